"""Write-ahead settlement, and truthful answers once a settlement may have been broadcast.

The intent to settle (payment key, request fingerprint, the withheld response) is stored before
the facilitator is asked. A ``serve`` process SIGKILLed between the broadcast and its answer
leaves that record behind, and the client's retry of the identical request, on another replica,
gets what it paid for, with nothing broadcast twice and the provider called once. A store lost
after the settle call never yields "nothing was charged". Each runs on single-node Redis and on a
3-master Redis Cluster (the lost store: a server, or every node of a cluster, of the test's own).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal

import aiohttp
import pytest

from gateway.x402.types import FacilitatorRequest, SettleResponse
from tests.support.adversarial_paid import (
    ONE_SETTLEMENT_FEE,
    LateConfirmationBackend,
    Money,
    another_client_signature,
)
from tests.support.cdp_facilitator import CdpCredentials, FacilitatorBackend, ReferenceBackend
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.log_capture import captured_log_lines
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    GET_BALANCE_PROVIDER_PRICE,
    MARKER,
    PROVIDER_ANSWER,
    StartPaidGateway,
    assert_answered,
    balance_body,
)
from tests.support.paid_processes import eventually, paid_processes
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.redis_server import RedisServer
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")
redis_url = on_redis_and_cluster()

ONE_SALE = Money(-GET_BALANCE_PROVIDER_PRICE, GET_BALANCE_PROVIDER_PRICE, -ONE_SETTLEMENT_FEE)
ONE_SALE_INTERNAL = Money(-GET_BALANCE_PRICE_INTERNAL, GET_BALANCE_PRICE_INTERNAL, -ONE_SETTLEMENT_FEE)
"""A sale settled by our own fee payer: its price carries the settlement fee."""


async def test_a_process_killed_between_broadcast_and_answer_is_reconciled_by_the_retry_on_a_replica(
    clean_redis_url: str,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    backend = LateConfirmationBackend(usdc_chain, solana_rpc_server)
    facilitator = await start_cdp_facilitator(credentials=cdp_credentials, backend=backend)
    upstream.responder = static(200, PROVIDER_ANSWER)
    before = Money.of(usdc_chain)
    async with paid_processes(
        2,
        chain=usdc_chain,
        rpc=solana_rpc_server,
        upstream=upstream,
        facilitator=facilitator,
        env={"STATE_STORE_REST_URL": clean_redis_url},
    ) as running:
        killed, other = running.replicas
        payment = await running.payment(killed)
        request = asyncio.create_task(killed.pay(GET_BALANCE, balance_body(), payment))
        await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the settlement broadcast")
        os.killpg(killed.process.process.pid, signal.SIGKILL)  # no cleanup, no last word
        await asyncio.to_thread(killed.process.process.wait, 10)
        with pytest.raises(aiohttp.ClientError):
            await request
        backend.signer.release.set()  # the facilitator stops waiting and keeps it pending
        await eventually(backend.pending.kept.is_set, what="the facilitator's pending record")

        resigned = another_client_signature(payment, usdc_chain.payer)
        copy = await other.pay(GET_BALANCE, balance_body(), resigned)
        reply = await other.pay(GET_BALANCE, balance_body(), payment)

    assert copy.status == 402, copy.body
    assert copy.json()["error"] == "payment_already_used"
    assert_answered(reply, solana_rpc_server.sent[0])
    assert running.upstream_calls == 1
    assert len(set(solana_rpc_server.sent)) == 1
    assert Money.of(usdc_chain).minus(before) == ONE_SALE


class StoreLostAtSettle:
    """A facilitator whose settle runs ``inner``'s (for real) and then takes the store down (every
    node of a cluster), so the gateway learns the outcome with no store to record it in."""

    def __init__(self, inner: FacilitatorBackend, store: RedisServer | RedisCluster) -> None:
        self.inner = inner
        self.store = store

    async def supported(self):  # type: ignore[no-untyped-def]
        return await self.inner.supported()

    async def verify(self, request: FacilitatorRequest):  # type: ignore[no-untyped-def]
        return await self.inner.verify(request)

    async def settle(self, request: FacilitatorRequest) -> SettleResponse:
        answer = await self.inner.settle(request)
        await asyncio.to_thread(self.store.stop)
        return answer


async def test_a_store_lost_after_a_pending_settlement_says_pending_and_logs_it_loudly(
    start_paid_gateway: StartPaidGateway,
    private_store: RedisServer | RedisCluster,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
) -> None:
    late = LateConfirmationBackend(usdc_chain, solana_rpc_server)
    late.signer.release.set()  # the first confirmation gives up at once: settlement_pending
    paid = await start_paid_gateway(
        backend=StoreLostAtSettle(late, private_store), env={"STATE_STORE_REST_URL": private_store.url}
    )
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()
    before = Money.of(usdc_chain)

    with captured_log_lines() as lines:
        reply = await paid.pay(GET_BALANCE, balance_body(), payment)
    late.close()

    assert reply.status == 503, reply.body
    assert reply.error_code == "settlement_pending"
    assert reply.headers["retry-after"] == "2"
    assert "nothing was charged" not in reply.body.decode()
    assert str(MARKER) not in reply.body.decode()
    logged = [json.loads(line) for line in lines]
    assert not any("nothing was charged" in entry["msg"] for entry in logged)
    (loud,) = [entry for entry in logged if entry["level"] == "error"]
    assert loud["msg"] == "settlement pending, its transaction not recorded: store unavailable"
    assert loud["settlement"] == solana_rpc_server.sent[0]
    assert paid.upstream_calls == 1
    assert Money.of(usdc_chain).minus(before) == ONE_SALE  # it landed: the retry will reconcile


async def test_a_store_lost_after_a_successful_settlement_still_delivers_it(
    start_paid_gateway: StartPaidGateway,
    private_store: RedisServer | RedisCluster,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
) -> None:
    reference = ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url)
    paid = await start_paid_gateway(
        backend=StoreLostAtSettle(reference, private_store), env={"STATE_STORE_REST_URL": private_store.url}
    )
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()
    before = Money.of(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)
    reference.close()

    assert_answered(reply, solana_rpc_server.sent[0])
    assert paid.upstream_calls == 1
    assert len(set(solana_rpc_server.sent)) == 1
    assert Money.of(usdc_chain).minus(before) == ONE_SALE


async def test_a_process_killed_while_our_fee_payer_confirms_is_reconciled_at_once_on_a_replica(
    clean_redis_url: str,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
) -> None:
    """With our own fee payer, a client IP without a record has one settlement in flight. The
    killed process's place used to stay held until its hold lapsed (a minute of 503
    ``settlement_pending`` for the retry); the place is the payment's, so the retry takes it back
    and is answered as soon as the chain confirms."""
    upstream.responder = static(200, PROVIDER_ANSWER)
    solana_rpc_server.confirm_delay_s = 2.0
    before = Money.of(usdc_chain)
    async with paid_processes(
        2,
        chain=usdc_chain,
        rpc=solana_rpc_server,
        upstream=upstream,
        facilitator=None,  # the internal facilitator: our fee payer, guarded per client IP
        env={"STATE_STORE_REST_URL": clean_redis_url},
    ) as running:
        killed, other = running.replicas
        payment = await running.payment(killed)
        request = asyncio.create_task(killed.pay(GET_BALANCE, balance_body(), payment))
        await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the settlement broadcast")
        os.killpg(killed.process.process.pid, signal.SIGKILL)  # mid-confirmation, no last word
        await asyncio.to_thread(killed.process.process.wait, 10)
        with pytest.raises(aiohttp.ClientError):
            await request

        started = asyncio.get_running_loop().time()
        statuses = []
        while (reply := await other.pay(GET_BALANCE, balance_body(), payment)).status == 503:
            statuses.append(reply.json()["error"]["code"])
            assert asyncio.get_running_loop().time() - started < 15, statuses
            await asyncio.sleep(0.5)
        waited = asyncio.get_running_loop().time() - started

    assert_answered(reply, solana_rpc_server.sent[0])
    assert waited < 10, (waited, statuses)  # the chain's 2 s, not the dead hold's minute
    assert set(statuses) <= {"settlement_pending"}
    assert running.upstream_calls == 1
    assert len(set(solana_rpc_server.sent)) == 1
    assert Money.of(usdc_chain).minus(before) == ONE_SALE_INTERNAL
