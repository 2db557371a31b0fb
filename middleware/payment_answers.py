"""How a payment method's decisions sound on the wire: 402 challenges, refusals, paid answers.

Every method speaks the same values (:mod:`gateway.methods`, :mod:`gateway.methods.results`),
so one renderer serves them all; the 402 itself is the route's, composed by the access layer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from gateway.errors import ErrorCode, GatewayError
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.exact.ledger import StoredResponse
from gateway.methods.results import Delivered, Failed, Interrupted, Pending, Refused, Settled
from gateway.methods.seam import Offer
from gateway.routing.vocabulary import Outcome
from gateway.telemetry.logs import log_event
from gateway.web.asgi import Scope, Send, send_bytes, send_error
from gateway.web.context import request_context
from gateway.x402.headers import CREDIT_BALANCE_HEADER

ChallengeFor = Callable[[Scope, str | None], Awaitable[Offer]]
"""The route's 402 for a request, naming why its credential was refused (or not)."""


def pending_error() -> GatewayError:
    """The settlement's outcome is not known: retry the same request, never pay again."""
    return GatewayError(
        ErrorCode.SETTLEMENT_PENDING,
        "settlement is not confirmed yet; retry the same request with the same payment",
        headers={"Retry-After": "2"},
    )


async def send_stored(send: Send, response: StoredResponse) -> None:
    """Deliver a paid response (first time or replay) with its receipt: both payment-response
    headers, the credit left, or another method's own receipts."""
    headers = [(b"content-type", response.content_type.encode())]
    if response.payment_response:
        value = response.payment_response.encode()
        headers += [(b"payment-response", value), (b"x-payment-response", value)]
    if response.credit_balance:
        headers.append((CREDIT_BALANCE_HEADER, response.credit_balance.encode()))
    headers += [(name.lower().encode(), value.encode()) for name, value in response.receipts.items()]
    await send_bytes(send, response.status, response.body, headers)


class PaymentAnswers:
    """One route's renderings; ``challenge`` gives the route's 402."""

    def __init__(self, *, route_name: str, challenge: ChallengeFor, limiter: RateLimiter) -> None:
        self.route_name = route_name
        self.challenge = challenge
        self.limiter = limiter

    async def send_challenge(self, scope: Scope, send: Send, error: str | None = None) -> None:
        offer = await self.challenge(scope, error)
        await send({"type": "http.response.start", "status": 402, "headers": offer.headers})
        await send({"type": "http.response.body", "body": offer.body})

    async def refused(self, scope: Scope, send: Send, refused: Refused) -> None:
        """A fresh challenge naming the reason; a refusal earns a challenge, so it is counted. A
        probe for credit that found none is its own outcome, never a failed payment."""
        ctx = request_context(scope)
        ctx.outcome, ctx.error = refused.outcome, refused.reason
        ctx.payer = refused.payer or ctx.payer
        if refused.outcome is Outcome.REJECTED:
            log_event("payment rejected", route=self.route_name, reason=refused.reason, payer=ctx.payer)
        await self.limiter.challenge(scope, probe=refused.probe)
        await self.send_challenge(scope, send, refused.reason)

    async def replayed(self, scope: Scope, send: Send, response: StoredResponse) -> None:
        """An answer paid for once, given again from the store: free for the client, so it counts
        against the client IP's challenge limit like any other unpaid answer."""
        request_context(scope).outcome = Outcome.REPLAYED
        await self.limiter.challenge(scope)
        await send_stored(send, response)

    async def in_progress(self, scope: Scope, send: Send, message: str) -> None:
        """409: the identical request is still being answered; free for the client, so counted
        against the client IP's challenge limit like a replay."""
        await self.limiter.challenge(scope)
        await send_error(
            send, GatewayError(ErrorCode.CALL_IN_PROGRESS, message, headers={"Retry-After": "1"})
        )

    async def settled(self, scope: Scope, send: Send, settled: Settled) -> None:
        """The paid answer, a 402 or the one error shape; never "nothing was charged" once the
        facilitator may have been asked (Pending and Interrupted say "retry, do not re-pay")."""
        ctx = request_context(scope)
        match settled:
            case Delivered(response=response, settlement=settlement, outcome=outcome):
                ctx.outcome, ctx.settlement = outcome, settlement or None
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
                await self.send_challenge(scope, send, "settlement_failed")
            case Refused():
                await self.refused(scope, send, settled)
