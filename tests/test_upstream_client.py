"""The one outbound seam, and every client of it, in-process: no gateway, no subprocess.

:class:`UpstreamClient` is driven against real loopback HTTP servers (pytest-aiohttp's
``aiohttp_server``, on 127.0.0.1), then each of its four callers is handed one: the JSON-RPC
proxy and the asset-data handler run as ASGI apps behind the real error boundary
(``MethodDispatcher``), the Solana RPC client against a loopback node, and the external
facilitator's client against the third party's HTTP answered in-process through the transport
seam (``AsgiTransport``: a broken answer, a timeout, a redirect on cue). Each caller must still
say exactly what it said before the seam: statuses, codes, messages, metrics.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import REGISTRY
from pytest_aiohttp import AiohttpServer

from gateway.facilitators.http import FacilitatorUnavailable, HttpFacilitator
from gateway.handlers.jsonrpc import JsonRpcProxy
from gateway.handlers.tokens import TokensHandler
from gateway.outbound.asgi import AsgiTransport
from gateway.outbound.client import (
    SESSION_CLOSED,
    UpstreamClient,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.outbound.solana_rpc import RpcResponseError, RpcUnavailable, SolanaRpc
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import ValidatedInput
from gateway.telemetry.redact import redact_url
from gateway.web.asgi import ASGIApp, Receive, Scope, Send
from gateway.web.context import request_context
from gateway.web.router import MethodDispatcher
from gateway.x402.types import SOLANA_MAINNET, USDC_MAINNET_MINT, PaymentPayload, PaymentRequirements
from tests.support.inprocess import balance_route, call
from tests.support.outbound import Reply, ThirdParty
from tests.support.ports import refusing_port

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SLOW_S = 1.0
TIMEOUT_S = 0.2
_names = itertools.count()


def fresh_name(prefix: str) -> str:
    """An upstream name no other test in this process has metered."""
    return f"{prefix}_{next(_names)}"


def duration_count(upstream: str) -> float:
    return REGISTRY.get_sample_value("x402_upstream_duration_seconds_count", {"upstream": upstream}) or 0.0


def errors(upstream: str) -> dict[str, float]:
    """The upstream's error counts by kind (only the kinds that occurred)."""
    return {
        s.labels["kind"]: s.value
        for family in REGISTRY.collect()
        if family.name == "x402_upstream_errors"
        for s in family.samples
        if s.name == "x402_upstream_errors_total" and s.labels["upstream"] == upstream
    }


