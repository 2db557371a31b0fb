"""The baselines served like the gateway (``python -m bench.serve``, same hypercorn settings).

* :func:`ceiling_app`: a bare Starlette app answering every request with one constant 402 the
  size of a compact x402 challenge (a 1.4 KB JSON body and a 1.9 KB ``PAYMENT-REQUIRED``
  header): the most a one-worker Starlette app under hypercorn can do on this machine when every
  answer carries a challenge. The challenge-path targets are set against it.
* :func:`minimal_app`: the same app answering a 51-byte JSON 200, for scale: what serving any
  402 costs over serving almost nothing.
* :func:`replay_app`: the same, but answering with the very status, headers and body recorded
  from the gateway's 402 challenge (``BENCH_REPLAY_FILE``): the ceiling for a response that
  size, which separates what the gateway's code costs from what serving its bytes costs.
* :func:`peer_app`: the reference x402 SDK (PyPI ``x402``) guarding a JSON-RPC proxy route with
  its Starlette payment middleware (``PaymentMiddlewareASGI``), priced like the gateway's
  getBalance route and pointed at the same facilitator and provider. Configured from
  ``BENCH_FACILITATOR_URL``, ``BENCH_PROVIDER_URL`` and ``BENCH_PAY_TO``.
* :func:`io_floor_app`: the round trips one paid request cannot do without, and nothing else:
  facilitator verify, the provider call, facilitator settle (the same aiohttp session settings as
  the gateway), and with ``BENCH_REDIS_URL`` as many Redis commands as the gateway sends, in as
  many round trips (the claim's two at once, then its budget's; the intent; the delivery; the
  same redis-py client); no decoding, checks or logging. What it adds over calling the provider
  directly is the least any gateway built on these libraries adds on this machine.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.x402.types import SOLANA_MAINNET

PEER_PATH = "/rpc/getBalance"
PEER_PRICE = "$0.002205"
"""The gateway's provider_a getBalance price (2205 micro-USDC) as the SDK's money string."""
CONSTANT_JSON = b'{"ok":true,"service":"ceiling","status":"constant"}'
CEILING_BODY_BYTES = 1400
CEILING_HEADER_CHARS = 1900


def padded_json(fields: dict[str, Any], size: int) -> bytes:
    """``fields`` as compact JSON with a ``padding`` string making it exactly ``size`` bytes."""
    bare = json.dumps({**fields, "padding": ""}, separators=(",", ":")).encode()
    return json.dumps({**fields, "padding": "x" * (size - len(bare))}, separators=(",", ":")).encode()


def ceiling_challenge() -> tuple[bytes, dict[str, str]]:
    """A constant 402 of a compact challenge's size: the body and headers :func:`ceiling_app` sends."""
    envelope = {"x402Version": 2, "error": None, "accepts": []}
    body = padded_json(envelope, CEILING_BODY_BYTES)
    header = base64.b64encode(padded_json(envelope, CEILING_HEADER_CHARS * 3 // 4)).decode()
    headers = {"payment-required": header, "cache-control": "no-store"}
    return body, headers


def ceiling_app() -> Starlette:
    body, headers = ceiling_challenge()

    async def constant(request: Request) -> Response:
        return Response(body, status_code=402, headers=headers, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", constant, methods=["GET", "POST"])])


def minimal_app() -> Starlette:
    async def constant(request: Request) -> Response:
        return Response(CONSTANT_JSON, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", constant, methods=["GET", "POST"])])


def replay_app() -> Starlette:
    recorded = json.loads(Path(os.environ["BENCH_REPLAY_FILE"]).read_text(encoding="utf-8"))
    body = base64.b64decode(recorded["body"])
    status = int(recorded["status"])
    headers = dict(recorded["headers"])

    async def replay(request: Request) -> Response:
        return Response(body, status_code=status, headers=headers)

    return Starlette(routes=[Route("/{path:path}", replay, methods=["GET", "POST"])])


def _starlette_as_fastapi() -> None:
    """The SDK's middleware imports ``Request``/``Response`` from FastAPI, which re-exports
    Starlette's own classes; without FastAPI installed, alias them (the very same objects)."""
    try:
        import fastapi  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        from starlette import responses

        shim = types.ModuleType("fastapi")
        shim.Request = Request  # type: ignore[attr-defined]
        shim.Response = Response  # type: ignore[attr-defined]
        shim.responses = responses  # type: ignore[attr-defined]
        sys.modules["fastapi"] = shim
        sys.modules["fastapi.responses"] = responses


def peer_app() -> Starlette:
    _starlette_as_fastapi()
    from x402 import x402ResourceServer
    from x402.http import FacilitatorConfig, HTTPFacilitatorClient
    from x402.http.middleware.fastapi import PaymentMiddlewareASGI
    from x402.http.types import PaymentOption, RouteConfig
    from x402.mechanisms.svm.exact import ExactSvmServerScheme

    provider_url = os.environ["BENCH_PROVIDER_URL"]
    facilitator = HTTPFacilitatorClient(FacilitatorConfig(url=os.environ["BENCH_FACILITATOR_URL"]))
    server = x402ResourceServer(facilitator)
    server.register(SOLANA_MAINNET, ExactSvmServerScheme())  # type: ignore[arg-type]  # SDK typing
    routes = {
        f"POST {PEER_PATH}": RouteConfig(
            accepts=PaymentOption(
                scheme="exact", pay_to=os.environ["BENCH_PAY_TO"], price=PEER_PRICE, network=SOLANA_MAINNET
            ),
            description="Lamport balance of an account (reference SDK baseline).",
            mime_type="application/json",
        )
    }
    sessions: dict[str, aiohttp.ClientSession] = {}

    async def proxy(request: Request) -> Response:
        """A minimal JSON-RPC proxy: the body as received, the provider's answer as returned."""
        body = await request.body()
        async with sessions["provider"].post(
            provider_url, data=body, headers={"content-type": "application/json"}
        ) as upstream:
            raw = await upstream.read()
            status = upstream.status
        return Response(raw, status_code=status, media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sessions["provider"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        try:
            yield
        finally:
            await sessions["provider"].close()

    return Starlette(
        routes=[Route(PEER_PATH, proxy, methods=["POST"])],
        middleware=[Middleware(PaymentMiddlewareASGI, routes=routes, server=server)],
        lifespan=lifespan,
    )


def io_floor_app() -> Starlette:
    import redis.asyncio as aioredis

    provider_url = os.environ["BENCH_PROVIDER_URL"]
    facilitator_url = os.environ["BENCH_FACILITATOR_URL"]
    redis_url = os.environ.get("BENCH_REDIS_URL")
    json_headers = {"content-type": "application/json"}
    parts: dict[str, Any] = {}

    async def post(url: str, body: bytes) -> bytes:
        async with parts["http"].post(url, data=body, headers=json_headers) as answer:
            return bytes(await answer.read())

    async def store_round_trip(key: str) -> None:
        if "redis" in parts:
            await parts["redis"].set(key, "1", px=60_000)

    async def paid(request: Request) -> Response:
        body = await request.body()
        payment = request.headers.get("payment-signature", "")
        key = f"floor:{hash(payment)}"
        await asyncio.gather(store_round_trip(key + ":claim"), store_round_trip(key + ":ip"))
        await store_round_trip(key + ":budget")
        await post(facilitator_url + "/verify", payment.encode())
        answer = await post(provider_url, body)
        await store_round_trip(key + ":intent")
        await post(facilitator_url + "/settle", payment.encode())
        await store_round_trip(key + ":delivered")
        return Response(answer, media_type="application/json")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        parts["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        if redis_url:
            parts["redis"] = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            yield
        finally:
            await parts["http"].close()
            if redis_url:
                await parts["redis"].aclose()

    return Starlette(routes=[Route("/{path:path}", paid, methods=["POST"])], lifespan=lifespan)
