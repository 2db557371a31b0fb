"""Per-upstream latency and errors in /metrics, end to end: the real gateway under hypercorn, the
providers and the asset-data API as recording loopback servers, the fake CDP facilitator or the
internal one on LiteSVM, real signed payments and real sign-ins.

Labels are the route table's upstream names (and the facilitator's endpoints), never a URL: the
URLs carry API keys.
"""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.paid_fixtures import GET_BALANCE, PROVIDER_KEY, PaidGateway, StartPaidGateway, balance_body
from tests.support.ports import refusing_port
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")

PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 9}, "value": 31337}}
TOKENS_HEALTH = "/v1/x402/tokens/health"
ASSET_KEY = "asset-api-key-upstream-metrics-0123"
DURATION = "x402_upstream_duration_seconds_count"
ERRORS = "x402_upstream_errors_total"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every upstream sample of the exposition, by name and labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("x402_upstream_")
        for s in family.samples
    }


def changed(before: Samples, after: Samples) -> dict[str, float]:
    """``name{label=value,...}`` -> how much it grew (only the duration count and the errors)."""
    grown = {}
    for key in before.keys() | after.keys():
        name, labels = key
        if name not in (DURATION, ERRORS):
            continue
        value = after.get(key, 0.0) - before.get(key, 0.0)
        if value:
            grown[name + "{" + ",".join(f"{k}={v}" for k, v in labels) + "}"] = value
    return grown


async def scrape(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(url + "/metrics") as reply:
        assert reply.status == 200
        text = await reply.text()
    assert PROVIDER_KEY not in text and ASSET_KEY not in text and "127.0.0.1" not in text
    return samples(text)


# --- paid routes: the provider and the facilitator ---------------------------------------------


async def paid_call(paid: PaidGateway) -> tuple[int, dict[str, float]]:
    payment = await paid.payment()
    before = await scrape(paid.http, paid.url)
    reply = await paid.pay(GET_BALANCE, balance_body(), payment)
    return reply.status, changed(before, await scrape(paid.http, paid.url))


async def test_a_paid_call_observes_the_provider_and_the_facilitator(paid: PaidGateway) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER)

    status, grown = await paid_call(paid)

    assert status == 200
    assert grown == {
        f"{DURATION}{{upstream=provider_a_mainnet}}": 1,
        f"{DURATION}{{upstream=facilitator_verify}}": 1,
        f"{DURATION}{{upstream=facilitator_settle}}": 1,
    }


async def test_a_provider_failure_is_counted_by_kind(paid: PaidGateway) -> None:
    paid.upstream.responder = static(503, {"error": "down"})

    status, grown = await paid_call(paid)

    assert status == 502
    assert grown == {
        f"{DURATION}{{upstream=provider_a_mainnet}}": 1,
        f"{ERRORS}{{kind=http_5xx,upstream=provider_a_mainnet}}": 1,
        f"{DURATION}{{upstream=facilitator_verify}}": 1,
    }


async def test_a_json_rpc_error_answer_is_counted_as_an_rpc_error(paid: PaidGateway) -> None:
    paid.upstream.responder = static(
        200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "no"}}
    )

    status, grown = await paid_call(paid)

    assert status == 502
    assert grown[f"{ERRORS}{{kind=rpc_error,upstream=provider_a_mainnet}}"] == 1


async def test_the_internal_facilitator_observes_its_solana_node(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(200, PROVIDER_ANSWER)

    status, grown = await paid_call(paid)

    assert status == 200
    assert grown[f"{DURATION}{{upstream=provider_a_mainnet}}"] == 1
    assert grown[f"{DURATION}{{upstream=solana_mainnet_rpc}}"] >= 2  # simulate, send, confirm
    assert not [key for key in grown if key.startswith(ERRORS)]


# --- sign-in routes: the asset-data API ---------------------------------------------------------


def tokens_env(api_url: str) -> dict[str, str]:
    return {
        "ROUTE_GROUPS": "tokens",
        "ASSET_API_BASE_URL": api_url,
        "ASSET_API_KEY": ASSET_KEY,
        "SIWX_SECRET": "upstream-metrics-siwx-secret-0123456789",
        "UPSTREAM_TIMEOUT_SECONDS": "0.3",
        "LOG_LEVEL": "WARNING",
    }


async def signed_in_call(
    http: aiohttp.ClientSession, gateway: RunningGateway
) -> tuple[int, dict[str, float]]:
    async with http.get(gateway.url + TOKENS_HEALTH) as challenge:
        assert challenge.status == 402
        header = sign_in((await challenge.json())["extensions"]["sign-in-with-x"], Keypair())
    before = await scrape(http, gateway.url)
    async with http.get(gateway.url + TOKENS_HEALTH, headers={"sign-in-with-x": header}) as reply:
        status = reply.status
    return status, changed(before, await scrape(http, gateway.url))


async def test_a_signed_in_call_observes_the_asset_api(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    upstream.responder = static(200, {"status": "ok"})
    async with run_gateway(tokens_env(upstream.url)) as gateway:
        status, grown = await signed_in_call(http, gateway)

    assert status == 200
    assert grown == {f"{DURATION}{{upstream=asset_api}}": 1}


@pytest.mark.parametrize(
    ("answer", "kind", "status"),
    [
        (static(500, {"error": "boom"}), "http_5xx", 502),
        (static(200, text="not json"), "invalid_answer", 502),
        (static(200, {"status": "late"}, delay=1.0), "timeout", 504),
    ],
    ids=["5xx", "invalid", "timeout"],
)
async def test_an_asset_api_failure_is_counted_by_kind(
    upstream: Upstream, http: aiohttp.ClientSession, answer: object, kind: str, status: int
) -> None:
    upstream.responder = answer  # type: ignore[assignment]
    async with run_gateway(tokens_env(upstream.url)) as gateway:
        got, grown = await signed_in_call(http, gateway)

    assert got == status
    assert grown == {
        f"{DURATION}{{upstream=asset_api}}": 1,
        f"{ERRORS}{{kind={kind},upstream=asset_api}}": 1,
    }


async def test_an_unreachable_asset_api_is_a_connection_error(http: aiohttp.ClientSession) -> None:
    async with run_gateway(tokens_env(f"http://127.0.0.1:{refusing_port()}")) as gateway:
        got, grown = await signed_in_call(http, gateway)

    assert got == 502
    assert grown[f"{ERRORS}{{kind=connection,upstream=asset_api}}"] == 1
