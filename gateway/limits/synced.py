"""A rate limit decided in the process and shared through the store in the background.

The per-IP challenge limit guards the cheapest answer the gateway gives (a 402 that costs no
upstream, no facilitator and no money), so one store round trip per 402 would cost more than
the answer itself. Here each process decides locally from what it last heard of the shared
count plus its own admissions since, and every ``sync_interval_s`` it adds its admissions to the
store and reads the totals back: one batched round trip per interval for all keys, whatever the
request rate (the ``sync_rate`` of Kong's rate limiting, Envoy's local-before-global limits).

Counting is a sliding window over two fixed windows of ``period``: the estimate is the previous
window's count, weighted by how much of it still overlaps the sliding window, plus the current
window's. A request is admitted while that estimate stays within the limit.

The price is a bounded overshoot. One process alone is exact (it sees every admission). With N
processes, each admits on a view that misses the other processes' admissions of at most two sync
intervals plus one store round trip (``lag``), so the admitted count in any window stays within

    limit + (N - 1) * min(limit, r * lag)        lag = 2 * sync_interval_s + round trip

where ``r`` is the rate at which one process receives the key's requests. A store outage leaves
every process deciding on its own counts: at most ``limit`` per process, never unlimited.

A count can be handed back (:meth:`SyncedWindowLimit.release`): the challenge limit hands one
back when the client answers its 402 with a credential the gateway admits, so only 402s left
unanswered add up. A hand-back never takes a window below zero and never exceeds what was
counted: it takes a count of the current window, else of the previous one; when this process
knows of none (the 402 was given by another replica), it is owed for at most two syncs and
taken only from counts the other processes added meanwhile, then dropped. So hand-backs cannot
be banked: one process never hands back a count it makes later, and across replicas a client
gains at most one 402 per credential admitted in the last ``lag``, each one paid for or
spending credit. With hand-backs the bound above grows by those, plus the hand-backs two
replicas raced against one count (a total raced below zero is read as zero). A process that
refused a request reads the count again at its next sync even with nothing to add, since
hand-backs elsewhere may have made room. A count made as a ``probe`` (a sign-in that found no
credit, which the client answers by paying) is handed back with the next hand-back of its
subject in the same process: one admission hands back at most two counts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.store import RateDecision, Store, StoreUnavailable, keys
from gateway.telemetry.logs import log_event


@dataclass(slots=True)
class _Count:
    known: int = 0
    """The shared total as of the last sync (this process's flushed admissions included)."""
    unsynced: int = 0
    """Admitted here since the last sync started; not yet in the store."""
    flushing: int = 0
    """Admitted here and sent by the sync in flight."""
    owed: int = 0
    """Hand-backs this process could not take yet (no count known): settled at the next sync."""
    owing: int = 0
    """Hand-backs left over from the last sync: settled at the next one or dropped."""
    probes: int = 0
    """Of this process's admissions, those a later admission may hand back as well (see
    :meth:`SyncedWindowLimit.acquire`); local, never synced."""
    stale: bool = False
    """A request was refused on this count: read it again at the next sync, since hand-backs
    of other replicas may have made room (an idle key is otherwise never read)."""

    @property
    def total(self) -> int:
        """The shared count as this process sees it; ``unsynced`` is below zero after a
        hand-back, and a total raced below zero by replicas reads as zero."""
        return max(0, self.known + self.flushing + self.unsynced)

    def settle_owed(self, others: int) -> None:
        """Take what is owed from the counts ``others`` (the other processes) added since the
        last read, the oldest first; drop what waited two syncs, move the rest on. Counts of this
        process are never taken: it knew of none when the hand-back came."""
        settled = min(self.owing + self.owed, max(0, others), self.total)
        self.unsynced -= settled
        left = self.owed - max(0, settled - self.owing)
        self.owing, self.owed = left, 0


class SyncedWindowLimit:
    """Sliding-window limit of ``limit`` per ``period_ms`` per subject, decided without the store."""

    def __init__(
        self,
        store: Store,
        scope: str,
        limit: int,
        period_ms: int,
        *,
        sync_interval_s: float = 0.1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.scope = scope
        self.limit = limit
        self.period_ms = period_ms
        self.sync_interval_s = sync_interval_s
        self._clock = clock
        # Wall-clock windows, so every process (on NTP-synchronised hosts) counts into the same
        # key; a counter lives for two windows, as long as the estimate reads it.
        self._ttl_ms = 2 * period_ms + 1_000
        self._counts: dict[tuple[str, int], _Count] = {}

    def acquire(self, subject: str, *, probe: bool = False) -> RateDecision:
        """Admit one request of ``subject`` or say when to retry; never waits for the store.

        A ``probe`` is a request the client answers another way within the same exchange (a
        sign-in looking for credit, then a payment): the next hand-back of ``subject`` in this
        process takes it too, so one admitted credential hands back at most two counts, the
        second only against a probe counted before it."""
        now_ms = self._clock() * 1000.0
        window = int(now_ms // self.period_ms)
        elapsed = (now_ms - window * self.period_ms) / self.period_ms
        current = self._counts.get((subject, window))
        previous = self._counts.get((subject, window - 1))
        count = current.total if current else 0
        before = previous.total if previous else 0
        if before * (1.0 - elapsed) + count + 1 <= self.limit + 1e-9:  # 1e-9: float rounding
            if current is None:
                current = self._counts[(subject, window)] = _Count()
            current.unsynced += 1
            current.probes += probe
            return RateDecision(allowed=True)
        for seen in (current, previous):
            if seen is not None:
                seen.stale = True
        return RateDecision(allowed=False, retry_after_ms=self._retry_after_ms(before, count, elapsed))

    def release(self, subject: str) -> None:
        """Hand back one count of ``subject`` (and one probe of it counted here, if any): the
        current window's, else the previous one's; owed until the next sync when this process
        knows of neither (see the module's text)."""
        window = int(self._clock() * 1000.0 // self.period_ms)
        self._release_one(subject, window)
        for index in (window, window - 1):
            count = self._counts.get((subject, index))
            if count is not None and count.probes:
                count.probes -= 1
                self._release_one(subject, window)
                return

    def _release_one(self, subject: str, window: int) -> None:
        for index in (window, window - 1):
            count = self._counts.get((subject, index))
            if count is not None and count.total > 0:
                count.unsynced -= 1
                return
        self._counts.setdefault((subject, window), _Count()).owed += 1

    def size(self) -> int:
        """Windows held in memory: the subjects seen in the current and the previous window."""
        return len(self._counts)

    def _retry_after_ms(self, before: int, count: int, elapsed: float) -> int:
        """When the estimate, decaying as the window slides, first admits one more request."""
        room = self.limit - 1
        if count <= room:  # the previous window's share must fade: before * (1 - f) <= room - count
            wait = (1.0 - (room - count) / before) - elapsed if before else 0.0
        else:  # this window is full: wait for it to become the previous one and fade in turn
            wait = (1.0 - elapsed) + (1.0 - room / count)
        return max(1, math.ceil(wait * self.period_ms))

    async def sync(self) -> None:
        """Send this process's admissions (less its hand-backs) since the last sync and learn
        the shared totals, also of the keys it refused on or owes a hand-back to.

        One round trip for every key. On failure the admissions are kept for the next sync and
        decisions go on from the counts already known.
        """
        window = int(self._clock() * 1000.0 // self.period_ms)
        for key in [k for k in self._counts if k[1] < window - 1]:
            del self._counts[key]
        sending = {key: c for key, c in self._counts.items() if c.unsynced or c.owed or c.owing or c.stale}
        if not sending:
            return
        for count in sending.values():
            count.flushing, count.unsynced = count.unsynced, 0
        named = {keys.limit_window(self.scope, subject, index): c for (subject, index), c in sending.items()}
        try:
            deltas = {name: count.flushing for name, count in named.items()}
            totals = await self.store.add_counts(deltas, self._ttl_ms)
        except StoreUnavailable:
            for count in sending.values():
                count.unsynced += count.flushing
                count.flushing = 0
            raise
        for name, count in named.items():
            # The store's total, even below what this process counted: other replicas hand back.
            others = totals[name] - count.known - count.flushing
            count.known, count.flushing, count.stale = totals[name], 0, False
            if count.owed or count.owing:
                count.settle_owed(others)

    async def run(self) -> None:
        """Sync every ``sync_interval_s`` until cancelled; a store outage is logged once."""
        down = False
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except StoreUnavailable:
                if not down:
                    log_event(
                        f"{self.scope} limit: store unavailable, deciding on this process's counts",
                        logging.WARNING,
                    )
                down = True
                continue
            if down:
                log_event(f"{self.scope} limit: store reachable again, sharing counts")
            down = False
