"""Attacks on the host's lifecycle: start and close, their re-entrancy, and the event loop a host runs on.

Each test states what a user sees: a typed error for a host used where it cannot be, never a
misleading one, a call that succeeds unrecorded, or a policy error that is really a lost wakeup.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.errors import ToolSystemError


class Quick:
    name = "quick"
    description = "Returns at once."
    input_schema = {"type": "object", "properties": {"x": {"type": "integer"}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0.01)
        return ToolResult(success=True, output=input.get("x", 0))


class SlowMount:
    """A plugin whose ``mount`` takes a while: a start stays under way meanwhile."""

    name = "slowmount"

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        await asyncio.sleep(0.2)


def _host(tmp_path: Path, *plugins: Any, config: dict[str, Any] | None = None) -> ToolHost:
    config = {"state_dir": str(tmp_path / "state"), **(config or {})}
    return ToolHost(config=config, plugins=[ToolsPlugin(Quick()), *plugins], builtins=["audit", "policy"],
                    entry_points=False, working_dir=tmp_path / "work", discover=False)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "state" / "audit.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path


async def test_a_closed_host_started_again_says_so(work: Path) -> None:
    host = _host(work)
    async with host:
        assert (await host.call("quick", {"x": 1})).success
    # Was: PluginLoadError "plugin 'audit': ... a plugin with this name is already registered
    # (from builtin; this one is from builtin)".
    with pytest.raises(ToolSystemError, match="was closed; a ToolHost starts once") as info:
        async with host:
            pass
    assert info.value.code == "host_closed"
    result = await host.call("quick", {"x": 2})
    assert result.error is not None and result.error["code"] == "host_closing"
    assert len(_records(work)) == 1


async def test_a_host_whose_start_failed_says_so_when_started_again(work: Path) -> None:
    host = _host(work, config={"plugins": {"policy": {"nonsense": 1}}})
    with pytest.raises(Exception, match="nonsense"):
        await host.start()
    with pytest.raises(ToolSystemError, match="failed to start; a ToolHost starts once"):
        await host.start()


async def test_two_starts_at_once_start_the_host_once_and_its_calls_are_recorded(work: Path) -> None:
    host = _host(work, SlowMount())
    # Was: the second start failed ("already registered") and its close ran the first start's
    # cleanups, the audit writer's among them: the call below succeeded with no record.
    await asyncio.gather(host.start(), host.start())
    try:
        result = await host.call("quick", {"x": 1})
        assert result.success, result.error
    finally:
        await host.close()
    assert [r["call_id"] for r in _records(work)] == [result.tool_call_id]


async def test_close_while_the_start_is_under_way_leaves_the_host_closed(work: Path) -> None:
    host = _host(work, SlowMount())
    starting = asyncio.ensure_future(host.start())
    await asyncio.sleep(0.05)
    await host.close()
    await starting
    # Was: close() returned at once, then the start went on and left the host started, its
    # audit writer already closed: every call failed audit_unavailable.
    assert not host.started
    result = await host.call("quick", {"x": 1})
    assert result.error is not None and result.error["code"] == "host_closing"


async def test_a_call_from_a_second_threads_loop_is_refused_as_such_and_the_host_loop_serves_its_own(
        work: Path) -> None:
    host = _host(work, config={"tools": {"quick": {"policies": {"concurrency": {"limit": 2}}}}})
    await host.start()
    try:
        def other_thread() -> list[Any]:
            async def calls() -> list[Any]:
                return list(await asyncio.gather(*(host.call("quick", {"x": i}) for i in range(20)),
                                                 return_exceptions=True))
            return asyncio.run(calls())

        outcome: list[Any] = []
        thread = threading.Thread(target=lambda: outcome.extend(other_thread()))
        mine = asyncio.gather(*(host.call("quick", {"x": i}) for i in range(20)))
        thread.start()
        results = await mine
        await asyncio.to_thread(thread.join, 30)
        # Was: the other loop's calls (and the host loop's) waited out their whole wait bound and
        # failed concurrency_limited: a slot freed on one loop never woke a waiter on the other.
        assert all(r.success for r in results), [r.error for r in results if not r.success]
        assert len(outcome) == 20
        for result in outcome:
            assert isinstance(result, ToolResult) and result.error is not None
            assert result.error["code"] == "wrong_event_loop", result.error
            assert "run_coroutine_threadsafe" in result.error["message"]
        with pytest.raises(ToolSystemError, match="another event loop"):
            await asyncio.to_thread(asyncio.run, host.close())
    finally:
        await host.close()
    assert len(_records(work)) == 20


def test_a_host_started_in_one_asyncio_run_serves_the_next(work: Path) -> None:
    host = _host(work, config={"tools": {"quick": {"policies": {"concurrency": {"limit": 1}}}}})

    async def first() -> None:
        await host.start()
        assert all(r.success for r in await asyncio.gather(*(host.call("quick") for _ in range(3))))

    async def second() -> None:
        assert all(r.success for r in await asyncio.gather(*(host.call("quick") for _ in range(3))))
        await host.close()

    asyncio.run(first())
    asyncio.run(second())
    assert len(_records(work)) == 6


class HalfMounts:
    """An installed plugin whose ``mount`` registers things, then fails."""

    seen: list[str] = []

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        coordinator.hooks.register("tool:pre", self.deny, name="half-deny")
        coordinator.register_capability("half.ready", True)
        coordinator.register_contributor("observability.events", "half", lambda: ["half:event"])
        await coordinator.mount("providers", object(), name="half-provider")
        raise RuntimeError("half way through")

    async def deny(self, event: str, data: dict[str, Any]) -> dict[str, Any]:
        HalfMounts.seen.append(event)
        return {"action": "deny", "reason": "the half-mounted plugin denies"}


async def test_an_installed_plugin_that_failed_half_way_through_mount_leaves_nothing_that_runs(
        work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import amplifier_tools.host as host_module

    entry = SimpleNamespace(name="half", value="half:HalfMounts", dist=None, load=lambda: HalfMounts)
    monkeypatch.setattr(host_module, "installed_entry_points",
                        lambda: {"amplifier_tools": [entry], "amplifier.modules": []})
    HalfMounts.seen = []
    host = ToolHost(config={"state_dir": str(work / "state")}, plugins=[ToolsPlugin(Quick())], builtins=False,
                    working_dir=work / "work", discover=False)
    async with host:
        assert [f.name for f in host.failed_plugins] == ["half"]
        assert "half way through" in host.failed_plugins[0].reason
        result = await host.call("quick", {"x": 1})
        # Was: "denied by plugin 'half'" — the plugin the host runs without went on denying every call.
        assert result.success, result.error
        assert HalfMounts.seen == []
        assert "half.ready" not in host.capabilities
        assert host.mounts.get("providers", {}) == {}
        assert host.contributors.get("observability.events", []) == []


_FORKED_HOST = """
import asyncio, json, os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers import ToolsPlugin
from test_host_lifecycle_attack import Quick
from amplifier_tools import ToolHost
from amplifier_tools.errors import ToolSystemError

