"""Credit sessions: one sign-in, many calls on prepaid credit.

A wallet signs in once (sign-in-with-x) to open a session: a short-lived bearer token bound to
the wallet, this gateway's origin and a spending cap the wallet signed. The cap and the lifetime
travel in the query of the sign-in's resource URL (``?capMicroUsdc=N&ttlSeconds=S``), which the
wallet signs and the challenge's nonce is keyed to, so neither can be changed after signing; the
challenge's statement names both. A call then carries the token in ``X-CREDIT-SESSION`` instead
of a fresh sign-in: no 402, no signature, and one store round trip before the provider
(:func:`gateway.store.credit.spend_credit_session`: the session live, its cap less what it spent
covering the price, the wallet's free credit covering it, the route's buckets, then the spend
counted and the price held). The hold is taken once the provider answered, as any credit hold;
a call that took nothing gives its share of the cap back.

The token names its wallet (``xcs1.<wallet>.<random>``), so a call's credit keys, and the
session's own key among them, are known before the store is asked; the store keeps only the
SHA-256 of this gateway's origin and the token, never the token, and checks the session's wallet
is the token's. A token altered in any
part, or presented at another origin sharing the store, names no session. A stolen token spends
at most what is left of its cap, until it expires or is revoked (``DELETE`` with the header).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import msgspec
from solders.pubkey import Pubkey

from gateway.limits.rate_limiter import Limited, RateLimiter
from gateway.methods.credit.book import CreditBook, CreditHold
from gateway.routing.routes import RateLimitSpec
from gateway.routing.vocabulary import CREDIT_SESSION
from gateway.store import CreditSessionSpend, CreditSessionState, SessionSpent, Store, keys
from gateway.store.credit import (
    open_credit_session,
    refund_credit_session,
    revoke_credit_session,
    spend_credit_session,
)
from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.siwx import EXTENSION_KEY
from gateway.x402.types import PaymentRequired, SiwxPayload

SESSION_HEADER = CREDIT_SESSION.header
DEFAULT_LIFETIME_S = 3600
"""A session's lifetime when the sign-in asks none: one hour, also the longest."""
MAX_LIFETIME_S = 3600
MAX_CAP_MICRO_USDC = 1_000_000_000
"""The largest cap a session may ask: 1,000 USDC (the credit itself bounds what it spends)."""
CAP_PARAM, LIFETIME_PARAM = "capMicroUsdc", "ttlSeconds"
TOKEN_PREFIX = "xcs1"
_TOKEN = re.compile(rf"{TOKEN_PREFIX}\.([1-9A-HJ-NP-Za-km-z]{{32,44}})\.([A-Za-z0-9_-]{{43}})")

SESSION_UNKNOWN = "credit_session_unknown"
"""The 402 reason of a token that names no live session: never opened, expired or revoked."""
STATEMENT_MISMATCH = "siwx_statement_mismatch"
"""The 402 reason of a session sign-in whose signed statement is not the one its terms state."""
SESSION_CAP_REACHED = "credit_session_cap_reached"
"""The 402 reason of a call the session's cap less what it spent does not cover."""


def new_token(wallet: str) -> str:
    """A fresh session token for ``wallet``: its prefix, the wallet and 256 random bits."""
    return f"{TOKEN_PREFIX}.{wallet}.{secrets.token_urlsafe(32)}"


def token_wallet(token: str) -> str | None:
    """The wallet a well-formed token names; None for anything else (no store round trip)."""
    found = _TOKEN.fullmatch(token.strip())
    if found is None:
        return None
    try:
        Pubkey.from_string(found[1])
    except ValueError:
        return None
    return found[1]


def usdc_words(micro: int) -> str:
    """``500000`` -> ``"0.5 USDC"``."""
    text = f"{Decimal(micro) / 1_000_000:f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + " USDC"


