"""Waiting for what a lifetime's end brings (a lapse, an expiry) without sleeping out a margin."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.01


async def read_until(read: Callable[[], Awaitable[T]], done: Callable[[T], bool], by: float) -> T:
    """``read()`` every 10 ms until ``done`` accepts its answer or the time ``by`` (on
    ``time.monotonic()``) has come; the last answer.

    Never a looser bound than sleeping until ``by`` and reading once: when no answer was done
    before, the last read starts at or after ``by``. Each read must change nothing until it is
    done (a state read, or a claim or hold that is refused while the old one lives)."""
    while True:
        last = time.monotonic() >= by
        answer = await read()
        if last or done(answer):
            return answer
        await asyncio.sleep(min(POLL_S, max(0.0, by - time.monotonic())))


class Stopwatch:
    """How long some steps took, to bound what a lifetime or a wait read after them may have lost.

    A loaded machine can stall a process between two store calls for a second or more, so a
    remaining lifetime read after a write is not within a fixed margin of its full length; it
    is within what the steps took: ``full - watch.margin_ms() < remaining <= full``."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def margin_ms(self, at_least: int = 1_000) -> int:
        """Milliseconds since it started (rounded up, plus one for the stores' rounding), and
        never less than ``at_least``: the margin a quick run is held to."""
        return max(at_least, math.ceil((time.monotonic() - self.started) * 1000) + 1)
