"""close() waits for the calls it cut to record themselves, bounded by the hooks they still run,
then runs every cleanup.

Found by review of 13731a4: the bound left out the ``tool:error``/``tool:post`` event sent to every
``tool_event`` observer, so observers within their own hook timeouts outlasted it and the cut call
was recorded after the audit writer's cleanup (not at all); a call still running after that bound (a
tool that ignores its cut) was waited for a second time through the whole bound; and a close()
cancelled during that wait left its request standing, so a cleanup's own ``CancelledError`` skipped
the cleanups after it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import LoggingCleanup, ToolsPlugin, WaitsUntilCut

from amplifier_tools import ToolHost, ToolResult, ToolSystemError, hookimpl


class _IgnoresItsCut:
    """A tool that catches every cancellation until ``release`` is set."""

    name = "stubborn"
    description = "Ignores cancellation."
    input_schema = {"type": "object"}

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.release = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                pass
        return ToolResult(True, "released")


class _SlowErrorEvents:
    """An async ``tool_event`` observer that takes its whole hook timeout on ``tool:error``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    async def tool_event(self, event: str, data: Any) -> None:
        if event == "tool:error":
            await asyncio.sleep(1)  # cut by its own hook timeout: logged, the call goes on


def _records(host: ToolHost) -> list[str]:
    path = Path(host.capabilities["audit.path"])
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["call_id"] for line in lines if json.loads(line).get("kind") == "call"]


async def test_close_waits_for_a_cut_call_whose_event_observers_use_their_timeouts(tmp_path: Path) -> None:
    """Was (3.10 to 3.13): four observers of 50 ms each outlasted a wait of 50 ms (twice), the audit
    writer was closed first: "the audit log ... is closed", and the call left no record."""
    waits = WaitsUntilCut()
    host = ToolHost(config={"hook_timeout_ms": 50, "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(waits), *(_SlowErrorEvents(f"e{n}") for n in range(4))],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("waits", {}, call_id="c1"))
    await waits.running.wait()
    await host.close(grace_ms=0)
    result = await calling
    assert result.error is not None and result.error["code"] == "host_closing"
    assert _records(host) == ["c1"]


async def test_close_waits_once_for_a_cut_call_that_goes_on_running(tmp_path: Path) -> None:
    """A tool that ignores its cut is waited for through the recording bound (here the 1 s hook
    timeout), then the cleanups run. Was: waited for a second time, close() took 2 s."""
    stubborn = _IgnoresItsCut()
    host = ToolHost(config={"hook_timeout_ms": 1000, "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(stubborn)], builtins=["audit"], entry_points=False,
                    working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("stubborn", {}, call_id="s1"))
    await stubborn.running.wait()
    began = time.monotonic()
    await host.close(grace_ms=0)
    took = time.monotonic() - began
    stubborn.release.set()
    await calling
    assert 0.9 < took < 1.6, took


class _SlowErrorHook:
    """An async ``tool_error`` hook that takes a while: a cut call records itself slowly."""

    name = "slowerror"

    def __init__(self) -> None:
        self.recording = asyncio.Event()

    @hookimpl
    async def tool_error(self, call: Any) -> None:
        self.recording.set()
        await asyncio.sleep(0.2)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a cleanup's own CancelledError apart")
async def test_a_close_cancelled_while_cut_calls_record_themselves_still_runs_every_cleanup(tmp_path: Path) -> None:
    """As when cancelled in the grace: the calls are recorded, every cleanup runs, then close()
    raises. Was (3.11 to 3.13): the cancellation stayed counted, the second plugin's own
    ``CancelledError`` read as close()'s, and "first" never ran, nor the audit writer's cleanup."""
    log: list[str] = []
    waits, slow = WaitsUntilCut(), _SlowErrorHook()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(waits), slow,
                             LoggingCleanup("first", log), LoggingCleanup("second", log, raises=True)],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("waits", {}, call_id="c1"))
    await waits.running.wait()
    closing = asyncio.ensure_future(host.close(grace_ms=0))
    await slow.recording.wait()  # past the grace: the cut call is being recorded
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == ["second", "first"]
    result = await calling
    assert result.error is not None and result.error["code"] == "host_closing"
    assert _records(host) == ["c1"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout")
async def test_a_close_under_a_timeout_that_fires_while_cut_calls_record_themselves_times_out(
        tmp_path: Path) -> None:
    """The withdrawn request is still raised: ``asyncio.timeout`` around close() turns it into
    ``TimeoutError``, once the call is recorded and the cleanups have run."""
    log: list[str] = []
    waits, slow = WaitsUntilCut(), _SlowErrorHook()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(waits), slow, LoggingCleanup("first", log)],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    calling = asyncio.ensure_future(host.call("waits", {}, call_id="c1"))
    await waits.running.wait()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):  # the cut call's tool_error hook takes 0.2 s
            await host.close(grace_ms=0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert log == ["first"]
    await calling
    assert _records(host) == ["c1"]


async def test_a_start_scheduled_before_close_returned_is_refused(tmp_path: Path) -> None:
    """``close()`` returned before a start scheduled earlier (a task not yet run) began. Was: that
    start then mounted every plugin and the host stayed open, its cleanups never run (the audit
    writer's among them), although close() had been awaited."""
    log: list[str] = []
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}}, plugins=[LoggingCleanup("first", log)],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    starting = asyncio.ensure_future(host.start())
    await host.close()
    with pytest.raises(ToolSystemError) as raised:
        await starting
    assert raised.value.code == "host_closed"
    assert not host.started and log == []