async def serve(aiohttp_server: AiohttpServer, handler: Handler) -> str:
    """``handler`` answers every request on a loopback server; its base URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


def answering(
    status: int = 200, payload: Any = None, *, text: str | None = None, delay: float = 0.0
) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        if text is not None:
            return web.Response(status=status, text=text, content_type="application/json")
        return web.json_response(payload, status=status)

    return answer


def refused_url() -> str:
    return f"http://127.0.0.1:{refusing_port()}"


# --- the seam ------------------------------------------------------------------------------------


async def test_an_answer_comes_back_whole_and_the_call_is_timed(aiohttp_server: AiohttpServer) -> None:
    seen: list[tuple[str, str, bytes]] = []

    async def echo(request: web.Request) -> web.StreamResponse:
        seen.append((request.method, request.headers["x-probe"], await request.read()))
        return web.json_response({"n": 1}, headers={"retry-after": "3"})

    url = await serve(aiohttp_server, echo)
    name = fresh_name("seam_ok")
    client = UpstreamClient(timeout_s=5, upstream=name)
    try:
        answer = await client.request("PUT", url + "/x", data=b"payload", headers={"x-probe": "yes"})
    finally:
        await client.close()

    assert (answer.status, answer.ok, json.loads(answer.body)) == (200, True, {"n": 1})
    assert answer.headers["Retry-After"] == "3"  # read case-insensitively
    assert seen == [("PUT", "yes", b"payload")]
    assert duration_count(name) == 1 and errors(name) == {}


@pytest.mark.parametrize(("status", "kind"), [(503, "http_5xx"), (404, "http_4xx")])
async def test_a_status_outside_2xx_is_raised_with_its_answer_and_counted_by_kind(
    aiohttp_server: AiohttpServer, status: int, kind: str
) -> None:
    url = await serve(aiohttp_server, answering(status, {"why": "no"}))
    name = fresh_name("seam_status")
    client = UpstreamClient(timeout_s=5, upstream=name)
    try:
        with pytest.raises(UpstreamStatus) as caught:
            await client.request("GET", url)
        accepted = await client.request("GET", url, accept={status})
    finally:
        await client.close()

    assert caught.value.status == status and json.loads(caught.value.answer.body) == {"why": "no"}
    assert accepted.status == status and not accepted.ok
    assert errors(name) == {kind: 1}  # the accepted answer is the caller's to judge
    assert duration_count(name) == 2


async def test_no_answer_in_time_is_a_timeout(aiohttp_server: AiohttpServer) -> None:
    url = await serve(aiohttp_server, answering(200, {}, delay=SLOW_S))
    name = fresh_name("seam_slow")
    client = UpstreamClient(timeout_s=TIMEOUT_S, upstream=name)
    try:
        with pytest.raises(UpstreamTimeout):
            await client.request("GET", url)
    finally:
        await client.close()

    assert errors(name) == {"timeout": 1} and duration_count(name) == 1


async def test_a_refused_connection_is_unreachable_and_names_no_url() -> None:
    name = fresh_name("seam_refused")
    client = UpstreamClient(timeout_s=5, upstream=name)
    try:
        with pytest.raises(UpstreamUnreachable) as caught:
            await client.request("GET", refused_url() + "/?api-key=SECRET-KEY")
    finally:
        await client.close()

    assert caught.value.cause == "ClientConnectorError"
    assert "SECRET" not in str(caught.value) and "127.0.0.1" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert errors(name) == {"connection": 1}


async def test_an_answer_over_the_cap_is_too_large(aiohttp_server: AiohttpServer) -> None:
    url = await serve(aiohttp_server, answering(200, text="x" * 5000))
    name = fresh_name("seam_large")
    client = UpstreamClient(timeout_s=5, max_bytes=1024, upstream=name)
    try:
        with pytest.raises(UpstreamTooLarge) as caught:
            await client.request("GET", url)
    finally:
        await client.close()

    assert caught.value.limit == 1024
    assert errors(name) == {"invalid_answer": 1}


async def test_redirects_are_followed_unless_the_client_says_not(aiohttp_server: AiohttpServer) -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        if request.path == "/there":
            return web.json_response({"here": True})
        raise web.HTTPFound("/there")

    url = await serve(aiohttp_server, moved)
    name = fresh_name("seam_redirect")
    follows = UpstreamClient(timeout_s=5)
    stays = UpstreamClient(follows, timeout_s=5, upstream=name, follow_redirects=False)
    try:
        followed = await follows.request("GET", url + "/here")
        with pytest.raises(UpstreamStatus) as caught:
            await stays.request("GET", url + "/here")
    finally:
        await follows.close()

    assert json.loads(followed.body) == {"here": True}
    assert caught.value.status == 302 and errors(name) == {"http_other": 1}


async def test_its_own_session_lives_until_close_and_a_later_call_opens_another(
    aiohttp_server: AiohttpServer,
) -> None:
    url = await serve(aiohttp_server, answering(200, {}))
    client = UpstreamClient(timeout_s=5)
    assert client.session is None  # nothing opened before the first call (or open())

    await client.request("GET", url)
    first = client.session
    await client.request("GET", url)
    assert client.session is first and first is not None

    await client.close()
    assert first.closed and client.session is None
    await client.request("GET", url)
    assert client.session is not None and client.session is not first
    await client.close()


async def test_a_borrowed_or_shared_session_is_never_closed_by_its_borrower(
    aiohttp_server: AiohttpServer,
) -> None:
    url = await serve(aiohttp_server, answering(200, {}))
    async with aiohttp.ClientSession() as borrowed:
        client = UpstreamClient(borrowed, timeout_s=5)
        await client.request("GET", url)
        await client.close()
        assert client.session is borrowed and not borrowed.closed

    owner = UpstreamClient(timeout_s=5)
    owner.open()
    sharer = UpstreamClient(owner, timeout_s=1, upstream=fresh_name("seam_shared"))
    await sharer.request("GET", url)
    assert sharer.session is owner.session
    await sharer.close()
    shared = owner.session
    assert shared is not None and not shared.closed
    await owner.close()
    assert shared.closed


async def test_a_borrowed_session_closed_by_its_owner_is_unreachable_and_sends_nothing(
    aiohttp_server: AiohttpServer,
) -> None:
    calls: list[str] = []

    async def count(request: web.Request) -> web.StreamResponse:
        calls.append(request.path)
        return web.json_response({})

    url = await serve(aiohttp_server, count)
    borrowed = aiohttp.ClientSession()
    await borrowed.close()
    client = UpstreamClient(borrowed, timeout_s=5)

    with pytest.raises(UpstreamUnreachable) as caught:
        await client.request("GET", url)

    assert caught.value.cause == SESSION_CLOSED and calls == []


# --- the JSON-RPC proxy ----------------------------------------------------------------------------

FAILURE_FIELDS = ("handler", "options", "status", "code", "message", "details", "kind")
"""An upstream's answer (None: nothing listens), the client's options, then what the handler
must answer (status, code, message, details) and the error kind counted."""


def error_shape(code: str, message: str, details: dict[str, Any] | None) -> dict[str, Any]:
    return {"code": code, "message": message, **({"details": details} if details is not None else {})}


BALANCE_INPUT = {"jsonrpc": "2.0", "id": 7, "method": "getBalance", "params": ["Acct1111"], "extra": "x"}


def validated(handler: ASGIApp, value: ValidatedInput) -> ASGIApp:
    """``handler`` with its input validated, as the route's access layer leaves it."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        request_context(scope).input = value
        await handler(scope, receive, send)

    return app


