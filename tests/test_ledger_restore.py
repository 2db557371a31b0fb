"""Money owed survives the store: a Redis that forgot credit is brought forward from the ledger.

Two replicas of the whole gateway are served (hypercorn on loopback) with credit on, over a Redis
of the test's own, settling with their own fee payer on a LiteSVM chain and journaling to a real
PostgreSQL. The store then loses data as stores do: flushed, or crashed and restarted from an
append-only file that stopped being written (a rollback). The credit the ledger says is owed
comes back by itself, once, and no top-up is credited twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from solders.keypair import Keypair

from gateway.ledger import EntryKind, Journal, restore
from gateway.store import Store
from gateway.store.redis import RedisStore
from tests.support.adversarial_credit import (
    CALL_CREDIT,
    TOP_UP_1_CREDIT,
    CreditClient,
    credit_env,
    credit_of,
    served_credit_gateway,
    started_provider,
)
from tests.support.ledger_served import eventually_owed
from tests.support.paid_fixtures import PaidGateway
from tests.support.paid_processes import eventually, paid_processes
from tests.support.postgres_server import create_schema
from tests.support.redis_server import RedisServer, start_redis_server
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]


@pytest.fixture
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check every 0.1 s, and trust a top-up's booking after 0.5 s instead of 20 s."""
    monkeypatch.setattr(restore, "CHECK_INTERVAL_S", 0.1)
    monkeypatch.setattr(restore, "SETTLE_MARGIN_MS", 500)


@pytest.fixture
def persistent_redis() -> Iterator[RedisServer]:
    with start_redis_server(append_only=True) as server:
        yield server


class Replicas:
    def __init__(self, gateways: list[PaidGateway], journal: Journal) -> None:
        self.gateways = gateways
        self.journal = journal

    @property
    def store(self) -> Store:
        return self.gateways[0].store

    async def credit(self, wallet: Keypair) -> int:
        return (await credit_of(self.store, wallet)).balance

    async def eventually(self, wallet: Keypair, balance: int, timeout_s: float = 10.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (found := await self.credit(wallet)) != balance:
            assert asyncio.get_running_loop().time() < deadline, f"credit {found}, expected {balance}"
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def replicas(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer],
    persistent_redis: RedisServer,
    postgres_url: str,
    quick_checks: None,
) -> AsyncIterator[Replicas]:
    chain, rpc = chain_rpc
    ledger_url = await create_schema(postgres_url)
    journal = await Journal.open(ledger_url)
    try:
        async with AsyncExitStack() as stack:
            provider = await stack.enter_async_context(started_provider())
            gateways = [
                await stack.enter_async_context(
                    served_credit_gateway(
                        chain, rpc, provider, persistent_redis.url, LEDGER_DATABASE_URL=ledger_url
                    )
                )
                for _ in range(2)
            ]
            yield Replicas(gateways, journal)
    finally:
        await journal.close()


async def _top_up(gateway: PaidGateway, payer: Keypair) -> str:
    client = CreditClient(gateway, gateway.chain)
    reply = await client.top_up(await client.top_up_payment(payer))
    assert reply.status == 200, reply.body
    transaction: str = reply.header_json("payment-response")["transaction"]
    return transaction


async def _spend(gateway: PaidGateway, payer: Keypair, n: int) -> int:
    client = CreditClient(gateway, gateway.chain)
    reply = await client.spend(await client.sign_in(payer), request_id=n)
    return reply.status


async def test_a_flushed_store_gets_back_every_wallets_credit_from_the_ledger(
    replicas: Replicas, persistent_redis: RedisServer
) -> None:
    first, second = replicas.gateways
    alice, bob = (CreditClient(first, first.chain).wallet()[0] for _ in range(2))
    await _top_up(first, alice)
    await _top_up(second, bob)
    await _top_up(second, bob)
    assert [await _spend(first, alice, n) for n in range(2)] == [200, 200]
    alice_owed = TOP_UP_1_CREDIT - 2 * CALL_CREDIT
    await eventually_owed(replicas.journal, str(alice.pubkey()), alice_owed)

    async with aioredis.Redis.from_url(persistent_redis.url) as raw:
        await raw.flushall()

    await replicas.eventually(alice, alice_owed)
    await replicas.eventually(bob, 2 * TOP_UP_1_CREDIT)
    assert await _spend(second, alice, 3) == 200
    assert await replicas.credit(alice) == alice_owed - CALL_CREDIT


