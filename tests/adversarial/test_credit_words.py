"""Findings: the text a wallet signed to spend credit said the opposite, and looking for credit
counted as a failed payment.

A real ``x402-gateway serve`` process on a real Redis (single-node, then a 3-master Redis
Cluster), credit on, its provider a recording loopback server.

Before: the sign-in that spent credit read "Sign in to use the asset-data routes of this
gateway. No funds move.", and a wallet without credit that signed in first (as ``pay`` and the
SDK hook do) was counted ``outcome="rejected"``, which feeds the "Failed payments by route" panel.
Now:

* a paid route's sign-in names the route, the most it may take and the gateway; the balance
  route's says no funds move; a sign-in that signed other words (that no funds move) spends
  nothing (``siwx_statement_mismatch``);
* a probe for credit that finds none is ``no_credit`` in ``x402_payments_total`` and ``unpaid`` in
  the shared usage, never ``rejected`` nor ``failed``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.store import Store
from tests.support.adversarial_credit import (
    BALANCES,
    CALL_CREDIT,
    CreditClient,
    credit_env,
    credit_of,
    fund,
)
from tests.support.metrics_text import Series, earnings_series
from tests.support.paid_fixtures import GET_BALANCE, PROVIDER_ANSWER
from tests.support.paid_processes import PaidProcesses, Replica, paid_processes
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]
redis_url = on_redis_and_cluster()

ROUTE = "solana.mainnet.provider_a.rpc.getBalance"
NO_FUNDS_MOVE = "Sign in to read asset data or your prepaid credit at this gateway. No funds move."


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str
) -> AsyncIterator[PaidProcesses]:
    chain, rpc = chain_rpc
    provider.responder = static(200, PROVIDER_ANSWER)
    env = credit_env(chain, rpc, provider, redis_url)
    async with paid_processes(
        1, chain=chain, rpc=rpc, upstream=provider, facilitator=None, env=env
    ) as running:
        yield running


async def scrape(replica: Replica) -> Series:
    reply = await replica.get("/metrics")
    assert reply.status == 200
    return earnings_series(reply.body.decode())


def changed(before: Series, after: Series) -> dict[str, float]:
    """What changed for the getBalance route: ``payments:<outcome>`` and ``usage:<outcome>``."""
    names = {"x402_payments_total": "payments", "x402_usage_total": "usage"}
    found: dict[str, float] = {}
    for key in before.keys() | after.keys():
        metric, route, outcome = key
        value = after.get(key, 0.0) - before.get(key, 0.0)
        if route == ROUTE and value and metric in names:
            found[f"{names[metric]}:{outcome}"] = value
    return found


async def test_the_sign_in_that_spends_credit_names_the_route_and_the_most_it_may_take(
    gateway: PaidProcesses, store: Store
) -> None:
    (replica,) = gateway.replicas
    client = CreditClient(replica, gateway.chain)
    wallet = Keypair()
    await fund(store, wallet, 2 * CALL_CREDIT)
    gateway.upstream.calls.clear()

    paid = (await client.challenge()).header_json("payment-required")["extensions"]["sign-in-with-x"]
    balance_route = (await replica.get(BALANCES)).header_json("payment-required")["extensions"][
        "sign-in-with-x"
    ]
    origin = paid["info"]["uri"].removesuffix(GET_BALANCE)
    signed_other_words = {**paid, "info": {**paid["info"], "statement": NO_FUNDS_MOVE}}
    refused = await client.spend(sign_in(signed_other_words, wallet))
    after_refused = await credit_of(store, wallet)
    spent = await client.spend(await client.sign_in(wallet))

    expected = f"Spend at most 0.000005 USDC of prepaid credit on {ROUTE} ({GET_BALANCE}) at {origin}."
    assert paid["info"]["statement"] == paid["statement"] == expected
    assert balance_route["info"]["statement"] == NO_FUNDS_MOVE
    assert refused.status == 402 and refused.json()["error"] == "siwx_statement_mismatch"
    assert (after_refused.balance, after_refused.held) == (2 * CALL_CREDIT, 0)  # nothing held or taken
    assert spent.status == 200 and spent.headers["x-credit-balance"] == str(CALL_CREDIT)
    assert len(gateway.upstream.calls) == 1


async def test_a_sign_in_that_finds_no_credit_is_counted_no_credit_never_a_failed_payment(
    gateway: PaidProcesses, store: Store
) -> None:
    (replica,) = gateway.replicas
    client = CreditClient(replica, gateway.chain)
    wallet = Keypair()  # no credit at all: the probe pay and the SDK hook make before paying
    before = await scrape(replica)

    probe = await client.spend(await client.sign_in(wallet))
    counted: dict[str, float] = {}
    deadline = time.monotonic() + 10  # the usage reaches the store within a second or two
    while time.monotonic() < deadline:
        counted = changed(before, await scrape(replica))
        if "usage:unpaid" in counted and "payments:no_credit" in counted:
            break
        await asyncio.sleep(0.2)

    assert probe.status == 402 and probe.json()["error"] == "insufficient_credit"
    assert [a["scheme"] for a in probe.header_json("payment-required")["accepts"]] == ["exact"]
    # The challenge fetched to sign in is an unpaid challenge too: two unpaid requests, no failure.
    assert counted == {"payments:challenged": 1, "payments:no_credit": 1, "usage:unpaid": 2}
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (0, 0)
