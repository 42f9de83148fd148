"""The one sandbox engine: a bubblewrap command line for a minimal view of the host, and a probe.

Used by the bash plugin for every command, and meant for any long-running process the host
starts for tools (an imported MCP stdio server), so there is one place that decides what a
confined process sees. Interface:

- ``View(cwd, writable=(), read_only=SYSTEM_PATHS, protected=(), network=False)``: what the
  process sees. ``read_only`` paths are bound read-only, ``writable`` read-write (after them, so a
  writable root inside a system directory stays writable); ``protected`` are the host's own
  paths (resolved; config file, ``state_dir``...), hidden wherever they would be visible, and so
  are the host's secret files in ``SENSITIVE`` (``/etc/shadow``, ssh host keys...). Every other
  path of the host is absent: no ``/home``, ``/root``, ``/run``, ``/var``, ``/mnt``, ``/srv``, no
  host ``/proc`` (a fresh one for a new PID namespace), a fresh ``/dev`` and a private ``/tmp``.
  Paths that do not exist on this host are skipped, never created on it.
- ``command(view, argv, *, bwrap)``: the full argv (``bwrap ... -- argv``) to spawn. New PID, IPC,
  UTS, cgroup (where possible) and, unless ``network``, network namespaces; every capability
  dropped; a new session (no TIOCSTI into the caller's terminal); ``--die-with-parent``. The
  namespace's first process is reported on ``info_fd``; ``wait_namespace_gone`` kills it and so
  the whole PID namespace, daemons included (``--die-with-parent`` alone was seen to fail);
  ``Namespace.of(pid).members()`` lists its processes, which the caller signals itself on a
  timeout (they are in a session of their own, out of reach of the signals to bwrap's group);
  ``SandboxProcesses(info_r)`` finds them from the info pipe, for ``termination.kill_group``.
- ``find_bwrap(exclude)``: the ``bwrap`` on PATH (outside the paths commands may write) and,
  when it cannot make a sandbox here, why not;
  ``start_find_bwrap()`` the same answer for a ``bwrap`` in a system directory, computed in a
  thread from now on (a plugin starts it when it is created, so that the probe runs while the
  host loads its other plugins).
- ``probe(bwrap)``: None when bubblewrap can set up such a sandbox on this host, else the reason.
  A success is cached per ``bwrap`` path for the process; callers probe at start, never per call.
- ``unavailable(reason, setting)``: the ``ToolSystemError`` (code ``sandbox_unavailable``) a
  caller raises when no sandbox can be had, naming both fixes.

Limits (see docs/bash.md): the kernel is shared (its attack surface is not reduced beyond
namespaces and dropped capabilities; no seccomp filter); CPU, memory and disk use are not limited
here; everything in the read-only system directories is readable except ``SENSITIVE``; writable
paths are fully writable, and a process running as root writes there as the host's root; with
``network`` the host's whole network is reachable. It must never run the command unconfined: a
missing or failing bwrap is an error, not a fallback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import glob
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from .errors import ToolSystemError
from .procfs import is_live, proc_stat
from .seccomp import filter_fd

#: Read-only by default: what common commands need (programs, libraries, configuration). Symlinks
#: among them (``/bin -> usr/bin`` on merged-usr systems) are recreated as symlinks.
SYSTEM_PATHS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")

#: The host's secret files, hidden when present in the view (globs; a directory becomes empty).
SENSITIVE: Final = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
    "/etc/ssh/ssh_host_*_key", "/etc/ssl/private", "/etc/pki/tls/private", "/etc/security/opasswd",
    "/etc/krb5.keytab", "/etc/credstore", "/etc/credstore.encrypted", "/etc/wireguard",
    "/etc/NetworkManager/system-connections", "/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets",
    "/etc/ipsec.secrets", "/etc/openvpn", "/etc/letsencrypt", "/etc/kubernetes", "/etc/rancher",
    "/etc/docker/key.json", "/etc/mysql/debian.cnf", "/etc/containers/auth.json",
)

PROBE_TIMEOUT: Final = 10.0


@attrs.frozen
class View:
    """What a sandboxed process sees; every path absolute (``writable`` and ``protected`` resolved)."""

    cwd: str
    writable: tuple[str, ...] = ()
    read_only: tuple[str, ...] = SYSTEM_PATHS
    protected: tuple[str, ...] = ()
    network: bool = False


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def visible(path: str, view: View) -> bool:
    """Whether ``path`` (absolute) is inside one of the view's bound roots."""
    # /tmp, /dev and /proc are mounted fresh first: below them only a bound path shows the host's files.
    return any(_under(path, root) for root in (*view.writable, *view.read_only))


