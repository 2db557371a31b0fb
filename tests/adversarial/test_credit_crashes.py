"""Prepaid credit when processes die and stores stall: never taken for a call not answered, never
served unpaid, and spendable on every replica.

Real ``x402-gateway serve`` processes on one real Redis, settling top-ups with their own fee
payer on a LiteSVM chain; the provider is a recording loopback server in the test process.

* credit bought on one replica is spent on another, with sign-ins issued by either;
* a gateway process SIGKILLed while a call on credit waits for its provider: nothing is taken,
  and the hold it left lapses by itself within the upstream timeout plus 30 s (its TTL is read
  in Redis rather than waited out);
* the store stopped (SIGSTOP) before the hold or while the provider answers: 503, nothing
  served, nothing taken.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.store import Store
from gateway.store.redis import RedisStore
from tests.support.adversarial_credit import (
    BALANCES,
    CALL_CREDIT,
    ONE_TOP_UP,
    TOP_UP_1_CREDIT,
    CreditClient,
    credit_env,
    credit_of,
    fund,
    hold_fields,
    served_credit_gateway,
)
from tests.support.adversarial_paid import Money
from tests.support.paid_fixtures import MARKER, PROVIDER_ANSWER, PaidGateway
from tests.support.paid_processes import PaidProcesses, eventually, paid_processes
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.redis_server import RedisServer
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")
redis_url = on_redis_and_cluster()

BASE_URL = "http://gateway.credit.test"
"""GATEWAY_BASE_URL of every replica: the public address clients sign for, not a replica's own."""
UPSTREAM_TIMEOUT_S = 2
HOLD_TTL_MS = UPSTREAM_TIMEOUT_S * 1000 + 30_000
"""How long a hold lives: the upstream timeout plus the credit book's margin."""


@pytest.fixture(scope="module")
def replica_env(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str
) -> dict[str, str]:
    """What every replica is started with: one Redis, one public address, one sign-in secret."""
    chain, rpc = chain_rpc
    return credit_env(
        chain,
        rpc,
        provider,
        redis_url,
        GATEWAY_BASE_URL=BASE_URL,
        UPSTREAM_TIMEOUT_SECONDS=str(UPSTREAM_TIMEOUT_S),
    )


async def test_credit_bought_on_one_replica_is_spent_on_the_other(
    replicas: PaidProcesses, answering: Upstream, store: Store
) -> None:
    seller, other = replicas.replicas
    at_seller, at_other = CreditClient(seller, replicas.chain), CreditClient(other, replicas.chain)
    wallet, account = at_seller.wallet()
    payment = await at_seller.top_up_payment(wallet)
    before, sent = Money.of(replicas.chain, account), len(replicas.rpc.sent)

    bought = await at_seller.top_up(payment)
    retried = await at_other.top_up(payment)  # the identical retry, on the other replica
    spent = await at_other.spend(await at_other.sign_in(wallet))
    issued_by_seller = await at_seller.sign_in(wallet)
    spent_again = await at_other.spend(issued_by_seller)
    answered_again = await at_seller.spend(issued_by_seller)  # its identical retry, on the seller
    replayed = await at_seller.spend(issued_by_seller, request_id=2)
    asked = (await seller.get(BALANCES)).header_json("payment-required")
    balance = await seller.get(
        BALANCES, {"sign-in-with-x": sign_in(asked["extensions"]["sign-in-with-x"], wallet)}
    )

    assert bought.status == 200, bought.body
    assert (retried.status, retried.body) == (200, bought.body)
    assert (spent.status, spent.headers["x-credit-balance"]) == (200, str(TOP_UP_1_CREDIT - CALL_CREDIT))
    assert spent.json() == PROVIDER_ANSWER
    assert spent_again.status == 200, spent_again.body
    assert spent_again.headers["x-credit-balance"] == str(TOP_UP_1_CREDIT - 2 * CALL_CREDIT)
    assert (answered_again.status, answered_again.body) == (200, spent_again.body)
    assert replayed.status == 402 and replayed.json()["error"] == "siwx_replayed"
    assert balance.status == 200, balance.body
    assert balance.json()["result"]["balanceMicroUsdc"] == str(TOP_UP_1_CREDIT - 2 * CALL_CREDIT)
    assert balance.json()["result"]["heldMicroUsdc"] == "0"
    assert len(answering.calls) == 2
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (TOP_UP_1_CREDIT - 2 * CALL_CREDIT, 0)
    assert len(replicas.rpc.sent) - sent == 1
    assert Money.of(replicas.chain, account).minus(before) == ONE_TOP_UP


