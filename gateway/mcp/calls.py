"""A tool call is its route's HTTP request, run through the route's own pipeline in-process.

Nothing about paying is done here: the credential a call carries in ``_meta`` becomes the
header the route's payment methods read (``x402/payment`` -> ``PAYMENT-SIGNATURE``; any other
method's credential header ``H`` -> ``_meta["x402-gateway/h"]``), and the route's answer
becomes the tool result (a 402 -> ``isError`` with the payment requirements in
``structuredContent``; a 200 -> the data, with ``PAYMENT-RESPONSE`` decoded into
``_meta["x402/payment-response"]`` and any other receipt header ``H`` as
``_meta["x402-gateway/h"]``). So a tool call is settled only after the provider answered,
refused as a replay, guarded, limited and answered again exactly as the same HTTP request.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

import msgspec
from mcp import types

from gateway.mcp.meta import GATEWAY_META, PAYMENT_META, PAYMENT_RESPONSE_META
from gateway.mcp.tools import ToolRequest
from gateway.routing.vocabulary import PAYMENT_METHODS
from gateway.web.asgi import ASGIApp, Message, Scope, replay_body
from gateway.x402.headers import PAYMENT_SIGNATURE, encode_header

_PAYMENT_RESPONSE = b"payment-response"
_PAYMENT_REQUIRED = b"payment-required"
_DROPPED = frozenset({b"content-type", b"content-length", b"accept", b"transfer-encoding"})


def credential_headers() -> frozenset[bytes]:
    """Every registered method's credential headers (lower case)."""
    return frozenset(c.header.lower().encode() for m in PAYMENT_METHODS.values() for c in m.credentials)


def receipt_headers() -> frozenset[bytes]:
    return frozenset(c.header.lower().encode() for m in PAYMENT_METHODS.values() for c in m.receipts)


class HttpAnswer(msgspec.Struct):
    status: int = 500
    headers: list[tuple[bytes, bytes]] = msgspec.field(default_factory=list)
    body: bytes = b""

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None


def credentials_of(meta: Mapping[str, Any], known: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The credential headers a call's ``_meta`` carries; anything else in it is ignored."""
    found: list[tuple[bytes, bytes]] = []
    payment = meta.get(PAYMENT_META)
    if isinstance(payment, str):  # the payload's JSON text, as some clients send it
        found.append((PAYMENT_SIGNATURE, base64.b64encode(payment.encode()).decode("ascii").encode()))
    elif payment is not None:
        found.append((PAYMENT_SIGNATURE, encode_header(payment).encode()))
    for key, value in meta.items():
        if not (key.startswith(GATEWAY_META) and isinstance(value, str)):
            continue
        name = key.removeprefix(GATEWAY_META).lower().encode()
        if name in known and name != PAYMENT_SIGNATURE:
            found.append((name, value.encode("latin-1", "replace")))
    return found


def call_scope(
    outer: Scope, request: ToolRequest, credentials: Iterable[tuple[bytes, bytes]], known: frozenset[bytes]
) -> Scope:
    """The route's request as the ASGI server would give it, from the same client: the MCP
    request's own headers (proxy headers, host) minus any credential header of ``known`` (those
    come from ``_meta`` only), plus the call's credentials."""
    drop = _DROPPED | known
    kept = outer.get("headers", [])
    headers = [(k, v) for k, v in kept if k.lower() not in drop and not k.lower().startswith(b"mcp-")]
    headers += [(b"content-type", b"application/json"), *credentials]
    if request.body:
        headers.append((b"content-length", str(len(request.body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": outer.get("http_version", "1.1"),
        "method": request.method,
        "scheme": outer.get("scheme", "http"),
        "path": unquote(request.path),
        "raw_path": request.path.encode(),
        "root_path": "",
        "query_string": request.query,
        "headers": headers,
        "client": outer.get("client"),
        "server": outer.get("server"),
        "extensions": {},
        "state": {},
    }


async def run(app: ASGIApp, scope: Scope, body: bytes) -> HttpAnswer:
    """Run ``app`` on the request and collect its answer."""
    answer = HttpAnswer()
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, replay_body(body), send)
    answer.body = b"".join(chunks)
    return answer


def tool_result(answer: HttpAnswer, receipts: frozenset[bytes]) -> types.CallToolResult:
    """The route's answer as the x402 MCP transport words it."""
    text = answer.body.decode("utf-8", "replace")
    try:
        decoded: Any = msgspec.json.decode(answer.body)
    except msgspec.DecodeError:
        decoded = {"text": text}
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=text)]
    if answer.status == 402:  # the payment requirements: the 402's PAYMENT-REQUIRED (x402 v2)
        required = answer.header(_PAYMENT_REQUIRED)
        stated = _decoded_header(required.encode("latin-1")) if required is not None else None
        if isinstance(stated, dict):
            decoded, text = stated, msgspec.json.encode(stated).decode()
        content = [types.TextContent(type="text", text=text)]
        return types.CallToolResult(content=content, structuredContent=decoded, isError=True)
    if answer.status != 200:
        detail = decoded if isinstance(decoded, dict) else {"body": decoded}
        structured = {"status": answer.status, **detail}
        retry_after = answer.header(b"retry-after")
        if retry_after:
            structured["retryAfter"] = retry_after
        return types.CallToolResult(content=content, structuredContent=structured, isError=True)
    meta: dict[str, Any] = {}
    for name, value in answer.headers:
        name = name.lower()
        if name == _PAYMENT_RESPONSE:
            meta[PAYMENT_RESPONSE_META] = _decoded_header(value)
        elif name in receipts and not name.startswith(b"x-payment-response"):
            meta[GATEWAY_META + name.decode("latin-1")] = value.decode("latin-1")
    structured = decoded if isinstance(decoded, dict) else {"result": decoded}
    return types.CallToolResult(
        content=content, structuredContent=structured, isError=False, _meta=meta or None
    )


def _decoded_header(value: bytes) -> Any:
    """A base64 JSON header (our own: it decodes), as JSON."""
    try:
        return msgspec.json.decode(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return value.decode("latin-1")
