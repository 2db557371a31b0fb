"""Prometheus metrics and the usage counters kept in the shared store.

Prometheus counters are per process (aggregated across hypercorn workers by prometheus-client's
multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set, which ``x402-gateway serve`` does);
the usage counters in the store are shared by every replica.

Every payment and sign-in is counted in one place: the telemetry layer hands the finished
request's context to :meth:`Usage.observe`. Only the (route, outcome) pairs that can happen on a
route exist as series, and all of them exist from start-up (at 0), so ``increase()`` sees the
first payment after a restart.

No ``_created`` series: one per series would double the exposition, and Prometheus finds counter
resets without them. Switched off here, at import, in every process that counts (the workers of
``serve --workers N`` included; their multiprocess exposition has none either).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.context import RequestContext
from gateway.logs import log_event
from gateway.routes import RouteSpec
from gateway.store import Store, StoreUnavailable, keys
from gateway.vocabulary import ACCESS_MODES, Outcome

disable_created_metrics()  # type: ignore[no-untyped-call]

USAGE_OF: Mapping[Outcome, str] = {
    Outcome.CHALLENGED: "unpaid",
    Outcome.CREDIT_UNCOVERED: "unpaid",
    Outcome.PAID: "paid",
    Outcome.SIGNED_IN: "signed_in",
    Outcome.CREDIT_SPENT: "credit",
    Outcome.REJECTED: "failed",
    Outcome.REFUSED: "failed",
    Outcome.SETTLE_FAILED: "failed",
    Outcome.UPSTREAM_FAILED: "failed",
}
"""The shared store's coarser outcome of each payment outcome. A payment-identifier replay and a
pending settlement add nothing: the one payment is counted once, when it settles or fails. A
sign-in that found no credit to spend was answered with the route's 402, as an unpaid request."""


def payment_outcomes(access: str) -> tuple[Outcome, ...]:
    """What a request on a route of ``access`` can come to: its mode's declared outcomes (public
    and internal routes take no payment and have no outcome series)."""
    return ACCESS_MODES[access].outcomes


def usage_outcomes(*accesses: str) -> tuple[str, ...]:
    """The store's outcomes of a route accepting ``accesses``: exact (unpaid, failed, paid), siwx
    (unpaid, failed, signed_in), exact beside credit (unpaid, failed, paid, credit)."""
    outcomes = (o for access in accesses for o in payment_outcomes(access))
    return tuple(dict.fromkeys(USAGE_OF[o] for o in outcomes if o in USAGE_OF))


REQUESTS = Counter("x402_requests_total", "HTTP requests by route and status.", ["route", "method", "status"])
LATENCY = Histogram(
    "x402_request_duration_seconds",
    "Request latency by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PAYMENTS = Counter(
    "x402_payments_total", "Payment and sign-in outcomes by route (this process).", ["route", "outcome"]
)
REVENUE = Counter(
    "x402_revenue_micro_usdc_total",
    "Settled payments in micro-USDC by route (this process); 1,000,000 = 1 USDC.",
    ["route"],
)


def usage_key(route: str, outcome: str) -> str:
    return keys.usage(route, outcome)


FLUSH_INTERVAL_S = 1.0


class _Series(NamedTuple):
    """What one (route, outcome) pair adds to: prepared once, so counting takes no lock."""

    payments: Counter
    usage_key: str | None
    revenue: Counter | None


def payment_outcome(ctx: RequestContext) -> Outcome:
    """The request's outcome as counted: a signed-in call whose upstream failed is
    ``upstream_failed`` (as on a paid route), anything else is the context's own word."""
    if ctx.outcome == Outcome.SIGNED_IN and ctx.status >= 500:
        return Outcome.UPSTREAM_FAILED
    return ctx.outcome


class Usage:
    """Counts payment and sign-in outcomes per route in Prometheus and in the shared store, and
    the settled revenue.

    Prometheus counts at once; the store's counters (shared by every replica) are added up in
    process and flushed every second, so a 402 challenge costs no store round trip of its own.
    A crash loses at most that second; a store outage keeps the counts until the next flush.
    """

    def __init__(
        self,
        store: Store,
        routes: Iterable[RouteSpec],
        methods: Callable[[RouteSpec], Sequence[str]] | None = None,
    ) -> None:
        """``methods`` gives the payment methods each route accepts (default: its access mode
        alone): a route counts what any of them can come to."""
        self.store = store
        self._series: dict[tuple[str, str], _Series] = {}
        self._usage_outcomes: dict[str, tuple[str, ...]] = {}
        for route in routes:
            accepted = (methods(route) if methods is not None else ()) or (route.access,)
            outcomes = tuple(dict.fromkeys(o for access in accepted for o in payment_outcomes(access)))
            revenue = REVENUE.labels(route.name) if route.paid else None
            for outcome in outcomes:
                usage = USAGE_OF.get(outcome)
                self._series[(route.name, outcome)] = _Series(
                    PAYMENTS.labels(route.name, outcome),
                    usage_key(route.name, usage) if usage else None,
                    revenue if outcome is Outcome.PAID else None,
                )
            if outcomes:
                self._usage_outcomes[route.name] = usage_outcomes(*accepted)
        self._pending: dict[str, int] = {}

    def observe(self, ctx: RequestContext) -> None:
        """Count the finished request once; requests outside the payment flow (public routes,
        a 400 or 429 before any payment was looked at) add nothing."""
        series = self._series.get((ctx.route, payment_outcome(ctx)))
        if series is None:
            return
        series.payments.inc()
        if series.revenue is not None and ctx.amount is not None:
            series.revenue.inc(int(ctx.amount))
        if series.usage_key is not None:
            self._pending[series.usage_key] = self._pending.get(series.usage_key, 0) + 1

    async def flush(self) -> None:
        """Add the pending counts to the store in one round trip; if it fails, they stay pending."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            await self.store.incr(pending)
        except StoreUnavailable:
            for key, count in pending.items():
                self._pending[key] = self._pending.get(key, 0) + count
            log_event("usage counters not flushed: store unavailable", pending=len(self._pending))

    async def run(self) -> None:
        """Flush every FLUSH_INTERVAL_S until cancelled (the app's lifespan owns this task)."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            await self.flush()

    async def snapshot(self, routes: Iterable[str]) -> dict[tuple[str, str], int]:
        """The shared totals of ``routes``' meaningful outcomes (none for a public route)."""
        await self.flush()
        pairs = [(r, o) for r in routes for o in self._usage_outcomes.get(r, ())]
        values = await self.store.counters([usage_key(r, o) for r, o in pairs])
        return {pair: values.get(usage_key(*pair), 0) for pair in pairs}


class _UsageCollector:
    def __init__(self, snapshot: dict[tuple[str, str], int]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "x402_usage",
            "Usage across all replicas (shared store) by route and outcome.",
            labels=["route", "outcome"],
        )
        for (route, outcome), value in sorted(self.snapshot.items()):
            family.add_metric([route, outcome], value)
        yield family


def render(snapshot: dict[tuple[str, str], int] | None) -> bytes:
    """The exposition text: this process (or all workers) plus the shared usage counters."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        text = generate_latest(registry)
    else:
        text = generate_latest(REGISTRY)
    if snapshot is not None:
        usage = CollectorRegistry()
        usage.register(_UsageCollector(snapshot))
        text += generate_latest(usage)
    return text
