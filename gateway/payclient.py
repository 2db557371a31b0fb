"""``x402-gateway pay``: a small x402 client for exact-on-Solana payments and sign-in-with-x.

Built on the same builders the tests use (:mod:`gateway.x402.svm_payer`,
:mod:`gateway.x402.siwx_signer`). One request, then at most two answers to a 402:

1. send the request;
2. on 402 read the challenge (``PAYMENT-REQUIRED`` header, else the JSON body);
3. if it carries a ``sign-in-with-x`` extension, sign in and retry with ``SIGN-IN-WITH-X``
   (signing in costs nothing, so it is tried before paying);
4. if the answer is (still) 402 and ``accepts`` holds an exact Solana requirement, build and
   sign the payment (mint and blockhash from the RPC node) and retry with
   ``PAYMENT-SIGNATURE`` (v2) or ``X-PAYMENT`` (v1 challenges).

The body of the last answer goes to stdout, the decoded ``PAYMENT-RESPONSE`` to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import base58
import msgspec
from solders.keypair import Keypair

from gateway.config import PUBLIC_MAINNET_RPC_URL
from gateway.solana_rpc import SolanaRpc, SolanaRpcError
from gateway.x402.headers import HeaderError, decode_header, encode_header
from gateway.x402.siwx_signer import sign_in
from gateway.x402.svm_payer import create_exact_payment
from gateway.x402.types import V1_NETWORKS, PaymentPayload, PaymentRequirements, ResourceInfo, SettleResponse

SIWX_EXTENSION = "sign-in-with-x"
SCHEME_EXACT = "exact"
DEFAULT_TIMEOUT_S = 60.0


class PayError(Exception):
    """Why the request could not be completed; the message is one line, safe to print."""


# --- keypair files --------------------------------------------------------------------------


def parse_keypair(text: str) -> Keypair:
    """A solana-keygen JSON array of 64 bytes, or the base58 string of those 64 bytes."""
    text = text.strip()
    if not text:
        raise PayError("keypair file is empty")
    if text.startswith("["):
        try:
            numbers = msgspec.json.decode(text, type=list[int])
            raw = bytes(numbers)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            raise PayError("keypair file is not a JSON array of 64 bytes") from None
        if len(raw) != 64:
            raise PayError(f"keypair file holds {len(raw)} bytes, expected 64")
        try:
            return Keypair.from_bytes(raw)
        except ValueError:
            raise PayError("keypair bytes are not a valid ed25519 keypair") from None
    try:
        raw = base58.b58decode(text)
    except ValueError:
        raise PayError("keypair is neither a JSON array of 64 bytes nor a base58 string") from None
    if len(raw) != 64:
        raise PayError(f"base58 keypair holds {len(raw)} bytes, expected 64")
    try:
        return Keypair.from_bytes(raw)
    except ValueError:
        raise PayError("keypair bytes are not a valid ed25519 keypair") from None


def load_keypair(path: str | Path) -> Keypair:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PayError(f"cannot read keypair file {str(path)!r}: {exc.__class__.__name__}") from None
    return parse_keypair(text)


# --- challenges -----------------------------------------------------------------------------


class Challenge(msgspec.Struct):
    """A 402 challenge as any x402 server may send it (v1 or v2); accepts stay raw until chosen."""

    x402Version: int = 2
    accepts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    resource: ResourceInfo | str | None = None
    error: str | None = None
    extensions: dict[str, Any] | None = None


def parse_challenge(headers: Mapping[str, str], body: bytes) -> Challenge:
    """The challenge of a 402: the ``PAYMENT-REQUIRED`` header, else the JSON body."""
    header = headers.get("payment-required") or headers.get("PAYMENT-REQUIRED")
    if header:
        try:
            return decode_header(header, Challenge)
        except HeaderError:
            pass
    try:
        return msgspec.json.decode(body, type=Challenge)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise PayError("402 without a readable x402 challenge") from None


def _is_solana(network: str) -> bool:
    return network.startswith("solana:") or network in V1_NETWORKS


def exact_solana_requirement(challenge: Challenge) -> PaymentRequirements | None:
    """The first ``accepts`` entry we can pay: scheme exact on a Solana network."""
    for accept in challenge.accepts:
        if accept.get("scheme") != SCHEME_EXACT or not _is_solana(str(accept.get("network", ""))):
            continue
        data = dict(accept)
        if "amount" not in data and "maxAmountRequired" in data:  # v1 names the amount differently
            data["amount"] = data["maxAmountRequired"]
        try:
            return msgspec.convert(data, PaymentRequirements)
        except msgspec.ValidationError:
            continue
    return None


def siwx_extension(challenge: Challenge) -> dict[str, Any] | None:
    ext = (challenge.extensions or {}).get(SIWX_EXTENSION)
    return ext if isinstance(ext, dict) else None


def _resource(challenge: Challenge) -> ResourceInfo | None:
    return challenge.resource if isinstance(challenge.resource, ResourceInfo) else None


def payment_header(challenge: Challenge, payload: PaymentPayload) -> tuple[str, str]:
    """(header name, value) carrying ``payload``: v2 ``PAYMENT-SIGNATURE``, v1 ``X-PAYMENT``."""
    if challenge.x402Version == 1 and payload.accepted is not None:
        v1 = PaymentPayload(
            x402Version=1,
            payload=payload.payload,
            scheme=payload.accepted.scheme,
            network=payload.accepted.network,
        )
        return "X-PAYMENT", encode_header(v1)
    return "PAYMENT-SIGNATURE", encode_header(payload)


# --- the client -----------------------------------------------------------------------------


@dataclass
class PayResult:
    status: int
    body: bytes
    headers: dict[str, str]
    settlement: SettleResponse | None = None
    paid: PaymentRequirements | None = None
    signed_in: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


async def _send(
    session: aiohttp.ClientSession, method: str, url: str, data: bytes | None, extra: Mapping[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    headers = {"accept": "application/json", **extra}
    if data is not None:
        headers["content-type"] = "application/json"
    try:
        async with session.request(method, url, data=data, headers=headers) as resp:
            return resp.status, await resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PayError(f"request failed: {exc.__class__.__name__}: {exc}") from None


async def pay(
    method: str,
    url: str,
    keypair: Keypair,
    *,
    data: bytes | None = None,
    rpc_url: str = PUBLIC_MAINNET_RPC_URL,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> PayResult:
    """Send the request, answering a 402 with a sign-in and/or an exact Solana payment."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        status, body, headers = await _send(session, method, url, data, {})
        result = PayResult(status, body, headers)
        if status != 402:
            return result
        challenge = parse_challenge(headers, body)
        extension = siwx_extension(challenge)
        if extension is not None:
            try:
                value = sign_in(extension, keypair, request_url=url)
            except ValueError as exc:
                raise PayError(f"cannot sign in: {exc}") from None
            status, body, headers = await _send(session, method, url, data, {"SIGN-IN-WITH-X": value})
            result = PayResult(status, body, headers, signed_in=True)
            if status != 402:
                return result
            challenge = parse_challenge(headers, body)
        requirement = exact_solana_requirement(challenge)
        if requirement is None:
            reason = f" ({challenge.error})" if challenge.error else ""
            raise PayError(f"402{reason}: no exact Solana payment or sign-in this client can answer")
        rpc = SolanaRpc(rpc_url, session)
        try:
            payload = await create_exact_payment(rpc, requirement, keypair, resource=_resource(challenge))
        except SolanaRpcError as exc:
            raise PayError(f"cannot build the payment: RPC {exc}") from None
        except ValueError as exc:
            raise PayError(f"cannot build the payment: {exc}") from None
        name, value = payment_header(challenge, payload)
        status, body, headers = await _send(session, method, url, data, {name: value})
        result = PayResult(status, body, headers, paid=requirement, signed_in=result.signed_in)
        settlement = headers.get("payment-response") or headers.get("x-payment-response")
        if settlement:
            try:
                result.settlement = decode_header(settlement, SettleResponse)
            except HeaderError:
                result.notes.append("PAYMENT-RESPONSE header could not be decoded")
        return result