async def rpc_call(proxy: JsonRpcProxy) -> Any:
    route = balance_route()
    app = MethodDispatcher(
        {"POST": (route, validated(proxy, ValidatedInput(path={}, query={}, body=BALANCE_INPUT)))}, "POST"
    )
    return await call(app, "POST", route.path)


def proxy_to(url: str, name: str, **options: Any) -> JsonRpcProxy:
    options.setdefault("timeout_s", 5)
    return JsonRpcProxy(url=url, method="getBalance", client=UpstreamClient(upstream=name, **options))


async def test_the_proxy_sends_four_fields_and_passes_the_answer_through(
    aiohttp_server: AiohttpServer,
) -> None:
    sent: list[Any] = []
    body = b'{"jsonrpc":"2.0","id":7,"result":{"context":{"slot":3},"value":42}}'

    async def provider(request: web.Request) -> web.StreamResponse:
        sent.append((request.headers["content-type"], await request.json()))
        return web.Response(body=body, content_type="application/json")

    name = fresh_name("proxy_ok")
    proxy = proxy_to(await serve(aiohttp_server, provider), name)
    try:
        answer = await rpc_call(proxy)
    finally:
        await proxy.client.close()

    assert answer.status == 200 and answer.body == body
    assert sent == [
        ("application/json", {"jsonrpc": "2.0", "id": 7, "method": "getBalance", "params": ["Acct1111"]})
    ]
    assert duration_count(name) == 1 and errors(name) == {}


PROXY_FAILURES = [
    pytest.param(
        answering(500, {"oops": 1}), {}, 502, "upstream_error",
        "provider answered HTTP 500; nothing was charged", {"status": 500}, "http_5xx", id="5xx",
    ),
    pytest.param(
        answering(200, {}, delay=SLOW_S), {"timeout_s": TIMEOUT_S}, 504, "upstream_timeout",
        "provider timed out; nothing was charged", None, "timeout", id="timeout",
    ),
    pytest.param(
        answering(200, text='{"result":"' + "x" * 4000 + '"}'), {"max_bytes": 1024}, 502, "upstream_error",
        "upstream answer too large; nothing was charged", None, "invalid_answer", id="too-large",
    ),
    pytest.param(
        None, {}, 502, "upstream_error",
        "provider unreachable; nothing was charged", None, "connection", id="unreachable",
    ),
    pytest.param(
        answering(200, text="<html>"), {}, 502, "upstream_error",
        "provider answered with invalid JSON-RPC", None, "invalid_answer", id="invalid-json",
    ),
    pytest.param(
        answering(200, {"jsonrpc": "2.0", "id": 7}), {}, 502, "upstream_error",
        "provider answer has no result; nothing was charged", None, "invalid_answer", id="no-result",
    ),
]  # fmt: skip


