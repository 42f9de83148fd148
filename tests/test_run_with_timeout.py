"""``run_with_timeout``: the deadline timer is armed only when the awaited coroutine suspends,
and the rest of the coroutine behaves exactly as if awaited directly."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from typing import Any

import pytest

from amplifier_tools.timeouts import run_with_timeout

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def instant() -> str:
    return "done"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 runs the whole coroutine in a task of its own")
async def test_a_coroutine_that_never_suspends_arms_no_timer() -> None:
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    for _ in range(500):
        assert await run_with_timeout(instant(), 60) == "done"
    assert len(loop._scheduled) == before  # type: ignore[attr-defined]


async def test_a_suspending_coroutine_still_times_out_and_sees_its_cancellation() -> None:
    seen: list[str] = []

    async def slow() -> None:
        seen.append("started")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(TimeoutError):
        await run_with_timeout(slow(), 0.05)
    assert seen == ["started", "cancelled"]


async def test_values_exceptions_bare_yields_and_context_pass_through() -> None:
    async def steps() -> list[Any]:
        out: list[Any] = [VAR.get()]
        await asyncio.sleep(0)  # a bare yield
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 7)
        out.append(await fut)
        VAR.set("inside")
        return out

    async def fails_after_a_wait() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    async def fails_at_once() -> None:
        raise KeyError("now")

    VAR.set("outer")
    assert await run_with_timeout(steps(), 5) == ["outer", 7]
    with pytest.raises(ValueError, match="boom"):
        await run_with_timeout(fails_after_a_wait(), 5)
    with pytest.raises(KeyError):
        await run_with_timeout(fails_at_once(), 5)


async def test_the_caller_cancelling_reaches_the_coroutine() -> None:
    cleaned = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()

    task = asyncio.ensure_future(run_with_timeout(waits(), 60))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


@pytest.mark.parametrize("ends", ["returns", "raises"])
async def test_a_cancellation_arriving_as_the_run_ends_is_not_lost(ends: str) -> None:
    """The caller is cancelled in the same turn of the loop as the run finishes: the caller's
    cancellation wins, on every version (CPython 3.10's ``wait_for`` returned the run's result
    and lost it: bpo-42130, found by attack)."""
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        if ends == "raises":
            raise ValueError("late")
        return "done"

    task = asyncio.ensure_future(run_with_timeout(work(), 10.0))
    for _ in range(3):
        await asyncio.sleep(0)  # the run is waiting for the release
    release.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_run_that_returns_despite_its_cut_gives_its_value() -> None:
    """As 3.11's ``asyncio.timeout``: a run that answers the limit's cancellation by returning."""
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    assert await run_with_timeout(stubborn(), 0.02) == "kept"



@pytest.mark.parametrize("answer", ["returns", "raises"])
async def test_a_run_that_swallows_its_cut_does_not_swallow_the_callers_cancellation(answer: str) -> None:
    """The limit and the caller's cancellation reach the run in the same turn of the loop; the run
    catches the one ``CancelledError`` it is thrown and returns (or fails). The caller's
    cancellation stands: ``CancelledError``, not the run's value nor ``TimeLimitExceeded``. Found by
    attack on CPython 3.11, where the run shares the caller's task: a tool_pre hook that answered
    its hook timeout with a default returned it, and the cancelled call ran its tool.

    The run arms the caller's cancellation in the step before its 20 ms limit is armed, and the test
    then blocks the loop: both are due in the loop's next turn, whatever the machine's load."""
    started = asyncio.Event()
    caller: list[asyncio.Future[Any]] = []

    async def stubborn() -> str:
        asyncio.get_running_loop().call_later(0.02, caller[0].cancel)
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if answer == "raises":
                raise ValueError("cut") from None
            return "kept"
        return "slept"

    caller.append(asyncio.ensure_future(run_with_timeout(stubborn(), 0.02)))
    await started.wait()
    time.sleep(0.08)  # blocks the loop: both timers fire in its next turn
    with pytest.raises(asyncio.CancelledError):
        await caller[0]
