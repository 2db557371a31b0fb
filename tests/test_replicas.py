"""Scale-out: three gateway processes sharing one real Redis behave as one gateway, on a single
Redis server and on a 3-master Redis Cluster.

Each replica is ``x402-gateway serve`` as an operator runs it, with its own port; all of them
share one Redis, one recording provider, one fake CDP facilitator whose backend is the reference
x402 facilitator settling for real on the LiteSVM chain (so money really moves), one
``SIWX_SECRET`` and one public base URL (the load balancer's), as a deployment behind a load
balancer would.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.store.cluster import CLUSTER_SCHEMES
from gateway.x402.headers import encode_header
from tests.support.cdp_facilitator import CdpFacilitatorServer, ReferenceBackend, make_ed25519_credentials
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    Reply,
    balance_body,
    encode_body,
)
from tests.support.paid_processes import PaidProcesses, Replica, paid_processes
from tests.support.redis_cluster import start_redis_cluster
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.redis_server import start_redis_server
from tests.support.solana_rpc_server import LiteSvmRpcServer, setup_usdc_chain
from tests.support.upstream import ASSET_API_KEY, Upstream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]

redis_url = on_redis_and_cluster()

REPLICAS = 3
BASE_URL = "http://gateway.replicas.test"
"""GATEWAY_BASE_URL of every replica: the public address clients sign for, not a replica's own."""
SIWX_SECRET = "replica-siwx-secret-0123456789abcdef"
CHALLENGE_LIMIT = 120
"""RATE_LIMIT_CHALLENGE_PER_MINUTE."""
SYNC_INTERVAL_S = 0.1
"""RATE_LIMIT_SYNC_SECONDS: how often each replica shares its challenge counts."""
TOKENS_HEALTH = "/v1/x402/tokens/health"
WALLET = Keypair()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(asset_api_server: Upstream, redis_url: str) -> AsyncIterator[PaidProcesses]:
    """One cluster for the module and store (starting three processes is most of these tests'
    cost), with third parties of its own: the session's chain server and Redis serve other tests
    between these, so the cluster must not share them. Its store is of the kind ``redis_url`` is:
    a Redis server, or a 3-master Redis Cluster."""
    start_store = start_redis_cluster if redis_url.startswith(CLUSTER_SCHEMES) else start_redis_server
    with start_store() as redis, LiteSvmRpcServer() as rpc:
        chain = setup_usdc_chain()
        rpc.use(chain.svm)
        upstream = Upstream()
        await upstream.start()
        facilitator = CdpFacilitatorServer(
            backend=ReferenceBackend(chain.fee_payer, rpc.url), credentials=make_ed25519_credentials()
        )
        await facilitator.start()
        env = {
            "STATE_STORE_REST_URL": redis.url,
            "GATEWAY_BASE_URL": BASE_URL,
            "ROUTE_GROUPS": "all",
            "SIWX_SECRET": SIWX_SECRET,
            "ASSET_API_BASE_URL": asset_api_server.url,
            "ASSET_API_KEY": ASSET_API_KEY,
            "RATE_LIMIT_CHALLENGE_PER_MINUTE": str(CHALLENGE_LIMIT),
            "RATE_LIMIT_SYNC_SECONDS": str(SYNC_INTERVAL_S),
            "RATE_LIMIT_WALLET_RPS": "1000",  # one payer pays in every test, a few times a second
        }
        try:
            async with paid_processes(
                REPLICAS, chain=chain, rpc=rpc, upstream=upstream, facilitator=facilitator, env=env
            ) as running:
                yield running
        finally:
            await facilitator.stop()
            facilitator.backend.close()
            await upstream.stop()


@pytest.fixture(autouse=True)
def fresh_records(cluster: PaidProcesses, asset_api: Upstream) -> None:
    """Each test counts only its own calls, and signs transactions no earlier test signed (the
    same payment built on the same blockhash would be the same transaction)."""
    cluster.chain.svm.expire_blockhash()
    cluster.upstream.calls.clear()
    cluster.rpc.sent.clear()
    cluster.facilitator.reset()


# --- exact payments ------------------------------------------------------------------------------


