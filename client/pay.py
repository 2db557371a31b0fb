"""``x402-gateway pay``: a small x402 client for exact-on-Solana payments and sign-in-with-x.

Built on the same builders the tests use (:mod:`client.svm_payer`,
:mod:`client.siwx_signer`). One request, then at most two answers to a 402:

1. send the request;
2. on 402 read the challenge (``PAYMENT-REQUIRED`` header, else the JSON body);
3. if it carries a ``sign-in-with-x`` extension, sign in (tried before paying): on a sign-in
   route, the request again with ``SIGN-IN-WITH-X``; on a paid route of a gateway selling
   prepaid credit, through a credit session (:mod:`client.sessions`: one sign-in opens
   it, or one kept from before serves), the request again with ``X-CREDIT-SESSION``, spending
   the wallet's credit with no transaction; the answer then carries ``X-Credit-Balance``, the
   credit left. A URL whose 402 the session cache saw within the policy is called on the
   session straight away, with no 402 (step 1 carries the session);
4. if the answer is (still) 402 (e.g. ``insufficient_credit``: the wallet's credit does not
   cover the call) and ``accepts`` holds an exact Solana requirement the wallet's
   :class:`SpendPolicy` allows, check the wallet holds enough USDC, build and sign the payment
   (mint and blockhash from the RPC node) and retry with ``PAYMENT-SIGNATURE`` (v2) or
   ``X-PAYMENT`` (v1 challenges), carrying a payment-identifier when the server offers one so
   a retry after a dropped connection gets the answer already paid for.

A challenge is a stranger's request to sign a transfer: nothing malformed (an amount that is
not a positive u64, an address that is not one, see :class:`OfferedExact`), above
``--max-amount``, in another asset than the configured USDC mint, or naming this wallet as the
fee payer (which would make the signature a fully signed transaction the stranger can broadcast
at will) is ever signed. A paid route whose every exact offer and whose credit price (when its
gateway's catalog lists one) are above ``--max-amount`` gets no sign-in either.

A 429 at any stage is waited out as its ``Retry-After`` asks (a second at least) and the
identical request sent again, for at most :data:`MAX_RATE_LIMIT_WAIT_S` a command
(``--no-wait``: not at all). ``--max-amount`` bounds what the call takes: a sign-in on a paid
route spends its credit price, which the gateway's catalog lists (:func:`credit_refusal`).

Redirects are never followed, whatever the stage: the URL given is the resource the user agreed
to pay for, and an HTTP client following a redirect keeps the ``PAYMENT-SIGNATURE`` and
``SIGN-IN-WITH-X`` headers, handing a payment to whichever origin the redirect names. A redirect
is the final answer (exit 1, its target named), so the user can call that URL directly.

The body of the last answer goes to stdout, what happened (signed in as, paid from credit or
paid, the decoded ``PAYMENT-RESPONSE``) to stderr; ``--quiet`` keeps stderr for errors,
``--json`` prints one JSON object for scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Annotated, Any, TextIO
from urllib.parse import urljoin, urlsplit

import aiohttp
import base58
import msgspec
from msgspec import Meta
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.challenge import (
    Challenge,
    PayError,
    parse_challenge,
    siwx_extension,
)
from client.sessions import (
    DEFAULT_SESSION_CAP,
    MAX_SESSION_CAP,
    PROCESS_CACHE,
    RENEWED,
    SESSION_HEADER,
    CreditSession,
    SessionCache,
    SessionError,
    open_session,
)
from client.siwx_signer import sign_in
from client.svm_payer import (
    MAX_MEMO_BYTES,
    U64_MAX,
    MintInfo,
    create_exact_payment,
    fetch_mint_info,
    fetch_token_balance,
)
from gateway.config import PUBLIC_MAINNET_RPC_URL
from gateway.outbound.solana_rpc import RpcUnavailable, SolanaRpc, SolanaRpcError
from gateway.routing.pricing import usd_display
from gateway.telemetry.redact import redact_url
from gateway.x402.challenge import PAYMENT_IDENTIFIER
from gateway.x402.headers import HeaderError, decode_header, encode_header
from gateway.x402.siwx import normalize_origin
from gateway.x402.svm import associated_token_address
from gateway.x402.types import (
    SCHEME_EXACT,
    USDC_DECIMALS,
    USDC_MAINNET_MINT,
    V1_NETWORKS,
    PaymentPayload,
    PaymentRequirements,
    ResourceInfo,
    SettleResponse,
)

CREDIT_BALANCE_HEADER = "x-credit-balance"
"""The credit left (micro-USDC) on an answer paid from prepaid credit."""
DEFAULT_TIMEOUT_S = 60.0
MAX_USDC_AMOUNT = 10**20
"""The largest ``--max-amount`` (whole USDC), already above any u64 of micro-USDC a challenge can
ask: a larger number says nothing more, and one with a huge exponent would overflow."""
DEFAULT_MAX_AMOUNT = 100_000
"""micro-USDC (0.10 USDC): the most one call may cost unless ``--max-amount`` says otherwise."""
PAID_RETRIES = 2
"""Extra attempts of the identical paid request after a dropped connection (payment-identifier)."""
RETRY_DELAY_S = 0.5
MAX_TIMEOUT_SECONDS = 3600
"""The longest ``maxTimeoutSeconds`` a challenge may ask (the gateway's own ceiling)."""
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
UNTRUSTED_CHARS = 200
"""How much of a text the server chose (an error, a Location) a message quotes."""
MAX_RATE_LIMIT_WAIT_S = 60.0
"""The longest one command waits out 429 answers in all (``Retry-After``), whatever they ask."""
DEFAULT_RETRY_AFTER_S = 1.0
"""The wait after a 429 that names no ``Retry-After``, and the shortest one: a server answering
``Retry-After: 0`` forever gets one request a second, and only until the bound is spent."""
CATALOG_PATH = "/v1/catalog"
"""Where a gateway lists its routes and their prices, credit price included."""


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` (cut to ``limit``) with every control or format character shown as ``?``.

    Messages quote what a hostile server chose; a newline or a terminal escape must not turn one
    line of stderr into several, or into something other than what it says.
    """
    text = text if limit is None else text[:limit]
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def usdc_text(micro: int) -> str:
    """``1005`` -> ``"0.001005 USDC"``."""
    return f"{usd_display(micro)[1:]} USDC"


def parse_usdc(text: str, option: str = "--max-amount") -> int:
    """``"0.10"`` (whole USDC, at most 6 decimals) -> micro-USDC; PayError when malformed."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise PayError(f"{option} {text[:30]!r} is not a USDC amount such as 0.10", "usage") from None
    if not value.is_finite() or value < 0 or value > MAX_USDC_AMOUNT:
        raise PayError(
            f"{option} {text[:30]!r} must be from 0 to {MAX_USDC_AMOUNT} with at most 6 decimals", "usage"
        )
    micro = value * 10**USDC_DECIMALS
    if micro != micro.to_integral_value():
        raise PayError(f"{option} {text[:30]!r} must be >= 0 with at most 6 decimals", "usage")
    return int(micro)


def session_cap(text: str | None, option: str = "--session-cap") -> int:
    """The most a credit session may spend (micro-USDC): more than 0, at most 1,000 USDC."""
    if text is None:
        return DEFAULT_SESSION_CAP
    cap = parse_usdc(text, option)
    if not 0 < cap <= MAX_SESSION_CAP:
        raise PayError(f"{option} {text[:30]!r} must be more than 0 and at most 1000 USDC", "usage")
    return cap


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


def _is_solana(network: str) -> bool:
    return network.startswith("solana:") or network in V1_NETWORKS


Base58Address = Annotated[str, Meta(pattern=r"^[1-9A-HJ-NP-Za-km-z]{32,44}$")]
"""A Solana address as base58 text (that it decodes to 32 bytes is checked after)."""
BaseUnits = Annotated[str, Meta(pattern=r"^[1-9][0-9]{0,19}$")]
"""A positive whole number of base units in plain decimal: no sign, point, exponent, leading 0."""

RULES = {
    "amount": f"amount must be a whole number of base units from 1 to {U64_MAX}, as a decimal string",
    "asset": "asset must be a Solana address (base58, 32 bytes)",
    "payTo": "payTo must be a Solana address (base58, 32 bytes)",
    "maxTimeoutSeconds": f"maxTimeoutSeconds must be a whole number from 1 to {MAX_TIMEOUT_SECONDS}",
    "extra": "extra must be an object naming the feePayer",
    "extra.feePayer": "extra.feePayer must be a Solana address (base58, 32 bytes)",
    "extra.memo": f"extra.memo must be text of at most {MAX_MEMO_BYTES} bytes",
}
"""What each field of an exact Solana requirement must be, as a refusal says it."""


def _is_address(text: str) -> bool:
    try:
        Pubkey.from_string(text)
    except ValueError:
        return False
    return True


class OfferedExtra(msgspec.Struct):
    feePayer: Base58Address
    memo: str | None = None


class OfferedExact(msgspec.Struct):
    """An exact Solana ``accepts`` entry as this client reads it before signing anything.

    The wire type (:class:`PaymentRequirements`) takes any text; decoding into this first keeps
    an amount a u64 cannot hold, or an address that is not one, away from the transaction
    builder. Unknown fields are ignored; the entry is paid as the server sent it.
    """

    amount: BaseUnits
    asset: Base58Address
    payTo: Base58Address
    maxTimeoutSeconds: Annotated[int, Meta(ge=1, le=MAX_TIMEOUT_SECONDS)]
    extra: OfferedExtra

    def __post_init__(self) -> None:
        if int(self.amount) > U64_MAX:
            raise ValueError(RULES["amount"])
        addresses = {"asset": self.asset, "payTo": self.payTo, "extra.feePayer": self.extra.feePayer}
        for name, value in addresses.items():
            if not _is_address(value):
                raise ValueError(RULES[name])
        if self.extra.memo is not None and len(self.extra.memo.encode("utf-8")) > MAX_MEMO_BYTES:
            raise ValueError(RULES["extra.memo"])


def malformed(exc: msgspec.ValidationError) -> PayError:
    """The refusal of a requirement that does not decode into :class:`OfferedExact`.

    msgspec names the field (never its value, which the server chose); the rule is ours.
    """
    text = str(exc)
    missing = re.fullmatch(r"Object missing required field `(\w+)`(?: - at `\$\.([\w.]+)`)?", text)
    at = re.search(r" - at `\$\.([\w.]+)`$", text)
    if missing:
        why = ".".join(part for part in (missing[2], missing[1]) if part) + " is missing"
    elif at:
        why = RULES.get(at[1], text)
    else:
        why = text  # __post_init__'s own words: already a rule
    return PayError(f"refusing to pay: the challenge is malformed: {why}", "invalid_payment_requirements")


def offered_requirements(challenge: Challenge) -> list[PaymentRequirements | PayError]:
    """Each exact Solana ``accepts`` entry, in order: the requirement, or why it is malformed."""
    found: list[PaymentRequirements | PayError] = []
    for accept in challenge.accepts:
        if accept.get("scheme") != SCHEME_EXACT or not _is_solana(str(accept.get("network", ""))):
            continue
        data = dict(accept)
        if "amount" not in data and "maxAmountRequired" in data:  # v1 names the amount differently
            data["amount"] = data["maxAmountRequired"]
        try:
            msgspec.convert(data, OfferedExact)
            found.append(msgspec.convert(data, PaymentRequirements))
        except msgspec.ValidationError as exc:
            found.append(malformed(exc))
    return found


def exact_solana_requirements(challenge: Challenge) -> list[PaymentRequirements]:
    """The ``accepts`` entries this client can pay: well-formed, scheme exact on a Solana network."""
    return [found for found in offered_requirements(challenge) if isinstance(found, PaymentRequirements)]


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


# --- what this wallet agrees to pay --------------------------------------------------------


@dataclass(frozen=True)
class SpendPolicy:
    """The most one call may cost (micro-USDC) and the only asset paid in."""

    max_amount: int = DEFAULT_MAX_AMOUNT
    asset: str = USDC_MAINNET_MINT


def refusal(requirement: PaymentRequirements, policy: SpendPolicy, payer: str) -> PayError | None:
    """Why this wallet will not sign ``requirement``, or None when it may."""
    if requirement.asset != policy.asset:
        return PayError(
            f"refusing to pay: the challenge asks for asset {requirement.asset[:64]}, not the USDC mint "
            f"{policy.asset} (--usdc-mint)",
            "asset_not_allowed",
        )
    fee_payer = (requirement.extra or {}).get("feePayer")
    if fee_payer == payer:
        return PayError(
            f"refusing to pay: the challenge names this wallet ({payer}) as the fee payer; signing would "
            "hand over a complete transaction",
            "fee_payer_is_payer",
        )
    amount = int(requirement.amount)  # an OfferedExact already: a u64 in plain decimal
    if amount > policy.max_amount:
        return PayError(
            f"refusing to pay: the challenge asks {usdc_text(amount)}, more than --max-amount "
            f"{usdc_text(policy.max_amount)}",
            "amount_above_max",
        )
    return None


def choose_requirement(challenge: Challenge, policy: SpendPolicy, payer: str) -> PaymentRequirements:
    """The first exact Solana requirement ``policy`` allows; else PayError with the first refusal
    (a malformed entry is one)."""
    first: PayError | None = None
    for offered in offered_requirements(challenge):
        refused = offered if isinstance(offered, PayError) else refusal(offered, policy, payer)
        if refused is None and isinstance(offered, PaymentRequirements):
            return offered
        first = first or refused
    if first is not None:
        raise first
    reason = f" ({one_line(challenge.error, UNTRUSTED_CHARS)})" if challenge.error else ""
    raise PayError(
        f"402{reason}: no exact Solana payment or sign-in this client can answer", "unsupported_scheme"
    )


async def credit_refusal(
    session: aiohttp.ClientSession, method: str, url: str, challenge: Challenge, policy: SpendPolicy
) -> PayError | None:
    """Why this wallet will not sign in to a paid route; None when it may.

    A sign-in there spends prepaid credit: the route's credit price, which the gateway's catalog
    states (the 402 does not), at most its price. ``--max-amount`` applies to what the call
    takes: with an exact offer within it, or a credit price within it, the wallet signs in (a
    wallet without enough credit is then refused, and the exact offer judged on its own);
    otherwise the call is refused whichever way it would be paid. The catalog is the gateway's
    own word on its own ledger: the credit is already the gateway's to take, and no payment is
    ever signed above ``--max-amount``."""
    offers = exact_solana_requirements(challenge)
    if not offers or any(int(offer.amount) <= policy.max_amount for offer in offers):
        return None
    in_credit = await catalog_credit_price(session, method, url)
    if in_credit is not None and in_credit <= policy.max_amount:
        return None
    cheapest = min(int(offer.amount) for offer in offers)
    from_credit = f" paid, {usdc_text(in_credit)} from credit" if in_credit is not None else ""
    return PayError(
        f"refusing to pay: the challenge asks {usdc_text(cheapest)}{from_credit}, more than --max-amount "
        f"{usdc_text(policy.max_amount)}" + ("" if in_credit is not None else " (from credit or paid)"),
        "amount_above_max",
    )


class _CatalogPrice(msgspec.Struct):
    microUsdc: Annotated[str, Meta(pattern=r"^[0-9]{1,20}$")]


class _CatalogRoute(msgspec.Struct):
    path: str
    method: str
    creditPrice: _CatalogPrice | None = None


class _Catalog(msgspec.Struct):
    routes: list[_CatalogRoute]


def _path_pattern(path: str) -> re.Pattern[str]:
    """A catalog path (``/v1/assets/{assetId}``) as a pattern over request paths."""
    parts = re.split(r"\{[^{}/]*\}", path)
    return re.compile("[^/]+".join(map(re.escape, parts)))


async def catalog_credit_price(session: aiohttp.ClientSession, method: str, url: str) -> int | None:
    """The credit price (micro-USDC) the gateway at ``url``'s origin lists for ``method`` on
    ``url``'s path; None when its catalog cannot be read or lists none."""
    try:
        catalog_url = _origin(url) + CATALOG_PATH
        async with session.get(catalog_url, allow_redirects=False) as resp:
            if resp.status != 200:
                return None
            catalog = msgspec.json.decode(await resp.read(), type=_Catalog)
    except (aiohttp.ClientError, TimeoutError, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    path = urlsplit(url).path
    for route in catalog.routes:
        if route.method == method and route.creditPrice and _path_pattern(route.path).fullmatch(path):
            return int(route.creditPrice.microUsdc)
    return None


def payment_identifier(challenge: Challenge) -> dict[str, Any] | None:
    """The ``payment-identifier`` extension with a fresh id, when the server declared it."""
    declared = (challenge.extensions or {}).get(PAYMENT_IDENTIFIER)
    if not isinstance(declared, dict):
        return None
    info = declared.get("info") if isinstance(declared.get("info"), dict) else {}
    required = bool(info.get("required", False)) if isinstance(info, dict) else False
    return {PAYMENT_IDENTIFIER: {"info": {"required": required, "id": "pay_" + secrets.token_hex(16)}}}


# --- the client -----------------------------------------------------------------------------


@dataclass
class PayResult:
    status: int
    body: bytes
    headers: dict[str, str]
    url: str = ""
    settlement: SettleResponse | None = None
    paid: PaymentRequirements | None = None
    signed_in_as: str | None = None
    sign_in_refused: str | None = None
    """The reason of the 402 a sign-in got (e.g. ``insufficient_credit``) before paying instead."""
    credit_left: int | None = None
    """Answered on prepaid credit: the credit left (``X-Credit-Balance``, micro-USDC)."""
    credit_session: str | None = None
    """Called on a credit session: ``opened`` for this call, or ``reused``."""
    payment_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class RateLimitWaits:
    """What is left of one command's time for waiting out 429 answers, and where it says so."""

    left_s: float = MAX_RATE_LIMIT_WAIT_S
    err: TextIO | None = None


RATE_LIMIT_WAITS: ContextVar[RateLimitWaits | None] = ContextVar("rate_limit_waits", default=None)
"""The running command's waits; None (a library call, ``--no-wait``): a 429 is the answer.

A context variable, so every request a command sends, at whatever stage of the flow, draws on
the same bounded budget without threading it through each call."""


@contextlib.contextmanager
def waiting_out_rate_limits(wait: bool, err: TextIO | None) -> Iterator[None]:
    """While the block runs, a 429 is waited out (``Retry-After``, at most
    :data:`MAX_RATE_LIMIT_WAIT_S` in all) and the request sent again, when ``wait``; ``err``
    (None: quiet) says so."""
    token = RATE_LIMIT_WAITS.set(RateLimitWaits(err=err) if wait else None)
    try:
        yield
    finally:
        RATE_LIMIT_WAITS.reset(token)


def retry_after_s(value: str | None) -> float | None:
    """``Retry-After`` (seconds, or an HTTP date) as seconds from now; the default wait when
    absent, None when unreadable."""
    if not value:
        return DEFAULT_RETRY_AFTER_S
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:12]))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


async def _send(
    session: aiohttp.ClientSession, method: str, url: str, data: bytes | None, extra: Mapping[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    """One request, sent again after a 429 while the command may wait (:data:`RATE_LIMIT_WAITS`).

    Resending is safe at every stage: a request refused with 429 was not served, and a paid one
    is resent with the identical payment, which can settle at most once.
    """
    while True:
        status, body, headers = await _send_once(session, method, url, data, extra)
        waits = RATE_LIMIT_WAITS.get()
        if status != 429 or waits is None:
            return status, body, headers
        delay = retry_after_s(headers.get("retry-after"))
        if delay is None or max(delay, DEFAULT_RETRY_AFTER_S) > waits.left_s:
            return status, body, headers
        delay = max(delay, DEFAULT_RETRY_AFTER_S)
        waits.left_s -= delay
        if waits.err is not None:
            print(
                f"HTTP 429 (rate limited): waiting {delay:g} s as Retry-After asks, then sending again "
                "(--no-wait stops at once)",
                file=waits.err,
            )
        await asyncio.sleep(delay)


async def _send_once(
    session: aiohttp.ClientSession, method: str, url: str, data: bytes | None, extra: Mapping[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    """One request; a redirect is returned as the answer, never followed (see the module's doc)."""
    headers = {"accept": "application/json", **extra}
    if data is not None:
        headers["content-type"] = "application/json"
    try:
        async with session.request(method, url, data=data, headers=headers, allow_redirects=False) as resp:
            return resp.status, await resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise PayError(f"request failed: {exc.__class__.__name__}: {exc}", "request_failed") from None


async def _send_paid(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    data: bytes | None,
    extra: Mapping[str, str],
    retries: int,
) -> tuple[int, bytes, dict[str, str]]:
    """Send the paid request; resend it unchanged ``retries`` times if the connection drops.

    Only with a payment-identifier is a resend safe: the server answers it from the settled
    record instead of refusing the payment as used.
    """
    for attempt in range(retries + 1):
        try:
            return await _send(session, method, url, data, extra)
        except PayError:
            if attempt == retries:
                raise PayError(
                    "the connection dropped after the payment was sent; it may have been settled"
                    + (" (resent with the same payment-identifier, no answer)" if retries else ""),
                    "request_failed",
                ) from None
            await asyncio.sleep(RETRY_DELAY_S)
    raise AssertionError("unreachable")


async def _check_funds(rpc: SolanaRpc, requirement: PaymentRequirements, keypair: Keypair) -> MintInfo:
    """The mint, once the wallet is known to hold the amount; PayError (insufficient_funds) if not."""
    mint = await fetch_mint_info(rpc, requirement.asset)
    held = await fetch_token_balance(rpc, keypair.pubkey(), mint)
    needed = int(requirement.amount)
    if held < needed:
        raise PayError(
            f"insufficient USDC: wallet {keypair.pubkey()} has {usdc_text(held)}, needs {usdc_text(needed)}",
            "insufficient_funds",
        )
    return mint


def rpc_failure(doing: str, exc: SolanaRpcError, rpc_url: str) -> PayError:
    """The refusal of a Solana RPC call, naming the node tried and how to name another."""
    parts = urlsplit(rpc_url)
    node = redact_url(rpc_url) if parts.scheme in ("http", "https") and parts.netloc else "(not an http URL)"
    if isinstance(exc, RpcUnavailable):
        return PayError(
            f"{doing}: no answer from the Solana RPC node {node} ({exc}); name one that answers with "
            "--rpc URL or SOLANA_RPC_URL (the sandbox's banner prints its local chain's)",
            "rpc_failed",
        )
    return PayError(f"{doing}: the Solana RPC node {node} refused: {exc}", "rpc_failed")


def credit_left(headers: Mapping[str, str]) -> int | None:
    """``X-Credit-Balance`` as a number of micro-USDC; None when absent or not a plain number."""
    value = headers.get(CREDIT_BALANCE_HEADER, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 20 else None


async def _sign_in(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    data: bytes | None,
    keypair: Keypair,
    extension: dict[str, Any],
) -> PayResult:
    """Answer the challenge's sign-in: the request again, with ``SIGN-IN-WITH-X``."""
    try:
        value = sign_in(extension, keypair, request_url=url)
    except ValueError as exc:
        raise PayError(f"cannot sign in: {exc}", "siwx_refused") from None
    status, body, headers = await _send(session, method, url, data, {"SIGN-IN-WITH-X": value})
    left = credit_left(headers) if status != 402 else None
    return PayResult(status, body, headers, url, signed_in_as=str(keypair.pubkey()), credit_left=left)


async def _on_session(
    http: aiohttp.ClientSession, method: str, url: str, data: bytes | None, credit: CreditSession, how: str
) -> PayResult:
    """The request on a credit session: ``X-CREDIT-SESSION``, no 402, no signature."""
    status, body, headers = await _send(http, method, url, data, {SESSION_HEADER: credit.token})
    left = credit_left(headers) if status != 402 else None
    return PayResult(
        status, body, headers, url, signed_in_as=credit.wallet, credit_left=left, credit_session=how
    )


async def _spend_credit(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    data: bytes | None,
    keypair: Keypair,
    extension: dict[str, Any],
    challenge: Challenge,
    cache: SessionCache,
    session_cap: int,
) -> PayResult:
    """Answer a challenge's sign-in: on a paid route (it offers payments beside), through a
    credit session, reused or opened (a gateway that opens none gets a sign-in per call); on a
    sign-in route, with a sign-in."""
    if not challenge.accepts:
        return await _sign_in(http, method, url, data, keypair, extension)
    origin, wallet = _origin(url), str(keypair.pubkey())
    credit, how = cache.get(origin, wallet), "reused"
    if credit is None:
        try:
            credit, how = await open_session(http, origin, keypair, session_cap), "opened"
        except SessionError:
            return await _sign_in(http, method, url, data, keypair, extension)
        cache.put(credit)
    asked = max((int(r.amount) for r in exact_solana_requirements(challenge)), default=0)
    cache.approve(credit, url, asked)
    result = await _on_session(http, method, url, data, credit, how)
    if result.status == 402 and parse_challenge(result.headers, result.body).error in RENEWED:
        cache.drop(origin, wallet)
    return result


async def sign_in_request(
    method: str, url: str, keypair: Keypair, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> PayResult:
    """Send the request, answering a 402 with a sign-in only (never a payment)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        status, body, headers = await _send(session, method, url, None, {})
        extension = siwx_extension(parse_challenge(headers, body)) if status == 402 else None
        if extension is None:
            return PayResult(status, body, headers, url)
        return await _sign_in(session, method, url, None, keypair, extension)


async def pay(
    method: str,
    url: str,
    keypair: Keypair,
    *,
    data: bytes | None = None,
    rpc_url: str = PUBLIC_MAINNET_RPC_URL,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    policy: SpendPolicy | None = None,
    sessions: SessionCache | None = None,
    session_cap: int = DEFAULT_SESSION_CAP,
) -> PayResult:
    """Send the request, answering a 402 with prepaid credit (a credit session on a paid route, a
    sign-in on a sign-in route) and/or an exact Solana payment. ``sessions`` keeps the credit
    sessions opened (default: this process's); a paid route this cache saw within the policy
    is called on its session straight away, with no 402."""
    policy = policy or SpendPolicy()
    wallet = str(keypair.pubkey())
    cache = PROCESS_CACHE if sessions is None else sessions
    origin = _origin(url)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        cached = cache.get(origin, wallet)
        if cached is not None and cached.prices.get(url, U64_MAX) <= policy.max_amount:
            result = await _on_session(session, method, url, data, cached, "reused")
            if result.status != 402:
                return result
            challenge = parse_challenge(result.headers, result.body)
            if challenge.error in RENEWED:
                cache.drop(origin, wallet)
                result = PayResult(result.status, result.body, result.headers, url)
            else:
                result.sign_in_refused = one_line(challenge.error or "refused", UNTRUSTED_CHARS)
        else:
            status, body, headers = await _send(session, method, url, data, {})
            result = PayResult(status, body, headers, url)
            if status != 402:
                return result
            challenge = parse_challenge(headers, body)
        extension = siwx_extension(challenge)
        if extension is not None and result.sign_in_refused is None:
            refused = await credit_refusal(session, method, url, challenge, policy)
            if refused is not None:
                raise refused
            result = await _spend_credit(
                session, method, url, data, keypair, extension, challenge, cache, session_cap
            )
            if result.status != 402:
                return result
            challenge = parse_challenge(result.headers, result.body)
            result.sign_in_refused = one_line(challenge.error or "refused", UNTRUSTED_CHARS)
        requirement = choose_requirement(challenge, policy, wallet)
        rpc = SolanaRpc(rpc_url, session)
        extensions = payment_identifier(challenge)
        try:
            mint = await _check_funds(rpc, requirement, keypair)
            payload = await create_exact_payment(
                rpc, requirement, keypair, resource=_resource(challenge), extensions=extensions, mint=mint
            )
        except SolanaRpcError as exc:
            raise rpc_failure("cannot build the payment", exc, rpc_url) from None
        except ValueError as exc:
            raise PayError(f"cannot build the payment: {exc}", "invalid_payment_requirements") from None
        name, value = payment_header(challenge, payload)
        retries = PAID_RETRIES if extensions else 0
        status, body, headers = await _send_paid(session, method, url, data, {name: value}, retries)
        result = PayResult(
            status,
            body,
            headers,
            url,
            paid=requirement,
            signed_in_as=result.signed_in_as,
            sign_in_refused=result.sign_in_refused,
            credit_session=result.credit_session,
            payment_id=extensions[PAYMENT_IDENTIFIER]["info"]["id"] if extensions else None,
        )
        settlement = headers.get("payment-response") or headers.get("x-payment-response")
        if settlement:
            try:
                result.settlement = decode_header(settlement, SettleResponse)
            except HeaderError:
                result.notes.append("PAYMENT-RESPONSE header could not be decoded")
        return result


def _parsed_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _origin(url: str) -> str:
    scheme, netloc = normalize_origin(url)
    return f"{scheme}://{netloc}"


def redirect_refusal(result: PayResult) -> str | None:
    """Why a redirect answer was not followed, naming its target; None when it is no redirect."""
    location = result.headers.get("location")
    if result.status not in REDIRECT_STATUSES or not location:
        return None
    try:
        target = urljoin(result.url, location)
        kind = "same origin" if _origin(target) == _origin(result.url) else "another origin"
        origin = _origin(result.url)
    except ValueError:  # a Location urllib cannot even split
        target, kind, origin = location, "unreadable", result.url
    where = f"redirect to {one_line(target, UNTRUSTED_CHARS)} ({kind}) not followed"
    if result.paid is not None:
        return f"{where}: the payment went to {origin} only, never to where it points"
    if result.signed_in_as is not None:
        return f"{where}: the sign-in went to {origin} only, never to where it points"
    return f"{where}: pay answers challenges only from the URL it was given; call that URL if you trust it"


def failure_reason(result: PayResult) -> str:
    """One line on why the final answer is not a success."""
    reason = f"HTTP {result.status}"
    if result.status == 429:
        after = one_line(result.headers.get("retry-after", ""), 40)
        reason += f" (Retry-After: {after} s)" if after.isdigit() else f" (Retry-After: {after or 'none'})"
    redirect = redirect_refusal(result)
    if redirect is not None:
        return f"{reason}: {redirect}"
    parsed = _parsed_body(result.body)
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            said = f"{error.get('code')}: {error.get('message')}"
            return f"{reason}: {one_line(said, UNTRUSTED_CHARS)}"
        if isinstance(error, str):
            return f"{reason}: {one_line(error, UNTRUSTED_CHARS)}"
    return reason


def default_rpc_url(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SOLANA_RPC_URL") or PUBLIC_MAINNET_RPC_URL


def _summary(result: PayResult) -> dict[str, Any]:
    """The ``--json`` object of a completed request."""
    parsed = _parsed_body(result.body)
    paid = None
    if result.paid is not None and result.settlement is not None and result.settlement.success:
        paid = {
            "amount": result.paid.amount,
            "asset": result.paid.asset,
            "payTo": result.paid.payTo,
            "network": result.paid.network,
            "transaction": result.settlement.transaction,
        }
    return {
        "ok": result.ok,
        "status": result.status,
        "body": parsed if parsed is not None else result.body.decode("utf-8", errors="replace"),
        "signedInAs": result.signed_in_as,
        "signInRefused": result.sign_in_refused,
        "creditLeftMicroUsdc": str(result.credit_left) if result.credit_left is not None else None,
        "creditSession": result.credit_session,
        "paid": paid,
        "paymentResponse": msgspec.to_builtins(result.settlement) if result.settlement else None,
        "paymentId": result.payment_id,
        "error": None if result.ok else failure_reason(result),
    }


def _narrate(result: PayResult, err: TextIO) -> None:
    """What happened, for a person, on stderr."""
    who = f"signed in as {result.signed_in_as}"
    if result.credit_session == "opened":
        who += ", credit session opened"
    elif result.credit_session == "reused":
        who = f"credit session of {result.signed_in_as} reused"
    if result.signed_in_as and result.sign_in_refused:
        print(f"{who}: refused ({result.sign_in_refused}), paying instead", file=err)
    elif result.signed_in_as:
        print(who, file=err)
    if result.credit_left is not None and result.ok:
        print(
            f"paid from prepaid credit, no transaction: {usdc_text(result.credit_left)} of credit left "
            f"(X-Credit-Balance: {result.credit_left})",
            file=err,
        )
    settled = result.settlement
    if result.paid is not None and settled is not None and settled.success:
        print(
            f"paid {usdc_text(int(result.paid.amount))} to {result.paid.payTo} "
            f"(transaction {settled.transaction})",
            file=err,
        )
    if settled is not None:
        print("PAYMENT-RESPONSE: " + msgspec.json.encode(settled).decode(), file=err)
    for note in result.notes:
        print(f"note: {note}", file=err)


def spend_policy(
    max_amount: str | None, usdc_mint: str | None, default_max: int = DEFAULT_MAX_AMOUNT
) -> SpendPolicy:
    """The policy ``--max-amount`` and ``--usdc-mint`` set (``default_max`` micro-USDC unless
    given); PayError (usage) when either is malformed."""
    policy = SpendPolicy(
        max_amount=default_max if max_amount is None else parse_usdc(max_amount),
        asset=usdc_mint or USDC_MAINNET_MINT,
    )
    if not _is_address(policy.asset):
        raise PayError(f"--usdc-mint {policy.asset[:64]!r} is not a Solana address", "usage")
    return policy


def report_refusal(exc: PayError, output: str, out: TextIO, err: TextIO, command: str = "pay") -> int:
    """A request refused or failed before any answer: one line (or one JSON object); exit 1."""
    if output == "json":
        print(json.dumps({"ok": False, "error": {"code": exc.code, "message": str(exc)}}), file=out)
    else:
        print(f"x402-gateway {command}: {one_line(str(exc))}", file=err)
    return 1


def report(
    result: PayResult,
    output: str,
    out: TextIO,
    err: TextIO,
    *,
    command: str = "pay",
    lines: Sequence[str] = (),
) -> int:
    """The last answer as ``output`` says (see :func:`run_pay`); ``lines`` add to the narration.
    0 on a 2xx answer, 1 otherwise with a one-line reason."""
    if output == "json":
        print(json.dumps(_summary(result)), file=out)
        return 0 if result.ok else 1
    text = result.body.decode("utf-8", errors="replace")
    print(text, file=out, end="" if text.endswith("\n") else "\n")
    if output != "quiet":
        _narrate(result, err)
        for line in lines:
            print(line, file=err)
    if not result.ok:
        print(f"x402-gateway {command}: {failure_reason(result)}", file=err)
        return 1
    return 0


async def run_pay(
    method: str,
    url: str,
    *,
    keypair_file: str,
    data: str | None = None,
    rpc_url: str | None = None,
    max_amount: str | None = None,
    usdc_mint: str | None = None,
    output: str = "text",
    wait: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
    session_file: str | None = None,
    session_cap_usdc: str | None = None,
) -> int:
    """The ``pay`` command: 0 on a 2xx answer, 1 otherwise, with a one-line reason on ``err``.
    On prepaid credit it calls on a credit session (``session_file`` keeps it for the next run).

    ``output``: ``text`` (body on ``out``, narration on ``err``), ``quiet`` (body only; errors
    still on ``err``) or ``json`` (one JSON object on ``out``, nothing on ``err``). ``wait``:
    a 429 is waited out (see :func:`waiting_out_rate_limits`).
    """
    out, err = out or sys.stdout, err or sys.stderr
    with waiting_out_rate_limits(wait, err if output == "text" else None):
        return await _run_pay(
            method,
            url,
            keypair_file,
            data,
            rpc_url,
            max_amount,
            usdc_mint,
            output,
            out,
            err,
            session_file,
            session_cap_usdc,
        )


async def _run_pay(
    method: str,
    url: str,
    keypair_file: str,
    data: str | None,
    rpc_url: str | None,
    max_amount: str | None,
    usdc_mint: str | None,
    output: str,
    out: TextIO,
    err: TextIO,
    session_file: str | None,
    session_cap_usdc: str | None,
) -> int:
    try:
        policy = spend_policy(max_amount, usdc_mint)
        keypair = load_keypair(keypair_file)
        body: bytes | None = None
        if data is not None:
            try:
                body = msgspec.json.encode(msgspec.json.decode(data))
            except msgspec.DecodeError:
                raise PayError("--data is not valid JSON", "usage") from None
        cap = session_cap(session_cap_usdc)
        cache = SessionCache(session_file) if session_file else None
        result = await pay(
            method.upper(),
            url,
            keypair,
            data=body,
            rpc_url=rpc_url or default_rpc_url(),
            policy=policy,
            sessions=cache,
            session_cap=cap,
        )
    except PayError as exc:
        return report_refusal(exc, output, out, err)
    return report(result, output, out, err)


# --- balance --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WalletBalance:
    wallet: str
    lamports: int
    usdc: int
    token_account: str
    mint: str


def sol_text(lamports: int) -> str:
    return f"{lamports / 10**9:.9f}".rstrip("0").rstrip(".") + " SOL"


async def fetch_wallet_balance(rpc_url: str, wallet: str, mint: str = USDC_MAINNET_MINT) -> WalletBalance:
    """SOL and USDC of ``wallet``: its lamports and its associated token account for ``mint``."""
    try:
        owner = Pubkey.from_string(wallet)
    except ValueError:
        raise PayError(f"{wallet[:64]!r} is not a Solana address", "usage") from None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_S)) as session:
        rpc = SolanaRpc(rpc_url, session)
        try:
            info = await fetch_mint_info(rpc, mint)
            usdc = await fetch_token_balance(rpc, owner, info)
            lamports = await rpc.get_balance(wallet)
        except SolanaRpcError as exc:
            raise rpc_failure("cannot read the balance", exc, rpc_url) from None
        except ValueError as exc:
            raise PayError(f"mint {mint}: {exc}", "rpc_failed") from None
    account = associated_token_address(
        owner, Pubkey.from_string(mint), Pubkey.from_string(info.token_program)
    )
    return WalletBalance(wallet, lamports, usdc, str(account), mint)


async def run_balance(
    wallet: str,
    *,
    rpc_url: str | None = None,
    usdc_mint: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The ``balance`` command: the wallet's USDC and SOL on the node at ``rpc_url``."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        found = await fetch_wallet_balance(
            rpc_url or default_rpc_url(), wallet, usdc_mint or USDC_MAINNET_MINT
        )
    except PayError as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": {"code": exc.code, "message": str(exc)}}), file=out)
        else:
            print(f"x402-gateway balance: {exc}", file=err)
        return 1
    if as_json:
        print(json.dumps({"ok": True, **dataclasses.asdict(found)}), file=out)
        return 0
    print(f"wallet:         {found.wallet}", file=out)
    print(f"USDC:           {usdc_text(found.usdc)}  (token account {found.token_account})", file=out)
    print(f"SOL:            {sol_text(found.lamports)}", file=out)
    return 0
