"""The internal facilitator's fee guard against LiteSVM: a payer settles as many payments at once
as it can pay and has earned, and a payer whose settlement failed on chain costs the fee payer
no second fee (the drain race: its own transaction empties its token accounts between our
preflight and our landing). The guard's state (records, places in flight, cool-downs) is kept
in memory, on Redis and on a 3-master Redis Cluster (the stores replicas share)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    build_payment_payload,
)
from gateway.facilitators.local import LocalFacilitator
from gateway.methods.exact.fee_guard import FeeGuard, Party
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.store import Store
from gateway.x402.types import PaymentPayload, PaymentRequirements, SettleResponse
from tests.support.adversarial_paid import drain_transaction, settled_after_held_drain
from tests.support.paid_processes import eventually
from tests.support.redis_fixtures import STORE_KINDS, fresh_store
from tests.support.solana_fixtures import MakeFacilitator, exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, set_token_account

AMOUNT = 10_000
FEE = 2 * 5_000  # two signatures; the builder's priority fee rounds to 0 lamports


@pytest.fixture(params=STORE_KINDS)
async def guard_store(
    request: pytest.FixtureRequest, upstash_url_and_token: tuple[str, str]
) -> AsyncIterator[Store]:
    """The guard's state on every backend: the in-process store and the ones replicas share."""
    store = fresh_store(request, request.param, upstash_url_and_token)
    yield store
    await store.close()


def _payment(
    chain: UsdcChain, req: PaymentRequirements, owner: Keypair | None = None, source: Pubkey | None = None
) -> PaymentPayload:
    mint = MintInfo(address=str(chain.mint), decimals=chain.decimals)
    tx = build_exact_transaction(req, owner or chain.payer, mint, chain.blockhash, source=source)
    return build_payment_payload(req, tx)


async def _settle_all(
    facilitator: LocalFacilitator, req: PaymentRequirements, payments: list[PaymentPayload]
) -> list[SettleResponse]:
    return list(await asyncio.gather(*(facilitator.settle(p, req) for p in payments)))


def _successes(outcomes: list[SettleResponse]) -> int:
    return sum(o.success for o in outcomes)


async def test_twelve_at_once_from_a_wallet_that_affords_one_land_one_transaction(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    guard_store: Store,
) -> None:
    chain = make_usdc_chain(payer_amount=AMOUNT)
    req = exact_requirements(chain, amount=str(AMOUNT))
    # Eleven wait their turn behind the one that lands, then each reads the balance in turn: wide
    # enough for the last of them on a loaded machine (a wait that passes answers settlement_pending).
    facilitator = make_local_facilitator(chain, store=guard_store, payer_wait_s=20.0)
    before = chain.lamports(chain.fee_payer.pubkey())

    outcomes = await _settle_all(facilitator, req, [_payment(chain, req) for _ in range(12)])

    assert _successes(outcomes) == 1
    assert {o.errorReason for o in outcomes if not o.success} == {"insufficient_funds"}
    assert len(solana_rpc_server.sent) == 1
    assert chain.balance(chain.pay_to_ata) == AMOUNT and chain.balance(chain.payer_ata) == 0
    assert before - chain.lamports(chain.fee_payer.pubkey()) == FEE


