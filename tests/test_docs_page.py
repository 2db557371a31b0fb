"""``GET /docs``: the API reference page, served by the real gateway on loopback and rendered by a
real headless Chromium (Debian's package; the browser tests skip without it, ``.ci/run``
installs it). The page must show every published operation with the price ``/openapi.json``
states, under its own Content-Security-Policy, loading nothing from anywhere but the gateway.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.x402.types import USDC_MAINNET_MINT as USDC
from tests.support.browser import CHROMIUM, chromium_page
from tests.support.gateway_process import clean_env
from tests.support.gateway_server import FULL_ENV, PAY_TO, RunningGateway, run_gateway
from tests.support.sandbox_process import Sandbox, run_sandbox

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
TOP_UP_5 = "/v1/x402/credits/top-up/5"
DOCS_PATHS = ("/docs", "/docs/docs.js", "/docs/docs.css")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)",
)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway(redis_url: str) -> AsyncIterator[RunningGateway]:
    """Every route group mounted, prepaid credit on (over Redis, as credit requires); a known fee
    payer, so no challenge would wait for a facilitator."""
    env = {
        **FULL_ENV,
        "FACILITATOR_FEE_PAYER": PAY_TO,
        "LOG_LEVEL": "WARNING",
        "CREDITS_ENABLED": "true",
        "STATE_STORE_REST_URL": redis_url,
    }
    async with run_gateway(env) as gw:
        yield gw


async def _get(
    http: aiohttp.ClientSession, url: str, method: str = "GET", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    async with http.request(method, url, headers=headers) as response:
        return response.status, {k.lower(): v for k, v in response.headers.items()}, await response.read()


async def _openapi(http: aiohttp.ClientSession, gateway: RunningGateway) -> dict[str, Any]:
    async with http.get(gateway.url + "/openapi.json") as response:
        assert response.status == 200
        document: dict[str, Any] = await response.json()
        return document


# --- what the gateway serves ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/docs", "text/html; charset=utf-8"),
        ("/docs/docs.js", "text/javascript; charset=utf-8"),
        ("/docs/docs.css", "text/css; charset=utf-8"),
    ],
)
async def test_each_file_has_its_content_type_an_etag_and_nosniff(
    gateway: RunningGateway, http: aiohttp.ClientSession, path: str, content_type: str
) -> None:
    status, headers, body = await _get(http, gateway.url + path)

    assert status == 200
    assert headers["content-type"] == content_type
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["etag"] == f'"{hashlib.sha256(body).hexdigest()[:16]}"'
    assert int(headers["content-length"]) == len(body) > 0
    head_status, head_headers, head_body = await _get(http, gateway.url + path, "HEAD")
    assert (head_status, head_body) == (200, b"")
    assert head_headers["etag"] == headers["etag"]
    assert head_headers["content-type"] == content_type


async def test_a_matching_if_none_match_gets_304_without_a_body(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    for path in DOCS_PATHS:
        _, headers, _ = await _get(http, gateway.url + path)
        etag = headers["etag"]
        for sent in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            status, again, body = await _get(http, gateway.url + path, **{"If-None-Match": sent})
            assert (status, body) == (304, b""), (path, sent)
            assert again["etag"] == etag
        status, _, _ = await _get(http, gateway.url + path, **{"If-None-Match": '"stale"'})
        assert status == 200


async def test_the_page_allows_only_its_own_script_style_and_document(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    _, headers, body = await _get(http, gateway.url + "/docs")
    policy = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))

    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == policy["style-src"] == policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == policy["base-uri"] == "'none'"
    assert headers["cache-control"] == "no-cache"
    assert headers["referrer-policy"] == "no-referrer"
    page = body.decode()
    assert "<script>" not in page and "<style" not in page and " style=" not in page and "http" not in page


async def test_the_page_names_each_asset_by_a_hash_of_its_content_so_they_can_be_kept(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    _, _, body = await _get(http, gateway.url + "/docs")
    named = dict(re.findall(r'"docs/(docs\.(?:js|css))\?v=([0-9a-f]{16})"', body.decode()))

    assert set(named) == {"docs.js", "docs.css"}
    for name, version in named.items():
        _, headers, asset = await _get(http, f"{gateway.url}/docs/{name}?v={version}")
        assert hashlib.sha256(asset).hexdigest()[:16] == version
        assert headers["cache-control"] == "public, max-age=86400"


async def test_the_docs_routes_are_not_published(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    document = await _openapi(http, gateway)
    async with http.get(gateway.url + "/v1/catalog") as response:
        catalog = await response.json()

    assert not any(path.startswith("/docs") for path in document["paths"])
    assert not any(route["path"].startswith("/docs") for route in catalog["routes"])
    status, _, _ = await _get(http, gateway.url + "/docs/other.js")
    assert status == 404
    status, headers, _ = await _get(http, gateway.url + "/docs", "POST")
    assert status == 405 and headers["allow"] == "GET, HEAD, OPTIONS"


# --- what a browser makes of it ------------------------------------------------------------------


@needs_chromium
def _sells_get_balance(document: dict[str, Any], path: str) -> bool:
    """The getBalance route, or a JSON-RPC endpoint whose calls may be getBalance (its summary
    names its methods, so the filter finds it too)."""
    terms = document["paths"][path].get("post", {}).get("x-x402")
    batch = isinstance(terms, dict) and "getBalance" in terms.get("methods", {})
    return path.endswith("/getBalance") or batch


async def test_a_headless_browser_renders_every_operation_with_its_price(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    document = await _openapi(http, gateway)
    published = {(method, path) for path, item in document["paths"].items() for method in item}
    balance = document["paths"][GET_BALANCE]["post"]["x-x402"]

    async with chromium_page() as page:
        await page.navigate(f"{gateway.url}/docs#{document['paths'][GET_BALANCE]['post']['operationId']}")
        state = await page.wait_for("document.documentElement?.dataset.state")
        rendered = await page.evaluate(
            """[...document.querySelectorAll("details.op")].map((op) => ({
                method: op.dataset.method, path: op.dataset.path, open: op.open,
                price: op.querySelector(".price").textContent, text: op.innerText}))"""
        )
        entry = next(op for op in rendered if op["path"] == GET_BALANCE)

        assert state == "ready", await page.evaluate("document.body.innerText")
        assert {(op["method"], op["path"]) for op in rendered} == published
        # The price per call and the price with prepaid credit, side by side.
        assert (
            entry["price"]
            == f"{balance['price']['usd']} per call · {balance['creditPrice']['usd']} with credit"
        )
        assert f"{balance['creditPrice']['microUsdc']} micro-USDC" in entry["text"]
        assert entry["open"], "the operation the URL names is opened"
        assert f"{balance['price']['microUsdc']} micro-USDC" in entry["text"]
        assert PAY_TO in entry["text"] and "getBalance" in entry["text"]
        free = next(op for op in rendered if op["path"] == "/healthz")
        assert free["price"] == "free"
        rpc = "/v1/x402/solana/mainnet/provider_a/rpc"
        fee = document["paths"][rpc]["post"]["x-x402"]["settlementFee"]["usd"]
        batch = next(op for op in rendered if op["path"] == rpc)
        assert batch["price"] == f"its calls' prices + {fee} per request"

        await page.evaluate("document.getElementById('filter').focus()")
        await page.type_text("getbalance")
        shown = await page.evaluate(
            """[...document.querySelectorAll("details.op")].filter((op) => !op.hidden)
                .map((op) => op.dataset.path)"""
        )
        assert sorted(shown) == sorted(path for _, path in published if _sells_get_balance(document, path))

        assert page.problems() == []
        assert page.requested_urls(), "the browser made no request"
        assert all(url.startswith(gateway.url + "/") for url in page.requested_urls()), page.requested_urls()


async def _rendered(page: Any, url: str) -> None:
    await page.navigate(url)
    state = await page.wait_for("document.documentElement?.dataset.state")
    assert state == "ready", await page.evaluate("document.body.innerText")


def _op(path: str) -> str:
    """The JavaScript expression of the rendered entry of ``path``."""
    return f"document.querySelector('details.op[data-path=\"{path}\"]')"


@needs_chromium
async def test_top_ups_read_as_purchases_and_group_names_and_counts_as_routes_yaml_and_the_filter_say(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    document = await _openapi(http, gateway)
    top_up = document["paths"][TOP_UP_5]["post"]["x-x402"]
    groups: dict[str, int] = {}
    for item in document["paths"].values():
        for operation in item.values():
            groups[operation["tags"][0]] = groups.get(operation["tags"][0], 0) + 1

    async with chromium_page() as page:
        await _rendered(page, f"{gateway.url}/docs")
        price = await page.evaluate(f"{_op(TOP_UP_5)}.querySelector('.price').textContent")
        assert price == f"{top_up['price']['usd']} buys {top_up['buysCredit']['usd']} of credit"
        assert "per call" not in price
        # Group names as routes.yaml writes them (shown, not only in the DOM), with their counts.
        headings = await page.evaluate(
            "[...document.querySelectorAll('section.group h2')].map((h) => h.innerText)"
        )
        assert headings == [f"{group} ({count})" for group, count in groups.items()]

        await page.evaluate("document.getElementById('filter').focus()")
        await page.type_text("getbalance")
        counted = await page.evaluate(
            """[...document.querySelectorAll("section.group")].map((s) => ({group: s.dataset.group,
                hidden: s.hidden, count: s.querySelector(".count").textContent,
                shown: s.querySelectorAll("details.op:not([hidden])").length}))"""
        )
        for section in counted:
            total = groups[section["group"]]
            assert section["count"] == f"({section['shown']} of {total})"
            assert section["hidden"] == (section["shown"] == 0)
        assert sum(s["shown"] for s in counted) == sum(
            1 for path in document["paths"] if _sells_get_balance(document, path)
        )
        await page.evaluate(
            "const f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input'))"
        )
        assert await page.evaluate(
            "[...document.querySelectorAll('section.group .count')].map((c) => c.textContent)"
        ) == [f"({count})" for count in groups.values()]
        assert page.problems() == []


@needs_chromium
async def test_try_it_sends_the_request_from_the_browser_and_decodes_the_402_or_shows_the_data(
    gateway: RunningGateway, http: aiohttp.ClientSession
) -> None:
    document = await _openapi(http, gateway)
    balance = document["paths"][GET_BALANCE]["post"]["x-x402"]

    async with chromium_page() as page:
        await _rendered(page, f"{gateway.url}/docs")
        # A paid route: its 402, decoded.
        await page.evaluate(
            f"{_op(GET_BALANCE)}.open = true; {_op(GET_BALANCE)}.querySelector('button.send').click()"
        )
        status = await page.wait_for(f"{_op(GET_BALANCE)}.querySelector('.answer').dataset.status")
        answer = await page.evaluate(f"{_op(GET_BALANCE)}.querySelector('.answer').innerText")
        assert status == "402", answer
        assert f"would cost\n{balance['price']['usd']} ({balance['price']['microUsdc']} base units" in answer
        assert f"paid to\n{PAY_TO}" in answer
        assert f"fee payer\n{PAY_TO}" in answer  # FACILITATOR_FEE_PAYER
        assert f"facilitator\n{FULL_ENV['FACILITATOR_URL'].rstrip('/')}" in answer
        assert "or sign in\nsign-in-with-x" in answer  # credit is on: the 402 offers it too
        # A free route: its data.
        await page.evaluate(
            f"{_op('/healthz')}.open = true; {_op('/healthz')}.querySelector('button.send').click()"
        )
        status = await page.wait_for(f"{_op('/healthz')}.querySelector('.answer').dataset.status")
        data = await page.evaluate(f"{_op('/healthz')}.querySelector('.answer pre.data').textContent")
        assert status == "200"
        async with http.get(gateway.url + "/healthz") as response:
            assert json.loads(data) == await response.json()

        # The browser logs the 402 it was asked to fetch as a failed load; nothing else went wrong.
        expected = "network: Failed to load resource: the server responded with a status of 402 ()"
        assert [p for p in page.problems() if p != expected] == []
        assert all(url.startswith(gateway.url + "/") for url in page.requested_urls()), page.requested_urls()


@needs_chromium
async def test_each_paid_route_gives_pay_python_and_javascript_snippets_for_itself(
    gateway: RunningGateway, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    document = await _openapi(http, gateway)
    example = document["paths"][GET_BALANCE]["post"]["requestBody"]["content"]["application/json"]["schema"]
    body = json.dumps(example["examples"][0], separators=(",", ":"))

    async with chromium_page() as page:
        await _rendered(page, f"{gateway.url}/docs")
        snippets = await page.evaluate(
            f"""Object.fromEntries([...{_op(GET_BALANCE)}.querySelectorAll("pre[data-snippet]")]
                .map((pre) => [pre.dataset.snippet, pre.textContent]))"""
        )
        top_up = await page.evaluate(f"{_op(TOP_UP_5)}.querySelector('pre[data-snippet=pay]').textContent")
        free = await page.evaluate(f"{_op('/healthz')}.querySelectorAll('pre[data-snippet]').length")

    url = gateway.url + GET_BALANCE
    assert shlex.split(snippets["pay"].replace("\\\n", "")) == [  # continuation lines joined, as bash does
        "x402-gateway", "pay", "POST", url, "--data", body, "--keypair", "$X402_KEYPAIR"
    ]  # fmt: skip
    assert f"await http.post({json.dumps(url)}, json=" in snippets["python"]
    compile(snippets["python"], "snippet.py", "exec")  # valid Python as pasted
    assert f"fetchWithPayment({json.dumps(url)}" in snippets["js"]
    assert f"body: JSON.stringify({body})" in snippets["js"]
    node = shutil.which("node")
    if node:  # valid JavaScript (a module) as pasted
        script = tmp_path / "pay.mjs"
        script.write_text(snippets["js"], encoding="utf-8")
        checked = await asyncio.create_subprocess_exec(
            node, "--check", str(script), stderr=asyncio.subprocess.PIPE
        )
        _, errors = await asyncio.wait_for(checked.communicate(), 30)
        assert checked.returncode == 0, errors.decode()
    assert shlex.split(top_up) == [
        "x402-gateway",
        "pay",
        "--top-up",
        "5",
        gateway.url,
        "--keypair",
        "$X402_KEYPAIR",
    ]
    assert free == 0


async def _snippets_of(url: str, path: str) -> dict[str, str]:
    async with chromium_page() as page:
        await _rendered(page, f"{url}/docs")
        snippets: dict[str, str] = await page.evaluate(
            f"""Object.fromEntries([...{_op(path)}.querySelectorAll("pre[data-snippet]")]
                .map((pre) => [pre.dataset.snippet, pre.textContent]))"""
        )
        return snippets


@needs_chromium
@pytest.mark.slow
def test_the_pay_and_python_snippets_pay_the_sandbox_as_pasted(tmp_path: Path) -> None:
    """Copied from the sandbox's own /docs and run with the banner's export line: each pays the
    route's price once."""
    with run_sandbox(script=True) as sandbox:
        snippets = asyncio.run(_snippets_of(sandbox.url, GET_BALANCE))
        price = _sandbox_price(sandbox.url)
        before = sandbox_usdc(sandbox, sandbox.wallet)
        env = {**sandbox.exports, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        paid = subprocess.run(
            ["bash", "-c", snippets["pay"]], env=clean_env(env), capture_output=True, text=True, timeout=60
        )
        assert paid.returncode == 0, paid.stderr
        assert sandbox_usdc(sandbox, sandbox.wallet) == before - price
        script = tmp_path / "snippet.py"
        script.write_text(snippets["python"], encoding="utf-8")
        ran = subprocess.run(
            [sys.executable, str(script)], env=clean_env(env), capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith("200 ")
        assert sandbox_usdc(sandbox, sandbox.wallet) == before - 2 * price


def _sandbox_price(url: str) -> int:
    request = urllib.request.Request(
        url + GET_BALANCE, data=b"{}", headers={"content-type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 402
    return int(json.loads(refused.value.read())["accepts"][0]["amount"])


def sandbox_usdc(sandbox: Sandbox, owner: str) -> int:
    """``owner``'s USDC on the sandbox chain, in base units."""
    params = [owner, {"mint": USDC}, {"encoding": "jsonParsed"}]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getTokenAccountsByOwner", "params": params})
    request = urllib.request.Request(
        sandbox.rpc_url, data=body.encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        owned = json.loads(resp.read())["result"]["value"]
    return sum(int(a["account"]["data"]["parsed"]["info"]["tokenAmount"]["amount"]) for a in owned)
