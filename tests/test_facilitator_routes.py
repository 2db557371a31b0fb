"""The internal facilitator routes under a real hypercorn server, called with aiohttp.

Each is mounted as create_app mounts it: its handler behind the one method dispatcher, whose gate
is the shared secret. The gate comes first: a missing or wrong secret is a 401 even when the body
is garbage, too large, or the method is wrong, which shows nothing was read or parsed before the
check. Past it, every failure is the dispatcher's one conversion.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from starlette.routing import Route, Router

from client.svm_payer import create_exact_payment
from gateway.facilitators.local import LocalFacilitator
from gateway.handlers.facilitator import InternalFacilitatorRoutes
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.routing.routes import RouteSpec
from gateway.store.redis import RedisStore
from gateway.web.asgi import ASGIApp, Receive, Scope, Send
from gateway.web.router import MethodDispatcher, PathTable, not_found
from gateway.x402.types import FacilitatorRequest, PaymentPayload, PaymentRequirements
from tests.support.gateway_server import run_app
from tests.support.ports import refusing_port
from tests.support.solana_fixtures import MakeFacilitator, exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

SECRET = "s3cret-" + "x" * 40
PREFIX = "/api/internal/facilitator"
OPERATIONS = {"supported": "GET", "verify": "POST", "settle": "POST"}
ServeRoutes = Callable[[ASGIApp], Awaitable[str]]


class _WithLifespan:
    """Answer hypercorn's lifespan protocol; the gateway's Starlette app does this in production."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await self._app(scope, receive, send)


def dispatcher(routes: InternalFacilitatorRoutes, name: str) -> MethodDispatcher:
    """One internal route as create_app mounts it: its handler behind the secret-gated dispatcher."""
    method = OPERATIONS[name]
    spec = RouteSpec(
        name=f"facilitator.{name}",
        path=f"{PREFIX}/{name}",
        method=method,
        access="internal",
        handler=f"facilitator_{name}",
        group="internal",
        description=name,
    )
    allow = "GET, HEAD" if method == "GET" else method
    return MethodDispatcher({method: (spec, getattr(routes, name))}, allow, gate=routes.require_secret)


def mounted(routes: InternalFacilitatorRoutes) -> ASGIApp:
    """The three routes at their paths as create_app mounts them; other paths are its 404."""
    table = PathTable([(f"{PREFIX}/{name}", dispatcher(routes, name), name) for name in OPERATIONS])
    router = Router(routes=[table])
    router.default = not_found
    return router


@pytest_asyncio.fixture(loop_scope="session")
async def serve_routes() -> AsyncIterator[ServeRoutes]:
    """Factory: serve an ASGI app on a loopback port; returns the internal facilitator's base URL."""
    async with contextlib.AsyncExitStack() as servers:

        async def start(routes: ASGIApp) -> str:
            return await servers.enter_async_context(run_app(_WithLifespan(routes))) + PREFIX

        yield start


@pytest_asyncio.fixture(loop_scope="session")
async def facilitator(usdc_chain: UsdcChain, make_local_facilitator: MakeFacilitator) -> LocalFacilitator:
    return make_local_facilitator(usdc_chain)


@pytest_asyncio.fixture(loop_scope="session")
async def base_url(facilitator: LocalFacilitator, serve_routes: ServeRoutes) -> str:
    return await serve_routes(mounted(InternalFacilitatorRoutes(facilitator, SECRET)))


async def payment(server: LiteSvmRpcServer, chain: UsdcChain) -> tuple[PaymentPayload, PaymentRequirements]:
    req = exact_requirements(chain, amount="7000")
    rpc = SolanaRpc(server.url)
    try:
        return await create_exact_payment(rpc, req, chain.payer), req
    finally:
        await rpc.close()


def body_of(payload: PaymentPayload, req: PaymentRequirements) -> bytes:
    request = FacilitatorRequest(x402Version=2, paymentPayload=payload, paymentRequirements=req)
    return msgspec.json.encode(request)


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None = None,
    secret: str | None = SECRET,
    expect100: bool = False,
) -> tuple[int, Any]:
    headers = {"content-type": "application/json"}
    if secret is not None:
        headers["x-gateway-internal-secret"] = secret
    async with http.request(method, url, data=body, headers=headers, expect100=expect100) as response:
        return response.status, await response.json(content_type=None)


def assert_error(answer: Any, code: str) -> None:
    assert answer["ok"] is False
    assert answer["error"]["code"] == code


# --- the happy path -----------------------------------------------------------------------------


async def test_supported_lists_our_fee_payer(
    http: aiohttp.ClientSession, base_url: str, usdc_chain: UsdcChain
) -> None:
    status, answer = await call(http, "GET", f"{base_url}/supported")
    assert status == 200
    address = str(usdc_chain.fee_payer.pubkey())
    assert answer["kinds"] == [
        {
            "x402Version": 2,
            "scheme": "exact",
            "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
            "extra": {"feePayer": address},
        }
    ]
    assert answer["signers"] == {"solana:*": [address]}