async def test_a_payer_with_a_record_of_settled_payments_settles_ten_at_once(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    guard_store: Store,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    facilitator = make_local_facilitator(chain, store=guard_store)
    for _ in range(5):  # its record: 5 settled payments, so 11 may be in flight
        assert (await facilitator.settle(_payment(chain, req), req)).success
    solana_rpc_server.hold_confirmations = True

    settling = asyncio.gather(*(facilitator.settle(_payment(chain, req), req) for _ in range(10)))
    await eventually(lambda: len(solana_rpc_server.sent) == 15, what="all ten broadcast before any confirmed")
    solana_rpc_server.release_confirmations()

    assert _successes(list(await settling)) == 10
    assert chain.balance(chain.pay_to_ata) == 15 * AMOUNT


async def test_a_stranger_settles_one_at_a_time_until_it_has_a_record(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    guard_store: Store,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    facilitator = make_local_facilitator(chain, store=guard_store)
    solana_rpc_server.hold_confirmations = True

    settling = asyncio.gather(*(facilitator.settle(_payment(chain, req), req) for _ in range(3)))
    await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the first broadcast")
    await asyncio.sleep(0.3)
    assert len(solana_rpc_server.sent) == 1  # the others wait for the first to land
    solana_rpc_server.release_confirmations()

    assert _successes(list(await settling)) == 3


async def test_the_drain_race_costs_the_fee_payer_one_failed_settlement_in_two_rounds(
    make_usdc_chain: Callable[..., UsdcChain],
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    guard_store: Store,
) -> None:
    chain = make_usdc_chain()
    req = exact_requirements(chain, amount=str(AMOUNT))
    facilitator = make_local_facilitator(chain, store=guard_store)
    owner = Keypair()
    chain.svm.airdrop(owner.pubkey(), 1_000_000_000)  # pays its own drain's fee
    rpc = SolanaRpc(solana_rpc_server.url)
    before = chain.lamports(chain.fee_payer.pubkey())
    failed_on_chain = 0
    try:
        for _ in range(2):
            accounts = [
                set_token_account(chain.svm, owner.pubkey(), chain.mint, AMOUNT, address=Keypair().pubkey())
                for _ in range(10)
            ]
            payments = [_payment(chain, req, owner, source) for source in accounts]
            # The drain goes out first and lands only after a settlement went out (or none will):
            # our checks, which read the funds once the place is held, still see them, as on a
            # cluster where a broadcast lands a moment later, however loaded the machine.
            solana_rpc_server.hold_landing = True
            await rpc.send_transaction(drain_transaction(chain, owner, accounts, AMOUNT), skip_preflight=True)
            drained = len(solana_rpc_server.sent)
            settling = _settle_all(facilitator, req, payments)
            outcomes = await settled_after_held_drain(solana_rpc_server, drained, settling)
            failed_on_chain += sum(o.errorReason == "transaction_failed" for o in outcomes)
            assert _successes(outcomes) == 0
    finally:
        await rpc.close()

    assert failed_on_chain == 1
    assert before - chain.lamports(chain.fee_payer.pubkey()) == FEE  # at most 2 fees lost: here 1


# --- a shared client IP: a payer's own record vouches for it ------------------------------------


IP = Party("ip", "2001:db8:1:2::/64")
HONEST = Party("owner", "HonestOwner1111111111111111111111111111111")
STRANGER = Party("owner", "Stranger11111111111111111111111111111111111")


async def test_an_ip_cooling_down_binds_only_payers_without_a_record_of_their_own(guard_store: Store) -> None:
    guard = FeeGuard(guard_store)
    for _ in range(3):
        await guard.landed([HONEST])
    await guard.failed([IP])  # another wallet of this IP failed on chain

    honest = await guard.standing([IP], voucher=HONEST)
    stranger = await guard.standing([IP], voucher=STRANGER)
    alone = await guard.standing([IP])

    assert honest.cooling is None and honest.vouched
    assert honest.records[IP] == 3  # its own record: 7 in flight, as anywhere else
    assert guard.allowance(honest.records[IP]) == 7
    assert stranger.cooling == IP and not stranger.vouched
    assert alone.cooling == IP and alone.records[IP] == 0


async def test_a_payer_cooling_down_itself_is_not_vouched_for(guard_store: Store) -> None:
    guard = FeeGuard(guard_store)
    await guard.landed([HONEST])
    await guard.failed([HONEST, IP])
    await guard.landed([HONEST])  # a settlement in flight before the failure landed after it

    standing = await guard.standing([IP], voucher=HONEST)

    assert standing.cooling in (IP, HONEST) and not standing.vouched


async def test_vouched_payers_never_hold_more_than_max_in_flight_of_one_ip(guard_store: Store) -> None:
    guard = FeeGuard(guard_store, max_in_flight=4)
    payers = [Party("owner", f"Payer{i}") for i in range(3)]
    for payer in payers:
        for _ in range(5):
            await guard.landed([payer])

    admitted = []
    for n in range(9):
        standing = await guard.standing([IP], voucher=payers[n % 3])
        admitted.append(await guard.enter(f"token-{n}", standing, [IP]))

    assert admitted == [True] * 4 + [False] * 5  # each payer's allowance is 4: the IP holds 4 in all