async def test_one_payment_sent_to_three_replicas_at_once_reaches_the_provider_and_settles_once(
    cluster: PaidProcesses,
) -> None:
    for replica in cluster.replicas:  # each has the facilitator's fee payer: nothing delays a replica
        await cluster.requirements(replica)
    payment = await cluster.payment(cluster.replicas[0])
    chain = cluster.chain
    payer_before, pay_to_before = chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)
    assert payer_before is not None and pay_to_before is not None

    replies = await asyncio.gather(
        *(replica.pay(GET_BALANCE, balance_body(), payment) for replica in cluster.replicas)
    )

    assert sorted(reply.status for reply in replies)[0] == 200, [r.body for r in replies]
    paid = next(reply for reply in replies if reply.status == 200)
    assert paid.header_json("payment-response")["transaction"] == cluster.rpc.sent[0]
    refused = [reply for reply in replies if reply is not paid]
    assert len(refused) == 2
    for reply in refused:
        # Refused for good, told to retry while the identical request is still settling, or, once
        # its answer was delivered, given that answer again (it is the identical request's retry):
        # never another answer, never another settlement.
        if reply.status == 200:
            assert reply.body == paid.body
            assert reply.headers["payment-response"] == paid.headers["payment-response"]
            continue
        if reply.status == 402:
            assert reply.json()["error"] == "payment_already_used"
        else:
            assert reply.status == 503 and reply.json()["error"]["code"] == "settlement_pending"
        assert "payment-response" not in reply.headers
    assert cluster.upstream_calls == 1
    # A copy that arrives while the first is settling may ask the facilitator too (it reconciles
    # the same transaction); the chain still sees exactly one broadcast.
    assert 1 <= cluster.settle_calls() <= len(cluster.replicas)
    assert len(cluster.rpc.sent) == 1
    assert chain.balance(chain.payer_ata) == payer_before - GET_BALANCE_PROVIDER_PRICE
    assert chain.balance(chain.pay_to_ata) == pay_to_before + GET_BALANCE_PROVIDER_PRICE


async def test_a_payment_signed_for_one_replica_is_accepted_by_another(cluster: PaidProcesses) -> None:
    first, second, _ = cluster.replicas
    payment = await cluster.payment(first)

    reply = await second.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert reply.header_json("payment-response")["success"] is True
    assert cluster.upstream_calls == cluster.settle_calls() == 1


async def test_a_payment_identifier_retry_on_another_replica_gets_the_stored_response(
    cluster: PaidProcesses,
) -> None:
    first, second, third = cluster.replicas
    payment = await cluster.payment(first, payment_id="replica-retry-0123456789")
    original = await second.pay(GET_BALANCE, balance_body(), payment)
    assert original.status == 200, original.body

    retry = await third.pay(GET_BALANCE, balance_body(), payment)

    assert retry.status == 200, retry.body
    assert retry.body == original.body
    assert retry.headers["payment-response"] == original.headers["payment-response"]
    assert retry.headers["x-payment-response"] == original.headers["payment-response"]
    assert cluster.upstream_calls == cluster.settle_calls() == 1
    assert len(cluster.rpc.sent) == 1


# --- rate limits ---------------------------------------------------------------------------------


async def test_three_replicas_hold_the_per_ip_challenge_limit_within_the_stated_overshoot(
    cluster: PaidProcesses,
) -> None:
    """Unpaid calls to a paid route from one IP, round-robin over the replicas at a steady pace:
    a per-process limit would let all of them through; the shared one admits the limit, plus at
    most what the other replicas admit between two exchanges of counts (the README's bound)."""
    requests, pace_s = 300, 0.01
    # A loopback address of its own: a fresh bucket, whatever the other tests challenged.
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.9", 0))
    statuses: Counter[int] = Counter()
    limited: list[Reply] = []
    async with aiohttp.ClientSession(connector=connector) as http:
        started = time.monotonic()
        for i in range(requests):
            url = cluster.replicas[i % REPLICAS].url + GET_BALANCE
            async with http.post(url, data=encode_body(balance_body())) as resp:
                statuses[resp.status] += 1
                if resp.status == 429:
                    limited.append(Reply(resp.status, resp.headers, await resp.read()))
            await asyncio.sleep(pace_s)
        elapsed = time.monotonic() - started

    per_replica_rate = requests / REPLICAS / elapsed
    lag_s = 2 * SYNC_INTERVAL_S + 0.05  # two sync intervals and a generous store round trip
    overshoot = (REPLICAS - 1) * min(CHALLENGE_LIMIT, math.ceil(per_replica_rate * lag_s))
    sliding = math.ceil(CHALLENGE_LIMIT * elapsed / 60)  # the window slides on while the test runs
    assert set(statuses) <= {402, 429}, statuses
    assert CHALLENGE_LIMIT <= statuses[402] <= CHALLENGE_LIMIT + overshoot + sliding, (statuses, overshoot)
    assert statuses[402] < requests / 2  # far from the 300 that per-process limits would admit
    assert all(reply.error_code == "rate_limited" for reply in limited)
    assert all(int(reply.headers["retry-after"]) >= 1 for reply in limited)
    assert cluster.upstream_calls == cluster.verify_calls() == 0


