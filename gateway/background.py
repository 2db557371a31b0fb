"""Background tasks of the app's lifespan (flushers, sweepers, watchers): stopped one way."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RECANCEL_AFTER_S = 0.1
"""How long a cancelled task has to stop before it is cancelled again."""


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has stopped, so nothing it does outlives the
    caller's shutdown; its cancellation is expected and swallowed."""
    if task is None:
        return
    task.cancel()
    # A cancellation can be lost inside a library (Python 3.11's wait_for drops one that meets a
    # completing inner await), leaving the task asleep in its loop: cancel again until it stops.
    while not task.done():
        await asyncio.wait({task}, timeout=RECANCEL_AFTER_S)
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
