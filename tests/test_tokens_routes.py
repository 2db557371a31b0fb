"""The asset-data routes behind sign-in-with-x, end to end: the real gateway under hypercorn, a
recording loopback asset-data upstream, wallets with real ed25519 keys, and the reference x402
client.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from nacl.signing import SigningKey
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from yarl import URL

from client.siwx_signer import Signer, sign_in, sign_payload, signer_address
from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.routing.routes import RateLimitSpec, RouteSpec, load_routes, named_limits
from gateway.store.upstash import UpstashStore
from gateway.x402.headers import encode_header
from gateway.x402.siwx import SiwxIssuer
from gateway.x402.types import SOLANA_DEVNET, SOLANA_MAINNET, SiwxExtension
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.paid_fixtures import Reply
from tests.support.ports import refusing_port
from tests.support.upstash_rest import UpstashRestServer
from tests.support.upstream import ASSET_API_KEY, Upstream, static

SIWX_SECRET = "siwx-test-secret-0123456789abcdef-0123"
PREFIX = "/v1/x402/tokens"
MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
SOL_MINT = "So11111111111111111111111111111111111111112"
WALLET = Keypair()
NACL_WALLET = SigningKey.generate()
TIMEOUT_S = 0.5
MAX_BODY = 16384  # 250 mints fit; the 413 case is larger
LIMITS = named_limits(Settings(base_url="https://gw.example.com"))
"""The named limits at their defaults (rpc 50/s, das 10/s, tokens 30/min, challenge 120/min, wallet 5/s)."""


def _env(api_url: str, **extra: str) -> dict[str, str]:
    return {
        "ROUTE_GROUPS": "tokens",
        "ASSET_API_BASE_URL": api_url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": SIWX_SECRET,
        "UPSTREAM_TIMEOUT_SECONDS": str(TIMEOUT_S),
        "MAX_BODY_BYTES": str(MAX_BODY),
        "RATE_LIMIT_TOKENS_PER_MINUTE": "100000",
        "RATE_LIMIT_CHALLENGE_PER_MINUTE": "100000",
        **extra,
    }


def _mints(n: int) -> list[str]:
    return [str(Pubkey.new_unique()) for _ in range(n)]


# --- fixtures: one gateway and one upstream for the module; small ones for limits -----------


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gw(asset_api_server: Upstream) -> AsyncIterator[RunningGateway]:
    async with run_gateway(_env(asset_api_server.url)) as gateway:
        yield gateway


# --- a client that signs in the way a wallet does -------------------------------------------


async def send(
    http: aiohttp.ClientSession,
    gw: RunningGateway,
    method: str,
    target: str,
    *,
    body: Any = None,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Reply:
    """One request, the target sent byte for byte (no client-side path normalisation)."""
    data = raw if raw is not None else (msgspec.json.encode(body) if body is not None else None)
    all_headers = dict(headers or {})
    if data is not None:
        all_headers.setdefault("content-type", "application/json")
    url = URL(gw.url + target, encoded=True)
    async with http.request(method, url, data=data, headers=all_headers) as response:
        return Reply(response.status, response.headers, await response.read())


async def challenge(
    http: aiohttp.ClientSession, gw: RunningGateway, target: str, method: str = "GET", **kwargs: Any
) -> SiwxExtension:
    reply = await send(http, gw, method, target, **kwargs)
    assert reply.status == 402, reply.body
    return msgspec.convert(reply.json()["extensions"]["sign-in-with-x"], SiwxExtension)


async def call(
    http: aiohttp.ClientSession,
    gw: RunningGateway,
    method: str,
    target: str,
    *,
    signer: Signer = WALLET,
    chain: str | None = None,
    headers: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Reply:
    """Request, answer the 402 by signing its challenge, retry with SIGN-IN-WITH-X."""
    first = await send(http, gw, method, target, headers=headers, **kwargs)
    if first.status != 402:
        return first
    ext = first.json()["extensions"]["sign-in-with-x"]
    signed = sign_in(ext, signer, chain, request_url=gw.url + target)
    return await send(
        http, gw, method, target, headers={**(headers or {}), "sign-in-with-x": signed}, **kwargs
    )


def assert_error(reply: Reply, status: int, code: str) -> dict[str, Any]:
    assert reply.status == status, reply.body
    body = reply.json()
    assert body["ok"] is False
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str)
    error: dict[str, Any] = body["error"]
    return error


def assert_sign_in_challenge(
    reply: Reply, gw: RunningGateway, path: str, error: str | None = None
) -> dict[str, Any]:
    """A 402 carrying a fresh sign-in challenge for ``path``; ``error`` is the refusal reason."""
    assert reply.status == 402, reply.body
    body: dict[str, Any] = reply.json()
    assert body.get("error") == error
    assert body["x402Version"] == 2
    assert body["accepts"] == []
    url = gw.url + path
    assert body["resource"]["url"] == url
    ext = body["extensions"]["sign-in-with-x"]
    assert ext["info"]["uri"] == url
    assert ext["resource"] == url
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["content-type"] == "application/json"
    assert msgspec.json.decode(base64.b64decode(reply.headers["payment-required"])) == body
    return body


# --- all nineteen operations ----------------------------------------------------------------

OPERATIONS: list[tuple[str, str, str, Any, str, dict[str, str]]] = [
    ("health", "GET", "/health", None, "/v1/health", {}),
    (
        "search",
        "GET",
        "/assets/search?q=wrapped%20sol&limit=5&category=defi",
        None,
        "/v1/assets/search",
        {"q": "wrapped sol", "limit": "5", "category": "defi"},
    ),
    ("resolve", "GET", f"/assets/resolve?mint={MINT}", None, "/v1/assets/resolve", {"mint": MINT}),
    (
        "curated",
        "GET",
        "/assets/curated?list=majors&groupBy=mint",
        None,
        "/v1/assets/curated",
        {"list": "majors", "groupBy": "mint"},
    ),
    (
        "marketSnapshots",
        "POST",
        "/assets/market-snapshots",
        {"mints": [MINT], "addresses": [SOL_MINT]},
        "/v1/assets/market-snapshots",
        {},
    ),
    (
        "variantMarkets",
        "GET",
        f"/assets/variant-markets?mints={MINT},{SOL_MINT}&addresses={MINT}",
        None,
        "/v1/assets/variant-markets",
        {"mints": f"{MINT},{SOL_MINT}", "addresses": MINT},
    ),
    (
        "riskSummaryByMint",
        "GET",
        f"/assets/risk-summary?mint={MINT}",
        None,
        "/v1/assets/risk-summary",
        {"mint": MINT},
    ),
    (
        "assetDetail",
        "GET",
        "/assets/solana?include=profile,risk,ohlcv,markets&ohlcvInterval=1H&ohlcvFrom=10&ohlcvTo=20"
        f"&marketsOffset=0&marketsLimit=50&variantsMode=all&mint={SOL_MINT}",
        None,
        "/v1/assets/solana",
        {
            "include": "profile,risk,ohlcv,markets",
            "ohlcvInterval": "1H",
            "ohlcvFrom": "10",
            "ohlcvTo": "20",
            "marketsOffset": "0",
            "marketsLimit": "50",
            "variantsMode": "all",
            "mint": SOL_MINT,
        },
    ),
    (
        "variants",
        "GET",
        f"/assets/solana/variants?kind=lst&liquidityTier=tier1&trustTier=experimental&mint={MINT}&variantsMode=all",
        None,
        "/v1/assets/solana/variants",
        {
            "kind": "lst",
            "liquidityTier": "tier1",
            "trustTier": "experimental",
            "mint": MINT,
            "variantsMode": "all",
        },
    ),
    (
        "variantTopMarkets",
        "GET",
        "/assets/solana/variant-top-markets?offset=10000&limit=100&variantsMode=all",
        None,
        "/v1/assets/solana/variant-top-markets",
        {"offset": "10000", "limit": "100", "variantsMode": "all"},
    ),
    (
        "variantMarket",
        "GET",
        f"/assets/solana-{MINT}/variant-market?mint={MINT}",
        None,
        f"/v1/assets/solana-{MINT}/variant-market",
        {"mint": MINT},
    ),
    (
        "markets",
        "GET",
        f"/assets/usd-coin/markets?mint={MINT}&offset=0&limit=1",
        None,
        "/v1/assets/usd-coin/markets",
        {"mint": MINT, "offset": "0", "limit": "1"},
    ),
    (
        "ohlcv",
        "GET",
        "/assets/solana/ohlcv?interval=1D&from=0&to=100",
        None,
        "/v1/assets/solana/ohlcv",
        {"interval": "1D", "from": "0", "to": "100"},
    ),
    (
        "priceChart",
        "GET",
        f"/assets/solana/price-chart?interval=1W&from=5&to=5&mint={MINT}",
        None,
        "/v1/assets/solana/price-chart",
        {"interval": "1W", "from": "5", "to": "5", "mint": MINT},
    ),
    ("profile", "GET", "/assets/solana/profile", None, "/v1/assets/solana/profile", {}),
    (
        "tickers",
        "GET",
        "/assets/solana/tickers?offset=1&limit=2&order=volume_desc",
        None,
        "/v1/assets/solana/tickers",
        {"offset": "1", "limit": "2", "order": "volume_desc"},
    ),
    (
        "riskSummary",
        "GET",
        f"/assets/solana/risk-summary?mint={MINT}",
        None,
        "/v1/assets/solana/risk-summary",
        {"mint": MINT},
    ),
    ("riskDetails", "GET", "/assets/solana/risk-details", None, "/v1/assets/solana/risk-details", {}),
    (
        "description",
        "GET",
        f"/assets/solana/description?mint={MINT}",
        None,
        "/v1/assets/solana/description",
        {"mint": MINT},
    ),
]


def test_the_table_covers_all_nineteen_operations() -> None:
    assert len({op for op, *_ in OPERATIONS}) == 19


@pytest.mark.parametrize(("operation", "method", "target", "body", "upstream_path", "query"), OPERATIONS)
async def test_operation_proxies_to_the_upstream_in_the_envelope(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    asset_api: Upstream,
    operation: str,
    method: str,
    target: str,
    body: Any,
    upstream_path: str,
    query: dict[str, str],
) -> None:
    reply = await call(http, gw, method, PREFIX + target, body=body)
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "ok": True,
        "provider": "tokens",
        "surface": "tokens",
        "method": operation,
        "result": {"path": upstream_path, "items": [1, 2]},
    }
    [sent] = asset_api.calls
    assert (sent.method, sent.path, sent.query) == (method, upstream_path, query)
    assert sent.headers["x-api-key"] == ASSET_API_KEY
    assert sent.json == body


async def test_only_the_key_and_accept_reach_the_upstream(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    reply = await call(
        http,
        gw,
        "GET",
        f"{PREFIX}/assets/search?q=sol",
        headers={
            "accept": "application/json;q=0.9",
            "authorization": "Bearer client-token",
            "cookie": "session=client",
            "x-api-key": "client-chosen-key",
            "x-forwarded-for": "203.0.113.9",
            "user-agent": "client-agent",
            "x-custom": "1",
        },
    )
    assert reply.status == 200, reply.body
    sent = {k.lower(): v for k, v in asset_api.calls[0].headers.items()}
    assert sent["x-api-key"] == ASSET_API_KEY
    assert sent["accept"] == "application/json;q=0.9"
    assert sent["user-agent"] != "client-agent"
    assert set(sent) <= {"host", "x-api-key", "accept", "accept-encoding", "user-agent", "content-length"}


async def test_the_signed_in_wallet_is_logged_and_the_key_is_not(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, log_lines: list[str]
) -> None:
    reply = await call(
        http, gw, "GET", f"{PREFIX}/assets/solana/profile", signer=NACL_WALLET, chain=SOLANA_DEVNET
    )
    assert reply.status == 200, reply.body
    [line] = [msgspec.json.decode(x) for x in log_lines if '"status":200' in x]
    assert line["route"] == "tokens.profile"
    assert line["wallet"] == signer_address(NACL_WALLET)
    assert line["outcome"] == "signed_in"
    assert all(ASSET_API_KEY not in x for x in log_lines)


# --- every row of the parameter tables: a passing and a failing case ------------------------

_25, _26 = ",".join(_mints(25)), ",".join(_mints(26))
_51 = ",".join(_mints(51))

PARAMETER_CASES: list[tuple[str, str | None]] = [
    # health: no parameters
    ("/health?x=1", "x"),
    # search
    ("/assets/search?q=sol", None),
    ("/assets/search", "q"),
    ("/assets/search?q=", "q"),
    ("/assets/search?q=sol&limit=1", None),
    ("/assets/search?q=sol&limit=50", None),
    ("/assets/search?q=sol&limit=0", "limit"),
    ("/assets/search?q=sol&limit=51", "limit"),
    ("/assets/search?q=sol&limit=ten", "limit"),
    ("/assets/search?q=sol&category=defi", None),
    ("/assets/search?q=sol&category=", "category"),
    # resolve: exactly one of ref and mint
    ("/assets/resolve?ref=wsol", None),
    (f"/assets/resolve?mint={MINT}", None),
    (f"/assets/resolve?ref=wsol&mint={MINT}", "ref"),
    ("/assets/resolve", "ref"),
    ("/assets/resolve?mint=not-a-mint", "mint"),
    # curated
    ("/assets/curated?list=all", None),
    ("/assets/curated", "list"),
    ("/assets/curated?list=bonds", "list"),
    ("/assets/curated?list=majors&groupBy=asset", None),
    ("/assets/curated?list=majors&groupBy=chain", "groupBy"),
    # variant-markets: comma lists, at most 50 combined
    (f"/assets/variant-markets?mints={MINT}", None),
    (f"/assets/variant-markets?addresses={MINT}", None),
    (f"/assets/variant-markets?mints={_25}&addresses={_25}", None),
    (f"/assets/variant-markets?mints={_26}&addresses={_25}", "mints"),
    (f"/assets/variant-markets?mints={_51}", "mints"),
    ("/assets/variant-markets", "mints"),
    (f"/assets/variant-markets?mints={MINT},,{SOL_MINT}", "mints"),
    (f"/assets/variant-markets?addresses={MINT},bad", "addresses[1]"),
    # risk-summary by mint
    (f"/assets/risk-summary?mint={MINT}", None),
    ("/assets/risk-summary", "mint"),
    ("/assets/risk-summary?mint=0OIl", "mint"),
    # assetDetail
    ("/assets/solana", None),
    (f"/assets/solana-{MINT}", None),
    ("/assets/SOLANA", None),
    ("/assets/usd_coin", None),
    ("/assets/wrapped.eth", None),
    ("/assets/-solana", None),
    ("/assets/sol%20ana", "assetId"),
    ("/assets/sol%0A", "assetId"),
    ("/assets/sol%00", "assetId"),
    (f"/assets/{'a' * 129}", "assetId"),
    ("/assets/solana?include=profile,markets", None),
    ("/assets/solana?include=profile,prices", "include[1]"),
    ("/assets/solana?include=", "include"),
    (f"/assets/solana?mint={MINT}", None),
    ("/assets/solana?mint=x", "mint"),
    ("/assets/solana?variantsMode=all", None),
    ("/assets/solana?variantsMode=some", "variantsMode"),
    ("/assets/solana?ohlcvInterval=4H", None),
    ("/assets/solana?ohlcvInterval=4h", "ohlcvInterval"),
    ("/assets/solana?ohlcvFrom=0", None),
    ("/assets/solana?ohlcvFrom=-1", "ohlcvFrom"),
    ("/assets/solana?ohlcvFrom=7&ohlcvTo=7", None),
    ("/assets/solana?ohlcvFrom=7&ohlcvTo=6", "ohlcvTo"),
    ("/assets/solana?ohlcvTo=-1", "ohlcvTo"),
    ("/assets/solana?marketsOffset=10000", None),
    ("/assets/solana?marketsOffset=10001", "marketsOffset"),
    ("/assets/solana?marketsOffset=-1", "marketsOffset"),
    ("/assets/solana?marketsLimit=1", None),
    ("/assets/solana?marketsLimit=0", "marketsLimit"),
    ("/assets/solana?marketsLimit=51", "marketsLimit"),
    # variants
    ("/assets/solana/variants?kind=tokenized_equity", None),
    ("/assets/solana/variants?kind=meme", "kind"),
    ("/assets/solana/variants?liquidityTier=tier3", None),
    ("/assets/solana/variants?liquidityTier=experimental", "liquidityTier"),
    ("/assets/solana/variants?trustTier=experimental", None),
    ("/assets/solana/variants?trustTier=tier4", "trustTier"),
    (f"/assets/solana/variants?mint={MINT}", None),
    ("/assets/solana/variants?mint=", "mint"),
    ("/assets/solana/variants?variantsMode=all", None),
    ("/assets/solana/variants?variantsMode=none", "variantsMode"),
    ("/assets/Solana/variants", None),
    ("/assets/sol%7Fana/variants", "assetId"),
    # variant-top-markets
    ("/assets/solana/variant-top-markets?offset=0", None),
    ("/assets/solana/variant-top-markets?offset=10001", "offset"),
    ("/assets/solana/variant-top-markets?limit=100", None),
    ("/assets/solana/variant-top-markets?limit=101", "limit"),
    ("/assets/solana/variant-top-markets?limit=0", "limit"),
    ("/assets/solana/variant-top-markets?variantsMode=all", None),
    ("/assets/solana/variant-top-markets?variantsMode=ALL", "variantsMode"),
    # variant-market
    (f"/assets/solana/variant-market?mint={MINT}", None),
    ("/assets/solana/variant-market?mint=abc", "mint"),
    ("/assets/solana/variant-market?limit=1", "limit"),
    # markets
    (f"/assets/solana/markets?mint={MINT}", None),
    ("/assets/solana/markets?mint=l" + "1" * 40, "mint"),
    ("/assets/solana/markets?offset=10000", None),
    ("/assets/solana/markets?offset=10001", "offset"),
    ("/assets/solana/markets?limit=50", None),
    ("/assets/solana/markets?limit=51", "limit"),
    # ohlcv and price-chart share their parameters
    *[
        case
        for sub in ("ohlcv", "price-chart")
        for case in [
            (f"/assets/solana/{sub}?mint={MINT}", None),
            (f"/assets/solana/{sub}?mint=abc", "mint"),
            (f"/assets/solana/{sub}?interval=15m", None),
            (f"/assets/solana/{sub}?interval=30m", "interval"),
            (f"/assets/solana/{sub}?from=0", None),
            (f"/assets/solana/{sub}?from=-5", "from"),
            (f"/assets/solana/{sub}?from=1.5", "from"),
            (f"/assets/solana/{sub}?from=100&to=100", None),
            (f"/assets/solana/{sub}?from=100&to=99", "to"),
            (f"/assets/solana/{sub}?to=-1", "to"),
        ]
    ],
    # profile: no query parameters
    ("/assets/solana/profile", None),
    ("/assets/solana/profile?mint=x", "mint"),
    # tickers
    ("/assets/solana/tickers?offset=10000", None),
    ("/assets/solana/tickers?offset=10001", "offset"),
    ("/assets/solana/tickers?limit=50", None),
    ("/assets/solana/tickers?limit=51", "limit"),
    ("/assets/solana/tickers?order=volume:desc", None),
    ("/assets/solana/tickers?order=volume%20desc", "order"),
    # risk-summary, risk-details, description: an optional mint
    *[
        case
        for sub in ("risk-summary", "risk-details", "description")
        for case in [(f"/assets/solana/{sub}?mint={MINT}", None), (f"/assets/solana/{sub}?mint=bad", "mint")]
    ],
    # any route: a parameter given twice, an unknown parameter
    ("/assets/search?q=sol&q=eth", "q"),
    ("/assets/search?q=sol&limit=1&limit=2", "limit"),
    ("/assets/search?q=sol&sort=asc", "sort"),
    ("/assets/solana/tickers?page=2", "page"),
]


@pytest.mark.parametrize(("target", "parameter"), PARAMETER_CASES)
async def test_query_and_path_parameters(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, target: str, parameter: str | None
) -> None:
    reply = await call(http, gw, "GET", PREFIX + target)
    if parameter is None:
        assert reply.status == 200, reply.body
        assert len(asset_api.calls) == 1
        return
    error = assert_error(reply, 400, "invalid_request")
    assert error["details"] == {"parameter": parameter}
    assert parameter.split("[")[0] in error["message"]
    assert asset_api.calls == []


ENUMS: dict[str, tuple[list[str], str]] = {
    "include": (["profile", "risk", "ohlcv", "markets"], "/assets/solana?include={}"),
    "interval": (["1m", "5m", "15m", "1H", "4H", "1D", "1W"], "/assets/solana/ohlcv?interval={}"),
    "ohlcvInterval": (["1m", "5m", "15m", "1H", "4H", "1D", "1W"], "/assets/solana?ohlcvInterval={}"),
    "kind": (
        [
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
        ],
        "/assets/solana/variants?kind={}",
    ),
    "liquidityTier": (["tier1", "tier2", "tier3"], "/assets/solana/variants?liquidityTier={}"),
    "trustTier": (["tier1", "tier2", "tier3", "experimental"], "/assets/solana/variants?trustTier={}"),
    "list": (
        ["all", "majors", "lsts", "currencies", "rwas", "etfs", "metals", "stocks"],
        "/assets/curated?list={}",
    ),
    "groupBy": (["asset", "mint"], "/assets/curated?list=all&groupBy={}"),
    "variantsMode": (["all"], "/assets/solana/variant-top-markets?variantsMode={}"),
}


@pytest.mark.parametrize(
    ("target", "value"),
    [(template.format(v), v) for values, template in ENUMS.values() for v in values],
)
async def test_every_enumerated_value_of_spec_2_7_is_accepted(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, target: str, value: str
) -> None:
    reply = await call(http, gw, "GET", PREFIX + target)
    assert reply.status == 200, reply.body
    assert value in asset_api.calls[0].query.values()


@pytest.mark.parametrize("name", sorted(ENUMS))
async def test_a_value_outside_each_enumeration_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, name: str
) -> None:
    reply = await call(http, gw, "GET", PREFIX + ENUMS[name][1].format("1Y"))
    error = assert_error(reply, 400, "invalid_request")
    assert error["details"]["parameter"].split("[")[0] == name
    assert asset_api.calls == []


BODY_CASES: list[tuple[Any, str | None]] = [
    ({"mints": [MINT]}, None),
    ({"addresses": [MINT]}, None),
    ({"mints": _mints(125), "addresses": _mints(125)}, None),
    ({"mints": _mints(250)}, None),
    ({"mints": _mints(126), "addresses": _mints(125)}, "mints"),
    ({"addresses": _mints(251)}, "addresses"),
    ({}, "mints"),
    ({"mints": []}, "mints"),
    ({"mints": [MINT, ""]}, "mints[1]"),
    ({"mints": MINT}, "mints"),
    ({"addresses": [7]}, "addresses[0]"),
    ({"mints": [MINT], "extra": True}, "extra"),
    ([MINT], "body"),
    (b"{not json", "body"),
    (b"", "body"),
]


@pytest.mark.parametrize(("body", "parameter"), BODY_CASES)
async def test_market_snapshots_body(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, body: Any, parameter: str | None
) -> None:
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    reply = await call(http, gw, "POST", f"{PREFIX}/assets/market-snapshots", raw=raw)
    if parameter is None:
        assert reply.status == 200, reply.body
        assert asset_api.calls[0].json == body
        return
    error = assert_error(reply, 400, "invalid_request")
    assert error["details"] == {"parameter": parameter}
    assert asset_api.calls == []


async def test_a_body_over_the_limit_is_413_after_sign_in(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    body = {"mints": [MINT] * (MAX_BODY // len(MINT) + 1)}
    reply = await call(http, gw, "POST", f"{PREFIX}/assets/market-snapshots", body=body)
    assert_error(reply, 413, "body_too_large")
    assert asset_api.calls == []


# --- sign-in comes first, and every refusal is a 402 with a fresh challenge -----------------


@pytest.mark.parametrize(
    ("method", "target", "kwargs"),
    [
        ("GET", "/assets/search?limit=0&bogus=1", {}),
        ("GET", "/assets/NOT-AN-ID/ohlcv?from=9&to=1", {}),
        ("POST", "/assets/market-snapshots", {"raw": b"{broken"}),
        ("POST", "/assets/market-snapshots", {"raw": b"x" * (MAX_BODY * 2)}),
    ],
)
async def test_without_sign_in_bad_input_still_gets_the_challenge(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    asset_api: Upstream,
    method: str,
    target: str,
    kwargs: Any,
) -> None:
    reply = await send(http, gw, method, PREFIX + target, **kwargs)
    assert_sign_in_challenge(reply, gw, PREFIX + target.split("?")[0])
    assert reply.headers["access-control-allow-origin"] == "*"
    assert "PAYMENT-REQUIRED" in reply.headers["access-control-expose-headers"]
    assert asset_api.calls == []


async def test_challenge_carries_the_spec_summary_and_decodes_with_the_reference_sdk(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    from x402.extensions.sign_in_with_x import SIWxExtension
    from x402.http.utils import decode_payment_required_header
    from x402.schemas import PaymentRequired

    path = f"{PREFIX}/assets/search"
    reply = await send(http, gw, "GET", path + "?q=sol")
    body = assert_sign_in_challenge(reply, gw, path)
    ext = body["extensions"]["sign-in-with-x"]
    assert ext["networks"] == [SOLANA_MAINNET, SOLANA_DEVNET]
    assert ext["statement"]
    assert ext["expirationSeconds"] == 300
    decoded = decode_payment_required_header(reply.headers["payment-required"])
    assert isinstance(decoded, PaymentRequired)
    assert decoded.x402_version == 2
    assert decoded.accepts == []
    assert decoded.extensions is not None
    reference = SIWxExtension.model_validate(decoded.extensions["sign-in-with-x"])
    assert reference.info.domain == gw.url.removeprefix("http://")
    assert reference.info.uri == gw.url + path
    assert reference.info.nonce == ext["info"]["nonce"]
    assert {c.chain_id for c in reference.supported_chains} == {SOLANA_MAINNET, SOLANA_DEVNET}


async def test_each_challenge_is_fresh_and_counted_as_unpaid(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    route = "tokens.curated"
    before = (await gw.services.usage.snapshot([route]))[(route, "unpaid")]
    first = await challenge(http, gw, f"{PREFIX}/assets/curated")
    second = await challenge(http, gw, f"{PREFIX}/assets/curated")
    assert first.info.nonce != second.info.nonce
    assert (await gw.services.usage.snapshot([route]))[(route, "unpaid")] == before + 2


async def _signed_for(
    http: aiohttp.ClientSession, gw: RunningGateway, path: str, chain: str = SOLANA_MAINNET, **changes: Any
) -> str:
    """A header for ``path``'s challenge, with ``changes`` made to the info before signing."""
    info = (await challenge(http, gw, path)).info
    return encode_header(sign_payload(msgspec.structs.replace(info, **changes), WALLET, chain))


