"""The bash spawn gate (one spawn at a time per event loop) under cancellation, timeouts, close and threads.

Found by attack: a call cancelled while it held the gate (mid-spawn) hung until its background
children died, they outlived it, and every later bash call of the loop hung behind it; a loop
on which two calls had ever waited at the gate was never freed. The rest is what held, asserted
so that a change cannot break it: a call cancelled or timed out at the gate never spawns, close()
ends queued calls as ``host_closing``, and loops in two threads each have a gate of their own.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bash_helpers import describe_processes, marker, needs_bwrap, processes_with
from helpers import EVENT_LOOPS, run_on

from amplifier_tools import ToolHost
from amplifier_tools.builtins.bash import process


async def _host(root: Path, *, tools: dict[str, Any] | None = None, **bash: Any) -> ToolHost:
    config: dict[str, Any] = {"plugins": {"bash": {"sandbox": "off", "kill_grace": 1, **bash},
                                          "audit": {"fsync": "never"}}}
    if tools is not None:
        config["tools"] = tools
    host = ToolHost(config=config, builtins=["bash", "audit"], entry_points=False, working_dir=root,
                    discover=False)
    await host.start()
    return host


def _recorded(host: ToolHost) -> dict[str, list[str | None]]:
    """call id -> the error code of each audit record of it (None: succeeded)."""
    out: dict[str, list[str | None]] = {}
    path = Path(host.capabilities["audit.path"])
    for record in map(json.loads, path.read_text().splitlines()):
        if record.get("kind") == "call":
            out.setdefault(record["call_id"], []).append((record.get("error") or {}).get("code"))
    return out


class Spawns:
    """The running loop's ``subprocess_exec``, recording each command line; ``hold`` keeps each
    spawn (inside the gate) waiting until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.real = loop.subprocess_exec
        self.argv: list[str] = []
        self.released = asyncio.Event()
        self.released.set()
        self.entered = asyncio.Event()
        monkeypatch.setattr(loop, "subprocess_exec", self.spawn)

    def hold(self) -> None:
        self.released.clear()
        self.entered.clear()

    async def spawn(self, factory: Any, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.released.wait()
        self.argv.append(" ".join(map(str, args)))
        return await self.real(factory, *args, **kwargs)

    def spawned(self, tag: str) -> bool:
        return any(tag in argv for argv in self.argv)


def _kill(tag: str) -> None:
    for pid in processes_with(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def _until(predicate: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return bool(predicate())


# -- cancellation -------------------------------------------------------------------------


async def test_a_call_cancelled_while_waiting_at_the_gate_never_spawns_and_the_queue_moves_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await _host(tmp_path)
    try:
        spawns = Spawns(monkeypatch)
        spawns.hold()
        tags = [marker() for _ in range(3)]
        first = asyncio.ensure_future(host.call("bash", {"command": f"echo first # {tags[0]}"}, call_id="first"))
        await spawns.entered.wait()  # holds the gate
        waiting = asyncio.ensure_future(host.call("bash", {"command": f"sleep 1000 # {tags[1]}"}, call_id="w"))
        behind = asyncio.ensure_future(host.call("bash", {"command": f"echo behind # {tags[2]}"}, call_id="b"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        spawns.released.set()
        assert (await first).success and (await behind).output["stdout"] == "behind\n"
        assert not spawns.spawned(tags[1]) and processes_with(tags[1]) == []
        assert (await host.call("bash", {"command": "echo later"})).success
    finally:
        await host.close()
    assert _recorded(host)["w"] == ["cancelled"] and _recorded(host)["b"] == [None]


@pytest.mark.parametrize(("sandbox", "busy", "how"), [
    ("off", 0.3, "cancel"), ("off", 0.3, "cancel twice"), ("off", 0.3, "close"),
    pytest.param("auto", 0.0, "cancel", marks=needs_bwrap), pytest.param("auto", 0.3, "cancel", marks=needs_bwrap)])
async def test_a_call_cancelled_mid_spawn_ends_at_once_and_takes_its_whole_group_with_it(
        tmp_path: Path, sandbox: str, busy: float, how: str) -> None:
    """Found by attack: cancelled inside ``subprocess_exec``, asyncio SIGKILLed bash alone and
    waited for its pipes to close, which the background child holds: the call hung for as long
    as the child lived (``sleep 1000``), the child outlived it, and the gate stayed held, so
    every later bash call of the loop hung too (close() cutting it: the same, and the cleanups
    ran before it was recorded). With the sandbox, cancelled at once, bwrap's namespace was left
    running (its first process under init: ``--die-with-parent`` not yet set up when bwrap was
    killed) and the call hung on its pipes the same way."""
    tag = marker()
    host = await _host(tmp_path, sandbox=sandbox)
    ending: set[asyncio.Future[Any]] = set()
    try:
        command = f"(exec -a {tag}-child sleep 1000) & (exec -a {tag}-last sleep 1000)"
        task = asyncio.ensure_future(host.call("bash", {"command": command, "timeout": 60}, call_id="mid"))
        ending.add(task)
        for _ in range(10_000):  # the process exists as soon as the spawn's first step is done
            await asyncio.sleep(0)
            if processes_with(tag):
                break
        assert processes_with(tag) and not task.done()
        time.sleep(busy)  # a busy loop: the command starts its background child meanwhile
        if how == "close":
            ending.add(asyncio.ensure_future(host.close(grace_ms=0)))
        else:
            task.cancel()
            if how == "cancel twice":
                await asyncio.sleep(0.01)
                task.cancel()
        _, pending = await asyncio.wait(ending, timeout=8)
        assert not pending, "the cancelled call hung"
        if how == "close":
            assert task.result().error["code"] == "host_closing"
        else:
            assert task.cancelled()
        assert await _until(lambda: processes_with(tag) == [], 3), describe_processes(tag)
        if how != "close":
            later = await asyncio.wait_for(host.call("bash", {"command": "echo later"}), 10)
            assert later.output["stdout"] == "later\n", later.error
    finally:
        _kill(tag)
        await asyncio.wait(ending, timeout=12)
        await host.close()
    assert _recorded(host)["mid"] == ["host_closing" if how == "close" else "cancelled"]


# -- timeouts ---------------------------------------------------------------------------


async def test_a_tool_timeout_running_out_at_the_gate_is_a_typed_timeout_and_the_call_never_spawns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await _host(tmp_path, tools={"local::bash": {"policies": {"timeout_ms": 300}}})
    try:
        spawns = Spawns(monkeypatch)
        tags = [marker() for _ in range(4)]
        loop = asyncio.get_running_loop()
        async with process.spawn_turn(loop):  # a long queue ahead of them
            results = await asyncio.gather(*[
                host.call("bash", {"command": f"echo hi # {tag}"}, call_id=f"t{i}") for i, tag in enumerate(tags)])
            await asyncio.sleep(0.1)
        assert [(r.error or {}).get("code") for r in results] == ["timeout"] * 4
        assert all(r.error and r.error["type"] == "PolicyError" for r in results)
        await asyncio.sleep(0.1)
        assert spawns.argv == [] and not any(processes_with(tag) for tag in tags)
        assert (await host.call("bash", {"command": "echo later"})).success
        assert loop not in process._SPAWN_GATES  # nobody waits at the gate: it is dropped
    finally:
        await host.close()
    assert all(_recorded(host)[f"t{i}"] == ["timeout"] for i in range(4))


async def test_a_callers_deadline_running_out_behind_a_held_spawn_never_spawns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await _host(tmp_path)
    try:
        spawns = Spawns(monkeypatch)
        spawns.hold()
        tag = marker()
        first = asyncio.ensure_future(host.call("bash", {"command": "echo first"}))
        await spawns.entered.wait()
        late = await host.call("bash", {"command": f"echo late # {tag}"},
                               context=host.default_context.with_timeout(0.2))
        assert late.error and late.error["code"] == "timeout" and "deadline" in late.error["message"]
        spawns.released.set()
        assert (await first).success
        assert spawns.argv and not spawns.spawned(tag)
    finally:
        await host.close()


# -- close ------------------------------------------------------------------------------------


async def test_close_cuts_the_calls_queued_at_the_gate_without_spawning_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await _host(tmp_path)
    spawns = Spawns(monkeypatch)
    tags = [marker() for _ in range(6)]
    loop = asyncio.get_running_loop()
    async with process.spawn_turn(loop):  # a spawn in progress: the calls queue behind it
        calls = [asyncio.ensure_future(host.call("bash", {"command": f"sleep 1000 # {tag}"}, call_id=f"q{i}"))
                 for i, tag in enumerate(tags)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await host.close(grace_ms=0)
        assert time.monotonic() - started < 3
    results = [await call for call in calls]  # returned, not raised: the caller did not cancel
    assert [r.error["code"] for r in results if r.error] == ["host_closing"] * 6
    await asyncio.sleep(0.1)
    assert spawns.argv == [] and not any(processes_with(tag) for tag in tags)
    assert _recorded(host) == {f"q{i}": ["host_closing"] for i in range(6)}
    assert loop not in process._SPAWN_GATES
    # The gate is free: another host on this loop runs commands.
    other = await _host(tmp_path)
    try:
        assert (await asyncio.wait_for(other.call("bash", {"command": "echo ok"}), 10)).success
    finally:
        await other.close()


async def test_close_with_grace_lets_the_queued_calls_run(tmp_path: Path) -> None:
    host = await _host(tmp_path)
    calls = [asyncio.ensure_future(host.call("bash", {"command": f"echo {i}"}, call_id=f"g{i}"))
             for i in range(20)]
    await asyncio.sleep(0)
    await host.close(grace_ms=10_000)
    results = [await call for call in calls]
    assert [r.output["stdout"] for r in results] == [f"{i}\n" for i in range(20)]
    assert Counter(len(codes) for codes in _recorded(host).values()) == Counter({1: 20})


# -- loops and threads -------------------------------------------------------------------------


def _burst_in_a_new_loop(root: Path, count: int, loop_kind: str = "asyncio") -> weakref.ref[asyncio.AbstractEventLoop]:
    async def main() -> weakref.ref[asyncio.AbstractEventLoop]:
        host = await _host(root)
        try:
            results = await asyncio.gather(*[host.call("bash", {"command": f"echo {i}"}) for i in range(count)])
            assert [r.output["stdout"] for r in results] == [f"{i}\n" for i in range(count)]
        finally:
            await host.close()
        return weakref.ref(asyncio.get_running_loop())

    made: weakref.ref[asyncio.AbstractEventLoop] = run_on(loop_kind, main())
    return made


def test_a_loop_that_ran_a_burst_of_bash_calls_is_freed_once_closed(tmp_path: Path) -> None:
    """Found by attack: the gates were a ``WeakKeyDictionary`` of ``asyncio.Lock``, and a lock
    binds itself to its loop once a call has to wait: the value kept its own key alive, so every
    loop that ever had two bash calls at once stayed in memory (one per ``asyncio.run``)."""
    loops = [_burst_in_a_new_loop(tmp_path, 5) for _ in range(3)]
    gc.collect()
    assert [loop() for loop in loops] == [None] * 3
    assert len(process._SPAWN_GATES) == 0


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
def test_loops_in_two_threads_each_have_their_own_gate(tmp_path: Path, loop_kind: str) -> None:
    """Found by running it on uvloop too: two threads' uvloop loops spawning at once failed calls
    with ``tool_raised`` ``RuntimeError: Racing with another loop to spawn a process``."""
    if loop_kind == "uvloop":
        pytest.importorskip("uvloop")
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(2):  # a loop closed, a new one made in the same thread
                loops.append(_burst_in_a_new_loop(tmp_path, 30, loop_kind))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(loops) == 4
    gc.collect()
    assert [loop() for loop in loops] == [None] * 4
    assert len(process._SPAWN_GATES) == 0
