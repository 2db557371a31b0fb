"""X402Exact: the paid side of an ``exact`` route, up to and including the claim.

Order (design.md), cheap checks first, nothing costs the client or the facilitator before the
request is known to be well formed:

    no header -> 402 challenge (body never read) -> decode header -> validate body (400)
    -> payment matches this route, payer != payTo -> scope rate limit -> payment-identifier
    lookup -> already claimed? (a pending settlement reconciles, else payment_already_used)
    -> facilitator verify -> atomic claim of the payment -> inner app

The verified payment goes inward in ``scope["state"]["payment"]``; SettleAfterSuccess settles it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.asgi import ASGIApp, Receive, Scope, Send, header, read_body, send_bytes
from gateway.context import request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators import Facilitator, FacilitatorUnavailable, fee_payer_for
from gateway.logs import log_event
from gateway.payments import StoredResponse, fingerprint
from gateway.routes import RouteSpec
from gateway.services import Services
from gateway.store import StoreUnavailable
from gateway.validation import InvalidInput, RequestValidator
from gateway.x402 import svm
from gateway.x402.challenge import PAYMENT_IDENTIFIER, ExactChallenge
from gateway.x402.headers import PAYMENT_SIGNATURE, X_PAYMENT, HeaderError, decode_header
from gateway.x402.types import SOLANA_MAINNET, V1_NETWORKS, PaymentPayload, PaymentRequirements

if TYPE_CHECKING:
    from middleware.settle import Settler

CREDENTIAL_HEADERS = (PAYMENT_SIGNATURE, X_PAYMENT)
PAYMENT_ID = re.compile(r"^[A-Za-z0-9_-]{16,128}$")


class PaymentRejected(Exception):
    """A 402 with a fresh challenge whose ``error`` is ``reason``."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


@dataclass(slots=True)
class PaidRequest:
    """What X402Exact learned, handed to SettleAfterSuccess and the handler."""

    payload: PaymentPayload
    requirements: PaymentRequirements
    payer: str
    signature: str
    fingerprint: str
    payment_id: str | None


async def fee_payer(facilitator: Facilitator) -> str:
    """The facilitator's fee payer on Solana mainnet (its ``/supported`` answer is cached)."""
    try:
        found = fee_payer_for(await facilitator.supported(), SOLANA_MAINNET)
    except FacilitatorUnavailable as exc:
        raise GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, "payment facilitator unavailable") from exc
    if found is None:
        raise GatewayError(
            ErrorCode.FACILITATOR_UNAVAILABLE, "facilitator offers no exact payments on Solana"
        )
    return found


