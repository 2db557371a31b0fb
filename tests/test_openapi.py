"""The OpenAPI 3.1 document: generated from routes.yaml, served at /openapi.json."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import schemathesis
from openapi_spec_validator import validate

from gateway.batch.endpoint import batch_endpoints
from gateway.config import PACKAGED_ROUTES_FILE
from gateway.routing.openapi import build_openapi
from gateway.routing.pricing import FacilitatorFee
from gateway.routing.routes import RouteSpec, load_routes
from tests.support.gateway_server import FULL_ENV, PAY_TO, SERVICE_ONLY_ENV, RunningGateway, run_gateway

MINT = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"
PACKAGED = load_routes(
    PACKAGED_ROUTES_FILE,
    {"rpc": (1, 1), "das": (1, 1), "tokens": (1, 1), "challenge": (1, 1),
     "rpc_wallet": (1, 1), "das_wallet": (1, 1), "tokens_share": (1, 1),
     "sign_in_ip": (1, 1), "sign_in_wallet": (1, 1)},
)
LISTED = [r for r in PACKAGED if r.listed and r.access != "internal"]
ENDPOINTS = batch_endpoints(PACKAGED, 20)
"""Each provider's JSON-RPC endpoint, described beside the routes (``gateway.batch``)."""
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


INTERNAL = FacilitatorFee(internal=True)


def _document(routes: list[RouteSpec] = PACKAGED, fee: FacilitatorFee = INTERNAL) -> dict[str, Any]:
    return build_openapi(routes, "https://gw.example", MINT, PAY_TO, fee)


