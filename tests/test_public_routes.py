"""Public routes over a real socket: health, catalog, CORS, HEAD, metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.config import PACKAGED_ROUTES_FILE
from gateway.routing.routes import load_routes
from gateway.store.memory import MemoryStore
from gateway.telemetry.metrics import usage_key
from gateway.x402.types import SOLANA_MAINNET, USDC_MAINNET_MINT
from tests.support.gateway_server import FULL_ENV, PAY_TO, SERVICE_ONLY_ENV, RunningGateway, run_gateway

ALLOW_HEADERS = [
    "Content-Type",
    "PAYMENT-SIGNATURE",
    "X-PAYMENT",
    "X-PAYMENT-RESPONSE",
    "PAYMENT-RESPONSE",
    "SIGN-IN-WITH-X",
    "X-CREDIT-SESSION",
    "Authorization",
]
# The CORS headers plus PAYMENT-REQUIRED (the v2 challenge header), Retry-After (for 429s) and
# X-Credit-Balance (the credit left after a call paid from prepaid credit).
EXPOSE_HEADERS = {
    "Content-Type",
    "WWW-Authenticate",
    "X-PAYMENT-RESPONSE",
    "PAYMENT-RESPONSE",
    "PAYMENT-REQUIRED",
    "Retry-After",
    "X-Credit-Balance",
}
PACKAGED = load_routes(
    PACKAGED_ROUTES_FILE,
    {"rpc": (1, 1), "das": (1, 1), "tokens": (1, 1), "challenge": (1, 1),
     "rpc_wallet": (1, 1), "das_wallet": (1, 1), "tokens_share": (1, 1),
     "sign_in_ip": (1, 1), "sign_in_wallet": (1, 1)},
)
GET_PATHS = [
    r.path.replace("{assetId}", "solana")
    for r in PACKAGED
    if r.method == "GET" and r.access in ("public", "siwx")
]
STATIC_GET_PATHS = ["/healthz", "/v1/catalog"]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def store() -> MemoryStore:
    return MemoryStore()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(store: MemoryStore) -> AsyncIterator[RunningGateway]:
    async with run_gateway(FULL_ENV, store=store) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def bare_gateway() -> AsyncIterator[RunningGateway]:
    """The operator switched every sellable group off: only the service routes are served."""
    async with run_gateway(SERVICE_ONLY_ENV) as running:
        yield running


async def _json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as response:
        return response.status, await response.json()


async def _catalog(
    http: aiohttp.ClientSession, gateway: RunningGateway, query: str = ""
) -> list[dict[str, Any]]:
    status, body = await _json(http, f"{gateway.url}/v1/catalog{query}")
    assert status == 200
    routes: list[dict[str, Any]] = body["routes"]
    return routes


def _entry(routes: list[dict[str, Any]], path: str) -> dict[str, Any]:
    (entry,) = [r for r in routes if r["path"] == path]
    return entry


# --- /healthz --------------------------------------------------------------------------------------


async def test_healthz_answers_the_spec_body(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/healthz") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == {"ok": True, "service": "x402-gateway", "status": "healthy"}


async def test_healthz_answers_with_nothing_configured(
    bare_gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    assert await _json(http, f"{bare_gateway.url}/healthz") == (
        200,
        {"ok": True, "service": "x402-gateway", "status": "healthy"},
    )


# --- /v1/catalog -----------------------------------------------------------------------------------


async def test_catalog_lists_every_listed_route(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    routes = await _catalog(http, gateway)

    assert len(routes) == 54  # 63 minus /metrics, /readyz, /openapi.json, the 3 of /docs, the 3 internal
    assert len({(r["method"], r["path"]) for r in routes}) == 54


async def test_catalog_never_lists_internal_or_metrics_routes(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    paths = {r["path"] for r in await _catalog(http, gateway)}

    assert "/metrics" not in paths
    assert not [p for p in paths if p.startswith("/api/internal")]
    assert "internal" not in {r["access"] for r in await _catalog(http, gateway)}


async def test_catalog_paid_entry_carries_price_asset_network_and_schemas(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    path = "/v1/x402/solana/mainnet/provider_a/das/getAssetsByOwner"

    entry = _entry(await _catalog(http, gateway), path)

    assert entry["path"] == path
    assert entry["url"] == gateway.settings.base_url + path
    assert entry["url"].startswith("http://127.0.0.1:")
    assert (entry["method"], entry["access"]) == ("POST", "exact")
    # The external facilitator pays the Solana fees and no fee is configured: the provider part.
    assert entry["price"] == {"microUsdc": "216", "usd": "$0.000216"}
    assert entry["priceParts"] == {
        "provider": {"microUsdc": "216", "usd": "$0.000216"},
        "settlementFee": {"microUsdc": "0", "usd": "$0.00"},
    }
    assert (entry["asset"], entry["network"]) == (USDC_MAINNET_MINT, SOLANA_MAINNET)
    assert entry["payTo"] == PAY_TO
    assert entry["inputSchema"]["properties"]["body"]["properties"]["method"] == {"const": "getAssetsByOwner"}
    assert entry["outputSchema"]["required"] == ["jsonrpc", "result"]
    assert (
        entry["description"]
        == "Digital assets of an owner (DAS; mainnet, provider_a); limit at most 1000, default 100."
    )


async def test_catalog_price_is_a_micro_usdc_string_with_usd_display(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    prices = {
        r["path"].split("/", 5)[-1]: r["price"] for r in await _catalog(http, gateway, "?provider=provider_b")
    }

    assert prices["provider_b/rpc/getBalance"] == {"microUsdc": "5", "usd": "$0.000005"}
    assert prices["provider_b/das/searchAssets"] == {"microUsdc": "50", "usd": "$0.00005"}


async def test_catalog_free_entries_have_zero_price_and_no_asset(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    routes = await _catalog(http, gateway)

    for path in ("/healthz", "/v1/x402/tokens/assets/{assetId}/ohlcv"):
        entry = _entry(routes, path)
        assert entry["price"] == {"microUsdc": "0", "usd": "$0.00"}
        assert "asset" not in entry and "network" not in entry and "priceParts" not in entry


async def test_catalog_siwx_entry_publishes_its_query_schema(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    entry = _entry(await _catalog(http, gateway), "/v1/x402/tokens/assets/resolve")

    assert (entry["method"], entry["access"], entry["url"]) == (
        "GET",
        "siwx",
        gateway.settings.base_url + "/v1/x402/tokens/assets/resolve",
    )
    assert entry["inputSchema"]["properties"]["query"]["oneOf"] == [
        {"required": ["ref"]},
        {"required": ["mint"]},
    ]
    assert entry["outputSchema"]["properties"]["provider"] == {"type": "string", "const": "tokens"}
    assert entry["description"].startswith("Resolve an alias or mint")


@pytest.mark.parametrize(("provider", "count"), [("provider_a", 15), ("provider_b", 18), ("tokens", 19)])
async def test_catalog_filters_by_provider(
    gateway: RunningGateway, http: aiohttp.ClientSession, provider: str, count: int
) -> None:
    routes = await _catalog(http, gateway, f"?provider={provider}")

    assert len(routes) == count
    assert all(f"/{provider}/" in r["path"] for r in routes)
    assert {r["provider"] for r in routes} == {provider}


@pytest.mark.parametrize(
    "query", ["?provider=provider_c", "?provider=", "?provider=tokens&provider=tokens", "?x=1"]
)
async def test_catalog_bad_query_is_400_in_the_one_error_shape(
    gateway: RunningGateway, http: aiohttp.ClientSession, query: str
) -> None:
    status, body = await _json(http, f"{gateway.url}/v1/catalog{query}")

    assert status == 400
    assert body["ok"] is False
    assert body["error"]["code"] == "invalid_request"
    assert set(body) == {"ok", "error"}
    assert isinstance(body["error"]["message"], str)


async def test_catalog_unknown_provider_names_the_allowed_values(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    status, body = await _json(http, f"{gateway.url}/v1/catalog?provider=provider_c")

    assert status == 400
    assert body["error"] == {
        "code": "invalid_request",
        "message": "provider: must be one of provider_a, provider_b, tokens, credits",
        "details": {"parameter": "provider"},
    }


async def test_catalog_never_shows_a_provider_key(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gateway.url}/v1/catalog") as response:
        text = await response.text()

    assert "LEAK" not in text
    assert "127.0.0.1:9" not in text


async def test_unconfigured_groups_are_not_listed(
    bare_gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    routes = await _catalog(http, bare_gateway)

    assert [r["path"] for r in routes] == ["/healthz", "/v1/catalog"]


async def test_unconfigured_groups_are_not_mounted(
    bare_gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{bare_gateway.url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance") as response:
        assert response.status == 404


# --- CORS -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/healthz", "GET"),
        ("/v1/catalog", "GET"),
        ("/v1/x402/tokens/assets/solana/markets", "GET"),
        ("/v1/x402/tokens/assets/market-snapshots", "POST"),
        ("/v1/x402/solana/devnet/provider_b/rpc/getAccountInfo", "POST"),
    ],
)
async def test_preflight_allows_the_route_method_and_options(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str, method: str
) -> None:
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": method}

    async with http.options(f"{gateway.url}{path}", headers=headers) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert response.headers["Access-Control-Allow-Methods"] == f"{method}, OPTIONS"
        assert await response.read() == b""


async def test_preflight_lists_the_allowed_request_headers(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.options(f"{gateway.url}/v1/x402/solana/mainnet/provider_b/das/getAsset") as response:
        allowed = [h.strip() for h in response.headers["Access-Control-Allow-Headers"].split(",")]

    assert allowed == ALLOW_HEADERS


async def test_preflight_allow_header_matches_the_405_allow_header(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.options(f"{gateway.url}/healthz") as preflight:
        allow = preflight.headers["Allow"]
    async with http.delete(f"{gateway.url}/healthz") as refused:
        assert refused.headers["Allow"] == allow == "GET, HEAD, OPTIONS"


@pytest.mark.parametrize("path", ["/healthz", "/v1/catalog", "/v1/x402/tokens/assets/search"])
async def test_simple_response_carries_allow_origin_and_expose_headers(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(f"{gateway.url}{path}", headers={"Origin": "https://app.example"}) as response:
        exposed = {h.strip() for h in response.headers["Access-Control-Expose-Headers"].split(",")}
        assert response.headers["Access-Control-Allow-Origin"] == "*"

    assert exposed == EXPOSE_HEADERS


async def test_error_responses_carry_cors_headers(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gateway.url}/v1/catalog?provider=nope") as response:
        assert response.status == 400
        assert response.headers["Access-Control-Allow-Origin"] == "*"


# --- HEAD, other methods, unknown paths -----------------------------------------------------------


def _comparable(headers: Any) -> dict[str, str]:
    """Headers that must agree between GET and HEAD (the challenge header holds a fresh nonce)."""
    return {
        k.lower(): ("<challenge>" if k.lower() == "payment-required" else v)
        for k, v in headers.items()
        if k.lower() != "date"
    }


@pytest.mark.parametrize("path", GET_PATHS)
async def test_head_returns_the_get_headers_with_an_empty_body(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(f"{gateway.url}{path}") as got:
        get_status, get_headers = got.status, _comparable(got.headers)
        await got.read()
    async with http.head(f"{gateway.url}{path}") as head:
        assert await head.read() == b""
        head_status, head_headers = head.status, _comparable(head.headers)

    assert head_status == get_status
    if path == "/metrics":  # the exposition grows between the two calls
        get_headers.pop("content-length"), head_headers.pop("content-length")
    assert head_headers == get_headers


@pytest.mark.parametrize("path", STATIC_GET_PATHS)
async def test_head_keeps_the_content_length_of_the_get(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(f"{gateway.url}{path}") as got:
        body = await got.read()
    async with http.head(f"{gateway.url}{path}") as head:
        assert int(head.headers["Content-Length"]) == len(body) > 0


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/healthz", "GET, HEAD, OPTIONS"),
        ("DELETE", "/v1/catalog", "GET, HEAD, OPTIONS"),
        ("PUT", "/v1/x402/tokens/assets/solana", "GET, HEAD, OPTIONS"),
        ("GET", "/v1/x402/solana/mainnet/provider_a/rpc/getBalance", "POST, OPTIONS"),
        ("PATCH", "/v1/x402/tokens/assets/market-snapshots", "POST, OPTIONS"),
    ],
)
async def test_other_method_is_405_with_allow(
    gateway: RunningGateway, http: aiohttp.ClientSession, method: str, path: str, allow: str
) -> None:
    async with http.request(method, f"{gateway.url}{path}") as response:
        assert response.status == 405
        assert response.headers["Allow"] == allow
        body = await response.json()

    assert body["ok"] is False
    assert body["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "path", ["/nope", "/healthz/", "/v1/catalog/extra", "/v2/catalog", "/v1/x402/solana/x"]
)
async def test_unknown_path_is_a_json_404(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str
) -> None:
    async with http.get(f"{gateway.url}{path}") as response:
        assert response.status == 404
        assert response.content_type == "application/json"
        body = await response.json()

    assert body["ok"] is False
    assert body["error"]["code"] == "not_found"


async def test_unknown_method_on_unknown_path_is_404(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.request("OPTIONS", f"{gateway.url}/nope") as response:
        assert response.status == 404


# --- /metrics -------------------------------------------------------------------------------------


async def _metrics(http: aiohttp.ClientSession, gateway: RunningGateway) -> str:
    async with http.get(f"{gateway.url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return await response.text()


async def test_metrics_count_requests_by_route_method_and_status(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    await _json(http, f"{gateway.url}/healthz")

    text = await _metrics(http, gateway)

    assert "# TYPE x402_requests_total counter" in text
    assert 'x402_requests_total{method="GET",route="health",status="200"}' in text
    assert 'x402_request_duration_seconds_bucket{le="0.001",route="health"}' in text


async def test_metrics_expose_the_usage_counters_of_the_store(
    gateway: RunningGateway, http: aiohttp.ClientSession, store: MemoryStore
) -> None:
    route = "solana.mainnet.provider_b.rpc.getBalance"
    await store.incr({usage_key(route, "paid"): 7, usage_key(route, "failed"): 2})

    text = await _metrics(http, gateway)

    assert "# TYPE x402_usage_total counter" in text
    assert f'x402_usage_total{{outcome="paid",route="{route}"}} 7.0' in text
    assert f'x402_usage_total{{outcome="failed",route="{route}"}} 2.0' in text
    assert f'x402_usage_total{{outcome="unpaid",route="{route}"}} 0.0' in text


async def test_metrics_method_label_cannot_be_chosen_freely(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.request("BREWCOFFEE", f"{gateway.url}/healthz") as response:
        assert response.status == 405

    text = await _metrics(http, gateway)

    assert "BREWCOFFEE" not in text
    assert 'x402_requests_total{method="OTHER",route="health",status="405"}' in text


async def test_metrics_never_show_a_secret(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    assert "LEAK" not in await _metrics(http, gateway)


async def test_metrics_carry_no_created_series(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    """One ``_created`` line per series would double the exposition for nothing Prometheus needs."""
    await _json(http, f"{gateway.url}/healthz")

    text = await _metrics(http, gateway)

    assert 'x402_requests_total{method="GET",route="health",status="200"}' in text
    assert "_created" not in text
