"""Attacks on 6d929b8 (a close() cancelled while a start is under way) and d8e2d29 (a cancellation
pending when a call, start or close begins is not theirs)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import leave_a_cancellation_pending
from test_host_lifecycle_attack import MountRecorder
from test_host_lifecycle_attack import _host as _lifecycle_host
from test_pending_cancel import Cleanup, _host, _records

from amplifier_tools import ToolResult, hookimpl

counts = pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 counts no cancellation requests")


class Sleeps:
    name = "sleeps"
    description = "Sleeps a little."
    input_schema = {"type": "object"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0.05)
        return ToolResult(True, "slept")


class SlowMount:
    name = "slowmount"

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        await asyncio.sleep(0.01)


@counts
async def test_a_caller_that_cancelled_itself_before_the_call_is_cancelled_not_handed_a_result(
        tmp_path: Path) -> None:
    """``task.cancel()`` from inside the task counts a request that is thrown in at its next
    suspension, inside the call: the caller's cancellation. Was: taken for the tool's own
    ``CancelledError``, the caller got ``tool_raised`` and its cancellation was lost."""
    async with _host(tmp_path, tools=(Sleeps(),)) as host:
        async def caller() -> ToolResult:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            result = await host.call("sleeps", {}, call_id="s1")
            await asyncio.sleep(0.01)
            return result

        calling = asyncio.ensure_future(caller())
        with pytest.raises(asyncio.CancelledError):
            await calling
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("s1", "cancelled")]


@counts
async def test_a_caller_with_a_request_caught_that_cancels_itself_again_is_cancelled(tmp_path: Path) -> None:
    async with _host(tmp_path, tools=(Sleeps(),)) as host:
        async def caller() -> ToolResult:
            task = asyncio.current_task()
            assert task is not None
            await leave_a_cancellation_pending()  # one caught and never withdrawn: not the call's
            task.cancel()  # this one is
            return await host.call("sleeps", {}, call_id="s2")

        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(caller())
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("s2", "cancelled")]


@counts
async def test_a_close_whose_task_cancelled_itself_before_it_raises_cancelled_error(tmp_path: Path) -> None:
    """Was: the cleanup the request was thrown into logged it as its failure, close() returned."""
    log: list[str] = []
    host = _host(tmp_path, Cleanup("first", log), Cleanup("second", log))
    await host.start()

    async def closer() -> str:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await host.close()
        await asyncio.sleep(0.01)
        return "returned"

    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(closer())


@counts
async def test_a_start_whose_task_cancelled_itself_before_it_raises_cancelled_error(tmp_path: Path) -> None:
    """Was: PluginLoadError "plugin 'slowmount': failed to mount: CancelledError"."""
    host = _host(tmp_path, SlowMount())

    async def starter() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await host.start()

    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(starter())
    assert not host.started


async def test_a_close_cancelled_in_the_turn_the_start_ends_still_closes_the_host(tmp_path: Path) -> None:
    """The start has ended (and looked for a close left to it) but close() has not resumed yet when
    its cancellation arrives (a timer firing in that turn, or the starter cancelling it). Was, on
    every version: close() raised, the host stayed open and its cleanups never ran."""
    (tmp_path / "work").mkdir()
    recorder = MountRecorder()
    host = _lifecycle_host(tmp_path, recorder)
    closing: asyncio.Future[None] | None = None

    async def starter() -> None:
        await host.start()
        assert closing is not None
        closing.cancel()

    starting = asyncio.ensure_future(starter())
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(host.close())
    await starting
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not host.started
    assert recorder.cleaned
    result = await host.call("quick", {"x": 1})
    assert result.error is not None and result.error["code"] == "host_closing"


@counts
async def test_a_call_coroutine_closed_from_another_context_leaves_no_call_in_flight(tmp_path: Path) -> None:
    """A suspended ``host.call`` coroutine closed outside the context it ran in (collected, or closed
    by hand) while a request was pending as it began. Was: ``ValueError`` (its ``ContextVar`` token
    was created in a different Context) from the call's ``finally``, which skipped the rest of it:
    the call stayed in flight and close() waited out the whole grace for it."""
    import contextvars

    host = _host(tmp_path, tools=(Sleeps(),))
    await host.start()
    pipeline = host._pipeline
    assert pipeline is not None

    async def work() -> None:
        coro = host.call("sleeps", {})
        coro.send(None)
        contextvars.Context().run(coro.close)

    async def runner() -> None:
        await leave_a_cancellation_pending()
        await work()

    await asyncio.ensure_future(runner())
    assert not pipeline.in_flight
    await asyncio.wait_for(host.close(), 5)
