"""Prometheus metrics and the usage counters kept in the shared store.

Prometheus counters are per process (aggregated across hypercorn workers by prometheus-client's
multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is set, which ``x402-gateway serve`` does);
the usage counters in the store are shared by every replica.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.logs import log_event
from gateway.store import Store, StoreUnavailable

OUTCOMES = ("unpaid", "paid", "failed")

REQUESTS = Counter("x402_requests_total", "HTTP requests by route and status.", ["route", "method", "status"])
LATENCY = Histogram(
    "x402_request_duration_seconds",
    "Request latency by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PAYMENTS = Counter("x402_payments_total", "Payment outcomes by route (this process).", ["route", "outcome"])


def usage_key(route: str, outcome: str) -> str:
    return f"x402gw:usage:{route}:{outcome}"


FLUSH_INTERVAL_S = 1.0


class Usage:
    """Counts unpaid, paid and failed flows per route in Prometheus and in the shared store.

    Prometheus counts at once; the store's counters (shared by every replica) are added up in
    process and flushed every second, so a 402 challenge costs no store round trip of its own.
    A crash loses at most that second; a store outage keeps the counts until the next flush.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._children: dict[tuple[str, str], tuple[Counter, str]] = {}
        self._pending: dict[str, int] = {}

    async def record(self, route: str, outcome: str) -> None:
        cached = self._children.get((route, outcome))
        if cached is None:  # labels() takes a lock; a challenge is counted on every 402
            cached = self._children[(route, outcome)] = (
                PAYMENTS.labels(route, outcome),
                usage_key(route, outcome),
            )
        counter, key = cached
        counter.inc()
        self._pending[key] = self._pending.get(key, 0) + 1

    async def flush(self) -> None:
        """Add the pending counts to the store; what cannot be written stays pending."""
        pending, self._pending = self._pending, {}
        items = list(pending.items())
        for index, (key, amount) in enumerate(items):
            try:
                await self.store.incr(key, amount)
            except StoreUnavailable:
                for unsent, count in items[index:]:
                    self._pending[unsent] = self._pending.get(unsent, 0) + count
                log_event("usage counters not flushed: store unavailable", pending=len(self._pending))
                return

    async def run(self) -> None:
        """Flush every FLUSH_INTERVAL_S until cancelled (the app's lifespan owns this task)."""
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            await self.flush()

    async def snapshot(self, routes: Iterable[str]) -> dict[tuple[str, str], int]:
        await self.flush()
        pairs = [(r, o) for r in routes for o in OUTCOMES]
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
