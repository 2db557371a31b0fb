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
    """Give every request body a total read deadline, counted from the first ``receive``, and
    never let an answer leave before the body it answers has arrived.

    A client dripping its body (one byte every few seconds) would otherwise hold a request, and
    whatever it had claimed, for as long as it likes. Past the deadline ``receive`` raises a 408
    :class:`GatewayError` (``request_timeout``) in whichever reader is waiting, before anything
    that reader guards (verification, settlement) has run; the response closes the connection.
    Once the body is complete, ``receive`` is the server's own again (disconnect listeners may
    wait on it for as long as the response takes).

    Many answers go out without the body being read: a 402 challenge, a 429, a 404, a 413. If
    the body's bytes reach the server only after such an answer ended, the HTTP/1.1 server
    cannot start the connection's next request and closes it, while the client, told nothing,
    sends its next request on it and gets no answer. So before such an answer starts, the rest
    of the body is read and dropped (at most ``drain_limit`` bytes within ``drain_timeout_s``,
    both small: every body the gateway accepts is bounded); a body that is larger or slower
    than that gets ``Connection: close`` on the answer instead, so the client opens a new one.
    """

    def __init__(
        self, app: ASGIApp, timeout_s: float, *, drain_limit: int = 65536, drain_timeout_s: float = 2.0
    ) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.drain_limit = drain_limit
        self.drain_timeout_s = drain_timeout_s
        self.message = f"request body not received within {timeout_s:g} s"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _RequestBody(receive, self, _declared_length(scope))
        await self.app(scope, body.receive, body.guard(send))


_NO_LENGTH = -1
"""A body whose length the headers do not state (chunked)."""


def _declared_length(scope: Scope) -> int:
    """The body's length as declared: 0 when there is none, ``_NO_LENGTH`` when chunked."""
    length = 0
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return _NO_LENGTH
        elif key == b"transfer-encoding":
            return _NO_LENGTH
    return length


class _RequestBody:
    """One request's body as the app reads it: the deadline, and the drain before an answer."""

    __slots__ = ("_complete", "_deadline", "_declared", "_limits", "_receive", "_seen")

    def __init__(self, receive: Receive, limits: BodyReadDeadline, declared: int) -> None:
        self._receive = receive
        self._limits = limits
        self._declared = declared
        self._deadline: float | None = None
        self._complete = False
        self._seen = 0

    async def receive(self) -> Message:
        if self._complete:
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self._deadline is None:
            self._deadline = loop.time() + self._limits.timeout_s
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise GatewayError(
                ErrorCode.REQUEST_TIMEOUT,
                self._limits.message,
                {"timeoutSeconds": self._limits.timeout_s},
                headers={"connection": "close"},
            ) from None
        self._seen += len(message.get("body", b""))
        self._complete = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    def guard(self, send: Send) -> Send:
        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and self._unread() and not await self._drain():
                message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
            await send(message)

        return guarded_send

    def _unread(self) -> bool:
        """Whether body bytes the client declared may still be on their way."""
        return not self._complete and self._declared != 0

    async def _drain(self) -> bool:
        """Read and drop the rest of the body; False when it is too large or too slow for that."""
        limit = self._limits.drain_limit
        if self._declared > limit:
            return False
        try:
            async with asyncio.timeout(self._limits.drain_timeout_s):
                while not self._complete:
                    await self.receive()
                    if self._seen > limit:
                        return False
        except (TimeoutError, GatewayError):
            return False
        return True


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
