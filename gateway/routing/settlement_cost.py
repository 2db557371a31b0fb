"""What one settlement can cost the fee payer, and what a route's price earns to cover it.

The internal facilitator's wallet pays every settlement's Solana fee: the base fee of every
signature on the transaction (the fee payer's and the client's) plus the priority fee the
client chose (compute-unit limit x compute-unit price). The exact-SVM caps bound the second
part, so the worst case is known at start-up; start-up refuses a route table whose settlement
fee, at the SOL price written beside it, would not cover that worst case.
"""

from __future__ import annotations

import math
from decimal import Decimal

from gateway.x402.svm import LAMPORTS_PER_SIGNATURE, ExactPolicy, priority_fee_lamports

SETTLEMENT_SIGNATURES = 2
"""An exact payment carries exactly two signatures: the fee payer's and the client's."""


def worst_case_lamports(policy: ExactPolicy) -> int:
    """The most one accepted payment can cost the fee payer to settle."""
    base = LAMPORTS_PER_SIGNATURE * SETTLEMENT_SIGNATURES
    return base + priority_fee_lamports(policy.max_compute_unit_limit, policy.max_compute_unit_price)


def lamports_covered(micro_usdc: int, sol_price_usd: Decimal) -> int:
    """How many lamports ``micro_usdc`` pays for at ``sol_price_usd``, rounded down."""
    return math.floor(Decimal(micro_usdc) * 1000 / sol_price_usd)
