"""Reading the gateway's /metrics text: the payment, usage and revenue series by route and outcome."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

EARNINGS_METRICS = ("x402_payments_total", "x402_usage_total", "x402_revenue_micro_usdc_total")

Series = dict[tuple[str, str, str], float]
"""(metric, route, outcome) -> value; the outcome is "" for the revenue counter."""


def earnings_series(text: str) -> Series:
    """Every sample of :data:`EARNINGS_METRICS` in the exposition ``text``."""
    found: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in EARNINGS_METRICS:
                found[(sample.name, sample.labels["route"], sample.labels.get("outcome", ""))] = sample.value
    return found
