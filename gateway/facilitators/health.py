"""Which of the configured facilitators are failing, shared by every replica through the store.

Several facilitators may settle for the gateway, in the operator's order of preference. One that
fails or times out is marked down for ``down_s`` (``FACILITATOR_DOWN_SECONDS``, 30 s): the 402
then offers it last, so clients pay through another. Every ``probe_s``
(``FACILITATOR_PROBE_SECONDS``, 5 s) each facilitator is probed live (the readiness probe's
question: an external one's ``/supported`` asked now, never its cached answer, which would hide
an outage; the internal one's node). A probe that fails marks it down, or renews its mark, so a
dead facilitator stays offered last for as long as it is dead, and one found dead by a probe is
offered last before any payment is sent its way; one that is down and answers again is offered
in its place again. A mark outlives the next probe's answer (start-up holds ``down_s`` above
``probe_s`` plus the probe's timeout), else a dead one would be offered first between two probes.
The marks live in the store, so a facilitator one replica found down is offered last by all;
each process reads them in the background every ``sync_s``, never on the 402 path.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping

from gateway.background import cancel_and_wait
from gateway.config import FACILITATOR_DOWN_S, FACILITATOR_PROBE_S, FACILITATOR_PROBE_TIMEOUT_S
from gateway.store import Store, StoreUnavailable, keys
from gateway.store.limits import check_then_limit

Probe = Callable[[], Awaitable[str | None]]
"""Asks a facilitator something cheap, live: None when it answered, else why not."""


class FacilitatorHealth:
    """Up or down, per facilitator name; the order the 402 offers them in."""

    def __init__(
        self,
        store: Store,
        probes: Mapping[str, Probe],
        *,
        down_s: float = FACILITATOR_DOWN_S,
        sync_s: float = 1.0,
        probe_s: float = FACILITATOR_PROBE_S,
        probe_timeout_s: float = FACILITATOR_PROBE_TIMEOUT_S,
    ) -> None:
        self.store = store
        self.names = tuple(probes)
        self.probes = dict(probes)
        self.down_ms = int(down_s * 1000)
        self.sync_s = sync_s
        self.probe_s = probe_s
        self.probe_timeout_s = probe_timeout_s
        self._down: set[str] = set()
        self._fresh: set[str] = set()
        """Marked down here since the last read of the marks began (the read may predate them)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._probed_at: dict[str, float] = {}

    def order(self) -> list[str]:
        """Every facilitator, the ones up first, each group in the operator's order."""
        return [n for n in self.names if n not in self._down] + [n for n in self.names if n in self._down]

    async def mark_down(self, name: str) -> None:
        """``name`` failed or timed out: offer it last, here at once and on every replica soon."""
        self._down.add(name)
        self._fresh.add(name)
        with contextlib.suppress(StoreUnavailable):
            await self.store.put(keys.facilitator_down(name), "1", self.down_ms)

    async def mark_up(self, name: str) -> None:
        self._down.discard(name)
        self._fresh.discard(name)
        with contextlib.suppress(StoreUnavailable):
            await self.store.put(keys.facilitator_down(name), "", 1)

    async def sync(self) -> None:
        """Read every replica's marks, then probe the facilitators that are due."""
        await self.read_marks()
        await self.probe_due()

    async def read_marks(self) -> None:
        """Every replica's marks; one this process made meanwhile is kept (the read may predate it)."""
        marks = [keys.facilitator_down(name) for name in self.names]
        self._fresh.clear()
        with contextlib.suppress(StoreUnavailable):
            values = (await check_then_limit(self.store, marks, [])).values
            found = {name for name, value in zip(self.names, values, strict=True) if value}
            self._down = found | self._fresh

    async def probe_due(self) -> None:
        """Probe, all at once, each facilitator last probed ``probe_s`` ago or more."""
        now = time.monotonic()
        due = [n for n in self.names if now - self._probed_at.get(n, float("-inf")) >= self.probe_s]
        for name in due:
            self._probed_at[name] = now
        answered = await asyncio.gather(*(self._answers(name) for name in due))
        for name, answers in zip(due, answered, strict=True):
            if not answers:
                await self.mark_down(name)  # renewed while it fails: never offered first meanwhile
            elif name in self._down:
                await self.mark_up(name)

    async def _answers(self, name: str) -> bool:
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                return await self.probes[name]() is None
        except Exception:  # any failure means it still cannot settle
            return False

    def start(self) -> None:
        """Two loops: the marks read every ``sync_s``, and the probes, which may wait up to
        ``probe_timeout_s`` on a facilitator that hangs, so they never hold the reads back."""
        if len(self.names) > 1 and not self._tasks:
            self._tasks = [
                asyncio.create_task(self._every(self.read_marks), name="facilitator-marks"),
                asyncio.create_task(self._every(self.probe_due), name="facilitator-probes"),
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await cancel_and_wait(task)

    async def _every(self, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            await step()
            await asyncio.sleep(self.sync_s)