async def test_a_replayed_sign_in_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    path = f"{PREFIX}/assets/solana/profile"
    signed = await _signed_for(http, gw, path)
    assert (await send(http, gw, "GET", path, headers={"sign-in-with-x": signed})).status == 200
    replay = await send(http, gw, "GET", path, headers={"sign-in-with-x": signed})
    assert_sign_in_challenge(replay, gw, path, "siwx_replayed")
    assert len(asset_api.calls) == 1


async def test_an_expired_sign_in_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    path = f"{PREFIX}/health"
    replica = SiwxIssuer(SIWX_SECRET.encode(), gw.settings.base_url, "Sign in")
    old = replica.challenge(gw.url + path, time.time() - 301).extensions["sign-in-with-x"]  # type: ignore[index]
    reply = await send(http, gw, "GET", path, headers={"sign-in-with-x": sign_in(old, WALLET)})
    assert_sign_in_challenge(reply, gw, path, "siwx_expired")
    assert asset_api.calls == []


async def test_a_sign_in_from_another_replica_is_accepted(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    path = f"{PREFIX}/health"
    replica = SiwxIssuer(SIWX_SECRET.encode(), gw.settings.base_url, "Sign in")
    ext = replica.challenge(gw.url + path).extensions["sign-in-with-x"]  # type: ignore[index]
    reply = await send(http, gw, "GET", path, headers={"sign-in-with-x": sign_in(ext, WALLET)})
    assert reply.status == 200, reply.body


@pytest.mark.parametrize(
    ("changes", "chain", "reason"),
    [
        ({"domain": "evil.example.com"}, SOLANA_MAINNET, "siwx_domain_mismatch"),
        ({"uri": "http://evil.example.com/v1/x402/tokens/health"}, SOLANA_MAINNET, "siwx_uri_mismatch"),
        ({}, "solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z", "siwx_unsupported_chain"),
        ({}, "eip155:1", "siwx_unsupported_chain"),
        ({"nonce": "0" * 32}, SOLANA_MAINNET, "siwx_nonce_invalid"),
        ({"issuedAt": "2020-01-01T00:00:00.000Z"}, SOLANA_MAINNET, "siwx_nonce_invalid"),
    ],
)
async def test_a_sign_in_for_something_else_is_refused(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    asset_api: Upstream,
    changes: dict[str, Any],
    chain: str,
    reason: str,
) -> None:
    path = f"{PREFIX}/health"
    signed = await _signed_for(http, gw, path, chain, **changes)
    reply = await send(http, gw, "GET", path, headers={"sign-in-with-x": signed})
    assert_sign_in_challenge(reply, gw, path, reason)
    assert asset_api.calls == []


async def test_a_sign_in_for_another_path_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    signed = await _signed_for(http, gw, f"{PREFIX}/assets/search")
    path = f"{PREFIX}/assets/resolve"
    reply = await send(http, gw, "GET", path + "?ref=sol", headers={"sign-in-with-x": signed})
    assert_sign_in_challenge(reply, gw, path, "siwx_uri_mismatch")
    assert asset_api.calls == []


async def test_a_bad_signature_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    path = f"{PREFIX}/health"
    signed = await _signed_for(http, gw, path)
    payload = msgspec.json.decode(base64.b64decode(signed))
    payload["address"] = str(Keypair().pubkey())  # someone else's wallet, the first one's signature
    forged = base64.b64encode(msgspec.json.encode(payload)).decode()
    reply = await send(http, gw, "GET", path, headers={"sign-in-with-x": forged})
    assert_sign_in_challenge(reply, gw, path, "siwx_signature_invalid")
    assert asset_api.calls == []


@pytest.mark.parametrize(
    "header",
    ["%%%", base64.b64encode(b"not json").decode(), base64.b64encode(b'{"domain": 1}').decode(), "e30="],
)
async def test_a_malformed_header_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, header: str
) -> None:
    path = f"{PREFIX}/assets/search"
    reply = await send(http, gw, "GET", path + "?q=1&limit=0", headers={"sign-in-with-x": header})
    assert_sign_in_challenge(reply, gw, path, "siwx_malformed")
    assert asset_api.calls == []


