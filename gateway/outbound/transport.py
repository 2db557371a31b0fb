"""How a request leaves the process: the one seam under :class:`~gateway.outbound.client.UpstreamClient`.

A :class:`Transport` sends one :class:`Request` and returns its whole :class:`Answer`; the
client around it keeps everything else (metrics, the typed failures, what a status means).
:class:`AiohttpTransport` is the production one: one aiohttp session and its connection pool.
:class:`~gateway.outbound.asgi.AsgiTransport` answers from ASGI apps in this process, with the
real statuses, headers and bytes, so a handler or a facilitator client is tested without a
socket (as httpx's ``transport=`` does).

What a transport raises, and nothing else (the client maps each to its typed failure):
``TimeoutError`` when no whole answer came within ``timeout_s``; :class:`AnswerTooLarge` past
``max_bytes``; ``aiohttp.ClientError`` or ``OSError`` when the exchange itself broke.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from yarl import URL

from gateway.outbound.bounded_body import read_bounded


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer: its final status, its body (at most the client's cap) and headers."""

    status: int
    body: bytes
    headers: Mapping[str, str]
    """Read case-insensitively."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class Request:
    """One outbound request, whole: the body is sent with a ``Content-Length``."""

    method: str
    url: URL
    headers: Mapping[str, str]
    body: bytes | None = None


class Transport(Protocol):
    """Sends requests; opened (inside the running loop) and closed by its owner."""

    async def send(
        self, request: Request, *, timeout_s: float, max_bytes: int, follow_redirects: bool
    ) -> Answer: ...

    def open(self) -> None: ...

    async def close(self) -> None: ...


class SessionClosed(ConnectionError):
    """A borrowed session was closed by its owner: nothing can be sent on it."""


class AiohttpTransport:
    """Sends on one aiohttp session: a borrowed one (never closed here), or its own, opened
    inside the running loop at first use (or :meth:`open`) and again after :meth:`close`.

    Its own session has one ``TCPConnector`` pool: at most ``connections`` in all (0: no total
    bound) and ``per_host`` to any one host (0: none), DNS answers cached ``dns_cache_s``.
    """

    __slots__ = ("_connections", "_dns_cache_s", "_per_host", "_session", "owned")

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        *,
        connections: int = 100,
        per_host: int = 0,
        dns_cache_s: int = 10,
    ) -> None:
        self._session = session
        self.owned = session is None
        self._connections = connections
        self._per_host = per_host
        self._dns_cache_s = dns_cache_s

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session requests go out on; ``None`` while one of its own is not open."""
        return self._session

    def open(self) -> None:
        self._get()

    async def close(self) -> None:
        """Close its own session (a later request opens another); a borrowed one is left open."""
        if self.owned:
            session, self._session = self._session, None
            if session is not None:
                await session.close()

    def _get(self) -> aiohttp.ClientSession:
        session = self._session
        if session is not None and not session.closed:
            return session
        if not self.owned:
            raise SessionClosed()
        connector = aiohttp.TCPConnector(
            limit=self._connections, limit_per_host=self._per_host, ttl_dns_cache=self._dns_cache_s
        )
        self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def send(
        self, request: Request, *, timeout_s: float, max_bytes: int, follow_redirects: bool
    ) -> Answer:
        session = self._get()
        async with session.request(
            request.method,
            request.url,
            data=request.body,
            headers=request.headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            allow_redirects=follow_redirects,
        ) as response:
            body = await read_bounded(response, max_bytes)
            return Answer(response.status, body, response.headers)