def _operations(doc: dict[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """operationId -> (METHOD, path, operation)."""
    return {
        op["operationId"]: (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def _route(name: str) -> RouteSpec:
    (route,) = [r for r in PACKAGED if r.name == name]
    return route


def _param(operation: dict[str, Any], name: str, location: str) -> dict[str, Any]:
    (param,) = [p for p in operation.get("parameters", []) if p.get("name") == name and p["in"] == location]
    return param


def _header_refs(operation: dict[str, Any]) -> set[str]:
    return {p["$ref"].rsplit("/", 1)[1] for p in operation.get("parameters", []) if "$ref" in p}


# --- the document ----------------------------------------------------------------------------------


def test_document_is_valid_openapi_3_1() -> None:
    doc = _document()

    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema
    assert doc["openapi"].startswith("3.1")


def test_schemathesis_loads_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(_document())

    operations = [result.ok() for result in schema.get_all_operations()]

    assert len(operations) == len(LISTED)
    assert {op.definition.raw["operationId"] for op in operations} == {r.name for r in LISTED}


def test_document_lists_exactly_the_listed_routes() -> None:
    ops = _operations(_document())

    assert {name: (method, path) for name, (method, path, _) in ops.items()} == {
        r.name: (r.method, r.path) for r in LISTED
    }
    assert "health" in ops
    assert "catalog" in ops


def test_internal_and_unlisted_routes_are_absent() -> None:
    doc = _document()
    paths = set(doc["paths"])

    assert not any(p.startswith("/api/internal/") for p in paths)
    assert "/metrics" not in paths
    assert "/openapi.json" not in paths


def test_only_mounted_routes_are_described() -> None:
    service_only = [r for r in PACKAGED if r.group == "service"]

    assert set(_document(service_only)["paths"]) == {"/healthz", "/v1/catalog"}


def test_query_parameters_come_from_the_query_schema() -> None:
    _, _, search = _operations(_document())["tokens.search"]

    assert _param(search, "q", "query") == {
        "name": "q",
        "in": "query",
        "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    }
    assert _param(search, "limit", "query")["required"] is False


def test_path_parameters_are_required_with_the_path_schema() -> None:
    _, path, detail = _operations(_document())["tokens.assetDetail"]
    param = _param(detail, "assetId", "path")

    assert path == "/v1/x402/tokens/assets/{assetId}"
    assert param["required"] is True
    assert param["schema"] == _route("tokens.assetDetail").input["path"]["properties"]["assetId"]


def test_our_schema_extensions_are_kept() -> None:
    ops = _operations(_document())
    _, _, variants = ops["tokens.variantMarkets"]
    _, _, snapshots = ops["tokens.marketSnapshots"]

    assert "x-comma-list" in _param(variants, "mints", "query")["schema"]
    assert variants["x-query-rules"]["x-combined-count"] == {
        "fields": ["mints", "addresses"],
        "min": 1,
        "max": 50,
    }
    assert "x-combined-count" in snapshots["requestBody"]["content"]["application/json"]["schema"]


def test_paid_operations_have_the_body_payment_headers_and_price() -> None:
    route = _route("solana.mainnet.provider_a.rpc.getBalance")
    _, _, op = _operations(_document())[route.name]

    assert op["requestBody"]["required"] is True
    assert op["requestBody"]["content"]["application/json"]["schema"] == route.input["body"]
    assert _header_refs(op) == {"PaymentSignature", "XPayment"}
    assert op["x-x402"] == {
        "scheme": "exact",
        "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
        "asset": MINT,
        "payTo": PAY_TO,
        # The internal facilitator: the provider part plus routes.yaml's settlement fee.
        "price": {"microUsdc": "2205", "usd": "$0.002205"},
        "priceParts": {
            "provider": {"microUsdc": "5", "usd": "$0.000005"},
            "settlementFee": {"microUsdc": "2200", "usd": "$0.0022"},
        },
    }
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == route.output


def test_paid_operations_carry_the_settlement_fee_configured_for_an_external_facilitator() -> None:
    configured = FacilitatorFee(internal=False, external_micro_usdc=300)
    _, _, op = _operations(_document(fee=configured))["solana.devnet.provider_b.das.searchAssets"]

    assert op["x-x402"]["price"] == {"microUsdc": "350", "usd": "$0.00035"}
    assert op["x-x402"]["priceParts"] == {
        "provider": {"microUsdc": "50", "usd": "$0.00005"},
        "settlementFee": {"microUsdc": "300", "usd": "$0.0003"},
    }


def test_sign_in_operations_read_sign_in_with_x() -> None:
    _, _, op = _operations(_document())["tokens.search"]

    assert _header_refs(op) == {"SignInWithX"}
    assert op["x-x402"]["scheme"] == "sign-in-with-x"


def test_public_operations_read_no_credential() -> None:
    ops = _operations(_document())

    for name in ("health", "catalog"):
        assert _header_refs(ops[name][2]) == set()
        assert "x-x402" not in ops[name][2]


def test_402_carries_the_challenge_and_its_header() -> None:
    doc = _document()
    _, _, op = _operations(doc)["solana.mainnet.provider_a.rpc.getBalance"]
    challenge = op["responses"]["402"]

    assert challenge["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PaymentRequired"
    }
    assert challenge["headers"]["PAYMENT-REQUIRED"] == {"$ref": "#/components/headers/PaymentRequired"}


def test_errors_use_the_one_error_shape() -> None:
    doc = _document()
    error = doc["components"]["schemas"]["Error"]

    assert error["required"] == ["ok", "error"]
    assert "invalid_request" in error["properties"]["error"]["properties"]["code"]["enum"]
    for _, _, op in _operations(doc).values():
        assert "500" not in op["responses"]  # a 500 is a bug, never a documented answer
        for status, response in op["responses"].items():
            if status not in ("200", "402"):
                assert response["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Error"
                }


# --- served at /openapi.json -------------------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(redis_url: str) -> AsyncIterator[RunningGateway]:
    """Every route group served, prepaid credit included (it needs a lasting store)."""
    env = {**FULL_ENV, "CREDITS_ENABLED": "true", "STATE_STORE_REST_URL": redis_url}
    async with run_gateway(env) as running:
        yield running


async def test_served_document_describes_the_mounted_listed_routes(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gateway.url}/openapi.json") as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        doc = await response.json()
    async with http.get(f"{gateway.url}/v1/catalog") as response:
        listed = await response.json()
    catalog = [*listed["routes"], *listed["endpoints"]]

    validate(doc)
    assert doc["servers"] == [{"url": gateway.url}]
    assert set(_operations(doc)) == {entry["name"] for entry in catalog}
    assert len(_operations(doc)) == len(LISTED) + len(ENDPOINTS)


async def test_served_document_leaks_no_secret(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/openapi.json") as response:
        text = await response.text()

    assert "LEAK" not in text
    assert "127.0.0.1:9" not in text  # no upstream or facilitator URL


async def test_schemathesis_loads_the_served_document(gateway: RunningGateway) -> None:
    # from_url is synchronous (requests): run it off the loop that serves the gateway.
    schema = await asyncio.to_thread(schemathesis.openapi.from_url, f"{gateway.url}/openapi.json")

    assert len(list(schema.get_all_operations())) == len(LISTED) + len(ENDPOINTS)


async def test_openapi_answers_head_like_get(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/openapi.json") as response:
        body = await response.read()
    async with http.head(f"{gateway.url}/openapi.json") as head:
        assert head.status == 200
        assert int(head.headers["Content-Length"]) == len(body) > 0
        assert await head.read() == b""


async def test_openapi_carries_cors_headers(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/openapi.json", headers={"Origin": "https://a.example"}) as response:
        assert response.headers["Access-Control-Allow-Origin"] == "*"
    async with http.options(
        f"{gateway.url}/openapi.json",
        headers={"Origin": "https://a.example", "Access-Control-Request-Method": "GET"},
    ) as preflight:
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Methods"] == "GET, OPTIONS"
        assert preflight.headers["Allow"] == "GET, HEAD, OPTIONS"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_openapi_refuses_other_methods_with_405(
    gateway: RunningGateway, http: aiohttp.ClientSession, method: str
) -> None:
    async with http.request(method, f"{gateway.url}/openapi.json") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "GET, HEAD, OPTIONS"
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_bare_gateway_describes_only_the_service_routes(http: aiohttp.ClientSession) -> None:
    async with run_gateway(SERVICE_ONLY_ENV) as bare, http.get(f"{bare.url}/openapi.json") as response:
        doc = await response.json()

    assert set(doc["paths"]) == {"/healthz", "/v1/catalog"}
