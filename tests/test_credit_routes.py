"""Prepaid credit as an operator switches it on: the routes it mounts, what the 402, catalog,
OpenAPI document and balance route say, and the store it refuses to keep money in.

The whole app runs under hypercorn on loopback over a real Redis; sign-ins are real ed25519
signatures over the challenges the gateway issued.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.config import PACKAGED_ROUTES_FILE, ConfigError, Settings, load_settings
from gateway.routing.plan import plan_routes
from gateway.routing.routes import load_routes, named_limits
from tests.support.gateway_server import FULL_ENV, RunningGateway, run_gateway

BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
TOP_UP_5 = "/v1/x402/credits/top-up/5"
CREDITS = "/v1/x402/credits"
SESSIONS = "/v1/x402/credits/sessions"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(redis_url: str) -> AsyncIterator[RunningGateway]:
    credit = {"CREDITS_ENABLED": "true", "CREDIT_LAPSE_DAYS": "90"}
    env = {**FULL_ENV, **credit, "STATE_STORE_REST_URL": redis_url}
    async with run_gateway(env) as running:
        yield running


async def _get(url: str, method: str = "GET", **kwargs: Any) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kwargs) as response:
        headers = {name.upper(): value for name, value in response.headers.items()}
        return response.status, headers, await response.json(content_type=None)


def _required(headers: dict[str, str]) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.b64decode(headers["PAYMENT-REQUIRED"]))
    return decoded


async def test_a_paid_routes_402_offers_a_sign_in_bound_to_it(gateway: RunningGateway) -> None:
    status, headers, _ = await _get(gateway.url + BALANCE, "POST", json={"params": []})

    required = _required(headers)
    assert status == 402 and [a["scheme"] for a in required["accepts"]] == ["exact"]
    assert required["extensions"]["sign-in-with-x"]["info"]["uri"] == gateway.url + BALANCE


async def test_a_top_up_asks_for_exactly_its_credit(gateway: RunningGateway) -> None:
    status, headers, _ = await _get(gateway.url + TOP_UP_5, "POST")

    required = _required(headers)
    assert status == 402
    assert [a["amount"] for a in required["accepts"]] == ["5000000"]
    assert "sign-in-with-x" not in required.get("extensions", {})  # credit does not buy credit


async def test_the_balance_of_a_new_wallet_is_zero(gateway: RunningGateway) -> None:
    status, headers, _ = await _get(gateway.url + CREDITS)
    assert status == 402
    signed = sign_in(_required(headers)["extensions"]["sign-in-with-x"], wallet := Keypair())

    status, _, body = await _get(gateway.url + CREDITS, headers={"SIGN-IN-WITH-X": signed})

    assert status == 200, body
    assert body == {
        "ok": True,
        "provider": "credits",
        "surface": "credits",
        "method": "balance",
        "result": {
            "wallet": str(wallet.pubkey()),
            "balanceMicroUsdc": "0",
            "heldMicroUsdc": "0",
            "expiresAt": 0,
        },
    }


async def test_the_catalog_states_credit_prices_and_the_lapse(gateway: RunningGateway) -> None:
    _, _, catalog = await _get(gateway.url + "/v1/catalog")

    assert catalog["credit"] == {
        "scheme": "sign-in-with-x",
        "lapseDays": 90,
        "sessionHeader": "X-CREDIT-SESSION",
        "sessionMaxSeconds": 3600,
    }
    entries = {r["path"]: r for r in catalog["routes"]}
    assert entries[BALANCE]["creditPrice"] == {"microUsdc": "5", "usd": "$0.000005"}
    assert entries[BALANCE]["price"]["microUsdc"] == "5"  # the external facilitator's fee is 0 here
    assert "creditPrice" not in entries[TOP_UP_5]
    assert entries[TOP_UP_5]["price"]["microUsdc"] == "5000000"


async def test_openapi_lists_the_sign_in_and_credit_price_of_paid_routes(gateway: RunningGateway) -> None:
    _, _, document = await _get(gateway.url + "/openapi.json")

    operation = document["paths"][BALANCE]["post"]
    assert {"$ref": "#/components/parameters/SignInWithX"} in operation["parameters"]
    assert operation["x-x402"]["creditPrice"] == {"microUsdc": "5", "usd": "$0.000005"}
    assert operation["x-x402"]["creditLapseDays"] == 90
    assert "buysCredit" not in operation["x-x402"]
    # A top-up is a purchase: it states the credit it buys, and costs no credit itself.
    top_up = document["paths"][TOP_UP_5]["post"]["x-x402"]
    assert top_up["buysCredit"] == top_up["price"] == {"microUsdc": "5000000", "usd": "$5.00"}
    assert "creditPrice" not in top_up


async def test_openapi_documents_the_credit_session_header_and_routes(gateway: RunningGateway) -> None:
    _, _, document = await _get(gateway.url + "/openapi.json")

    session = {"$ref": "#/components/parameters/XCreditSession"}
    assert session in document["paths"][BALANCE]["post"]["parameters"]
    assert session in document["paths"][SESSIONS]["delete"]["parameters"]
    assert sorted(document["paths"][SESSIONS]["delete"]["responses"]) == [
        "200",
        "400",
        "404",
        "405",
        "429",
        "503",
    ]
    header = document["components"]["parameters"]["XCreditSession"]
    assert header["name"] == "X-CREDIT-SESSION" and header["in"] == "header"
    assert "at most 1 hour" in header["description"] and "revoked" in header["description"]
    opened = {p["name"]: p for p in document["paths"][SESSIONS]["post"]["parameters"] if "name" in p}
    assert opened["capMicroUsdc"]["required"] is True
    assert opened["capMicroUsdc"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 1000000000}
    assert (
        opened["ttlSeconds"]["schema"]["maximum"] == 3600
        and opened["ttlSeconds"]["schema"]["default"] == 3600
    )


async def test_a_session_is_opened_and_revoked_over_http(gateway: RunningGateway) -> None:
    url = gateway.url + SESSIONS + "?capMicroUsdc=1500000&ttlSeconds=60"
    status, headers, _ = await _get(url, "POST")
    siwx = _required(headers)["extensions"]["sign-in-with-x"]
    assert status == 402 and siwx["info"]["uri"] == url
    assert siwx["info"]["statement"] == (
        f"Open a credit session on {gateway.url}: spend at most 1.5 USDC of prepaid credit for 1 minute."
    )
    wallet = Keypair()

    status, _, opened = await _get(url, "POST", headers={"SIGN-IN-WITH-X": sign_in(siwx, wallet)})
    token = opened["result"]["token"]
    revoked = await _get(gateway.url + SESSIONS, "DELETE", headers={"X-CREDIT-SESSION": token})
    preflight = await _get(gateway.url + SESSIONS, "OPTIONS")

    assert status == 200 and opened["method"] == "openSession"
    assert (opened["result"]["wallet"], opened["result"]["capMicroUsdc"]) == (str(wallet.pubkey()), "1500000")
    assert revoked[0] == 200 and revoked[2]["result"]["spentMicroUsdc"] == "0"
    assert preflight[0] == 204 and preflight[1]["ACCESS-CONTROL-ALLOW-METHODS"] == "POST, DELETE, OPTIONS"


def test_credit_is_refused_on_a_store_that_forgets_it() -> None:
    env = {**FULL_ENV, "GATEWAY_BASE_URL": "https://gw.example", "CREDITS_ENABLED": "true"}
    settings = load_settings(env)
    routes = load_routes(settings.routes_file, named_limits(settings))

    with pytest.raises(ConfigError, match="CREDITS_ENABLED needs a shared store that survives restarts"):
        plan_routes(routes, settings)


def test_without_credit_the_credit_routes_are_off() -> None:
    settings = load_settings({**FULL_ENV, "GATEWAY_BASE_URL": "https://gw.example"})
    mounted, warnings = plan_routes(load_routes(settings.routes_file, named_limits(settings)), settings)

    assert not [r for r in mounted if r.group == "credits"]
    assert not [w for w in warnings if "credits" in w]  # an option left off, not a group switched off


EXACT_ONLY = "/v1/exact-only/getBalance"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def exact_only(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningGateway]:
    """The packaged table plus a paid route that lists exact alone, with credit on."""
    doc: dict[str, Any] = yaml.safe_load(PACKAGED_ROUTES_FILE.read_text(encoding="utf-8"))
    packaged = load_routes(PACKAGED_ROUTES_FILE, named_limits(Settings(base_url="https://gw.example")))
    balance = next(r for r in packaged if r.path == BALANCE)
    doc["routes"].append(
        {
            "name": "exact_only.getBalance",
            "path": EXACT_ONLY,
            "method": "POST",
            "accepts": ["exact"],
            "handler": "jsonrpc",
            "group": "provider_a",
            "upstream": "provider_a_mainnet",
            "operation": "getBalance",
            "price": 1000,
            "description": "getBalance, paid per call only.",
            "input": {"body": balance.input["body"]},
        }
    )
    table = tmp_path_factory.mktemp("exact_only") / "routes.yaml"
    table.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    env = {**FULL_ENV, "CREDITS_ENABLED": "true", "STATE_STORE_REST_URL": redis_url}
    env["ROUTES_FILE"] = str(table)
    async with run_gateway(env) as running:
        yield running


async def test_a_route_that_does_not_list_credit_takes_none_while_credit_is_on(
    exact_only: RunningGateway,
) -> None:
    url = exact_only.url + EXACT_ONLY
    status, headers, _ = await _get(url, "POST", json={"params": []})
    required = _required(headers)
    _, beside, _ = await _get(exact_only.url + BALANCE, "POST", json={"params": []})
    signed = sign_in(_required(beside)["extensions"]["sign-in-with-x"], Keypair())
    again, again_headers, body = await _get(
        url, "POST", json={"params": []}, headers={"SIGN-IN-WITH-X": signed}
    )
    _, _, catalog = await _get(exact_only.url + "/v1/catalog")
    _, _, openapi = await _get(exact_only.url + "/openapi.json")

    assert status == 402 and [a["scheme"] for a in required["accepts"]] == ["exact"]
    assert "sign-in-with-x" not in required.get("extensions", {})
    # a sign-in is no credential here: the route's plain 402, nothing spent or taken
    assert again == 402 and "sign-in-with-x" not in _required(again_headers).get("extensions", {})
    assert body.get("error") is None
    entry = next(r for r in catalog["routes"] if r["path"] == EXACT_ONLY)
    assert entry["access"] == "exact" and entry.get("creditPrice") is None
    paid_with_credit = next(r for r in catalog["routes"] if r["path"] == BALANCE)
    assert paid_with_credit["creditPrice"] is not None
    parameters = openapi["paths"][EXACT_ONLY]["post"]["parameters"]
    assert {"$ref": "#/components/parameters/SignInWithX"} not in parameters
    assert "creditPrice" not in openapi["paths"][EXACT_ONLY]["post"]["x-x402"]
