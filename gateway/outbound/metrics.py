"""How long each upstream takes to answer, and how its calls fail, by upstream name.

Upstream URLs carry API keys, so a label is never a URL or a host: it is the name the route
table gives the upstream (``provider_a_mainnet``, ``asset_api``), or a fixed name for the
facilitator's endpoints (``facilitator_verify``, ``facilitator_settle``,
``facilitator_supported``) and the internal facilitator's Solana nodes (``solana_mainnet_rpc``).

A call's duration runs from sending the request to the last byte of the answer (or to the
failure), so a slow or timing-out upstream shows in the histogram. A client that goes away
mid-call (cancellation) is neither observed nor counted: the upstream did nothing wrong.
"""

from __future__ import annotations

import enum
import time
from types import TracebackType

import aiohttp
from prometheus_client import Counter, Histogram

from gateway.outbound.bounded_body import AnswerTooLarge


class ErrorKind(enum.StrEnum):
    """Why an upstream call failed; a fixed set, so the label cannot grow."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    HTTP_OTHER = "http_other"
    """A final status that is neither 2xx, 4xx nor 5xx (a redirect that was not followed)."""
    INVALID_ANSWER = "invalid_answer"
    """Not the protocol's answer: invalid JSON, no result, too large, unusable."""
    RPC_ERROR = "rpc_error"
    """A JSON-RPC upstream answered with an error object."""


UPSTREAM_DURATION = Histogram(
    "x402_upstream_duration_seconds",
    "Upstream call duration by upstream (route table name or facilitator endpoint).",
    ["upstream"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
UPSTREAM_ERRORS = Counter(
    "x402_upstream_errors_total", "Failed upstream calls by upstream and kind.", ["upstream", "kind"]
)


def status_kind(status: int) -> ErrorKind:
    """The error kind of a non-2xx HTTP status."""
    if 400 <= status < 500:
        return ErrorKind.HTTP_4XX
    if 500 <= status < 600:
        return ErrorKind.HTTP_5XX
    return ErrorKind.HTTP_OTHER


def exception_kind(exc: BaseException) -> ErrorKind:
    """The error kind of an exception raised while calling an upstream."""
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return ErrorKind.TIMEOUT
    if isinstance(exc, AnswerTooLarge):
        return ErrorKind.INVALID_ANSWER
    if isinstance(exc, aiohttp.ClientResponseError):
        return status_kind(exc.status) if exc.status >= 400 else ErrorKind.INVALID_ANSWER
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ErrorKind.INVALID_ANSWER
    return ErrorKind.CONNECTION  # refused, reset, DNS, TLS: the exchange itself broke


class UpstreamMeter:
    """The series of one upstream. Its duration histogram exists from the meter's creation (at
    0); an error series only from its first error, so the exposition does not carry a zero for
    every kind of failure of every upstream."""

    __slots__ = ("_duration", "_errors", "_upstream")

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self._duration = UPSTREAM_DURATION.labels(upstream)
        self._errors: dict[ErrorKind, Counter] = {}

    def observe(self, seconds: float) -> None:
        self._duration.observe(seconds)

    def failed(self, kind: ErrorKind) -> None:
        """Count one failed call (an answer that came back but is not the one wanted)."""
        child = self._errors.get(kind)
        if child is None:
            child = self._errors[kind] = UPSTREAM_ERRORS.labels(self._upstream, kind.value)
        child.inc()

    def timed(self) -> _TimedCall:
        """``with meter.timed(): ...`` observes the block's duration and counts the exception
        that ends it (timeout, connection, oversized answer) before it propagates."""
        return _TimedCall(self)


class _TimedCall:
    __slots__ = ("_meter", "_started")

    def __init__(self, meter: UpstreamMeter) -> None:
        self._meter = meter
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, Exception):
            return  # cancelled: the client left, the upstream is not to blame
        self._meter.observe(time.perf_counter() - self._started)
        if exc is not None:
            self._meter.failed(exception_kind(exc))


_meters: dict[str, UpstreamMeter] = {}


def upstream_meter(upstream: str) -> UpstreamMeter:
    """The one meter of ``upstream`` in this process (its series are created on first use)."""
    meter = _meters.get(upstream)
    if meter is None:
        meter = _meters[upstream] = UpstreamMeter(upstream)
    return meter
