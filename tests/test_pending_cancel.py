"""A cancellation already requested when a call, a start or a close begins is not theirs.

A task can carry a cancellation request nobody will act on again: a ``CancelledError`` caught in an
``except`` block that then calls a tool or closes the host (``async with host:`` left by a
cancellation does just that), a cancel caught and never withdrawn, or, before CPython 3.12.3, the
request a ``TaskGroup`` whose child failed leaves behind (gh-116720). Found by review: with one
standing, a tool's, hook's or cleanup's own ``CancelledError`` was taken for the caller's
cancellation: ``host.call`` raised it into a caller nobody had cancelled, a close cut by
``close()`` raised instead of returning ``host_closing``, and a close skipped the cleanups after
it, the audit writer's last. CPython 3.11+: 3.10 counts no cancellation requests.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from helpers import ToolsPlugin, WaitsUntilCut, leave_a_cancellation_pending

from amplifier_tools import ToolHost, ToolResult, hookimpl

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 counts no cancellation requests")

T = TypeVar("T")


async def with_a_request_pending(work: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """Run ``work`` in a task that caught a cancellation and never withdrew it; what it returned and
    the task's count of requests after it (still the one)."""

    async def runner() -> tuple[T, int]:
        task = asyncio.current_task()
        assert task is not None
        await leave_a_cancellation_pending()
        assert task.cancelling() == 1
        out = await work()
        return out, task.cancelling()

    return await asyncio.ensure_future(runner())


class AwaitsACancelledTask:
    """A tool that awaits a task someone else cancels: the ``CancelledError`` is its own."""

    name = "awaits"
    description = "Awaits a task that someone else cancels."
    input_schema = {"type": "object"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        await asyncio.sleep(0)
        inner.cancel()
        await inner
        return ToolResult(True, "unreachable")


class PreRaisesCancelled:
    """An async ``tool_pre`` hook raising ``CancelledError`` of its own."""

    name = "pre_raises"

    @hookimpl
    async def tool_pre(self, call: Any) -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError


class Cleanup:
    """A plugin whose cleanup logs itself, and raises ``CancelledError`` of its own if ``raises``."""

    def __init__(self, name: str, log: list[str], raises: bool = False) -> None:
        self.name, self.log, self.raises = name, log, raises

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> Any:
        async def cleanup() -> None:
            await asyncio.sleep(0)
            self.log.append(self.name)
            if self.raises:
                raise asyncio.CancelledError

        return cleanup


def _host(work: Path, *plugins: Any, tools: tuple[Any, ...] = ()) -> ToolHost:
    (work / "work").mkdir(exist_ok=True)
    return ToolHost(config={"state_dir": str(work / "state"), "shutdown_grace_ms": 30_000},
                    plugins=[ToolsPlugin(AwaitsACancelledTask(), *tools), *plugins],
                    builtins=["audit", "policy"], entry_points=False, working_dir=work / "work", discover=False)


def _records(work: Path) -> list[dict[str, Any]]:
    log = work / "state" / "audit.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if json.loads(line).get("kind") == "call"]


async def test_a_tools_own_cancelled_error_is_its_failure_for_a_caller_with_a_request_pending(
        tmp_path: Path) -> None:
    async with _host(tmp_path) as host:
        # Was (3.11+): host.call raised CancelledError into the caller, recorded as "cancelled".
        result, requests = await with_a_request_pending(lambda: host.call("awaits", {}, call_id="a1"))
    assert (result.error["code"], result.error["cause"]) == ("tool_raised", "CancelledError")
    assert requests == 1  # the caller's own request is left as it was
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("a1", "tool_raised")]


async def test_a_hooks_own_cancelled_error_is_its_failure_for_a_caller_with_a_request_pending(
        tmp_path: Path) -> None:
    async with _host(tmp_path, PreRaisesCancelled()) as host:
        result, _ = await with_a_request_pending(lambda: host.call("awaits", {}, call_id="h1"))
    assert (result.error["code"], result.error["plugin"]) == ("hook_failed", "pre_raises")
    assert [r["call_id"] for r in _records(tmp_path)] == ["h1"]


async def test_a_caller_with_a_request_pending_cancelled_again_is_still_cancelled(tmp_path: Path) -> None:
    waits = WaitsUntilCut()
    async with _host(tmp_path, tools=(waits,)) as host:
        outcome: dict[str, Any] = {}

        async def call() -> None:
            try:
                await host.call("waits", {}, call_id="c1")
            except asyncio.CancelledError:
                outcome["cancelled"] = True
                raise

        calling = asyncio.ensure_future(with_a_request_pending(call))
        await waits.running.wait()
        calling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await calling
    assert outcome == {"cancelled": True}
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("c1", "cancelled")]


async def test_a_call_cut_by_close_returns_host_closing_to_a_caller_with_a_request_pending(tmp_path: Path) -> None:
    waits = WaitsUntilCut()
    host = _host(tmp_path, tools=(waits,))
    await host.start()
    calling = asyncio.ensure_future(with_a_request_pending(lambda: host.call("waits", {}, call_id="k1")))
    await waits.running.wait()
    await host.close(grace_ms=0)
    # Was (3.11, 3.12 before 3.12.3): the cut raised CancelledError, as if the caller had cancelled.
    result, requests = await calling
    assert result.error["code"] == "host_closing"
    assert requests == 1
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("k1", "host_closing")]


async def test_async_with_left_by_a_cancellation_still_runs_every_cleanup(tmp_path: Path) -> None:
    """``__aexit__`` closes the host while the task's cancellation is pending: a cleanup raising its
    own ``CancelledError`` is its failure, and the cleanups after it run, the audit writer's last."""
    log: list[str] = []
    waits = WaitsUntilCut()
    entered = asyncio.Event()

    async def agent() -> None:
        async with _host(tmp_path, Cleanup("first", log), Cleanup("second", log, raises=True),
                         tools=(waits,)) as host:
            entered.set()
            await host.call("waits", {}, call_id="w1")

    running = asyncio.ensure_future(agent())
    await entered.wait()
    await waits.running.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    # Was: the second plugin's CancelledError read as close()'s cancellation: "first" never ran,
    # nor did the audit writer's cleanup.
    assert log == ["second", "first"]
    assert [(r["call_id"], r["error"]["code"]) for r in _records(tmp_path)] == [("w1", "cancelled")]


async def test_a_close_cancelled_again_while_its_cleanups_run_stops_them(tmp_path: Path) -> None:
    """The other side: a cancellation arriving during the cleanups is close()'s own and stops them."""
    log: list[str] = []
    started = asyncio.Event()

    class Hangs:
        name = "hangs"

        @hookimpl
        def mount(self, coordinator: Any, config: Any) -> Any:
            async def cleanup() -> None:
                started.set()
                log.append("hangs")
                await asyncio.sleep(30)

            return cleanup

    host = _host(tmp_path, Cleanup("first", log), Hangs())
    await host.start()
    closing = asyncio.ensure_future(with_a_request_pending(host.close))
    await started.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == ["hangs"]