async def test_a_gateway_killed_while_its_provider_answers_takes_nothing_and_its_hold_lapses(
    replicas: PaidProcesses, replica_env: dict[str, str], answering: Upstream, store: Store, redis_url: str
) -> None:
    stalled = asyncio.Event()

    async def stall(request: web.Request, body: bytes) -> web.StreamResponse:
        await stalled.wait()
        return web.json_response(PROVIDER_ANSWER)

    chain, rpc = replicas.chain, replicas.rpc
    wallet = Keypair()
    await fund(store, wallet, 2 * CALL_CREDIT)
    survivor = CreditClient(replicas.replicas[0], chain)
    async with paid_processes(
        1, chain=chain, rpc=rpc, upstream=answering, facilitator=None, env=replica_env
    ) as third:
        (killed,) = third.replicas
        doomed = CreditClient(killed, chain)
        header = await doomed.sign_in(wallet)
        answering.responder = stall
        call = asyncio.create_task(doomed.spend(header))
        await eventually(lambda: len(answering.calls) == 1, what="the provider called")
        os.killpg(killed.process.process.pid, signal.SIGKILL)  # between the hold and the answer
        await asyncio.to_thread(killed.process.process.wait, 10)
        with pytest.raises(aiohttp.ClientError):
            await call
        stalled.set()

    credit = await credit_of(store, wallet)
    holds, pttl, now_us = await hold_fields(redis_url, wallet)
    answering.responder = static(200, PROVIDER_ANSWER)
    free = await survivor.spend(await survivor.sign_in(wallet))
    short = await survivor.spend(await survivor.sign_in(wallet))

    assert (credit.balance, credit.held) == (2 * CALL_CREDIT, CALL_CREDIT)  # held, never taken
    (hold,) = holds
    assert hold.amount == CALL_CREDIT
    assert 0 < hold.expires_us - now_us <= HOLD_TTL_MS * 1000  # it lapses by itself, and soon
    assert 0 < pttl <= HOLD_TTL_MS
    assert free.status == 200 and free.headers["x-credit-balance"] == str(CALL_CREDIT)
    assert short.status == 402 and short.json()["error"] == "insufficient_credit"  # the rest is held
    assert len(answering.calls) == 2


# --- the store stalls --------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def on_private_redis(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], answering: Upstream, private_redis: RedisServer
) -> AsyncIterator[PaidGateway]:
    """A served gateway (in-process) on a Redis of the test's own, which the test stops; its store
    gives up on a command after 0.3 s."""
    chain, rpc = chain_rpc
    timeout = str(UPSTREAM_TIMEOUT_S)
    store = RedisStore(private_redis.url, timeout_s=0.3)
    try:
        async with served_credit_gateway(
            chain, rpc, answering, private_redis.url, store=store, UPSTREAM_TIMEOUT_SECONDS=timeout
        ) as gateway:
            yield gateway
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
        await store.close()


@pytest.mark.parametrize(
    "when",
    [
        "before the hold",
        "while the provider answers",  # the take waits out the stall, then lands past its deadline
    ],
)
async def test_a_store_stopped_during_a_call_on_credit_serves_nothing_and_takes_nothing(
    on_private_redis: PaidGateway, private_redis: RedisServer, when: str
) -> None:
    paid = on_private_redis
    client = CreditClient(paid, paid.chain)
    wallet = Keypair()
    reader = RedisStore(private_redis.url)

    async def stop_the_store(request: web.Request, body: bytes) -> web.StreamResponse:
        private_redis.process.send_signal(signal.SIGSTOP)
        return web.json_response(PROVIDER_ANSWER)

    try:
        await fund(reader, wallet, 3 * CALL_CREDIT)
        # One call first, as on any gateway that has served one: the store knows its scripts, so
        # a command that waited out the stall runs when the store resumes (a first call's script
        # would be refused unknown instead).
        warm = await client.spend(await client.sign_in(wallet))
        assert warm.status == 200, warm.body
        paid.upstream.calls.clear()
        header = await client.sign_in(wallet)
        if when == "before the hold":
            private_redis.process.send_signal(signal.SIGSTOP)
        else:
            paid.upstream.responder = stop_the_store
        reply = await client.spend(header)
        private_redis.process.send_signal(signal.SIGCONT)
        await asyncio.sleep(0.2)  # what the stalled server still held runs as soon as it resumes
        credit = await credit_of(reader, wallet)
        holds, _, now_us = await hold_fields(private_redis.url, wallet)
    finally:
        private_redis.process.send_signal(signal.SIGCONT)
        await reader.close()

    assert reply.status == 503, reply.body
    assert reply.json()["error"]["code"] == "store_unavailable"
    assert str(MARKER) not in reply.body.decode() and "x-credit-balance" not in reply.headers
    assert len(paid.upstream.calls) == (0 if when == "before the hold" else 1)
    assert credit.balance == 2 * CALL_CREDIT  # the first call's price, and nothing for this one
    # A hold that reached the store late is left to lapse, within the hold's lifetime.
    assert all(0 < hold.expires_us - now_us <= HOLD_TTL_MS * 1000 for hold in holds)
