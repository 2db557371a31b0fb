"""Sign-in-with-x (SIWX) on Solana: the 402 challenge, the signed message and header verification.

Framework-free: the SIWX middleware asks :class:`SiwxIssuer` for a challenge when the header is
missing and calls :meth:`SiwxIssuer.verify` when it is present, turning :class:`SiwxError` into a
402 whose ``error`` is the reason. Nonces are stateless (a random part plus an HMAC under the
shared ``SIWX_SECRET`` over it, the ``issuedAt`` and the resource), so issuing a challenge costs
no store write and any replica can tell its own nonces; single use is the caller's store claim.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import msgspec
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from solders.pubkey import Pubkey
from solders.signature import Signature

from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.types import (
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    PaymentRequired,
    ResourceInfo,
    SiwxExtension,
    SiwxInfo,
    SiwxPayload,
    SiwxSupportedChain,
)

EXTENSION_KEY: Final = "sign-in-with-x"
SIWX_VERSION: Final = "1"
SIGNATURE_TYPE: Final = "ed25519"
SIGNATURE_SCHEME: Final = "siws"
SUPPORTED_CHAINS: Final = (SOLANA_MAINNET, SOLANA_DEVNET)
DEFAULT_LIFETIME_S: Final = 300
DEFAULT_CLOCK_SKEW_S: Final = 30
MIN_SECRET_BYTES: Final = 16

# Domain separation: this key signs nothing else, but a label keeps it that way if it ever does.
_MAC_LABEL: Final = b"x402-gateway/siwx-nonce/v1\n"
_RANDOM_HEX: Final = 16
_MAC_HEX: Final = 16
_NONCE_RE: Final = re.compile(r"[0-9a-f]{32}")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_DEFAULT_PORTS: Final = {"http": ":80", "https": ":443"}

# JSON Schema of the SIGN-IN-WITH-X header payload, advertised in every challenge (x402 spec).
PAYLOAD_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "domain": {"type": "string"},
        "address": {"type": "string"},
        "statement": {"type": "string"},
        "uri": {"type": "string", "format": "uri"},
        "version": {"type": "string"},
        "chainId": {"type": "string"},
        "type": {"type": "string"},
        "nonce": {"type": "string"},
        "issuedAt": {"type": "string", "format": "date-time"},
        "expirationTime": {"type": "string", "format": "date-time"},
        "notBefore": {"type": "string", "format": "date-time"},
        "requestId": {"type": "string"},
        "resources": {"type": "array", "items": {"type": "string", "format": "uri"}},
        "signatureScheme": {"type": "string"},
        "signature": {"type": "string"},
    },
    "required": ["domain", "address", "uri", "version", "chainId", "type", "nonce", "issuedAt", "signature"],
}


class SiwxReason(enum.StrEnum):
    """Stable reasons a sign-in is refused; they go into the 402's ``error``, so never rename one."""

    MALFORMED = "siwx_malformed"
    DOMAIN_MISMATCH = "siwx_domain_mismatch"
    URI_MISMATCH = "siwx_uri_mismatch"
    STATEMENT_MISMATCH = "siwx_statement_mismatch"
    UNSUPPORTED_CHAIN = "siwx_unsupported_chain"
    NONCE_INVALID = "siwx_nonce_invalid"
    EXPIRED = "siwx_expired"
    NOT_YET_VALID = "siwx_not_yet_valid"
    ISSUED_IN_FUTURE = "siwx_issued_in_future"
    SIGNATURE_INVALID = "siwx_signature_invalid"
    # Never raised here: the caller raises it when its store claim on the nonce fails.
    REPLAYED = "siwx_replayed"


