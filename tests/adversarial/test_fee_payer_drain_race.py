"""Attack: make the operator's fee payer pay for settlements that fail on chain.

A client holding 10 small token accounts under one owner sends 10 paid requests at once and, at
the same moment, one transaction of its own that empties those accounts. On a real cluster a
broadcast lands a slot or more after the node's preflight, so every check (verify's simulation,
settle's simulation, the preflight) passes before the drain lands, and every settlement that
is broadcast fails on chain at the fee payer's expense. Mounted against the gateway settling
with its own wallet (``FACILITATOR_URL=internal``) on LiteSVM, which holds the drain (and what
follows it) unexecuted until a settlement was broadcast or every request was refused, for two
rounds: the fee guard lets a stranger have one settlement in flight and cools the owner, its
accounts and its IP down after it fails, so the fee payer loses one settlement's fee in all (the
stated bound: two).
"""

from __future__ import annotations

import asyncio

from solders.keypair import Keypair

from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    build_payment_payload,
)
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload
from tests.support.adversarial_paid import (
    ONE_SETTLEMENT_FEE,
    drain_transaction,
    settled_after_held_drain,
    via,
)
from tests.support.paid_fixtures import (
    GET_BALANCE,
    PaidGateway,
    Reply,
    StartPaidGateway,
    balance_body,
    paid_gateways_on_the_store,
)
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import set_token_account

redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()

ATTACKER_IP = "203.0.113.99"
ACCOUNTS = 10
ROUNDS = 2
FAILED_FEES = 'x402_fee_payer_fees_lamports_total{outcome="failed"}'


async def _round(paid: PaidGateway, rpc: SolanaRpc, owner: Keypair) -> list[Reply]:
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    mint = MintInfo(address=str(paid.chain.mint), decimals=paid.chain.decimals)
    accounts = [
        set_token_account(paid.chain.svm, owner.pubkey(), paid.chain.mint, price, address=Keypair().pubkey())
        for _ in range(ACCOUNTS)
    ]
    blockhash = paid.chain.blockhash
    payments = [
        build_payment_payload(
            requirements,
            build_exact_transaction(requirements, owner, mint, blockhash, source=account),
            resource=resource,
        )
        for account in accounts
    ]
    # The drain goes out first and lands only once a settlement went out (or none will): every
    # check sees the funds still there, as on a cluster, however loaded the machine.
    paid.rpc.hold_landing = True
    await rpc.send_transaction(drain_transaction(paid.chain, owner, accounts, price), skip_preflight=True)
    drained = len(paid.rpc.sent)

    async def pay(n: int, payment: PaymentPayload) -> Reply:
        headers = {"payment-signature": encode_header(payment), **via(ATTACKER_IP)}
        return await paid.post(GET_BALANCE, balance_body(request_id=n), headers)

    paying = asyncio.gather(*(pay(n, p) for n, p in enumerate(payments)))
    return list(await settled_after_held_drain(paid.rpc, drained, paying))


async def test_the_drain_race_costs_the_fee_payer_at_most_two_failed_settlements(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(internal=True, env={"TRUSTED_PROXIES": "127.0.0.1"})
    owner = Keypair()
    paid.chain.svm.airdrop(owner.pubkey(), 1_000_000_000)  # pays its own drains' fees
    fee_payer = paid.chain.fee_payer.pubkey()
    before = paid.chain.lamports(fee_payer)
    failed_fees_before = _metric(await paid.get("/metrics"), FAILED_FEES)
    rpc = SolanaRpc(paid.rpc.url)
    try:
        replies = [reply for _ in range(ROUNDS) for reply in await _round(paid, rpc, owner)]
    finally:
        await rpc.close()

    assert len(replies) == ROUNDS * ACCOUNTS
    assert all(reply.status == 402 for reply in replies), [r.status for r in replies]
    reasons = {reply.json()["error"] for reply in replies}
    assert reasons <= {"settlement_failed", "invalid_transaction_state", "transaction_simulation_failed"}
    lost = before - paid.chain.lamports(fee_payer)
    assert lost <= 2 * ONE_SETTLEMENT_FEE
    assert lost == ONE_SETTLEMENT_FEE  # one failed settlement: the owner and its IP cooled down after it
    # The operator sees it: the fees lost to failed settlements, and the fee payer's balance.
    metrics = await paid.get("/metrics")
    # (computed from the transaction: the priority fee rounded up, 1 lamport here, which LiteSVM
    # does not charge)
    assert _metric(metrics, FAILED_FEES) - failed_fees_before in (lost, lost + 1)
    assert _metric(metrics, "x402_fee_payer_balance_lamports") == paid.chain.lamports(fee_payer)


def _metric(reply: Reply, series: str) -> float:
    """A series' value in a /metrics answer (0 when it is not there yet)."""
    for line in reply.body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
