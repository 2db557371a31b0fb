"""Attack: clients that never pay try to starve the clients that do.

Each attack is mounted for real against the gateway under hypercorn, behind a trusted proxy
(TRUSTED_PROXIES + X-Forwarded-For), with the default limits unless a test says otherwise:

* an empty wallet's validly signed payment re-sent at full speed, and a fresh throwaway wallet
  per request, from one IP, while a paying client on another IP pays through the reference
  facilitator on LiteSVM: the paying client is never refused, and the flood costs the
  facilitator only the few verifies its IP's refusal budget allows;
* on the asset-data routes (real processes on one Redis): a lone wallet uses the whole key, and
  throwaway wallets from one IP, which took the whole key while alone, keep flooding while three
  other clients on other IPs wait: the flood gets its IP's share at most, the three are served;
* 5 and 10 paid calls at once from one funded wallet under the default limits: all served, each
  paid once;
* a charged request whose client hangs up, retried identically: it gets the answer, nothing is
  settled twice, the balances move once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import msgspec
import pytest
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money, via
from tests.support.cdp_facilitator import ReferenceBackend
from tests.support.gateway_process import serve
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    balance_body,
    encode_body,
    paid_gateways_on_the_store,
    send_and_hang_up,
    settled_once,
)
from tests.support.paid_processes import start_all
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import ASSET_API_KEY, Upstream, static

redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()

FLOODER, HONEST = "203.0.113.7", "198.51.100.20"
REFUSED_PER_MINUTE = 10  # the default refusal budget of an IP and of a payer
FLOOD_WORKERS = 16
FLOOD_SECONDS = 1.5
FLOOD_AT_LEAST = 101
"""Requests a flood sends however long they take: a loaded machine sends fewer in its seconds."""


async def _reference_gateway(
    start_paid_gateway: StartPaidGateway, chain: UsdcChain, rpc: LiteSvmRpcServer
) -> PaidGateway:
    """Real verify and settle (the reference facilitator on LiteSVM), default limits."""
    paid = await start_paid_gateway(
        backend=ReferenceBackend(chain.fee_payer, rpc.url), env={"TRUSTED_PROXIES": "127.0.0.1"}
    )
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    return paid


async def _pay_from(paid: PaidGateway, ip: str, payment: PaymentPayload, request_id: int = 1) -> Reply:
    headers = {"payment-signature": encode_header(payment), **via(ip)}
    return await paid.post(GET_BALANCE, balance_body(request_id=request_id), headers)


async def _flood(send: Callable[[], Awaitable[Reply]]) -> list[Reply]:
    """``FLOOD_WORKERS`` clients sending back to back for ``FLOOD_SECONDS`` and at least
    ``FLOOD_AT_LEAST`` requests (bounded)."""
    deadline = time.monotonic() + FLOOD_SECONDS
    replies: list[Reply] = []

    async def worker() -> None:
        while (time.monotonic() < deadline or len(replies) < FLOOD_AT_LEAST) and len(replies) < 5_000:
            replies.append(await send())

    await asyncio.gather(*(worker() for _ in range(FLOOD_WORKERS)))
    return replies


async def _honest_calls_during(
    paid: PaidGateway, flood: Awaitable[list[Reply]]
) -> tuple[list[Reply], list[Reply]]:
    """The paying client's calls, one after another, for as long as the flood lasts."""
    requirements, resource = await paid.requirements()
    blockhash = paid.chain.blockhash  # read once: the chain is busy in the RPC server's thread
    flooding = asyncio.ensure_future(flood)
    honest: list[Reply] = []
    while not flooding.done():
        payment = paid.sign(requirements, resource, blockhash=blockhash)
        honest.append(await _pay_from(paid, HONEST, payment, len(honest)))
    return honest, await flooding


