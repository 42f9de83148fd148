"""The bash-specific part of the sandbox: the start probe around ``bash -c`` and its status pipe.

The view, the namespaces and the masks come from the one engine, ``amplifier_tools.sandbox``;
this module only wraps the command so that a setup failure of bwrap (exit code 1, like any
command) can be told apart from the command's own exit: inside the sandbox a one-line ``sh``
writes ``started`` to a status descriptor, closes it and execs the command.

Must never fall back to running the command without the sandbox: a missing ``bwrap`` or one
that cannot set up the sandbox is a ``ToolSystemError``.
"""

from __future__ import annotations

import fcntl
import os
import signal

from ... import sandbox as engine
from ...errors import ToolSystemError


def bwrap_argv(bwrap: str, view: engine.View, *, status_fd: int, bash: str, info_fd: int | None = None,
               seccomp_fd: int | None = None) -> list[str]:
    """The ``bwrap`` prefix for a command (appended after it) that runs in ``view`` and reports its
    start on ``status_fd`` (and, with ``info_fd``, bwrap its namespace's first process there;
    with ``seccomp_fd``, under the engine's seccomp filter)."""
    probe = f"printf started >&{status_fd} && exec {status_fd}>&- && exec \"$@\""
    # The probe needs only printf and exec: a POSIX sh (dash on Debian) starts faster than bash,
    # but dash takes single-digit descriptors only (see ``low_status_fd``).
    shell = "/bin/sh" if status_fd <= 9 and os.access("/bin/sh", os.X_OK) else bash
    return engine.command(view, [shell, "-c", probe, "sandbox-probe"], bwrap=bwrap, info_fd=info_fd,
                          seccomp_fd=seccomp_fd)


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


def check_started(status: str, stderr_text: str) -> None:
    """``ToolSystemError`` when bwrap never started the command (the probe did not report)."""
    if status != "started":
        detail = stderr_text.strip().splitlines()[-1] if stderr_text.strip() else "no message"
        raise ToolSystemError(f"the bubblewrap sandbox failed to start ({detail}); the command was not run",
                              code="sandbox_failed")


def returncode(code: int | None) -> int | None:
    """bwrap's exit status as a Popen return code: bwrap exits ``128 + N`` when the command died of
    signal N (it never dies of the signal itself), so that is reported as ``-N``.

    Limit: a command that exits with ``128 + N`` on its own is indistinguishable and is reported as
    killed by signal N (the shell's own convention for ``$?``).
    """
    if code is not None and 128 < code < 128 + signal.NSIG:
        try:
            return -signal.Signals(code - 128)
        except ValueError:
            return code
    return code
