"""close(): a cancellation withdrawn whole, and the time cut calls get to record themselves.

Found by review of e7f4f1c: close() cancelled twice in one turn of the loop (during the grace, or in
the turn the start it waited for ended) withdrew one request of the two, so a cleanup's own
``CancelledError`` read as close()'s and the cleanups after it, the audit writer's last, were
skipped; and the time close() gives cut calls to record themselves counted the hook timeouts of
async implementations only, where a synchronous implementation returning an awaitable (a future, as
the audit's fsync wait) is awaited within its hook timeout too: observers using theirs outlasted the
wait and the call was recorded after the audit writer's cleanup, so not at all.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import LoggingCleanup, ToolsPlugin, WaitsUntilCut

from amplifier_tools import ToolHost, ToolResult, hookimpl


class _SlowMount:
    """A plugin whose mount takes a while (the start is under way meanwhile)."""

    name = "slowmount"

    def __init__(self) -> None:
        self.mounting = asyncio.Event()
        self.release = asyncio.Event()

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        self.mounting.set()
        await self.release.wait()


def _records(host: ToolHost) -> list[str]:
    path = Path(host.capabilities["audit.path"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["call_id"] for line in lines if json.loads(line).get("kind") == "call"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a cleanup's own CancelledError apart")
async def test_a_close_cancelled_twice_in_its_grace_still_runs_every_cleanup(tmp_path: Path) -> None:
    """Two requests in one turn reach close() as one ``CancelledError``. Was (3.11 to 3.13): one
    withdrawn, the other stayed counted, the second plugin's own ``CancelledError`` read as close()'s
    and "first" never ran, nor the audit writer's cleanup."""
    log: list[str] = []
    waits = WaitsUntilCut()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(waits),
                             LoggingCleanup("first", log), LoggingCleanup("second", log, raises=True)],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("waits", {}, call_id="c1"))
    await waits.running.wait()
    closing = asyncio.ensure_future(host.close(grace_ms=5000))
    await asyncio.sleep(0.01)  # close() waits in the grace
    closing.cancel()
    closing.cancel()  # a second request in the same turn (a Ctrl-C and an asyncio.timeout, say)
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == ["second", "first"]
    result = await calling
    assert result.error is not None and result.error["code"] == "host_closing"
    assert _records(host) == ["c1"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a cleanup's own CancelledError apart")
async def test_a_close_cancelled_twice_in_the_turn_the_start_ended_still_runs_every_cleanup(tmp_path: Path) -> None:
    """As in the grace: the start ended in the turn close() was cancelled (twice), so close() closes
    the host itself. Was (3.11 to 3.13): one request stayed counted and "first" never ran."""
    log: list[str] = []
    slow = _SlowMount()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[LoggingCleanup("first", log), LoggingCleanup("second", log, raises=True), slow],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    starting = asyncio.ensure_future(host.start())
    await slow.mounting.wait()
    closing = asyncio.ensure_future(host.close())
    await asyncio.sleep(0)  # close() waits for the start
    slow.release.set()
    await asyncio.sleep(0)  # the start resumes and ends: it wakes close(), which has not run yet
    while not starting.done():
        await asyncio.sleep(0)
    assert not closing.done()
    closing.cancel()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await starting
    assert log == ["second", "first"]


class _FutureObserver:
    """A synchronous ``tool_complete`` observer handing back an awaitable (as the audit writer's
    fsync wait does) that takes most of its hook timeout."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    @hookimpl
    def tool_complete(self, call: Any) -> Any:
        return asyncio.sleep(self.seconds)


class _FutureErrorHook:
    """A synchronous ``tool_error`` implementation handing back an awaitable."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds

    @hookimpl
    def tool_error(self, call: Any) -> Any:
        return asyncio.sleep(self.seconds)


@pytest.mark.parametrize("kind", ["tool_complete", "tool_error"])
async def test_close_waits_for_a_cut_call_whose_sync_hooks_hand_back_awaitables(tmp_path: Path, kind: str) -> None:
    """Was (3.10 to 3.13): the wait counted async implementations only (here none: 50 ms), three
    awaitables of 40 ms each outlasted it, the audit writer was closed first and the cut call left
    no record."""
    waits = WaitsUntilCut()
    hooks = [(_FutureObserver if kind == "tool_complete" else _FutureErrorHook)(f"h{n}", 0.04) for n in range(3)]
    host = ToolHost(config={"hook_timeout_ms": 50, "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(waits), *hooks],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("waits", {}, call_id="c1"))
    await waits.running.wait()
    await host.close(grace_ms=0)
    result = await calling
    assert result.error is not None and result.error["code"] == "host_closing"
    assert _records(host) == ["c1"]


class _SlowErrors:
    """An async ``tool_error`` hook taking a while for every failed call."""

    name = "slowerrors"

    @hookimpl
    async def tool_error(self, call: Any) -> None:
        await asyncio.sleep(0.05)


class _CallsWhenCut:
    """A tool that answers its cut by making another call and returning at once: the other call
    enters the pipeline in the turns between this one leaving it and close() waking from its wait."""

    name = "callswhencut"
    description = "Calls again when cut."
    input_schema = {"type": "object"}

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.host: ToolHost | None = None
        self.later: list[asyncio.Future[Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            assert self.host is not None
            self.later.append(asyncio.ensure_future(self.host.call("callswhencut", {}, call_id="b")))
        return ToolResult(True, "cut")


async def test_a_call_entering_as_close_wakes_from_its_wait_for_cut_calls_is_waited_for(tmp_path: Path) -> None:
    """Found by a fuzz seed (test_fuzz_exactly_once_long[195-uvloop], run in the whole file): the
    calls in flight once close() woke from its wait for the cut calls were taken for calls that
    ignore their cut and not waited for, although the wait had ended because none was left. Was:
    "b", refused as closing, was recorded after the audit writer's cleanup: no record."""
    tool = _CallsWhenCut()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(tool), _SlowErrors()],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    tool.host = host
    await host.start()
    calling = asyncio.ensure_future(host.call("callswhencut", {}, call_id="a"))
    await tool.running.wait()
    await host.close(grace_ms=0)
    await calling
    assert [(await each).error["code"] for each in tool.later] == ["host_closing"]  # type: ignore[index]
    assert sorted(_records(host)) == ["a", "b"]
