"""How the payment core's results sound on the wire: 402 challenges, refusals, paid answers.

Shared by :class:`~middleware.exact.X402Exact` (refusals, replays, reconciliations) and
:class:`~middleware.settle.SettleAfterSuccess` (settlements), so neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.asgi import Scope, Send, send_bytes, send_error
from gateway.context import Outcome, request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import log_event
from gateway.payments import (
    Delivered,
    Failed,
    Interrupted,
    PaidRequest,
    Pending,
    Refused,
    Settled,
    StoredResponse,
)
from gateway.payments.offer import RouteOffers
from gateway.rate_limiter import RateLimiter


def pending_error() -> GatewayError:
    """The settlement's outcome is not known: retry the same request, never pay again."""
    return GatewayError(
        ErrorCode.SETTLEMENT_PENDING,
        "settlement is not confirmed yet; retry the same request with the same payment",
        headers={"Retry-After": "2"},
    )


async def send_stored(send: Send, response: StoredResponse) -> None:
    """Deliver a settled response (first time or replay) with both payment-response headers."""
    headers = [(b"content-type", response.content_type.encode())]
    if response.payment_response:
        value = response.payment_response.encode()
        headers += [(b"payment-response", value), (b"x-payment-response", value)]
    await send_bytes(send, response.status, response.body, headers)


class PaymentAnswers:
    """One route's renderings; the offers (challenges and fee payers) are the route's own."""

    def __init__(self, *, route_name: str, offers: RouteOffers, limiter: RateLimiter) -> None:
        self.route_name = route_name
        self.offers = offers
        self.limiter = limiter

    async def send_challenge(self, send: Send, error: str | None = None) -> None:
        """The 402: one ``accepts`` entry per facilitator, the healthy ones first."""
        offered = await self.offers.offered()
        body, headers = offered[0][0].offering(offered, error)
        await send({"type": "http.response.start", "status": 402, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def refused(self, scope: Scope, send: Send, refused: Refused) -> None:
        """A fresh challenge naming the reason; a refusal earns a challenge, so it is counted."""
        ctx = request_context(scope)
        ctx.outcome, ctx.error = Outcome.REJECTED, refused.reason
        ctx.payer = refused.payer or ctx.payer
        log_event("payment rejected", route=self.route_name, reason=refused.reason, payer=ctx.payer)
        await self.limiter.challenge(scope)
        await self.send_challenge(send, refused.reason)

    async def replayed(self, scope: Scope, send: Send, response: StoredResponse) -> None:
        """An answer paid for once, given again from the store: free for the client, so it counts
        against the client IP's challenge limit like any other unpaid answer."""
        request_context(scope).outcome = Outcome.REPLAYED
        await self.limiter.challenge(scope)
        await send_stored(send, response)

    async def settled(self, scope: Scope, send: Send, paid: PaidRequest, settled: Settled) -> None:
        """The paid answer, a 402 or the one error shape; never "nothing was charged" once the
        facilitator may have been asked (Pending and Interrupted say "retry, do not re-pay")."""
        ctx = request_context(scope)
        match settled:
            case Delivered(response=response, settlement=settlement):
                ctx.outcome, ctx.settlement = Outcome.PAID, settlement
                ctx.amount = paid.requirements.amount  # also on a reconciling retry, which skipped the claim
                await send_stored(send, response)
            case Pending():
                ctx.outcome = Outcome.SETTLEMENT_PENDING
                await send_error(send, pending_error())
            case Interrupted():
                # The core caught the cancellation to record it; the shutdown itself goes on.
                ctx.outcome = Outcome.SETTLEMENT_PENDING
                with contextlib.suppress(Exception):  # the client may still hear it: retry, do not re-pay
                    await send_error(send, pending_error())
                raise asyncio.CancelledError
            case Failed(reason=reason):
                ctx.outcome, ctx.error = Outcome.SETTLE_FAILED, reason
                await self.send_challenge(send, "settlement_failed")
            case Refused():
                await self.refused(scope, send, settled)