def lifetime_words(seconds: int) -> str:
    """``3600`` -> ``"1 hour"``, ``900`` -> ``"15 minutes"``, ``90`` -> ``"90 seconds"``."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} second{'' if seconds == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class SessionTerms:
    """What a wallet signs to open a session: the resource URL carrying its cap and lifetime
    (the route's input schema bounds both, 400 otherwise), and the statement naming them."""

    origin: str

    def signed(self, resource: str, query: Mapping[str, Any]) -> tuple[str, str]:
        cap, lifetime = int(query[CAP_PARAM]), int(query.get(LIFETIME_PARAM, DEFAULT_LIFETIME_S))
        url = f"{resource}?{CAP_PARAM}={cap}&{LIFETIME_PARAM}={lifetime}"
        statement = (
            f"Open a credit session on {self.origin}: spend at most {usdc_words(cap)} of prepaid "
            f"credit for {lifetime_words(lifetime)}."
        )
        return url, statement


def signed_statement(header_value: str) -> str | None:
    """The statement a (verified) ``SIGN-IN-WITH-X`` header signed."""
    try:
        return decode_header(header_value, SiwxPayload).statement
    except HeaderError:
        return None


def with_statement(document: PaymentRequired, statement: str) -> PaymentRequired:
    """``document`` whose sign-in challenge carries ``statement`` (what the wallet signs)."""
    extensions = dict(document.extensions or {})
    extension = extensions[EXTENSION_KEY]
    info = msgspec.structs.replace(extension.info, statement=statement)
    extensions[EXTENSION_KEY] = msgspec.structs.replace(extension, info=info, statement=statement)
    return msgspec.structs.replace(document, extensions=extensions)


@dataclass(frozen=True, slots=True)
class OpenedSession:
    token: str
    wallet: str
    cap: int
    expires_at: int
    """Unix seconds."""


@dataclass(frozen=True, slots=True)
class SessionCall:
    """What one call on a session came to: its hold, or why not (the store's outcome, or a
    bucket's refusal)."""

    outcome: SessionSpent
    hold: CreditHold | None = None
    limited: Limited | None = None


class CreditSessions:
    """Opens, spends and revokes the credit sessions of one origin in the shared store; every
    call may raise ``StoreUnavailable``."""

    def __init__(self, store: Store, origin: str, book: CreditBook) -> None:
        self.store = store
        self.origin = origin
        self.book = book

    def key(self, wallet: str, token: str) -> str:
        """Where the session of ``token`` (which names ``wallet``) lives: among ``wallet``'s keys,
        under the SHA-256 of this origin and the token. A token whose wallet part was altered
        names another key, and its digest no session."""
        digest = hashlib.sha256(f"{self.origin}\n{token.strip()}".encode()).hexdigest()
        return keys.credit_session(wallet, digest)

    async def open(self, wallet: str, cap: int, lifetime_s: int) -> OpenedSession:
        token = new_token(wallet)
        await open_credit_session(self.store, self.key(wallet, token), wallet, cap, lifetime_s * 1000)
        return OpenedSession(token, wallet, cap, int(time.time()) + lifetime_s)

    async def revoke(self, token: str) -> CreditSessionState | None:
        """End the session of ``token`` (None: there was none live); calls in flight finish."""
        wallet = token_wallet(token)
        if wallet is None:
            return None
        return await revoke_credit_session(self.store, self.key(wallet, token))

    async def spend(
        self,
        token: str,
        wallet: str,
        amount: int,
        limiter: RateLimiter,
        limits: tuple[RateLimitSpec, ...],
        client_ip: str,
    ) -> SessionCall:
        """Hold ``amount`` of ``wallet``'s credit (the wallet ``token`` names) on the session of
        ``token``, in one round trip on the wallet's keys."""
        order = self.book.order(wallet, amount)
        plan = limiter.plan(limits, wallet=wallet, ip=client_ip)
        session = self.key(wallet, token)
        found = await spend_credit_session(self.store, CreditSessionSpend(session, order), plan.buckets)
        if found.outcome is SessionSpent.LIMITED:
            return SessionCall(found.outcome, limited=plan.refusal(found.decisions))
        if found.outcome is not SessionSpent.SPENT or found.held is None:
            return SessionCall(found.outcome)
        hold = dataclasses.replace(self.book.held(order, found.held), session=session)
        return SessionCall(found.outcome, hold=hold)

    async def refund(self, hold: CreditHold) -> None:
        """The call took nothing: drop its hold and give its share of the cap back."""
        holds = keys.credit_holds(hold.wallet)
        await refund_credit_session(self.store, hold.session, holds, hold.token, hold.amount)