@pytest.mark.parametrize(FAILURE_FIELDS, PROXY_FAILURES)
async def test_each_provider_failure_is_the_same_error_as_before_the_seam(
    aiohttp_server: AiohttpServer,
    handler: Handler | None,
    options: dict[str, Any],
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None,
    kind: str,
) -> None:
    url = refused_url() if handler is None else await serve(aiohttp_server, handler)
    name = fresh_name("proxy_fails")
    proxy = proxy_to(url, name, **options)
    try:
        answer = await rpc_call(proxy)
    finally:
        await proxy.client.close()

    assert answer.status == status
    assert answer.json()["error"] == error_shape(code, message, details)
    assert errors(name) == {kind: 1} and duration_count(name) == 1


async def test_a_provider_rpc_error_is_passed_on_without_the_key_in_its_url(
    aiohttp_server: AiohttpServer,
) -> None:
    error = {"code": -32602, "message": "bad params for /rpc?api-key=PROVIDER-SECRET-1"}
    url = await serve(aiohttp_server, answering(200, {"jsonrpc": "2.0", "id": 7, "error": error}))
    name = fresh_name("proxy_rpc_error")
    proxy = proxy_to(url + "/rpc?api-key=PROVIDER-SECRET-1", name)
    try:
        answer = await rpc_call(proxy)
    finally:
        await proxy.client.close()

    assert answer.status == 502
    assert answer.json()["error"]["message"] == "provider returned a JSON-RPC error; nothing was charged"
    rpc_error = answer.json()["error"]["details"]["rpcError"]
    assert rpc_error["code"] == -32602 and "PROVIDER-SECRET-1" not in rpc_error["message"]
    assert errors(name) == {"rpc_error": 1}


# --- the asset-data handler ------------------------------------------------------------------------

API_KEY = "asset-key-outbound-0123456789"
OHLCV_ROUTE = RouteSpec(
    name="asset_ohlcv",
    path="/v1/assets/{assetId}/ohlcv",
    method="GET",
    access="siwx",
    handler="tokens",
    group="tokens",
    description="Candles of one asset",
    upstream="asset_api",
    upstream_path="/v1/assets/{assetId}/ohlcv",
    operation="assets.ohlcv",
)


async def tokens_call(handler: TokensHandler, query: dict[str, Any] | None = None) -> Any:
    value = ValidatedInput(path={"assetId": "So1/x"}, query=query or {"interval": "1h"})
    app = MethodDispatcher({"GET": (OHLCV_ROUTE, validated(handler, value))}, "GET")
    return await call(app, "GET", "/v1/assets/So1%2Fx/ohlcv", headers={"accept": "application/json"})


def tokens_to(url: str, name: str, **options: Any) -> TokensHandler:
    options.setdefault("timeout_s", 5)
    client = UpstreamClient(upstream=name, **options)
    return TokensHandler(OHLCV_ROUTE, base_url=url, api_key=API_KEY, client=client)


async def test_the_asset_handler_sends_the_key_and_wraps_the_scrubbed_answer(
    aiohttp_server: AiohttpServer,
) -> None:
    sent: list[tuple[str, str, str]] = []

    async def api(request: web.Request) -> web.StreamResponse:
        sent.append((request.raw_path, request.headers["x-api-key"], request.headers["accept"]))
        return web.json_response({"candles": [1, 2], "echo": f"key={API_KEY}"})

    name = fresh_name("tokens_ok")
    handler = tokens_to(await serve(aiohttp_server, api), name)
    try:
        answer = await tokens_call(handler)
    finally:
        await handler.client.close()

    assert answer.status == 200
    assert answer.json() == {
        "ok": True,
        "provider": "tokens",
        "surface": "tokens",
        "method": "assets.ohlcv",
        "result": {"candles": [1, 2], "echo": "key=[redacted]"},
    }
    assert sent == [("/v1/assets/So1%2Fx/ohlcv?interval=1h", API_KEY, "application/json")]
    assert duration_count(name) == 1 and errors(name) == {}


