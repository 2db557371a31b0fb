"""Attack: spend more through a credit session than its wallet signed, after it was revoked, at
another gateway, or with someone else's credit.

Real ``x402-gateway serve`` processes on one real Redis (single-node, then a 3-master Redis
Cluster; two replicas of one public address, and for one test a third gateway of another address
on the same Redis); the provider is a recording loopback server in the test process. Credit is
put in the store as a top-up's delivery does, so each balance is exact; every limit that is not
credit's own is lifted.

* a session opened on one replica is honoured by the other (the session lives in the store);
* 50 calls at once on one session, across both replicas, spend exactly what its cap allows;
* a revoked session is refused with ``credit_session_unknown`` on every replica;
* a call whose provider fails takes nothing and gives its share of the cap back;
* a token of another origin, or altered to name another wallet, spends nothing of anyone's;
* the store keeps the session under a digest, never the token, and forgets it with its lifetime.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.store import Store, keys
from tests.support.adversarial_credit import CALL_CREDIT, credit_env, credit_of, fund, hold_fields
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    PROVIDER_ANSWER,
    Reply,
    assert_challenge,
    balance_body,
)
from tests.support.paid_processes import PaidProcesses, Replica, paid_processes
from tests.support.redis_cluster import raw_client
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = [
    # The whole module: its replicas start once per store only while its tests stay together, and
    # a slow test of its own would be dealt out ahead of the rest.
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]
redis_url = on_redis_and_cluster()

BASE_URL = "http://gateway.sessions.test"
"""GATEWAY_BASE_URL of both replicas: the public address a session is bound to."""
OTHER_URL = "http://other-gateway.sessions.test"
SESSIONS = "/v1/x402/credits/sessions"


@pytest.fixture(scope="module")
def replica_env(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str
) -> dict[str, str]:
    chain, rpc = chain_rpc
    return credit_env(chain, rpc, provider, redis_url, GATEWAY_BASE_URL=BASE_URL)


async def open_session(replica: Replica, wallet: Keypair, cap: int, ttl_s: int | None = None) -> Reply:
    """Sign in to ``replica``'s session route for ``cap`` (and ``ttl_s``), as a client does."""
    path = f"{SESSIONS}?capMicroUsdc={cap}" + ("" if ttl_s is None else f"&ttlSeconds={ttl_s}")
    challenge = await replica.post(path)
    assert challenge.status == 402, challenge.body
    header = sign_in(challenge.header_json("payment-required")["extensions"]["sign-in-with-x"], wallet)
    return await replica.post(path, None, {"sign-in-with-x": header})


async def token_of(replica: Replica, wallet: Keypair, cap: int) -> str:
    opened = await open_session(replica, wallet, cap)
    assert opened.status == 200, opened.body
    token: str = opened.json()["result"]["token"]
    return token


async def spend(replica: Replica, token: str, request_id: int = 1) -> Reply:
    return await replica.post(GET_BALANCE, balance_body(request_id=request_id), {"x-credit-session": token})


async def revoke(replica: Replica, token: str) -> Reply:
    async with replica.http.delete(replica.url + SESSIONS, headers={"x-credit-session": token}) as resp:
        return Reply(resp.status, resp.headers, await resp.read())


def assert_spent(reply: Reply, left: int) -> None:
    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert reply.headers["x-credit-balance"] == str(left)
    assert "payment-response" not in reply.headers


async def test_a_session_opened_on_one_replica_spends_on_both(
    replicas: PaidProcesses, answering: Upstream, store: Store
) -> None:
    first, second = replicas.replicas
    wallet = Keypair()
    await fund(store, wallet, 100)

    opened = await open_session(first, wallet, 12, 600)
    token = opened.json()["result"]["token"]
    calls = [await spend(second, token), await spend(first, token), await spend(second, token)]

    assert opened.status == 200 and opened.headers["cache-control"] == "no-store"
    result = opened.json()["result"]
    assert (result["wallet"], result["capMicroUsdc"]) == (str(wallet.pubkey()), "12")
    assert_spent(calls[0], 95)
    assert_spent(calls[1], 90)
    assert_challenge(calls[2], "credit_session_cap_reached", GET_BALANCE_PRICE_INTERNAL)
    assert len(answering.calls) == 2
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (90, 0)


async def test_50_calls_at_once_on_one_session_spend_exactly_its_cap(
    replicas: PaidProcesses, answering: Upstream, store: Store
) -> None:
    wallet = Keypair()
    await fund(store, wallet, 1_000)
    token = await token_of(replicas.replicas[0], wallet, 47)  # 9 calls of 5, and 2 left over

    replies = await asyncio.gather(*(spend(replicas.replicas[n % 2], token, request_id=n) for n in range(50)))

    served = [r for r in replies if r.status == 200]
    assert len(served) == 47 // CALL_CREDIT == 9
    assert sorted(int(r.headers["x-credit-balance"]) for r in served) == list(range(955, 1_000, 5))
    for reply in replies:
        if reply.status != 200:
            assert_challenge(reply, "credit_session_cap_reached", GET_BALANCE_PRICE_INTERNAL)
    assert len(answering.calls) == 9
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (955, 0)
    revoked = await revoke(replicas.replicas[1], token)
    assert revoked.status == 200 and revoked.json()["result"]["spentMicroUsdc"] == "45"


