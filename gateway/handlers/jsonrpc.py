"""JsonRpcProxy: forward a validated paid call to the provider as JSON-RPC 2.0.

Success means HTTP 2xx and a JSON body with ``result`` and no ``error``; only then is the
provider's JSON passed on, as a 200 (the only status on which a payment is settled). Everything
else is a 502 or 504 and nothing is settled.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.outbound.client import (
    UpstreamClient,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.outbound.metrics import ErrorKind
from gateway.telemetry.redact import scrub, url_secrets
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes
from gateway.web.context import validated_input


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
_HEADERS: Final = {"content-type": "application/json"}


class JsonRpcProxy:
    def __init__(self, *, url: str, method: str, client: UpstreamClient) -> None:
        """``client`` calls the provider: its timeout, its cap on the answer and its metrics,
        labelled with the provider's route-table name (never the URL, which carries a key)."""
        self.url = url
        self.client = client
        self.secrets = url_secrets(url)
        self.method = method

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only these four fields go upstream: anything else the client sent is ignored. DAS
        # params arrive here already in their named form (validation normalises both forms).
        body: dict[str, Any] = validated_input(scope).body
        request = JsonRpcRequest(
            jsonrpc="2.0", id=body.get("id", 1), method=self.method, params=body["params"]
        )
        raw = await self.post(_encode(request))
        try:
            reply = _reply.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:  # nesting too deep is garbage too
            self.client.failed(ErrorKind.INVALID_ANSWER)
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider answered with invalid JSON-RPC") from exc
        if reply.error is not None:
            self.client.failed(ErrorKind.RPC_ERROR)
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                "provider returned a JSON-RPC error; nothing was charged",
                {"rpcError": {"code": reply.error.code, "message": self._public(reply.error.message)}},
            )
        if not reply.result:
            self.client.failed(ErrorKind.INVALID_ANSWER)
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider answer has no result; nothing was charged")
        await send_bytes(send, 200, raw, (JSON_CONTENT_TYPE,))

    def _public(self, message: str | None) -> str:
        """The provider's error text as we pass it on: its URL's key parts never leave."""
        return scrub(message or "", self.secrets)[:200]

    async def post(self, payload: bytes) -> bytes:
        """POST ``payload`` to the provider; its failures as the 502 or 504 saying nothing was charged."""
        try:
            answer = await self.client.request("POST", self.url, data=payload, headers=_HEADERS)
        except UpstreamTimeout as exc:
            raise GatewayError(ErrorCode.UPSTREAM_TIMEOUT, "provider timed out; nothing was charged") from exc
        except UpstreamTooLarge as exc:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR, "upstream answer too large; nothing was charged"
            ) from exc
        except UpstreamUnreachable as exc:
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "provider unreachable; nothing was charged") from exc
        except UpstreamStatus as exc:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"provider answered HTTP {exc.status}; nothing was charged",
                {"status": exc.status},
            ) from None
        return answer.body
