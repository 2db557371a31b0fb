"""``GET /readyz``: readiness. 200 while the store answers and (when paid routes are served) the
facilitator is reachable; otherwise 503 ``not_ready`` in the one error shape, naming the failing
parts in ``details.failing``. The checks and their caching are in :mod:`gateway.telemetry.readiness`."""

from __future__ import annotations

import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.telemetry.readiness import OK, Readiness
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes

READY = "ready"


class ReadyBody(msgspec.Struct):
    ok: bool
    status: str
    checks: dict[str, str]


_encode = msgspec.json.Encoder().encode


class ReadyHandler:
    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self.headers = [JSON_CONTENT_TYPE, (b"cache-control", b"no-store")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        checks = await self.readiness.states()
        failing = [name for name, state in checks.items() if state != OK]
        if failing:
            raise GatewayError(
                ErrorCode.NOT_READY,
                f"not ready: {', '.join(failing)}",
                {"failing": failing, "checks": checks},
                headers={"Cache-Control": "no-store"},
            )
        await send_bytes(send, 200, _encode(ReadyBody(ok=True, status=READY, checks=checks)), self.headers)