async def test_a_top_up_replayed_after_a_flush_is_not_credited_again(
    replicas: Replicas, persistent_redis: RedisServer
) -> None:
    gateway = replicas.gateways[0]
    client = CreditClient(gateway, gateway.chain)
    payer, _ = client.wallet()
    payment = await client.top_up_payment(payer)
    assert (await client.top_up(payment)).status == 200

    async with aioredis.Redis.from_url(persistent_redis.url) as raw:
        await raw.flushall()
    await replicas.eventually(payer, TOP_UP_1_CREDIT)

    replayed = await client.top_up(payment)

    assert replayed.status == 402, replayed.body
    await asyncio.sleep(0.3)  # a wrong credit would have landed by now
    assert await replicas.credit(payer) == TOP_UP_1_CREDIT
    assert await replicas.journal.owed_to(str(payer.pubkey())) == TOP_UP_1_CREDIT


async def test_a_store_rolled_back_past_a_top_up_gets_its_credit_back(
    replicas: Replicas, persistent_redis: RedisServer
) -> None:
    gateway = replicas.gateways[1]
    client = CreditClient(gateway, gateway.chain)
    payer, _ = client.wallet()
    await _top_up(gateway, payer)
    async with aioredis.Redis.from_url(persistent_redis.url) as raw:
        await raw.config_set("appendonly", "no")  # the append-only file stops here
    await _top_up(gateway, payer)
    assert await replicas.credit(payer) == 2 * TOP_UP_1_CREDIT

    persistent_redis.crash_and_restart()  # back to the file: one top-up, as of the freeze

    await replicas.eventually(payer, 2 * TOP_UP_1_CREDIT)
    assert await replicas.journal.owed_to(str(payer.pubkey())) == 2 * TOP_UP_1_CREDIT


async def test_a_gateway_killed_mid_top_up_is_credited_once_by_the_retry_on_a_replica(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], postgres_url: str
) -> None:
    """A ``serve`` process SIGKILLed while our fee payer waits for its top-up's confirmation: the
    identical retry on another replica reconciles it as soon as the chain confirms (it takes the
    payment's place in flight back), the ledger holds it once, and the store and the ledger agree."""
    chain, rpc = chain_rpc
    ledger_url = await create_schema(postgres_url)
    journal = await Journal.open(ledger_url)
    rpc.confirm_delay_s = 2.0
    try:
        with start_redis_server() as store_server:
            async with started_provider() as provider, paid_processes(
                2,
                chain=chain,
                rpc=rpc,
                upstream=provider,
                facilitator=None,
                env={
                    **credit_env(chain, rpc, provider, store_server.url),
                    "LEDGER_DATABASE_URL": ledger_url,
                },
            ) as running:
                killed, other = running.replicas
                client = CreditClient(killed, chain)
                payer, _ = client.wallet()
                payment = await client.top_up_payment(payer)
                sent_before = len(rpc.sent)
                first = asyncio.create_task(client.top_up(payment))
                await eventually(lambda: len(rpc.sent) == sent_before + 1, what="the top-up's broadcast")
                os.killpg(killed.process.process.pid, signal.SIGKILL)
                await asyncio.to_thread(killed.process.process.wait, 10)
                with pytest.raises(aiohttp.ClientError):
                    await first

                retry = CreditClient(other, chain)
                started = asyncio.get_running_loop().time()
                while (reply := await retry.top_up(payment)).status == 503:
                    assert asyncio.get_running_loop().time() - started < 15, reply.body
                    await asyncio.sleep(0.5)
                waited = asyncio.get_running_loop().time() - started
                again = await retry.top_up(payment)

                store = RedisStore(store_server.url)
                try:
                    balance = (await credit_of(store, payer)).balance
                finally:
                    await store.close()
        wallet = str(payer.pubkey())
        top_ups = [e for e in await journal.movements(wallet) if e.kind is EntryKind.TOP_UP]
        owed = await journal.owed_to(wallet)
    finally:
        rpc.confirm_delay_s = 0.0  # the module's chain: the other tests confirm at once
        await journal.close()

    assert reply.status == 200, reply.body
    assert waited < 10, waited  # the chain's 2 s, not a dead process's place held for minutes
    assert again.status == 200 and again.body == reply.body  # the kept answer, credited nothing more
    assert len(rpc.sent) == sent_before + 1  # broadcast once
    assert len(top_ups) == 1 and top_ups[0].signature == rpc.sent[sent_before]
    assert balance == owed == TOP_UP_1_CREDIT
