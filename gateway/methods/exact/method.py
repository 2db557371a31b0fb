"""The x402 ``exact`` scheme on Solana as a payment method: a signed USDC transfer per request,
verified before the upstream is called and settled only after it answered.

The decisions are the payment core's (:class:`~gateway.methods.exact.PaymentGate` before the
upstream, :class:`~gateway.methods.exact.Settlement` after it); this module binds them to a route
and speaks the method seam's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.methods.credit.book import TopUp
from gateway.methods.exact.gate import PaymentGate
from gateway.methods.exact.ledger import PaymentLedger, StoredResponse
from gateway.methods.exact.offer import Option, RouteOffers, exact_challenge
from gateway.methods.exact.settlement import Settlement
from gateway.methods.results import Paid, PaidRequest, Reconcile, Refused, Settled
from gateway.methods.seam import Admitted, Answer, Checked, Finished, Incoming, Offer, credential_headers
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import RequestValidator
from gateway.routing.vocabulary import HANDLERS, PAYMENT_METHODS
from gateway.telemetry.logs import log_event

if TYPE_CHECKING:
    from gateway.services import Services


class ExactMethod:
    """One exact route's payments: challenge, verify and claim, settle after success."""

    credential_headers = credential_headers(PAYMENT_METHODS["exact"])

    def __init__(
        self, *, route_name: str, offers: RouteOffers, gate: PaymentGate, settlement: Settlement
    ) -> None:
        self.route_name = route_name
        self.offers = offers
        self.gate = gate
        self.settlement = settlement

    async def challenge(self, path: str, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """One ``accepts`` entry per facilitator, the healthy ones first."""
        offered = await self.offers.offered()
        body, headers = offered[0][0].offering(offered, error, extensions)
        return Offer(body, headers)

    async def extensions(self, path: str) -> Mapping[str, Any]:
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


def bind(route: RouteSpec, services: Services) -> ExactMethod:
    """The route's options (one per facilitator), its gate and its settlement."""
    assert services.settling, "exact routes need a facilitator"
    s = services.settings
    offers = RouteOffers(
        [
            Option(
                settling,
                exact_challenge(
                    route,
                    base_url=s.base_url,
                    asset=s.usdc_mint,
                    pay_to=s.pay_to,
                    timeout_s=s.payment_timeout_s,
                    facilitator_url=settling.facilitator.url,
                    fee=settling.fee,
                ),
            )
            for settling in services.settling
        ],
        services.facilitator_health,
    )
    ledger = PaymentLedger(services.store)
    gate = PaymentGate(
        route_name=route.name,
        offers=offers,
        validator=RequestValidator(route.input),
        ledger=ledger,
        limiter=services.limiter,
        limits=route.rate_limits,
        guard=services.settlement_guard,
    )
    top_up = None
    if HANDLERS[route.handler].sells_credit and route.provider_price_micro_usdc is not None:
        top_up = TopUp(services.credit_book, route.provider_price_micro_usdc, route.name)
    settlement = Settlement(
        route_name=route.name,
        ledger=ledger,
        offers=offers,
        replay_cap_bytes=route.replay_cap_bytes,
        guard=services.settlement_guard,
        top_up=top_up,
        recorder=services.recorder,
        late=services.local_facilitator if services.settlement_guard is not None else None,
    )
    return ExactMethod(route_name=route.name, offers=offers, gate=gate, settlement=settlement)
