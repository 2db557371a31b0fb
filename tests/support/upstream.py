"""A real HTTP upstream on loopback that records every call and answers as each test scripts.

It stands in for the third-party providers (JSON-RPC) and the asset-data API, speaking their wire
protocol over a socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Responder = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]

ASSET_API_KEY = "asset-api-key-0123456789abcdef"
"""The key the gateway is configured to send the asset-data API; the fake refuses any other."""


@dataclass
class RecordedCall:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    json: Any = None


@dataclass
class Upstream:
    """``responder`` decides each answer; ``calls`` records what arrived."""

    responder: Responder | None = None
    calls: list[RecordedCall] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        call = RecordedCall(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=body,
        )
        try:
            call.json = await request.json() if body else None
        except ValueError:
            call.json = None
        self.calls.append(call)
        if self.responder is None:
            return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {"value": 1}})
        return await self.responder(request, body)


def static(status: int, payload: Any = None, text: str | None = None, delay: float = 0.0) -> Responder:
    """A responder answering ``payload`` as JSON (or raw ``text``) with ``status`` after ``delay`` s."""

    async def respond(request: web.Request, body: bytes) -> web.StreamResponse:
        if delay:
            await asyncio.sleep(delay)
        if text is not None:
            return web.Response(status=status, text=text, content_type="application/json")
        return web.json_response(payload, status=status)

    return respond


async def asset_data(request: web.Request, body: bytes) -> web.StreamResponse:
    """The asset-data API: a wrong key is its 401, else it names the path it was asked."""
    if request.headers.get("x-api-key") != ASSET_API_KEY:
        return web.json_response({"error": "invalid api key"}, status=401)
    return web.json_response({"path": request.path, "items": [1, 2]})