TOKENS_FAILURES = [
    pytest.param(
        answering(404, {}), {}, 404, "not_found",
        "the asset-data upstream has no such resource", {"upstreamStatus": 404}, "http_4xx", id="404",
    ),
    pytest.param(
        answering(422, {}), {}, 400, "invalid_request",
        "the asset-data upstream refused the request", {"upstreamStatus": 422}, "http_4xx", id="422",
    ),
    pytest.param(
        answering(401, {}), {}, 502, "upstream_error",
        "the asset-data upstream answered 401", {"upstreamStatus": 401}, "http_4xx", id="401",
    ),
    pytest.param(
        answering(503, {}), {}, 502, "upstream_error",
        "the asset-data upstream answered 503", {"upstreamStatus": 503}, "http_5xx", id="503",
    ),
    pytest.param(
        answering(200, {}, delay=SLOW_S), {"timeout_s": TIMEOUT_S}, 504, "upstream_timeout",
        "the asset-data upstream did not answer in time", None, "timeout", id="timeout",
    ),
    pytest.param(
        None, {}, 502, "upstream_error",
        "the asset-data upstream is unreachable", None, "connection", id="unreachable",
    ),
    pytest.param(
        answering(200, text="x" * 5000), {"max_bytes": 1024}, 502, "upstream_error",
        "the asset-data upstream answered more than 1024 bytes", None, "invalid_answer", id="too-large",
    ),
    pytest.param(
        answering(200, text="{not json"), {}, 502, "upstream_error",
        "the asset-data upstream answered with invalid JSON", None, "invalid_answer", id="invalid-json",
    ),
]  # fmt: skip


@pytest.mark.parametrize(FAILURE_FIELDS, TOKENS_FAILURES)
async def test_each_asset_api_failure_is_the_same_error_as_before_the_seam(
    aiohttp_server: AiohttpServer,
    handler: Handler | None,
    options: dict[str, Any],
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None,
    kind: str,
) -> None:
    url = refused_url() if handler is None else await serve(aiohttp_server, handler)
    name = fresh_name("tokens_fails")
    tokens = tokens_to(url, name, **options)
    try:
        answer = await tokens_call(tokens)
    finally:
        await tokens.client.close()

    assert answer.status == status
    assert answer.json()["error"] == error_shape(code, message, details)
    assert errors(name) == {kind: 1} and duration_count(name) == 1


@pytest.mark.parametrize(("retry_after", "expected"), [("7", "7"), ("soon", "60"), ("999999", "3600")])
async def test_an_asset_api_rate_limit_keeps_a_sane_retry_after(
    aiohttp_server: AiohttpServer, retry_after: str, expected: str
) -> None:
    async def limited(request: web.Request) -> web.StreamResponse:
        return web.json_response({}, status=429, headers={"Retry-After": retry_after})

    tokens = tokens_to(await serve(aiohttp_server, limited), fresh_name("tokens_429"))
    try:
        answer = await tokens_call(tokens)
    finally:
        await tokens.client.close()

    assert (answer.status, answer.reason, answer.headers["retry-after"]) == (429, "rate_limited", expected)


# --- the Solana RPC client -------------------------------------------------------------------------

ACCOUNT = "11111111111111111111111111111111"


async def test_the_rpc_client_speaks_json_rpc_through_the_seam(aiohttp_server: AiohttpServer) -> None:
    sent: list[Any] = []

    async def node(request: web.Request) -> web.StreamResponse:
        sent.append((request.headers["content-type"], request.headers["accept"], await request.json()))
        return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 5}, "value": 99}})

    name = fresh_name("rpc_ok")
    rpc = SolanaRpc(await serve(aiohttp_server, node), timeout_s=5, upstream=name)
    try:
        assert await rpc.get_balance(ACCOUNT) == 99
    finally:
        await rpc.close()

    (content_type, accept, request), = sent
    assert (content_type, accept) == ("application/json", "application/json")
    assert request["method"] == "getBalance" and request["params"] == [ACCOUNT, {"commitment": "confirmed"}]
    assert duration_count(name) == 1 and errors(name) == {}


