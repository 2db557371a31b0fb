"""What one ``exact`` route asks for: its price as x402 payment requirements and the 402 challenge,
one per facilitator it may be settled through."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.facilitators.health import FacilitatorHealth
from gateway.facilitators.http import ChallengeFeePayer, Facilitator
from gateway.routing.pricing import FacilitatorFee, route_price
from gateway.routing.routes import RouteSpec
from gateway.x402.challenge import ExactChallenge
from gateway.x402.types import SCHEME_EXACT, SOLANA_MAINNET, PaymentPayload, PaymentRequirements


def exact_challenge(
    route: RouteSpec,
    *,
    base_url: str,
    asset: str,
    pay_to: str,
    timeout_s: int,
    facilitator_url: str,
    fee: FacilitatorFee,
) -> ExactChallenge:
    """Built once per route at start-up; only the fee payer varies per challenge. The amount is
    the route's price through the facilitator at ``facilitator_url``, whose settlement fee is
    ``fee``."""
    price = route_price(route, fee)
    assert price is not None, f"route {route.name} is exact but has no price"
    requirements = PaymentRequirements(
        scheme=SCHEME_EXACT,
        network=SOLANA_MAINNET,
        amount=str(price.total),
        asset=asset,
        payTo=pay_to,
        maxTimeoutSeconds=timeout_s,
    )
    return ExactChallenge(
        requirements,
        base_url + route.path,
        route.description,
        route.input.get("body"),
        route.output,
        facilitator_url,
        route.method,
    )


@dataclass(frozen=True, slots=True)
class SettlingFacilitator:
    """One facilitator the gateway may settle through: its name (``internal`` or its URL), the
    fee payer its challenges name, its settlement fee, and whether the fee payer is ours."""

    name: str
    facilitator: Facilitator
    fee_payer: ChallengeFeePayer
    fee: FacilitatorFee

    @property
    def ours(self) -> bool:
        """Our own fee payer settles: the fee guard applies."""
        return self.fee.internal


@dataclass(frozen=True, slots=True)
class Option:
    """One way to pay a route: a facilitator and the challenge priced for it."""

    settling: SettlingFacilitator
    challenge: ExactChallenge


class RouteOffers:
    """A route's payment options, one per configured facilitator, offered in the order of their
    health (:class:`~gateway.facilitators.health.FacilitatorHealth`): the 402 lists one
    ``accepts`` entry per facilitator, and a payment is verified and settled by the one whose fee
    payer it names, never by another."""

    def __init__(self, options: Sequence[Option], health: FacilitatorHealth) -> None:
        assert options, "an exact route needs a facilitator"
        self.options = {option.settling.name: option for option in options}
        self.health = health
        self.preferred = options[0]

    def named(self, name: str) -> Option:
        return self.options[name]

    async def offered(self) -> list[tuple[ExactChallenge, str | None]]:
        """(challenge, fee payer) per facilitator, healthy ones first."""
        return [
            (self.options[name].challenge, await self.options[name].settling.fee_payer.current())
            for name in self.health.order()
        ]

    async def for_payment(self, payload: PaymentPayload) -> Option:
        """The option whose fee payer the payment names (what the client echoed in
        ``accepted.extra.feePayer``); the preferred one when it names none we know, so its
        facilitator refuses it with its own reason."""
        accepted = payload.accepted
        named = (accepted.extra or {}).get("feePayer") if accepted is not None else None
        if named and len(self.options) > 1:
            for option in self.options.values():
                if await option.settling.fee_payer.current() == named:
                    return option
        return self.preferred
