"""The bubblewrap sandbox: the ``bwrap`` command line around a command, and whether it started.

Read-only view of the host's root, fresh ``/dev``, ``/proc`` and a private
``/tmp``, the writable roots bound read-write, new IPC/PID/network/UTS (and,
where possible, cgroup) namespaces, every capability dropped (bwrap keeps them
for root otherwise, and a root with ``CAP_SYS_ADMIN`` can remount ``/``
writable), a new session (no TIOCSTI on the caller's terminal), and death with
the parent: when ``bwrap`` is killed its PID namespace goes with it, even the
processes that left the process group.

Must never fall back to running the command without the sandbox: a missing
``bwrap`` or one that cannot set up the sandbox is a ``ToolSystemError``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence

from ...errors import ToolSystemError


def bwrap_argv(bwrap: str, *, cwd: str, writable: Sequence[str], network: bool, status_fd: int,
               bash: str) -> list[str]:
    """The ``bwrap`` prefix for a command that runs in ``cwd`` with ``writable`` directories.

    Inside the sandbox a one-line ``sh`` probe writes ``started`` to ``status_fd``,
    closes it and execs the command: bwrap reports its own setup failures with
    exit code 1, like any command, so only the probe tells them apart.
    """
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
            "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if not network:
        argv.append("--unshare-net")
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in writable:
        argv += ["--bind", path, path]
    probe = f"printf started >&{status_fd} && exec {status_fd}>&- && exec \"$@\""
    # The probe needs only printf and exec: a POSIX sh (dash on Debian) starts faster than bash,
    # but dash takes single-digit descriptors only (see ``low_status_fd``).
    shell = "/bin/sh" if status_fd <= 9 and os.access("/bin/sh", os.X_OK) else bash
    argv += ["--chdir", cwd, "--", shell, "-c", probe, "sandbox-probe"]
    return argv


def low_status_fd(fd: int) -> int:
    """``fd`` moved to the lowest free descriptor from 3 when that is a single digit, else ``fd``.

    ``F_DUPFD`` picks the lowest free number atomically, so no other thread's
    descriptor is ever clobbered; a process with 3-9 all in use keeps ``fd``
    (and the probe runs in bash).
    """
    low = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    if low <= 9:
        os.close(fd)
        return low
    os.close(low)
    return fd


def missing_bwrap() -> ToolSystemError:
    return ToolSystemError("sandbox = 'bubblewrap' is configured but 'bwrap' was not found on PATH; install "
                           "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap). The command was not run.",
                           code="sandbox_unavailable")


def read_status(fd: int) -> str:
    """What bwrap wrote to its status pipe (non-blocking; the pipe's writers may still exist)."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def check_started(status: str, stderr_text: str) -> None:
    """``ToolSystemError`` when bwrap never started the command (the probe did not report)."""
    if status != "started":
        detail = stderr_text.strip().splitlines()[-1] if stderr_text.strip() else "no message"
        raise ToolSystemError(f"the bubblewrap sandbox failed to start ({detail}); the command was not run",
                              code="sandbox_failed")
