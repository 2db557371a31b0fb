"""Waiting for what a lifetime's end brings (a lapse, an expiry) without sleeping out a margin."""

from __future__ import annotations

import asyncio
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
