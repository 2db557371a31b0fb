"""Confirmation at the chain's pace: one watcher per Solana node polls, together, every signature
the settlements of this process wait on.

A signature is first asked about ``first_s`` (40 ms) after it is handed over, then after waits
growing ``growth`` (1.4) times up to ``max_s`` (300 ms); every signature that is due goes into
one ``getSignatureStatuses`` call (up to 256), and two calls are at least ``min_gap_s`` (20 ms)
apart. So a settlement hears of its confirmation at most 300 ms after the node reports it (about
65 ms when the chain confirms 600 ms after landing), and the node hears from one process at most
50 calls a second however many settlements wait; one settlement alone costs 6 calls in its first
second and at most 4 a second after that, instead of a whole second per poll.

A settlement that stops waiting (its confirmation wait passed) may still land, and fail at our
fee payer's expense: :meth:`ConfirmationWatcher.follow` keeps asking about its signature, in the
same calls, until it is confirmed or failed, or until its blockhash can no longer land (the node
says ``isBlockhashValid`` false, asked every ``blockhash_check_s`` per blockhash, one call at
least ``check_gap_s`` (100 ms) after another; at most ``follow_max_s``, longer than a blockhash
lives), and then hands the outcome over. A process follows at most
``max_followed`` signatures per node; follow-ups live in its memory, so a process that dies
loses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.background import cancel_and_wait
from gateway.outbound.solana_rpc import RpcResponseError, RpcUnavailable, SignatureStatus, SolanaRpc
from gateway.telemetry.logs import log_event

MAX_SIGNATURES_PER_CALL = 256
"""What one getSignatureStatuses call may ask about."""

FOLLOW_MAX_S = 120.0
"""The longest a signature is followed after its wait: a blockhash lives 151 blocks (60 to 90 s
at a cluster's pace), so a transaction cannot land later than that after it was signed."""

LateOutcome = Callable[[SignatureStatus | None], Awaitable[None]]
"""Told a followed signature's outcome: its status once confirmed or failed, or None once its
blockhash can no longer land (it never will); after ``follow_max_s``, what the node says then
(None, or landed and not yet confirmed)."""


class LateFollower(Protocol):
    """Who can follow a settlement's signature after its wait (the internal facilitator)."""

    def follow(self, network: str, signature: str, blockhash: str, then: LateOutcome) -> bool: ...


@dataclass(slots=True)
class _Watch:
    due: float
    wait: float
    outcome: asyncio.Future[SignatureStatus]
    waiters: int = 0
    followers: list[LateOutcome] = field(default_factory=list)
    blockhash: str = ""
    check_at: float = 0.0
    """When to ask the node again whether its blockhash may still land."""
    give_up_at: float = float("inf")
    last_look: bool = False
    """Its blockhash can no longer land: the next poll is the last one."""


@dataclass(slots=True)
class PollSchedule:
    """How often a signature is asked about (see the module docstring)."""

    first_s: float = 0.04
    growth: float = 1.4
    max_s: float = 0.3
    min_gap_s: float = 0.02
    blockhash_check_s: float = 2.0
    check_gap_s: float = 0.1
    follow_max_s: float = FOLLOW_MAX_S
    max_followed: int = 1024


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
        self._told: set[asyncio.Task[None]] = set()
        """Followers being told an outcome (kept so the loop does not drop them)."""
        self._next_check = 0.0

    @property
    def followed(self) -> int:
        """Signatures followed after their wait, not yet decided."""
        return sum(1 for watch in self._watches.values() if watch.followers)

    def _watch(self, signature: str) -> _Watch:
        watch = self._watches.get(signature)
        if watch is None:
            loop = asyncio.get_running_loop()
            first = self.schedule.first_s
            watch = _Watch(due=loop.time() + first, wait=first, outcome=loop.create_future())
            self._watches[signature] = watch
            self._start()
        return watch

    async def status(self, signature: str, timeout_s: float) -> SignatureStatus | None:
        """The signature's status once it is confirmed (or finalized) or failed; None when
        ``timeout_s`` passes first. Several callers may wait on one signature."""
        watch = self._watch(signature)
        watch.waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(watch.outcome), timeout_s)
        except TimeoutError:
            return None
        finally:
            watch.waiters -= 1
            if watch.waiters == 0 and not watch.followers and self._watches.get(signature) is watch:
                del self._watches[signature]

    def follow(self, signature: str, blockhash: str, then: LateOutcome) -> bool:
        """Keep asking about ``signature`` (whose transaction was signed over ``blockhash``) until
        it is confirmed or failed, or its blockhash can no longer land; then await ``then`` with
        its status (None: it never landed). False, and nothing followed, when this process
        already follows ``max_followed`` signatures of this node."""
        known = self._watches.get(signature)
        if (known is None or not known.followers) and self.followed >= self.schedule.max_followed:
            return False
        watch = self._watch(signature)
        now = asyncio.get_running_loop().time()
        if not watch.followers:
            watch.blockhash = blockhash
            watch.check_at = now + self.schedule.blockhash_check_s
            watch.give_up_at = now + self.schedule.follow_max_s
        watch.followers.append(then)
        return True

    async def close(self) -> None:
        """Stop polling; signatures still followed are dropped (and outcomes being told, cancelled)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for told in list(self._told):
            await cancel_and_wait(told)

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
        heard = False
        with contextlib.suppress(RpcUnavailable, RpcResponseError):
            answered = await self.rpc.get_signature_statuses(due)
            if len(answered) == len(due):
                statuses, heard = answered, True
        later = asyncio.get_running_loop().time()
        for signature, status in zip(due, statuses, strict=True):
            watch = self._watches.get(signature)
            if watch is None:
                continue
            if status is not None and (status.err is not None or status.confirmed):
                del self._watches[signature]
                if not watch.outcome.done():
                    watch.outcome.set_result(status)
                self._tell(watch, status)
                continue
            # Its blockhash expired before this look (it never will land), or it was followed
            # for as long as any blockhash lives: its followers hear what the node says now
            # (nothing, when the node cannot be heard).
            if watch.followers and (
                (heard and watch.last_look and status is None) or later >= watch.give_up_at
            ):
                self._tell(watch, status)
                watch.followers.clear()
                watch.last_look = False
                if watch.waiters == 0:
                    del self._watches[signature]
                    continue
            watch.wait = min(watch.wait * self.schedule.growth, self.schedule.max_s)
            watch.due = later + watch.wait
        await self._check_blockhashes(later)

    async def _check_blockhashes(self, now: float) -> None:
        """Ask the node whether the blockhash of followed signatures due a check may still land;
        a signature whose blockhash may not gets one last look (when the node cannot say, the
        follow-up ends at ``follow_max_s``)."""
        waiting = [w for w in self._watches.values() if w.followers and not w.last_look and w.check_at <= now]
        if not waiting or now < self._next_check:
            return
        # One blockhash per call, the one waiting longest, and the calls spaced out: however many
        # signatures are followed, they add at most 1 / check_gap_s calls a second.
        self._next_check = now + self.schedule.check_gap_s
        blockhash = min(waiting, key=lambda w: w.check_at).blockhash
        valid: bool | None = None
        with contextlib.suppress(RpcUnavailable, RpcResponseError):
            valid = await self.rpc.is_blockhash_valid(blockhash)
        for watch in waiting:
            if watch.blockhash == blockhash:
                watch.last_look = valid is False
                watch.check_at = now + self.schedule.blockhash_check_s

    def _tell(self, watch: _Watch, status: SignatureStatus | None) -> None:
        """Hand a followed signature's outcome to its followers, each in a task of its own (the
        polls go on meanwhile)."""
        for then in watch.followers:
            told = asyncio.create_task(_told(then, status), name="late-settlement-outcome")
            self._told.add(told)
            told.add_done_callback(self._told.discard)


async def _told(then: LateOutcome, status: SignatureStatus | None) -> None:
    try:
        await then(status)
    except Exception as exc:  # one follower's failure must not stop the others or the polls
        log_event("late settlement outcome not counted", logging.WARNING, error=type(exc).__name__)
