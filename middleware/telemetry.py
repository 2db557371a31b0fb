"""Outermost middleware: the request log and the Prometheus observations per request.

The log line (or, for a plain 402 challenge, its count) is
:class:`gateway.telemetry.request_log.RequestLog`'s.
Payments and sign-ins are counted here too, once the response is done, from what the request's
context says it came to (so a refusal, a replay and a reconciled settlement are told apart).

It is also the last safety net: an unexpected exception becomes the one error shape with 500,
logged by type only (exception messages may hold upstream text).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from gateway.errors import ErrorCode, GatewayError
from gateway.telemetry.logs import get_logger, monotonic_ms
from gateway.telemetry.metrics import LATENCY, REQUESTS, Usage
from gateway.telemetry.request_log import RequestLog
from gateway.web.asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from gateway.web.context import request_context

# The method is the client's word: any other token becomes one label value, so a client cannot
# grow the metric's label set without bound.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class TelemetryMiddleware:
    def __init__(self, app: ASGIApp, usage: Usage, request_log: RequestLog | None = None) -> None:
        self.app = app
        self.usage = usage
        # Without an app's lifespan to write challenge summaries, a line per request.
        self.request_log = request_log or RequestLog(challenges="all")
        # Label children cached per key: prometheus-client's labels() takes a lock each call.
        self._request_children: dict[tuple[str, str, int], Counter] = {}
        self._latency_children: dict[str, Histogram] = {}

    def _requests(self, route: str, method: str, status: int) -> Counter:
        key = (route, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = REQUESTS.labels(route, method, str(status))
        return child

    def _latency(self, route: str) -> Histogram:
        child = self._latency_children.get(route)
        if child is None:
            child = self._latency_children[route] = LATENCY.labels(route)
        return child

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = monotonic_ms()
        ctx = request_context(scope)

        async def send_observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                ctx.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        except Exception:
            get_logger().error("unhandled error", exc_info=True, extra={"fields": {"route": ctx.route}})
            if ctx.status == 0:
                ctx.status = 500
                ctx.error = ErrorCode.INTERNAL_ERROR.value
                await send_error(send, GatewayError(ErrorCode.INTERNAL_ERROR, "internal error"))
        status = ctx.status
        latency_ms = monotonic_ms() - started
        method = scope["method"] if scope["method"] in KNOWN_METHODS else "OTHER"
        self._requests(ctx.route, method, status).inc()
        self._latency(ctx.route).observe(latency_ms / 1000.0)
        self.usage.observe(ctx)
        self.request_log.request(scope, ctx, latency_ms)
