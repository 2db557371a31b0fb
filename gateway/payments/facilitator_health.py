"""Which of the configured facilitators are failing, shared by every replica through the store.

Several facilitators may settle for the gateway, in the operator's order of preference. One that
fails or times out is marked down for ``down_s`` (30 s): the 402 then offers it last, so clients
pay through another, and while it is down it is probed (its ``/supported``) every ``probe_s``
until it answers, when it is offered in its place again. The marks live in the store, so a
facilitator one replica found down is offered last by all; each process reads them in the
background every ``sync_s``, never on the 402 path.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping

from gateway.background import cancel_and_wait
from gateway.store import Store, StoreUnavailable, keys

Probe = Callable[[], Awaitable[object]]
"""Asks a facilitator something cheap (``/supported``); raises when it cannot answer."""


class FacilitatorHealth:
    """Up or down, per facilitator name; the order the 402 offers them in."""

    def __init__(
        self,
        store: Store,
        probes: Mapping[str, Probe],
        *,
        down_s: float = 30.0,
        sync_s: float = 1.0,
        probe_s: float = 5.0,
        probe_timeout_s: float = 3.0,
    ) -> None:
        self.store = store
        self.names = tuple(probes)
        self.probes = dict(probes)
        self.down_ms = int(down_s * 1000)
        self.sync_s = sync_s
        self.probe_s = probe_s
        self.probe_timeout_s = probe_timeout_s
        self._down: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._probed_at: dict[str, float] = {}

    def order(self) -> list[str]:
        """Every facilitator, the ones up first, each group in the operator's order."""
        return [n for n in self.names if n not in self._down] + [n for n in self.names if n in self._down]

    async def mark_down(self, name: str) -> None:
        """``name`` failed or timed out: offer it last, here at once and on every replica soon."""
        self._down.add(name)
        with contextlib.suppress(StoreUnavailable):
            await self.store.put(keys.facilitator_down(name), "1", self.down_ms)

    async def mark_up(self, name: str) -> None:
        self._down.discard(name)
        with contextlib.suppress(StoreUnavailable):
            await self.store.put(keys.facilitator_down(name), "", 1)

    async def sync(self) -> None:
        """Read every replica's marks; probe the facilitators that are down."""
        marks = [keys.facilitator_down(name) for name in self.names]
        with contextlib.suppress(StoreUnavailable):
            values = (await self.store.check_then_limit(marks, [])).values
            self._down = {name for name, value in zip(self.names, values, strict=True) if value}
        now = time.monotonic()
        for name in [n for n in self.names if n in self._down]:
            if now - self._probed_at.get(name, float("-inf")) >= self.probe_s:
                self._probed_at[name] = now
                if await self._answers(name):
                    await self.mark_up(name)

    async def _answers(self, name: str) -> bool:
        try:
            async with asyncio.timeout(self.probe_timeout_s):
                await self.probes[name]()
        except Exception:  # any failure means it still cannot settle
            return False
        return True

    def start(self) -> None:
        if len(self.names) > 1 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="facilitator-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.sync_s)

