"""Coinbase CDP API-key authentication: a fresh signed JWT per request.

The CDP facilitator wants ``Authorization: Bearer <JWT>`` on every call, the token bound to
one method, host and path and valid for two minutes. The key is parsed once at start-up so a
bad secret fails fast, and no error message ever carries the secret.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from gateway.telemetry.redact import Secret

JWT_ISSUER = "cdp"
JWT_LIFETIME_S = 120
"""CDP's token lifetime: long enough for one request, short enough that a leak expires fast."""

Algorithm = Literal["EdDSA", "ES256"]
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

_ED25519_SECRET_BYTES = 64


def request_uri(method: str, url: str) -> str:
    """The ``uris`` claim entry: ``"<METHOD> <host[:port]><path>"``, no scheme, userinfo or query."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError("request URL has no host")
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{method.upper()} {host}{parts.path or '/'}"


@dataclass(frozen=True, slots=True, repr=False)
class CdpKey:
    """A parsed CDP API key: its id, the JWT algorithm it implies and the private key."""

    key_id: str
    algorithm: Algorithm
    _private_key: PrivateKey

    def __repr__(self) -> str:
        return f"CdpKey(key_id={self.key_id!r}, algorithm={self.algorithm!r})"

    @classmethod
    def parse(cls, key_id: str, secret: str | Secret) -> CdpKey:
        """Parse a CDP secret: base64 of a 64-byte Ed25519 key (seed + public) or an EC P-256 PEM.

        Raises ``ValueError`` with a message that names the problem, never the secret.
        """
        raw = secret.reveal() if isinstance(secret, Secret) else secret
        key_id = key_id.strip()
        if not key_id:
            raise ValueError("CDP API key id is empty")
        raw = raw.strip()
        if not raw:
            raise ValueError("CDP API key secret is empty")
        if "-----BEGIN" in raw:
            return cls(key_id, "ES256", _parse_ec_pem(raw))
        return cls(key_id, "EdDSA", _parse_ed25519(raw))

    def public_key(self) -> PublicKey:
        """The public half, for whoever verifies our tokens (the test facilitator)."""
        return self._private_key.public_key()

    def token(self, method: str, url: str, *, now: int | None = None) -> str:
        """A fresh JWT for one request: new nonce, ``nbf`` now, ``exp`` two minutes later."""
        issued = int(time.time()) if now is None else now
        claims = {
            "sub": self.key_id,
            "iss": JWT_ISSUER,
            "nbf": issued,
            "exp": issued + JWT_LIFETIME_S,
            "uris": [request_uri(method, url)],
        }
        headers = {"kid": self.key_id, "typ": "JWT", "nonce": secrets.token_hex(16)}
        return jwt.encode(claims, self._private_key, algorithm=self.algorithm, headers=headers)

    def bearer(self, method: str, url: str) -> str:
        """The ``Authorization`` header value for one request."""
        return f"Bearer {self.token(method, url)}"


def _parse_ed25519(raw: str) -> ed25519.Ed25519PrivateKey:
    try:
        decoded = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("CDP API key secret is neither a PEM EC key nor base64 of an Ed25519 key") from None
    if len(decoded) != _ED25519_SECRET_BYTES:
        raise ValueError(
            f"CDP Ed25519 secret must decode to {_ED25519_SECRET_BYTES} bytes (seed + public key), "
            f"got {len(decoded)}"
        )
    seed, public = decoded[:32], decoded[32:]
    key = ed25519.Ed25519PrivateKey.from_private_bytes(seed)
    derived = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    if not secrets.compare_digest(derived, public):
        raise ValueError("CDP Ed25519 secret is inconsistent: its public half does not match its seed")
    return key


def _parse_ec_pem(raw: str) -> ec.EllipticCurvePrivateKey:
    if "\\n" in raw:  # a PEM pasted into an env file with escaped newlines
        raw = raw.replace("\\n", "\n")
    try:
        key = serialization.load_pem_private_key(raw.encode("utf-8"), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError("CDP API key secret looks like PEM but is not a readable private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("CDP PEM secret is not an EC private key")
    if not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"CDP EC secret must be on P-256 for ES256, got {key.curve.name}")
    return key
