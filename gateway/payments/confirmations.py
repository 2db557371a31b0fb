"""Confirmation at the chain's pace: one watcher per Solana node polls, together, every signature
the settlements of this process wait on.

A signature is first asked about ``first_s`` (40 ms) after it is handed over, then after waits
growing ``growth`` (1.4) times up to ``max_s`` (300 ms); every signature that is due goes into
one ``getSignatureStatuses`` call (up to 256), and two calls are at least ``min_gap_s`` (20 ms)
apart. So a settlement hears of its confirmation at most 300 ms after the node reports it (about
65 ms when the chain confirms 600 ms after landing), and the node hears from one process at most
50 calls a second however many settlements wait; one settlement alone costs 6 calls in its first
second and at most 4 a second after that, instead of a whole second per poll.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from gateway.background import cancel_and_wait
from gateway.solana_rpc import RpcResponseError, RpcUnavailable, SignatureStatus, SolanaRpc

MAX_SIGNATURES_PER_CALL = 256
"""What one getSignatureStatuses call may ask about."""


@dataclass(slots=True)
class _Watch:
    due: float
    wait: float
    outcome: asyncio.Future[SignatureStatus]
    waiters: int = 0


@dataclass(slots=True)
class PollSchedule:
    """How often a signature is asked about (see the module docstring)."""

    first_s: float = 0.04
    growth: float = 1.4
    max_s: float = 0.3
    min_gap_s: float = 0.02


class ConfirmationWatcher:
    """Answers "is this signature confirmed (or failed) yet?" for every settlement of a process."""

    def __init__(self, rpc: SolanaRpc, schedule: PollSchedule | None = None) -> None:
        self.rpc = rpc
        self.schedule = schedule or PollSchedule()
        self.calls = 0
        """getSignatureStatuses calls made (for tests and the stated bound)."""
        self._watches: dict[str, _Watch] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def status(self, signature: str, timeout_s: float) -> SignatureStatus | None:
        """The signature's status once it is confirmed (or finalized) or failed; None when
        ``timeout_s`` passes first. Several callers may wait on one signature."""
        watch = self._watches.get(signature)
        if watch is None:
            loop = asyncio.get_running_loop()
            first = self.schedule.first_s
            watch = _Watch(due=loop.time() + first, wait=first, outcome=loop.create_future())
            self._watches[signature] = watch
            self._start()
        watch.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(watch.outcome), timeout_s)
        except TimeoutError:
            return None
        finally:
            watch.waiters -= 1
            if watch.waiters == 0 and self._watches.get(signature) is watch:
                del self._watches[signature]

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def _start(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="confirmation-watcher")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watches:
            nearest = min(watch.due for watch in self._watches.values())
            pause = nearest - loop.time()
            if pause > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
                continue
            await self._poll(loop.time())
            await asyncio.sleep(self.schedule.min_gap_s)

    async def _poll(self, now: float) -> None:
        """Ask about every signature that is due, in one call; reschedule the undecided ones."""
        due = [sig for sig, watch in self._watches.items() if watch.due <= now][:MAX_SIGNATURES_PER_CALL]
        self.calls += 1
        statuses: list[SignatureStatus | None] = [None] * len(due)
        with contextlib.suppress(RpcUnavailable, RpcResponseError):
            answered = await self.rpc.get_signature_statuses(due)
            if len(answered) == len(due):
                statuses = answered
        later = asyncio.get_running_loop().time()
        for signature, status in zip(due, statuses, strict=True):
            watch = self._watches.get(signature)
            if watch is None:
                continue
            if status is not None and (status.err is not None or status.confirmed):
                del self._watches[signature]
                if not watch.outcome.done():
                    watch.outcome.set_result(status)
                continue
            watch.wait = min(watch.wait * self.schedule.growth, self.schedule.max_s)
            watch.due = later + watch.wait
