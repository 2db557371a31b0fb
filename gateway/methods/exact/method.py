"""The x402 ``exact`` scheme on Solana as a payment method: a signed USDC transfer per request,
verified before the upstream is called and settled only after it answered.

The decisions are the payment core's (:class:`~gateway.methods.exact.PaymentGate` before the
upstream, :class:`~gateway.methods.exact.Settlement` after it); this module binds them to a route
and speaks the method seam's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.facilitators.health import FacilitatorHealth
from gateway.ledger.recorder import MoneyRecorder
from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.credit.book import CreditBook, TopUp
from gateway.methods.exact.confirmations import LateFollower
from gateway.methods.exact.fee_guard import FeeGuard
from gateway.methods.exact.gate import PaymentGate
from gateway.methods.exact.ledger import PaymentLedger, StoredResponse
from gateway.methods.exact.offer import Option, RouteOffers, SettlingFacilitator, exact_challenge
from gateway.methods.exact.settlement import Settlement
from gateway.methods.results import Paid, PaidRequest, Reconcile, Refused, Settled
from gateway.methods.seam import (
    Admitted,
    Answer,
    Asked,
    Checked,
    Finished,
    Incoming,
    Offer,
    credential_headers,
)
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import RequestValidator
from gateway.routing.vocabulary import EXACT_METHOD, HANDLERS, PAYMENT_METHODS, AccessMode
from gateway.store import Store
from gateway.telemetry.logs import log_event

if TYPE_CHECKING:
    from gateway.methods.shared import SharedParts


class ExactMethod:
    """One exact route's payments: challenge, verify and claim, settle after success."""

    credential_headers = credential_headers(PAYMENT_METHODS[EXACT_METHOD])

    def __init__(
        self, *, route_name: str, offers: RouteOffers, gate: PaymentGate, settlement: Settlement
    ) -> None:
        self.route_name = route_name
        self.offers = offers
        self.gate = gate
        self.settlement = settlement

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """One ``accepts`` entry per facilitator, the healthy ones first."""
        offered = await self.offers.offered()
        body, headers = offered[0][0].offering(offered, error, extensions)
        return Offer(body, headers)

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
        return {}

    async def check(self, incoming: Incoming) -> Checked[PaidRequest]:
        inspected = await self.gate.inspect(incoming.credential, incoming.read_body)
        if isinstance(inspected, Refused):
            return Checked(inspected, inspected.payer)
        payer = inspected.payer
        match await self.gate.authorize(inspected, incoming.client_ip):
            case Paid(paid=paid, body=body):
                return Checked(Admitted(paid, body, paid.requirements.amount), payer)
            case Reconcile() as retry:
                settled = await self.settlement.reconcile(retry)
                return Checked(Finished(settled, retry.paid.requirements.amount), payer)
            case other:
                return Checked(other, payer)

    async def finish(self, grant: PaidRequest, answer: Answer) -> Settled:
        response = StoredResponse(status=200, body=answer.body, content_type=answer.content_type)
        return await self.settlement.settle(grant, response)

    async def abandon(self, grant: PaidRequest) -> None:
        """Nothing is settled and the claim stays: the authorization is dead."""
        log_event("payment discarded: upstream failed", route=self.route_name, payer=grant.payer)


@dataclass(frozen=True, slots=True)
class ExactDeps:
    """What exact routes use: the terms of their challenges, the facilitators, the store."""

    base_url: str
    usdc_mint: str
    pay_to: str
    payment_timeout_s: int
    settling: Sequence[SettlingFacilitator]
    facilitator_health: FacilitatorHealth
    store: Store
    limiter: RateLimiter
    guard: FeeGuard | None
    """Our own fee payer's guard, when the internal facilitator settles."""
    credit_book: CreditBook
    recorder: MoneyRecorder
    late: LateFollower | None


@dataclass(frozen=True, slots=True)
class Exact:
    """The ``exact`` way of paying (:mod:`gateway.methods.registry`)."""

    name: str = EXACT_METHOD
    mode: AccessMode = PAYMENT_METHODS[EXACT_METHOD]

    def dependencies(self, parts: SharedParts) -> ExactDeps:
        s = parts.settings
        guard = parts.settlement_guard
        return ExactDeps(
            base_url=s.base_url,
            usdc_mint=s.usdc_mint,
            pay_to=s.pay_to,
            payment_timeout_s=s.payment_timeout_s,
            settling=tuple(parts.settling),
            facilitator_health=parts.facilitator_health,
            store=parts.store,
            limiter=parts.limiter,
            guard=guard,
            credit_book=parts.credit_book,
            recorder=parts.recorder,
            late=parts.local_facilitator if guard is not None else None,
        )

    def bind(self, route: RouteSpec, deps: ExactDeps) -> ExactMethod:
        """The route's options (one per facilitator), its gate and its settlement."""
        assert deps.settling, "exact routes need a facilitator"
        offers = RouteOffers(
            [
                Option(
                    settling,
                    exact_challenge(
                        route,
                        base_url=deps.base_url,
                        asset=deps.usdc_mint,
                        pay_to=deps.pay_to,
                        timeout_s=deps.payment_timeout_s,
                        facilitator_url=settling.facilitator.url,
                        fee=settling.fee,
                    ),
                )
                for settling in deps.settling
            ],
            deps.facilitator_health,
        )
        ledger = PaymentLedger(deps.store)
        gate = PaymentGate(
            route_name=route.name,
            offers=offers,
            validator=RequestValidator(route.input),
            ledger=ledger,
            limiter=deps.limiter,
            limits=route.rate_limits,
            guard=deps.guard,
        )
        top_up = None
        if HANDLERS[route.handler].sells_credit and route.provider_price_micro_usdc is not None:
            top_up = TopUp(deps.credit_book, route.provider_price_micro_usdc, route.name)
        settlement = Settlement(
            route_name=route.name,
            ledger=ledger,
            offers=offers,
            replay_cap_bytes=route.replay_cap_bytes,
            guard=deps.guard,
            top_up=top_up,
            recorder=deps.recorder,
            late=deps.late,
        )
        return ExactMethod(route_name=route.name, offers=offers, gate=gate, settlement=settlement)


EXACT = Exact()
