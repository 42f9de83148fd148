"""Attacks on the host's own bounded waits (session 37, helper waits37): a ``tool_complete``
observer's future waited for through a ``wake`` future of its own (``HookDispatcher._finish_future``),
the waits moved from ``asyncio.wait_for`` to ``run_with_timeout`` (bash's command and pipes,
``close()``'s wait for calls in flight, an MCP server's start).

The first test is a defect found here (it fails before its fix); the others guard what the attack
tried and found holding, at the exact turns of the loop the commits are about, so a later change
that loses a cancellation there, or reports a start timeout with another code on 3.10, fails.
Timing is driven by ``call_soon`` hops or by blocking the loop after arming timers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from bash_helpers import marker, processes_with, wait_until
from helpers import ToolsPlugin
from test_exactly_once import FutureObserver, Last, Sleeps, audit_record

from amplifier_tools import ToolHost
from amplifier_tools.builtins.bash import process

# -- _finish_future: the observer's future outlives its hook timeout -------------------------------


async def test_a_tool_complete_future_failing_after_its_hook_timeout_is_not_left_unretrieved(tmp_path: Path) -> None:
    """The audit's ``fsync = "always"`` wait timed out (``hook_timeout``), then its fsync failed: under
    ``fail_closed`` the writer sets the typed error on the future nobody waits for any more, and
    asyncio logged "Future exception was never retrieved" when it was collected (found by attack, on
    3.10, 3.11 and 3.13; so before 13879fe too: the old wait's ``shield``, once cut, dropped its
    callback on the future). The wait that gives up on
    the future now marks its outcome seen when it comes. Asserted on the future's own flag (what
    asyncio reads when it is collected): a log capture holding the timeout's traceback keeps the
    future alive, so its collection cannot be waited for here."""
    futures, last = FutureObserver(), Last()
    config = {"plugins": {"futures": {"hook_timeout_ms": 20}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Sleeps()), futures, last], builtins=["audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("sleeps", {"seconds": 0}, call_id="u1")
        assert result.error is not None and result.error["code"] == "hook_timeout"
        assert last.seen == ["u1"] and audit_record(host, "u1")["error"]["code"] == "hook_timeout"
        (future,) = futures.futures
        future.set_exception(OSError(5, "the fsync failed after all"))  # what the audit's writer does
        await asyncio.sleep(0)  # its done callbacks run
        assert future._log_traceback is False, "asyncio will log: Future exception was never retrieved"


async def test_the_audits_fsync_wait_timing_out_with_the_callers_cancellation_is_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real audit plugin under ``fsync = "always"``, its fsync slower than its hook timeout, and the
    caller's cancellation due in the same turn as that timeout: the caller gets ``CancelledError``, the
    call has one record, the audit's future no callback of the wait (13879fe, with the audit's own
    future rather than a test observer's)."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        if threading.current_thread().name.startswith("audit-fsync"):
            time.sleep(0.3)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    loop = asyncio.get_running_loop()
    config = {"plugins": {"audit": {"fsync": "always", "hook_timeout_ms": 20}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Sleeps())], builtins=["audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        waiting = []
        wait_synced = host.plugin_manager.get_plugin("audit").writer.wait_synced

        def noted(seq: int) -> Any:
            future = wait_synced(seq)
            waiting.append(future)
            return future

        monkeypatch.setattr(host.plugin_manager.get_plugin("audit").writer, "wait_synced", noted)
        call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="fs1"))
        while not waiting:
            await asyncio.sleep(0)
        assert waiting[0] is not None
        said: list[bool] = []
        loop.call_later(0.02, lambda: said.append(call.cancel()))
        time.sleep(0.08)  # blocks the loop: the hook timeout and the cancellation are due in one turn
        with pytest.raises(asyncio.CancelledError):
            await call
        assert said == [True]
        assert not waiting[0].done(), "the fsync ended before the timeout: nothing was tested"
        left = [callback for callback, _ in waiting[0]._callbacks or ()]
        assert all(getattr(callback, "__name__", "") != "ring" for callback in left), left
        await waiting[0]  # the fsync ends
        # one record, written before its fsync was waited for: the tool's success, as the call stood then
        assert audit_record(host, "fs1")["error"] is None


# -- bash: the caller cancelled at each turn around its command's end -------------------------------


@pytest.mark.parametrize("hook", ["process_exited", "pipe_connection_lost"])
@pytest.mark.parametrize("turns", [1, 3])
async def test_a_bash_call_cancelled_around_its_commands_end_with_a_child_left_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hook: str, turns: int) -> None:
    """``sleep 100 &`` outlives the command, which then exits 3: whether the caller's cancellation
    lands in the wait for the exit, the kill of the group or the drain of the pipes, it gets
    ``CancelledError`` when ``cancel()`` said True, the exit code and output otherwise, and the child
    is gone either way (38547ab: ``run_with_timeout`` there, not ``wait_for``)."""
    loop = asyncio.get_running_loop()
    calls: list[asyncio.Future[Any]] = []
    said: list[bool] = []
    original = getattr(process._Protocol, hook)

    def cancel_after(n: int) -> None:
        if n:
            loop.call_soon(cancel_after, n - 1)
        elif calls and not said:
            said.append(calls[0].cancel())

    def patched(self: process._Protocol, *args: Any) -> None:
        original(self, *args)
        if not said:
            cancel_after(turns)

    monkeypatch.setattr(process._Protocol, hook, patched)
    tag = marker()
    config = {"plugins": {"bash": {"sandbox": "off"}, "audit": {"fsync": "never"}}}
    async with ToolHost(config=config, builtins=["bash", "audit"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        command = f"sleep 100 & echo {tag}; exit 3"
        calls.append(asyncio.ensure_future(host.call("bash", {"command": command}, call_id="b1")))
        try:
            result = await calls[0]
        except asyncio.CancelledError:
            result = None
        records = [json.loads(line) for line in Path(host.capabilities["audit.path"]).read_text().splitlines()]
    assert said, "the command's end was never seen"
    if said[0]:
        assert result is None, f"cancel() returned True, yet the call returned {result}"
    else:
        assert result is not None and result.output["exit_code"] == 3 and tag in result.output["stdout"]
    assert len([r for r in records if r.get("kind") == "call" and r["call_id"] == "b1"]) == 1
    assert wait_until(lambda: not processes_with(tag), 5.0), "the background child outlived the call"


# -- close(): its caller cancelled at the turn the host becomes idle --------------------------------


@pytest.mark.parametrize("turns", [0, 2])
async def test_close_cancelled_as_the_host_becomes_idle_raises_and_a_later_close_finishes(
        tmp_path: Path, turns: int) -> None:
    """``close()``'s wait for the call in flight ends in the turns its own caller is cancelled: it
    raises ``CancelledError`` when ``cancel()`` said True (never swallows it), else it has closed; a
    second ``close()`` finishes the job, and the call is recorded once (38547ab)."""
    loop = asyncio.get_running_loop()
    said: list[bool] = []
    closer: list[asyncio.Future[None]] = []

    def cancel_after(n: int) -> None:
        if n:
            loop.call_soon(cancel_after, n - 1)
        elif not said:
            said.append(closer[0].cancel())

    class Idle(asyncio.Event):
        def set(self) -> None:
            super().set()
            cancel_after(turns)

    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}}, plugins=[ToolsPlugin(Sleeps())],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    path = Path(host.capabilities["audit.path"])
    call = asyncio.ensure_future(host.call("sleeps", {"seconds": 0.05}, call_id="c1"))
    while not host._pipeline.in_flight:
        await asyncio.sleep(0)
    host._pipeline._idle = Idle()  # the event close() waits on (it keeps one that is not set)
    closer.append(asyncio.ensure_future(host.close(grace_ms=5000)))
    try:
        await closer[0]
        closed = True
    except asyncio.CancelledError:
        closed = False
    result = await call
    await host.close()
    assert result.success
    if said and said[0]:
        assert not closed, "close() swallowed its caller's cancellation"
    else:
        assert closed
    calls = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "call"]
    assert [r["call_id"] for r in calls] == ["c1"]


# -- an MCP server's start ----------------------------------------------------------------------


def _connection(tmp_path: Path, **env: str) -> Any:
    pytest.importorskip("mcp")
    from mcp_helpers import HOSTILE_SERVER

    from amplifier_tools.mcp.client import ServerConnection
    from amplifier_tools.mcp.settings import McpSettings
    from amplifier_tools.plugin_settings import structure_settings

    section = {"command": sys.executable, "args": [HOSTILE_SERVER], "env": env, "sandbox": "off",
               "startup_timeout_ms": 400}
    settings = structure_settings({"servers": {"h": section}}, McpSettings, "plugins.mcp").servers["h"]
    return ServerConnection("h", settings, str(tmp_path))


async def test_an_mcp_start_timeout_is_mcp_start_timeout_on_every_version(tmp_path: Path) -> None:
    """On 3.10 ``TimeLimitExceeded`` is a ``builtins.TimeoutError``, not ``asyncio.TimeoutError``:
    the start's ``isinstance`` test is on ``TimeLimitExceeded`` itself (38547ab); no test named the code."""
    from mcp_helpers import wait_dead

    from amplifier_tools.errors import ExecutionError

    connection = _connection(tmp_path, HOSTILE_HANG_INIT="1")
    with pytest.raises(ExecutionError) as caught:
        await connection.start()
    assert caught.value.code == "mcp_start_timeout" and "did not start within 400 ms" in str(caught.value)
    assert connection.pid is None or wait_dead(connection.pid, 5.0)


@pytest.mark.parametrize("turns", [0, 2])
async def test_an_mcp_start_cancelled_as_the_server_becomes_ready_is_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: int) -> None:
    """The start's caller cancelled within the turns in which the server's readiness reaches it:
    ``CancelledError`` when ``cancel()`` said True (the server stopped), a started connection otherwise."""
    from mcp_helpers import wait_dead

    connection = _connection(tmp_path)
    loop = asyncio.get_running_loop()
    said: list[bool] = []
    starting: list[asyncio.Future[None]] = []
    run = type(connection)._run

    def cancel_after(n: int) -> None:
        if n:
            loop.call_soon(cancel_after, n - 1)
        else:
            said.append(starting[0].cancel())

    async def noted(self: Any, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        ready.add_done_callback(lambda _: cancel_after(turns))
        await run(self, ready, stop)

    monkeypatch.setattr(type(connection), "_run", noted)
    starting.append(asyncio.ensure_future(connection.start()))
    try:
        await starting[0]
        started = True
    except asyncio.CancelledError:
        started = False
    pid = connection.pid
    await connection.close()
    assert said, "the server never became ready"
    assert started is not said[0]
    assert pid is None or wait_dead(pid, 5.0)
