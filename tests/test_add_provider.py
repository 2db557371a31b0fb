"""Adding a provider takes routes.yaml and the variable holding its URL: no Python changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from gateway.config import PACKAGED_ROUTES_FILE, ConfigError, load_settings
from gateway.routing.plan import plan_routes
from gateway.routing.routes import load_routes, named_limits
from tests.support.gateway_server import FULL_ENV, RunningGateway, run_gateway

PROVIDER_C_URL = "http://127.0.0.1:9/c/?api-key=LEAK-C"
RPC_PATH = "/v1/x402/solana/mainnet/provider_c/rpc/"
RPC_METHODS = {
    "getBalance",
    "getAccountInfo",
    "getTransaction",
    "getSignaturesForAddress",
    "getTokenAccountsByOwner",
    "getProgramAccounts",
}


def table_with_provider_c(directory: Path) -> Path:
    """The packaged table plus provider_c on mainnet, edited as an operator would edit it."""
    doc: dict[str, Any] = yaml.safe_load(PACKAGED_ROUTES_FILE.read_text(encoding="utf-8"))
    doc["upstreams"]["provider_c_mainnet"] = "PROVIDER_C_MAINNET_RPC_URL"
    doc["pricing"]["provider_c"] = {**doc["pricing"]["provider_b"], "micro_usdc_per_unit": "7"}
    (rpc_template,) = [t for t in doc["templates"] if ".rpc." in t["name"]]
    rpc_template["expand"].append({"cluster": ["mainnet"], "provider": ["provider_c"]})
    (catalog,) = [r for r in doc["routes"] if r["handler"] == "catalog"]
    catalog["input"]["query"]["properties"]["provider"]["enum"].append("provider_c")
    path = directory / "routes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return table_with_provider_c(tmp_path_factory.mktemp("provider_c"))


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(table: Path) -> AsyncIterator[RunningGateway]:
    env = {**FULL_ENV, "ROUTES_FILE": str(table), "PROVIDER_C_MAINNET_RPC_URL": PROVIDER_C_URL}
    async with run_gateway(env) as running:
        yield running


async def test_its_url_is_read_from_the_variable_the_table_names(gateway: RunningGateway) -> None:
    assert gateway.settings.upstream_url("provider_c_mainnet") == PROVIDER_C_URL


async def test_its_routes_are_mounted(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}{RPC_PATH}getBalance") as response:
        assert response.status == 405  # mounted: POST only (an unknown path is a 404)
        assert response.headers["Allow"] == "POST, OPTIONS"


async def test_the_catalog_lists_and_filters_it(gateway: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{gateway.url}/v1/catalog?provider=provider_c") as response:
        assert response.status == 200
        routes = (await response.json())["routes"]

    assert {r["operation"] for r in routes} == RPC_METHODS
    assert {r["provider"] for r in routes} == {"provider_c"}
    assert all(r["path"].startswith(RPC_PATH) and r["access"] == "exact" for r in routes)
    balance = next(r for r in routes if r["operation"] == "getBalance")
    # 1 credit x 7; the external facilitator pays the Solana fees, no settlement fee configured.
    assert balance["price"]["microUsdc"] == "7"
    assert balance["priceParts"]["settlementFee"]["microUsdc"] == "0"


async def test_the_openapi_document_describes_it(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gateway.url}/openapi.json") as response:
        paths = (await response.json())["paths"]

    operation = paths[f"{RPC_PATH}getBalance"]["post"]
    assert operation["tags"] == ["provider_c"]
    assert operation["x-x402"]["scheme"] == "exact"
    assert "402" in operation["responses"]


def test_start_up_requires_its_url_variable(table: Path) -> None:
    settings = load_settings(
        {**FULL_ENV, "GATEWAY_BASE_URL": "https://gw.example", "ROUTES_FILE": str(table)}
    )

    with pytest.raises(ConfigError) as refused:
        plan_routes(load_routes(table, named_limits(settings)), settings)

    assert refused.value.problems == [
        "PROVIDER_C_MAINNET_RPC_URL is required by route group provider_c "
        "(set it, or switch the group off with ROUTE_GROUPS, now unset: every group)"
    ]
