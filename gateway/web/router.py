"""Routing: one table of paths, dispatching by method to pre-built pipelines.

Starlette's own ``Route`` lets a later ``{assetId}`` route win over a fixed path that only has
another method; ours matches on the path alone, so a wrong method on a fixed path is a 405
with ``Allow`` rather than a request to the wrong operation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.convertors import Convertor
from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound, compile_path
from starlette.types import Receive as StarletteReceive
from starlette.types import Scope as StarletteScope
from starlette.types import Send as StarletteSend

from gateway.errors import ErrorCode, GatewayError, error_body
from gateway.routing.routes import RouteSpec
from gateway.web.asgi import ASGIApp, Message, Receive, Scope, Send, send_bytes, send_error
from gateway.web.context import request_context
from gateway.web.failures import EXPECTED_FAILURES, as_error

Gate = Callable[[Scope], None]
"""Checked before anything else, the method included: raises the :class:`GatewayError` that
refuses the request (a server-to-server path's shared secret)."""


class MethodDispatcher:
    """Run the pipeline for the request's method; HEAD runs GET without a body; else 405.

    It is also the boundary that turns every expected failure (a :class:`GatewayError`, a store
    outage, invalid input, a facilitator out of reach) into the one error shape, through
    :func:`gateway.web.failures.as_error`. A ``gate`` runs first, before the method is even looked at.
    """

    def __init__(
        self, pipelines: Mapping[str, tuple[RouteSpec, ASGIApp]], allow: str, *, gate: Gate | None = None
    ) -> None:
        self.pipelines = dict(pipelines)
        if "GET" in self.pipelines:
            self.pipelines.setdefault("HEAD", self.pipelines["GET"])
        self.allow = allow
        self.gate = gate
        self.not_allowed = error_body(ErrorCode.METHOD_NOT_ALLOWED, f"method not allowed; allowed: {allow}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if scope["method"] == "HEAD":
            send = without_body(send)
        try:
            if self.gate is not None:
                self.gate(scope)
            entry = self.pipelines.get(scope["method"])
            if entry is None:
                headers = [(b"content-type", b"application/json"), (b"allow", self.allow.encode())]
                await send_bytes(send, 405, self.not_allowed, headers)
                return
            route, pipeline = entry
            ctx.route, ctx.access = route.name, route.access
            await pipeline(scope, receive, send)
        except EXPECTED_FAILURES as failure:
            if ctx.status:  # the response has started: too late for an error page
                raise
            error = as_error(failure, access=ctx.access)
            ctx.error = ctx.error or error.code.value
            await send_error(send, error)


def without_body(send: Send) -> Send:
    """``send`` for a HEAD request: the GET's status and headers, an empty body."""

    async def send_headers_only(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {
                "type": "http.response.body",
                "body": b"",
                "more_body": message.get("more_body", False),
            }
        await send(message)

    return send_headers_only


class PathTable(BaseRoute):
    """Every gateway path as ONE Starlette route: fixed paths by dict lookup, then the
    parameterised ones in order (fixed-segment paths win over ``{assetId}``).

    Matching is on the path alone (any method); the matched path's app gets the path parameters.
    One lookup instead of a regex per route keeps routing off the hot path's profile.
    """

    def __init__(self, entries: Sequence[tuple[str, ASGIApp, str]]) -> None:
        self.fixed: dict[str, tuple[ASGIApp, str]] = {}
        self.patterns: list[tuple[re.Pattern[str], dict[str, Convertor[Any]], ASGIApp, str]] = []
        for path, app, name in entries:
            if "{" in path:
                regex, _, convertors = compile_path(path)
                self.patterns.append((regex, convertors, app, name))
            else:
                self.fixed[path] = (app, name)

    def matches(self, scope: StarletteScope) -> tuple[Match, StarletteScope]:
        if scope["type"] != "http" or _has_encoded_slash(scope):
            return Match.NONE, {}
        path = scope["path"]
        fixed = self.fixed.get(path)
        if fixed is not None:
            return Match.FULL, {"x402gw.app": fixed}
        for regex, convertors, app, name in self.patterns:
            found = regex.match(path)
            if found is not None:
                params = {k: convertors[k].convert(v) for k, v in found.groupdict().items()}
                return Match.FULL, {"path_params": params, "x402gw.app": (app, name)}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: object) -> URLPath:
        raise NoMatchFound(name, dict(path_params))

    async def handle(self, scope: StarletteScope, receive: StarletteReceive, send: StarletteSend) -> None:
        app, name = scope["x402gw.app"]
        request_context(scope).route = name
        await app(scope, receive, send)


def _has_encoded_slash(scope: StarletteScope) -> bool:
    """``%2F`` decodes to ``/`` before matching, so ``a%2Fb`` would reach another route: refuse it."""
    raw = scope.get("raw_path") or b""
    return b"%2f" in raw.lower()


async def not_found(scope: StarletteScope, receive: StarletteReceive, send: StarletteSend) -> None:
    """Unknown paths: the one error shape with 404."""
    if scope["type"] != "http":
        return
    await send_error(send, GatewayError(ErrorCode.NOT_FOUND, f"no route for {scope['path'][:200]}"))
