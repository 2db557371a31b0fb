"""The prepaid-credit routes: a top-up's answer and a wallet's balance, in the asset-data envelope.

A top-up (``handler: credit_top_up``, an ``exact`` route whose price is the credit it sells)
answers once its payment was verified; the credit itself is booked by the settlement, in the
round trip that delivers this answer, so the answer states the balance the wallet will have
(its balance read now plus the top-up) and when it lapses. The balance route
(``handler: credit_balance``, behind sign-in) reads the signed-in wallet's credit and, asked
with ``?movements=N``, its N latest movements from the ledger of record (a gateway without a
ledger refuses that with 400: it keeps no movements to list, and an empty list would say there
were none). A credit session is opened behind a sign-in that signed its cap and lifetime
(``handler: credit_session_open``) and revoked by its token (``handler: credit_session_revoke``,
:mod:`gateway.methods.credit.sessions`). Amounts are decimal strings of micro-USDC, times Unix seconds.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.ledger import LedgerUnavailable, Recorded
from gateway.ledger.recorder import MoneyRecorder
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.credit.book import Balance, CreditBook
from gateway.methods.credit.sessions import (
    CAP_PARAM,
    DEFAULT_LIFETIME_S,
    LIFETIME_PARAM,
    SESSION_HEADER,
    CreditSessions,
    token_wallet,
)
from gateway.methods.credit.wire import (
    BalanceResult,
    CreditEnvelope,
    Movement,
    Result,
    RevokedResult,
    SessionResult,
    TopUpResult,
)
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, header, send_bytes
from gateway.web.context import request_context, validated_input

PROVIDER: Final = "credits"


def _envelope(method: str, result: Result) -> bytes:
    return msgspec.json.encode(CreditEnvelope(True, PROVIDER, PROVIDER, method, result))


class TopUpHandler:
    """The answer to a verified top-up of ``amount`` micro-USDC (credited at its delivery)."""

    def __init__(self, book: CreditBook, amount: int) -> None:
        self.book = book
        self.amount = amount

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        wallet = request_context(scope).payer
        if wallet is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "top-up is served without a payment")
        now = await self.book.balance(wallet)
        result = TopUpResult(
            wallet=wallet,
            balanceMicroUsdc=str(now.balance + self.amount),
            expiresAt=int(time.time() + self.book.lapse_ms / 1000),
        )
        await send_bytes(send, 200, _envelope("topUp", result), (JSON_CONTENT_TYPE,))


def _movement(entry: Recorded) -> Movement:
    return Movement(
        kind=entry.kind.value,
        amountMicroUsdc=str(entry.amount_micro),
        route=entry.route,
        at=entry.occurred_at_ms // 1000,
        signature=entry.signature,
    )


class BalanceHandler:
    """The signed-in wallet's credit, and its latest movements when asked."""

    def __init__(self, book: CreditBook, recorder: MoneyRecorder) -> None:
        self.book = book
        self.recorder = recorder
        """Read at each request: the ledger opens when the services start, after the app is built."""

    async def _movements(self, wallet: str, limit: int) -> list[Movement]:
        journal = self.recorder.journal
        if journal is None:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                "movements are listed from the ledger of record, which this gateway does not keep",
            )
        try:
            return [_movement(entry) for entry in await journal.movements(wallet, limit)]
        except LedgerUnavailable:
            raise GatewayError(ErrorCode.STORE_UNAVAILABLE, "the ledger of record is unavailable") from None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        signed = request_context(scope).sign_in
        if signed is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "balance is served without sign-in")
        limit: int | None = validated_input(scope).query.get("movements")
        movements = await self._movements(signed.address, limit) if limit is not None else None
        balance: Balance = await self.book.balance(signed.address)
        result = BalanceResult(
            wallet=balance.wallet,
            balanceMicroUsdc=str(balance.balance),
            heldMicroUsdc=str(balance.held),
            expiresAt=balance.expires_at,
            movements=movements,
        )
        await send_bytes(send, 200, _envelope("balance", result), (JSON_CONTENT_TYPE,))


class SessionOpenHandler:
    """Open a credit session for the signed-in wallet, with the cap and lifetime it signed (the
    sign-in's resource carried them: :class:`gateway.methods.credit.sessions.SessionTerms`)."""

    def __init__(self, sessions: CreditSessions) -> None:
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        signed, given = ctx.sign_in, ctx.input
        if signed is None or given is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "a credit session is opened without sign-in")
        cap = int(given.query[CAP_PARAM])
        lifetime = int(given.query.get(LIFETIME_PARAM, DEFAULT_LIFETIME_S))
        opened = await self.sessions.open(signed.address, cap, lifetime)
        result = SessionResult(opened.token, opened.wallet, str(opened.cap), opened.expires_at)
        headers = (JSON_CONTENT_TYPE, (b"cache-control", b"no-store"))
        await send_bytes(send, 200, _envelope("openSession", result), headers)


class SessionRevokeHandler:
    """Revoke the credit session whose token the request carries: it spends nothing more. Each
    revocation counts against the client IP's challenge limit before the store is asked (429
    past it), so guessing tokens is bounded like any other unpaid request."""

    def __init__(self, sessions: CreditSessions, limiter: RateLimiter) -> None:
        self.sessions = sessions
        self.limiter = limiter
        self.header = SESSION_HEADER.lower().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.limiter.challenge(scope)
        token = header(scope, self.header)
        if not token or token_wallet(token) is None:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"{SESSION_HEADER} must carry a credit session token"
            )
        revoked = await self.sessions.revoke(token)
        if revoked is None:
            gone = "no live credit session under this token (expired, revoked or never opened)"
            raise GatewayError(ErrorCode.NOT_FOUND, gone)
        result = RevokedResult(revoked.wallet, str(revoked.cap), str(revoked.spent))
        await send_bytes(send, 200, _envelope("revokeSession", result), (JSON_CONTENT_TYPE,))
