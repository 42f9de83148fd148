"""The bash-specific part of the sandbox: how a setup failure is told from the command's exit.

The view, the namespaces and the masks come from the one engine, ``amplifier_tools.sandbox``;
this module only adds a status pipe so that a setup failure of bwrap (exit code 1, like any
command) can be told apart from the command's own exit. A ``bwrap`` that ``reports_exit``
(bubblewrap 0.3.2+) writes the command's exit code to it (``--json-status-fd``) and nothing when
its setup failed. An older one runs a start probe first: inside the sandbox a one-line ``sh``
writes ``started`` to the status descriptor, closes it and execs the command (one more exec a
call, ≈ 0.7 ms here).

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
               seccomp_fd: int | None = None, reports_exit: bool = False) -> list[str]:
    """The ``bwrap`` prefix for a command (appended after it) that runs in ``view`` and reports on
    ``status_fd`` (and, with ``info_fd``, bwrap its namespace's first process there; with
    ``seccomp_fd``, under the engine's seccomp filter): bwrap itself the command's exit when
    ``reports_exit`` (``engine.reports_exit``), else a start probe the command's start."""
    if reports_exit:
        return engine.command(view, [], bwrap=bwrap, info_fd=info_fd, seccomp_fd=seccomp_fd, status_fd=status_fd)
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


def check_started(status: str, stderr_text: str, *, reports_exit: bool = False, returncode: int | None = None) -> None:
    """``ToolSystemError`` when bwrap never started the command: with ``reports_exit``, it wrote no
    exit code to its status pipe and was not itself killed by a signal once it had released the
    sandbox's first process (``returncode`` < 0 after a ``child-pid`` line: the command may have
    run, and is reported killed; before it, nothing ran); else the start probe did not report."""
    if reports_exit:
        killed = returncode is not None and returncode < 0 and engine.child_reported(status)
        started = engine.exit_reported(status) is not None or killed
    else:
        started = status == "started"
    if not started:
        detail = stderr_text.strip().splitlines()[-1] if stderr_text.strip() else \
            f"bwrap was killed by signal {-returncode}" if returncode is not None and returncode < 0 else "no message"
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