async def test_a_refused_sign_in_is_counted_as_failed(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    route = "tokens.health"
    before = (await gw.services.usage.snapshot([route]))[(route, "failed")]
    reply = await send(http, gw, "GET", f"{PREFIX}/health", headers={"sign-in-with-x": "%%%"})
    assert reply.status == 402
    assert (await gw.services.usage.snapshot([route]))[(route, "failed")] == before + 1


async def test_the_reference_x402_client_signs_in_by_itself(gw: RunningGateway, asset_api: Upstream) -> None:
    from x402 import x402Client
    from x402.extensions.sign_in_with_x import create_siwx_client_hook
    from x402.http import x402HTTPClient
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.svm.signers import KeypairSigner

    http_client = x402HTTPClient(x402Client()).on_payment_required(
        create_siwx_client_hook(KeypairSigner(WALLET))
    )
    async with x402HttpxClient(http_client) as reference:
        got = await reference.get(f"{gw.url}{PREFIX}/assets/search", params={"q": "sol", "limit": 3})
        posted = await reference.post(f"{gw.url}{PREFIX}/assets/market-snapshots", json={"mints": [MINT]})
    assert got.status_code == 200, got.text
    assert got.json()["method"] == "search"
    assert posted.status_code == 200, posted.text
    assert posted.json()["method"] == "marketSnapshots"
    assert [(c.path, c.query, c.json) for c in asset_api.calls] == [
        ("/v1/assets/search", {"q": "sol", "limit": "3"}, None),
        ("/v1/assets/market-snapshots", {}, {"mints": [MINT]}),
    ]


# --- routing: fixed segments first, no whoami, no traversal ---------------------------------


async def test_fixed_segments_win_over_asset_ids(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    for name, operation in [("search?q=x", "search"), (f"risk-summary?mint={MINT}", "riskSummaryByMint")]:
        reply = await call(http, gw, "GET", f"{PREFIX}/assets/{name}")
        assert reply.json()["method"] == operation


async def test_a_get_on_market_snapshots_is_405(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    reply = await send(http, gw, "GET", f"{PREFIX}/assets/market-snapshots")
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"].startswith("POST")
    assert asset_api.calls == []


@pytest.mark.parametrize(
    "target",
    [
        "/whoami",
        "/v1/whoami",
        "/assets",
        "/assets/",
        "/assets/solana/unknown",
        "/assets/solana/profile/x",
        "/nope",
    ],
)
async def test_unknown_and_unexposed_paths_are_404(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, target: str
) -> None:
    assert_error(await send(http, gw, "GET", PREFIX + target), 404, "not_found")
    assert asset_api.calls == []


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("/assets/..", 400),
        ("/assets/.", 400),
        ("/assets/%2E%2E/variants", 400),
        ("/assets/..%2Fhealth", 404),
        ("/assets/solana%2F..%2F..%2Fwhoami", 404),
        ("/assets/sol%2fvariants", 404),
        ("/assets/solana%2Fprofile", 404),
        ("/assets/%2e/profile", 400),
        ("/assets/../../whoami", 404),
    ],
)
async def test_asset_id_traversal_is_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, target: str, status: int
) -> None:
    reply = await call(http, gw, "GET", PREFIX + target)
    assert_error(reply, status, "invalid_request" if status == 400 else "not_found")
    assert asset_api.calls == []