async def test_402s_answered_with_payments_on_another_replica_are_handed_back_to_the_challenge_limit(
    cluster: PaidProcesses,
) -> None:
    """A paying agent from one IP takes every 402 from one replica and pays each on another at
    once: more paid calls than the challenge limit, no 429. The replica that admits a payment
    never counted a 402 of that IP itself: its hand-back waits for the other's count to arrive
    through the store, then takes it."""
    calls = CHALLENGE_LIMIT + 20
    challenging, admitting, _ = cluster.replicas
    chain = cluster.chain
    requirements, resource = await cluster.requirements(challenging)
    mint = MintInfo(address=str(chain.mint), decimals=chain.decimals)
    payments = [
        encode_header(
            build_payment_payload(
                requirements,
                build_exact_transaction(
                    requirements, chain.payer, mint, chain.blockhash, memo=f"{i}".encode()
                ),
                resource=resource,
            )
        )
        for i in range(calls)
    ]
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.10", 0))
    statuses: Counter[int] = Counter()
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(replica: Replica, headers: dict[str, str]) -> int:
            headers = {"content-type": "application/json", **headers}
            body = encode_body(balance_body())
            async with http.post(replica.url + GET_BALANCE, data=body, headers=headers) as resp:
                await resp.read()
                return resp.status

        for payment in payments:
            statuses[await post(challenging, {})] += 1
            statuses[await post(admitting, {"payment-signature": payment})] += 1
            await asyncio.sleep(0.025)  # under the route's own 50 calls a second

    assert statuses == Counter({402: calls, 200: calls}), statuses
    assert cluster.upstream_calls == calls


# --- sign-in-with-x ------------------------------------------------------------------------------


async def _sign_in(replica: Replica) -> str:
    """A SIGN-IN-WITH-X header answering ``replica``'s challenge for the tokens health route."""
    challenge = await replica.get(TOKENS_HEALTH)
    assert challenge.status == 402, challenge.body
    extension = challenge.json()["extensions"]["sign-in-with-x"]
    return sign_in(extension, WALLET, request_url=BASE_URL + TOKENS_HEALTH)


async def test_a_sign_in_used_on_one_replica_is_refused_as_replayed_on_another(
    cluster: PaidProcesses, asset_api: Upstream
) -> None:
    first, second, third = cluster.replicas
    signed = await _sign_in(first)
    assert (await first.get(TOKENS_HEALTH, {"sign-in-with-x": signed})).status == 200

    replays = [await replica.get(TOKENS_HEALTH, {"sign-in-with-x": signed}) for replica in (second, third)]

    for replay in replays:
        assert replay.status == 402
        assert replay.json()["error"] == "siwx_replayed"
        assert "sign-in-with-x" in replay.json()["extensions"]  # a fresh challenge to sign again
    assert len(asset_api.calls) == 1


async def test_a_sign_in_challenge_from_one_replica_is_accepted_by_another(
    cluster: PaidProcesses, asset_api: Upstream
) -> None:
    _, second, third = cluster.replicas
    signed = await _sign_in(second)

    reply = await third.get(TOKENS_HEALTH, {"sign-in-with-x": signed})

    assert reply.status == 200, reply.body
    assert reply.json()["ok"] is True
    assert len(asset_api.calls) == 1
    assert asset_api.calls[0].headers.get("x-api-key") == ASSET_API_KEY
