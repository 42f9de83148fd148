"""One reader of ``/proc/<pid>/stat``: the fields the host uses to find and kill processes.

Used by the bash process-group cleanup, the sandbox's namespace wait and the MCP
process-tree kill. Linux only; a process that is gone (or a ``/proc`` that cannot be
read) reads as None.
"""

from __future__ import annotations

from typing import NamedTuple


class ProcStat(NamedTuple):
    """What ``/proc/<pid>/stat`` says of one process."""

    comm: str  #: the program name, at most 15 bytes (may contain spaces and parentheses)
    state: str  #: R, S, D, T, Z (zombie), X (dead), ...
    ppid: int
    pgid: int
    started: int  #: clock ticks after boot: with the pid, it names one process (pids are reused)

    @property
    def live(self) -> bool:
        """Not a zombie and not dead."""
        return self.state not in ("Z", "X")


def proc_stat(pid: int | str) -> ProcStat | None:
    """The stat of process ``pid``, or None when it does not exist (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    name_end = data.rfind(b")")  # the name may contain ")": the last one ends it
    fields = data[name_end + 2:].split()
    if len(fields) < 20:
        return None
    comm = data[data.find(b"(") + 1:name_end].decode("utf-8", "replace")
    return ProcStat(comm, fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def is_live(pid: int | str) -> bool:
    """Whether process ``pid`` exists and is neither a zombie nor dead."""
    stat = proc_stat(pid)
    return stat is not None and stat.live