@pytest.mark.parametrize(
    ("handler", "raised", "message", "kind"),
    [
        pytest.param(
            answering(429, {"jsonrpc": "2.0", "id": 1, "error": {"code": 429, "message": "slow down"}}),
            RpcResponseError, "getBalance: error 429: slow down", "rpc_error", id="error-with-a-status",
        ),
        pytest.param(
            answering(503, text="down"), RpcUnavailable, "getBalance: HTTP 503", "http_5xx", id="503",
        ),
        pytest.param(
            answering(200, {"jsonrpc": "2.0", "id": 1}), RpcUnavailable,
            "getBalance: HTTP 200 without a result", "invalid_answer", id="no-result",
        ),
        pytest.param(
            None, RpcUnavailable, "getBalance: node unreachable (ClientConnectorError)", "connection",
            id="unreachable",
        ),
    ],
)  # fmt: skip
async def test_each_node_failure_is_the_same_error_as_before_the_seam(
    aiohttp_server: AiohttpServer, handler: Handler | None, raised: type[Exception], message: str, kind: str
) -> None:
    url = refused_url() if handler is None else await serve(aiohttp_server, handler)
    name = fresh_name("rpc_fails")
    rpc = SolanaRpc(url + "/?api-key=NODE-SECRET", timeout_s=5, upstream=name)
    try:
        with pytest.raises(raised) as caught:
            await rpc.get_balance(ACCOUNT)
    finally:
        await rpc.close()

    assert str(caught.value) == message
    assert errors(name) == {kind: 1}


async def test_a_slow_node_is_unavailable_with_the_timeout_named(aiohttp_server: AiohttpServer) -> None:
    url = await serve(aiohttp_server, answering(200, {}, delay=SLOW_S))
    name = fresh_name("rpc_slow")
    rpc = SolanaRpc(url, timeout_s=TIMEOUT_S, upstream=name)
    try:
        with pytest.raises(RpcUnavailable) as caught:
            await rpc.get_balance(ACCOUNT)
    finally:
        await rpc.close()

    assert str(caught.value).startswith("getBalance: node unreachable (") and "Timeout" in str(caught.value)
    assert errors(name) == {"timeout": 1}


async def test_node_clients_over_one_shared_session_are_metered_apart(aiohttp_server: AiohttpServer) -> None:
    """As the internal facilitator runs its nodes: one session, one name per node."""
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 5}, "value": 1}}
    url = await serve(aiohttp_server, answering(200, answer))
    shared = UpstreamClient(timeout_s=5)
    mainnet, devnet = fresh_name("rpc_main"), fresh_name("rpc_dev")
    first = SolanaRpc(url, shared, timeout_s=5, upstream=mainnet)
    second = SolanaRpc(url, shared, timeout_s=5, upstream=devnet)

    await first.get_balance(ACCOUNT)
    await second.get_balance(ACCOUNT)
    await second.get_balance(ACCOUNT)
    await first.close()
    await second.close()
    session = shared.session

    assert (duration_count(mainnet), duration_count(devnet)) == (1, 2)
    assert session is not None and not session.closed
    await shared.close()
    assert session.closed


# --- the external facilitator's client, against the third party's HTTP ------------------------------

FACILITATOR = "https://facilitator.example/platform/x402"
REQUIREMENTS = PaymentRequirements(
    scheme="exact",
    network=SOLANA_MAINNET,
    amount="1000",
    asset=USDC_MAINNET_MINT,
    payTo="9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin",
    maxTimeoutSeconds=60,
)
PAYLOAD = PaymentPayload(x402Version=2, payload={"transaction": "AQID"}, accepted=REQUIREMENTS)
WHERE = f"facilitator verify at {redact_url(FACILITATOR)}"


FACILITATOR_TIMEOUT_S = 0.5


@pytest.fixture
def third_party() -> ThirdParty:
    """The facilitator's HTTP API, in-process: it answers what a test queues for a path."""
    return ThirdParty(lambda seen: Reply(404, b'{"error":"not queued"}'))


@pytest.fixture
async def facilitator(third_party: ThirdParty) -> Any:
    transport = AsgiTransport({"facilitator.example": third_party})
    client = HttpFacilitator(
        FACILITATOR,
        timeout_s=FACILITATOR_TIMEOUT_S,
        session=UpstreamClient(transport, timeout_s=FACILITATOR_TIMEOUT_S),
    )
    yield client
    await client.close()


VERIFY_PATH = "/platform/x402/verify"


