"""What the internal facilitator's fee payer spends and holds, for the operator's alerts.

Fees are computed from each broadcast transaction (every signature's base fee plus its priority
fee) and counted once its outcome is known: ``landed`` for a settlement that was paid for,
``failed`` for one that failed on chain, whose fee the fee payer lost. The balance is read from
the node after settlements, at most every ``BALANCE_REFRESH_S`` per process.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

BALANCE_REFRESH_S = 10.0

SETTLEMENT_FEES = Counter(
    "x402_fee_payer_fees_lamports_total",
    "Lamports the internal facilitator's fee payer spent on settlements, by outcome (landed, failed).",
    ["outcome"],
)
FEE_PAYER_BALANCE = Gauge(
    "x402_fee_payer_balance_lamports",
    "The internal facilitator's fee payer's SOL balance in lamports, as last read.",
    multiprocess_mode="mostrecent",
)
SETTLEMENTS_HELD_BACK = Counter(
    "x402_settlements_held_back_total",
    "Settlements the fee guard did not broadcast, by reason (cooling_down, in_flight, insufficient_funds).",
    ["reason"],
)
