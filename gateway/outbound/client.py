"""One way out: every HTTP call the gateway makes to a third party goes through :class:`UpstreamClient`.

The JSON-RPC providers, the asset-data API, the external facilitator and the Solana RPC nodes
are called alike: through one transport (:mod:`gateway.outbound.transport`; in the gateway one
per process, shared by every caller through :meth:`UpstreamClient.bound`), a total timeout per
call, the answer read whole but bounded, the call timed and its failures
counted under the upstream's fixed name (:mod:`gateway.outbound.metrics`), and every way the
exchange can fail raised as one of four typed failures. Each caller turns those into its own
error, with its own words and status; this module never decides what a client is told.

Transport exceptions can name the host, and upstream URLs carry API keys: a failure keeps only
the exception's type name (``cause``) and is raised ``from None``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Container, Mapping
from typing import Final

import aiohttp
from yarl import URL

from gateway.outbound.bounded_body import MAX_UPSTREAM_BYTES, AnswerTooLarge
from gateway.outbound.metrics import ErrorKind, UpstreamMeter, status_kind, upstream_meter
from gateway.outbound.transport import AiohttpTransport, Request, SessionClosed, Transport
from gateway.outbound.transport import Answer as Answer  # re-exported: callers read answers from here

ANY_STATUS: Final = range(100, 1000)
"""``accept`` for a caller that reads every answer's body whatever its status (JSON-RPC nodes)."""

SESSION_CLOSED: Final = SessionClosed.__name__
"""The ``cause`` when a borrowed session was closed by its owner: nothing can be sent on it."""


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


class UpstreamClient:
    """Calls to one upstream: a timeout, a cap on the answer and (when named) its metrics,
    sent through a :class:`~gateway.outbound.transport.Transport`.

    ``session`` is what it sends on: ``None`` for a pool of its own (an
    :class:`AiohttpTransport`, closed by :meth:`close`, opened again by the next call), an
    aiohttp session the caller owns (never closed here), a transport (closed by :meth:`close`),
    or another client, whose transport it shares (only that other client closes it): the
    gateway builds one client per process and every caller shares it through :meth:`bound`,
    each with its own name, timeout and cap.

    ``upstream`` is the metrics' label, a fixed name and never a URL; without it nothing is
    recorded. ``connections`` and ``dns_cache_s`` shape a pool of its own only.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | UpstreamClient | Transport | None = None,
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
        self.follow_redirects = follow_redirects
        self._meter: UpstreamMeter | None = upstream_meter(upstream) if upstream else None
        self._closes = not isinstance(session, UpstreamClient)
        """Whether :meth:`close` closes the transport: not one shared from another client."""
        self.transport: Transport
        if isinstance(session, UpstreamClient):
            self.transport = session.transport
        elif session is None or isinstance(session, aiohttp.ClientSession):
            self.transport = AiohttpTransport(session, connections=connections, dns_cache_s=dns_cache_s)
        else:
            self.transport = session

    def bound(
        self,
        *,
        upstream: str | None,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
        follow_redirects: bool | None = None,
    ) -> UpstreamClient:
        """A client of upstream ``upstream`` over this one's transport (its pool), with its
        own timeout, cap and redirect rule (this one's where not given); closing it closes
        nothing."""
        return UpstreamClient(
            self,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
            max_bytes=self.max_bytes if max_bytes is None else max_bytes,
            upstream=upstream,
            follow_redirects=self.follow_redirects if follow_redirects is None else follow_redirects,
        )

    @property
    def session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session calls go out on; ``None`` while one of its own is not open, or
        when the transport is not aiohttp's."""
        transport = self.transport
        return transport.session if isinstance(transport, AiohttpTransport) else None

    def open(self) -> None:
        """Open a pool of its own now (inside the running loop) rather than at the first call."""
        self.transport.open()

    async def close(self) -> None:
        """Close the transport if it is this client's own; a borrowed or shared one is left open."""
        if self._closes:
            await self.transport.close()

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
        outgoing = Request(method, url if isinstance(url, URL) else URL(url), headers or {}, data)
        try:
            with self._timed():
                answer = await self.transport.send(
                    outgoing,
                    timeout_s=self.timeout_s,
                    max_bytes=self.max_bytes,
                    follow_redirects=self.follow_redirects,
                )
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