async def test_verify_then_settle_a_payment_over_http(
    http: aiohttp.ClientSession, base_url: str, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    payload, req = await payment(solana_rpc_server, usdc_chain)
    body = body_of(payload, req)

    status, verdict = await call(http, "POST", f"{base_url}/verify", body)
    assert (status, verdict) == (200, {"isValid": True, "payer": str(usdc_chain.payer.pubkey())})
    assert solana_rpc_server.calls["sendTransaction"] == 0

    status, settled = await call(http, "POST", f"{base_url}/settle", body)
    assert status == 200
    assert settled["success"] is True
    assert settled["transaction"] == solana_rpc_server.sent[0]
    assert (settled["network"], settled["payer"], settled["amount"]) == (
        req.network,
        str(usdc_chain.payer.pubkey()),
        "7000",
    )
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 7000

    status, again = await call(http, "POST", f"{base_url}/settle", body)
    assert (status, again["success"], again["errorReason"]) == (200, False, "duplicate_settlement")
    assert len(solana_rpc_server.sent) == 1


async def test_undecodable_transaction_is_an_invalid_result_not_an_error(
    http: aiohttp.ClientSession, base_url: str, usdc_chain: UsdcChain
) -> None:
    req = exact_requirements(usdc_chain)
    garbage = PaymentPayload(x402Version=2, payload={"transaction": "AAAA////"}, accepted=req)
    status, verdict = await call(http, "POST", f"{base_url}/verify", body_of(garbage, req))
    assert status == 200
    assert verdict["isValid"] is False
    assert verdict["invalidReason"] == "invalid_exact_svm_payload_transaction_could_not_be_decoded"
    status, settled = await call(http, "POST", f"{base_url}/settle", body_of(garbage, req))
    assert (status, settled["success"], settled["transaction"]) == (200, False, "")


# --- the secret gate -----------------------------------------------------------------------------

WRONG_SECRETS = [None, "", "wrong", SECRET[:-1], SECRET + "x", SECRET.upper()]


@pytest.mark.parametrize(
    "secret", WRONG_SECRETS, ids=["missing", "empty", "wrong", "prefix", "longer", "case"]
)
@pytest.mark.parametrize(
    ("method", "route"),
    [("GET", "supported"), ("POST", "verify"), ("POST", "settle"), ("GET", "verify")],
)
async def test_missing_or_wrong_secret_is_401_before_anything_is_parsed(
    http: aiohttp.ClientSession,
    base_url: str,
    solana_rpc_server: LiteSvmRpcServer,
    secret: str | None,
    method: str,
    route: str,
) -> None:
    status, answer = await call(http, method, f"{base_url}/{route}", b"\x00not json{{", secret=secret)
    assert status == 401  # not 400 (garbage body), 404 (route) or 405 (method)
    assert_error(answer, "unauthorized")
    assert solana_rpc_server.calls.total() == 0


async def test_wrong_secret_is_answered_without_reading_the_body(
    http: aiohttp.ClientSession, base_url: str
) -> None:
    # With ``Expect: 100-continue`` the client sends the body only once the app asks for it.
    huge = b"x" * (1024 * 1024)
    status, answer = await call(http, "POST", f"{base_url}/settle", huge, secret="wrong", expect100=True)
    assert status == 401  # not 413: the body was never read
    assert_error(answer, "unauthorized")
    status, answer = await call(http, "POST", f"{base_url}/settle", huge, expect100=True)
    assert status == 413
    assert_error(answer, "body_too_large")


async def test_garbage_body_with_the_right_secret_is_400(http: aiohttp.ClientSession, base_url: str) -> None:
    for body in (
        b"\x00not json{{",
        b"{}",
        b'{"x402Version": 2, "paymentPayload": {}, "paymentRequirements": {}}',
    ):
        status, answer = await call(http, "POST", f"{base_url}/verify", body)
        assert status == 400, body
        assert_error(answer, "invalid_request")


async def test_wrong_method_and_unknown_route_with_the_right_secret(
    http: aiohttp.ClientSession, base_url: str
) -> None:
    status, answer = await call(http, "GET", f"{base_url}/settle")
    assert status == 405
    assert_error(answer, "method_not_allowed")
    status, answer = await call(http, "GET", f"{base_url}/nope")
    assert status == 404
    assert_error(answer, "not_found")


@pytest.mark.parametrize("configured", ["no-wallet", "no-secret", "empty-secret"])
async def test_unconfigured_routes_answer_401_to_everyone(
    http: aiohttp.ClientSession, facilitator: LocalFacilitator, serve_routes: ServeRoutes, configured: str
) -> None:
    routes = {
        "no-wallet": InternalFacilitatorRoutes(None, SECRET),
        "no-secret": InternalFacilitatorRoutes(facilitator, None),
        "empty-secret": InternalFacilitatorRoutes(facilitator, ""),
    }[configured]
    url = await serve_routes(mounted(routes))
    for method, route, secret in [
        ("GET", "supported", SECRET),
        ("POST", "verify", SECRET),
        ("POST", "settle", ""),
    ]:
        status, answer = await call(http, method, f"{url}/{route}", b"{}", secret=secret)
        assert status == 401
        assert_error(answer, "unauthorized")


async def test_unreachable_rpc_is_503_and_does_not_leak_the_url(
    http: aiohttp.ClientSession,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    serve_routes: ServeRoutes,
) -> None:
    down = make_local_facilitator(usdc_chain, mainnet_rpc_url="http://127.0.0.1:1/?api-key=SECRET-API-KEY")
    url = await serve_routes(mounted(InternalFacilitatorRoutes(down, SECRET)))
    payload, req = await payment(solana_rpc_server, usdc_chain)
    status, answer = await call(http, "POST", f"{url}/verify", body_of(payload, req))
    assert status == 503
    assert_error(answer, "facilitator_unavailable")
    assert "SECRET-API-KEY" not in str(answer) and "127.0.0.1:1" not in str(answer)


async def test_a_store_outage_is_503_and_promises_nothing_about_charges(
    http: aiohttp.ClientSession,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    make_local_facilitator: MakeFacilitator,
    serve_routes: ServeRoutes,
) -> None:
    # The one conversion's store message says "nothing was charged" on the gateway's own routes;
    # a settle here may have broadcast before the store failed, so it must not say so.
    store = RedisStore(f"redis://127.0.0.1:{refusing_port()}/0", timeout_s=0.2)
    down = make_local_facilitator(usdc_chain, store)
    url = await serve_routes(mounted(InternalFacilitatorRoutes(down, SECRET)))
    payload, req = await payment(solana_rpc_server, usdc_chain)
    try:
        for route in ("verify", "settle"):
            status, answer = await call(http, "POST", f"{url}/{route}", body_of(payload, req))
            assert status == 503, route
            assert_error(answer, "store_unavailable")
            assert "charged" not in answer["error"]["message"]
    finally:
        await store.close()
    assert solana_rpc_server.sent == []


async def test_the_routes_mount_as_raw_asgi_apps_in_a_starlette_router(
    http: aiohttp.ClientSession, facilitator: LocalFacilitator, serve_routes: ServeRoutes
) -> None:
    routes = InternalFacilitatorRoutes(facilitator, SECRET)
    for endpoint in (routes.supported, routes.verify, routes.settle):
        assert not inspect.isfunction(endpoint) and not inspect.ismethod(endpoint)
    router = Router(routes=[Route(f"{PREFIX}/{name}", dispatcher(routes, name)) for name in OPERATIONS])
    url = (await serve_routes(router)).removesuffix(PREFIX)
    status, answer = await call(http, "GET", f"{url}{PREFIX}/supported")
    assert status == 200 and answer["kinds"]
    status, answer = await call(http, "POST", f"{url}{PREFIX}/verify", b"{}", secret="wrong")
    assert status == 401
    status, answer = await call(http, "POST", f"{url}{PREFIX}/verify", b"{}")
    assert status == 400


async def _raw(
    http: aiohttp.ClientSession, method: str, url: str, secret: str | None = SECRET
) -> tuple[int, dict[str, str], bytes]:
    headers = {} if secret is None else {"x-gateway-internal-secret": secret}
    async with http.request(method, url, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


async def test_head_on_supported_answers_the_get_headers_without_a_body(
    http: aiohttp.ClientSession, base_url: str
) -> None:
    get_status, get_headers, get_body = await _raw(http, "GET", f"{base_url}/supported")

    status, headers, body = await _raw(http, "HEAD", f"{base_url}/supported")

    assert (get_status, status, body) == (200, 200, b"")
    assert get_body
    assert headers["Content-Type"] == get_headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == get_headers["Content-Length"] == str(len(get_body))
    assert headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("secret", [None, "wrong"], ids=["missing", "wrong"])
async def test_head_on_supported_without_the_secret_is_still_401(
    http: aiohttp.ClientSession, base_url: str, secret: str | None
) -> None:
    status, _, body = await _raw(http, "HEAD", f"{base_url}/supported", secret)

    assert (status, body) == (401, b"")


async def test_wrong_method_names_head_among_the_allowed_ones(
    http: aiohttp.ClientSession, base_url: str
) -> None:
    status, headers, _ = await _raw(http, "POST", f"{base_url}/supported")
    settle_status, settle_headers, _ = await _raw(http, "HEAD", f"{base_url}/settle")

    assert (status, headers["Allow"]) == (405, "GET, HEAD")
    assert (settle_status, settle_headers["Allow"]) == (405, "POST")
