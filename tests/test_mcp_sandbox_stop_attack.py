"""Attacks on the stop path of a sandboxed stdio MCP server (the host's close, a startup timeout, a
restart), with a server that traps SIGTERM and a child that keeps writing a file
(tests/mcp_fixtures/stop_server.py): does the server get its SIGTERM and grace before SIGKILL, and
does anything of the sandbox run on once the host says it stopped? (The bash tool's sandbox had both
gaps: tests/test_bash_sandbox_attack_2.py.)"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp_helpers import FIXTURES

from amplifier_tools import PluginLoadError, ToolHost

# Slow: each stop waits out the second a server gets to exit once its stdin closes.
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap is not installed (.ci/run installs it)"),
              pytest.mark.slow]

STOP_SERVER = str(FIXTURES / "stop_server.py")


def stopping(tmp_path: Path, **server: Any) -> ToolHost:
    """A host importing the stop server, sandboxed, as ``s``; ``env`` adds to its environment."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    env = {"STOP_TERM_FILE": str(out / "term"), "STOP_BEAT_FILE": str(out / "beat"), **server.pop("env", {})}
    section = {"command": sys.executable, "args": [STOP_SERVER], "env": env, "sandbox": "auto",
               "sandbox_read_paths": sorted({sys.prefix, sys.base_prefix, str(FIXTURES)}),
               "sandbox_write_paths": [str(out)], **server}
    return ToolHost(config={"plugins": {"mcp": {"servers": {"s": section}}}}, builtins=["mcp"],
                    entry_points=False, working_dir=work, discover=False)


def term_file(tmp_path: Path) -> list[str]:
    """What the server's SIGTERM handler wrote: ``["term", "done"]`` when it had its grace."""
    path = tmp_path / "out" / "term"
    return path.read_text().split() if path.exists() else []


def beats(tmp_path: Path) -> int:
    path = tmp_path / "out" / "beat"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def wait_beating(tmp_path: Path) -> None:
    """Until the server's child has written twice (it is running)."""
    with anyio.fail_after(10):
        while beats(tmp_path) < 2:
            await anyio.sleep(0.02)


async def still_writing(tmp_path: Path) -> bool:
    """Whether anything still appends to the beat file (its child writes every 20 ms)."""
    before = beats(tmp_path)
    await anyio.sleep(0.25)
    return beats(tmp_path) > before


async def test_a_sandboxed_server_gets_sigterm_and_its_grace_when_the_host_closes(tmp_path: Path) -> None:
    """Found by attack: after its stdin closed, the sandboxed server was SIGKILLed with its whole tree
    (the sweep of bwrap's descendants), and the SIGTERM went to bwrap's group, which holds bwrap
    alone: a server's SIGTERM handler never ran, unlike an unsandboxed server's."""
    async with stopping(tmp_path) as host:
        assert (await host.call("mcp::s::echo", {})).output == "ok"
        await wait_beating(tmp_path)
    assert term_file(tmp_path) == ["term", "done"]
    assert not await still_writing(tmp_path), "the server's child (SIGTERM ignored) ran on after close"


async def test_a_server_that_ignores_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    started = 0.0
    async with stopping(tmp_path, env={"STOP_TERM_WORK": "60"}) as host:
        assert (await host.call("mcp::s::echo", {})).output == "ok"
        await wait_beating(tmp_path)
        started = time.monotonic()
    assert time.monotonic() - started < 6.0  # stdin closed: 1 s; SIGTERM: 1 s; then SIGKILL
    assert term_file(tmp_path) == ["term"]
    assert not await still_writing(tmp_path)


async def test_a_sandboxed_server_that_misses_its_startup_timeout_gets_sigterm_and_nothing_runs_on(
        tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match="did not start within"):
        async with stopping(tmp_path, env={"STOP_HANG_INIT": "1"}, startup_timeout_ms=1000):
            pass
    assert beats(tmp_path) > 0, "the server had started"
    assert term_file(tmp_path) == ["term", "done"]
    assert not await still_writing(tmp_path)


async def test_a_startup_timeout_during_the_sandboxes_spawn_leaves_nothing_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack (``startup_timeout_ms = 1``..``6``, one start in two): the timeout's
    cancellation arrived while asyncio was still spawning bwrap; asyncio SIGKILLed bwrap alone, the
    sandbox it had begun lived on (re-parented to init, its server and the server's children
    running and writing for good), and the start took 10 s (the close's wait for the start) instead
    of failing at its timeout. Here the spawn is made to outlast the timeout, as on a loaded machine."""
    spawn = anyio.open_process

    async def slow_spawn(*args: Any, **kwargs: Any) -> Any:
        process = await spawn(*args, **kwargs)
        await anyio.sleep(0.5)  # bwrap setting up the sandbox while the start's deadline passes
        return process

    monkeypatch.setattr(anyio, "open_process", slow_spawn)
    started = time.monotonic()
    with pytest.raises(PluginLoadError, match="did not start within"):
        async with stopping(tmp_path, startup_timeout_ms=50):
            pass
    assert time.monotonic() - started < 4.0
    await anyio.sleep(0.2)
    assert not await still_writing(tmp_path), "the sandbox whose spawn the timeout cut ran on"


async def test_tiny_startup_timeouts_leave_no_sandbox_running(tmp_path: Path) -> None:
    """The same with the real spawn: deadlines of a few milliseconds land in the spawn, in bwrap's
    setup or in the server's start; none may leave a process writing, nor take the close's 10 s."""
    for attempt, timeout_ms in enumerate((1, 2, 3, 5, 8) * 2):
        run = tmp_path / str(attempt)
        run.mkdir()
        started = time.monotonic()
        with pytest.raises(PluginLoadError, match="did not start within"):
            async with stopping(run, startup_timeout_ms=timeout_ms):
                pass
        assert time.monotonic() - started < 8.0, f"{timeout_ms} ms: the failed start took the close's 10 s"
        assert not await still_writing(run), f"{timeout_ms} ms: the sandbox ran on"


async def test_a_crashed_sandboxed_server_leaves_no_child_and_is_restarted(tmp_path: Path) -> None:
    """The namespace dies with the server: its child stops when it crashes, and the restarted
    server is the one stopped with SIGTERM at close."""
    async with stopping(tmp_path) as host:
        await wait_beating(tmp_path)
        crashed = await host.call("mcp::s::crash", {})
        assert crashed.error is not None and crashed.error["code"] == "mcp_server_died"
        assert not await still_writing(tmp_path), "the crashed server's child ran on"
        assert (await host.call("mcp::s::echo", {})).output == "ok"  # restarted
        await wait_beating(tmp_path)
    assert term_file(tmp_path) == ["term", "done"]
    assert not await still_writing(tmp_path)
