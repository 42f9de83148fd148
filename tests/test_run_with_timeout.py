"""``run_with_timeout``: the deadline timer is armed only when the awaited coroutine suspends,
and the rest of the coroutine behaves exactly as if awaited directly."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from typing import Any

import pytest
from helpers import EVENT_LOOPS, run_on

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


# -- limits of one length share one timer (``timeouts._Deadlines``) ----------------------------------

needs_311 = pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cuts a task of its own with asyncio.wait")


@needs_311
async def test_suspending_calls_under_one_limit_keep_one_timer_in_the_loop() -> None:
    """A timer per call: 1,000 calls waiting under a 60 s limit kept 1,000 timers in the loop's
    heap (and cancelled ones stayed there until it was rebuilt), and every other timer's push and
    pop paid for them. One timer serves every limit of one length."""
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    async def yields() -> str:
        await asyncio.sleep(0)
        seen.append(len(loop._scheduled))  # type: ignore[attr-defined]
        return "done"

    before = len(loop._scheduled)  # type: ignore[attr-defined]
    results = await asyncio.gather(*(run_with_timeout(yields(), 61.5) for _ in range(1_000)))
    assert results == ["done"] * 1_000
    assert max(seen) <= before + 1


@needs_311
async def test_each_call_is_cut_at_its_own_deadline_behind_a_long_running_one() -> None:
    """Calls that began later expire later, whatever ended before them; a finished call ahead of
    them neither cuts them nor delays their cut."""
    cut_at: dict[str, float] = {}
    start = time.monotonic()

    async def waits(name: str, seconds: float) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cut_at[name] = time.monotonic() - start
            raise

    async def limited(name: str, seconds: float) -> str:
        try:
            await run_with_timeout(waits(name, seconds), 0.3)
        except TimeoutError:
            return "timed out"
        return "finished"

    first = asyncio.ensure_future(limited("first", 0.01))  # ends well before its limit
    await asyncio.sleep(0.1)
    second = asyncio.ensure_future(limited("second", 5))  # begins 0.1 s later: cut at ≈ 0.4 s
    assert await first == "finished"
    assert await second == "timed out"
    assert "first" not in cut_at
    assert 0.38 <= cut_at["second"] < 1.0, cut_at


@needs_311
async def test_many_finished_calls_behind_a_running_one_are_let_go_and_later_ones_still_cut() -> None:
    """Entries of finished calls behind one still running are compacted away (memory stays
    bounded by the running calls), and those still running keep their deadlines."""
    from amplifier_tools import timeouts

    async def yields() -> None:
        await asyncio.sleep(0)

    blocker = asyncio.ensure_future(run_with_timeout(asyncio.sleep(30), 0.5))
    await asyncio.sleep(0)
    for _ in range(5_000):
        await run_with_timeout(yields(), 0.5)
    queue = timeouts._deadlines(asyncio.get_running_loop(), 0.5)
    assert len(queue.entries) <= 2 * timeouts._SLACK + 2
    late = asyncio.ensure_future(run_with_timeout(asyncio.sleep(30), 0.5))
    with pytest.raises(TimeoutError):
        await blocker
    with pytest.raises(TimeoutError):
        await late
    assert all(entry[1] is None for entry in queue.entries)


@needs_311
async def test_a_nan_limit_cuts_at_the_next_turn_and_keeps_no_queue_of_its_own() -> None:
    from amplifier_tools import timeouts

    with pytest.raises(TimeoutError):
        await run_with_timeout(asyncio.sleep(30), float("nan"))
    with pytest.raises(TimeoutError):
        await run_with_timeout(asyncio.sleep(30), float("nan"))
    assert float("nan") not in timeouts._queues[asyncio.get_running_loop()]


def test_loops_in_threads_cut_their_own_calls_and_a_closed_loop_is_let_go() -> None:
    """Each loop has its own queues; a loop that is gone leaves none behind."""
    import gc
    import threading

    from amplifier_tools import timeouts

    outcomes: list[str] = []

    def run() -> None:
        async def main() -> None:
            try:
                await run_with_timeout(asyncio.sleep(30), 0.05)
            except TimeoutError:
                outcomes.append("cut")
            outcomes.append(await run_with_timeout(asyncio.sleep(0.01, "ok"), 0.05))

        asyncio.run(main())

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(outcomes) == ["cut"] * 4 + ["ok"] * 4
    gc.collect()
    assert len(timeouts._queues) == 0


@needs_311
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
def test_a_cut_runs_the_shared_timer_a_few_times_not_every_turn(loop_kind: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop rounds a timer to whole milliseconds of a clock it reads once a turn: the shared
    timer ran just early, was re-armed for the fraction left, and ran again every turn until the
    clock moved on (found by trial: 235 runs, a busy loop, for one cut at 12.3 ms)."""
    from amplifier_tools import timeouts

    runs: list[float] = []
    fire = timeouts._Deadlines._fire

    def counted(self: Any, loop: asyncio.AbstractEventLoop) -> None:
        runs.append(loop.time())
        fire(self, loop)

    monkeypatch.setattr(timeouts._Deadlines, "_fire", counted)

    async def main() -> float:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await run_with_timeout(asyncio.sleep(1), 0.0123)
        return time.monotonic() - start

    elapsed = run_on(loop_kind, main())
    assert elapsed >= 0.0123
    assert len(runs) <= 3, runs