def _statuses(replies: list[Reply]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for reply in replies:
        counts[reply.status] = counts.get(reply.status, 0) + 1
    return counts


async def test_an_empty_wallets_payment_resent_at_full_speed_never_starves_a_paying_client(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _reference_gateway(start_paid_gateway, usdc_chain, solana_rpc_server)
    requirements, resource = await paid.requirements()
    empty = paid.sign(requirements, resource, payer=Keypair())  # validly signed, no USDC behind it
    before = Money.of(paid.chain)

    honest, flood = await _honest_calls_during(paid, _flood(lambda: _pay_from(paid, FLOODER, empty)))

    assert len(flood) >= FLOOD_AT_LEAST and set(_statuses(flood)) <= {402, 429}
    assert all(str(MARKER) not in r.body.decode() for r in flood)
    assert honest and all(r.status == 200 for r in honest), _statuses(honest)
    for reply in honest:
        assert_answered(reply)
    # Only the flooder's refusal budget reached the facilitator (each refusal ends its claim, so
    # one copy at a time could be verified); everything else was refused before it cost a verify.
    assert paid.verify_calls() - len(honest) <= REFUSED_PER_MINUTE + 1
    spent = Money.of(paid.chain).minus(before)
    n = len(honest)
    price = GET_BALANCE_PROVIDER_PRICE
    assert spent == Money(-n * price, n * price, -n * ONE_SETTLEMENT_FEE)


async def test_a_fresh_throwaway_wallet_per_request_never_starves_a_paying_client(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _reference_gateway(start_paid_gateway, usdc_chain, solana_rpc_server)
    requirements, resource = await paid.requirements()
    blockhash = paid.chain.blockhash
    before = Money.of(paid.chain)

    async def throwaway() -> Reply:
        payment = paid.sign(requirements, resource, payer=Keypair(), blockhash=blockhash)
        return await _pay_from(paid, FLOODER, payment)

    honest, flood = await _honest_calls_during(paid, _flood(throwaway))

    statuses = _statuses(flood)
    assert len(flood) >= FLOOD_AT_LEAST and set(statuses) <= {402, 429}
    assert honest and all(r.status == 200 for r in honest), _statuses(honest)
    # The IP's refusal budget, plus the flood's own concurrency once (a burst that slipped past
    # the guard before the first refusals were charged; each of those is owed as debt).
    flood_verifies = paid.verify_calls() - len(honest)
    assert flood_verifies <= REFUSED_PER_MINUTE + FLOOD_WORKERS
    assert statuses[429] >= len(flood) - flood_verifies - 1
    n = len(honest)
    assert Money.of(paid.chain).minus(before) == Money(
        -n * GET_BALANCE_PROVIDER_PRICE, n * GET_BALANCE_PROVIDER_PRICE, -n * ONE_SETTLEMENT_FEE
    )


@pytest.mark.parametrize("at_once", [5, 10])
@pytest.mark.parametrize("settler", ["reference facilitator", "our own fee payer"])
async def test_calls_at_once_from_one_funded_wallet_are_all_served_under_default_limits(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    at_once: int,
    settler: str,
) -> None:
    """Through our own fee payer the wallet is a stranger (no record): it settles one at a time
    at first and more as its record grows, each waiting its turn; none is refused."""
    if settler == "our own fee payer":
        paid = await start_paid_gateway(internal=True, env={"TRUSTED_PROXIES": "127.0.0.1"})
        paid.upstream.responder = static(200, PROVIDER_ANSWER)
    else:
        paid = await _reference_gateway(start_paid_gateway, usdc_chain, solana_rpc_server)
    requirements, resource = await paid.requirements()
    payments = [paid.sign(requirements, resource) for _ in range(at_once)]
    before = Money.of(paid.chain)

    replies = await asyncio.gather(*(_pay_from(paid, HONEST, p, n) for n, p in enumerate(payments)))

    for reply in replies:
        assert_answered(reply)
    price = int(requirements.amount)
    assert len(solana_rpc_server.sent) == paid.upstream_calls == at_once
    assert Money.of(paid.chain).minus(before) == Money(
        -at_once * price, at_once * price, -at_once * ONE_SETTLEMENT_FEE
    )


async def test_a_charged_client_that_hung_up_gets_its_answer_when_it_retries_identically(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _reference_gateway(start_paid_gateway, usdc_chain, solana_rpc_server)
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.2)
    payment = await paid.payment()  # no payment identifier, as most clients in the field
    before = Money.of(paid.chain)
    header = {"payment-signature": encode_header(payment)}
    await send_and_hang_up(paid.url, GET_BALANCE, encode_body(balance_body()), header)
    await settled_once(paid, "solana.mainnet.provider_a.rpc.getBalance")

    retry = await paid.pay(GET_BALANCE, balance_body(), payment)
    other = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)

    assert_answered(retry)
    assert other.status == 402 and other.json()["error"] == "payment_already_used"
    assert paid.settle_calls() == paid.upstream_calls == 1
    assert len(solana_rpc_server.sent) == 1
    once = Money(-GET_BALANCE_PROVIDER_PRICE, GET_BALANCE_PROVIDER_PRICE, -ONE_SETTLEMENT_FEE)
    assert Money.of(paid.chain).minus(before) == once


# --- sign-in: the asset-data key's budget, on real processes sharing one Redis ------------------

TOKENS_PATH = "/v1/x402/tokens/health"
BASE_URL = "http://gateway.shares.test"
"""GATEWAY_BASE_URL of both replicas: the address clients sign for."""
KEY_PER_MINUTE = 30  # the asset-data key's default budget
TOKENS_SHARE = 8  # ceil(30 per minute x 25%): the default share of one wallet and of one IP
OTHER_IPS = [f"198.51.100.{n}" for n in range(1, 4)]
SIGN_IN_FLOOD_PAUSE_S = 0.05
"""Between one flooder's sign-ins: four flooders still send some 50 a second, a hundred times
the key's refill (one every 2 s), for the seconds the others wait; at full speed they only
burned CPU on both sides (some 13 s a run per store) to the same refusals."""


@dataclass
class SignIns:
    """Gateway processes behind one load balancer's address, and the asset-data API they call."""

    urls: list[str]
    asset_api: Upstream
    session: aiohttp.ClientSession

    async def sign_in(self, ip: str, wallet: Keypair | None = None, via_replica: int = 0) -> Reply:
        """A wallet's whole sign-in from ``ip`` (a fresh wallet unless given): the challenge,
        then the signed request, both through replica ``via_replica``."""
        url = self.urls[via_replica % len(self.urls)] + TOKENS_PATH
        async with self.session.get(url, headers=via(ip)) as resp:
            challenge = msgspec.json.decode(await resp.read())
        extension = challenge["extensions"]["sign-in-with-x"]
        signed = sign_in(extension, wallet or Keypair(), request_url=BASE_URL + TOKENS_PATH)
        async with self.session.get(url, headers={**via(ip), "sign-in-with-x": signed}) as resp:
            return Reply(resp.status, resp.headers, await resp.read())


@asynccontextmanager
async def _sign_in_replicas(
    redis_url: str, asset_api: Upstream, per_minute: int, replicas: int = 2
) -> AsyncIterator[SignIns]:
    """``x402-gateway serve`` ``replicas`` times on one Redis, the asset-data routes only."""
    env = {
        "STATE_STORE_REST_URL": redis_url,
        "GATEWAY_BASE_URL": BASE_URL,
        "ASSET_API_BASE_URL": asset_api.url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": "fair-shares-siwx-secret-0123456789abcdef",
        "TRUSTED_PROXIES": "127.0.0.1/32",
        "ROUTE_GROUPS": "tokens",
        "RATE_LIMIT_TOKENS_PER_MINUTE": str(per_minute),
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        with contextlib.ExitStack() as stack:
            processes = await start_all([serve(env) for _ in range(replicas)], stack)
            yield SignIns([process.url for process in processes], asset_api, session)


@pytest.mark.slow
async def test_a_lone_wallet_may_use_the_whole_key_not_only_its_share(
    clean_redis_url: str, asset_api: Upstream
) -> None:
    """Found: a lone wallet got 8 of the key's 30 a minute, the ninth sign-in refused with
    ``tokens:wallet`` though nobody else used the key. At 12 a minute (share 25%: 3), a lone
    wallet from one IP now gets all 12, through either replica, and only then the key's 429."""
    wallet = Keypair()
    async with _sign_in_replicas(clean_redis_url, asset_api, per_minute=12) as gateway:
        replies = [await gateway.sign_in(HONEST, wallet, via_replica=n) for n in range(13)]

    for reply in replies[:12]:
        assert reply.status == 200, reply.body
    refused = replies[12]
    error = refused.json()["error"]
    assert refused.status == 429 and error["code"] == "rate_limited"
    assert error["details"] == {"scope": "tokens:upstream-key", "limit": 12, "periodSeconds": 60.0}
    assert 1 <= int(refused.headers["Retry-After"]) <= 5  # the key's next slot: one every 5 s
    assert len(asset_api.calls) == 12


@pytest.mark.slow
async def test_throwaway_wallets_from_one_ip_cannot_starve_three_other_clients(
    clean_redis_url: str, asset_api: Upstream
) -> None:
    """One IP, a fresh wallet per sign-in, alone at first: it may take the whole key (30). Then
    it keeps flooding (a hundred times the key's refill) through both replicas while three
    clients on IPs of their own sign in, each trying again after the ``Retry-After`` it was
    given. The first of them refused binds the shares: the flood gets at most its IP's share
    while they wait, and each of the three is served at one of the key's next slots."""
    async with _sign_in_replicas(clean_redis_url, asset_api, per_minute=KEY_PER_MINUTE) as gateway:
        alone = [await gateway.sign_in(FLOODER, via_replica=n) for n in range(KEY_PER_MINUTE + 1)]
        assert [r.status for r in alone] == [200] * KEY_PER_MINUTE + [429]
        flooding = True
        flood: list[Reply] = []

        async def flooder(replica: int) -> None:
            while flooding:
                flood.append(await gateway.sign_in(FLOODER, via_replica=replica))
                await asyncio.sleep(SIGN_IN_FLOOD_PAUSE_S)

        async def other(n: int, ip: str) -> list[Reply]:
            wallet, replies = Keypair(), list[Reply]()
            while not replies or replies[-1].status != 200:
                replies.append(await gateway.sign_in(ip, wallet, via_replica=n))
                if replies[-1].status == 429:
                    await asyncio.sleep(int(replies[-1].headers["Retry-After"]))
            return replies

        flooders = [asyncio.ensure_future(flooder(n)) for n in range(4)]
        started = time.monotonic()
        try:
            others = await asyncio.wait_for(
                asyncio.gather(*(other(n, ip) for n, ip in enumerate(OTHER_IPS))), timeout=30
            )
        finally:
            flooding = False
            await asyncio.gather(*flooders)
        waited = time.monotonic() - started

    for replies in others:  # each served, after a few refusals by the key at most
        assert replies[-1].status == 200, replies[-1].body
        assert all(r.json()["error"]["details"]["scope"] == "tokens:upstream-key" for r in replies[:-1])
    assert waited < 15  # three of the key's slots (2 s each), Retry-After's rounding and a busy machine
    served = [r for r in flood if r.status == 200]
    assert len(flood) > 20 and len(served) <= TOKENS_SHARE
    refused = {r.json()["error"]["details"]["scope"] for r in flood if r.status != 200}
    assert refused <= {"tokens:ip", "tokens:upstream-key", "challenge:ip"}  # refusals count as challenges
    assert "tokens:ip" in refused  # the flood met its IP's share
    assert len(asset_api.calls) == KEY_PER_MINUTE + len(served) + len(OTHER_IPS)
