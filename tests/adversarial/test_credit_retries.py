"""Finding: a call on credit whose client hung up was charged and could never be answered.

A real ``x402-gateway serve`` process on a real Redis (single-node, then a 3-master Redis
Cluster), credit on, settling exact payments with its own fee payer on a LiteSVM chain; the
provider is a recording loopback server that answers after ``PROVIDER_DELAY_S``. The client
hangs up ``HANG_UP_S`` into the call (its connection closed, as an agent's timeout does), then
retries the identical request with the same credential.

Before: on credit, the 5 micro-USDC were taken and the retry with the same sign-in got 402
``siwx_replayed``, while the same disconnect on an exact payment got the paid answer on retry.
Now both get the answer they paid for:

* on credit, a retry while the call is still in flight hears 409 ``call_in_progress``
  (``Retry-After``); once answered, the identical retry gets the answer from the store; another
  body under the same sign-in is refused ``siwx_replayed``; the credit is taken exactly once and
  the provider called once;
* on an exact payment (the reference), the identical retry gets the paid answer with its
  receipt, settled once on chain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.methods.credit.book import Balance
from gateway.store import Store, keys
from gateway.x402.headers import decode_header, encode_header
from gateway.x402.siwx import DEFAULT_CLOCK_SKEW_S, DEFAULT_LIFETIME_S
from gateway.x402.types import SiwxPayload
from tests.support.adversarial_credit import CALL_CREDIT, CreditClient, credit_env, credit_of, fund
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    PROVIDER_ANSWER,
    balance_body,
    encode_body,
)
from tests.support.paid_processes import PaidProcesses, Replica, paid_processes
from tests.support.redis_cluster import raw_client
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]
redis_url = on_redis_and_cluster()

PROVIDER_DELAY_S = 3.0
HANG_UP_S = 0.5
UPSTREAM_TIMEOUT_S = 10


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str
) -> AsyncIterator[PaidProcesses]:
    chain, rpc = chain_rpc
    env = credit_env(chain, rpc, provider, redis_url, UPSTREAM_TIMEOUT_SECONDS=str(UPSTREAM_TIMEOUT_S))
    async with paid_processes(
        1, chain=chain, rpc=rpc, upstream=provider, facilitator=None, env=env
    ) as running:
        yield running


@pytest.fixture
def slow_provider(provider: Upstream) -> Upstream:
    provider.responder = static(200, PROVIDER_ANSWER, delay=PROVIDER_DELAY_S)
    provider.calls.clear()
    return provider


async def hang_up(replica: Replica, body: Any, headers: Mapping[str, str]) -> None:
    """Send a call and hang up ``HANG_UP_S`` into it, before the provider answered."""
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=HANG_UP_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        with pytest.raises(TimeoutError):
            all_headers = {"content-type": "application/json", **headers}
            await http.post(replica.url + GET_BALANCE, data=encode_body(body), headers=all_headers)
    assert time.monotonic() - started < PROVIDER_DELAY_S  # gone before the answer


async def settled_credit(store: Store, wallet: Keypair, timeout_s: float = 15.0) -> Balance:
    """The wallet's credit once no call of it is in flight any more."""
    deadline = time.monotonic() + timeout_s
    while True:
        credit = await credit_of(store, wallet)
        if credit.held == 0 or time.monotonic() > deadline:
            return credit
        await asyncio.sleep(0.05)


async def kept_for_ms(redis_url: str, wallet: Keypair, header: str) -> int:
    """How long the store keeps the call's record (its answer) from now, in ms."""
    nonce = decode_header(header, SiwxPayload).nonce
    client = raw_client(redis_url)
    try:
        return int(await client.pttl(keys.credit_call(str(wallet.pubkey()), nonce)))
    finally:
        await client.aclose()


async def test_a_call_on_credit_whose_client_hung_up_is_answered_again_and_taken_once(
    gateway: PaidProcesses, slow_provider: Upstream, store: Store, redis_url: str
) -> None:
    (replica,) = gateway.replicas
    client = CreditClient(replica, gateway.chain)
    wallet = Keypair()
    await fund(store, wallet, 3 * CALL_CREDIT)
    header = await client.sign_in(wallet)

    await hang_up(replica, balance_body(), {"sign-in-with-x": header})
    during = await client.spend(header)  # the first call still waits for its provider
    held = await credit_of(store, wallet)
    after_take = await settled_credit(store, wallet)
    retried = await client.spend(header)
    retried_again = await client.spend(header)
    kept_ms = await kept_for_ms(redis_url, wallet, header)
    other_body = await client.spend(header, request_id=2)
    slow_provider.responder = static(200, PROVIDER_ANSWER)
    fresh = await client.spend(await client.sign_in(wallet))
    credit = await credit_of(store, wallet)

    assert during.status == 409, during.body
    assert during.json()["error"]["code"] == "call_in_progress"
    assert during.headers["retry-after"] == "1"
    assert (held.balance, held.held) == (3 * CALL_CREDIT, CALL_CREDIT)  # held, not yet taken
    assert (after_take.balance, after_take.held) == (2 * CALL_CREDIT, 0)  # taken once, client gone
    for again in (retried, retried_again):
        assert again.status == 200, again.body
        assert again.json() == PROVIDER_ANSWER
        assert "x-credit-balance" not in again.headers and "payment-response" not in again.headers
    assert other_body.status == 402 and other_body.json()["error"] == "siwx_replayed"
    # Kept no longer than the sign-in could be presented again (it verifies 5 min, plus skew).
    assert 0 < kept_ms <= (DEFAULT_LIFETIME_S + DEFAULT_CLOCK_SKEW_S) * 1000
    assert fresh.status == 200 and fresh.headers["x-credit-balance"] == str(CALL_CREDIT)
    assert (credit.balance, credit.held) == (CALL_CREDIT, 0)  # two calls, two takes, exactly
    assert len(slow_provider.calls) == 2  # the hung-up call and the fresh one; never the retries


async def test_an_exact_payment_whose_client_hung_up_is_answered_again_and_settled_once(
    gateway: PaidProcesses, slow_provider: Upstream
) -> None:
    """The reference credit now matches: the same disconnect on a payment."""
    (replica,) = gateway.replicas
    payment = await gateway.payment(replica)
    headers = {"payment-signature": encode_header(payment)}
    before, sent = Money.of(gateway.chain), len(gateway.rpc.sent)

    await hang_up(replica, balance_body(), headers)
    retried: Any = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # answered once settled; until then the payment is in use
        retried = await replica.post(GET_BALANCE, balance_body(), headers)
        if retried.status == 200:
            break
        assert retried.status == 402 and retried.json()["error"] == "payment_already_used", retried.body
        await asyncio.sleep(0.2)
    again = await replica.post(GET_BALANCE, balance_body(), headers)

    assert retried is not None and retried.status == 200, retried.body
    assert retried.json() == PROVIDER_ANSWER and retried.headers["payment-response"]
    assert (again.status, again.body) == (200, retried.body)
    assert len(slow_provider.calls) == 1
    assert len(gateway.rpc.sent) - sent == 1
    price = GET_BALANCE_PRICE_INTERNAL
    assert Money.of(gateway.chain).minus(before) == Money(-price, price, -ONE_SETTLEMENT_FEE)