def closed_to(path: str, uid: int, gid: int, *, enter: bool = False) -> tuple[str, os.stat_result] | None:
    """The first directory on the way to ``path`` (absolute, resolved) that the user ``uid`` with
    the group ``gid`` may not search, with its ``stat``; None when every one lets it through.
    ``enter``: ``path`` itself too (a directory the command starts in). bwrap runs as the
    configured ``user`` and looks up every path it binds: one it cannot reach ends every command
    with "Can't find source path ...: Permission denied" (found by a new-user trial: the example
    configuration's ``~/.pyenv`` read path and ``user = "nobody"`` on a root host). Commands run
    with that user's primary group only, so supplementary groups do not count. The kernel decides:
    a shell running as that user (primary group only) enters each directory in turn, so POSIX ACLs,
    ACL masks and anything else the kernel weighs count (found by attack: mode bits alone let
    through a directory whose ACL shuts the user out, and refused one whose ACL lets it in); mode
    bits only where no such shell can be started. A directory missing on the way ends the walk (a
    missing path is not bound)."""
    if uid == 0:
        return None
    parts = [part for part in path.split("/") if part]
    candidates = ["/" + "/".join(parts[:depth]) for depth in range(len(parts))]  # "/", then each ancestor
    if enter and parts:
        candidates.append(path)
    directories: list[tuple[str, os.stat_result]] = []
    for directory in candidates:
        try:
            info = os.stat(directory)
        except OSError:
            break
        if not stat.S_ISDIR(info.st_mode):
            break
        directories.append((directory, info))
    if not directories:
        return None
    script = 'for d; do cd -- "$d" 2>/dev/null || { printf "%s" "$d"; exit 0; }; done'
    try:
        probe = subprocess.run(["/bin/sh", "-c", script, "sh", *(d for d, _ in directories)], user=uid, group=gid,
                               extra_groups=[], cwd="/", env={}, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        probe = None
    if probe is not None and probe.returncode == 0:
        closed = probe.stdout.decode("utf-8", "surrogateescape")
        return next(((d, info) for d, info in directories if d == closed), None) if closed else None
    for directory, info in directories:  # no shell as that user here: the mode bits
        bit = stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH
        if not info.st_mode & bit:
            return directory, info
    return None


def _present(patterns: Iterable[str]) -> list[str]:
    """The paths matching ``patterns`` that exist now (a literal path costs one ``lstat``, not a glob)."""
    found: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            found += glob.glob(pattern)
        elif os.path.lexists(pattern):
            found.append(pattern)
    return found


def _mask(path: str, info: os.stat_result) -> list[str]:
    if stat.S_ISDIR(info.st_mode):
        return ["--tmpfs", path, "--remount-ro", path]
    return ["--ro-bind", "/dev/null", path]


def _inside_writable(path: str, view: View) -> str | None:
    """The writable root (other than ``path`` itself) that ``path`` lies inside, or None: below
    one, a sandboxed command may have renamed or replaced any component of ``path``."""
    return next((root for root in view.writable if root != path and _under(path, root)), None)


def _unchanged(path: str, what: str) -> None:
    """Raise ``sandbox_failed`` unless ``path`` still resolves to itself (no component replaced by
    a symlink): bwrap follows symlinks in what it binds, so a bind of it would show, or hide,
    what the symlink names instead — the host's ``/proc`` (found by attack: a write path below the
    working directory swapped for ``../../proc`` gave the next command the host's root)."""
    real = os.path.realpath(path)
    if real != path:
        raise ToolSystemError(f"the {what} {path} now resolves to {real} (was a component replaced by a "
                              "symlink?); the sandbox cannot bind it safely, so the command was not run",
                              code="sandbox_failed", path=path)


def _pin_chain(path: str, view: View, pinned: set[str]) -> list[str]:
    """Bind every directory between a writable root and ``path`` onto itself: inside the sandbox
    they are mount points then, which no command can rename or remove (to put a symlink where
    ``path`` was before a later command's sandbox binds it)."""
    argv: list[str] = []
    for root in (root for root in view.writable if _under(path, root)):
        parent, chain = os.path.dirname(path), []
        while parent not in pinned and _under(parent, root):
            chain.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(chain):
            argv += ["--bind", directory, directory]
            pinned.add(directory)
    return argv


def unbindable(path: str, *, writable: bool) -> str | None:
    """Why ``path`` (absolute, resolved) can never be bound into a view, or None: ``/`` (the whole
    host), ``/proc`` and ``/dev`` and what lies below them (found by attack: a read-only bind of the
    host's ``/proc`` over the sandbox's gave ``/proc/<pid>/root``, the host's whole filesystem,
    writable), and as a writable path one that holds the system directories (the host's programs)
    or lies inside a directory the start probe runs a ``bwrap`` from (``EARLY_PROBE_DIRS``: a
    command could plant one there, run unsandboxed at the next start)."""
    if path == "/":
        return "/ is the whole host"
    if _under(path, "/proc"):
        return "/proc is the host's own (its /proc/<pid>/root is the whole host); the sandbox has a fresh one"
    if _under(path, "/dev"):
        return "/dev is the host's own (its device nodes); the sandbox has a fresh one"
    if not writable:
        return None
    held = next((system for system in SYSTEM_PATHS if _under(system, path)), None)
    if held is not None:
        return f"it holds {held}, the host's programs (the sandbox's bwrap among them)"
    inside = next((directory for directory in EARLY_PROBE_DIRS if _under(path, directory)), None)
    if inside is not None:
        return f"it lies inside {inside}, where the sandbox's bwrap is looked for before any path is known"
    return None


def view_problem(view: View) -> tuple[str, str] | None:
    """The first path of ``view`` that cannot be bound safely, and why (``unbindable``; a read-only
    path inside a writable root: bound by name, a command could have swapped a component of it for a
    symlink in the moment before bwrap binds it — found by attack, racing a second call, the
    host's ``/proc`` — so such a path cannot be made read-only); None when every path can."""
    for path in view.writable:
        reason = unbindable(path, writable=True)
        if reason is not None:
            return path, reason
    for path in view.read_only:
        reason = unbindable(path, writable=False)
        if reason is not None:
            return path, reason
        root = _inside_writable(path, view)
        if root is not None:
            return path, (f"it lies inside {root}, which commands may write: a command could swap it before the "
                          "sandbox binds it, so it cannot be made read-only; name a directory outside the paths "
                          "tools may write (a virtual environment elsewhere, say)")
    return None


def mask_argv(view: View) -> list[str]:
    """The bwrap arguments that hide each protected path and each ``SENSITIVE`` file the view shows.

    Raises ``ToolSystemError`` (``sandbox_failed``) when a protected path no longer resolves to
    itself (a component was replaced by a symlink): masking the symlink's target instead would
    leave the protected path reachable. The directories between a writable root and a masked path
    are bound onto themselves, so inside the sandbox they are mount points that cannot be renamed
    or removed (which would let a command put a new file where the masked one was).
    """
    argv: list[str] = []
    masked: list[str] = []
    pinned = {path for path in view.writable if _inside_writable(path, view) is None}  # the roots bound
    sensitive = {os.path.realpath(p) for p in _present(SENSITIVE)}
    for path in sorted(set(view.protected) | sensitive):  # parents before what lies below them
        if any(_under(path, done) for done in masked) or not visible(path, view):
            continue  # already hidden
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue  # never make bwrap create a mount point on the host
        _unchanged(path, "protected path")
        argv += _pin_chain(path, view, pinned)
        argv += _mask(path, info)
        masked.append(path)
    return argv


def _read_only_argv(view: View) -> list[str]:
    """The read-only binds, made before the writable ones (``view_problem`` refuses a read-only path
    inside a writable root)."""
    argv: list[str] = []
    for path in sorted(set(view.read_only), key=lambda p: (p.count("/"), p)):  # parents first
        if not os.path.lexists(path):
            continue  # skipped, never created on the host
        if os.path.islink(path) and os.path.dirname(path) == "/":
            argv += ["--symlink", os.readlink(path), path]  # /bin -> usr/bin stays a symlink
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    return argv


def command(view: View, argv: Sequence[str], *, bwrap: str = "bwrap", info_fd: int | None = None,
            seccomp_fd: int | None = None, status_fd: int | None = None) -> list[str]:
    """``bwrap`` with the view's mounts and namespaces, then ``--`` and ``argv`` (see the module docstring).

    With ``info_fd``, bwrap writes ``{"child-pid": N}`` there: N is the sandbox's first process (PID 1
    of its namespace) as the host sees it; see ``wait_namespace_gone``. With ``seccomp_fd`` (a
    ``seccomp.filter_fd()``), the command runs under ``seccomp.FILTER``: no kernel keyrings. With
    ``status_fd`` (only for a ``bwrap`` that ``reports_exit``), bwrap writes JSON lines there, the
    last ``{"exit-code": N}`` once the command has run (``exit_reported``).
    ``ToolSystemError`` (``sandbox_failed``) for a view with a path it cannot bind safely
    (``view_problem``; callers refuse such settings at start)."""
    problem = view_problem(view)
    if problem is not None:
        raise ToolSystemError(f"the sandbox cannot bind {problem[0]}: {problem[1]}; nothing was run",
                              code="sandbox_failed", path=problem[0])
    out = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
           "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if info_fd is not None:
        out += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    if status_fd is not None:
        out += ["--json-status-fd", str(status_fd)]
    if not view.network:
        out.append("--unshare-net")
    out += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]  # first: a path bound below them shows
    out += _proc_argv()
    out += _read_only_argv(view)
    for path in sorted(set(view.writable), key=lambda p: (p.count("/"), p)):
        if _inside_writable(path, view) is None and os.path.isdir(path):
            out += ["--bind", path, path]
    out += mask_argv(view)  # after the binds: mounted on top of them
    out += ["--remount-ro", "/", "--chdir", view.cwd, "--", *argv]
    return out


