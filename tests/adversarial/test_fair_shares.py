"""Attack: clients that never pay try to starve the clients that do.

Each attack is mounted for real against the gateway under hypercorn, behind a trusted proxy
(TRUSTED_PROXIES + X-Forwarded-For), with the default limits unless a test says otherwise:

* an empty wallet's validly signed payment re-sent at full speed, and a fresh throwaway wallet
  per request, from one IP, while a paying client on another IP pays through the reference
  facilitator on LiteSVM: the paying client is never refused, and the flood costs the
  facilitator only the few verifies its IP's refusal budget allows;
* 31 and 100 throwaway wallets signing in from one IP on the asset-data routes, while other
  wallets on other IPs are served;
* 5 and 10 paid calls at once from one funded wallet under the default limits: all served, each
  paid once;
* a charged request whose client hangs up, retried identically: it gets the answer, nothing is
  settled twice, the balances move once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.x402.headers import encode_header
from gateway.x402.siwx_signer import sign_in
from gateway.x402.types import PaymentPayload
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money, via
from tests.support.cdp_facilitator import ReferenceBackend
from tests.support.gateway_server import RunningGateway, run_gateway
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
    send_and_hang_up,
    settled_once,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import ASSET_API_KEY, Upstream, static

FLOODER, HONEST = "203.0.113.7", "198.51.100.20"
REFUSED_PER_MINUTE = 10  # the default refusal budget of an IP and of a payer
FLOOD_WORKERS = 16
FLOOD_SECONDS = 1.5


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
    """``FLOOD_WORKERS`` clients sending back to back for ``FLOOD_SECONDS`` (bounded)."""
    deadline = time.monotonic() + FLOOD_SECONDS
    replies: list[Reply] = []

    async def worker() -> None:
        while time.monotonic() < deadline and len(replies) < 5_000:
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

    assert len(flood) > 100 and set(_statuses(flood)) <= {402, 429}
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
    assert len(flood) > 100 and set(statuses) <= {402, 429}
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


# --- sign-in: the asset-data key's budget --------------------------------------------------------

TOKENS_PATH = "/v1/x402/tokens/health"
TOKENS_SHARE = 8  # ceil(30 per minute x 25%): the default share of one wallet and of one IP


@pytest_asyncio.fixture(loop_scope="session")
async def signing_gateway(asset_api: Upstream) -> AsyncIterator[RunningGateway]:
    """The asset-data routes with the default limits: 30 a minute for the key, 120 challenges."""
    env = {
        "ASSET_API_BASE_URL": asset_api.url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": "fair-shares-siwx-secret-0123456789abcdef",
        "TRUSTED_PROXIES": "127.0.0.1/32",
        "ROUTE_GROUPS": "tokens",
    }
    async with run_gateway(env) as running:
        yield running


async def _sign_in_from(session: aiohttp.ClientSession, gateway: RunningGateway, ip: str) -> tuple[int, Any]:
    """A fresh wallet's whole sign-in from ``ip``: the challenge, then the signed request."""
    url = gateway.url + TOKENS_PATH
    async with session.get(url, headers=via(ip)) as resp:
        challenge = msgspec.json.decode(await resp.read())
    header = sign_in(challenge["extensions"]["sign-in-with-x"], Keypair(), request_url=url)
    async with session.get(url, headers={**via(ip), "sign-in-with-x": header}) as resp:
        return resp.status, msgspec.json.decode(await resp.read())


@pytest.mark.parametrize("throwaways", [31, 100])
async def test_throwaway_wallets_from_one_ip_leave_the_key_to_other_clients(
    signing_gateway: RunningGateway, asset_api: Upstream, throwaways: int
) -> None:
    calls_before = len(asset_api.calls)
    async with aiohttp.ClientSession() as session:
        flood = [await _sign_in_from(session, signing_gateway, FLOODER) for _ in range(throwaways)]
        others = [await _sign_in_from(session, signing_gateway, f"198.51.100.{n}") for n in range(1, 4)]

    served = [status for status, _ in flood if status == 200]
    assert len(served) <= TOKENS_SHARE
    refused = [body for status, body in flood if status != 200]
    assert {body["error"]["details"]["scope"] for body in refused} <= {"tokens:ip", "challenge:ip"}
    for status, body in others:  # three other clients, each on its own IP, all served
        assert status == 200, body
    assert len(asset_api.calls) - calls_before == len(served) + len(others)
