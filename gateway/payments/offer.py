"""What one ``exact`` route asks for: its price as x402 payment requirements and the 402 challenge."""

from __future__ import annotations

from gateway.pricing import FacilitatorFee, route_price
from gateway.routes import RouteSpec
from gateway.x402.challenge import ExactChallenge
from gateway.x402.types import SOLANA_MAINNET, PaymentRequirements


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
        scheme="exact",
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
