"""/metrics under ``serve --workers 2``: every worker's requests, payments and earnings are counted
(multiprocess mode), and only the (route, outcome) series a route can have are listed. One
worker serves in the ``serve`` process itself."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.batch.endpoint import batch_endpoints
from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.routes import RouteSpec, load_routes, named_limits
from gateway.telemetry.metrics import payment_outcomes, usage_outcomes
from tests.support.cdp_facilitator import CdpCredentials, StaticBackend
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.gateway_process import GatewayProcess, serve
from tests.support.metrics_text import Series, earnings_series
from tests.support.paid_fixtures import GET_BALANCE, GET_BALANCE_PROVIDER_PRICE, balance_body
from tests.support.paid_processes import Replica, eventually, paid_processes
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.slow

BATCH = 20
ROUTE = "solana.mainnet.provider_a.rpc.getBalance"
TOKENS_ROUTE = "tokens.health"
MAX_BATCHES = 20


def _health_count(text: str) -> float:
    found = re.search(r'^x402_requests_total\{method="GET",route="health",status="200"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _sample(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert found, f"{series} is not exposed"
    return float(found.group(1))


def _health_pids(gateway: GatewayProcess) -> set[int]:
    lines = [json.loads(line) for line in gateway.stdout().splitlines() if line.startswith("{")]
    return {line["pid"] for line in lines if line.get("route") == "health"}


async def test_one_worker_serves_in_the_serve_process_itself_and_stops_on_sigterm() -> None:
    with serve({"ROUTE_GROUPS": "none"}) as gateway:
        async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/healthz") as reply:
            assert reply.status == 200
        # Its log line follows the answer: read until it is there.
        await eventually(lambda: bool(_health_pids(gateway)), what="the health request's log line")
        assert _health_pids(gateway) == {gateway.process.pid}  # no second interpreter
        assert gateway.terminate() == 0


async def test_metrics_with_two_workers_count_the_requests_of_both(clean_redis_url: str) -> None:
    with serve(
        {"STATE_STORE_REST_URL": clean_redis_url, "ROUTE_GROUPS": "none"}, "--workers", "2"
    ) as gateway:
        sent = 0
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:

            async def health() -> None:
                async with http.get(f"{gateway.url}/healthz") as r:
                    assert r.status == 200

            # Concurrent fresh connections until both workers have served some (bounded).
            for _ in range(MAX_BATCHES):
                await asyncio.gather(*(health() for _ in range(BATCH)))
                sent += BATCH
                await asyncio.sleep(0.05)
                if len(_health_pids(gateway)) == 2:
                    break
            assert len(_health_pids(gateway)) == 2, "both workers must serve for this test to mean anything"
            for _ in range(6):
                async with http.get(f"{gateway.url}/metrics") as r:
                    text = await r.text()
                    assert r.status == 200
                    # Whichever worker answers, it reports all workers' requests.
                    assert _health_count(text) == sent
    assert "x402_usage" in text
    assert "_created" not in text


# --- earnings under two workers --------------------------------------------------------------------

PAYMENT_BATCH = 6
MAX_PAYMENT_BATCHES = 20
"""The kernel hands a burst of connections to whichever worker wakes first, and that worker's
event loop accepts every pending one, so a batch often lands on one worker: keep sending batches
(a short pause apart, which reshuffles which worker is waiting) until both have settled some."""
PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 4}, "value": 77}}
TOKENS_HEALTH = "/v1/x402/tokens/health"
STORE_FLUSH_POLLS = 300
ROUTE_LIMITS = named_limits(Settings(base_url="https://gw.example.com"))


def _settling_pids(gateway: GatewayProcess) -> set[int]:
    lines = [json.loads(line) for line in gateway.stdout().splitlines() if line.startswith("{")]
    return {line["pid"] for line in lines if line.get("msg") == "payment settled"}


def _meaningful_series(routes: list[RouteSpec]) -> set[tuple[str, str, str]]:
    """What /metrics must list for these routes: each access mode's own outcomes, nothing else."""
    expected: set[tuple[str, str, str]] = set()
    for route in routes:
        expected |= {("x402_payments_total", route.name, o) for o in payment_outcomes(route.access)}
        expected |= {("x402_usage_total", route.name, o) for o in usage_outcomes(route.access)}
        if route.access == "exact":
            expected.add(("x402_revenue_micro_usdc_total", route.name, ""))
    return expected


