"""uvloop's process-wide spawn guard: a spawn made while a uvloop loop of another thread is forking
is refused (``RuntimeError: Racing with another loop to spawn a process.``, nothing started). The
bash tool and the MCP stdio transport try the spawn again (``spawning.retry_racing``)."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest

pytest.importorskip("mcp")
uvloop = pytest.importorskip("uvloop")

from amplifier_tools.mcp import transport  # noqa: E402

RACING = "Racing with another loop to spawn a process."


def _racing_once(loop: Any) -> list[int]:
    """Make ``loop`` refuse its first spawn as uvloop does while another thread's loop forks."""
    spawns: list[int] = []
    real = loop.subprocess_exec

    async def subprocess_exec(*args: Any, **kwargs: Any) -> Any:
        spawns.append(1)
        if len(spawns) == 1:
            raise RuntimeError(RACING)
        return await real(*args, **kwargs)

    loop.subprocess_exec = subprocess_exec
    return spawns


def test_an_mcp_server_spawn_refused_by_a_race_with_another_loop_is_tried_again() -> None:
    """Found by review: only the bash tool tried again; an MCP stdio server started on uvloop while
    another thread's uvloop loop spawned (a bash call of a second host) failed to start."""
    loop = uvloop.new_event_loop()
    spawns = _racing_once(loop)

    async def spawn() -> bytes:
        process = await transport._open_process(["/bin/echo", "started"], env={"PATH": "/usr/bin:/bin"},
                                                cwd=None, stderr=subprocess.DEVNULL, start_new_session=True,
                                                pass_fds=())
        assert process.stdout is not None
        out = await process.stdout.receive()
        await process.wait()
        return out

    try:
        out = loop.run_until_complete(asyncio.wait_for(spawn(), 5))
    finally:
        loop.close()
    assert out == b"started\n" and len(spawns) == 2
