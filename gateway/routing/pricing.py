"""What a paid route costs through the facilitator that settles it, and how prices display.

A route holds its provider part (units x the schedule's rate, see routes.yaml); the facilitator
that settles the payment adds its settlement fee: the internal facilitator the fee the route
table derives for our own fee payer, an external one the fee configured for it (none by
default: it pays the Solana fees itself). :func:`route_price` is the one place that adds them;
the 402, the catalog, the OpenAPI document and the CLI all show its answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING

import msgspec

from gateway.config import INTERNAL
from gateway.routing.vocabulary import HANDLERS

if TYPE_CHECKING:  # the pay client imports the display helpers and needs neither
    from gateway.config import Settings
    from gateway.routing.routes import RouteSpec


SETTLEMENT_FEE_VARIABLE = "FACILITATOR_SETTLEMENT_FEE_MICRO_USDC"


class FacilitatorFee(msgspec.Struct, frozen=True):
    """The settlement fee one facilitator adds to every price: our own fee payer's (the route
    table states it) or an external facilitator's configured figure."""

    internal: bool
    external_micro_usdc: int = 0
    """An external facilitator's fee; unused for the internal one."""

    @property
    def source(self) -> str:
        """Where the fee is set, for an operator reading ``check`` or ``routes``."""
        return "routes.yaml pricing.settlement_fee_micro_usdc" if self.internal else SETTLEMENT_FEE_VARIABLE


class RoutePrice(msgspec.Struct, frozen=True):
    """What one paid route charges through one facilitator, and its two parts."""

    provider: int
    settlement_fee: int

    @property
    def total(self) -> int:
        """The amount the 402 asks for and the facilitator settles."""
        return self.provider + self.settlement_fee


def facilitator_fee(settings: Settings, url: str | None = None) -> FacilitatorFee:
    """The settlement fee of the facilitator at ``url`` (default: the preferred one)."""
    if (url or settings.facilitator_url) == INTERNAL:
        return FacilitatorFee(internal=True)
    return FacilitatorFee(internal=False, external_micro_usdc=settings.facilitator_settlement_fee_micro_usdc)


def route_price(route: RouteSpec, fee: FacilitatorFee) -> RoutePrice | None:
    """``route``'s price through the facilitator charging ``fee``; None for an unpaid route. A
    top-up sells credit worth exactly its price: the operator bears its one settlement's fee."""
    if route.provider_price_micro_usdc is None:
        return None
    if HANDLERS[route.handler].sells_credit:
        return RoutePrice(provider=route.provider_price_micro_usdc, settlement_fee=0)
    settlement = route.internal_settlement.fee_micro_usdc if fee.internal else fee.external_micro_usdc
    return RoutePrice(provider=route.provider_price_micro_usdc, settlement_fee=settlement)


def batch_price(routes: Iterable[RouteSpec], fee: FacilitatorFee) -> RoutePrice | None:
    """A JSON-RPC batch of calls of ``routes`` (one per call, repeats included) through the
    facilitator charging ``fee``: one payment, so one settlement, so the sum of the calls'
    provider parts plus ONE settlement fee; None when a call is unpaid (or there are none)."""
    prices = [route_price(route, fee) for route in routes]
    if not prices or any(price is None for price in prices):
        return None
    priced = [price for price in prices if price is not None]
    return RoutePrice(provider=sum(p.provider for p in priced), settlement_fee=priced[0].settlement_fee)


class CreditTerms(msgspec.Struct, frozen=True):
    """Prepaid credit is on: paid routes also take credit, which lapses ``lapse_days`` after a
    wallet's last top-up."""

    lapse_days: int


def credit_terms(settings: Settings) -> CreditTerms | None:
    return CreditTerms(settings.credit_lapse_days) if settings.credits_enabled else None


def micro_usdc_string(micro: int) -> str:
    return str(micro)


def usd_display(micro: int) -> str:
    """``1005`` -> ``"$0.001005"``; whole cents keep two decimals (``0`` -> ``"$0.00"``)."""
    value = Decimal(micro) / Decimal(1_000_000)
    text = f"{value:.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"
