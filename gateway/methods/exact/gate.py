"""PaymentGate: from a payment header to a claimed, verified payment, cheap checks first.

The order never changes; nothing costs the client, a shared rate-limit bucket or the
facilitator before the request is known to be well formed and signed by its payer:

    (no header at all: the route's 402, rendered by the access layer before anything else)
    decode header -> validate body (InvalidInput: 400) -> payment matches this route,
    payer != payTo, the client's signature verifies over the message        (:meth:`inspect`)
    -> payment-identifier lookup (409 for another request); a client IP cooling down after a
       failed settlement refuses payers without a record of their own (a payer with one is
       vouched for by it: looked up, and the claim made again, only while its IP cools)
    -> already claimed? (its answer delivered to this very request: Replay; the pending
       settlement of this very request: Reconcile; else Refused)
    -> the payer's own bucket, the refusal guards (its IP's and its payer's refused payments),
       then the route's shared scope
    -> atomic claim of the payment (its message) and of its identifier
       (all of these in one store round trip)
    -> facilitator verify (refused or unreachable: the claim is released and the shared scope
       handed back; a refusal is charged to the IP's and the payer's guards) -> Paid
                                                                            (:meth:`authorize`)

The claim comes before the verify so that the look-up and the claim are one round trip; of
concurrent requests offering one payment, only the one holding the claim asks the facilitator.
A payment the facilitator refuses spent nothing other clients share, and each refusal counts
against its IP and its payer, so refused payments cannot cost the operator more than a few
verifies a minute per IP however fast they come.
A payment is known by its key, the hash of its transaction message, never by a client
signature (see :mod:`gateway.methods.exact.ledger`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators.http import FacilitatorUnavailable
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.exact.fee_guard import FeeGuard, Party
from gateway.methods.exact.ledger import ClaimAttempt, PaymentLedger, PendingSettlement, fingerprint
from gateway.methods.exact.matching import as_v2, match_payment, payment_identifier
from gateway.methods.exact.offer import Option, RouteOffers
from gateway.methods.results import (
    Authorization,
    Candidate,
    Conflict,
    Inspection,
    Paid,
    PaidRequest,
    Reconcile,
    Refused,
    Replay,
)
from gateway.routing.routes import RateLimitSpec
from gateway.routing.validation import RequestValidator
from gateway.store import Bucket, StoreUnavailable
from gateway.telemetry.logs import log_event
from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements

BodyReader = Callable[[], Awaitable[bytes]]
"""Reads the request body; only called once the header decoded, so junk never waits on it."""


class PaymentGate:
    """Decides what one payment on one route comes to, before the upstream is called."""

    def __init__(
        self,
        *,
        route_name: str,
        offers: RouteOffers,
        validator: RequestValidator,
        ledger: PaymentLedger,
        limiter: RateLimiter,
        limits: Sequence[RateLimitSpec],
        guard: FeeGuard | None = None,
    ) -> None:
        self.route_name = route_name
        self.offers = offers
        self.validator = validator
        self.ledger = ledger
        self.limiter = limiter
        self.limits = tuple(limits)
        self.guard = guard
        """Our own fee payer's guard: whether a payer's record vouches for it on a cooling IP."""

    async def inspect(self, header: str, read_body: BodyReader) -> Inspection:
        """The local checks: no store, no shared bucket, no facilitator. A body that breaks the
        route's schema raises ``InvalidInput`` (400), before the payment is looked at."""
        try:
            payload = decode_header(header, PaymentPayload)
        except HeaderError as exc:
            return Refused("invalid_payment_header", str(exc))
        raw = await read_body()
        body = self.validator.body(raw)
        option = await self.offers.for_payment(payload)
        signed = match_payment(payload, option.challenge.requirements)
        if isinstance(signed, Refused):
            return signed
        payment_id = payment_identifier(payload)
        if isinstance(payment_id, Refused):
            return Refused(payment_id.reason, payment_id.message, signed.payer)
        return Candidate(
            payload=payload,
            body=body,
            payer=signed.payer,
            key=signed.key,
            claimant=signed.claimant,
            fingerprint=fingerprint(self.route_name, signed.key, raw),
            payment_id=payment_id,
            facilitator=option.settling.name,
        )

    async def authorize(self, candidate: Candidate, client_ip: str) -> Authorization:
        """The shared checks, ending in the verified claim, or the value saying why not (a replay,
        a refusal, a conflict, a limit). Raises only on outages: 503 (store, facilitator)."""
        plan = self.limiter.plan(
            self.limits, wallet=candidate.payer, ip=client_ip, guards=self.limiter.refusal_guards
        )
        option = self.offers.named(candidate.facilitator)
        # Our own fee payer would settle: a client IP cooling down after a settlement of its
        # failed on chain is refused before it costs anything.
        blockers = [Party("ip", client_ip).cooldown_key] if option.settling.ours else []
        attempt = await self._claim(candidate, plan.buckets, blockers)
        if attempt.blocked and await self._vouched(candidate.payer, client_ip):
            # Another wallet of this IP failed; this payer's own record vouches for it (nothing
            # was charged by the blocked attempt, so it is simply made again without the IP's).
            attempt = await self._claim(candidate, plan.buckets)
        if attempt.payment_id is not None and attempt.payment_id.fingerprint != candidate.fingerprint:
            return Conflict("payment identifier was used with another payment or request")
        # A used payment is refused from the store, before any shared bucket or the facilitator
        # is charged for it: once broadcast, a real facilitator's verify fails (the funds moved),
        # which would lose a pending settlement's withheld response and blame the wrong reason.
        if attempt.claimed:
            delivered = attempt.delivered
            identified = attempt.payment_id is not None  # and its fingerprint matched, else 409
            answer = (
                delivered.answers(candidate.fingerprint, candidate.claimant, identified=identified)
                if delivered
                else None
            )
            if answer is not None:
                return Replay(answer)
            return await self._reuse(candidate, attempt.pending, client_ip)
        if attempt.blocked:
            return Refused(
                "invalid_transaction_state",
                "a settlement from this client failed on chain recently: pay again later",
                candidate.payer,
            )
        if attempt.payment_id is not None:
            # The identifier names this very request while its payment is unclaimed: the two are
            # written together and the identifier expires first, so another request holds it.
            return Conflict("payment identifier already used by another request")
        limited = plan.refusal(attempt.decisions)
        if limited is not None:
            return limited
        if not attempt.won:
            raise StoreUnavailable("state store neither refused nor recorded the payment's claim")
        try:
            requirements = await _requirements(option)
            payload = as_v2(candidate.payload, requirements, option.challenge.resource)
            refused = await self._verify(option, payload, requirements, candidate.payer)
        except GatewayError:
            await self._release(attempt, candidate.payer, plan.shared)
            raise
        if refused is not None:
            await self._release(attempt, candidate.payer, plan.shared, plan.refusal_debts)
            return refused
        return Paid(_paid(candidate, payload, requirements, client_ip), candidate.body)

    async def _claim(
        self, candidate: Candidate, buckets: Sequence[Bucket], blockers: Sequence[str] = ()
    ) -> ClaimAttempt:
        return await self.ledger.claim(
            candidate.payer,
            candidate.key,
            self.route_name,
            candidate.payment_id,
            candidate.fingerprint,
            buckets,
            blockers,
        )

    async def _vouched(self, payer: str, client_ip: str) -> bool:
        """The payer has a record of its own and is not cooling down: its IP's cool-down (set by
        another wallet's failure) does not bind it. One more round trip, only while its IP cools."""
        if self.guard is None:
            return False
        standing = await self.guard.standing([Party("ip", client_ip)], voucher=Party("owner", payer))
        return standing.cooling is None

    async def _release(
        self, attempt: ClaimAttempt, payer: str, refunds: Sequence[Bucket], debts: Sequence[Bucket] = ()
    ) -> None:
        """The payment was never used: free it for the client to offer again (once funded, say),
        hand back the shared scope it spent and charge its refusal, if it was refused. Left
        claimed when the store fails: the client then signs a new payment; nothing moved."""
        try:
            await self.ledger.release(attempt, refunds, debts)
        except StoreUnavailable:
            log_event(
                "unverified payment left claimed: store unavailable",
                logging.WARNING,
                route=self.route_name,
                payer=payer,
            )

    async def _verify(
        self, option: Option, payload: PaymentPayload, requirements: PaymentRequirements, payer: str
    ) -> Refused | None:
        try:
            result = await option.settling.facilitator.verify(payload, requirements)
        except FacilitatorUnavailable as exc:
            # Offered last from now on, by every replica: the client's next 402 names another.
            await self.offers.health.mark_down(option.settling.name)
            raise GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, "payment facilitator unavailable") from exc
        if not result.isValid:
            return Refused(result.invalidReason or "invalid_payment", result.invalidMessage or "", payer)
        if result.payer and result.payer != payer:
            return Refused("invalid_payload", "the facilitator found another payer", payer)
        return None

    async def _reuse(
        self, candidate: Candidate, pending: PendingSettlement | None, client_ip: str
    ) -> Reconcile | Refused:
        """The payment is claimed already. The request that claimed it (the same signed
        transaction, route and body), whose settlement was left ``pending``, settles again (the
        facilitator reconciles instead of re-broadcasting) and may get the withheld response;
        any other reuse, a copy of the message under another client signature included, is
        refused."""
        if (
            pending is not None
            and pending.fingerprint == candidate.fingerprint
            and pending.claimant == candidate.claimant
            and pending.response is not None
        ):
            option = self.offers.named(candidate.facilitator)
            requirements = await _requirements(option)
            payload = as_v2(candidate.payload, requirements, option.challenge.resource)
            return Reconcile(_paid(candidate, payload, requirements, client_ip), pending)
        return Refused("payment_already_used", "this payment was already used", candidate.payer)


async def _requirements(option: Option) -> PaymentRequirements:
    """What the option's facilitator is asked to verify and settle (503 without a fee payer)."""
    return option.challenge.requirements_for(await option.settling.fee_payer.required())


def _paid(
    candidate: Candidate, payload: PaymentPayload, requirements: PaymentRequirements, client_ip: str
) -> PaidRequest:
    return PaidRequest(
        payload=payload,
        requirements=requirements,
        payer=candidate.payer,
        key=candidate.key,
        claimant=candidate.claimant,
        fingerprint=candidate.fingerprint,
        payment_id=candidate.payment_id,
        client_ip=client_ip,
        facilitator=candidate.facilitator,
    )
