"""The shared sandbox engine used for a long-running stdio process that is not bash (as for an MCP server)."""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import BWRAP, needs_bwrap, processes_with, wait_until

from amplifier_tools import sandbox as engine

pytestmark = needs_bwrap


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="amp-engine-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_stdio_process_talks_through_the_sandbox_and_its_whole_tree_dies_with_it(work: Path) -> None:
    assert BWRAP is not None and engine.probe(BWRAP) is None
    seconds = f"1000.{random.randrange(10**8):08d}"
    view = engine.View(cwd=str(work), writable=(str(work),))
    argv = engine.command(view, ["sh", "-c", f"setsid sleep {seconds} & exec cat"], bwrap=BWRAP)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b'{"jsonrpc": "2.0"}\n')
        proc.stdin.flush()
        assert proc.stdout.readline() == b'{"jsonrpc": "2.0"}\n'
        assert wait_until(lambda: processes_with(f"sleep {seconds}") != [], timeout=10)
    finally:
        proc.kill()  # only bwrap itself: the PID namespace takes the daemon with it
        proc.wait()
    assert wait_until(lambda: processes_with(f"sleep {seconds}") == [], timeout=10)


def test_the_command_line_names_the_view(work: Path) -> None:
    view = engine.View(cwd=str(work), writable=(str(work),), read_only=("/usr", "/no/such/path"), network=True)
    argv = engine.command(view, ["true"], bwrap="bwrap")
    assert "--unshare-net" not in argv and "--die-with-parent" in argv and argv[-2:] == ["--", "true"]
    assert "/no/such/path" not in argv  # skipped, never created on the host
    assert argv[argv.index("--bind") + 1] == str(work) and "--cap-drop" in argv


def test_unavailable_names_both_fixes() -> None:
    error = engine.unavailable("'bwrap' was not found on PATH", "[mcp.servers.x]")
    assert error.code == "sandbox_unavailable" and "bubblewrap" in error.message
    assert 'sandbox = "off"' in error.message and "[mcp.servers.x]" in error.message


async def test_wait_namespace_gone_returns_only_when_no_process_of_the_sandbox_is_left(work: Path) -> None:
    """Killing bwrap does not wait for its namespace (and ``--die-with-parent`` was seen to leave the
    namespace running under init now and then); ``wait_namespace_gone`` ends it and waits (the bash
    tool's promise that nothing outlives a call rests on it). Failed about one run in four before."""
    import os

    assert BWRAP is not None
    seconds = [f"1000.{random.randrange(10**8):08d}" for _ in range(3)]
    read_fd, write_fd = os.pipe()
    view = engine.View(cwd=str(work), writable=(str(work),))
    script = " & ".join(f"sleep {s}" for s in seconds) + " & wait"
    argv = engine.command(view, ["sh", "-c", script], bwrap=BWRAP, info_fd=write_fd)
    proc = subprocess.Popen(argv, pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    try:
        assert wait_until(lambda: all(processes_with(f"sleep {s}") for s in seconds), timeout=10)
        first = engine.child_pid(os.read(read_fd, 65536).decode())
        os.close(read_fd)
        assert first is not None and first != proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert await engine.wait_namespace_gone(first, 5.0)
    assert all(processes_with(f"sleep {s}") == [] for s in seconds)  # at once: no wait_until here


def test_child_pid_reads_bwraps_info() -> None:
    assert engine.child_pid('{\n    "child-pid": 4242\n}\n') == 4242
    assert engine.child_pid("") is None and engine.child_pid("not json") is None


def test_any_sandboxed_process_finds_proc_sys_read_only(work: Path) -> None:
    """The engine, not the bash plugin, makes the kernel's global knobs read-only: an MCP server
    in the sandbox gets the same view (see test_root_in_the_sandbox_cannot_change_the_kernel...)."""
    assert BWRAP is not None
    view = engine.View(cwd=str(work), writable=(str(work),))
    script = "v=$(cat /proc/sys/kernel/core_pattern); (echo \"$v\" > /proc/sys/kernel/core_pattern) 2>&1 || true"
    done = subprocess.run(engine.command(view, ["sh", "-c", script], bwrap=BWRAP), capture_output=True, text=True,
                          timeout=30)
    assert "Read-only file system" in done.stdout + done.stderr


def _run_bpf(program: bytes, arch: int, nr: int) -> int:
    """What a classic-BPF seccomp program returns for a system call ``nr`` on ``arch`` (the subset
    of instructions ``seccomp.build_filter`` emits)."""
    import struct

    data = struct.pack("=iI", nr, arch)
    pc = 0
    accumulator = 0
    while True:
        code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
        if code == 0x20:
            accumulator = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:
            pc += 1 + (jt if accumulator == k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_the_seccomp_filter_refuses_exactly_the_keyring_calls_on_every_listed_architecture() -> None:
    from amplifier_tools.seccomp import FILTER, KEYRING_SYSCALLS

    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    for arch, numbers in KEYRING_SYSCALLS.items():
        for nr in numbers:
            assert _run_bpf(FILTER, arch, nr) == eperm, (hex(arch), nr)
        for nr in (0, 1, 59, 231, 247, 251, 285, 289, 216, 220, 308, 312, 0x40000000):
            if nr not in numbers:
                assert _run_bpf(FILTER, arch, nr) == allow, (hex(arch), nr)
    assert _run_bpf(FILTER, 0xDEADBEEF, 250) == allow  # an architecture it does not know: allowed
