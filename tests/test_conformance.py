"""The running gateway against its specification, table by table.

Every request here is written from the specification's text: its route tables, its parameter
tables for the asset-data routes, the JSON-RPC ``params`` array of the paid routes (both the
positional and the named form for DAS), and the statuses it names (402 for paid and sign-in
routes, 401 for the internal routes, HEAD, OPTIONS and CORS, the catalog filter). Nothing is read
from routes.yaml: where this module and the table disagree, the table is what is wrong.

The gateway runs for real (hypercorn on loopback) with every route group configured. Asset-data
calls sign in for real and reach a recording loopback upstream; paid calls pay with real Solana
transactions settled on the LiteSVM chain by the internal facilitator.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import base58
import pytest
import pytest_asyncio
from solders.keypair import Keypair
from yarl import URL

from client.siwx_signer import sign_in
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.paid_fixtures import PaidGateway, Reply, StartPaidGateway
from tests.support.solana_rpc_server import UsdcChain
from tests.support.upstream import Upstream, static

# --- the specification's vocabulary -------------------------------------------------------------

SOLANA_MAINNET = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
SOLANA_DEVNET = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
USDC = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
MINT = USDC
OTHER_MINT = "So11111111111111111111111111111111111111112"
OWNER = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"

CLUSTERS = ("mainnet", "devnet")
PROVIDERS = ("provider_a", "provider_b")
RPC_METHODS = (
    "getBalance",
    "getAccountInfo",
    "getTransaction",
    "getSignaturesForAddress",
    "getTokenAccountsByOwner",
    "getProgramAccounts",
)
DAS_METHODS = ("getAsset", "getAssetsByOwner", "searchAssets")
# "provider_a offers DAS on mainnet only. provider_b offers DAS on both clusters."
DAS_OFFERED = {("mainnet", "provider_a"), ("mainnet", "provider_b"), ("devnet", "provider_b")}

TOKENS = "/v1/x402/tokens"
# The asset-data route table: operation, method, path.
ASSET_ROUTES = [
    ("health", "GET", "/health"),
    ("search", "GET", "/assets/search"),
    ("resolve", "GET", "/assets/resolve"),
    ("curated", "GET", "/assets/curated"),
    ("marketSnapshots", "POST", "/assets/market-snapshots"),
    ("variantMarkets", "GET", "/assets/variant-markets"),
    ("riskSummaryByMint", "GET", "/assets/risk-summary"),
    ("assetDetail", "GET", "/assets/:assetId"),
    ("variants", "GET", "/assets/:assetId/variants"),
    ("variantTopMarkets", "GET", "/assets/:assetId/variant-top-markets"),
    ("variantMarket", "GET", "/assets/:assetId/variant-market"),
    ("markets", "GET", "/assets/:assetId/markets"),
    ("ohlcv", "GET", "/assets/:assetId/ohlcv"),
    ("priceChart", "GET", "/assets/:assetId/price-chart"),
    ("profile", "GET", "/assets/:assetId/profile"),
    ("tickers", "GET", "/assets/:assetId/tickers"),
    ("riskSummary", "GET", "/assets/:assetId/risk-summary"),
    ("riskDetails", "GET", "/assets/:assetId/risk-details"),
    ("description", "GET", "/assets/:assetId/description"),
]
INTERVALS = ("1m", "5m", "15m", "1H", "4H", "1D", "1W")
KINDS = (
    "native",
    "wrapped",
    "bridged",
    "etf",
    "yield",
    "leveraged",
    "basket",
    "lst",
    "stablecoin",
    "tokenized_equity",
)
CURATED_LISTS = ("all", "majors", "lsts", "currencies", "rwas", "etfs", "metals", "stocks")
INCLUDE = ("profile", "risk", "ohlcv", "markets")
ALLOWED_REQUEST_HEADERS = (
    "Content-Type",
    "PAYMENT-SIGNATURE",
    "X-PAYMENT",
    "X-PAYMENT-RESPONSE",
    "PAYMENT-RESPONSE",
    "SIGN-IN-WITH-X",
    "Authorization",
)
EXPOSED_HEADERS = ("Content-Type", "WWW-Authenticate", "X-PAYMENT-RESPONSE", "PAYMENT-RESPONSE")
INTERNAL = "/api/internal/facilitator"
SECRET = "conformance-internal-secret-0123456789abcdef"
ASSET_KEY = "conformance-asset-key"


def asset_path(path: str, asset_id: str = "solana") -> str:
    return TOKENS + path.replace(":assetId", asset_id)


def paid_path(cluster: str, provider: str, surface: str, method: str) -> str:
    return f"/v1/x402/solana/{cluster}/{provider}/{surface}/{method}"


def mints(count: int, offset: int = 0) -> list[str]:
    """``count`` distinct valid Solana addresses."""
    return [str(Keypair.from_seed(bytes([offset + i + 1]) * 32).pubkey()) for i in range(count)]


# --- one gateway with every group configured --------------------------------------------------------


@dataclass
class Gateway:
    running: RunningGateway
    providers: Upstream
    assets: Upstream
    http: aiohttp.ClientSession

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        all_headers = dict(headers or {})
        if data is not None:
            all_headers.setdefault("content-type", "application/json")
        url = URL(self.running.url + target, encoded=True)
        async with self.http.request(method, url, data=data, headers=all_headers) as response:
            return Reply(response.status, response.headers, await response.read())

    async def signed_in(self, method: str, target: str, body: Any = None) -> tuple[Reply, Reply]:
        """The unsigned 402, then the same request signed in with a fresh wallet."""
        first = await self.request(method, target, body=body)
        assert first.status == 402, first.body
        challenge = first.json()["extensions"]["sign-in-with-x"]
        header = sign_in(challenge, Keypair(), request_url=self.running.url + target)
        return first, await self.request(method, target, body=body, headers={"sign-in-with-x": header})


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    providers, assets = Upstream(), Upstream()
    await providers.start()
    await assets.start()
    assets.responder = static(200, {"items": [], "sample": True})
    env = {
        "ROUTE_GROUPS": "all",
        "FACILITATOR_URL": "internal",
        "FACILITATOR_WALLET_BASE58": base58.b58encode(bytes(Keypair())).decode(),
        "INTERNAL_SETTLEMENT_SECRET": SECRET,
        "X402_PAY_TO_WALLET": str(Keypair().pubkey()),
        "PROVIDER_A_MAINNET_RPC_URL": f"{providers.url}/a/mainnet",
        "PROVIDER_A_DEVNET_RPC_URL": f"{providers.url}/a/devnet",
        "PROVIDER_B_MAINNET_RPC_URL": f"{providers.url}/b/mainnet",
        "PROVIDER_B_DEVNET_RPC_URL": f"{providers.url}/b/devnet",
        "ASSET_API_BASE_URL": assets.url,
        "ASSET_API_KEY": ASSET_KEY,
        "SIWX_SECRET": "conformance-siwx-secret-0123456789abcdef",
        "RATE_LIMIT_TOKENS_PER_MINUTE": "1000000",
        "RATE_LIMIT_CHALLENGE_PER_MINUTE": "1000000",
        "RATE_LIMIT_RPC_RPS": "1000000",
        "RATE_LIMIT_DAS_RPS": "1000000",
        "LOG_LEVEL": "WARNING",
    }
    try:
        async with run_gateway(env) as running, aiohttp.ClientSession() as http:
            yield Gateway(running, providers, assets, http)
    finally:
        await providers.stop()
        await assets.stop()


@pytest.fixture
def fresh(gateway: Gateway) -> Gateway:
    """The module's gateway with the upstreams' records cleared for this test."""
    gateway.providers.calls.clear()
    gateway.assets.calls.clear()
    return gateway


# --- public service routes --------------------------------------------------------------------------


async def test_healthz_is_the_liveness_probe(fresh: Gateway) -> None:
    answer = await fresh.request("GET", "/healthz")

    assert answer.status == 200
    body = answer.json()
    assert (body["ok"], body["status"]) == (True, "healthy")
    assert isinstance(body["service"], str) and body["service"]


async def test_catalog_lists_every_sold_route_with_access_price_and_schemas(fresh: Gateway) -> None:
    answer = await fresh.request("GET", "/v1/catalog")

    assert answer.status == 200
    routes = answer.json()["routes"]
    paths = {entry["path"] for entry in routes}
    expected = {paid_path(c, p, "rpc", m) for c in CLUSTERS for p in PROVIDERS for m in RPC_METHODS}
    expected |= {paid_path(c, p, "das", m) for c, p in DAS_OFFERED for m in DAS_METHODS}
    expected |= {TOKENS + path.replace(":assetId", "{assetId}") for _, _, path in ASSET_ROUTES}
    assert expected <= paths
    assert not any(path.startswith(INTERNAL) for path in paths)  # absent from the catalog
    for entry in routes:
        assert {"access", "price", "inputSchema", "outputSchema"} <= set(entry), entry["path"]


@pytest.mark.parametrize("provider", ["provider_a", "provider_b", "tokens"])
async def test_catalog_filter_by_provider(fresh: Gateway, provider: str) -> None:
    answer = await fresh.request("GET", f"/v1/catalog?provider={provider}")

    assert answer.status == 200
    paths = [entry["path"] for entry in answer.json()["routes"]]
    assert paths
    segment = f"/{provider}/" if provider != "tokens" else "/v1/x402/tokens/"
    assert all(segment in path for path in paths)


async def test_catalog_filter_outside_the_three_values_is_refused(fresh: Gateway) -> None:
    answer = await fresh.request("GET", "/v1/catalog?provider=provider_c")

    assert answer.status == 400
    assert answer.json()["ok"] is False


# --- paid Solana routes: every route, a 402 challenge even for an empty-body probe -------------------

PAID_ROUTES = [
    *((c, p, "rpc", m) for c in CLUSTERS for p in PROVIDERS for m in RPC_METHODS),
    *((c, p, "das", m) for c, p in sorted(DAS_OFFERED) for m in DAS_METHODS),
]


@pytest.mark.parametrize(("cluster", "provider", "surface", "method"), PAID_ROUTES)
async def test_every_paid_route_challenges_an_empty_body_probe(
    fresh: Gateway, cluster: str, provider: str, surface: str, method: str
) -> None:
    path = paid_path(cluster, provider, surface, method)

    answer = await fresh.request("POST", path)

    assert answer.status == 402, answer.body
    accepted = answer.json()["accepts"][0]
    assert accepted["scheme"] == "exact"
    assert accepted["network"] == SOLANA_MAINNET
    assert accepted["asset"] == USDC
    assert int(accepted["maxAmountRequired"]) > 0
    assert accepted["payTo"] == fresh.running.settings.pay_to
    assert accepted["facilitator"]["url"]
    # "The envelope also advertises the route's input and output schemas, price and asset."
    schemas = accepted["outputSchema"]
    assert schemas["input"]["properties"]["params"] and schemas["output"]
    assert fresh.providers.calls == []


async def test_a_paid_challenge_price_is_the_catalog_price(fresh: Gateway) -> None:
    catalog = (await fresh.request("GET", "/v1/catalog?provider=provider_b")).json()["routes"]
    for entry in catalog:
        answer = await fresh.request("POST", entry["path"], body={"params": []})
        assert answer.json()["accepts"][0]["maxAmountRequired"] == entry["price"]["microUsdc"], entry["path"]
        # The price is the provider's part plus the settling facilitator's fee, both published.
        parts = entry["priceParts"]
        total = int(parts["provider"]["microUsdc"]) + int(parts["settlementFee"]["microUsdc"])
        assert str(total) == entry["price"]["microUsdc"], entry["path"]


@pytest.mark.parametrize(
    "path",
    [
        paid_path("devnet", "provider_a", "das", "getAsset"),  # provider_a: DAS on mainnet only
        paid_path("testnet", "provider_a", "rpc", "getBalance"),
        paid_path("mainnet", "provider_c", "rpc", "getBalance"),
        paid_path("mainnet", "provider_a", "rpc", "sendTransaction"),
        paid_path("mainnet", "provider_a", "das", "getAssetProof"),
    ],
)
async def test_paths_outside_the_paid_tables_are_not_found(fresh: Gateway, path: str) -> None:
    answer = await fresh.request("POST", path, body={"params": []})

    assert answer.status == 404
    assert fresh.providers.calls == []


# --- asset-data routes: every route challenges, then every parameter rule ---------------------------


@pytest.mark.parametrize(("operation", "method", "path"), ASSET_ROUTES)
async def test_every_asset_data_route_challenges_for_a_sign_in(
    fresh: Gateway, operation: str, method: str, path: str
) -> None:
    target = asset_path(path)

    answer = await fresh.request(method, target, body={"mints": [MINT]} if method == "POST" else None)

    assert answer.status == 402
    extension = answer.json()["extensions"]["sign-in-with-x"]
    assert set(extension["networks"]) >= {SOLANA_MAINNET, SOLANA_DEVNET}
    assert extension["statement"]
    assert extension["expirationSeconds"] == 300
    assert extension["resource"] == fresh.running.url + target
    assert fresh.assets.calls == []


# The required parameters of each route, from its parameter table.
REQUIRED_QUERY = {
    "search": "?q=sol",
    "resolve": "?ref=sol",
    "curated": "?list=all",
    "variantMarkets": f"?mints={MINT}",
    "riskSummaryByMint": f"?mint={MINT}",
}


@pytest.mark.parametrize(("operation", "method", "path"), ASSET_ROUTES)
async def test_every_asset_data_route_answers_the_envelope_after_sign_in(
    fresh: Gateway, operation: str, method: str, path: str
) -> None:
    target = asset_path(path) + REQUIRED_QUERY.get(operation, "")

    _, answer = await fresh.signed_in(method, target, {"mints": [MINT]} if method == "POST" else None)

    assert answer.status == 200, answer.body
    assert answer.json() == {
        "ok": True,
        "provider": "tokens",
        "surface": "tokens",
        "method": operation,
        "result": {"items": [], "sample": True},
    }
    (call,) = fresh.assets.calls
    assert call.headers["x-api-key"] == ASSET_KEY
    assert ASSET_KEY.encode() not in answer.body


def q(path: str, **params: Any) -> str:
    return f"{path}?{urlencode(params)}" if params else path


M50 = ",".join(mints(50))
# (target, accepted?) for every rule of the parameter tables; bodies for market-snapshots below.
QUERY_RULES: list[tuple[str, bool]] = [
    # 2 search: q required non-empty, limit 1..50, category
    (q("/assets/search", q="sol"), True),
    (q("/assets/search", q="sol", limit=1), True),
    (q("/assets/search", q="sol", limit=50), True),
    (q("/assets/search", q="sol", category="defi"), True),
    (q("/assets/search"), False),
    (q("/assets/search", q=""), False),
    (q("/assets/search", q="sol", limit=0), False),
    (q("/assets/search", q="sol", limit=51), False),
    # 3 resolve: exactly one of ref or mint
    (q("/assets/resolve", ref="wrapped-sol"), True),
    (q("/assets/resolve", mint=MINT), True),
    (q("/assets/resolve", ref="sol", mint=MINT), False),
    (q("/assets/resolve"), False),
    # 4 curated: list required (section 2.7), groupBy asset or mint
    *((q("/assets/curated", list=name), True) for name in CURATED_LISTS),
    (q("/assets/curated", list="all", groupBy="asset"), True),
    (q("/assets/curated", list="all", groupBy="mint"), True),
    (q("/assets/curated"), False),
    (q("/assets/curated", list="bonds"), False),
    (q("/assets/curated", list="all", groupBy="chain"), False),
    # 6 variant-markets: mints or addresses, Solana addresses, at most 50 combined
    (q("/assets/variant-markets", mints=MINT), True),
    (q("/assets/variant-markets", addresses=MINT), True),
    (q("/assets/variant-markets", mints=",".join(mints(25)), addresses=",".join(mints(25, 30))), True),
    (q("/assets/variant-markets", mints=M50), True),
    (q("/assets/variant-markets", mints=",".join(mints(26)), addresses=",".join(mints(25, 30))), False),
    (q("/assets/variant-markets"), False),
    (q("/assets/variant-markets", mints="not-a-mint"), False),
    # 7 risk-summary by mint: mint required
    (q("/assets/risk-summary", mint=MINT), True),
    (q("/assets/risk-summary"), False),
    (q("/assets/risk-summary", mint="not-a-mint"), False),
    # 8 assetDetail
    (q("/assets/solana", include=",".join(INCLUDE)), True),
    *((q("/assets/solana", include=name), True) for name in INCLUDE),
    (q("/assets/solana", include="prices"), False),
    (q("/assets/solana", mint=MINT, variantsMode="all"), True),
    (q("/assets/solana", variantsMode="some"), False),
    *((q("/assets/solana", ohlcvInterval=interval), True) for interval in INTERVALS),
    (q("/assets/solana", ohlcvInterval="2H"), False),
    (q("/assets/solana", ohlcvFrom=0, ohlcvTo=0), True),
    (q("/assets/solana", ohlcvFrom=-1), False),
    (q("/assets/solana", ohlcvFrom=10, ohlcvTo=9), False),
    (q("/assets/solana", marketsOffset=0, marketsLimit=1), True),
    (q("/assets/solana", marketsOffset=10000, marketsLimit=50), True),
    (q("/assets/solana", marketsOffset=10001), False),
    (q("/assets/solana", marketsLimit=0), False),
    (q("/assets/solana", marketsLimit=51), False),
    (q(f"/assets/solana-{MINT}"), True),  # a singleton id solana-<mint>
    # 9 variants
    *((q("/assets/solana/variants", kind=kind), True) for kind in KINDS),
    (q("/assets/solana/variants", kind="meme"), False),
    *((q("/assets/solana/variants", liquidityTier=tier), True) for tier in ("tier1", "tier2", "tier3")),
    (q("/assets/solana/variants", liquidityTier="experimental"), False),
    *(
        (q("/assets/solana/variants", trustTier=tier), True)
        for tier in ("tier1", "tier2", "tier3", "experimental")
    ),
    (q("/assets/solana/variants", trustTier="tier4"), False),
    (q("/assets/solana/variants", mint=MINT, variantsMode="all"), True),
    (q("/assets/solana/variants", variantsMode="none"), False),
    # 10 variant-top-markets: offset 0..10000, limit 1..100
    (q("/assets/solana/variant-top-markets", offset=10000, limit=100, variantsMode="all"), True),
    (q("/assets/solana/variant-top-markets", offset=10001), False),
    (q("/assets/solana/variant-top-markets", limit=101), False),
    (q("/assets/solana/variant-top-markets", limit=0), False),
    # 11 variant-market: mint
    (q("/assets/solana/variant-market", mint=MINT), True),
    (q("/assets/solana/variant-market"), True),
    # 12 markets: mint, offset 0..10000, limit 1..50
    (q("/assets/solana/markets", mint=MINT, offset=0, limit=50), True),
    (q("/assets/solana/markets", limit=51), False),
    (q("/assets/solana/markets", offset=-1), False),
    # 13 ohlcv and 14 price-chart: mint, interval, from >= 0, to >= from
    *(
        (q(f"/assets/solana/{route}", interval=i), True)
        for route in ("ohlcv", "price-chart")
        for i in INTERVALS
    ),
    *(
        (q(f"/assets/solana/{route}", mint=MINT, **{"from": 5, "to": 5}), True)
        for route in ("ohlcv", "price-chart")
    ),
    *((q(f"/assets/solana/{route}", **{"from": 5, "to": 4}), False) for route in ("ohlcv", "price-chart")),
    *((q(f"/assets/solana/{route}", **{"from": -1}), False) for route in ("ohlcv", "price-chart")),
    *((q(f"/assets/solana/{route}", interval="1h"), False) for route in ("ohlcv", "price-chart")),
    # 15 profile: no query parameters
    (q("/assets/solana/profile"), True),
    # 16 tickers: offset 0..10000, limit 1..50, order
    (q("/assets/solana/tickers", offset=10000, limit=50, order="volume"), True),
    (q("/assets/solana/tickers", limit=51), False),
    (q("/assets/solana/tickers", offset=10001), False),
    # 17, 18, 19: mint
    *(
        (q(f"/assets/solana/{route}", mint=MINT), True)
        for route in ("risk-summary", "risk-details", "description")
    ),
    *(
        (q(f"/assets/solana/{route}", mint="x"), False)
        for route in ("risk-summary", "risk-details", "description")
    ),
    # asset ids: what an upstream canonical id can be; never traversal or a control character
    (q("/assets/Solana/profile"), True),
    (q("/assets/usd_coin/profile"), True),
    (q("/assets/wrapped.eth/profile"), True),
    ("/assets/sol%0A/profile", False),
    ("/assets/%2E%2E/profile", False),
]


@pytest.mark.parametrize(("target", "accepted"), QUERY_RULES, ids=[t for t, _ in QUERY_RULES])
async def test_asset_data_parameter_rules(fresh: Gateway, target: str, accepted: bool) -> None:
    first, answer = await fresh.signed_in("GET", TOKENS + target)

    assert first.status == 402  # the sign-in challenge comes before any parameter check
    if accepted:
        assert answer.status == 200, answer.body
        assert len(fresh.assets.calls) == 1
    else:
        assert answer.status == 400, answer.body
        assert answer.json()["ok"] is False
        assert fresh.assets.calls == []


BODY_RULES: list[tuple[str, Any, bool]] = [
    ("mints", {"mints": [MINT]}, True),
    ("addresses", {"addresses": [MINT]}, True),
    ("250-combined", {"mints": mints(125), "addresses": mints(125, 130)}, True),
    ("251-combined", {"mints": mints(126), "addresses": mints(125, 130)}, False),
    ("neither", {}, False),
    ("empty-lists", {"mints": [], "addresses": []}, False),
    ("empty-string", {"mints": [""]}, False),
    ("not-strings", {"mints": [1]}, False),
]


@pytest.mark.parametrize(("name", "body", "accepted"), BODY_RULES, ids=[n for n, _, _ in BODY_RULES])
async def test_market_snapshots_body_rules(fresh: Gateway, name: str, body: Any, accepted: bool) -> None:
    _, answer = await fresh.signed_in("POST", TOKENS + "/assets/market-snapshots", body)

    assert answer.status == (200 if accepted else 400), answer.body
    assert len(fresh.assets.calls) == (1 if accepted else 0)
    if accepted:
        assert fresh.assets.calls[0].json == body


# --- internal facilitator routes: 401 without the secret, before anything else ----------------------


@pytest.mark.parametrize(
    ("method", "route", "body"),
    [("GET", "supported", None), ("POST", "verify", b"{not json"), ("POST", "settle", b"\x00" * 10)],
)
@pytest.mark.parametrize("secret", [None, "wrong"], ids=["missing", "wrong"])
async def test_internal_routes_are_401_without_the_secret(
    fresh: Gateway, method: str, route: str, body: bytes | None, secret: str | None
) -> None:
    headers = {} if secret is None else {"x-gateway-internal-secret": secret}

    answer = await fresh.request(method, f"{INTERNAL}/{route}", body=body, headers=headers)

    assert answer.status == 401
    assert answer.json()["ok"] is False


async def test_internal_supported_lists_solana_mainnet_exact(fresh: Gateway) -> None:
    answer = await fresh.request(
        "GET", f"{INTERNAL}/supported", headers={"x-gateway-internal-secret": SECRET}
    )

    assert answer.status == 200
    kinds = answer.json()["kinds"]
    assert {"scheme": "exact", "network": SOLANA_MAINNET} in [
        {"scheme": k["scheme"], "network": k["network"]} for k in kinds
    ]


@pytest.mark.parametrize("secret", [SECRET, None], ids=["with-secret", "without"])
async def test_internal_supported_answers_head_like_get(fresh: Gateway, secret: str | None) -> None:
    headers = {} if secret is None else {"x-gateway-internal-secret": secret}
    get = await fresh.request("GET", f"{INTERNAL}/supported", headers=headers)

    head = await fresh.request("HEAD", f"{INTERNAL}/supported", headers=headers)

    assert head.status == get.status == (200 if secret else 401)
    assert head.body == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"] == str(len(get.body))


# --- CORS, OPTIONS, HEAD ------------------------------------------------------------------------------

PUBLIC_ROUTES = [
    ("GET", "/healthz"),
    ("GET", "/v1/catalog"),
    *(("POST", paid_path(c, p, s, m)) for c, p, s, m in PAID_ROUTES),
    *((method, asset_path(path)) for _, method, path in ASSET_ROUTES),
]


def _names(value: str) -> set[str]:
    return {item.strip().lower() for item in value.split(",") if item.strip()}


@pytest.mark.parametrize(("method", "path"), PUBLIC_ROUTES)
async def test_every_public_route_answers_the_cors_preflight(fresh: Gateway, method: str, path: str) -> None:
    answer = await fresh.request(
        "OPTIONS",
        path,
        headers={
            "origin": "https://app.example",
            "access-control-request-method": method,
            "access-control-request-headers": ", ".join(ALLOWED_REQUEST_HEADERS),
        },
    )

    assert answer.status in (200, 204)
    assert answer.headers["access-control-allow-origin"] == "*"
    assert {method.lower(), "options"} <= _names(answer.headers["access-control-allow-methods"])
    assert {h.lower() for h in ALLOWED_REQUEST_HEADERS} <= _names(
        answer.headers["access-control-allow-headers"]
    )
    assert fresh.providers.calls == [] and fresh.assets.calls == []


@pytest.mark.parametrize(("method", "path"), PUBLIC_ROUTES[:3] + PUBLIC_ROUTES[-3:])
async def test_responses_expose_the_payment_headers(fresh: Gateway, method: str, path: str) -> None:
    answer = await fresh.request(
        method,
        path,
        body={"mints": [MINT]} if method == "POST" else None,
        headers={"origin": "https://app.example"},
    )

    assert answer.headers["access-control-allow-origin"] == "*"
    assert {h.lower() for h in EXPOSED_HEADERS} <= _names(answer.headers["access-control-expose-headers"])


GET_ROUTES = [path for method, path in PUBLIC_ROUTES if method == "GET"]


@pytest.mark.parametrize("path", GET_ROUTES)
async def test_head_is_accepted_wherever_get_is_with_the_same_headers_and_no_body(
    fresh: Gateway, path: str
) -> None:
    get = await fresh.request("GET", path)

    head = await fresh.request("HEAD", path)

    assert head.status == get.status
    assert head.body == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert set(head.headers) == set(get.headers)
    assert fresh.assets.calls == []


# --- paid calls: both DAS forms, the settlement, the exits ------------------------------------------

DAS_GET_ASSET = paid_path("mainnet", "provider_a", "das", "getAsset")
DAS_BY_OWNER = paid_path("mainnet", "provider_b", "das", "getAssetsByOwner")
DAS_SEARCH = paid_path("devnet", "provider_b", "das", "searchAssets")


def _balances(chain: UsdcChain) -> tuple[int | None, int | None]:
    return chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)


async def _pay(paid: PaidGateway, path: str, body: Any) -> tuple[Any, int]:
    """Pay ``path`` its advertised price with ``body``; (the reply, the price)."""
    price = int((await paid.challenge(path, body)).json()["accepts"][0]["maxAmountRequired"])
    return await paid.pay(path, body, await paid.payment(path)), price


def _settled(reply: Any) -> str:
    receipt = json.loads(base64.b64decode(reply.headers["x-payment-response"]))
    assert receipt["success"] is True
    transaction: str = receipt["transaction"]
    return transaction


DAS_FORMS = [
    ("getAsset positional", DAS_GET_ASSET, [MINT], {"id": MINT}),
    ("getAsset named in the array", DAS_GET_ASSET, [{"id": MINT}], {"id": MINT}),
    ("getAsset bare object", DAS_GET_ASSET, {"id": MINT}, {"id": MINT}),
    (
        "getAsset display options",
        DAS_GET_ASSET,
        [MINT, {"showFungible": True, "showInscription": False}],
        {"id": MINT, "options": {"showFungible": True, "showInscription": False}},
    ),
    ("getAssetsByOwner positional owner", DAS_BY_OWNER, [OWNER], {"ownerAddress": OWNER, "limit": 100}),
    (
        "getAssetsByOwner positional in provider order",
        DAS_BY_OWNER,
        [OWNER, {"sortBy": "created", "sortDirection": "desc"}, 50, 2],
        {
            "ownerAddress": OWNER,
            "sortBy": {"sortBy": "created", "sortDirection": "desc"},
            "limit": 50,
            "page": 2,
        },
    ),
    (
        "getAssetsByOwner named with displayOptions",
        DAS_BY_OWNER,
        [{"ownerAddress": OWNER, "page": 1, "displayOptions": {"showFungible": True}}],
        {"ownerAddress": OWNER, "page": 1, "limit": 100, "options": {"showFungible": True}},
    ),
    (
        "searchAssets without a limit",
        DAS_SEARCH,
        {"ownerAddress": OWNER, "tokenType": "fungible"},
        {"ownerAddress": OWNER, "tokenType": "fungible", "limit": 100},
    ),
    (
        "searchAssets named in the array",
        DAS_SEARCH,
        [{"grouping": ["collection", MINT], "limit": 10, "cursor": "next"}],
        {"grouping": ["collection", MINT], "limit": 10, "cursor": "next"},
    ),
]


@pytest.mark.parametrize(("name", "path", "params", "forwarded"), DAS_FORMS, ids=[f[0] for f in DAS_FORMS])
async def test_das_params_in_either_form_are_sold_and_forwarded_named(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    name: str,
    path: str,
    params: Any,
    forwarded: dict[str, Any],
) -> None:
    paid = await start_paid_gateway(internal=True)
    before = _balances(usdc_chain)
    body = {"jsonrpc": "2.0", "id": "das-1", "method": path.rsplit("/", 1)[1], "params": params, "trace": "x"}

    reply, price = await _pay(paid, path, body)

    assert reply.status == 200, reply.body
    assert reply.json()["result"] == {"value": 1}
    assert _settled(reply)
    (call,) = paid.upstream.calls
    assert call.json == {
        "jsonrpc": "2.0",
        "id": "das-1",
        "method": path.rsplit("/", 1)[1],
        "params": forwarded,
    }
    assert _balances(usdc_chain) == (before[0] - price, before[1] + price)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("path", "params"),
    [
        (DAS_GET_ASSET, ["not-an-address"]),
        (DAS_GET_ASSET, {"id": "not-an-address"}),
        (DAS_BY_OWNER, [OWNER, None, 1001]),
        (DAS_BY_OWNER, {"ownerAddress": OWNER, "page": 0}),
        (DAS_SEARCH, {"limit": 1001}),
    ],
)
async def test_das_guardrails_refuse_either_form_and_charge_nothing(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, path: str, params: Any
) -> None:
    paid = await start_paid_gateway(internal=True)
    before = _balances(usdc_chain)

    reply = await paid.pay(path, {"params": params}, await paid.payment(path))

    assert reply.status == 400, reply.body
    assert reply.json()["error"]["code"] == "invalid_request"
    assert paid.upstream_calls == 0
    assert _balances(usdc_chain) == before


async def test_paid_rpc_success_returns_the_provider_json_and_the_settlement_hash(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await start_paid_gateway(internal=True)
    path = paid_path("devnet", "provider_b", "rpc", "getBalance")
    before = _balances(usdc_chain)

    reply, price = await _pay(
        paid, path, {"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [OWNER]}
    )

    assert reply.status == 200
    assert reply.json() == {"jsonrpc": "2.0", "id": 1, "result": {"value": 1}}
    assert _settled(reply) == paid.rpc.sent[-1]
    assert _balances(usdc_chain) == (before[0] - price, before[1] + price)  # type: ignore[operator]


async def test_upstream_failure_settles_nothing_and_charges_nothing(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await start_paid_gateway(internal=True)
    paid.upstream.responder = static(500, {"error": "down"})
    before = _balances(usdc_chain)
    sent = len(paid.rpc.sent)

    reply, _ = await _pay(paid, DAS_GET_ASSET, {"params": [MINT]})

    assert reply.status >= 500
    assert "x-payment-response" not in reply.headers
    assert len(paid.rpc.sent) == sent
    assert _balances(usdc_chain) == before


async def test_a_reused_payment_authorization_is_rejected(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await start_paid_gateway(internal=True)
    payment = await paid.payment(DAS_GET_ASSET)
    assert (await paid.pay(DAS_GET_ASSET, {"params": [MINT]}, payment)).status == 200
    after_first = _balances(usdc_chain)

    reply = await paid.pay(DAS_GET_ASSET, {"params": [MINT], "id": "another"}, payment)

    assert reply.status == 402
    assert reply.json()["error"]
    assert paid.upstream_calls == 1
    assert _balances(usdc_chain) == after_first


async def test_a_self_transfer_is_rejected(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    paid = await start_paid_gateway(internal=True, env={"X402_PAY_TO_WALLET": str(usdc_chain.payer.pubkey())})
    before = _balances(usdc_chain)

    reply = await paid.pay(DAS_GET_ASSET, {"params": [MINT]}, await paid.payment(DAS_GET_ASSET))

    assert reply.status == 402
    assert reply.json()["error"]
    assert paid.upstream_calls == 0
    assert _balances(usdc_chain) == before


async def test_a_reused_sign_in_session_is_rejected(fresh: Gateway) -> None:
    target = asset_path("/assets/:assetId/profile")
    first = await fresh.request("GET", target)
    header = sign_in(
        first.json()["extensions"]["sign-in-with-x"], Keypair(), request_url=fresh.running.url + target
    )
    assert (await fresh.request("GET", target, headers={"sign-in-with-x": header})).status == 200

    again = await fresh.request("GET", target, headers={"sign-in-with-x": header})

    assert again.status == 402
    assert again.json()["error"]
    assert len(fresh.assets.calls) == 1