#: Kernel interfaces under the fresh ``/proc`` that act on the whole machine, made read-only (the
#: list container runtimes use). uid 0 writes sysctls without any capability: a writable
#: ``/proc/sys/kernel/core_pattern`` lets a sandboxed root run a program as root on the host.
PROC_READ_ONLY: Final = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs")
#: Kernel state hidden under the fresh ``/proc`` (files get ``/dev/null``, directories an empty tmpfs).
PROC_MASKED_FILES: Final = ("/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                            "/proc/sched_debug", "/proc/kallsyms")
PROC_MASKED_DIRS: Final = ("/proc/acpi", "/proc/scsi", "/proc/asound")


def _proc_argv() -> list[str]:
    """Read-only binds and masks over the sandbox's ``/proc``; what this kernel's ``/proc`` lacks
    is skipped (the fresh ``/proc`` has the same entries as the host's)."""
    out: list[str] = []
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    for path in PROC_MASKED_FILES:
        if os.path.exists(path):
            out += ["--ro-bind", "/dev/null", path]
    for path in PROC_MASKED_DIRS:
        if os.path.isdir(path):
            out += ["--tmpfs", path, "--remount-ro", path]
    return out


def writable_by_commands(path: str, writable: Iterable[str], *, resolve: bool = True) -> str | None:
    """The root among ``writable`` (absolute) that ``path`` lies inside, or None; both resolved
    first unless ``resolve`` is False (per call: the view's paths and the bwrap in use are)."""
    real = os.path.realpath(path) if resolve else path
    return next((root for root in writable if _under(real, os.path.realpath(root) if resolve else root)), None)


async def find_bwrap(exclude: Sequence[str] = ()) -> tuple[str | None, str | None]:
    """(the ``bwrap`` on PATH, resolved, or None; why no sandbox can be had here or None); probes in
    a thread.

    A candidate is passed over when its PATH directory or the file it resolves to lies inside
    ``exclude`` — the paths sandboxed commands may write (found by attack: a command planted its
    own ``bwrap``, one that runs the command as it is, in an activated in-project ``.venv/bin``, and
    the next host ran every command unconfined while reporting it sandboxed; then a symlink there
    to ``/usr/bin/bwrap``, swapped after the check). The resolved path is what runs, so a symlink
    changed later changes nothing. An empty or relative PATH entry is taken from this process's
    working directory, as ``shutil.which`` would."""
    bwrap = _lookup(exclude)
    if bwrap is None:
        where = " outside the paths sandboxed commands may write" if exclude else ""
        return None, f"'bwrap' was not found on PATH{where}"
    return bwrap, await asyncio.to_thread(probe, bwrap)


def _lookup(exclude: Sequence[str]) -> str | None:
    """The first ``bwrap`` on PATH, resolved, neither whose directory nor whose file lies inside
    ``exclude`` (``find_bwrap``)."""
    excluded = [os.path.realpath(root) for root in exclude]
    for entry in os.environ.get("PATH", os.defpath).split(os.pathsep):
        directory = os.path.abspath(entry or ".")
        candidate = shutil.which("bwrap", path=directory)
        if candidate is None:
            continue
        real = os.path.realpath(candidate)
        if all(writable_by_commands(found, excluded, resolve=False) is None
               for found in (os.path.realpath(directory), real)):
            return real
    return None


#: Where a ``bwrap`` is probed before the host knows which paths its commands may write
#: (``start_find_bwrap``): the package manager's directories, which no sandboxed command writes
#: (``unbindable`` refuses a writable path that holds them).
EARLY_PROBE_DIRS: Final = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def start_find_bwrap() -> concurrent.futures.Future[tuple[str | None, str | None]] | None:
    """``find_bwrap()``'s answer, computed from now on in a daemon thread (which a process that
    exits before it finishes does not wait for) — only for a ``bwrap`` that resolves into one of
    ``EARLY_PROBE_DIRS``; None for any other (it is looked for, and run, only once the paths
    commands may write are known: ``find_bwrap(exclude)``)."""
    found = shutil.which("bwrap")
    bwrap = os.path.realpath(found) if found is not None else None
    if bwrap is None or os.path.dirname(bwrap) not in EARLY_PROBE_DIRS:
        return None
    future: concurrent.futures.Future[tuple[str | None, str | None]] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result((bwrap, probe(bwrap)))
        except BaseException as exc:  # handed to whoever waits for the answer
            future.set_exception(exc)

    threading.Thread(target=run, name="amplifier-tools-sandbox-probe", daemon=True).start()
    return future


_working: set[str] = set()
#: The working ``bwrap``s that report the command's exit on ``--json-status-fd`` (``reports_exit``).
_reporting: set[str] = set()
_probe_lock = threading.Lock()


def reports_exit(bwrap: str) -> bool:
    """Whether ``bwrap``, probed working (``probe``), takes ``--json-status-fd`` (bubblewrap 0.3.2
    and later): it then writes ``{"exit-code": N}`` there once the command has run, and writes none
    when its own setup, or the exec of the command, failed. That tells a setup failure (exit code 1,
    like any command's) from the command's own exit without a shell started first in the sandbox to
    say so (the bash tool's start probe, kept for older bubblewraps: ≈ 0.7 ms a call here)."""
    return bwrap in _reporting


def _status_field(status: str, key: str) -> int | None:
    """The first integer ``key`` among the JSON lines a ``bwrap`` wrote to its ``--json-status-fd``."""
    for line in status.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def exit_reported(status: str) -> int | None:
    """The command's exit code from what a ``bwrap`` wrote to its ``--json-status-fd`` (JSON lines),
    or None if it wrote none (its setup or the command's exec failed, or it was killed)."""
    return _status_field(status, "exit-code")


def child_reported(status: str) -> bool:
    """Whether a ``bwrap`` wrote its sandbox's first process (``{"child-pid": N}``) to its
    ``--json-status-fd``: it does just before it lets that process set the sandbox up and run the
    command, so without it the command cannot have run."""
    return _status_field(status, "child-pid") is not None


def probe(bwrap: str) -> str | None:
    """None when ``bwrap`` can set up a sandbox here, else why not.

    A success is cached per path for the process; a failure is not (the next caller, e.g. the next
    host's mount, probes again: a probe that timed out on a loaded machine is not final). Blocking
    (up to ``PROBE_TIMEOUT`` seconds, usually a few ms): call it from a thread in async code.
    """
    with _probe_lock:
        if bwrap in _working:
            return None
        reason, reporting = _run_probe(bwrap, status=True)
        if reason is not None and reporting is None:  # a bubblewrap before 0.3.2: no --json-status-fd
            reason, reporting = _run_probe(bwrap, status=False)
        if reason is None:
            _working.add(bwrap)
            if reporting:
                _reporting.add(bwrap)
        return reason


def _run_probe(bwrap: str, *, status: bool) -> tuple[str | None, bool | None]:
    """The probe runs what every command runs: the same namespaces and the seccomp filter. With
    ``status``, also ``--json-status-fd`` (on the probe's stdout). ``(why it failed or None, whether
    it reported the exit)``; ``None`` for the second when bwrap refused ``--json-status-fd`` itself."""
    seccomp_fd = filter_fd()
    argv = command(View(cwd="/"), ["/bin/sh", "-c", "exit 0"], bwrap=bwrap, seccomp_fd=seccomp_fd,
                   status_fd=1 if status else None)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT,
                              check=False, pass_fds=(seccomp_fd,))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not be run ({exc})", False
    finally:
        os.close(seccomp_fd)
    if done.returncode != 0:
        text = done.stderr.decode("utf-8", "replace")
        lines = text.strip().splitlines()
        refused = status and "--json-status-fd" in text
        return (f"{bwrap} failed to set up a sandbox ({lines[-1] if lines else f'exit code {done.returncode}'})",
                None if refused else False)
    return None, status and exit_reported(done.stdout.decode("utf-8", "replace")) == 0


