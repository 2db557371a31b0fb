"""JsonRpcProxy: forward a validated paid call to the provider as JSON-RPC 2.0.

Success means HTTP 2xx and a JSON body with ``result`` and no ``error``; only then is the
provider's JSON passed on, as a 200 (the only status on which a payment is settled). Everything
else is a 502 or 504 and nothing is settled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec

from gateway.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes
from gateway.bounded_body import MAX_UPSTREAM_BYTES, AnswerTooLarge, read_bounded
from gateway.context import validated_input
from gateway.errors import ErrorCode, GatewayError
from gateway.redact import scrub, url_secrets
from gateway.upstream_metrics import ErrorKind, status_kind, upstream_meter


class JsonRpcRequest(msgspec.Struct):
    jsonrpc: str
    id: str | int | None
    method: str
    params: Any


class JsonRpcError(msgspec.Struct):
    code: int | None = None
    message: str | None = None


class JsonRpcReply(msgspec.Struct):
    """Only what decides success; the body itself is passed through untouched."""

    jsonrpc: str | None = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: JsonRpcError | None = None


_reply = msgspec.json.Decoder(JsonRpcReply)
_encode = msgspec.json.Encoder().encode


SessionGetter = Callable[[], aiohttp.ClientSession]
"""The upstream's one session; only valid while the app runs, so it is looked up per call."""


class JsonRpcProxy:
    def __init__(self, *, url: str, method: str, session: SessionGetter, upstream: str) -> None:
        """``upstream`` is the route table's name of the provider: the metrics' label, never the URL."""
        self.url = url
        self.meter = upstream_meter(upstream)
        self.secrets = url_secrets(url)
        self.method = method
        self.session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only these four fields go upstream: anything else the client sent is ignored. DAS
        # params arrive here already in their named form (validation normalises both forms).
        body: dict[str, Any] = validated_input(scope).body
        request = JsonRpcRequest(
            jsonrpc="2.0", id=body.get("id", 1), method=self.method, params=body["params"]
        )
        raw = await self._post(_encode(request))
        try:
            reply = _reply.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:  # nesting too deep is garbage too
            self.meter.failed(ErrorKind.INVALID_ANSWER)
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider answered with invalid JSON-RPC") from exc
        if reply.error is not None:
            self.meter.failed(ErrorKind.RPC_ERROR)
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                "provider returned a JSON-RPC error; nothing was charged",
                {"rpcError": {"code": reply.error.code, "message": self._public(reply.error.message)}},
            )
        if not reply.result:
            self.meter.failed(ErrorKind.INVALID_ANSWER)
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider answer has no result; nothing was charged")
        await send_bytes(send, 200, raw, (JSON_CONTENT_TYPE,))

    def _public(self, message: str | None) -> str:
        """The provider's error text as we pass it on: its URL's key parts never leave."""
        return scrub(message or "", self.secrets)[:200]

    async def _post(self, payload: bytes) -> bytes:
        session = self.session()
        try:
            with self.meter.timed():
                async with session.post(
                    self.url, data=payload, headers={"content-type": "application/json"}
                ) as resp:
                    status = resp.status
                    raw = await read_bounded(resp, MAX_UPSTREAM_BYTES)
        except TimeoutError as exc:
            raise GatewayError(ErrorCode.UPSTREAM_TIMEOUT, "provider timed out; nothing was charged") from exc
        except AnswerTooLarge as exc:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR, "upstream answer too large; nothing was charged"
            ) from exc
        except aiohttp.ClientError as exc:
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider unreachable; nothing was charged") from exc
        if not 200 <= status < 300:
            self.meter.failed(status_kind(status))
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"provider answered HTTP {status}; nothing was charged",
                {"status": status},
            )
        return raw
