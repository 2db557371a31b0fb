"""Small helpers for speaking raw ASGI: read a bounded body, send JSON, read a header.

Middlewares and handlers are pure ASGI; these keep each of them short. :class:`BodyReadDeadline`
bounds how long any of them may wait for a request body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import quote

from gateway.errors import ErrorCode, GatewayError, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RawHeaders = list[tuple[bytes, bytes]]

JSON_CONTENT_TYPE = (b"content-type", b"application/json")


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of request header ``name`` (lower-case bytes), decoded as latin-1."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def read_body(receive: Receive, limit: int) -> bytes:
    """Read the whole request body, refusing more than ``limit`` bytes with 413."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(ErrorCode.INVALID_REQUEST, "client disconnected before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(
                ErrorCode.BODY_TOO_LARGE, f"request body exceeds {limit} bytes", {"limit": limit}
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class BodyReadDeadline:
    """Give every request body a total read deadline, counted from the first ``receive``.

    A client dripping its body (one byte every few seconds) would otherwise hold a request, and
    whatever it had claimed, for as long as it likes. Past the deadline ``receive`` raises a 408
    :class:`GatewayError` (``request_timeout``) in whichever reader is waiting, before anything
    that reader guards (verification, settlement) has run; the response closes the connection.
    Once the body is complete, ``receive`` is the server's own again (disconnect listeners may
    wait on it for as long as the response takes).
    """

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.message = f"request body not received within {timeout_s:g} s"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, self._bounded(receive), send)

    def _bounded(self, receive: Receive) -> Receive:
        deadline: float | None = None
        complete = False

        async def bounded_receive() -> Message:
            nonlocal deadline, complete
            if complete:
                return await receive()
            loop = asyncio.get_running_loop()
            if deadline is None:
                deadline = loop.time() + self.timeout_s
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise GatewayError(
                    ErrorCode.REQUEST_TIMEOUT,
                    self.message,
                    {"timeoutSeconds": self.timeout_s},
                    headers={"connection": "close"},
                ) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        return bounded_receive


def replay_body(body: bytes) -> Receive:
    """A ``receive`` that hands an already-read body to the inner app once."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def send_bytes(
    send: Send, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = (JSON_CONTENT_TYPE,)
) -> None:
    """Send a complete response with a Content-Length."""
    raw: RawHeaders = list(headers)
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError) -> None:
    """Send ``error`` in the one error shape with its status and extra headers."""
    headers: RawHeaders = [JSON_CONTENT_TYPE]
    headers.extend((k.lower().encode(), v.encode()) for k, v in error.headers.items())
    await send_bytes(send, error.status, error_body(error.code, error.message, error.details), headers)


def request_path(scope: Scope) -> str:
    """The path exactly as the client sent it (percent-encoded ASCII), for the signed resource URL.

    The decoded ``path`` may hold control characters that do not belong in a signed message, and
    the raw form is what an HTTP client reports as the URL it fetched.
    """
    raw = scope.get("raw_path")
    if raw:
        return str(raw.partition(b"?")[0].decode("latin-1"))
    return quote(scope["path"], safe="/")
