"""X402Exact: the paid side of an ``exact`` route, up to and including the claim.

Order, cheap checks first: nothing costs the client, a shared rate-limit bucket or
the facilitator before the request is known to be well formed and signed by its payer:

    no header -> 402 challenge (body never read, never waits for the facilitator)
    -> decode header -> validate body (400) -> payment matches this route, payer != payTo,
    the client's signature verifies over the message -> payment-identifier lookup
    -> already claimed? (a pending settlement of this request reconciles, else
    payment_already_used) -> scope and per-wallet rate limits -> facilitator verify
    -> atomic claim of the payment (its message) -> inner app

A payment is known by its key, the hash of its transaction message (``gateway.payments``),
never by a client signature. The verified payment goes inward in ``scope["state"]["payment"]``;
SettleAfterSuccess settles it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from solders.message import to_bytes_versioned
from solders.transaction import VersionedTransaction

from gateway.asgi import ASGIApp, Receive, Scope, Send, header, read_body, send_bytes
from gateway.context import request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators import ChallengeFeePayer, Facilitator, FacilitatorUnavailable
from gateway.logs import log_event
from gateway.payments import StoredResponse, claimant, fingerprint
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
    key: str
    """The payment key: SHA-256 of the transaction message (what is claimed and settled once)."""
    claimant: str
    """The exact signed transaction that claimed it (see ``gateway.payments.claimant``)."""
    fingerprint: str
    payment_id: str | None


async def send_challenge(
    send: Send, challenge: ExactChallenge, fee_payer: ChallengeFeePayer, error: str | None
) -> None:
    body, headers = challenge.response(await fee_payer.current(), error)
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
        self.fee_payer = settler.fee_payer
        self.challenge = settler.challenge
        self.ledger = settler.ledger
        self.validator = RequestValidator(route.input)
        self.max_body = services.settings.max_body_bytes
        self.limits = route.rate_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = header(scope, PAYMENT_SIGNATURE) or header(scope, X_PAYMENT)
        ctx = request_context(scope)
        if raw is None:
            ctx.outcome = "challenged"
            await send_challenge(send, self.challenge, self.fee_payer, None)
            return
        try:
            await self._authorize(raw, scope, receive, send)
        except PaymentRejected as rejected:
            ctx.outcome, ctx.error = "rejected", rejected.reason
            log_event("payment rejected", route=self.route.name, reason=rejected.reason, payer=ctx.payer)
            await self.services.limiter.challenge(scope)
            await send_challenge(send, self.challenge, self.fee_payer, rejected.reason)
        except StoreUnavailable as exc:
            if ctx.settling:  # the settlement may have been broadcast: never say nothing was charged
                log_event(
                    "store lost while settling: payment left pending",
                    logging.ERROR,
                    route=self.route.name,
                    payer=ctx.payer,
                )
                raise pending_error() from exc
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
        payer, key, claimed_by = self._match(payload)
        ctx.payer = payer
        fp = fingerprint(self.route.name, key, body)
        payment_id = _payment_id(payload)
        if payment_id is not None and await self._replayed(payment_id, fp, send):
            ctx.outcome = "replayed"
            return
        # A used payment is refused from the store, before any shared bucket or the facilitator
        # is charged for it: once broadcast, a real facilitator's verify fails (the funds moved),
        # which would lose a pending settlement's withheld response and blame the wrong reason.
        if await self.ledger.claimed(key):
            await self._refuse_reuse(payload, payer, key, claimed_by, fp, payment_id, scope, send)
            return
        for spec in self.limits:
            await self.services.limiter.hit(spec, payer if spec.per == "wallet" else None)
        requirements = self.challenge.requirements_for(await self.fee_payer.required())
        payload = self._as_v2(payload, requirements)
        try:
            await self._verify(payload, requirements, payer)
        except PaymentRejected:
            # A concurrent request (on any replica) may have claimed and settled this payment
            # while the facilitator was asked; its verify then fails because the funds moved,
            # and the reason the client must hear is the reuse (or its pending settlement).
            if await self.ledger.claimed(key):
                await self._refuse_reuse(payload, payer, key, claimed_by, fp, payment_id, scope, send)
                return
            raise
        if not await self.ledger.claim(key, self.route.name):
            await self._refuse_reuse(payload, payer, key, claimed_by, fp, payment_id, scope, send)
            return
        if payment_id is not None and not await self.ledger.reserve_payment_id(payment_id, fp):
            raise GatewayError(
                ErrorCode.IDEMPOTENCY_CONFLICT, "payment identifier already used by another request"
            )
        ctx.amount = requirements.amount
        state = scope.setdefault("state", {})
        state["payment"] = PaidRequest(payload, requirements, payer, key, claimed_by, fp, payment_id)
        state["input"] = validated
        await self.app(scope, receive, send)

    def _as_v2(self, payload: PaymentPayload, requirements: PaymentRequirements) -> PaymentPayload:
        """v1 (``X-PAYMENT``): the facilitator is spoken to in v2, so the payment says which
        requirements it accepted, as a v2 client would."""
        if payload.accepted is not None:
            return payload
        return PaymentPayload(
            x402Version=2,
            payload=payload.payload,
            accepted=requirements,
            resource=self.challenge.resource,
            extensions=payload.extensions,
        )

    def _match(self, payload: PaymentPayload) -> tuple[str, str, str]:
        """(payer, payment key, claimant) of a payment that is for this route as far as the header says,
        not a self-transfer, and signed by its payer over the message. All local and cheap."""
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
            tx = svm.decode_transaction(transaction)
        except ValueError as exc:
            raise PaymentRejected("invalid_payload", str(exc)) from exc
        client = svm.payment_client(tx)
        if client is None:
            raise PaymentRejected("invalid_payload", "the transaction has no client signer")
        payer = client[0]
        if payer == want.payTo:
            raise PaymentRejected("self_transfer", "the payer must differ from payTo")
        if not _client_signed(tx):
            raise PaymentRejected(svm.Reason.TRANSACTION.value, "the client's signature does not verify")
        return payer, svm.payment_key(tx), claimant(bytes(tx))

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
        payload: PaymentPayload,
        payer: str,
        key: str,
        claimed_by: str,
        fp: str,
        payment_id: str | None,
        scope: Scope,
        send: Send,
    ) -> None:
        """The payment is claimed already. The request that claimed it (the same signed
        transaction, route and body), whose settlement was left pending, settles again (the
        facilitator reconciles instead of re-broadcasting) and may get the withheld response;
        any other reuse, a copy of the message under another client signature included, is
        refused."""
        pending = await self.ledger.pending(key)
        if (
            pending is not None
            and pending.fingerprint == fp
            and pending.claimant == claimed_by
            and pending.response is not None
        ):
            requirements = self.challenge.requirements_for(await self.fee_payer.required())
            payload = self._as_v2(payload, requirements)
            paid = PaidRequest(payload, requirements, payer, key, claimed_by, fp, payment_id)
            await self.settler.settle_and_respond(paid, pending, scope, send, reconciling=True)
            return
        raise PaymentRejected("payment_already_used", "this payment was already used")


def pending_error() -> GatewayError:
    """The settlement's outcome is not known: retry the same request, never pay again."""
    return GatewayError(
        ErrorCode.SETTLEMENT_PENDING,
        "settlement is not confirmed yet; retry the same request with the same payment",
        headers={"Retry-After": "2"},
    )


def _client_signed(tx: VersionedTransaction) -> bool:
    """The client's signature (slot 1) verifies over the message: junk never reaches a shared
    rate-limit bucket or the facilitator. Slot 0 is the fee payer's, still empty here."""
    message = to_bytes_versioned(tx.message)
    return bool(tx.signatures[1].verify(tx.message.account_keys[1], message))


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