# --- CORS and HEAD --------------------------------------------------------------------------


async def test_preflight_needs_no_sign_in(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    reply = await send(
        http,
        gw,
        "OPTIONS",
        f"{PREFIX}/assets/market-snapshots",
        headers={"origin": "https://app.example", "access-control-request-method": "POST"},
    )
    assert reply.status == 204
    assert reply.headers["access-control-allow-origin"] == "*"
    assert reply.headers["access-control-allow-methods"] == "POST, OPTIONS"
    assert "SIGN-IN-WITH-X" in reply.headers["access-control-allow-headers"]


async def test_head_gives_the_get_headers_and_no_body(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    path = f"{PREFIX}/assets/solana/tickers"
    unsigned = await send(http, gw, "HEAD", path)
    assert unsigned.status == 402
    assert unsigned.body == b""
    required = msgspec.json.decode(base64.b64decode(unsigned.headers["payment-required"]))
    signed = sign_in(required["extensions"]["sign-in-with-x"], WALLET)
    head = await send(http, gw, "HEAD", path, headers={"sign-in-with-x": signed})
    get = await call(http, gw, "GET", path)
    assert (head.status, get.status) == (200, 200)
    assert head.body == b""
    for name in ("content-type", "content-length", "cache-control", "access-control-allow-origin"):
        assert head.headers[name] == get.headers[name]
    assert [c.method for c in asset_api.calls] == ["GET", "GET"]


# --- the upstream's answers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("upstream_status", "status", "code"),
    [
        (404, 404, "not_found"),
        (410, 404, "not_found"),
        (400, 400, "invalid_request"),
        (422, 400, "invalid_request"),
        (401, 502, "upstream_error"),
        (403, 502, "upstream_error"),
        (409, 502, "upstream_error"),
        (500, 502, "upstream_error"),
        (503, 502, "upstream_error"),
    ],
)
async def test_upstream_error_statuses_map_to_our_shape(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    asset_api: Upstream,
    upstream_status: int,
    status: int,
    code: str,
) -> None:
    asset_api.responder = static(upstream_status, {"error": "upstream says no", "key": ASSET_API_KEY})
    reply = await call(http, gw, "GET", f"{PREFIX}/assets/solana")
    error = assert_error(reply, status, code)
    assert error["details"] == {"upstreamStatus": upstream_status}
    assert ASSET_API_KEY not in reply.body.decode()
    assert "upstream says no" not in reply.body.decode()


async def test_upstream_rate_limit_is_429_with_retry_after(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    async def limited(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "7"})

    asset_api.responder = limited
    reply = await call(http, gw, "GET", f"{PREFIX}/health")
    assert_error(reply, 429, "rate_limited")
    assert reply.headers["retry-after"] == "7"


@pytest.mark.parametrize(
    "text", ["<html>oops</html>", "", '{"truncated": ', "null trailing", "[" * 5000 + "]" * 5000]
)
async def test_an_upstream_answer_that_is_not_json_is_502(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, text: str
) -> None:
    asset_api.responder = static(200, text=text)
    assert_error(await call(http, gw, "GET", f"{PREFIX}/health"), 502, "upstream_error")


async def test_a_slow_upstream_is_504(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    asset_api.responder = static(200, {"late": True}, delay=TIMEOUT_S + 2)
    started = time.monotonic()
    assert_error(await call(http, gw, "GET", f"{PREFIX}/health"), 504, "upstream_timeout")
    assert time.monotonic() - started < TIMEOUT_S + 1.9  # before the upstream would have answered


async def test_an_unreachable_upstream_is_502_without_naming_it(
    http: aiohttp.ClientSession, log_lines: list[str]
) -> None:
    dead = f"http://127.0.0.1:{refusing_port()}"
    async with run_gateway(_env(dead)) as gateway:
        reply = await call(http, gateway, "GET", f"{PREFIX}/health")
    error = assert_error(reply, 502, "upstream_error")
    assert dead.split("//")[1] not in error["message"]
    assert all(dead.split("//")[1] not in line for line in log_lines)


async def test_the_key_is_redacted_when_the_upstream_echoes_it(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream, log_lines: list[str]
) -> None:
    async def echo(request: web.Request, body: bytes) -> web.StreamResponse:
        key = ASSET_API_KEY
        payload = {"received": request.headers["x-api-key"], key: [f"key={key};"], "n": 1}
        return web.json_response(payload, headers={"x-echo-key": key, "set-cookie": f"k={key}"})

    asset_api.responder = echo
    reply = await call(http, gw, "GET", f"{PREFIX}/health")
    assert reply.status == 200, reply.body
    assert reply.json()["result"] == {"received": "[redacted]", "[redacted]": ["key=[redacted];"], "n": 1}
    assert ASSET_API_KEY not in reply.body.decode()
    assert all(ASSET_API_KEY not in value for value in reply.headers.values())
    assert all(ASSET_API_KEY not in line for line in log_lines)


async def test_the_key_is_redacted_even_behind_json_escapes(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    escaped = ASSET_API_KEY.replace("t", "\\u0074").replace("-", "\\u002d")
    asset_api.responder = static(200, text=f'{{"echo": "{escaped}", "list": ["\\/{escaped}\\/"]}}')
    reply = await call(http, gw, "GET", f"{PREFIX}/health")
    assert reply.status == 200, reply.body
    assert reply.json()["result"] == {"echo": "[redacted]", "list": ["/[redacted]/"]}


async def test_a_clean_upstream_answer_passes_through_byte_for_byte(
    gw: RunningGateway, http: aiohttp.ClientSession, asset_api: Upstream
) -> None:
    text = '{"b": 1.50, "a": [true, null, "x"], "big": 123456789012345678901234567890}'
    asset_api.responder = static(200, text=text)
    reply = await call(http, gw, "GET", f"{PREFIX}/health")
    assert reply.status == 200, reply.body
    assert text.encode() in reply.body


# --- rate limits, challenge limits and the store --------------------------------------------


async def test_the_tokens_limit_is_shared_across_the_key(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    env = _env(asset_api_server.url, RATE_LIMIT_TOKENS_PER_MINUTE="3", TRUSTED_PROXIES="127.0.0.1")
    async with run_gateway(env) as gateway:
        wallets: list[Signer] = [Keypair(), Keypair(), SigningKey.generate()]
        targets = ["/health", "/assets/search?q=a", "/assets/solana"]
        for n, (wallet, target) in enumerate(zip(wallets, targets, strict=True)):
            from_ip = {"X-Forwarded-For": f"198.51.100.{n + 1}"}  # each wallet from an IP of its own
            reply = await call(http, gateway, "GET", PREFIX + target, signer=wallet, headers=from_ip)
            assert reply.status == 200
        reply = await call(
            http, gateway, "GET", f"{PREFIX}/assets/solana/profile", signer=Keypair(),
            headers={"X-Forwarded-For": "198.51.100.9"},
        )
    error = assert_error(reply, 429, "rate_limited")
    assert error["details"]["scope"] == "tokens:upstream-key"
    assert 1 <= int(reply.headers["retry-after"]) <= 20
    assert reply.headers["access-control-allow-origin"] == "*"
    assert len(asset_api.calls) == 3


def _routes_with(limits: tuple[RateLimitSpec, ...]) -> list[RouteSpec]:
    routes = load_routes(PACKAGED_ROUTES_FILE, LIMITS)
    return [msgspec.structs.replace(r, rate_limits=limits) if r.handler == "tokens" else r for r in routes]


async def test_each_wallet_has_its_own_limit(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    limits = (
        RateLimitSpec(scope="tokens:upstream-key", limit=100, period_ms=60_000),
        RateLimitSpec(scope="tokens:wallet", limit=2, period_ms=60_000, per="wallet"),
    )
    busy, other = Keypair(), Keypair()
    async with run_gateway(_env(asset_api_server.url), routes=_routes_with(limits)) as gateway:
        for _ in range(2):
            assert (await call(http, gateway, "GET", f"{PREFIX}/health", signer=busy)).status == 200
        refused = await call(http, gateway, "GET", f"{PREFIX}/assets/solana", signer=busy)
        allowed = await call(http, gateway, "GET", f"{PREFIX}/assets/solana", signer=other)
    error = assert_error(refused, 429, "rate_limited")
    assert error["details"]["scope"] == "tokens:wallet"
    assert int(refused.headers["retry-after"]) >= 1
    assert allowed.status == 200
    assert len(asset_api.calls) == 3


async def test_a_sign_in_refused_by_a_limit_keeps_its_nonce_for_when_the_limit_allows(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    """Over its wallet's limit a sign-in is refused before its nonce is used: the very same
    header is served once the limit allows it, and then never again."""
    limits = (RateLimitSpec(scope="tokens:wallet", limit=1, period_ms=1_000, per="wallet"),)
    busy = Keypair()
    async with run_gateway(_env(asset_api_server.url), routes=_routes_with(limits)) as gateway:
        path = f"{PREFIX}/health"
        assert (await call(http, gateway, "GET", path, signer=busy)).status == 200
        signed = {"sign-in-with-x": sign_in(await challenge(http, gateway, path), busy)}
        limited = await send(http, gateway, "GET", path, headers=signed)
        await asyncio.sleep(int(limited.headers["retry-after"]))
        served = await send(http, gateway, "GET", path, headers=signed)
        replayed = await send(http, gateway, "GET", path, headers=signed)
    assert_error(limited, 429, "rate_limited")
    assert served.status == 200, served.body
    assert_sign_in_challenge(replayed, gateway, path, "siwx_replayed")
    assert len(asset_api.calls) == 2


async def test_a_sign_in_takes_two_store_round_trips(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession, clean_redis_url: str
) -> None:
    """Its nonce on its wallet's slot, then the upstream key's budget with the wallet's and the
    IP's shares of it on the budget's: two requests over Upstash REST, the shared one only once
    the nonce is new (a replayed sign-in never touches the budget)."""
    rest = UpstashRestServer(clean_redis_url, "siwx-token")
    store = UpstashStore(await rest.start(), "siwx-token")
    env = _env(asset_api_server.url, RATE_LIMIT_SYNC_SECONDS="10")
    try:
        async with run_gateway(env, store=store) as gateway:
            path = f"{PREFIX}/health"
            assert (await call(http, gateway, "GET", path)).status == 200  # loads the script
            signed = {"sign-in-with-x": sign_in(await challenge(http, gateway, path), WALLET)}
            await gateway.app.state.services.usage.flush()
            rest.requests.clear()
            reply = await send(http, gateway, "GET", path, headers=signed)
            requests = list(rest.requests)
    finally:
        await rest.stop()
    assert reply.status == 200, reply.body
    assert requests == ["EVALSHA", "EVALSHA"]


async def test_sign_in_challenges_have_no_side_effect_on_the_ip_limit(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    async with run_gateway(_env(asset_api_server.url, RATE_LIMIT_CHALLENGE_PER_MINUTE="2")) as gateway:
        path = f"{PREFIX}/health"
        first = await challenge(http, gateway, path)
        await challenge(http, gateway, path)
        third = await send(http, gateway, "GET", path)
        signed = await send(http, gateway, "GET", path, headers={"sign-in-with-x": sign_in(first, WALLET)})
    assert third.status == 402 and third.json()["extensions"]["sign-in-with-x"]
    assert signed.status == 200


async def test_refused_sign_ins_count_against_the_per_ip_challenge_limit(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    """A junk SIGN-IN-WITH-X header earns a fresh challenge, so it must not bypass the limit."""
    async with run_gateway(_env(asset_api_server.url, RATE_LIMIT_CHALLENGE_PER_MINUTE="2")) as gateway:
        path = f"{PREFIX}/health"
        replies = [
            await send(http, gateway, "GET", path, headers={"sign-in-with-x": "junk"}) for _ in range(3)
        ]
    assert [r.status for r in replies] == [402, 402, 429]
    assert_error(replies[2], 429, "rate_limited")
    assert "retry-after" in replies[2].headers


async def test_an_unreachable_store_fails_a_sign_in_closed_with_503_but_still_challenges(
    asset_api_server: Upstream, asset_api: Upstream, http: aiohttp.ClientSession
) -> None:
    store = f"redis://127.0.0.1:{refusing_port()}/0"
    env = _env(asset_api_server.url, STATE_STORE_REST_URL=store)
    async with run_gateway(env, routes=_routes_with(())) as gateway:
        path = f"{PREFIX}/health"
        replica = SiwxIssuer(SIWX_SECRET.encode(), gateway.settings.base_url, "Sign in")
        ext = replica.challenge(gateway.url + path).extensions["sign-in-with-x"]  # type: ignore[index]
        claimed = await send(http, gateway, "GET", path, headers={"sign-in-with-x": sign_in(ext, WALLET)})
        unsigned = await send(http, gateway, "GET", path)
    assert_error(claimed, 503, "store_unavailable")
    assert unsigned.status == 402  # a challenge needs nothing from the store
    assert asset_api.calls == []
