"""Finding: the credit balance (``GET /v1/x402/credits``, sign-in only) was an unbounded free path:
throwaway-wallet sign-ins from one IP were all answered, no 429, each leaving a used nonce in the
store for the nonce's lifetime (about 223,000 keys at steady state).

Every sign-in-only route now declares a per-IP and a per-wallet limit (routes.yaml; the loader
refuses one without), the IP's bucket charged first. The whole gateway is served (hypercorn on
loopback) with credit on, over a real Redis of the test's own (flushed: single-node, then a
3-master Redis Cluster), at a low per-IP limit:

* a flood of throwaway-wallet sign-ins from one IP: exactly the per-IP limit answered, every
  other one 429 ``credits:ip`` with ``Retry-After``, and the store keeps a nonce and a wallet
  bucket for the answered ones alone: within the stated bound (per IP, at most
  ``limit x (1 + nonce lifetime / period)`` nonces);
* one wallet signing in from many IPs: 429 ``credits:wallet`` past its own limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.store import keys
from gateway.x402.siwx import DEFAULT_CLOCK_SKEW_S, DEFAULT_LIFETIME_S
from tests.support.adversarial_credit import BALANCES, credit_env, started_provider
from tests.support.adversarial_paid import via
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.paid_fixtures import Reply
from tests.support.redis_cluster import raw_client
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

redis_url = on_redis_and_cluster()

PER_IP = 20
PER_WALLET = 5
FLOOD = 100
NONCE_TTL_S = DEFAULT_LIFETIME_S + 2 * DEFAULT_CLOCK_SKEW_S
"""The longest a used nonce is kept: its lifetime, plus the clock skew allowed on either side."""
NONCE_BOUND_PER_IP = PER_IP * (1 + NONCE_TTL_S // 60)
"""The stated bound: a bucket admits its limit at once, then its limit a minute, for as long as
the first nonce lives."""


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], clean_redis_url: str
) -> AsyncIterator[RunningGateway]:
    chain, rpc = chain_rpc
    async with started_provider() as provider:
        env = credit_env(
            chain,
            rpc,
            provider,
            clean_redis_url,
            TRUSTED_PROXIES="127.0.0.1",
            RATE_LIMIT_SIGN_IN_IP_PER_MINUTE=str(PER_IP),
            RATE_LIMIT_SIGN_IN_WALLET_PER_MINUTE=str(PER_WALLET),
        )
        async with run_gateway(env) as running:
            yield running


async def balance(http: aiohttp.ClientSession, url: str, wallet: Keypair, ip: str) -> Reply:
    """A sign-in by ``wallet`` from ``ip`` on the balance route, over a fresh 402 of its own."""
    async with http.get(url + BALANCES, headers=via(ip)) as asked:
        assert asked.status == 402
        required: dict[str, Any] = await asked.json()
    header = sign_in(required["extensions"]["sign-in-with-x"], wallet)
    async with http.get(url + BALANCES, headers={"sign-in-with-x": header, **via(ip)}) as reply:
        return Reply(reply.status, reply.headers, await reply.read())


async def store_keys(redis_url: str, pattern: str) -> int:
    client = raw_client(redis_url)  # a cluster's client scans every node
    try:
        return len([key async for key in client.scan_iter(match=pattern, count=1000)])
    finally:
        await client.aclose()


def assert_limited(reply: Reply, scope: str) -> None:
    assert reply.status == 429, reply.body
    assert reply.error_code == "rate_limited"
    assert reply.json()["error"]["details"]["scope"] == scope
    assert int(reply.headers["retry-after"]) >= 1


async def test_a_flood_of_throwaway_wallet_sign_ins_from_one_ip_is_429d_at_the_limit(
    gateway: RunningGateway, clean_redis_url: str
) -> None:
    async with aiohttp.ClientSession() as http:
        flood = [await balance(http, gateway.url, Keypair(), "198.51.100.7") for _ in range(FLOOD)]
        other_ip = await balance(http, gateway.url, Keypair(), "198.51.100.8")

    assert [r.status for r in flood] == [200] * PER_IP + [429] * (FLOOD - PER_IP)
    assert all(r.json()["result"]["balanceMicroUsdc"] == "0" for r in flood[:PER_IP])
    for reply in flood[PER_IP:]:
        assert_limited(reply, "credits:ip")
    assert other_ip.status == 200, other_ip.body  # the limit is the flooding IP's own

    nonces = await store_keys(clean_redis_url, keys.sign_in_nonce("*", "*"))
    wallets = await store_keys(clean_redis_url, keys.rate_bucket("credits:wallet", keys.wallet_tag("*")))
    ips = await store_keys(clean_redis_url, keys.rate_bucket("credits:ip", keys.ip_tag("*")))
    assert (nonces, wallets, ips) == (PER_IP + 1, PER_IP + 1, 2)  # refused sign-ins write nothing
    assert nonces - 1 <= NONCE_BOUND_PER_IP == 140


async def test_one_wallet_signing_in_from_many_ips_is_429d_at_its_own_limit(gateway: RunningGateway) -> None:
    wallet = Keypair()
    async with aiohttp.ClientSession() as http:
        replies = [await balance(http, gateway.url, wallet, f"203.0.113.{i}") for i in range(PER_WALLET + 2)]

    assert [r.status for r in replies] == [200] * PER_WALLET + [429] * 2
    for reply in replies[PER_WALLET:]:
        assert_limited(reply, "credits:wallet")
