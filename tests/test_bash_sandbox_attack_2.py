"""Attacks on the default bash sandbox's kill path (the command is the agent's).

Found by attack: in the sandbox the host's SIGTERM, SIGCONT and SIGKILL reached ``bwrap`` alone (the
sandbox runs in a session of its own), so a command that timed out or was cancelled never saw a
SIGTERM: it was SIGKILLed at once through ``--die-with-parent``, whatever ``kill_grace`` said, and
where that failed (a deadline passing while bwrap was setting up) it went on running, and writing
in the working directory, until the host gave up waiting for its output ``DRAIN_AFTER_EXIT`` (2 s)
later and killed the namespace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, marker, needs_bwrap, processes_with, work_dir_outside_tmp

pytestmark = needs_bwrap


@pytest.fixture
def work() -> Iterator[Path]:
    with work_dir_outside_tmp("amp-attack2-") as path:
        yield path


async def test_a_timed_out_command_gets_sigterm_and_can_clean_up(work: Path) -> None:
    host = await bash_host(work, kill_grace=1)
    try:
        command = "trap 'echo term-seen; exit 3' TERM; echo ready; sleep 30 & wait"
        result = await host.call("bash", {"command": command, "timeout": 0.5})
        assert result.output["timed_out"] is True and result.output["sandboxed"] is True
        assert "ready" in result.output["stdout"]
        assert "term-seen" in result.output["stdout"], result.output
    finally:
        await host.close()


async def test_a_command_timed_out_during_the_sandbox_setup_does_nothing_after_the_kill(work: Path) -> None:
    host = await bash_host(work, kill_grace=0.2)
    try:
        started = time.monotonic()
        # A deadline passing while bwrap sets up: killing bwrap left its namespace running.
        result = await host.call("bash", {"command": "sleep 1.2; echo late > late.txt", "timeout": 1e-6})
        elapsed = time.monotonic() - started
        assert result.output["timed_out"] is True
        assert not (work / "late.txt").exists(), "the command ran on after it was reported killed"
        assert elapsed < 1.2, elapsed
    finally:
        await host.close()


async def test_a_term_ignoring_sandboxed_command_is_killed_after_the_grace_not_later(work: Path) -> None:
    tag = marker()
    host = await bash_host(work, kill_grace=0.2)
    try:
        started = time.monotonic()
        result = await host.call("bash", {"command": f"trap '' TERM; sleep 30 # {tag}", "timeout": 0.3})
        elapsed = time.monotonic() - started
        assert result.output["timed_out"] is True
        assert processes_with(tag) == []
        assert elapsed < 1.5, elapsed  # timeout + grace + the kill, not the 2 s drain on top
    finally:
        await host.close()


async def test_a_cancelled_sandboxed_command_gets_sigterm_before_the_kill(work: Path) -> None:
    host = await bash_host(work, kill_grace=2)
    try:
        command = "trap 'echo bye > termed.txt; exit 0' TERM; echo ready > ready.txt; sleep 30 & wait"
        call = asyncio.ensure_future(host.call("bash", {"command": command}))
        for _ in range(200):
            if (work / "ready.txt").exists():
                break
            await asyncio.sleep(0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert (work / "termed.txt").read_text() == "bye\n"
    finally:
        await host.close()
