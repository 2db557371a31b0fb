"""``GET /healthz``: liveness only; it must not depend on the store or upstreams."""

from __future__ import annotations

import msgspec

from gateway import SERVICE_NAME
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes


class HealthBody(msgspec.Struct):
    ok: bool
    service: str
    status: str


class HealthHandler:
    def __init__(self) -> None:
        self.body = msgspec.json.encode(HealthBody(ok=True, service=SERVICE_NAME, status="healthy"))
        self.headers = [JSON_CONTENT_TYPE, (b"cache-control", b"no-store")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, self.body, self.headers)