work = Path({work!r})

async def main():
    host = ToolHost(config={{"state_dir": str(work / "state"), "plugins": {{"audit": {{"fsync": "always"}}}}}},
                    plugins=[ToolsPlugin(Quick())], builtins=["audit", "policy"], entry_points=False,
                    working_dir=work / "work", discover=False)
    await host.start()
    try:
        assert (await host.call("quick", {{"x": 1}})).success
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                async def child():
                    result = await asyncio.wait_for(host.call("quick", {{"x": 2}}), 30)
                    try:
                        await asyncio.wait_for(host.close(), 30)
                        closed = "closed"
                    except ToolSystemError as exc:
                        closed = exc.code
                    return {{"error": result.error, "close": closed}}
                os.write(write, json.dumps(asyncio.run(child())).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            report = json.loads(await asyncio.to_thread(pipe.read))
        await asyncio.to_thread(os.waitpid, pid, 0)
        report["after"] = (await host.call("quick", {{"x": 3}})).success
    finally:
        await host.close()
    print(json.dumps(report))

asyncio.run(main())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_using_the_parents_host_is_refused_and_leaves_the_parents_plugins_alone(work: Path) -> None:
    """The host and the fork are in a fresh interpreter (forking the test run itself, which has
    threads, warns on 3.13 of the deadlocks that may follow)."""
    script = _FORKED_HOST.format(tests=str(Path(__file__).parent), work=str(work))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    # Was: the call waited 10 s for the audit writer's thread (the child has none) and failed
    # audit_unavailable "(None)"; the child's close() then ran the parent's plugins' cleanups.
    assert report["error"]["code"] == "wrong_process", report
    assert "os.fork" in report["error"]["message"]
    assert report["close"] == "wrong_process"
    assert report["after"] is True
    assert len(_records(work)) == 2


class SlowCleanup:
    """A plugin whose cleanup takes ``delay`` seconds; the cleanups' starts and ends are logged."""

    def __init__(self, name: str, delay: float, log: list[tuple[str, str]], close_host: bool = False) -> None:
        self.name, self.delay, self.log, self.close_host = name, delay, log, close_host
        self.host: ToolHost | None = None

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> Any:
        async def cleanup() -> None:
            self.log.append(("start", self.name))
            if self.close_host and self.host is not None:
                await self.host.close()
            await asyncio.sleep(self.delay)
            self.log.append(("end", self.name))
        return cleanup


async def test_two_closes_at_once_run_each_cleanup_once_in_reverse_order_and_return_after_the_last(
        work: Path) -> None:
    log: list[tuple[str, str]] = []
    host = _host(work, SlowCleanup("first", 0.05, log), SlowCleanup("second", 0.2, log))
    await host.start()
    result = await host.call("quick", {"x": 1})

    async def close(who: str) -> None:
        await host.close()
        log.append(("returned", who))

    await asyncio.gather(close("a"), close("b"))
    # Was: b ran "first" (and the audit writer's cleanup) while "second" still ran, and returned before it ended.
    assert log == [("start", "second"), ("end", "second"), ("start", "first"), ("end", "first"),
                   ("returned", "a"), ("returned", "b")]
    assert [r["call_id"] for r in _records(work)] == [result.tool_call_id]


async def test_a_cleanup_that_closes_its_own_host_does_not_wait_for_itself(work: Path) -> None:
    log: list[tuple[str, str]] = []
    closing = SlowCleanup("closing", 0.01, log, close_host=True)
    host = _host(work, SlowCleanup("first", 0.01, log), closing)
    closing.host = host
    await host.start()
    await asyncio.wait_for(host.close(), 10)
    assert log == [("start", "closing"), ("end", "closing"), ("start", "first"), ("end", "first")]


class Waits:
    name = "waits"
    description = "Waits until released."

    def __init__(self) -> None:
        self.running = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        await asyncio.sleep(30)
        return ToolResult(output="slept")


async def test_a_cancelled_close_still_cuts_records_and_cleans_up_then_raises(work: Path) -> None:
    """``close()`` cancelled while a call uses its grace: the call is cut at once and recorded,
    every cleanup runs (the audit writer's last), then ``CancelledError``. Found by a helper's
    attack: the cancellation ended close() where it was — the host half-closed, its call running
    on, and no cleanup run (the audit writer's among them)."""
    log: list[tuple[str, str]] = []
    waits = Waits()
    host = ToolHost(config={"state_dir": str(work / "state"), "shutdown_grace_ms": 30_000},
                    plugins=[ToolsPlugin(Quick(), waits), SlowCleanup("first", 0.01, log),
                             SlowCleanup("second", 0.05, log)],
                    builtins=["audit", "policy"], entry_points=False, working_dir=work / "work", discover=False)
    await host.start()
    call = asyncio.ensure_future(host.call("waits", {}, call_id="w1"))
    await waits.running.wait()
    closing = asyncio.ensure_future(host.close())
    for _ in range(5):
        await asyncio.sleep(0)  # close() waits for the call's grace (30 s)
    assert not closing.done() and log == []
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == [("start", "second"), ("end", "second"), ("start", "first"), ("end", "first")]
    result = await call
    assert result.error["code"] == "host_closing"
    assert [r["call_id"] for r in _records(work) if r.get("kind") == "call"] == ["w1"]
    assert (await host.call("quick", {"x": 1})).error["code"] == "host_closing"


class RaisesCancelledInCleanup:
    """A plugin whose cleanup raises ``CancelledError`` of its own (something it awaited was cancelled)."""

    name = "raises_cancelled"

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> Any:
        async def cleanup() -> None:
            self.log.append(("start", self.name))
            raise asyncio.CancelledError

        return cleanup


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a cleanup's own CancelledError apart")
async def test_a_cancelled_close_takes_a_cleanups_own_cancelled_error_for_its_failure(work: Path) -> None:
    """After ``close()`` caught its own cancellation (in the grace), a cleanup raising
    ``CancelledError`` itself is that cleanup's failure and the cleanups after it still run. Found
    by review: the caught request was left standing on the task, so the cleanup's error read as a
    second cancellation of close(), and the later cleanups (the audit writer's last) were skipped."""
    log: list[tuple[str, str]] = []
    waits = Waits()
    host = ToolHost(config={"state_dir": str(work / "state"), "shutdown_grace_ms": 30_000},
                    plugins=[ToolsPlugin(Quick(), waits), SlowCleanup("first", 0.01, log),
                             RaisesCancelledInCleanup(log)],
                    builtins=["audit", "policy"], entry_points=False, working_dir=work / "work", discover=False)
    await host.start()
    call = asyncio.ensure_future(host.call("waits", {}, call_id="w2"))
    await waits.running.wait()
    closing = asyncio.ensure_future(host.close())
    for _ in range(5):
        await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert log == [("start", "raises_cancelled"), ("start", "first"), ("end", "first")]
    assert (await call).error["code"] == "host_closing"
    assert [r["call_id"] for r in _records(work) if r.get("kind") == "call"] == ["w2"]


class MountRecorder:
    """A plugin whose ``mount`` takes a while and whose cleanup says it ran."""

    name = "recorder"

    def __init__(self) -> None:
        self.cleaned = False

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        coordinator.register_cleanup(self._cleanup)
        await asyncio.sleep(0.2)

    def _cleanup(self) -> None:
        self.cleaned = True


async def _close_cancelled_while_starting(host: ToolHost) -> asyncio.Future[None]:
    """Start ``host``, await ``close()`` in another task while the start is under way, cancel that
    close and check it raises at once (the start may take long); the start, still going on."""
    starting = asyncio.ensure_future(host.start())
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(host.close())
    await asyncio.sleep(0.05)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    return starting


async def test_a_close_cancelled_while_the_start_is_under_way_still_leaves_the_host_closed(work: Path) -> None:
    recorder = MountRecorder()
    host = _host(work, recorder)
    await (await _close_cancelled_while_starting(host))
    # Was: the start went on and left the host started and open, its plugins' cleanups never run,
    # although close() had been awaited.
    assert not host.started
    assert recorder.cleaned
    result = await host.call("quick", {"x": 1})
    assert result.error is not None and result.error["code"] == "host_closing"
    await host.close()  # closing again is harmless


async def test_a_close_cancelled_while_a_failing_start_is_under_way_leaves_its_error_to_the_start(
        work: Path) -> None:
    class FailingMount(SlowMount):
        name = "failing"

        @hookimpl
        async def mount(self, coordinator: Any, config: Any) -> None:
            await asyncio.sleep(0.2)
            raise RuntimeError("no mount today")

    host = ToolHost(config={"state_dir": str(work / "state")},
                    plugins=[ToolsPlugin(Quick()), FailingMount()], builtins=["audit"], entry_points=False,
                    working_dir=work / "work", discover=False)
    starting = await _close_cancelled_while_starting(host)
    with pytest.raises(Exception, match="no mount today"):
        await starting
    assert not host.started
