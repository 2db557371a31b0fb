"""The confirmation watcher against the LiteSVM node on loopback, confirming some time after
landing as a real cluster does: every waiting settlement learns of its confirmation (or failure),
and concurrent ones share the node's calls."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import pytest_asyncio
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.system_program import TransferParams, transfer
from solders.transaction import VersionedTransaction

from gateway.methods.exact.confirmations import ConfirmationWatcher, PollSchedule
from gateway.outbound.solana_rpc import SignatureStatus, SolanaRpc
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

FAST = PollSchedule(first_s=0.01, growth=1.4, max_s=0.05, min_gap_s=0.005)


@pytest_asyncio.fixture(loop_scope="session")
async def rpc(solana_rpc_server: LiteSvmRpcServer) -> AsyncIterator[SolanaRpc]:
    client = SolanaRpc(solana_rpc_server.url)
    yield client
    await client.close()


async def _send_transfer(
    rpc: SolanaRpc, chain: UsdcChain, lamports: int, skip_preflight: bool = False
) -> str:
    """A SOL transfer from the fee payer, broadcast through the node; its signature."""
    payer = chain.fee_payer
    ix = transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=Keypair().pubkey(), lamports=lamports))
    message = MessageV0.try_compile(payer.pubkey(), [ix], [], chain.blockhash)
    tx = VersionedTransaction(message, [payer])
    encoded = base64.b64encode(bytes(tx)).decode()
    return await rpc.send_transaction(
        encoded, skip_preflight=skip_preflight, preflight_commitment="processed"
    )


async def test_a_signature_is_reported_once_the_chain_confirms_it(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.confirm_delay_s = 0.15
    watcher = ConfirmationWatcher(rpc, FAST)
    signature = await _send_transfer(rpc, usdc_chain, 1_000_000)

    status = await watcher.status(signature, timeout_s=5)

    assert status is not None and status.confirmed and status.err is None
    # Polled at a growing pace while the chain was still confirming, not once a second.
    assert 2 <= watcher.calls <= 15
    await watcher.close()


async def test_concurrent_settlements_share_the_nodes_calls(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.confirm_delay_s = 0.15
    watcher = ConfirmationWatcher(rpc, FAST)
    signatures = [await _send_transfer(rpc, usdc_chain, 1_000_000 + n) for n in range(20)]
    before = solana_rpc_server.calls["getSignatureStatuses"]

    statuses = await asyncio.gather(*(watcher.status(s, timeout_s=5) for s in signatures))

    assert all(s is not None and s.confirmed for s in statuses)
    calls = solana_rpc_server.calls["getSignatureStatuses"] - before
    assert calls == watcher.calls <= 15  # one call asks about every signature that is due
    await watcher.close()


async def test_a_transaction_that_fails_on_chain_is_reported_failed(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    watcher = ConfirmationWatcher(rpc, FAST)
    broke = usdc_chain.lamports(usdc_chain.fee_payer.pubkey()) * 2
    signature = await _send_transfer(rpc, usdc_chain, broke, skip_preflight=True)

    status = await watcher.status(signature, timeout_s=5)

    assert status is not None and status.err is not None
    await watcher.close()


async def test_a_signature_never_confirmed_gives_up_at_the_timeout(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.hold_confirmations = True
    watcher = ConfirmationWatcher(rpc, FAST)
    signature = await _send_transfer(rpc, usdc_chain, 1_000_000)

    assert await watcher.status(signature, timeout_s=0.2) is None
    solana_rpc_server.release_confirmations()
    status = await watcher.status(signature, timeout_s=5)  # a later wait (a reconciling retry) hears it
    assert status is not None and status.confirmed
    await watcher.close()


# --- following a signature after its wait -------------------------------------------------------

FOLLOWING = PollSchedule(first_s=0.01, growth=1.4, max_s=0.05, min_gap_s=0.005, blockhash_check_s=0.05)


async def _followed(watcher: ConfirmationWatcher, signature: str, blockhash: str) -> asyncio.Future[object]:
    """Follow ``signature``; the future gets what its follower was told."""
    told: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def then(status: object) -> None:
        told.set_result(status)

    assert watcher.follow(signature, blockhash, then)
    return told


async def test_a_transaction_failing_after_the_wait_is_followed_until_it_lands(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.land_delay_s = 0.6  # lands after the wait below, as 35 s after a 30 s wait
    watcher = ConfirmationWatcher(rpc, FOLLOWING)
    broke = usdc_chain.lamports(usdc_chain.fee_payer.pubkey()) * 2
    signature = await _send_transfer(rpc, usdc_chain, broke, skip_preflight=True)

    assert await watcher.status(signature, timeout_s=0.3) is None
    told = await _followed(watcher, signature, str(usdc_chain.blockhash))
    assert watcher.followed == 1
    status = await asyncio.wait_for(told, 5)

    assert isinstance(status, SignatureStatus) and status.err is not None
    assert watcher.followed == 0
    await watcher.close()


async def test_a_transaction_whose_blockhash_expired_before_it_landed_is_told_none(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.land_delay_s = 0.3
    watcher = ConfirmationWatcher(rpc, FOLLOWING)
    blockhash = str(usdc_chain.blockhash)
    signature = await _send_transfer(rpc, usdc_chain, 1_000_000)
    usdc_chain.svm.expire_blockhash()  # before it lands: the node drops it, it never will

    told = await _followed(watcher, signature, blockhash)
    assert await asyncio.wait_for(told, 5) is None
    await asyncio.sleep(0.4)  # past its landing time: nothing landed
    assert (await rpc.get_signature_statuses([signature])) == [None]
    assert solana_rpc_server.calls["isBlockhashValid"] >= 1
    assert watcher.followed == 0
    await watcher.close()


async def test_a_process_follows_a_bounded_number_of_signatures(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.hold_confirmations = True
    schedule = PollSchedule(first_s=0.01, max_s=0.05, min_gap_s=0.005, max_followed=1)
    watcher = ConfirmationWatcher(rpc, schedule)
    first, second = [await _send_transfer(rpc, usdc_chain, 1_000_000 + n) for n in range(2)]

    told = await _followed(watcher, first, str(usdc_chain.blockhash))
    also_told = await _followed(watcher, first, str(usdc_chain.blockhash))  # not one more signature

    async def then(status: object) -> None:
        raise AssertionError("a signature past the bound is not followed")

    assert not watcher.follow(second, str(usdc_chain.blockhash), then)
    solana_rpc_server.release_confirmations()
    for future in (told, also_told):
        status = await asyncio.wait_for(future, 5)
        assert isinstance(status, SignatureStatus) and status.confirmed
    await watcher.close()


async def test_a_follow_up_ends_after_its_longest_time_when_the_node_cannot_tell(
    rpc: SolanaRpc, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    solana_rpc_server.hold_confirmations = True  # landed, never confirmed; its blockhash stays valid
    schedule = PollSchedule(
        first_s=0.01, max_s=0.05, min_gap_s=0.005, blockhash_check_s=0.05, follow_max_s=0.4
    )
    watcher = ConfirmationWatcher(rpc, schedule)
    signature = await _send_transfer(rpc, usdc_chain, 1_000_000)
    never_sent = str(Keypair().sign_message(b"never broadcast"))

    landed = await _followed(watcher, signature, str(usdc_chain.blockhash))
    unknown = await _followed(watcher, never_sent, str(usdc_chain.blockhash))

    status = await asyncio.wait_for(landed, 5)
    assert isinstance(status, SignatureStatus) and status.err is None and not status.confirmed
    assert await asyncio.wait_for(unknown, 5) is None
    assert solana_rpc_server.calls["isBlockhashValid"] >= 1  # asked, and told it is still valid
    assert watcher.followed == 0
    await watcher.close()
