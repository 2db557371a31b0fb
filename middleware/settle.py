"""SettleAfterSuccess: buffer the handler's answer; settle only when the upstream succeeded.

``challenged -> verified -> claimed -> upstream_ok -> settled``; an upstream failure passes
its 502/504 through with nothing settled (the claim stays, so the authorization is dead), a
settlement failure withholds the body behind a 402 ``settlement_failed``, and an unknown
settlement outcome is recorded so a retry reconciles instead of paying twice.
"""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, send_bytes, send_error
from gateway.context import request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators import Facilitator, FacilitatorUnavailable
from gateway.logs import log_event
from gateway.payments import PaymentLedger, PendingSettlement, StoredResponse
from gateway.routes import RouteSpec
from gateway.services import Services
from gateway.store import StoreUnavailable
from gateway.x402.challenge import ExactChallenge
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements
from middleware.exact import PaidRequest, send_challenge, send_stored


class Settler:
    """Settles one route's payments and answers the client, whatever the outcome."""

    def __init__(
        self, route: RouteSpec, services: Services, facilitator: Facilitator, challenge: ExactChallenge
    ) -> None:
        self.route = route
        self.services = services
        self.facilitator = facilitator
        self.challenge = challenge
        self.ledger = PaymentLedger(services.store)

    async def settle_and_respond(
        self,
        payload: PaymentPayload,
        requirements: PaymentRequirements,
        signature: str,
        fingerprint: str,
        payment_id: str | None,
        response: StoredResponse | None,
        scope: Scope,
        send: Send,
        *,
        reconciling: bool = False,
    ) -> None:
        """Settle and answer. ``reconciling``: a retry of a pending settlement, where the
        facilitator's ``duplicate_settlement`` with a transaction means the first broadcast landed
        (the earlier answer was lost), so the client gets what it paid for."""
        ctx = request_context(scope)
        try:
            result = await self.facilitator.settle(payload, requirements)
        except FacilitatorUnavailable:
            result = None
        except asyncio.CancelledError:
            # Stopped mid-settle (a shutdown past its graceful timeout): the broadcast may have
            # landed, so the settlement is left pending for a retry (on any replica) to reconcile.
            ctx.outcome = "settlement_pending"
            await asyncio.shield(self._record_pending(signature, PendingSettlement(fingerprint, response)))
            log_event("payment settlement interrupted, left pending", route=self.route.name, payer=ctx.payer)
            with contextlib.suppress(Exception):  # the client may still hear it: retry, do not re-pay
                await send_error(send, _pending_error())
            raise
        if (
            reconciling
            and result is not None
            and result.errorReason == "duplicate_settlement"
            and result.transaction
        ):
            result = msgspec.structs.replace(result, success=True, errorReason=None, errorMessage=None)
        if result is not None and result.success and response is not None:
            delivered = StoredResponse(
                status=response.status,
                body=response.body,
                content_type=response.content_type,
                payment_response=encode_header(result),
                settlement=result.transaction,
            )
            ctx.outcome, ctx.settlement = "paid", result.transaction
            ctx.amount = requirements.amount  # also on a reconciling retry, which skipped the claim
            log_event(
                "payment settled",
                route=self.route.name,
                payer=ctx.payer,
                amount=requirements.amount,
                settlement=result.transaction,
            )
            await self._remember(signature, fingerprint, payment_id, delivered)
            await send_stored(send, delivered)
            return
        if result is None or result.errorReason == "settlement_pending":
            ctx.outcome = "settlement_pending"
            record = PendingSettlement(fingerprint, response, result.transaction if result else "")
            await self._record_pending(signature, record)
            log_event("payment settlement pending", route=self.route.name, payer=ctx.payer)
            raise _pending_error()
        ctx.outcome, ctx.error = "settle_failed", result.errorReason or "settlement_failed"
        log_event("payment settlement failed", route=self.route.name, payer=ctx.payer, reason=ctx.error)
        await send_challenge(send, self.challenge, self.facilitator, "settlement_failed")

    async def _record_pending(self, signature: str, record: PendingSettlement) -> None:
        try:
            await self.ledger.record_pending(signature, record)
        except StoreUnavailable:
            log_event("pending settlement not recorded: store unavailable", route=self.route.name)

    async def _remember(
        self, signature: str, fingerprint: str, payment_id: str | None, delivered: StoredResponse
    ) -> None:
        """Close a pending record and keep the response for payment-identifier replays."""
        try:
            await self.ledger.resolve_pending(signature)
            if payment_id is not None and len(delivered.body) <= self.route.replay_cap_bytes:
                await self.ledger.complete_payment_id(payment_id, fingerprint, delivered)
        except StoreUnavailable:
            log_event("settled response not stored for replay: store unavailable", route=self.route.name)


def _pending_error() -> GatewayError:
    return GatewayError(
        ErrorCode.SETTLEMENT_PENDING,
        "settlement is not confirmed yet; retry the same request with the same payment",
        headers={"Retry-After": "2"},
    )


class _Buffer:
    """Collects the inner app's response instead of sending it."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))

    @property
    def content_type(self) -> str:
        for key, value in self.headers:
            if key.lower() == b"content-type":
                return str(value.decode("latin-1"))
        return "application/json"


class SettleAfterSuccess:
    def __init__(self, app: ASGIApp, settler: Settler) -> None:
        self.app = app
        self.settler = settler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        paid: PaidRequest = scope["state"]["payment"]
        buffer = _Buffer()
        try:
            await self.app(scope, receive, buffer.send)
        except GatewayError:  # the handler's 502/504: discarded all the same
            await self._discard(scope, paid)
            raise
        body = b"".join(buffer.chunks)
        if buffer.status != 200 or not scope["state"].get("upstream_ok"):
            await self._discard(scope, paid)
            await send_bytes(send, buffer.status, body, buffer.headers)
            return
        response = StoredResponse(status=200, body=body, content_type=buffer.content_type)
        await self.settler.settle_and_respond(
            paid.payload, paid.requirements, paid.signature, paid.fingerprint, paid.payment_id,
            response, scope, send,
        )  # fmt: skip

    async def _discard(self, scope: Scope, paid: PaidRequest) -> None:
        """Upstream failed: nothing is settled, the claim stays, the flow counts as failed."""
        ctx = request_context(scope)
        ctx.outcome = "upstream_failed"
        log_event("payment discarded: upstream failed", route=self.settler.route.name, payer=paid.payer)
