"""Ending a process group, and a sandbox's processes outside it: SIGTERM, a grace, then SIGKILL.

The one stop of the host's children that may have a say in their end: the bash tool's commands
(at a timeout or a cancellation) and the imported MCP stdio servers (at the host's close, a
restart, a startup timeout). ``kill_group`` sends SIGTERM (and SIGCONT, so stopped members can act
on it), waits out the grace while anything is alive, then SIGKILLs until the kernel has removed
every member. A sandbox's processes are in a session of their own (bubblewrap's
``--new-session``), out of reach of the signals to bwrap's group, and killing bwrap would SIGKILL
them at once (``--die-with-parent``) or not at all: the caller passes ``others``, which finds them
(``sandbox.SandboxProcesses``), and they get the SIGTERM instead of bwrap.

The ``/proc`` scans run in a small pool of threads of its own, not on the event loop (a scan of
2,000 processes takes about 200 ms, and the grace polls every 20 ms); a stop whose caller is
cancelled sends its SIGKILL at once, from the loop's thread.

Limits: a process that leaves the group and is not among ``others`` (``setsid`` without the
sandbox) is not found here; the callers sweep those their own way (the MCP transport passes an
unsandboxed server's subreaper tree as ``others``). Linux only (``/proc``). It never signals a pid
it did not find in the group or among ``others`` at that moment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from .procfs import proc_stat

POLL_INTERVAL: Final = 0.02
KILL_WAIT: Final = 5.0  # after SIGKILL, how long to wait for the kernel to remove the group

_T = TypeVar("_T")

#: The processes to end outside the process group (a sandbox's PID namespace), found anew each time.
Others = Callable[[], Sequence[int]]


def live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are not zombies (a /proc scan)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(name)
            if stat is not None and stat.pgid == pgid and stat.live:
                out.append(int(name))
    return out


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # members that changed uid (setuid programs); the rest were signalled
        return True
    return True


def signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    # killpg(0) is cheap but counts zombies that an init without reaping may keep; confirm in /proc.
    return signal_group(pgid, 0) and bool(live_members(pgid))


#: Where the stop paths' /proc scans run, off the event loop (a scan of 2,000 processes took
#: 200 ms, and the grace polls one every 20 ms: the loop was held for most of the grace). Its own
#: threads, not the loop's default executor, which other tools' threads may fill for long.
#: Made at a process's first stop: a forked child gets its own (found by review: the parent's
#: pool, its threads not copied by ``fork``, took a child's scans and never ran them, so a stop in
#: a ``multiprocessing`` or ``gunicorn --preload`` worker hung).
_scans: concurrent.futures.ThreadPoolExecutor | None = None


_scans_lock = threading.Lock()


def _scan_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _scans
    with _scans_lock:  # two event loops in two threads stopping at once make one pool
        if _scans is None:
            _scans = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="amplifier-tools-stop")
        return _scans


def _forget_scan_pool() -> None:
    global _scans, _scans_lock
    _scans, _scans_lock = None, threading.Lock()  # the lock too: another thread may have held it at the fork


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_scan_pool)


class _OffLoop:
    """Runs a stop's scans in ``_scan_pool()``, one at a time; ``settle`` waits (blocking) for the one in
    flight, so that none still runs when a cancelled stop returns (``others`` may read what its
    caller closes then: the sandbox's info pipe)."""

    __slots__ = ("_running",)

    def __init__(self) -> None:
        self._running: concurrent.futures.Future[Any] | None = None

    async def __call__(self, function: Callable[[], _T]) -> _T:
        try:
            future = _scan_pool().submit(function)
        except RuntimeError:  # the interpreter is exiting (no new threads): a stop still completes, here
            return function()
        self._running = future
        return await asyncio.wrap_future(future)  # cancelled: a scan not started yet never runs

    def settle(self) -> None:
        if self._running is not None:
            concurrent.futures.wait((self._running,))


def _kill_now(pgid: int, outside: Others, before_kill: Callable[[], object] | None) -> None:
    """SIGKILL what is outside the group first (an unsandboxed MCP server's subreaper tree must go
    while its leader, a group member, still holds it), then the group — each even when what comes
    before it fails: ``before_kill`` or the scan of ``outside`` (their error is raised after them;
    found by review: a failing ``before_kill`` skipped the processes outside the group)."""
    try:
        if before_kill is not None:
            before_kill()
    finally:
        try:
            signal_pids(outside(), signal.SIGKILL)
        finally:
            signal_group(pgid, signal.SIGKILL)


def _kill_round(pgid: int, outside: Others) -> bool:
    """SIGKILL what is left; True while anything was."""
    left = outside()
    signal_pids(left, signal.SIGKILL)
    return bool((signal_group(pgid, signal.SIGKILL) and live_members(pgid)) or left)


async def kill_group(pgid: int, grace: float, others: Others | None = None, *,
                     before_kill: Callable[[], object] | None = None) -> bool:
    """TERM, grace, KILL the process group until no live member is left; True if anything was alive.

    ``others``: the processes outside the group to end with it (the sandbox's, in a session of
    their own); while there are any, SIGTERM goes to them rather than to the group (bwrap, whose
    death would SIGKILL them at once), and SIGKILL to both, to them first. ``before_kill`` runs once
    the grace is over, before any SIGKILL (the MCP transport stops an unsandboxed server and sweeps
    its subreaper tree there). Safe to call when the group is already gone.

    The /proc scans run in threads of their own (``_scan_pool()``): the event loop serves other calls
    meanwhile. Cancellation of the caller before the SIGKILL (during a scan or the grace) goes
    straight to SIGKILL, which then runs on the loop's thread (no await is left to be cut short),
    after the scan in flight; a cancellation after it only cuts the wait for the kernel to remove
    the members. No scan of this call runs once it has returned or raised.
    """
    def outside() -> Sequence[int]:
        return others() if others is not None else ()

    def alive() -> bool:
        return _group_alive(pgid) or bool(outside())

    off_loop = _OffLoop()
    killed = False
    try:
        found = await off_loop(outside)
        if not found and not await off_loop(lambda: _group_alive(pgid)):
            killed = True  # nothing to kill
            return False
        if found:
            signal_pids(found, signal.SIGTERM)
            signal_pids(found, signal.SIGCONT)
        else:
            signal_group(pgid, signal.SIGTERM)
            signal_group(pgid, signal.SIGCONT)  # stopped members cannot act on SIGTERM otherwise
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and await off_loop(alive):
            await asyncio.sleep(POLL_INTERVAL)
        await off_loop(lambda: _kill_now(pgid, outside, before_kill))
        killed = True
    finally:
        if not killed:  # cancelled before the SIGKILL: it is sent now, once the scan in flight is over
            off_loop.settle()
            _kill_now(pgid, outside, before_kill)
    # A member may be forking as the signal arrives; repeat until the kernel has removed every one.
    deadline = time.monotonic() + KILL_WAIT
    try:
        while time.monotonic() < deadline and await off_loop(lambda: _kill_round(pgid, outside)):
            await asyncio.sleep(0.005)
    finally:
        off_loop.settle()  # cancelled: the last SIGKILL round still ends before the caller goes on
    return True
