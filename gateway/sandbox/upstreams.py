"""The sandbox's sample upstreams: DAS methods on the local chain, and the asset-data API.

Everything here is deterministic sample data, derived from the request alone, and marked
``"sandbox": true`` so nobody mistakes it for market data:

* :func:`das_methods` -> ``getAsset``, ``getAssetsByOwner``, ``searchAssets`` for
  :attr:`gateway.sandbox.chain.LiteSvmRpcServer.extra_methods` (the providers' RPC and DAS
  share one URL, so the local chain answers both);
* :class:`AssetDataSample`: an aiohttp server (loopback by default) answering the 19 ``/v1/...``
  paths the asset-data routes proxy (checks ``x-api-key`` like the real API).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from solders.pubkey import Pubkey

from gateway.sandbox.chain import INVALID_PARAMS, RpcError
from gateway.x402.types import USDC_MAINNET_MINT

SANDBOX: Final = True
WRAPPED_SOL_MINT: Final = "So11111111111111111111111111111111111111112"

# A small fixed universe of canonical assets for search/resolve/curated answers.
_ASSETS: Final[list[dict[str, Any]]] = [
    {"id": "solana", "symbol": "SOL", "name": "Solana", "category": "majors", "mint": WRAPPED_SOL_MINT},
    {
        "id": "usd-coin",
        "symbol": "USDC",
        "name": "USD Coin",
        "category": "currencies",
        "mint": USDC_MAINNET_MINT,
    },
    {
        "id": "jito-staked-sol",
        "symbol": "JITOSOL",
        "name": "Jito Staked SOL",
        "category": "lsts",
        "mint": "J1toso1uCk3RLmjorhTtrVwY9HJ7X8V9yYac6Y7kGCPn",
    },
    {
        "id": "marinade-staked-sol",
        "symbol": "MSOL",
        "name": "Marinade Staked SOL",
        "category": "lsts",
        "mint": "mSoLzYCxHdYgdzU16g5QSh3i5K3z3KZK7ytfqcJm7So",
    },
]


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("\x00".join(parts).encode()).digest()


def _number(seed: str, low: float, high: float) -> float:
    """A deterministic number in [low, high) derived from ``seed``."""
    fraction = int.from_bytes(_digest(seed)[:8], "big") / 2**64
    return round(low + (high - low) * fraction, 6)


def _address(*parts: str) -> str:
    """A deterministic (fake) Solana address derived from ``parts``."""
    return str(Pubkey.from_bytes(_digest("sandbox", *parts)))


# --- DAS ----------------------------------------------------------------------------------------


def sample_asset(asset_id: str, owner: str | None = None) -> dict[str, Any]:
    """A DAS asset for ``asset_id``: the USDC mint is fungible, anything else a sample NFT."""
    if asset_id == USDC_MAINNET_MINT:
        return {
            "sandbox": SANDBOX,
            "interface": "FungibleToken",
            "id": asset_id,
            "content": {"metadata": {"name": "USD Coin", "symbol": "USDC"}, "links": {}},
            "token_info": {
                "symbol": "USDC",
                "decimals": 6,
                "token_program": "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA",
            },
            "mutable": True,
            "burnt": False,
        }
    owner = owner or _address("owner", asset_id)
    return {
        "sandbox": SANDBOX,
        "interface": "V1_NFT",
        "id": asset_id,
        "content": {
            "$schema": "https://schema.metaplex.com/nft1.0.json",
            "metadata": {"name": f"Sandbox asset {asset_id[:6]}", "symbol": "SBX"},
            "links": {},
        },
        "ownership": {"owner": owner, "frozen": False, "delegated": False, "ownership_model": "single"},
        "compression": {"compressed": False},
        "royalty": {"basis_points": int(_number(asset_id, 0, 1000)), "primary_sale_happened": True},
        "mutable": False,
        "burnt": False,
    }


def _named(params: Any) -> dict[str, Any]:
    """DAS params are one object (or a list holding one)."""
    if isinstance(params, list) and len(params) == 1:
        params = params[0]
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "Invalid params: expected an object")
    return params


def _page(params: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    limit = int(params.get("limit") or 10)
    page = int(params.get("page") or 1)
    start = (page - 1) * limit
    return {
        "sandbox": SANDBOX,
        "total": len(items[start : start + limit]),
        "limit": limit,
        "page": page,
        "items": items[start : start + limit],
    }


def _get_asset(params: Any) -> dict[str, Any]:
    asset_id = _named(params).get("id")
    if not isinstance(asset_id, str) or not asset_id:
        raise RpcError(INVALID_PARAMS, "Invalid params: id is required")
    return sample_asset(asset_id)


def _get_assets_by_owner(params: Any) -> dict[str, Any]:
    named = _named(params)
    owner = named.get("ownerAddress")
    if not isinstance(owner, str) or not owner:
        raise RpcError(INVALID_PARAMS, "Invalid params: ownerAddress is required")
    items = [sample_asset(_address("asset", owner, str(i)), owner) for i in range(3)]
    return _page(named, items)


def _search_assets(params: Any) -> dict[str, Any]:
    named = _named(params)
    owner = named.get("ownerAddress")
    seed = ",".join(f"{k}={named[k]}" for k in sorted(named) if k not in ("limit", "page"))
    items = [
        sample_asset(_address("search", seed, str(i)), owner if isinstance(owner, str) else None)
        for i in range(5)
    ]
    return _page(named, items)


def das_methods() -> dict[str, Callable[[Any], Any]]:
    """The DAS sample, as extra JSON-RPC methods of the local chain."""
    return {"getAsset": _get_asset, "getAssetsByOwner": _get_assets_by_owner, "searchAssets": _search_assets}


# --- asset data -----------------------------------------------------------------------------


def _asset_by_id(asset_id: str) -> dict[str, Any]:
    for asset in _ASSETS:
        if asset["id"] == asset_id or f"solana-{asset['mint']}" == asset_id:
            return asset
    return {
        "id": asset_id,
        "symbol": asset_id[:8].upper(),
        "name": f"Sandbox {asset_id}",
        "category": "other",
        "mint": _address("mint", asset_id),
    }


def _market(mint: str) -> dict[str, Any]:
    return {
        "mint": mint,
        "priceUsd": _number("price" + mint, 0.5, 200.0),
        "liquidityUsd": _number("liq" + mint, 1e5, 1e8),
        "volume24hUsd": _number("vol" + mint, 1e4, 1e7),
    }


def _candles(seed: str, query: dict[str, str]) -> list[dict[str, Any]]:
    start = int(query.get("from", "1700000000"))
    return [
        {
            "t": start + 3600 * i,
            "o": _number(f"{seed}o{i}", 1, 2),
            "h": _number(f"{seed}h{i}", 2, 3),
            "l": _number(f"{seed}l{i}", 0.5, 1),
            "c": _number(f"{seed}c{i}", 1, 2),
            "v": _number(f"{seed}v{i}", 1e3, 1e5),
        }
        for i in range(3)
    ]


def _answer(operation: str, path: dict[str, str], query: dict[str, str], body: Any) -> Any:
    """The sample data of one operation (wrapped with the sandbox marker by the caller)."""
    asset = _asset_by_id(path["assetId"]) if "assetId" in path else None
    mint = query.get("mint") or (asset["mint"] if asset else USDC_MAINNET_MINT)
    if operation == "health":
        return {"status": "ok"}
    if operation == "search":
        q = query.get("q", "").lower()
        found = [a for a in _ASSETS if q in a["id"] or q in a["symbol"].lower() or q in a["name"].lower()]
        return {"assets": found[: int(query.get("limit", "20"))]}
    if operation == "resolve":
        ref = (query.get("ref") or query.get("mint") or "").lower()
        match = next((a for a in _ASSETS if ref in (a["id"], a["symbol"].lower(), a["mint"].lower())), None)
        return {"asset": match}
    if operation == "curated":
        wanted = query.get("list", "all")
        return {"list": wanted, "assets": [a for a in _ASSETS if wanted in ("all", a["category"])]}
    if operation in ("marketSnapshots", "variantMarkets"):
        ids = (
            (body or {}).get("mints", [])
            if operation == "marketSnapshots"
            else query.get("mints", "").split(",")
        )
        return {"markets": [_market(m) for m in ids if m]}
    if operation in ("ohlcv", "priceChart"):
        return {"interval": query.get("interval", "1H"), "candles": _candles(operation + mint, query)}
    if operation in ("riskSummary", "riskSummaryByMint", "riskDetails"):
        return {"mint": mint, "score": int(_number("risk" + mint, 0, 100)), "level": "sample"}
    if operation in ("markets", "variantMarket", "variantTopMarkets"):
        return {"markets": [_market(mint)]}
    return {"asset": asset, "market": _market(mint)}


# (method, upstream path, operation); ``{assetId}`` is a path segment.
ASSET_DATA_PATHS: Final[list[tuple[str, str, str]]] = [
    ("GET", "/v1/health", "health"),
    ("GET", "/v1/assets/search", "search"),
    ("GET", "/v1/assets/resolve", "resolve"),
    ("GET", "/v1/assets/curated", "curated"),
    ("POST", "/v1/assets/market-snapshots", "marketSnapshots"),
    ("GET", "/v1/assets/variant-markets", "variantMarkets"),
    ("GET", "/v1/assets/risk-summary", "riskSummaryByMint"),
    ("GET", "/v1/assets/{assetId}", "assetDetail"),
    ("GET", "/v1/assets/{assetId}/variants", "variants"),
    ("GET", "/v1/assets/{assetId}/variant-top-markets", "variantTopMarkets"),
    ("GET", "/v1/assets/{assetId}/variant-market", "variantMarket"),
    ("GET", "/v1/assets/{assetId}/markets", "markets"),
    ("GET", "/v1/assets/{assetId}/ohlcv", "ohlcv"),
    ("GET", "/v1/assets/{assetId}/price-chart", "priceChart"),
    ("GET", "/v1/assets/{assetId}/profile", "profile"),
    ("GET", "/v1/assets/{assetId}/tickers", "tickers"),
    ("GET", "/v1/assets/{assetId}/risk-summary", "riskSummary"),
    ("GET", "/v1/assets/{assetId}/risk-details", "riskDetails"),
    ("GET", "/v1/assets/{assetId}/description", "description"),
]


class AssetDataSample:
    """The asset-data API on ``host`` (loopback by default), answering sample data to callers
    with ``api_key``; ``url`` names ``shown_host``, the address clients use (default: ``host``)."""

    def __init__(self, api_key: str, port: int = 0, host: str = "127.0.0.1", shown_host: str = "") -> None:
        self.api_key = api_key
        self.port = port
        self.host = host
        self.shown_host = shown_host or host
        self.port_bound = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        for method, path, operation in ASSET_DATA_PATHS:
            app.router.add_route(method, path, self._handler(operation))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port_bound = int(self._runner.addresses[0][1])
        self.url = f"http://{self.shown_host}:{self.port_bound}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _handler(self, operation: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            if request.headers.get("x-api-key") != self.api_key:
                return web.json_response({"error": "unauthorized"}, status=401)
            body: Any = None
            if request.can_read_body:
                try:
                    body = await request.json()
                except ValueError:
                    return web.json_response({"error": "invalid JSON"}, status=400)
            data = _answer(operation, dict(request.match_info), dict(request.query), body)
            return web.json_response({"sandbox": SANDBOX, "operation": operation, "data": data})

        return handle