async def test_the_facilitator_client_asks_through_the_seam(
    third_party: ThirdParty, facilitator: HttpFacilitator
) -> None:
    before = duration_count("facilitator_verify")
    third_party.then(VERIFY_PATH, Reply.of({"isValid": True, "payer": "Payer111"}))

    verified = await facilitator.verify(PAYLOAD, REQUIREMENTS)

    assert verified.isValid and verified.payer == "Payer111"
    [request] = third_party.seen
    assert (request.method, request.path) == ("POST", VERIFY_PATH)
    assert request.headers["host"] == "facilitator.example"
    assert request.headers["content-type"] == "application/json"
    assert request.json()["paymentRequirements"]["amount"] == "1000"
    assert duration_count("facilitator_verify") == before + 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        pytest.param(Reply(401, b""), f"{WHERE}: HTTP 401 (API key refused)", id="401"),
        pytest.param(Reply(503, b""), f"{WHERE}: HTTP 503", id="503"),
        pytest.param(Reply(302, b"", location="https://elsewhere.example/"), f"{WHERE}: HTTP 302",
                     id="redirect-not-followed"),
        pytest.param(Reply(400, b"garbage"), f"{WHERE}: HTTP 400", id="400-without-an-answer"),
        pytest.param(Reply(200, b"[]"), f"{WHERE}: answer is not a valid verify response",
                     id="200-without-an-answer"),
        pytest.param(Reply(broken=True), f"{WHERE}: ClientPayloadError", id="broken-mid-answer"),
        pytest.param(Reply(hang=True), f"{WHERE}: timed out after {FACILITATOR_TIMEOUT_S:g}s", id="timeout"),
    ],
)  # fmt: skip
async def test_each_facilitator_failure_is_unavailable_as_before_the_seam(
    third_party: ThirdParty, facilitator: HttpFacilitator, reply: Reply, message: str
) -> None:
    third_party.then(VERIFY_PATH, reply)

    with pytest.raises(FacilitatorUnavailable) as caught:
        await facilitator.verify(PAYLOAD, REQUIREMENTS)

    assert str(caught.value) == message
    assert len(third_party.seen) == 1  # a redirect is never followed: the token is for one host


async def test_an_unreachable_facilitator_is_unavailable() -> None:
    client = HttpFacilitator(FACILITATOR, session=UpstreamClient(AsgiTransport({}), timeout_s=1))

    with pytest.raises(FacilitatorUnavailable) as caught:
        await client.verify(PAYLOAD, REQUIREMENTS)

    assert str(caught.value) == f"{WHERE}: ConnectionRefusedError"


async def test_a_refusal_with_an_answer_status_is_an_answer(
    third_party: ThirdParty, facilitator: HttpFacilitator
) -> None:
    third_party.then(VERIFY_PATH, Reply.of({"isValid": False, "invalidReason": "insufficient_funds"}, 400))

    verified = await facilitator.verify(PAYLOAD, REQUIREMENTS)

    assert not verified.isValid and verified.invalidReason == "insufficient_funds"


async def test_an_oversized_facilitator_answer_is_unavailable(aiohttp_server: AiohttpServer) -> None:
    """Over a socket: the cap holds however the body arrives."""
    padded = '{"isValid": true, "pad": "' + "x" * (1 << 20) + '"}'
    url = await serve(aiohttp_server, answering(200, text=padded)) + "/x402"
    client = HttpFacilitator(url, timeout_s=2)
    try:
        with pytest.raises(FacilitatorUnavailable) as caught:
            await client.verify(PAYLOAD, REQUIREMENTS)
    finally:
        await client.close()

    where = f"facilitator verify at {redact_url(url)}"
    assert str(caught.value) == f"{where}: answer larger than 1048576 bytes"


async def test_a_facilitator_over_a_shared_session_leaves_it_open(aiohttp_server: AiohttpServer) -> None:
    url = await serve(aiohttp_server, answering(200, {"kinds": [], "extensions": [], "signers": {}}))
    shared = UpstreamClient(timeout_s=5)
    client = HttpFacilitator(url + "/x402", timeout_s=2, session=shared)

    assert (await client.supported()).kinds == []
    await client.close()
    session = shared.session
    assert session is not None and not session.closed
    await shared.close()
