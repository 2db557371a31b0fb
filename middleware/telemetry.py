"""Outermost middleware: one JSON log line and the Prometheus observations per request.

It is also the last safety net: an unexpected exception becomes the one error shape with 500,
logged by type only (exception messages may hold upstream text).
"""

from __future__ import annotations

import logging

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, send_error
from gateway.context import request_context
from gateway.errors import ErrorCode, GatewayError
from gateway.logs import get_logger, log_event, monotonic_ms
from gateway.metrics import LATENCY, REQUESTS

# The method is the client's word: any other token becomes one label value, so a client cannot
# grow the metric's label set without bound.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class TelemetryMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = monotonic_ms()
        ctx = request_context(scope)
        status = 0

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        except Exception:
            get_logger().error("unhandled error", exc_info=True, extra={"fields": {"route": ctx.route}})
            if status == 0:
                status = 500
                ctx.error = ErrorCode.INTERNAL_ERROR.value
                await send_error(send, GatewayError(ErrorCode.INTERNAL_ERROR, "internal error"))
        latency_ms = monotonic_ms() - started
        method = scope["method"] if scope["method"] in KNOWN_METHODS else "OTHER"
        REQUESTS.labels(ctx.route, method, str(status)).inc()
        LATENCY.labels(ctx.route).observe(latency_ms / 1000.0)
        log_event(
            "request",
            logging.INFO,
            method=scope["method"],
            path=scope["path"],
            route=ctx.route,
            status=status,
            latency_ms=round(latency_ms, 3),
            access=ctx.access,
            outcome=ctx.outcome,
            wallet=ctx.wallet,
            payer=ctx.payer,
            amount=ctx.amount,
            settlement=ctx.settlement,
            error=ctx.error,
        )
