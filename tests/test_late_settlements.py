"""A settlement whose confirmation wait passed is followed until it lands or its blockhash
expires, on the internal facilitator against LiteSVM, with its state on memory, on Redis and on
a 3-master Redis Cluster (the stores replicas share): a late failure cools the payer owner and
its token account down and wipes the owner's record, as a failure found in time does; a late
outcome is counted once however many settles and follow-ups hear of it. The chain lands 1.5 s
after broadcast and the wait is 0.3 s: as a Solana cluster landing after a settle gave up waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.facilitators.local import LocalFacilitator
from gateway.methods.exact.fee_guard import FeeGuard, Party, Standing
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.store import Store, keys
from gateway.x402.svm import decode_transaction, payment_key
from gateway.x402.types import PaymentPayload, PaymentRequirements
from tests.support.adversarial_paid import drain_transaction
from tests.support.paid_processes import eventually, eventually_async, stored_eventually
from tests.support.redis_fixtures import STORE_KINDS, fresh_store
from tests.support.solana_fixtures import MakeFacilitator, exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, set_token_account

AMOUNT = 10_000
FEE = 2 * 5_000  # two signatures; the builder's priority fee rounds to 0 lamports
WAIT_S = 0.3
"""The broadcaster's confirmation wait; the chain holds each landing until the test has seen it
pass (``hold_landing``), so a settle's checks (places, the balance, preflight) still see the funds
a drain sent just before takes, however loaded the machine."""


@pytest.fixture(params=STORE_KINDS)
async def store(
    request: pytest.FixtureRequest, upstash_url_and_token: tuple[str, str]
) -> AsyncIterator[Store]:
    found = fresh_store(request, request.param, upstash_url_and_token)
    yield found
    await found.close()


def _fees(outcome: str) -> float:
    return REGISTRY.get_sample_value("x402_fee_payer_fees_lamports_total", {"outcome": outcome}) or 0.0


def _payment(
    chain: UsdcChain, req: PaymentRequirements, owner: Keypair, amount: int
) -> tuple[PaymentPayload, Pubkey]:
    """A payment from a fresh token account of ``owner`` holding ``amount``; and that account."""
    source = set_token_account(chain.svm, owner.pubkey(), chain.mint, amount, address=Keypair().pubkey())
    mint = MintInfo(address=str(chain.mint), decimals=chain.decimals)
    tx = build_exact_transaction(req, owner, mint, chain.blockhash, source=source)
    return build_payment_payload(req, tx), source


def _key(payment: PaymentPayload) -> str:
    return keys.settlement(payment_key(decode_transaction(payment.payload["transaction"])))


def _late(make: MakeFacilitator, chain: UsdcChain, store: Store, wait_s: float = WAIT_S) -> LocalFacilitator:
    return make(chain, store=store, confirm_timeout_s=wait_s)


async def test_a_failure_after_the_wait_cools_the_payer_down_and_wipes_its_record(
    store: Store,
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    facilitator = _late(make_local_facilitator, chain, store)
    owner = Keypair()
    chain.svm.airdrop(owner.pubkey(), 1_000_000_000)  # pays its own drain's fee
    guard = FeeGuard(store)
    me = Party("owner", str(owner.pubkey()))
    await guard.landed([me])  # a record, earned before
    solana_rpc_server.hold_landing = True
    payment, source = _payment(chain, req, owner, AMOUNT)
    fee_payer = chain.fee_payer.pubkey()
    before, failed_before = chain.lamports(fee_payer), _fees("failed")
    rpc = SolanaRpc(solana_rpc_server.url)
    try:
        await rpc.send_transaction(drain_transaction(chain, owner, [source], AMOUNT), skip_preflight=True)
    finally:
        await rpc.close()

    answer = await facilitator.settle(payment, req)

    # The wait passed before it landed: pending, its signature named, nothing counted yet.
    assert answer.success is False and answer.errorReason == "settlement_pending"
    assert answer.transaction == solana_rpc_server.sent[-1]
    assert await store.get(me.cooldown_key) is None
    assert not await guard.enter("early", Standing(None, {}), [me])  # its place is still held
    solana_rpc_server.land_held()
    # It lands and fails later: the follow-up counts it as a failure in time is counted.
    cooling = Party("account", str(source))
    for party in (me, cooling):  # on a cluster each party's keys are a step of their own
        await stored_eventually(store, party.cooldown_key)
    assert await store.get(cooling.cooldown_key) == "1"
    assert await store.get(me.record_key) == "0"  # its record is wiped
    assert before - chain.lamports(fee_payer) == FEE
    assert _fees("failed") - failed_before in (FEE, FEE + 1)
    settled = await store.get(_key(payment))
    assert settled is not None and '"state":"failed"' in settled
    # Its places in flight are free again (the follow-up left them), and the owner cannot pay.
    await eventually_async(
        lambda: guard.enter("probe", Standing(None, {}), [me, cooling]), what="places freed"
    )
    again = await facilitator.settle(_payment(chain, req, owner, AMOUNT)[0], req)
    assert again.errorReason == "invalid_transaction_state"
    assert len(solana_rpc_server.sent) == 2  # the drain and the one settlement


async def test_a_late_landing_is_counted_once_by_the_follow_up_and_a_reconciling_replica(
    store: Store,
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    broadcaster = _late(make_local_facilitator, chain, store)
    other_replica = _late(make_local_facilitator, chain, store, wait_s=5.0)
    solana_rpc_server.hold_landing = True
    payment, _ = _payment(chain, req, chain.payer, AMOUNT)
    me = Party("owner", str(chain.payer.pubkey()))
    landed_before = _fees("landed")

    first = asyncio.create_task(broadcaster.settle(payment, req))
    await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the broadcast")
    retried = asyncio.create_task(other_replica.settle(payment, req))
    pending = await first
    solana_rpc_server.land_held()  # after the broadcaster's wait, within the other's
    reconciled = await retried  # hears the landing in its own wait

    assert pending.errorReason == "settlement_pending"
    assert reconciled.success is True and reconciled.transaction == pending.transaction
    await asyncio.sleep(0.3)  # the broadcaster's follow-up hears it too
    assert broadcaster._watcher(req.network).followed == 0
    assert await store.get(me.record_key) == "1"  # counted once
    assert _fees("landed") - landed_before in (FEE, FEE + 1)
    assert len(solana_rpc_server.sent) == 1


async def test_a_late_failure_whose_follow_up_died_is_counted_by_a_retry_on_another_replica(
    store: Store,
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    broadcaster = _late(make_local_facilitator, chain, store)
    other_replica = _late(make_local_facilitator, chain, store, wait_s=5.0)
    owner = Keypair()
    chain.svm.airdrop(owner.pubkey(), 1_000_000_000)
    solana_rpc_server.hold_landing = True
    payment, source = _payment(chain, req, owner, AMOUNT)
    me, account = Party("owner", str(owner.pubkey())), Party("account", str(source))
    rpc = SolanaRpc(solana_rpc_server.url)
    try:
        await rpc.send_transaction(drain_transaction(chain, owner, [source], AMOUNT), skip_preflight=True)
    finally:
        await rpc.close()
    failed_before = _fees("failed")

    third_replica = _late(make_local_facilitator, chain, store, wait_s=5.0)

    pending = await broadcaster.settle(payment, req)
    assert pending.errorReason == "settlement_pending"
    await broadcaster.close()  # its process dies: its follow-up is lost
    solana_rpc_server.land_held()
    # The client's retries, on two other replicas at once: both hear the failure.
    retried = await asyncio.gather(other_replica.settle(payment, req), third_replica.settle(payment, req))

    assert [r.errorReason for r in retried] == ["transaction_failed"] * 2
    assert await store.get(me.cooldown_key) == "1" and await store.get(account.cooldown_key) == "1"
    assert _fees("failed") - failed_before in (FEE, FEE + 1)  # counted once
    assert await store.get(keys.fee_guard_counted("payer", pending.transaction)) == "1"
    assert len(solana_rpc_server.sent) == 2  # the drain and the one settlement