async def test_earnings_with_two_workers_add_up_and_list_only_meaningful_series(
    clean_redis_url: str,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    facilitator = await start_cdp_facilitator(
        credentials=cdp_credentials, backend=StaticBackend(fee_payer=str(usdc_chain.fee_payer.pubkey()))
    )
    upstream.responder = static(200, PROVIDER_ANSWER)  # also answers as the asset-data API
    env = {
        "STATE_STORE_REST_URL": clean_redis_url,
        "LOG_LEVEL": "INFO",
        "ASSET_API_BASE_URL": f"{upstream.url}/asset-data",
        "ASSET_API_KEY": "asset-key-workers-0123456789",
        "SIWX_SECRET": "w" * 40,
        "ROUTE_GROUPS": "all",  # the paid groups and the asset-data group
        "RATE_LIMIT_WALLET_RPS": "1000",  # one test wallet pays every request
    }
    async with (
        paid_processes(
            1,
            chain=usdc_chain,
            rpc=solana_rpc_server,
            upstream=upstream,
            facilitator=facilitator,
            env=env,
            args=("--workers", "2"),
        ) as running,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
    ):
        gateway = Replica(running.replicas[0].process, http)  # a fresh connection per request
        settled = 0
        # Concurrent payments on fresh connections until both workers have settled some (bounded).
        for _ in range(MAX_PAYMENT_BATCHES):
            payments = [await running.payment(gateway) for _ in range(PAYMENT_BATCH)]
            replies = await asyncio.gather(*(gateway.pay(GET_BALANCE, balance_body(), p) for p in payments))
            assert [r.status for r in replies] == [200] * PAYMENT_BATCH, [r.body for r in replies]
            settled += PAYMENT_BATCH
            if len(_settling_pids(gateway.process)) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(_settling_pids(gateway.process)) == 2, "both workers must settle for this to mean anything"
        challenge = await gateway.get(TOKENS_HEALTH)
        assert challenge.status == 402
        signed = sign_in(challenge.json()["extensions"]["sign-in-with-x"], Keypair())
        assert (await gateway.get(TOKENS_HEALTH, {"sign-in-with-x": signed})).status == 200
        assert running.settle_calls() == settled

        async def scrape() -> Series:
            reply = await gateway.get("/metrics")
            assert reply.status == 200
            return earnings_series(reply.body.decode())

        revenue = settled * GET_BALANCE_PROVIDER_PRICE  # the fake CDP: no settlement fee
        expected = {
            ("x402_revenue_micro_usdc_total", ROUTE, ""): revenue,
            ("x402_payments_total", ROUTE, "paid"): settled,
            ("x402_payments_total", ROUTE, "challenged"): settled,
            ("x402_usage_total", ROUTE, "paid"): settled,
            ("x402_payments_total", TOKENS_ROUTE, "signed_in"): 1,
            ("x402_usage_total", TOKENS_ROUTE, "signed_in"): 1,
            ("x402_usage_total", TOKENS_ROUTE, "unpaid"): 1,
        }
        # The shared store hears from each worker within its flush interval (a second); a loaded
        # runner may take several, so wait for every series, not only the first.
        for _ in range(STORE_FLUSH_POLLS):
            series = await scrape()
            if all(series[key] == value for key, value in expected.items()):
                break
            await asyncio.sleep(0.1)
        catalog = await gateway.get("/v1/catalog")
        assert catalog.status == 200
        for _ in range(6):  # whichever worker answers, it reports every worker's earnings
            series = await scrape()
            assert series[("x402_revenue_micro_usdc_total", ROUTE, "")] == revenue
            assert series[("x402_payments_total", ROUTE, "paid")] == settled
            assert series[("x402_payments_total", ROUTE, "challenged")] == settled
            assert series[("x402_usage_total", ROUTE, "paid")] == settled
            assert series[("x402_payments_total", TOKENS_ROUTE, "signed_in")] == 1
            assert series[("x402_usage_total", TOKENS_ROUTE, "signed_in")] == 1
            assert series[("x402_usage_total", TOKENS_ROUTE, "unpaid")] == 1
        # Every worker's upstream calls too: one provider call and one settle per payment.
        text = (await gateway.get("/metrics")).body.decode()
        assert _sample(text, 'x402_upstream_duration_seconds_count{upstream="provider_a_mainnet"}') == settled
        assert _sample(text, 'x402_upstream_duration_seconds_count{upstream="facilitator_settle"}') == settled
        assert _sample(text, 'x402_upstream_duration_seconds_count{upstream="asset_api"}') == 1
        assert "_created" not in text

    routes = {r.name: r for r in load_routes(PACKAGED_ROUTES_FILE, ROUTE_LIMITS)}
    # each provider's JSON-RPC endpoint counts its own sales
    routes |= {e.name: e.template for e in batch_endpoints(list(routes.values()), 20)}
    served = {entry["name"] for entry in catalog.json()["routes"]} | {key[1] for key in series}
    listed = [routes[name] for name in served]
    assert series.keys() == _meaningful_series(listed)
    assert {"exact", "siwx"} <= {route.access for route in listed}
    assert not [key for key in series if key[1] == "health"]
    earning = {key[1] for key in series if key[0] == "x402_revenue_micro_usdc_total"}
    assert earning == {r.name for r in listed if r.access == "exact"}
