"""``GET /docs``: the API reference page, served by the real gateway on loopback and rendered by a
real headless Chromium (Debian's package; the browser tests skip without it, ``.ci/run``
installs it). The page must show every published operation with the price ``/openapi.json``
states, under its own Content-Security-Policy, loading nothing from anywhere but the gateway.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.browser import CHROMIUM, chromium_page
from tests.support.gateway_server import FULL_ENV, PAY_TO, RunningGateway, run_gateway

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
DOCS_PATHS = ("/docs", "/docs/docs.js", "/docs/docs.css")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)",
)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def gateway() -> AsyncIterator[RunningGateway]:
    """Every route group mounted; a known fee payer, so no challenge would wait for a facilitator."""
    async with run_gateway({**FULL_ENV, "FACILITATOR_FEE_PAYER": PAY_TO, "LOG_LEVEL": "WARNING"}) as gw:
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
        assert entry["price"] == f"{balance['price']['usd']} per call"
        assert entry["open"], "the operation the URL names is opened"
        assert f"{balance['price']['microUsdc']} micro-USDC" in entry["text"]
        assert PAY_TO in entry["text"] and "getBalance" in entry["text"]
        free = next(op for op in rendered if op["path"] == "/healthz")
        assert free["price"] == "free"

        await page.evaluate("document.getElementById('filter').focus()")
        await page.type_text("getbalance")
        shown = await page.evaluate(
            """[...document.querySelectorAll("details.op")].filter((op) => !op.hidden)
                .map((op) => op.dataset.path)"""
        )
        assert sorted(shown) == sorted(path for _, path in published if path.endswith("/getBalance"))

        assert page.problems() == []
        assert page.requested_urls(), "the browser made no request"
        assert all(url.startswith(gateway.url + "/") for url in page.requested_urls()), page.requested_urls()
