"""Answer outbound requests from ASGI apps in this process: the transport for tests.

Like httpx's ``ASGITransport``: a request to ``http://provider.test/rpc`` is handed, as an
HTTP/1.1 ASGI request (its method, raw path, query, headers with ``host`` and
``content-length``, and body), to the app registered for ``provider.test``, and what the app
sends back is the answer: its status, its headers and its bytes. So the client, its error
mapping and every caller above it run exactly as over a socket, but a test registers a third
party (a provider, a facilitator, a Solana node) as a plain ASGI app, sees what it was sent,
and makes it slow, broken or malformed on cue, with no port and no server.

As a server and the network would, it answers 500 for an app that fails before answering
(the exception is kept in :attr:`AsgiTransport.failures`), breaks the exchange for one that
fails mid-answer or for a host nobody serves, follows redirects when asked, and holds the
client's timeout and cap on the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gateway.outbound.bounded_body import AnswerTooLarge
from gateway.outbound.transport import Answer, Request
from gateway.web.asgi import ASGIApp, Message

MAX_REDIRECTS: Final = 10
"""aiohttp's own bound."""
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_CLIENT: Final = ("127.0.0.1", 50000)


class AsgiTransport:
    """Routes each request by its URL's host (``host:port`` first, then ``host``) to an app."""

    def __init__(self, apps: Mapping[str, ASGIApp]) -> None:
        self.apps = dict(apps)
        self.failures: list[BaseException] = []
        """What an app raised instead of answering (the client saw a 500 or a broken answer)."""

    def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(
        self, request: Request, *, timeout_s: float, max_bytes: int, follow_redirects: bool
    ) -> Answer:
        async with asyncio.timeout(timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                answer = await self._exchange(request, max_bytes)
                location = answer.headers.get("location")
                if not follow_redirects or answer.status not in _REDIRECTS or location is None:
                    return answer
                request = _redirected(request, answer.status, request.url.join(URL(location)))
        raise aiohttp.ClientError("too many redirects")

    def _app(self, url: URL) -> ASGIApp:
        app = self.apps.get(f"{url.host}:{url.port}") or self.apps.get(url.host or "")
        if app is None:
            raise ConnectionRefusedError("no app serves this host")
        return app

    async def _exchange(self, request: Request, max_bytes: int) -> Answer:
        url = request.url
        app = self._app(url)
        body = request.body or b""
        headers = [(b"host", (url.raw_authority.rpartition("@")[2]).encode("latin-1"))]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        if request.body is not None:  # as aiohttp sends bytes
            headers.append((b"content-length", str(len(body)).encode()))
            if not any(name == b"content-type" for name, _ in headers):
                headers.append((b"content-type", b"application/octet-stream"))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method.upper(),
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.encode("latin-1"),
            "query_string": url.raw_query_string.encode("latin-1"),
            "root_path": "",
            "headers": headers,
            "client": _CLIENT,
            "server": (url.host or "", url.port or 80),
        }
        answer = _Collector(max_bytes)
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await answer.complete.wait()  # as a server does: nothing more until the client leaves
            return {"type": "http.disconnect"}

        try:
            await app(scope, receive, answer.send)
        except Exception as failed:
            if answer.too_large:  # raised by our send through the app: the client's cap
                raise AnswerTooLarge(max_bytes) from None
            self.failures.append(failed)
            if answer.status is None:
                return Answer(500, b"Internal Server Error", _headers([(b"content-type", b"text/plain")]))
            if not answer.complete.is_set():
                raise aiohttp.ClientPayloadError("the answer broke off") from None
        if answer.too_large:  # the app swallowed what our send raised
            raise AnswerTooLarge(max_bytes)
        return answer.whole()


class _Collector:
    """What the app sends: the start, then the body, held to the client's cap."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.complete = asyncio.Event()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            self.size += len(chunk)
            if self.size > self.max_bytes:
                self.too_large = True
                raise AnswerTooLarge(self.max_bytes)
            self.chunks.append(chunk)
            if not message.get("more_body", False):
                self.complete.set()

    def whole(self) -> Answer:
        if self.status is None:
            raise aiohttp.ServerDisconnectedError()  # the app returned without answering
        if not self.complete.is_set():
            raise aiohttp.ClientPayloadError("the answer broke off")
        return Answer(self.status, b"".join(self.chunks), _headers(self.headers))


def _headers(raw: list[tuple[bytes, bytes]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in raw))


def _redirected(request: Request, status: int, url: URL) -> Request:
    """The next request of a redirect, as aiohttp makes it: a 303, or a 301/302 after a POST,
    becomes a GET without a body (its headers kept)."""
    if (status == 303 and request.method != "HEAD") or (status in (301, 302) and request.method == "POST"):
        return Request("GET", url, request.headers, None)
    return Request(request.method, url, request.headers, request.body)