async def test_a_revoked_session_is_refused_on_every_replica(
    replicas: PaidProcesses, answering: Upstream, store: Store
) -> None:
    first, second = replicas.replicas
    wallet = Keypair()
    await fund(store, wallet, 100)
    token = await token_of(first, wallet, 50)
    assert_spent(await spend(first, token), 95)

    revoked = await revoke(second, token)
    after = [await spend(first, token), await spend(second, token)]
    again = await revoke(first, token)

    assert revoked.status == 200
    assert revoked.json() == {
        "ok": True,
        "provider": "credits",
        "surface": "credits",
        "method": "revokeSession",
        "result": {"wallet": str(wallet.pubkey()), "capMicroUsdc": "50", "spentMicroUsdc": "5"},
    }
    for reply in after:
        assert_challenge(reply, "credit_session_unknown", GET_BALANCE_PRICE_INTERNAL)
        assert "sign-in-with-x" in reply.header_json("payment-required")["extensions"]
    assert again.status == 404 and again.error_code == "not_found"
    assert len(answering.calls) == 1
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (95, 0)


async def test_a_call_whose_provider_fails_takes_nothing_and_gives_the_cap_back(
    replicas: PaidProcesses, answering: Upstream, store: Store, redis_url: str
) -> None:
    first, second = replicas.replicas
    wallet = Keypair()
    await fund(store, wallet, 100)
    token = await token_of(first, wallet, CALL_CREDIT)  # a cap of exactly one call
    answering.responder = static(500, {"error": "provider down"})

    failed = await spend(second, token)
    answering.responder = static(200, PROVIDER_ANSWER)
    served = await spend(first, token)
    capped = await spend(second, token)

    assert failed.status == 502 and "x-credit-balance" not in failed.headers
    assert_spent(served, 95)
    assert_challenge(capped, "credit_session_cap_reached", GET_BALANCE_PRICE_INTERNAL)
    assert len(answering.calls) == 2
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (95, 0)
    assert (await hold_fields(redis_url, wallet))[0] == []
    revoked = await revoke(first, token)
    assert revoked.json()["result"]["spentMicroUsdc"] == str(CALL_CREDIT)


async def test_a_token_of_another_origin_or_altered_spends_nothing_of_anyones(
    replicas: PaidProcesses, replica_env: dict[str, str], answering: Upstream, store: Store
) -> None:
    first, second = replicas.replicas
    alice, bob = Keypair(), Keypair()
    await fund(store, alice, 100)
    await fund(store, bob, 100)
    async with paid_processes(
        1,
        chain=replicas.chain,
        rpc=replicas.rpc,
        upstream=replicas.upstream,
        facilitator=None,
        env={**replica_env, "GATEWAY_BASE_URL": OTHER_URL},
    ) as other:
        foreign = await token_of(other.replicas[0], alice, 50)
        served_there = await spend(other.replicas[0], foreign)
    token = await token_of(first, alice, 50)
    prefix, _, secret = token.split(".")
    altered = [
        foreign,
        f"{prefix}.{bob.pubkey()}.{secret}",
        f"{prefix}.{alice.pubkey()}.{secret[::-1]}",
        token + "x",
    ]

    replies = [await spend(second, t) for t in altered]

    assert_spent(served_there, 95)  # the other gateway honours its own session
    for reply in replies:
        assert_challenge(reply, "credit_session_unknown", GET_BALANCE_PRICE_INTERNAL)
    assert len(answering.calls) == 1
    assert (await credit_of(store, alice)).balance == 95
    assert (await credit_of(store, bob)).balance == 100


async def test_the_store_keeps_a_digest_for_the_sessions_lifetime_never_the_token(
    replicas: PaidProcesses, store: Store, redis_url: str
) -> None:
    wallet = Keypair()
    opened = await open_session(replicas.replicas[0], wallet, 30, 120)
    token = opened.json()["result"]["token"]

    client = raw_client(redis_url)
    try:
        digest = hashlib.sha256(f"{BASE_URL}\n{token}".encode()).hexdigest()
        key = keys.credit_session(str(wallet.pubkey()), digest)
        stored = await client.hgetall(key)
        ttl_ms = await client.pttl(key)
        found = [k async for k in client.scan_iter(match="*" + token.split(".")[2] + "*")]
    finally:
        await client.aclose()

    assert stored == {"wallet": str(wallet.pubkey()), "cap": "30", "spent": "0"}
    assert 110_000 < ttl_ms <= 120_000
    assert found == []


@pytest.mark.parametrize("query", ["capMicroUsdc=0", "capMicroUsdc=5&ttlSeconds=3601", "ttlSeconds=60"])
async def test_bad_session_terms_are_a_400_in_the_one_error_shape(
    replicas: PaidProcesses, query: str
) -> None:
    reply = await replicas.replicas[0].post(f"{SESSIONS}?{query}")

    assert reply.status == 400 and reply.error_code == "invalid_request"
    assert "payment-required" not in reply.headers
