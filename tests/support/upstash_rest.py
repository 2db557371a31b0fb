"""A small Upstash-REST-compatible server in front of a real Redis, for tests.

No package offers a local Upstash REST server, and Upstash itself is not reachable offline. This
speaks the protocol the way ``upstash-redis`` uses it (see the testing notes): ``POST /`` with one
command as a JSON array, ``POST /pipeline`` and ``POST /multi-exec`` with an array of them, bearer
token auth, ``{"result": ...}`` / ``{"error": ...}`` answers and ``Upstash-Encoding: base64``.
Commands run on the real server through ``redis.asyncio``, so their semantics are Redis's own.
"""

from __future__ import annotations

import base64
import hmac
import json
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

Json = Any


class UpstashRestServer:
    """Serve the REST protocol on a free 127.0.0.1 port; ``start()`` returns the base URL."""

    def __init__(self, redis_url: str, token: str) -> None:
        self._token = token
        # Raw replies: without redis-py's per-command callbacks, SET answers "OK" (not True), PING
        # "PONG", as a REST client expects.
        self._redis = aioredis.Redis.from_url(redis_url)
        self._redis.response_callbacks.clear()
        app = web.Application()
        app.router.add_post("/", self._single)
        app.router.add_post("/pipeline", self._pipeline)
        app.router.add_post("/multi-exec", self._multi_exec)
        self._runner = web.AppRunner(app, access_log=None)
        self.url = ""
        self.requests: list[str] = []
        """One entry per authorized request, in order: its command's name, or ``pipeline``."""

    async def start(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._redis.aclose()

    async def _single(self, request: web.Request) -> web.StreamResponse:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        if not _is_command(body):
            return web.json_response({"error": "ERR invalid command"}, status=400)
        self.requests.append(str(body[0]).upper())
        try:
            result = await self._redis.execute_command(*body)  # type: ignore[no-untyped-call]
        except RedisError as exc:
            return web.json_response({"error": _error_text(exc)}, status=400)
        return web.json_response({"result": _encode(result, _base64(request))})

    async def _pipeline(self, request: web.Request) -> web.StreamResponse:
        return await self._batch(request, transaction=False)

    async def _multi_exec(self, request: web.Request) -> web.StreamResponse:
        return await self._batch(request, transaction=True)

    async def _batch(self, request: web.Request, *, transaction: bool) -> web.StreamResponse:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body, list) or not body or not all(_is_command(command) for command in body):
            return web.json_response({"error": "ERR invalid pipeline"}, status=400)
        self.requests.append("MULTI" if transaction else "PIPELINE")
        pipe = self._redis.pipeline(transaction=transaction)
        for command in body:
            pipe.execute_command(*command)
        try:
            results = await pipe.execute(raise_on_error=False)
        except RedisError as exc:
            return web.json_response({"error": _error_text(exc)}, status=400)
        encode = _base64(request)
        return web.json_response(
            [
                {"error": _error_text(result)}
                if isinstance(result, RedisError)
                else {"result": _encode(result, encode)}
                for result in results
            ]
        )

    async def _read(self, request: web.Request) -> Json | web.Response:
        """The decoded JSON body, or the response that refuses the request."""
        expected = f"Bearer {self._token}".encode()
        if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "ERR failed to parse JSON body"}, status=400)


def _is_command(value: Json) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(part, str | int | float) and not isinstance(part, bool) for part in value)
    )


def _base64(request: web.Request) -> bool:
    return request.headers.get("Upstash-Encoding", "").lower() == "base64"


def _encode(value: object, base64_strings: bool) -> Json:
    """A Redis reply as JSON: strings base64 when asked (except the status "OK"), recursively."""
    if isinstance(value, bytes):
        if not base64_strings:
            return value.decode("utf-8", errors="replace")
        return "OK" if value == b"OK" else base64.b64encode(value).decode("ascii")
    if isinstance(value, list | tuple):
        return [_encode(item, base64_strings) for item in value]
    if value is None or isinstance(value, int):
        return value
    raise TypeError(f"unexpected reply type {type(value).__name__}")


def _error_text(exc: RedisError) -> str:
    """Put back the error code ("ERR", "NOSCRIPT", ...) that redis-py strips off the message."""
    code = getattr(exc, "status_code", None)
    return f"{code} {exc}" if code else str(exc)
