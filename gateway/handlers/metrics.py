"""``GET /metrics``: Prometheus exposition, plus the usage counters shared in the store."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CONTENT_TYPE_LATEST

from gateway.store import StoreUnavailable
from gateway.telemetry.metrics import Usage, render
from gateway.web.asgi import Receive, Scope, Send, send_bytes


class MetricsHandler:
    def __init__(self, usage: Usage, route_names: Sequence[str]) -> None:
        self.usage = usage
        self.route_names = list(route_names)
        self.headers = [(b"content-type", CONTENT_TYPE_LATEST.encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            snapshot = await self.usage.snapshot(self.route_names)
        except StoreUnavailable:
            snapshot = None
        await send_bytes(send, 200, render(snapshot), self.headers)
