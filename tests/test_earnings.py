"""Earnings and usage in /metrics, end to end: the real gateway under hypercorn, real signed
Solana payments, the fake CDP facilitator or the internal one settling on LiteSVM, and real
sign-ins with ed25519 keys.

Revenue (``x402_revenue_micro_usdc_total``) grows by the route's price once per settled payment,
never for a refusal, a failure, a pending settlement or a payment-identifier replay; every
payment and sign-in outcome is counted once in ``x402_payments_total`` and in the shared
``x402_usage_total``.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from tests.support.cdp_facilitator import Fault
from tests.support.metrics_text import Series, earnings_series
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    GET_BALANCE_PROVIDER_PRICE,
    PaidGateway,
    StartPaidGateway,
    balance_body,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")

ROUTE = "solana.mainnet.provider_a.rpc.getBalance"
PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 9}, "value": 31337}}
PAYMENT_ID = "earn_0123456789abcdef0123"
TOKENS_HEALTH = "/v1/x402/tokens/health"
TOKENS_ROUTE = "tokens.health"
ASSET_KEY = "asset-api-key-earnings-0123456789"
WALLET = Keypair()

SHORT_NAMES = {
    "x402_payments_total": "payments",
    "x402_usage_total": "usage",
    "x402_revenue_micro_usdc_total": "revenue",
}


async def scrape(gateway: PaidGateway) -> Series:
    reply = await gateway.get("/metrics")
    assert reply.status == 200
    return earnings_series(reply.body.decode())


def delta(before: Series, after: Series, route: str = ROUTE) -> dict[str, float]:
    """What changed for ``route``: ``payments:<outcome>``, ``usage:<outcome>``, ``revenue``."""
    changed: dict[str, float] = {}
    for key in before.keys() | after.keys():
        name, series_route, outcome = key
        value = after.get(key, 0.0) - before.get(key, 0.0)
        if series_route == route and value:
            changed[f"{SHORT_NAMES[name]}:{outcome}" if outcome else SHORT_NAMES[name]] = value
    return changed


def balances(chain: UsdcChain) -> tuple[int, int]:
    payer, pay_to = chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)
    assert payer is not None and pay_to is not None
    return payer, pay_to


# --- paid routes -----------------------------------------------------------------------------------


async def test_a_settled_payment_adds_exactly_the_route_price_to_revenue(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The internal facilitator settles on LiteSVM: revenue moves as payTo's USDC does."""
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()  # one challenge
    payer_before, pay_to_before = balances(usdc_chain)
    before = await scrape(paid)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert solana_rpc_server.sent == [reply.header_json("payment-response")["transaction"]]
    price = GET_BALANCE_PRICE_INTERNAL  # the provider part and routes.yaml's settlement fee
    assert balances(usdc_chain) == (payer_before - price, pay_to_before + price)
    assert delta(before, await scrape(paid)) == {
        "revenue": price,
        "payments:paid": 1,
        "usage:paid": 1,
    }
    assert paid.upstream_calls == 1


async def test_a_settlement_failure_adds_nothing_to_revenue(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_FAILURE, reason="insufficient_funds")
    payment = await paid.payment()
    before = await scrape(paid)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402
    assert reply.json()["error"] == "settlement_failed"
    assert "payment-response" not in reply.headers
    assert paid.settle_calls() == paid.upstream_calls == 1
    assert delta(before, await scrape(paid)) == {
        "payments:settle_failed": 1,
        "usage:failed": 1,
    }


async def test_an_upstream_failure_adds_nothing_to_revenue(paid: PaidGateway) -> None:
    paid.upstream.responder = static(500, {"error": "down"})
    payment = await paid.payment()
    before = await scrape(paid)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 502
    assert reply.error_code == "upstream_error"
    assert "payment-response" not in reply.headers
    assert paid.settle_calls() == 0
    assert delta(before, await scrape(paid)) == {
        "payments:upstream_failed": 1,
        "usage:failed": 1,
    }


