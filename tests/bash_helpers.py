"""Shared helpers for the bash tool tests: a host factory and process inspection through /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed; CI installs it "
                                                        "(.ci/run), locally: apt-get install bubblewrap")

#: ``sandbox_read_paths`` that make this test run's Python usable inside the sandbox (a venv or pyenv
#: outside the system directories is not in the default view).
PYTHON_READ_PATHS = sorted({sys.prefix, sys.base_prefix})


@contextmanager
def work_dir_outside_tmp(prefix: str) -> Iterator[Path]:
    """A fresh ``work`` directory in a directory of its own under /var/tmp (the sandbox replaces
    /tmp, so a working directory there would not be the one the command sees), removed after."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    (base / "work").mkdir()
    try:
        yield base / "work"
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def bash_host(root: Path | str, *, builtins: tuple[str, ...] = ("bash",), **bash_config: Any) -> ToolHost:
    config: dict[str, Any] = {"plugins": {"bash": bash_config}} if bash_config else {}
    host = ToolHost(config=config, builtins=list(builtins), entry_points=False, working_dir=root, discover=False)
    await host.start()
    return host


def marker() -> str:
    """A unique string to put on a command line and find again in /proc."""
    return "amp-marker-" + uuid.uuid4().hex


def _tagged(text: str) -> dict[int, bytes]:
    """``{pid: stat line}`` of live (non-zombie) processes whose command line contains ``text``."""
    found: dict[int, bytes] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2:].split()[0]
        if text in cmdline and state not in (b"Z", b"X"):
            found[int(name)] = stat
    return found


def processes_with(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``text``.

    One pass over /proc, not a snapshot: while processes come and go, a process that exits after
    it was counted and one that starts after the pass went by both count. For "how many at once"
    use :func:`processes_alive_together`.
    """
    return list(_tagged(text))


def _start_time(stat: bytes) -> bytes:
    return stat[stat.rfind(b")") + 2:].split()[19]  # field 22 of proc(5), counting from field 3


def processes_alive_together(text: str) -> int:
    """How many processes with ``text`` on their command line were certainly alive at one instant.

    Two passes over /proc; a process (same pid and start time) found by both was alive from the
    moment the first pass saw it to the moment the second did, so at the instant between the passes.
    A lower bound on the true number under churn, never an overcount (unlike one pass).
    """
    first = _tagged(text)
    second = _tagged(text)
    return sum(1 for pid, stat in second.items()
               if pid in first and _start_time(first[pid]) == _start_time(stat))


def launchers_outside_sandbox(text: str) -> int:
    """How many processes with ``text`` on their command line are bwrap in this pid namespace: the
    sandbox's launcher, which runs as the host's child outside the namespace and the limits the
    command gets (found in CI: a fork bomb held to 64 processes was counted 65 with it)."""
    count = 0
    for pid in _tagged(text):
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/status", "rb") as f:
                nspid = next((line for line in f if line.startswith(b"NSpid:")), b"")
        except OSError:
            continue
        if comm == b"bwrap" and len(nspid.split()) == 2:  # one pid: not inside a nested namespace
            count += 1
    return count


def describe_processes(text: str) -> str:
    """The live processes with ``text``, for an assertion message: pid, state and command."""
    lines = []
    for pid, stat in _tagged(text).items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode("utf-8", "replace")[:120]
        except OSError:
            command = "?"
        state = stat[stat.rfind(b")") + 2:].split()[0].decode()
        lines.append(f"{pid} {state} {command}")
    return "\n".join(lines) or "none"


def group_members(pgid: int) -> list[int]:
    from amplifier_tools.termination import live_members

    return live_members(pgid)


def wait_until(predicate: Any, timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (generous: CI machines are slow and shared)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def peak_rss_kib() -> int:
    """VmHWM (peak resident set) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); False when not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def runs_hidden_command(template: str, tmp_path: Path) -> bool:
    """Whether real bash, running ``template`` with ``{M}`` a marker file's path, creates the marker:
    the hidden command of a rules attack really runs."""
    marker = tmp_path / "marker"
    subprocess.run(["bash", "-c", template.replace("{M}", str(marker))], cwd=tmp_path, capture_output=True,
                   timeout=30, check=False)
    return marker.exists()
