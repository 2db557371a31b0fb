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

from gateway.payments.confirmations import ConfirmationWatcher, PollSchedule
from gateway.solana_rpc import SolanaRpc
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
