"""An imported server's whole process tree: kept together while it runs, killed at close.

A server may start children in other sessions and process groups (``setsid sleep &``) and
orphan them at once, which escapes a process-group kill. So every stdio server is started
through a tiny exec wrapper (``subreaper_argv``) that marks the server process a *child
subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, kept across ``execve``): orphans anywhere in
its tree are re-parented to the server instead of to init, so while the server lives its
``/proc`` descendants are its whole tree. ``kill_descendants`` SIGKILLs them, walking
``/proc`` until none is left (a process forked between two walks is found by the next one).
A server asked to exit may go before its children (they are then re-parented to init), so
the tree is pinned first (``pin_descendants``: pid and start time) and what survives the
server's exit is killed after it (``kill_pinned``), with whatever descends from it by then.
A stop gives the tree its SIGTERM and grace first: ``ServerTree`` is the server and its
descendants for ``termination.kill_group``, and its ``sweep`` the SIGKILL of the tree while the
server, stopped, still holds it.

Why not make the host the subreaper: its orphans would then be re-parented to the host,
mixed with every other child the host has (bash calls, other servers) and left as zombies
unless something reaps them, and reaping unknown pids steals exit statuses from asyncio's
child watchers. A per-server subreaper keeps the side effects inside the server: orphans
that it does not reap stay zombies of the server until it exits.

Limits (without a PID namespace, which only the sandbox gives): a server that clears its
own subreaper flag and double-forks, or that itself starts a process after the tree was
pinned and then exits, or that dies on its own and leaves children behind, can leave a
process the sweep never sees; so can anything that escapes through another service (``systemd-run``,
``at``). Linux only (other systems: the server runs without the wrapper; only its process
group is killed). This module never signals a process that is not a descendant of the pid
it was given at the moment of the walk (each victim is pinned with a pidfd and re-checked),
or that is not a process it pinned (same pid and start time).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import suppress
from typing import Final

from ..procfs import proc_stat

#: ``prctl`` option number (linux/prctl.h).
PR_SET_CHILD_SUBREAPER: Final = 36
#: Walks of ``/proc`` before ``kill_descendants`` gives up on a tree that keeps forking.
MAX_SWEEPS: Final = 50

#: Fails (exit 125, the reason on stderr) rather than run a server whose tree the host cannot hold.
_WRAPPER: Final = (
    "import ctypes,os,sys\n"
    f"if ctypes.CDLL(None,use_errno=True).prctl({PR_SET_CHILD_SUBREAPER},1,0,0,0)!=0:\n"
    "    sys.stderr.write('amplifier-tools: cannot make the MCP server a child subreaper: '"
    "+os.strerror(ctypes.get_errno())+'\\n');sys.exit(125)\n"
    "os.execv(sys.argv[1],sys.argv[1:])\n"
)


def subreaper_available() -> bool:
    """Whether servers can be started as child subreapers (Linux with ``/proc``, a known interpreter)."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self") and bool(sys.executable)


def subreaper_argv(executable: str, args: Sequence[str]) -> list[str]:
    """The argv that runs ``executable`` (an absolute path) as a child subreaper, same pid.

    The wrapper is this interpreter in isolated mode (``-I -S``: no site, no environment
    variables read); it costs one interpreter start (about 30 ms) per server start.
    """
    return [sys.executable, "-I", "-S", "-c", _WRAPPER, executable, *args]


def descendants(*roots: int) -> list[int]:
    """Live (non-zombie) descendants of ``roots`` from one walk of ``/proc``, parents first."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        stat = proc_stat(name)
        if stat is not None and stat.live:
            children.setdefault(stat.ppid, []).append(int(name))
    found: list[int] = []
    seen = set(roots)
    frontier = list(roots)
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                frontier.append(child)
    return found


def _kill_if_still_under(pid: int, tree: set[int]) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone, or no pidfd (old kernel): signal by pid
        stat = proc_stat(pid)
        if stat is not None and stat.ppid in tree:
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    try:
        stat = proc_stat(pid)  # the pidfd pins the process: this is the one we walked
        if stat is not None and stat.ppid in tree:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def kill_descendants(*roots: int) -> int:
    """SIGKILL every descendant of ``roots`` (not the roots themselves); the number killed.

    Walks ``/proc`` again after each round until no live descendant is left (at most
    ``MAX_SWEEPS`` walks, whatever the number of roots). Cheap when there is none: one walk.
    """
    killed: set[int] = set()
    for _ in range(MAX_SWEEPS):
        found = descendants(*roots)
        if not found:
            break
        tree = {*roots, *found}
        for pid in found:
            _kill_if_still_under(pid, tree)
        killed.update(found)
    return len(killed)


#: A process named so that a reused pid is not mistaken for it: ``(pid, start time)``.
Pinned = tuple[int, int]


def pin_descendants(root: int) -> list[Pinned]:
    """The descendants of ``root`` now, named by pid and start time, for ``kill_pinned`` later.

    Taken before a server is asked to exit: it may exit before its children, which are then
    re-parented away from it (to init) and no longer found under it.
    """
    pinned = []
    for pid in descendants(root):
        stat = proc_stat(pid)
        if stat is not None:
            pinned.append((pid, stat.started))
    return pinned


def kill_pinned(pinned: Sequence[Pinned]) -> int:
    """SIGKILL each pinned process still alive (the same process: same start time) and every
    descendant it has now; the number of pinned processes that were still alive. One set of
    ``/proc`` walks for all of them (a walk per survivor made it quadratic)."""
    alive: list[tuple[int, int | None]] = []  # (pid, its pidfd, or None without pidfd support)
    for pid, started in pinned:
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                continue  # gone
            pidfd = None
        stat = proc_stat(pid)  # with a pidfd, the process cannot be swapped for another meanwhile
        if stat is None or not stat.live or stat.started != started:
            if pidfd is not None:
                os.close(pidfd)
            continue
        alive.append((pid, pidfd))
    try:
        if alive:
            kill_descendants(*(pid for pid, _ in alive))
        for pid, pidfd in alive:
            with suppress(OSError):
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
    finally:
        for _, pidfd in alive:
            if pidfd is not None:
                os.close(pidfd)
    return len(alive)


class ServerTree:
    """An unsandboxed server's processes, found anew at each call, for ``termination.kill_group``'s
    ``others``: its descendants (it is their subreaper, so all of them, whatever their session or
    group) and the server itself, last; ``[]`` once the server (same pid and start time) is gone or
    a zombie: its orphans are then re-parented to init and not found here (``kill_pinned`` finds
    those that were pinned). ``sweep`` is the ``before_kill``: it stops the server (SIGSTOP: it
    forks nothing more and stays the subreaper of all it started) and SIGKILLs its descendants
    until none is left, so that nothing it forked during the grace outlives it."""

    __slots__ = ("pid", "started")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        stat = proc_stat(pid)
        #: None when the server is gone or a zombie already: nothing is found then.
        self.started = stat.started if stat is not None and stat.live else None

    def _alive(self) -> bool:
        stat = proc_stat(self.pid)
        return stat is not None and stat.live and stat.started == self.started

    def __call__(self) -> list[int]:
        if self.started is None or not self._alive():
            return []
        found = descendants(self.pid)
        return [*found, self.pid] if self._alive() else []  # it ended during the walk: its pid may be reused

    def sweep(self) -> None:
        if self.started is None:
            return
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return  # gone (or no pidfd: nothing is signalled by a pid that may be another's)
        try:
            if not self._alive():  # the pidfd pins the process: this is the server
                return
            with suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
            kill_descendants(self.pid)
        finally:
            os.close(pidfd)