async def test_a_pending_settlement_counts_its_revenue_once_when_reconciled(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()
    before = await scrape(paid)

    pending = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert pending.status == 503
    assert pending.error_code == "settlement_pending"
    at_pending = await scrape(paid)
    assert delta(before, at_pending) == {"payments:settlement_pending": 1}

    reconciled = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reconciled.status == 200, reconciled.body
    assert reconciled.json() == PROVIDER_ANSWER
    assert "payment-response" in reconciled.headers
    assert paid.settle_calls() == 2 and paid.upstream_calls == 1
    assert delta(at_pending, await scrape(paid)) == {
        "revenue": GET_BALANCE_PROVIDER_PRICE,  # the fake CDP: no settlement fee
        "payments:paid": 1,
        "usage:paid": 1,
    }


async def test_a_payment_identifier_replay_adds_nothing_to_revenue(paid: PaidGateway) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment(payment_id=PAYMENT_ID)
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert first.status == 200, first.body
    settled = await scrape(paid)

    again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert again.status == 200
    assert again.body == first.body
    assert again.headers["payment-response"] == first.headers["payment-response"]
    assert paid.settle_calls() == paid.upstream_calls == 1
    assert delta(settled, await scrape(paid)) == {"payments:replayed": 1}


async def test_refused_payments_are_rejected_and_earn_nothing(paid: PaidGateway) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 200
    settled = await scrape(paid)

    reused = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)
    junk = await paid.pay(GET_BALANCE, balance_body(), "junk")
    again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reused.status == junk.status == 402
    assert reused.json()["error"] == "payment_already_used"
    assert junk.json()["error"] == "invalid_payment_header"
    assert again.status == 200  # the identical request's answer again: no new sale
    assert paid.settle_calls() == paid.upstream_calls == 1
    assert delta(settled, await scrape(paid)) == {
        "payments:rejected": 2,
        "usage:failed": 2,
        "payments:replayed": 1,
    }


async def test_a_refusal_before_the_payment_flow_is_no_payment_outcome(paid: PaidGateway) -> None:
    """A malformed body is a 400 like on any route: a request, not a payment outcome."""
    before = await scrape(paid)

    reply = await paid.pay(GET_BALANCE, b"{", await paid.payment())

    assert reply.status == 400
    assert reply.error_code == "invalid_request"
    assert delta(before, await scrape(paid)) == {"payments:challenged": 1, "usage:unpaid": 1}  # payment()
    assert paid.verify_calls() == 0


# --- sign-in-with-x routes ---------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def signing(start_paid_gateway: StartPaidGateway, upstream: Upstream) -> PaidGateway:
    """One gateway selling both: paid RPC routes and the sign-in asset-data routes, whose
    asset-data API is the same recording upstream as the RPC provider's."""
    upstream.responder = static(200, {"status": "ok"})
    env = {
        "ASSET_API_BASE_URL": f"{upstream.url}/asset-data",
        "ASSET_API_KEY": ASSET_KEY,
        "SIWX_SECRET": "e" * 40,
        "ROUTE_GROUPS": "all",  # the paid groups and the asset-data group
    }
    return await start_paid_gateway(env=env)


async def _signed_header(gateway: PaidGateway) -> str:
    challenge = await gateway.get(TOKENS_HEALTH)
    assert challenge.status == 402, challenge.body
    return sign_in(challenge.json()["extensions"]["sign-in-with-x"], WALLET)


async def _signed_get(gateway: PaidGateway, header: str) -> tuple[int, dict[str, object]]:
    async with gateway.http.get(gateway.url + TOKENS_HEALTH, headers={"sign-in-with-x": header}) as resp:
        return resp.status, await resp.json()


async def test_a_sign_in_call_counts_as_signed_in_and_earns_nothing(
    signing: PaidGateway,
) -> None:
    before = await scrape(signing)
    signed = await _signed_header(signing)  # one challenge

    status, body = await _signed_get(signing, signed)

    assert status == 200 and body["ok"] is True
    assert signing.upstream_calls == 1
    assert signing.upstream.calls[0].headers.get("x-api-key") == ASSET_KEY
    after = await scrape(signing)
    assert delta(before, after, TOKENS_ROUTE) == {
        "payments:challenged": 1,
        "payments:signed_in": 1,
        "usage:unpaid": 1,
        "usage:signed_in": 1,
    }
    assert not [key for key in after if key[0] == "x402_revenue_micro_usdc_total" and key[1] == TOKENS_ROUTE]


async def test_a_replayed_sign_in_is_refused_and_not_signed_in(signing: PaidGateway) -> None:
    signed = await _signed_header(signing)
    assert (await _signed_get(signing, signed))[0] == 200
    before = await scrape(signing)

    status, body = await _signed_get(signing, signed)

    assert status == 402
    assert body["error"] == "siwx_replayed"
    assert signing.upstream_calls == 1  # the first call only
    assert delta(before, await scrape(signing), TOKENS_ROUTE) == {"payments:refused": 1, "usage:failed": 1}


async def test_a_signed_in_call_whose_upstream_fails_is_upstream_failed(
    signing: PaidGateway,
) -> None:
    signed = await _signed_header(signing)
    before = await scrape(signing)
    signing.upstream.responder = static(500, {"error": "down"})

    status, body = await _signed_get(signing, signed)

    assert status == 502
    assert body["error"]["code"] == "upstream_error"
    assert signing.upstream_calls == 1
    assert delta(before, await scrape(signing), TOKENS_ROUTE) == {
        "payments:upstream_failed": 1,
        "usage:failed": 1,
    }
