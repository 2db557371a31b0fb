"""A payment method is one module and one registration line: a method defined only in the test
suite (a fixed token, ``tests/support/token_method.py``, with its own credential header, receipt
header and outcome) is mounted through routes.yaml, and the 402, the paid answer and its
receipt, CORS, the catalog, OpenAPI, the metrics and the CLI all know it from its registration.
"""

from __future__ import annotations

import io
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from prometheus_client import REGISTRY

from gateway import cli
from gateway.config import PACKAGED_ROUTES_FILE, Settings
from gateway.methods.registry import METHODS, register, unregister
from gateway.routing.routes import load_routes, named_limits
from gateway.routing.vocabulary import ACCESS_MODES
from tests.support import token_method
from tests.support.gateway_server import FULL_ENV, RunningGateway, run_gateway
from tests.support.upstream import Upstream

PATH = "/v1/token-demo/getBalance"
ROUTE = "token_demo.getBalance"
BODY = b'{"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": ["11111111111111111111111111111111"]}'


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def registered() -> Iterator[None]:
    register(token_method.METHOD)  # the one registration line
    yield
    unregister(token_method.NAME)


def _table(directory: Path) -> Path:
    """The packaged table plus one route paid with the test token, as an operator writes it."""
    doc: dict[str, Any] = yaml.safe_load(PACKAGED_ROUTES_FILE.read_text(encoding="utf-8"))
    packaged = load_routes(PACKAGED_ROUTES_FILE, named_limits(Settings(base_url="https://gw.example")))
    balance = next(r for r in packaged if r.operation == "getBalance" and r.upstream == "provider_a_mainnet")
    doc["routes"].append(
        {
            "name": ROUTE,
            "path": PATH,
            "method": "POST",
            "accepts": [token_method.NAME],
            "handler": "jsonrpc",
            "group": "token_demo",
            "upstream": "provider_a_mainnet",
            "operation": "getBalance",
            "description": "getBalance, paid with the suite's test token.",
            "input": {"body": balance.input["body"]},
        }
    )
    (catalog,) = [r for r in doc["routes"] if r["handler"] == "catalog"]
    catalog["input"]["query"]["properties"]["provider"]["enum"].append("token_demo")
    path = directory / "routes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _table(tmp_path_factory.mktemp("token_method"))


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def provider() -> AsyncIterator[Upstream]:
    upstream = Upstream()
    await upstream.start()
    yield upstream
    await upstream.stop()


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(table: Path, provider: Upstream) -> AsyncIterator[RunningGateway]:
    env = {**FULL_ENV, "ROUTES_FILE": str(table), "PROVIDER_A_MAINNET_RPC_URL": provider.url + "/rpc"}
    async with run_gateway(env) as running:
        yield running


async def _post(
    gateway: RunningGateway, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as http, http.post(
        gateway.url + PATH, data=BODY, headers={"content-type": "application/json", **(headers or {})}
    ) as response:
        return response.status, dict(response.headers), await response.json()


def _payments(outcome: str) -> float | None:
    return REGISTRY.get_sample_value("x402_payments_total", {"route": ROUTE, "outcome": outcome})


async def test_without_its_token_the_route_answers_the_methods_own_402(
    gateway: RunningGateway, provider: Upstream
) -> None:
    calls = len(provider.calls)
    challenged = _payments("challenged") or 0.0

    status, headers, body = await _post(gateway)

    assert status == 402
    assert body == {"x402Version": 2, "accepts": [{"scheme": "test-token", "network": "test"}], "error": None}
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert len(provider.calls) == calls
    assert _payments("challenged") == challenged + 1


async def test_a_wrong_token_is_refused_with_the_methods_reason(
    gateway: RunningGateway, provider: Upstream
) -> None:
    calls, finished = len(provider.calls), len(token_method.LEDGER.finished)

    status, _, body = await _post(gateway, {"X-Test-Token": "guess"})

    assert (status, body["error"]) == (402, "invalid_token")
    assert len(provider.calls) == calls and len(token_method.LEDGER.finished) == finished


async def test_the_token_reaches_the_provider_once_and_is_finished_once(
    gateway: RunningGateway, provider: Upstream
) -> None:
    calls, finished = len(provider.calls), len(token_method.LEDGER.finished)
    spent, paid = _payments(token_method.SPENT) or 0.0, _payments("paid")
    usage = gateway.app.state.services.usage
    used = (await usage.snapshot([ROUTE]))[(ROUTE, "token")]

    status, headers, body = await _post(gateway, {"X-Test-Token": token_method.TOKEN})

    assert status == 200, body
    assert body == {"jsonrpc": "2.0", "id": 1, "result": {"value": 1}}
    assert "PAYMENT-RESPONSE" not in headers
    assert headers[token_method.RECEIPT.lower()] == f"open:{ROUTE}"  # its own receipt header
    assert len(provider.calls) == calls + 1
    assert provider.calls[-1].json["method"] == "getBalance"
    assert token_method.LEDGER.finished[finished:] == [ROUTE]
    assert _payments(token_method.SPENT) == spent + 1  # counted under its own outcome
    assert _payments("paid") == paid  # not a settled payment
    assert (await usage.snapshot([ROUTE]))[(ROUTE, "token")] == used + 1  # and in the shared usage


async def test_a_provider_failure_is_abandoned_and_nothing_finished(
    gateway: RunningGateway, provider: Upstream
) -> None:
    async def fail(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"error": "down"}, status=500)

    finished, abandoned = len(token_method.LEDGER.finished), len(token_method.LEDGER.abandoned)
    provider.responder = fail
    try:
        status, _, body = await _post(gateway, {"X-Test-Token": token_method.TOKEN})
    finally:
        provider.responder = None

    assert (status, body["error"]["code"]) == (502, "upstream_error")
    assert len(token_method.LEDGER.finished) == finished
    assert token_method.LEDGER.abandoned[abandoned:] == [ROUTE]


