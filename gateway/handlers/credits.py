"""The prepaid-credit routes: a top-up's answer and a wallet's balance, in the asset-data envelope.

A top-up (``handler: credit_top_up``, an ``exact`` route whose price is the credit it sells)
answers once its payment was verified; the credit itself is booked by the settlement, in the
round trip that delivers this answer, so the answer states the balance the wallet will have
(its balance read now plus the top-up) and when it lapses. The balance route
(``handler: credit_balance``, behind sign-in) reads the signed-in wallet's credit.
Amounts are decimal strings of micro-USDC, times Unix seconds.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from gateway.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes
from gateway.context import request_context
from gateway.credits import Balance, CreditBook
from gateway.errors import ErrorCode, GatewayError

PROVIDER: Final = "credits"


class TopUpResult(msgspec.Struct):
    wallet: str
    balanceMicroUsdc: str
    expiresAt: int


class BalanceResult(msgspec.Struct):
    wallet: str
    balanceMicroUsdc: str
    heldMicroUsdc: str
    expiresAt: int


class CreditEnvelope(msgspec.Struct):
    ok: bool
    provider: str
    surface: str
    method: str
    result: TopUpResult | BalanceResult


def _envelope(method: str, result: TopUpResult | BalanceResult) -> bytes:
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


class BalanceHandler:
    """The signed-in wallet's credit."""

    def __init__(self, book: CreditBook) -> None:
        self.book = book

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        signed = request_context(scope).sign_in
        if signed is None:
            raise GatewayError(ErrorCode.INTERNAL_ERROR, "balance is served without sign-in")
        balance: Balance = await self.book.balance(signed.address)
        result = BalanceResult(
            wallet=balance.wallet,
            balanceMicroUsdc=str(balance.balance),
            heldMicroUsdc=str(balance.held),
            expiresAt=balance.expires_at,
        )
        await send_bytes(send, 200, _envelope("balance", result), (JSON_CONTENT_TYPE,))
