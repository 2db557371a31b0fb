"""Stopping a background task: a cancellation lost inside the task does not hang shutdown."""

from __future__ import annotations

import asyncio

from gateway.background import cancel_and_wait


async def test_a_task_that_lost_its_cancellation_is_cancelled_again_until_it_stops() -> None:
    cancels_seen = 0

    async def loop_that_swallows_one_cancel() -> None:
        nonlocal cancels_seen
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels_seen += 1
                if cancels_seen > 1:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]  # as a library that drops it

    task = asyncio.create_task(loop_that_swallows_one_cancel())
    await asyncio.sleep(0)

    stopper = asyncio.create_task(cancel_and_wait(task))
    await asyncio.wait({stopper}, timeout=5)  # a stopper that hangs is left running, not cancelled

    assert stopper.done() and task.cancelled() and cancels_seen == 2


async def test_a_task_that_stops_at_the_first_cancellation_is_cancelled_once() -> None:
    cancels_seen = 0

    async def loop() -> None:
        nonlocal cancels_seen
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancels_seen += 1
            raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)

    await cancel_and_wait(task)
    await cancel_and_wait(None)

    assert task.cancelled() and cancels_seen == 1
