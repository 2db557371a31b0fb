"""Prepaid credit in Prometheus, for the operator's books: credit sold (the liability grows),
spent per route (it shrinks as calls are served) and lapsed. Settled revenue
(``x402_revenue_micro_usdc_total``) counts a top-up's payment like any other; these series say
how much of it is still owed."""

from __future__ import annotations

from prometheus_client import Counter

CREDIT_SOLD = Counter(
    "x402_credit_sold_micro_usdc_total",
    "Prepaid credit booked to wallets by settled top-ups, in micro-USDC (this process).",
)
CREDIT_SPENT = Counter(
    "x402_credit_spent_micro_usdc_total",
    "Prepaid credit taken for calls served, in micro-USDC, by route (this process).",
    ["route"],
)
CREDIT_LAPSED = Counter(
    "x402_credit_lapsed_micro_usdc_total",
    "Prepaid credit lapsed unspent (CREDIT_LAPSE_DAYS after the wallet's last top-up), in micro-USDC"
    " (this process: the replica that swept it).",
)
