"""The Redis store's ``Watchdog``: whose cancellation an expiry is, told as ``asyncio.timeout`` tells it."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from helpers import leave_a_cancellation_pending

from amplifier_tools.builtins.policy.watchdog import Watchdog

needs_counts = pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling: CPython 3.11+")


async def _bounded(watchdog: Watchdog, seconds: float) -> bool:
    """One bounded wait that outlives its deadline: whether ``leave`` calls the expiry the watchdog's."""
    task = asyncio.current_task()
    assert task is not None
    watchdog.enter(task, asyncio.get_running_loop().time() + seconds)
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return watchdog.leave(task)
    watchdog.leave(task)
    raise AssertionError("the watchdog did not cut the wait")


async def test_an_expiry_is_the_watchdogs() -> None:
    watchdog = Watchdog()
    assert await _bounded(watchdog, 0.01) is True


@needs_counts
async def test_a_cancellation_left_over_from_before_is_not_the_operations() -> None:
    """A task that caught a cancellation earlier and never withdrew it (or, before CPython 3.12.3,
    one a task group left): its next operation's expiry is still the watchdog's, the store's own
    error, not a cancellation (found by review: compared with zero it was taken for the caller's)."""
    watchdog = Watchdog()

    async def leftover_then_bounded() -> bool:
        task = asyncio.current_task()
        assert task is not None
        await leave_a_cancellation_pending()  # caught, not withdrawn: cancelling() stays 1
        assert task.cancelling() == 1
        return await _bounded(watchdog, 0.01)

    assert await asyncio.ensure_future(leftover_then_bounded()) is True


@pytest.mark.parametrize("first", ["caller", "watchdog"])
async def test_a_callers_cancellation_in_the_same_turn_as_the_expiry_is_the_callers(first: str) -> None:
    """Both reach the task in one turn of the loop (one ``CancelledError``), in either order: the
    caller's stands (``leave`` says False, and the caller raises ``CancelledError``)."""
    watchdog = Watchdog()
    started = asyncio.Event()
    answers: list[bool] = []

    async def operation() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        if first == "caller":
            loop.call_later(0.01, task.cancel)
        watchdog.enter(task, loop.time() + 0.01)
        if first == "watchdog":
            loop.call_later(0.01, task.cancel)
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            answers.append(watchdog.leave(task))
            raise

    task = asyncio.ensure_future(operation())
    await started.wait()
    time.sleep(0.05)  # blocks the loop: the expiry and the cancellation fire in its next turn
    with pytest.raises(asyncio.CancelledError):
        await task
    assert answers == [sys.version_info < (3, 11)]  # 3.10 cannot tell: the expiry is taken as the watchdog's
