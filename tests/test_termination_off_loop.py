"""``termination.kill_group`` (the stop of bash commands and imported MCP servers) scans /proc off
the event loop, and a cancelled stop still ends in SIGKILL, wherever the cancellation lands.

Found by review: the scans that find the group's members and the sandbox's processes ran on the
event loop thread, one every 20 ms through the grace; with 2,000 processes on the host a scan took
200 ms and a 1 s grace held the loop for about a second (every other call and stop waited). Here a
slow scan stands for a busy host."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from amplifier_tools import termination
from amplifier_tools.procfs import is_live

WITNESS = str(Path(__file__).parent / "mcp_fixtures" / "term_witness.py")
#: How long one scan takes here: a host with some thousands of processes.
SLOW_SCAN = 0.25


def words(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def wait_for(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A process leading a group of its own that traps SIGTERM and works 5 s in its handler (its
    marker: ``ready``, ``term``, ``done``)."""
    marker = tmp_path / "marker"
    process = subprocess.Popen([sys.executable, WITNESS, str(marker), "5"], start_new_session=True,
                               stdin=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: words(marker) == ["ready"])
        yield process, marker
    finally:
        process.kill()
        process.wait()


def slow_others(calls: list[float]) -> termination.Others:
    """Processes outside the group (none), found by a scan that takes ``SLOW_SCAN``; each call noted."""
    def scan() -> list[int]:
        calls.append(time.monotonic())
        time.sleep(SLOW_SCAN)
        return []
    return scan


async def test_a_slow_scan_does_not_hold_the_event_loop(witness: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, marker = witness
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker runs from here on
    calls: list[float] = []
    try:
        assert await termination.kill_group(process.pid, 0.2, slow_others(calls))
        await asyncio.sleep(0.05)  # a tick after the stop: a hold at its very end counts too
    finally:
        ticking.cancel()
    held = max(later - earlier for earlier, later in itertools.pairwise(ticks))
    assert calls, "the scan was not used"
    assert words(marker) == ["ready", "term"]  # SIGTERM, then SIGKILL after the grace
    assert held < SLOW_SCAN * 0.8, f"the event loop was held {held:.2f} s by a /proc scan"


async def test_a_stop_cancelled_during_its_first_scan_sigkills_the_group_at_once(
        witness: tuple[subprocess.Popen[bytes], Path]) -> None:
    """No SIGTERM had gone out yet: the cancellation skips the grace (as one during the grace does),
    and no scan of the stop runs on once it has raised (``others`` may read what its caller closes
    then: the sandbox's info pipe)."""
    process, marker = witness
    scanning, release, scanned = threading.Event(), threading.Event(), threading.Event()

    def held_scan() -> list[int]:
        scanning.set()
        release.wait(10)
        scanned.set()
        return []

    stop = asyncio.ensure_future(termination.kill_group(process.pid, 30.0, held_scan))
    try:
        while not scanning.is_set():
            await asyncio.sleep(0.005)
        stop.cancel()
    finally:
        release.set()  # the scan ends after the cancellation: the stop waits for it, then SIGKILLs
    with pytest.raises(asyncio.CancelledError):
        await stop
    assert scanned.is_set(), "a scan of the cancelled stop ran on after it raised"
    assert wait_for(lambda: process.poll() is not None, 5.0), "the group outlived the cancelled stop"
    assert words(marker) == ["ready"]


async def test_a_stop_cancelled_during_the_grace_sigkills_the_group(
        witness: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, marker = witness
    calls: list[float] = []
    stop = asyncio.ensure_future(termination.kill_group(process.pid, 30.0, slow_others(calls)))
    deadline = time.monotonic() + 10
    while words(marker) != ["ready", "term"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    stop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stop
    assert wait_for(lambda: process.poll() is not None, 5.0), "the group outlived the cancelled stop"
    assert words(marker) == ["ready", "term"]
    assert not is_live(process.pid)


def _stop_a_sleeper() -> bool:
    """Start ``sleep`` in a group of its own and stop it with ``kill_group``; whether it ended."""
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        return asyncio.run(asyncio.wait_for(termination.kill_group(process.pid, 0.5), 10)) is True
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # 3.12+: the point
def test_a_stop_in_a_forked_child_runs_its_scans() -> None:
    """Found by review: the scans' thread pool was made once per interpreter; a child forked after
    the parent's first stop inherited the pool without its threads, and its stop never ended."""
    assert _stop_a_sleeper()  # the parent's pool now has threads
    pid = os.fork()
    if pid == 0:  # the child: a stop must end, as in a multiprocessing or gunicorn worker
        code = 1
        try:
            code = 0 if _stop_a_sleeper() else 2
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's stop did not end")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_a_stop_whose_scan_of_others_fails_still_sigkills_the_group(
        witness: tuple[subprocess.Popen[bytes], Path]) -> None:
    """Found by review: a failing ``others`` (its first scan fine, the next ones raising) failed the
    stop before the group's SIGKILL (outside first, then the group, both in ``_kill_now``), so the
    group outlived a stop that raised; before the off-loop change the group's SIGKILL came first."""
    process, marker = witness
    scans = itertools.count()

    def failing_others() -> list[int]:
        if next(scans):
            raise OSError("a /proc scan failed")
        return []

    with pytest.raises(OSError, match="a /proc scan failed"):
        await termination.kill_group(process.pid, 0.2, failing_others)
    # The witness works 5 s in its SIGTERM handler: ended within 2 s, it was SIGKILLed.
    assert wait_for(lambda: process.poll() is not None, 2.0), "the group outlived a stop whose scan failed"
    assert words(marker) == ["ready", "term"]


async def test_a_stop_whose_before_kill_fails_still_sigkills_the_processes_outside_the_group(
        witness: tuple[subprocess.Popen[bytes], Path]) -> None:
    """Found by review: a ``before_kill`` that raised skipped the SIGKILL of ``others`` (only the
    group's came, in ``_kill_now``'s finally): a process outside the group that ignores SIGTERM
    outlived the stop."""
    process, _ = witness
    outside = subprocess.Popen(["/bin/sh", "-c", 'trap "" TERM; echo ready; while :; do sleep 0.05; done'],
                               start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert outside.stdout is not None and outside.stdout.readline() == b"ready\n"

        def failing_sweep() -> None:
            raise OSError("the sweep failed")

        with pytest.raises(OSError, match="the sweep failed"):
            await termination.kill_group(process.pid, 0.2, lambda: [outside.pid] if is_live(outside.pid) else [],
                                         before_kill=failing_sweep)
        assert wait_for(lambda: outside.poll() is not None, 2.0), "the process outside the group outlived the stop"
    finally:
        outside.kill()
        outside.wait()