async def send_challenge(
    send: Send, challenge: ExactChallenge, facilitator: Facilitator, error: str | None
) -> None:
    body, headers = challenge.response(await fee_payer(facilitator), error)
    await send({"type": "http.response.start", "status": 402, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_stored(send: Send, response: StoredResponse) -> None:
    """Deliver a settled response (first time or replay) with both payment-response headers."""
    headers = [(b"content-type", response.content_type.encode())]
    if response.payment_response:
        value = response.payment_response.encode()
        headers += [(b"payment-response", value), (b"x-payment-response", value)]
    await send_bytes(send, response.status, response.body, headers)


def exact_challenge(route: RouteSpec, services: Services, facilitator: Facilitator) -> ExactChallenge:
    s = services.settings
    requirements = PaymentRequirements(
        scheme="exact",
        network=SOLANA_MAINNET,
        amount=str(route.price_micro_usdc),
        asset=s.usdc_mint,
        payTo=s.pay_to,
        maxTimeoutSeconds=s.payment_timeout_s,
    )
    return ExactChallenge(
        requirements,
        s.base_url + route.path,
        route.description,
        route.input.get("body"),
        route.output,
        facilitator.url,
        route.method,
    )


class X402Exact:
    def __init__(self, app: ASGIApp, settler: Settler) -> None:
        self.app = app
        self.settler = settler
        self.route = route = settler.route
        self.services = services = settler.services
        self.facilitator = settler.facilitator
        self.challenge = settler.challenge
        self.ledger = settler.ledger
        self.validator = RequestValidator(route.input)
        self.max_body = services.settings.max_body_bytes
        self.limits = [s for s in route.rate_limits if s.per == "scope"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = header(scope, PAYMENT_SIGNATURE) or header(scope, X_PAYMENT)
        ctx = request_context(scope)
        if raw is None:
            ctx.outcome = "challenged"
            await send_challenge(send, self.challenge, self.facilitator, None)
            return
        try:
            await self._authorize(raw, scope, receive, send)
        except PaymentRejected as rejected:
            ctx.outcome, ctx.error = "rejected", rejected.reason
            log_event("payment rejected", route=self.route.name, reason=rejected.reason, payer=ctx.payer)
            await self.services.limiter.challenge(scope)
            await send_challenge(send, self.challenge, self.facilitator, rejected.reason)
        except StoreUnavailable as exc:
            raise GatewayError(
                ErrorCode.STORE_UNAVAILABLE, "state store unavailable; nothing was charged"
            ) from exc

    async def _authorize(self, raw: str, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        try:
            payload = decode_header(raw, PaymentPayload)
        except HeaderError as exc:
            raise PaymentRejected("invalid_payment_header", str(exc)) from exc
        body = await read_body(receive, self.max_body)
        try:
            validated = self.validator.body(body)
        except InvalidInput as exc:
            raise GatewayError(ErrorCode.INVALID_REQUEST, str(exc), {"parameter": exc.where}) from exc
        payer, signature = self._match(payload)
        ctx.payer = payer
        for spec in self.limits:
            await self.services.limiter.hit(spec)
        fp = fingerprint(self.route.name, signature, body)
        payment_id = _payment_id(payload)
        if payment_id is not None and await self._replayed(payment_id, fp, send):
            ctx.outcome = "replayed"
            return
        requirements = self.challenge.requirements_for(await fee_payer(self.facilitator))
        if payload.accepted is None:
            # v1 (``X-PAYMENT``): the facilitator is spoken to in v2, so the payment says which
            # requirements it accepted, as a v2 client would.
            payload = PaymentPayload(
                x402Version=2,
                payload=payload.payload,
                accepted=requirements,
                resource=self.challenge.resource,
                extensions=payload.extensions,
            )
        # A used payment is refused from the store, before the facilitator is asked: once
        # broadcast, a real facilitator's verify fails (the funds moved), which would lose a
        # pending settlement's withheld response and blame the client with the wrong reason.
        if await self.ledger.claimed(signature):
            await self._refuse_reuse(signature, fp, payment_id, payload, requirements, scope, send)
            return
        try:
            await self._verify(payload, requirements, payer)
        except PaymentRejected:
            # A concurrent request (on any replica) may have claimed and settled this payment
            # while the facilitator was asked; its verify then fails because the funds moved,
            # and the reason the client must hear is the reuse (or its pending settlement).
            if await self.ledger.claimed(signature):
                await self._refuse_reuse(signature, fp, payment_id, payload, requirements, scope, send)
                return
            raise
        if not await self.ledger.claim(signature, self.route.name):
            await self._refuse_reuse(signature, fp, payment_id, payload, requirements, scope, send)
            return
        if payment_id is not None and not await self.ledger.reserve_payment_id(payment_id, fp):
            raise GatewayError(
                ErrorCode.IDEMPOTENCY_CONFLICT, "payment identifier already used by another request"
            )
        ctx.amount = requirements.amount
        state = scope.setdefault("state", {})
        state["payment"] = PaidRequest(payload, requirements, payer, signature, fp, payment_id)
        state["input"] = validated
        await self.app(scope, receive, send)

    def _match(self, payload: PaymentPayload) -> tuple[str, str]:
        """The payment is for this route (as far as the header says) and not a self-transfer."""
        want = self.challenge.requirements
        accepted = payload.accepted
        scheme = accepted.scheme if accepted else payload.scheme
        network = accepted.network if accepted else V1_NETWORKS.get(payload.network or "", payload.network)
        if payload.x402Version not in (1, 2) or (payload.x402Version == 2 and accepted is None):
            raise PaymentRejected("invalid_x402_version")
        if scheme != "exact":
            raise PaymentRejected("invalid_scheme")
        if network != want.network:
            raise PaymentRejected("invalid_network")
        if accepted is not None:
            if accepted.asset != want.asset:
                raise PaymentRejected("asset_mismatch")
            if accepted.amount != want.amount:
                raise PaymentRejected("amount_mismatch")
            if accepted.payTo != want.payTo:
                raise PaymentRejected("pay_to_mismatch")
        transaction = payload.payload.get("transaction")
        if not isinstance(transaction, str):
            raise PaymentRejected("invalid_payload", "payload.transaction is missing")
        try:
            client = svm.payment_client(svm.decode_transaction(transaction))
        except ValueError as exc:
            raise PaymentRejected("invalid_payload", str(exc)) from exc
        if client is None:
            raise PaymentRejected("invalid_payload", "the transaction has no client signer")
        if client[0] == want.payTo:
            raise PaymentRejected("self_transfer", "the payer must differ from payTo")
        return client

    async def _verify(self, payload: PaymentPayload, requirements: PaymentRequirements, payer: str) -> None:
        try:
            result = await self.facilitator.verify(payload, requirements)
        except FacilitatorUnavailable as exc:
            raise GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, "payment facilitator unavailable") from exc
        if not result.isValid:
            raise PaymentRejected(result.invalidReason or "invalid_payment", result.invalidMessage or "")
        if result.payer and result.payer != payer:
            raise PaymentRejected("invalid_payload", "the facilitator found another payer")

    async def _replayed(self, payment_id: str, fp: str, send: Send) -> bool:
        """Serve the stored response of an identical earlier request; 409 for a different one."""
        record = await self.ledger.payment_id(payment_id)
        if record is None:
            return False
        if record.fingerprint != fp:
            raise GatewayError(
                ErrorCode.IDEMPOTENCY_CONFLICT, "payment identifier was used with another payment or request"
            )
        if record.response is None:
            # Not settled (yet): in flight, discarded or pending. The payment's claim decides:
            # a pending settlement reconciles, anything else is payment_already_used.
            return False
        await send_stored(send, record.response)
        return True

    async def _refuse_reuse(
        self,
        signature: str,
        fp: str,
        payment_id: str | None,
        payload: PaymentPayload,
        requirements: PaymentRequirements,
        scope: Scope,
        send: Send,
    ) -> None:
        """The payment is claimed already. A retry of the identical request whose settlement was
        pending settles again (the facilitator reconciles instead of re-broadcasting) and gets the
        withheld response; any other reuse is refused."""
        pending = await self.ledger.pending(signature)
        if pending is not None and pending.fingerprint == fp:
            await self.settler.settle_and_respond(
                payload,
                requirements,
                signature,
                fp,
                payment_id,
                pending.response,
                scope,
                send,
                reconciling=True,
            )
            return
        raise PaymentRejected("payment_already_used", "this payment was already used")


def _payment_id(payload: PaymentPayload) -> str | None:
    """The client's payment-identifier (extension ``payment-identifier``), if it sent one."""
    extension: Any = (payload.extensions or {}).get(PAYMENT_IDENTIFIER)
    if not isinstance(extension, dict):
        return None
    info = extension.get("info")
    pid = info.get("id") if isinstance(info, dict) else None
    if pid is None:
        return None
    if not isinstance(pid, str) or not PAYMENT_ID.match(pid):
        raise PaymentRejected(
            "invalid_payment_identifier", "payment identifier must be 16-128 of [A-Za-z0-9_-]"
        )
    return pid
