"""One way out: every HTTP call the gateway makes to a third party goes through :class:`UpstreamClient`.

The JSON-RPC providers, the asset-data API, the external facilitator and the Solana RPC nodes
are called alike: one aiohttp session per client (its own, opened lazily inside the running
loop and again after a close, or one borrowed from the caller or shared with another client),
a total timeout per call, the answer read whole but bounded, the call timed and its failures
counted under the upstream's fixed name (:mod:`gateway.outbound.metrics`), and every way the
exchange can fail raised as one of four typed failures. Each caller turns those into its own
error, with its own words and status; this module never decides what a client is told.

Transport exceptions can name the host, and upstream URLs carry API keys: a failure keeps only
the exception's type name (``cause``) and is raised ``from None``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
from yarl import URL

from gateway.outbound.bounded_body import MAX_UPSTREAM_BYTES, AnswerTooLarge, read_bounded
from gateway.outbound.metrics import ErrorKind, UpstreamMeter, status_kind, upstream_meter

ANY_STATUS: Final = range(100, 1000)
"""``accept`` for a caller that reads every answer's body whatever its status (JSON-RPC nodes)."""

SESSION_CLOSED: Final = "SessionClosed"
"""The ``cause`` when a borrowed session was closed by its owner: nothing can be sent on it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer: its final status, its body (at most the client's cap) and headers."""

    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class UpstreamFailure(Exception):
    """No answer the caller takes came back. ``cause`` names what happened (an exception's type
    name, never its text: that can carry the host)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class UpstreamTimeout(UpstreamFailure):
    """No whole answer within the client's timeout."""


class UpstreamUnreachable(UpstreamFailure):
    """The exchange itself broke: refused, reset, DNS, TLS, a truncated body, a closed session."""


class UpstreamTooLarge(UpstreamFailure):
    """The answer is longer than the client's cap; nothing of it is kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes")
        self.limit = limit


class UpstreamStatus(UpstreamFailure):
    """A whole answer with a status the caller does not take (outside 2xx and its ``accept``).
    Already counted by its status kind."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"HTTP {answer.status}")
        self.answer = answer

    @property
    def status(self) -> int:
        return self.answer.status


class _Session:
    """The one aiohttp session behind one or more clients: borrowed, or owned and (re)opened on use."""

    __slots__ = ("_connections", "_dns_cache_s", "_session", "_timeout", "owned")

    def __init__(
        self,
        borrowed: aiohttp.ClientSession | None,
        timeout: aiohttp.ClientTimeout,
        connections: int,
        dns_cache_s: int,
    ) -> None:
        self._session = borrowed
        self.owned = borrowed is None
        self._timeout = timeout
        self._connections = connections
        self._dns_cache_s = dns_cache_s

    def get(self) -> aiohttp.ClientSession:
        session = self._session
        if session is not None and not session.closed:
            return session
        if not self.owned:
            raise UpstreamUnreachable(SESSION_CLOSED)
        connector = aiohttp.TCPConnector(limit=self._connections, ttl_dns_cache=self._dns_cache_s)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    @property
    def current(self) -> aiohttp.ClientSession | None:
        return self._session

    async def close(self) -> None:
        if self.owned:
            session, self._session = self._session, None
            if session is not None:
                await session.close()


class UpstreamClient:
    """Calls to one upstream: a timeout, a cap on the answer and (when named) its metrics.

    ``session`` is what it sends on: ``None`` for a session of its own (closed by :meth:`close`,
    opened again by the next call), an aiohttp session the caller owns (never closed here), or
    another client, whose session it shares (for several upstreams over one connection pool,
    each with its own name, timeout and cap; only that other client closes it).

    ``upstream`` is the metrics' label, a fixed name and never a URL; without it nothing is
    recorded. ``connections`` and ``dns_cache_s`` shape a session of its own only.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | UpstreamClient | None = None,
        *,
        timeout_s: float,
        max_bytes: int = MAX_UPSTREAM_BYTES,
        upstream: str | None = None,
        follow_redirects: bool = True,
        connections: int = 100,
        dns_cache_s: int = 10,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._follow_redirects = follow_redirects
        self._meter: UpstreamMeter | None = upstream_meter(upstream) if upstream else None
        self._session: _Session
        self._closes = not isinstance(session, UpstreamClient)
        """Whether :meth:`close` closes the session: not one shared from another client."""
        if isinstance(session, UpstreamClient):
            self._session = session._session
        else:
            self._session = _Session(session, self._timeout, connections, dns_cache_s)

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The session calls go out on; ``None`` while one of its own is not open."""
        return self._session.current

    def open(self) -> None:
        """Open a session of its own now (inside the running loop) rather than at the first call."""
        self._session.get()

    async def close(self) -> None:
        """Close the session if it is this client's own; a borrowed or shared one is left open."""
        if self._closes:
            await self._session.close()

    async def request(
        self,
        method: str,
        url: str | URL,
        *,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        accept: Container[int] = (),
    ) -> Answer:
        """Send one request and read its whole answer.

        A 2xx answer, or one whose status is in ``accept``, is returned; any other is counted
        by its status kind and raised as :class:`UpstreamStatus`. A timeout, a broken exchange
        or an oversized answer is raised as its :class:`UpstreamFailure` (counted by
        :meth:`UpstreamMeter.timed`). A cancelled call propagates as it is.
        """
        session = self._session.get()
        try:
            with self._timed():
                async with session.request(
                    method,
                    url,
                    data=data,
                    headers=headers,
                    timeout=self._timeout,
                    allow_redirects=self._follow_redirects,
                ) as response:
                    body = await read_bounded(response, self.max_bytes)
                    answer = Answer(response.status, body, response.headers)
        except TimeoutError as exc:  # before OSError, which it is; aiohttp's timeouts are too
            raise UpstreamTimeout(type(exc).__name__) from None
        except AnswerTooLarge:
            raise UpstreamTooLarge(self.max_bytes) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnreachable(type(exc).__name__) from None
        if not answer.ok and answer.status not in accept:
            self.failed(status_kind(answer.status))
            raise UpstreamStatus(answer)
        return answer

    def failed(self, kind: ErrorKind) -> None:
        """Count a call whose answer came back but is not the one wanted (the caller judges)."""
        if self._meter is not None:
            self._meter.failed(kind)

    def _timed(self) -> contextlib.AbstractContextManager[None]:
        return self._meter.timed() if self._meter is not None else contextlib.nullcontext()
