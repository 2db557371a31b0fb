"""Shared rate-limit buckets count only credible paid requests; each payer has its own budget.

A flood of junk payments (garbage client signatures) or replays of a used payment from one IP
must not drain a scope bucket (``provider:cluster:rpc``) that other clients share: the bucket is
charged only after the cheap local checks (header decodes, payment matches the route, not a
self-transfer, the client's signature verifies over the message, the payment is unused). The
refusals still count against the flooding IP's challenge limit. Per-wallet buckets, keyed by the
payer of such a payment, keep one payer from taking a scope's whole budget.

Limits are literal (per hour) in a copy of the packaged routes.yaml, so no test depends on timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import PACKAGED_ROUTES_FILE, load_settings
from gateway.routing.routes import load_routes, named_limits
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload
from tests.support.adversarial_paid import (
    ONE_SETTLEMENT_FEE,
    Money,
    funded_wallet,
    garbage_client_signature,
    via,
)
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    balance_body,
    paid_gateways_on_the_store,
)
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer
from tests.support.upstream import static

redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()

FLOODER, HONEST = "203.0.113.7", "198.51.100.20"
CHALLENGES_PER_IP = 10
SCOPE_BUDGET = 3
"""provider_a:mainnet:rpc allows this many paid calls per hour in these tests."""


def routes_with_limits(tmp_path: Path, scope_budget: int, wallet_budget: int) -> Path:
    """The packaged route table with hourly literal limits for the scope and per-wallet buckets."""
    text = PACKAGED_ROUTES_FILE.read_text()
    scope_line = '- {scope: "{provider}:{cluster}:rpc", limit: rpc}'
    wallet_line = '- {scope: "{provider}:{cluster}:rpc:wallet", per: wallet, limit: rpc_wallet}'
    assert scope_line in text and wallet_line in text
    hour = "period_seconds: 3600}"
    text = text.replace(scope_line, scope_line.replace("limit: rpc}", f"limit: {scope_budget}, {hour}"))
    wallet_limit = f"limit: {wallet_budget}, {hour}"
    text = text.replace(wallet_line, wallet_line.replace("limit: rpc_wallet}", wallet_limit))
    path = tmp_path / "routes.yaml"
    path.write_text(text)
    return path


async def _gateway(start_paid_gateway: StartPaidGateway, routes: Path) -> PaidGateway:
    paid = await start_paid_gateway(
        internal=True,
        env={
            "ROUTES_FILE": str(routes),
            "TRUSTED_PROXIES": "127.0.0.1",
            "RATE_LIMIT_CHALLENGE_PER_MINUTE": str(CHALLENGES_PER_IP),
        },
    )
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    return paid


async def pay_from(paid: PaidGateway, ip: str, payment: PaymentPayload, request_id: int = 1) -> Reply:
    """A paid getBalance from client ``ip`` (through the trusted proxy)."""
    headers = {"payment-signature": encode_header(payment), **via(ip)}
    return await paid.post(GET_BALANCE, balance_body(request_id=request_id), headers)


def assert_rate_limited(reply: Reply, scope: str) -> None:
    assert reply.status == 429, reply.body
    assert reply.error_code == "rate_limited"
    assert reply.json()["error"]["details"]["scope"] == scope
    assert int(reply.headers["retry-after"]) >= 1
    assert str(MARKER) not in reply.body.decode()


async def test_junk_and_replayed_payments_from_one_ip_leave_another_wallet_untouched(
    start_paid_gateway: StartPaidGateway, tmp_path: Path, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await _gateway(start_paid_gateway, routes_with_limits(tmp_path, SCOPE_BUDGET, 100))
    requirements, resource = await paid.requirements()
    used = paid.sign(requirements, resource)
    assert_answered(await pay_from(paid, FLOODER, used))  # the flooder's one real sale
    other, other_ata = funded_wallet(paid.chain)
    before = Money.of(paid.chain, other_ata)
    flooder_before = paid.chain.balance(paid.chain.payer_ata)

    flood: list[Reply] = []
    for n in range(3 * SCOPE_BUDGET + CHALLENGES_PER_IP):
        if n % 2:
            junk = garbage_client_signature(paid.sign(requirements, resource))
            flood.append(await pay_from(paid, FLOODER, junk))
        else:  # the used payment offered for another request
            flood.append(await pay_from(paid, FLOODER, used, request_id=2 + n))

    refused = [r for r in flood if r.status == 402]
    assert len(refused) == CHALLENGES_PER_IP
    for reply in refused:
        assert reply.json()["error"] in ("invalid_exact_svm_payload_transaction", "payment_already_used")
        assert str(MARKER) not in reply.body.decode()
    for reply in flood[len(refused) :]:
        assert_rate_limited(reply, "challenge:ip")

    honest = [
        await pay_from(paid, HONEST, paid.sign(requirements, resource, payer=other))
        for _ in range(SCOPE_BUDGET - 1)
    ]

    for reply in honest:
        assert_answered(reply)
    assert paid.upstream_calls == SCOPE_BUDGET
    assert paid.chain.balance(paid.chain.payer_ata) == flooder_before
    spent = Money.of(paid.chain, other_ata).minus(before)
    n = SCOPE_BUDGET - 1
    price = GET_BALANCE_PRICE_INTERNAL
    assert spent == Money(-n * price, n * price, -n * ONE_SETTLEMENT_FEE)
    assert len(set(solana_rpc_server.sent)) == SCOPE_BUDGET


async def test_one_payer_is_held_to_its_wallet_budget_while_another_is_served(
    start_paid_gateway: StartPaidGateway, tmp_path: Path
) -> None:
    paid = await _gateway(start_paid_gateway, routes_with_limits(tmp_path, 100, 2))
    requirements, resource = await paid.requirements()
    other, other_ata = funded_wallet(paid.chain)
    before, other_before = Money.of(paid.chain), Money.of(paid.chain, other_ata)

    greedy = [await pay_from(paid, HONEST, paid.sign(requirements, resource)) for _ in range(3)]
    served = await pay_from(paid, FLOODER, paid.sign(requirements, resource, payer=other))

    assert_answered(greedy[0])
    assert_answered(greedy[1])
    assert_rate_limited(greedy[2], "provider_a:mainnet:rpc:wallet")
    assert_answered(served)
    assert paid.upstream_calls == 3
    assert Money.of(paid.chain).minus(before).client_usdc == -2 * GET_BALANCE_PRICE_INTERNAL
    assert Money.of(paid.chain, other_ata).minus(other_before).client_usdc == -GET_BALANCE_PRICE_INTERNAL
    assert Money.of(paid.chain).minus(before).pay_to_usdc == 3 * GET_BALANCE_PRICE_INTERNAL


@pytest.mark.parametrize("configured", [None, "7"])
def test_every_paid_route_carries_a_wallet_limit_from_the_environment(configured: str | None) -> None:
    env = {"GATEWAY_BASE_URL": "https://gw.example.com"}
    if configured is not None:
        env["RATE_LIMIT_WALLET_RPS"] = configured
    settings = load_settings(env)
    routes = load_routes(PACKAGED_ROUTES_FILE, named_limits(settings))

    # Every paid route that calls a provider (a top-up sells credit: no provider budget to share).
    exact = [route for route in routes if route.access == "exact" and route.handler != "credit_top_up"]
    assert exact
    for route in exact:
        (wallet,) = [spec for spec in route.rate_limits if spec.per == "wallet"]
        scope_limit = 50 if "/rpc/" in route.path else 10  # by default, the scope's own limit
        assert wallet.limit == (int(configured) if configured else scope_limit)
        assert wallet.period_ms == 1000
        assert wallet.scope.endswith(":wallet")
