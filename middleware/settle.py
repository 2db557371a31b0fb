"""SettleAfterSuccess: buffer the handler's answer; settle only when the upstream succeeded.

``challenged -> verified -> claimed -> upstream_ok -> intent recorded -> settled``; an upstream
failure passes its 502/504 through with nothing settled (the claim stays, so the authorization
is dead), a settlement failure withholds the body behind a 402 ``settlement_failed``.

Write-ahead: the intent to settle (payment key, request fingerprint, withheld response) is in the
store *before* the facilitator is asked. Whatever happens after (a pending confirmation, a silent
facilitator, a store outage, the process killed), the record survives, and a retry of the
identical request, on any replica, reconciles it: the facilitator answers for the one message it
knows, nothing is broadcast twice, and exactly one request delivers the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, send_bytes, send_error
from gateway.context import request_context
from gateway.errors import GatewayError
from gateway.facilitators import ChallengeFeePayer, Facilitator, FacilitatorUnavailable
from gateway.logs import log_event
from gateway.payments import PaymentLedger, PendingSettlement, StoredResponse
from gateway.routes import RouteSpec
from gateway.services import Services
from gateway.store import StoreUnavailable
from gateway.x402.challenge import ExactChallenge
from gateway.x402.headers import encode_header
from gateway.x402.types import SettleResponse
from middleware.exact import PaidRequest, PaymentRejected, pending_error, send_challenge, send_stored

DUPLICATE_SETTLEMENT = "duplicate_settlement"


class Settler:
    """Settles one route's payments and answers the client, whatever the outcome."""

    def __init__(
        self,
        route: RouteSpec,
        services: Services,
        facilitator: Facilitator,
        challenge: ExactChallenge,
        fee_payer: ChallengeFeePayer,
    ) -> None:
        self.route = route
        self.services = services
        self.facilitator = facilitator
        self.challenge = challenge
        self.fee_payer = fee_payer
        self.ledger = PaymentLedger(services.store)

    async def settle_and_respond(
        self,
        paid: PaidRequest,
        intent: PendingSettlement,
        scope: Scope,
        send: Send,
        *,
        reconciling: bool = False,
    ) -> None:
        """Settle and answer. ``reconciling``: a retry of the identical request whose ``intent``
        was recorded earlier; there the facilitator's ``duplicate_settlement`` naming the same
        transaction means the first broadcast landed and its answer was lost, so this request
        may deliver what was paid for (once: see :meth:`_deliver_once`)."""
        ctx = request_context(scope)
        if not reconciling:
            # Nothing may reach the facilitator before the intent is stored; a failure here is
            # the truthful "nothing was charged" of the caller.
            await self.ledger.record_pending(paid.key, intent)
        ctx.settling = True
        try:
            result: SettleResponse | None = await self.facilitator.settle(paid.payload, paid.requirements)
        except (FacilitatorUnavailable, StoreUnavailable):
            result = None
        except asyncio.CancelledError:
            # Stopped mid-settle (a shutdown past its graceful timeout): the broadcast may have
            # landed; the intent recorded above lets a retry (on any replica) reconcile.
            ctx.outcome = "settlement_pending"
            log_event("payment settlement interrupted, left pending", route=self.route.name, payer=paid.payer)
            with contextlib.suppress(Exception):  # the client may still hear it: retry, do not re-pay
                await send_error(send, pending_error())
            raise
        if result is None or result.errorReason == "settlement_pending":
            await self._left_pending(paid, intent, result, scope)
            raise pending_error()
        settled = result.success or (
            reconciling
            and result.errorReason == DUPLICATE_SETTLEMENT
            and bool(result.transaction)
            and intent.transaction in ("", result.transaction)
        )
        if settled and intent.response is not None:
            if await self._deliver_once(paid, result, intent, scope):
                await self._deliver(paid, result, intent.response, scope, send)
                return
            raise PaymentRejected("payment_already_used", "this payment's answer was delivered already")
        if reconciling and not intent.transaction:
            # The request that recorded this intent may still be settling it, or died before it
            # heard the outcome: a refusal seen from here (a concurrent duplicate, say) is not
            # final, so nothing is closed and the client is told to retry, never to pay again.
            ctx.outcome = "settlement_pending"
            log_event("reconciling settle refused while its intent is open", route=self.route.name)
            raise pending_error()
        ctx.outcome, ctx.error = "settle_failed", result.errorReason or "settlement_failed"
        log_event("payment settlement failed", route=self.route.name, payer=paid.payer, reason=ctx.error)
        await self._close_intent(paid)
        await send_challenge(send, self.challenge, self.fee_payer, "settlement_failed")

    async def _deliver_once(
        self, paid: PaidRequest, result: SettleResponse, intent: PendingSettlement, scope: Scope
    ) -> bool:
        """Exactly one request per payment hands out the answer, however many reconcile it at
        once. A store outage here lets a fresh success through (only this settle call was told
        it settled) but leaves a reconciled one pending, to be delivered by a later retry."""
        try:
            return await self.ledger.claim_delivery(paid.key)
        except StoreUnavailable:
            if result.success:
                return True
            await self._left_pending(paid, intent, result, scope)
            raise pending_error() from None

    async def _deliver(
        self, paid: PaidRequest, result: SettleResponse, response: StoredResponse, scope: Scope, send: Send
    ) -> None:
        ctx = request_context(scope)
        if not result.success:  # a reconciled duplicate: the client hears a plain success
            result = msgspec.structs.replace(result, success=True, errorReason=None, errorMessage=None)
        delivered = StoredResponse(
            status=response.status,
            body=response.body,
            content_type=response.content_type,
            payment_response=encode_header(result),
            settlement=result.transaction,
        )
        ctx.outcome, ctx.settlement = "paid", result.transaction
        ctx.amount = paid.requirements.amount  # also on a reconciling retry, which skipped the claim
        log_event(
            "payment settled",
            route=self.route.name,
            payer=paid.payer,
            amount=paid.requirements.amount,
            settlement=result.transaction,
        )
        await self._remember(paid, delivered)
        await send_stored(send, delivered)

    async def _left_pending(
        self, paid: PaidRequest, intent: PendingSettlement, result: SettleResponse | None, scope: Scope
    ) -> None:
        """Keep the intent (with the broadcast transaction, once known) for a retry to reconcile."""
        ctx = request_context(scope)
        ctx.outcome = "settlement_pending"
        transaction = result.transaction if result is not None and result.transaction else intent.transaction
        try:
            await self.ledger.record_pending(
                paid.key, msgspec.structs.replace(intent, transaction=transaction)
            )
        except StoreUnavailable:
            # The intent written before settling still stands, without the transaction.
            log_event(
                "settlement pending, its transaction not recorded: store unavailable",
                logging.ERROR,
                route=self.route.name,
                payer=paid.payer,
                settlement=transaction or None,
            )
        log_event("payment settlement pending", route=self.route.name, payer=paid.payer)

    async def _close_intent(self, paid: PaidRequest) -> None:
        """The settlement failed for good: nothing to reconcile (the claim keeps the payment used)."""
        try:
            await self.ledger.resolve_pending(paid.key)
        except StoreUnavailable:
            log_event(
                "failed settlement's intent not closed: store unavailable",
                logging.WARNING,
                route=self.route.name,
            )

    async def _remember(self, paid: PaidRequest, delivered: StoredResponse) -> None:
        """Close the intent and keep the response for payment-identifier replays."""
        try:
            await self.ledger.resolve_pending(paid.key)
            if paid.payment_id is not None and len(delivered.body) <= self.route.replay_cap_bytes:
                await self.ledger.complete_payment_id(paid.payment_id, paid.fingerprint, delivered)
        except StoreUnavailable:
            log_event(
                "settled response not stored for replay: store unavailable",
                logging.WARNING,
                route=self.route.name,
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
        intent = PendingSettlement(paid.fingerprint, paid.claimant, response)
        await self.settler.settle_and_respond(paid, intent, scope, send)

    async def _discard(self, scope: Scope, paid: PaidRequest) -> None:
        """Upstream failed: nothing is settled, the claim stays, the flow counts as failed."""
        ctx = request_context(scope)
        ctx.outcome = "upstream_failed"
        log_event("payment discarded: upstream failed", route=self.settler.route.name, payer=paid.payer)