async def test_the_catalog_and_openapi_describe_it_from_its_registration(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(gateway.url + "/v1/catalog") as response:
            entry = next(r for r in (await response.json())["routes"] if r["name"] == ROUTE)
        async with http.get(gateway.url + "/openapi.json") as response:
            operation = (await response.json())["paths"][PATH]["post"]

    assert (entry["access"], entry["scheme"]) == ("test_token", "test-token")
    assert "payTo" not in entry and "asset" not in entry  # not sold for USDC
    assert {"$ref": "#/components/parameters/XTestToken"} in operation["parameters"]
    assert list(operation["responses"]["200"]["headers"]) == [token_method.RECEIPT]
    assert operation["x-x402"]["scheme"] == "test-token"
    assert sorted(operation["responses"]) == ["200", "400", "402", "405", "413", "502", "504"]


async def test_browsers_may_send_its_credential_and_read_its_receipt(gateway: RunningGateway) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.options(
            gateway.url + PATH,
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        ) as response:
            allowed = [h.strip() for h in response.headers["Access-Control-Allow-Headers"].split(",")]
        status, headers, _ = await _post(gateway, {"X-Test-Token": token_method.TOKEN})

    assert status == 200
    assert "X-Test-Token" in allowed and "PAYMENT-SIGNATURE" in allowed
    exposed = [h.strip() for h in headers["Access-Control-Expose-Headers"].split(",")]
    assert token_method.RECEIPT in exposed and "PAYMENT-RESPONSE" in exposed


def test_its_outcome_series_exist_from_start_up(gateway: RunningGateway) -> None:
    """Every outcome it declares is a series at 0 before its first request, its own included."""
    for outcome in token_method.MODE.outcomes:
        assert _payments(outcome) is not None, outcome


def test_the_cli_lists_it(table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTES_FILE", str(table))
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["routes"]) == 0
    line = next(row for row in out.getvalue().splitlines() if row.endswith(PATH))
    assert line.split()[:2] == ["POST", "test_token"]


def test_routes_yaml_knows_the_word_only_while_it_is_registered(table: Path) -> None:
    assert ACCESS_MODES[token_method.NAME] is token_method.MODE
    assert METHODS[token_method.NAME] is token_method.METHOD
    unregister(token_method.NAME)
    try:
        with pytest.raises(Exception, match="test_token"):
            load_routes(table, named_limits(Settings(base_url="https://gw.example")))
    finally:
        register(token_method.METHOD)


def test_a_new_method_is_one_module_plus_one_registration_line() -> None:
    """No code or configuration outside its module names it (its word, headers, outcome or
    module), and the one line that registers it is this test's."""
    words = (token_method.NAME, "X-Test-Token", token_method.RECEIPT, token_method.SPENT, "token_method")
    naming_it = re.compile("|".join(rf"\b{re.escape(word)}\b" for word in words))
    module = REPO / "tests" / "support" / "token_method.py"
    this = Path(__file__).resolve()
    naming = sorted(
        str(path.relative_to(REPO))
        for top in ("gateway", "middleware", "client", "tests", "deploy")
        for path in (REPO / top).rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".yaml", ".yml", ".md", ".toml", ".lua", ".json"}
        and path.resolve() not in {module, this}
        and naming_it.search(path.read_text(encoding="utf-8", errors="replace"))
    )
    assert naming == []
    call = "register" + "(token_method.METHOD)"
    lines = this.read_text(encoding="utf-8").splitlines()
    registrations = {line.split("#")[0].strip() for line in lines if re.search(r"\bregister\(", line)}
    assert registrations == {call}
