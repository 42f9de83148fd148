"""The bubblewrap sandbox: the ``bwrap`` command line around a command, and whether it started.

Read-only view of the host's root, fresh ``/dev``, ``/proc`` and a private
``/tmp``, the writable roots bound read-write, new IPC/PID/network/UTS (and,
where possible, cgroup) namespaces, every capability dropped (bwrap keeps them
for root otherwise, and a root with ``CAP_SYS_ADMIN`` can remount ``/``
writable), a new session (no TIOCSTI on the caller's terminal), and death with
the parent: when ``bwrap`` is killed its PID namespace goes with it, even the
processes that left the process group.

The host's protected paths (``session.protected_paths``: its config file, ``state_dir``,
the audit log...) are masked: an existing directory gets an empty read-only tmpfs in its
place, an existing file a read-only ``/dev/null``, and the directories between a writable
root and a masked path are bound onto themselves, so that inside the sandbox they are mount
points that cannot be renamed or removed (which would let a command put a new file where the
masked one was). A protected path that does not exist is not masked: bwrap would have to
create a mount point for it on the host (see docs/bash.md for that gap).

Must never fall back to running the command without the sandbox: a missing
``bwrap`` or one that cannot set up the sandbox is a ``ToolSystemError``.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterable, Sequence
from typing import Final

from ...errors import ToolSystemError

#: Mounted fresh in the sandbox: the host's files below them are not visible (unless a writable root
#: below them is bound back in).
REPLACED: Final = ("/tmp", "/dev", "/proc")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def mask_argv(protected: Iterable[str], writable: Sequence[str]) -> list[str]:
    """The bwrap arguments that hide each protected path the sandbox would otherwise show.

    ``protected`` are absolute, resolved paths. Raises ``ToolSystemError`` when one of them no
    longer resolves to itself (a component was replaced by a symlink): masking the symlink's
    target instead would leave the protected path reachable.
    """
    argv: list[str] = []
    masked: list[str] = []
    pinned: set[str] = set(writable)
    for path in sorted(set(protected)):  # parents before what lies below them
        roots = [root for root in writable if _under(path, root)]
        if any(_under(path, done) for done in masked) or (
                not roots and any(_under(path, replaced) for replaced in REPLACED)):
            continue  # already hidden
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # never make bwrap create a mount point on the host
        if os.path.realpath(path) != path:
            raise ToolSystemError(f"the protected path {path} now resolves to {os.path.realpath(path)} (was a "
                                  "component replaced by a symlink?); the sandbox cannot hide it, so the command "
                                  "was not run", code="sandbox_failed", path=path)
        for root in roots:  # pin the directories between the root and the masked path
            parent, chain = os.path.dirname(path), []
            while parent not in pinned and _under(parent, root):
                chain.append(parent)
                parent = os.path.dirname(parent)
            for directory in reversed(chain):
                argv += ["--bind", directory, directory]
                pinned.add(directory)
        if stat.S_ISDIR(info.st_mode):
            argv += ["--tmpfs", path, "--remount-ro", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]
        masked.append(path)
    return argv


def bwrap_argv(bwrap: str, *, cwd: str, writable: Sequence[str], network: bool, status_fd: int,
               bash: str, masks: Sequence[str] = ()) -> list[str]:
    """The ``bwrap`` prefix for a command that runs in ``cwd`` with ``writable`` directories and
    ``masks`` (from ``mask_argv``) hiding the host's protected paths.

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
    argv += masks  # ``mask_argv``'s, after the binds: mounted on top of them
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