def unavailable(reason: str, setting: str) -> ToolSystemError:
    """The error for a process that must be sandboxed where no sandbox works; ``setting`` is the
    config section that decides it (``[plugins.bash]``)."""
    return ToolSystemError(
        f"no sandbox is available: {reason}. Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; "
        "it needs unprivileged user namespaces or root), or set `sandbox = \"off\"` in "
        f"{setting} to run unconfined. Nothing was run.", code="sandbox_unavailable", reason=reason)


def child_pid(info: str) -> int | None:
    """The namespace's first process from what bwrap wrote to its ``--info-fd`` (None if nothing)."""
    try:
        data = json.loads(info) if info.strip() else None
    except ValueError:
        return None
    pid = data.get("child-pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) and pid > 0 else None


async def wait_namespace_gone(pid: int | None, timeout: float) -> bool:
    """End the sandbox whose first process is ``pid`` and wait until no process of it is left;
    True if it is gone within ``timeout``.

    When a PID namespace's first process exits, the kernel kills every other process in the
    namespace and completes that exit only after they are all gone, so the first process turning
    into a zombie (or vanishing) means the whole sandbox is gone. Killing bwrap alone is not
    enough: its child is meant to die with it (``--die-with-parent``), but that was seen to fail
    now and then, leaving the namespace running under init. So the first process is SIGKILLed
    here too — through a pidfd, and only while it is still a ``bwrap`` (a pid reused meanwhile by
    another program is left alone). Polls /proc (the process is not our child).

    Limit: the pid comes from bwrap's info fd, read after bwrap has exited. Had the first process
    died and another bwrap been given its pid in that moment (the pid space wrapping around within
    microseconds), that sandbox would be killed.
    """
    if pid is None:
        return True
    _kill_first_process(pid)
    deadline = time.monotonic() + timeout
    while is_live(pid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.002)
    return True


@attrs.frozen
class Namespace:
    """One sandbox's PID namespace, known by its first process (pid and start time) and its
    ``ns/pid`` link, so that a pid reused meanwhile (by another call's bwrap) is never taken for it.

    The host signals its processes itself (``members``): they run in a session of their own
    (``--new-session``), out of reach of the signals it sends to bwrap's process group, and killing
    bwrap takes them all down with SIGKILL at once (``--die-with-parent``), or not at all. Found by
    attack: a command that timed out never saw the SIGTERM and ``kill_grace`` the docs promise, and
    where ``--die-with-parent`` failed (a deadline passing while bwrap was still setting up) it went
    on running, and writing, for seconds after it was reported killed.
    """

    pid: int
    started: int
    link: str

    @classmethod
    def of(cls, pid: int | None) -> Namespace | None:
        """The namespace whose first process is ``pid`` (from ``child_pid``); None when that process
        is gone, is no ``bwrap`` or shares the host's own namespace."""
        first = proc_stat(pid) if pid is not None else None
        if pid is None or first is None or not first.live or first.comm != "bwrap":
            return None
        try:
            link = os.readlink(f"/proc/{pid}/ns/pid")
            if link == os.readlink("/proc/self/ns/pid"):  # never the host's own processes
                return None
        except OSError:
            return None
        return cls(pid, first.started, link)

    def members(self) -> list[int]:
        """The namespace's live processes, its first included; ``[]`` once the first is gone (the
        kernel then kills the rest). A /proc scan; processes this user may not inspect are skipped."""
        first = proc_stat(self.pid)
        if first is None or not first.live or first.started != self.started:
            return []
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.readlink(f"/proc/{name}/ns/pid") != self.link:
                        continue
                except OSError:
                    continue
                if is_live(name):
                    found.append(int(name))
        # The first process ended during the scan: the namespace may be gone and its ``ns/pid`` link,
        # a number the kernel reuses, may name another sandbox's now (found in review).
        again = proc_stat(self.pid)
        if again is None or not again.live or again.started != self.started:
            return []
        return found


def read_pipe(fd: int) -> str:
    """What is in the pipe ``fd`` now (non-blocking; its writers may still exist): bwrap's status or
    info pipe."""
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


class SandboxProcesses:
    """One sandbox's processes, found anew at each call: the ``others`` that
    ``termination.kill_group`` ends with bwrap's process group (they are in a session of their own).

    Built on the read end ``info_r`` of the pipe given to ``command(..., info_fd=)``, which it reads
    (never closes: the caller does, after its last use). Until bwrap has reported its namespace's
    first process, and once that process is gone, it finds none. Used by the bash tool and by the
    MCP stdio transport: one way to find what is left of a sandbox.
    """

    __slots__ = ("_info", "_info_r", "_namespace")

    def __init__(self, info_r: int) -> None:
        self._info_r = info_r
        self._info: list[str] = []
        self._namespace: Namespace | None = None

    def first(self) -> int | None:
        """The namespace's first process as bwrap reported it (``child_pid``), or None (not yet)."""
        found = child_pid("".join(self._info))
        if found is None:
            self._info.append(read_pipe(self._info_r))
            found = child_pid("".join(self._info))
        return found

    def __call__(self) -> list[int]:
        """The namespace's live processes (``Namespace.members``), its first included."""
        if self._namespace is None:
            self._namespace = Namespace.of(self.first())
            if self._namespace is None:
                return []
        return self._namespace.members()


def _kill_first_process(pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # gone already
        return
    try:
        first = proc_stat(pid)  # the pidfd pins the process from here on
        if first is not None and first.comm == "bwrap" and first.live:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)
