"""Price display: micro-USDC integers to the strings the catalog and 402 advertise."""

from __future__ import annotations

from decimal import Decimal


def micro_usdc_string(micro: int) -> str:
    return str(micro)


def usd_display(micro: int) -> str:
    """``1005`` -> ``"$0.001005"``; whole cents keep two decimals (``0`` -> ``"$0.00"``)."""
    value = Decimal(micro) / Decimal(1_000_000)
    text = f"{value:.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"