def _failure_reason(result: PayResult) -> str:
    """One line on why the final answer is not a success."""
    reason = f"HTTP {result.status}"
    try:
        parsed = json.loads(result.body)
    except ValueError:
        return reason
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            return f"{reason}: {error.get('code')}: {error.get('message')}"
        if isinstance(error, str):
            return f"{reason}: {error}"
    return reason


def default_rpc_url(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SOLANA_RPC_URL") or PUBLIC_MAINNET_RPC_URL


async def run_pay(
    method: str,
    url: str,
    *,
    keypair_file: str,
    data: str | None = None,
    rpc_url: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The ``pay`` command: 0 on a 2xx answer, 1 otherwise, with a one-line reason on ``err``."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        keypair = load_keypair(keypair_file)
        body: bytes | None = None
        if data is not None:
            try:
                body = msgspec.json.encode(msgspec.json.decode(data))
            except msgspec.DecodeError:
                raise PayError("--data is not valid JSON") from None
        result = await pay(method.upper(), url, keypair, data=body, rpc_url=rpc_url or default_rpc_url())
    except PayError as exc:
        print(f"x402-gateway pay: {exc}", file=err)
        return 1
    text = result.body.decode("utf-8", errors="replace")
    print(text, file=out, end="" if text.endswith("\n") else "\n")
    if result.settlement is not None:
        print("PAYMENT-RESPONSE: " + msgspec.json.encode(result.settlement).decode(), file=err)
    for note in result.notes:
        print(f"note: {note}", file=err)
    if not result.ok:
        print(f"x402-gateway pay: {_failure_reason(result)}", file=err)
        return 1
    return 0