class SiwxError(Exception):
    """Any refused sign-in: ``reason`` for machines, ``message`` safe to show (no secrets)."""

    def __init__(self, reason: SiwxReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class VerifiedSignIn(msgspec.Struct, frozen=True, gc=False):
    """A sign-in that passed every check; the caller must still claim ``nonce`` once.

    ``expires_at`` (unix seconds) is when the nonce stops verifying. ``replay_ttl_ms`` is how long
    the replay record must live from the moment of verification: the nonce's remaining life
    plus the clock-skew allowance, so a replica whose clock lags cannot accept it after the
    record is gone.
    """

    address: str
    chain_id: str
    nonce: str
    issued_at: float
    expires_at: float
    replay_ttl_ms: int


class SiwsFields(Protocol):
    """The message fields :class:`SiwxInfo` and :class:`SiwxPayload` share."""

    @property
    def domain(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def nonce(self) -> str: ...
    @property
    def issuedAt(self) -> str: ...
    @property
    def statement(self) -> str | None: ...
    @property
    def expirationTime(self) -> str | None: ...
    @property
    def notBefore(self) -> str | None: ...
    @property
    def requestId(self) -> str | None: ...
    @property
    def resources(self) -> list[str] | None: ...


def siws_message(fields: SiwsFields, address: str, chain_id: str) -> str:
    """The exact text a Solana wallet signs (CAIP-122 / SIWS), shared by signer and verifier.

    Optional lines appear only when the field is non-empty, as the reference clients do, so a
    header they produce rebuilds to the same bytes here.
    """
    lines = [f"{fields.domain} wants you to sign in with your Solana account:", address, ""]
    if fields.statement:
        lines.append(fields.statement)
        lines.append("")
    lines.append(f"URI: {fields.uri}")
    lines.append(f"Version: {fields.version}")
    lines.append(f"Chain ID: {chain_id.partition(':')[2]}")
    lines.append(f"Nonce: {fields.nonce}")
    lines.append(f"Issued At: {fields.issuedAt}")
    if fields.expirationTime:
        lines.append(f"Expiration Time: {fields.expirationTime}")
    if fields.notBefore:
        lines.append(f"Not Before: {fields.notBefore}")
    if fields.requestId:
        lines.append(f"Request ID: {fields.requestId}")
    if fields.resources:
        lines.append("Resources:")
        lines.extend(f"- {resource}" for resource in fields.resources)
    return "\n".join(lines)


def normalize_origin(url: str) -> tuple[str, str]:
    """``(scheme, netloc)`` as HTTP clients see them: lower case, default port dropped.

    The reference client compares the challenge's ``domain`` with the netloc of the URL it
    fetched, which httpx and browsers normalise the same way.
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    netloc = parts.netloc.lower()
    default_port = _DEFAULT_PORTS.get(scheme)
    if default_port and netloc.endswith(default_port):
        netloc = netloc[: -len(default_port)]
    return scheme, netloc


def random_secret() -> bytes:
    """A per-process secret for when ``SIWX_SECRET`` is unset (one replica only; warn at start-up)."""
    return secrets.token_bytes(32)


def format_time(ms: int) -> str:
    """ISO 8601 UTC with milliseconds and ``Z``, the shape JavaScript's ``toISOString`` gives."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(value: str, name: str) -> float:
    """Unix seconds of an ISO 8601 timestamp that carries an offset; anything else is malformed."""
    try:
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError("no UTC offset")
        return parsed.timestamp()
    except (ValueError, OverflowError):
        raise SiwxError(SiwxReason.MALFORMED, f"{name} is not an ISO 8601 timestamp with offset") from None


def _has_newline(payload: SiwxPayload) -> bool:
    """Free-text fields must stay on their line, or two payloads could sign the same text."""
    if payload.statement and "\n" in payload.statement:
        return True
    if payload.requestId and "\n" in payload.requestId:
        return True
    return bool(payload.resources) and any("\n" in r for r in payload.resources or ())


class SiwxIssuer:
    """Issues SIWX challenges and verifies SIGN-IN-WITH-X headers for one public base URL.

    Everything that does not depend on the request (domain, chains, schema, the keyed HMAC
    state) is computed once here, because :meth:`verify` runs on every signed-in request.
    """

    def __init__(
        self,
        secret: bytes,
        base_url: str,
        statement: str,
        lifetime_s: int = DEFAULT_LIFETIME_S,
        *,
        clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"SIWX secret must be at least {MIN_SECRET_BYTES} bytes")
        if lifetime_s <= 0 or clock_skew_s < 0:
            raise ValueError("SIWX lifetime must be positive and clock skew non-negative")
        if "\n" in statement:
            raise ValueError("SIWX statement must be a single line")
        parts = urlsplit(base_url.strip())
        if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError("GATEWAY_BASE_URL must be an absolute http(s) URL")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise ValueError("GATEWAY_BASE_URL must not carry credentials, a query or a fragment")
        scheme, netloc = normalize_origin(base_url)
        self.domain: Final = netloc
        self.base_url: Final = f"{scheme}://{netloc}{parts.path.rstrip('/')}"
        self.statement: Final = statement
        self.lifetime_s: Final = lifetime_s
        self.clock_skew_s: Final = clock_skew_s
        # The secret lives only inside the keyed HMAC state; each nonce copies it.
        self._mac_base = hmac.new(secret, _MAC_LABEL, hashlib.sha256)
        self._lifetime_ms = lifetime_s * 1000
        self._chain_ids = frozenset(SUPPORTED_CHAINS)
        self._supported = [
            SiwxSupportedChain(chainId=c, type=SIGNATURE_TYPE, signatureScheme=SIGNATURE_SCHEME)
            for c in SUPPORTED_CHAINS
        ]
        self._networks = list(SUPPORTED_CHAINS)

    def __repr__(self) -> str:
        return f"SiwxIssuer(domain={self.domain!r}, lifetime_s={self.lifetime_s})"

    def resource_url(self, path: str) -> str:
        """The URL a client signs for ``path``: the base URL plus the path, no query string."""
        return self.base_url + path

    def _mac(self, random_part: str, issued_at: str, resource_url: str) -> str:
        mac = self._mac_base.copy()
        # random_part is fixed-length hex and issued_at newline-free, so the encoding is unambiguous.
        mac.update(f"{random_part}\n{issued_at}\n{resource_url}".encode())
        return mac.hexdigest()[:_MAC_HEX]

    def extension(
        self, resource_url: str, now: float | None = None, statement: str | None = None
    ) -> SiwxExtension:
        """A fresh ``extensions["sign-in-with-x"]`` for ``resource_url`` (new nonce each call),
        whose wallet reads ``statement`` (None: the issuer's own).

        The chain list, networks and schema are shared between challenges: do not mutate them.
        """
        statement = self.statement if statement is None else statement
        issued_ms = int((time.time() if now is None else now) * 1000)
        issued_at = format_time(issued_ms)
        random_part = secrets.token_hex(_RANDOM_HEX // 2)
        info = SiwxInfo(
            domain=self.domain,
            uri=resource_url,
            version=SIWX_VERSION,
            nonce=random_part + self._mac(random_part, issued_at, resource_url),
            issuedAt=issued_at,
            expirationTime=format_time(issued_ms + self._lifetime_ms),
            statement=statement or None,
            resources=[resource_url],
        )
        return SiwxExtension(
            info=info,
            supportedChains=self._supported,
            schema=PAYLOAD_SCHEMA,
            networks=self._networks,
            statement=statement or None,
            expirationSeconds=self.lifetime_s,
            resource=resource_url,
        )

    def challenge(
        self,
        resource_url: str,
        now: float | None = None,
        *,
        error: str | None = None,
        description: str | None = None,
        mime_type: str | None = None,
        statement: str | None = None,
    ) -> PaymentRequired:
        """The whole 402 envelope of a sign-in-only route: body and ``PAYMENT-REQUIRED`` header."""
        return PaymentRequired(
            x402Version=2,
            resource=ResourceInfo(url=resource_url, description=description, mimeType=mime_type),
            accepts=[],
            error=error,
            extensions={EXTENSION_KEY: self.extension(resource_url, now, statement)},
        )

    def verify(
        self, header_value: str, resource_url: str, now: float | None = None, statement: str | None = None
    ) -> VerifiedSignIn:
        """Check a ``SIGN-IN-WITH-X`` header against this request; raise :class:`SiwxError` if refused.

        Cheap checks run first and the ed25519 verification last. Replay is not checked here:
        the caller claims ``nonce`` in the shared store for ``replay_ttl_ms``. With a
        ``statement`` (a route where a sign-in spends money), the signed statement must be that
        one, the one the route's challenge gave: a wallet that signed other words (say, that no
        funds move) never authorised the spend.
        """
        t = time.time() if now is None else now
        try:
            payload = decode_header(header_value, SiwxPayload)
        except HeaderError as exc:
            raise SiwxError(SiwxReason.MALFORMED, f"SIGN-IN-WITH-X {exc}") from None
        try:
            public_key = bytes(Pubkey.from_string(payload.address))
        except ValueError:
            raise SiwxError(SiwxReason.MALFORMED, "address is not a base58 32-byte public key") from None
        try:
            signature = bytes(Signature.from_string(payload.signature))
        except ValueError:
            raise SiwxError(SiwxReason.MALFORMED, "signature is not a base58 64-byte signature") from None
        if payload.version != SIWX_VERSION:
            raise SiwxError(SiwxReason.MALFORMED, f"unsupported SIWX version, expected {SIWX_VERSION}")
        if _has_newline(payload):
            raise SiwxError(SiwxReason.MALFORMED, "statement, requestId and resources must be single lines")

        if payload.domain != self.domain:
            raise SiwxError(SiwxReason.DOMAIN_MISMATCH, f"domain must be {self.domain}")
        if payload.uri != resource_url:
            raise SiwxError(SiwxReason.URI_MISMATCH, "uri must be the URL of the requested resource")
        if statement is not None and (payload.statement or "") != statement:
            raise SiwxError(
                SiwxReason.STATEMENT_MISMATCH, "statement must be the one this route's challenge gave"
            )
        if (
            payload.chainId not in self._chain_ids
            or payload.type != SIGNATURE_TYPE
            or (payload.signatureScheme is not None and payload.signatureScheme != SIGNATURE_SCHEME)
        ):
            raise SiwxError(
                SiwxReason.UNSUPPORTED_CHAIN, "chain must be Solana mainnet or devnet with ed25519 (siws)"
            )

        nonce = payload.nonce
        if not _NONCE_RE.fullmatch(nonce) or "\n" in payload.issuedAt:
            raise SiwxError(SiwxReason.NONCE_INVALID, "nonce was not issued by this gateway")
        expected = self._mac(nonce[:_RANDOM_HEX], payload.issuedAt, resource_url)
        if not hmac.compare_digest(expected, nonce[_RANDOM_HEX:]):
            raise SiwxError(
                SiwxReason.NONCE_INVALID, "nonce was not issued by this gateway for this resource"
            )

        issued = _parse_time(payload.issuedAt, "issuedAt")
        if issued > t + self.clock_skew_s:
            raise SiwxError(SiwxReason.ISSUED_IN_FUTURE, "issuedAt is in the future")
        expires_at = issued + self.lifetime_s
        if t >= expires_at:
            raise SiwxError(SiwxReason.EXPIRED, "sign-in challenge expired; sign the new one")
        if payload.expirationTime and _parse_time(payload.expirationTime, "expirationTime") <= t:
            raise SiwxError(SiwxReason.EXPIRED, "expirationTime has passed; sign the new challenge")
        if payload.notBefore and _parse_time(payload.notBefore, "notBefore") > t + self.clock_skew_s:
            raise SiwxError(SiwxReason.NOT_YET_VALID, "notBefore is in the future")

        message = siws_message(payload, payload.address, payload.chainId).encode()
        try:
            VerifyKey(public_key).verify(message, signature)
        except BadSignatureError:
            raise SiwxError(SiwxReason.SIGNATURE_INVALID, "signature does not match the message") from None

        return VerifiedSignIn(
            address=payload.address,
            chain_id=payload.chainId,
            nonce=nonce,
            issued_at=issued,
            expires_at=expires_at,
            replay_ttl_ms=math.ceil((expires_at + self.clock_skew_s - t) * 1000),
        )
