"""An imported stdio MCP server that closes its stdout but keeps running
(tests/mcp_fixtures/mute_server.py): the end of its output marks it dead. A call in flight fails at
once, retryable (``mcp_server_died``), the process is stopped then, not at the next call or the
host's close, and the next call restarts it (counted against ``max_restarts``). Found by trial: the
mute process ran on until the next call stopped it (that call paid the stop's second), or for the
host's lifetime once ``max_restarts`` was reached; one that went mute while idle still counted as
alive, and the next call failed ``mcp_server_died`` instead of running on a restarted server."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from helpers import EVENT_LOOPS, run_on
from mcp_helpers import FIXTURES, alive

from amplifier_tools import ToolContext, ToolHost

MUTE_SERVER = str(FIXTURES / "mute_server.py")


def muting(tmp_path: Path, max_restarts: int, **env: str) -> ToolHost:
    """A host importing the mute server as ``m``; its pids go to ``tmp_path/pids``."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    section = {"command": sys.executable, "args": [MUTE_SERVER], "max_restarts": max_restarts,
               "env": {"MUTE_PID_FILE": str(tmp_path / "pids"), **env}}
    return ToolHost(config={"state_dir": str(tmp_path / "state"), "plugins": {"mcp": {"servers": {"m": section}}}},
                    builtins=["mcp"], entry_points=False, working_dir=work, discover=False)


async def gone(pid: int, seconds: float = 5.0) -> bool:
    """Whether ``pid`` ends within ``seconds``, the event loop running meanwhile (the host stops it there)."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not alive(pid)


def pids(tmp_path: Path) -> list[int]:
    return [int(line) for line in (tmp_path / "pids").read_text().split()]


async def timed_call(host: ToolHost) -> tuple[Any, float]:
    began = time.monotonic()
    result = await host.call("mcp::m::echo", {}, context=ToolContext().with_timeout(30))
    return result, time.monotonic() - began


@pytest.mark.slow
async def test_a_server_closing_its_stdout_mid_call_fails_the_call_is_stopped_and_restarted_once(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("mute")
    async with muting(tmp_path, max_restarts=1) as host:
        died, took = await timed_call(host)
        assert not died.success and took < 5, took  # not the call's 30 s deadline
        assert died.error["code"] == "mcp_server_died" and died.error["retryable"] is True
        first = pids(tmp_path)[0]
        assert await gone(first, 5), "the mute server runs on after its call failed"
        assert "closed its output" in died.error["message"]
        again, _ = await timed_call(host)  # restart 1 of 1: the new process goes mute too
        assert again.error["code"] == "mcp_server_died"
        assert len(pids(tmp_path)) == 2 and await gone(pids(tmp_path)[1], 5)
        refused, _ = await timed_call(host)
        assert refused.error["code"] == "mcp_server_unavailable"
        assert len(pids(tmp_path)) == 2


@pytest.mark.slow
async def test_a_server_that_went_mute_while_idle_is_restarted_before_the_next_call(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp_path = tmp_path_factory.mktemp("mute")
    async with muting(tmp_path, max_restarts=1, MUTE_AFTER_LIST="1", MUTE_ONCE="1") as host:
        first = pids(tmp_path)[0]
        assert await gone(first, 5), "the server that closed its stdout still runs"
        result, took = await timed_call(host)
        assert len(pids(tmp_path)) == 2 and alive(pids(tmp_path)[1])
    assert result.success, result.error
    assert result.output == "ok" and took < 5


@pytest.mark.slow  # the SDK server's start, 1 to 2 s
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
def test_a_server_closing_its_stdout_is_seen_on_every_loop(tmp_path: Path, loop_kind: str) -> None:
    """Found by running the host on uvloop, which closes no descriptor at a spawn: the server
    inherited copies of its own stdout, so closing its stdout ended nothing and the call waited out
    its 30 s deadline (``timeout``) instead of failing ``mcp_server_died`` at once."""

    async def scenario() -> tuple[Any, float, bool]:
        async with muting(tmp_path, max_restarts=0) as host:
            died, took = await timed_call(host)
            return died, took, await gone(pids(tmp_path)[0], 5)

    died, took, stopped = run_on(loop_kind, scenario())
    assert not died.success and died.error["code"] == "mcp_server_died" and took < 5, (died.error, took)
    assert stopped, "the mute server runs on after its call failed"
