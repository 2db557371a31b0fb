"""Entries written in the background, in batches: the journal off the hot path of a call.

A call paid from credit must not wait for PostgreSQL, so its spend is queued here and written
with the others every ``flush_interval_s``, in one statement per batch. An entry whose write
failed stays queued, in order, and goes with the next batch (the journal skips any it already
has). What a process loses if it dies with entries queued is spends never written: the ledger
then owes those wallets more than the store does, in their favour, never the other way. The
backlog is bounded; past it, the oldest spends are dropped, logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable

from gateway.background import cancel_and_wait
from gateway.ledger.entries import Entry
from gateway.ledger.journal import Journal, LedgerUnavailable
from gateway.ledger.metrics import LEDGER_BACKLOG, LEDGER_DROPPED, LEDGER_LAG_SECONDS
from gateway.telemetry.logs import log_event


class JournalWriter:
    """Queues entries and writes them to ``journal`` in batches, in the order queued."""

    def __init__(
        self,
        journal: Journal,
        *,
        flush_interval_s: float = 0.2,
        max_batch: int = 1000,
        max_backlog: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_backlog = max_backlog
        self._clock = clock
        self._queue: deque[tuple[float, Entry]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._down = False

    def record_soon(self, entry: Entry) -> None:
        """Queue ``entry`` for the next batch; never waits."""
        if len(self._queue) >= self.max_backlog:
            _, dropped = self._queue.popleft()
            LEDGER_DROPPED.inc()
            log_event(
                "ledger backlog full: entry dropped", logging.ERROR, ref=dropped.ref, wallet=dropped.wallet
            )
        self._queue.append((self._clock(), entry))
        LEDGER_BACKLOG.set(len(self._queue))

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def lag_s(self) -> float:
        """Age of the oldest entry still queued (0 when none is)."""
        return self._clock() - self._queue[0][0] if self._queue else 0.0

    async def flush(self) -> None:
        """Write every queued entry, a batch at a time; raises ``LedgerUnavailable`` (the rest
        stays queued)."""
        while self._queue:
            batch = [entry for _, entry in list(self._queue)[: self.max_batch]]
            await self.journal.record(batch)
            for _ in batch:
                self._queue.popleft()
            LEDGER_BACKLOG.set(len(self._queue))
        LEDGER_LAG_SECONDS.set(0.0)

    async def run(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled; an outage is logged once."""
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                await self.flush()
            except LedgerUnavailable as failed:
                LEDGER_LAG_SECONDS.set(self.lag_s())
                if not self._down:
                    log_event(f"ledger unavailable, keeping entries queued: {failed}", logging.WARNING)
                self._down = True
                continue
            if self._down:
                log_event("ledger reachable again, queued entries written")
            self._down = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="ledger-writer")

    async def stop(self) -> None:
        """Stop the background writes after one last flush."""
        if self._task is not None:
            task, self._task = self._task, None
            await cancel_and_wait(task)
        with contextlib.suppress(LedgerUnavailable):
            await self.flush()
        if self._queue:
            log_event("ledger entries left unwritten at shutdown", logging.ERROR, count=len(self._queue))
