"""Ending a process group, and a sandbox's processes outside it: SIGTERM, a grace, then SIGKILL.

The one stop of the host's children that may have a say in their end: the bash tool's commands
(at a timeout or a cancellation) and the imported MCP stdio servers (at the host's close, a
restart, a startup timeout). ``kill_group`` sends SIGTERM (and SIGCONT, so stopped members can act
on it), waits out the grace while anything is alive, then SIGKILLs until the kernel has removed
every member. A sandbox's processes are in a session of their own (bubblewrap's
``--new-session``), out of reach of the signals to bwrap's group, and killing bwrap would SIGKILL
them at once (``--die-with-parent``) or not at all: the caller passes ``others``, which finds them
(``sandbox.SandboxProcesses``), and they get the SIGTERM instead of bwrap.

Limits: a process that leaves the group and is not among ``others`` (``setsid`` without the
sandbox) is not found here; the callers sweep those their own way. Linux only (``/proc``). It never
signals a pid it did not find in the group or among ``others`` at that moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Final

from .procfs import proc_stat

POLL_INTERVAL: Final = 0.02
KILL_WAIT: Final = 5.0  # after SIGKILL, how long to wait for the kernel to remove the group

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


async def kill_group(pgid: int, grace: float, others: Others | None = None) -> bool:
    """TERM, grace, KILL the process group until no live member is left; True if anything was alive.

    ``others``: the processes outside the group to end with it (the sandbox's, in a session of
    their own); while there are any, SIGTERM goes to them rather than to the group (bwrap, whose
    death would SIGKILL them at once), and SIGKILL to both. Safe to call when the group is already
    gone. Cancellation of the caller while waiting out the grace period goes straight to SIGKILL.
    """
    def outside() -> Sequence[int]:
        return others() if others is not None else ()

    found = outside()
    if not found and not _group_alive(pgid):
        return False
    if found:
        signal_pids(found, signal.SIGTERM)
        signal_pids(found, signal.SIGCONT)
    else:
        signal_group(pgid, signal.SIGTERM)
        signal_group(pgid, signal.SIGCONT)  # stopped members cannot act on SIGTERM otherwise
    try:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (_group_alive(pgid) or outside()):
            await asyncio.sleep(POLL_INTERVAL)
    finally:
        signal_group(pgid, signal.SIGKILL)  # even when cancelled while waiting out the grace
        signal_pids(outside(), signal.SIGKILL)
    # A member may be forking as the signal arrives; repeat until the kernel has removed every one.
    deadline = time.monotonic() + KILL_WAIT
    while time.monotonic() < deadline:
        left = outside()
        signal_pids(left, signal.SIGKILL)
        if not ((signal_group(pgid, signal.SIGKILL) and live_members(pgid)) or left):
            break
        await asyncio.sleep(0.005)
    return True
