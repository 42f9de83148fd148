"""The bubblewrap sandbox is the boundary: nothing outside the working directory changes, no network.

Skipped only when ``bwrap`` is not installed (CI installs it in .ci/run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, marker, needs_bwrap, processes_with
from test_bash_rules import corpus

from amplifier_tools import ToolContext
from amplifier_tools.sandbox import View


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """A working directory and a victim directory beside it, outside /tmp (which the sandbox replaces)."""
    base = Path(tempfile.mkdtemp(prefix="amp-sandbox-", dir="/var/tmp"))
    work, victim = base / "work", base / "victim"
    work.mkdir()
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    yield work, victim
    shutil.rmtree(base, ignore_errors=True)


@needs_bwrap
async def test_destructive_commands_outside_the_working_directory_change_nothing(dirs: tuple[Path, Path]) -> None:
    work, victim = dirs
    host = await bash_host(work, sandbox="bubblewrap", sandbox_read_paths=[str(victim)])
    try:
        seen = await host.call("bash", {"command": f"cat {victim}/precious.txt"})
        assert seen.success and seen.output["stdout"] == "keep me"  # visible, so the corpus is a real attempt
        for command, _ in corpus(str(victim)):
            result = await host.call("bash", {"command": command, "timeout": 60})
            assert result.output is None or result.output["sandboxed"] is True
            assert (victim / "precious.txt").read_text() == "keep me", command
        for command in (f"echo x > {victim}/new", f"mv {victim}/precious.txt {work}/", f"chmod 000 {victim}",
                        "mount -o remount,rw / && touch /etc/amp-sandbox-test", "touch /usr/amp-sandbox-test"):
            await host.call("bash", {"command": command})
        assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
        assert (victim.stat().st_mode & 0o777) != 0 and not Path("/etc/amp-sandbox-test").exists()
    finally:
        await host.close()


@needs_bwrap
async def test_the_working_directory_is_writable_and_tmp_is_private(dirs: tuple[Path, Path]) -> None:
    work, _ = dirs
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        result = await host.call("bash", {"command": "echo data > out.txt && echo t > /tmp/amp-private && ls /tmp"})
        assert result.success, result.error
        assert (work / "out.txt").read_text() == "data\n"
        assert result.output["stdout"] == "amp-private\n" and not Path("/tmp/amp-private").exists()
    finally:
        await host.close()


@needs_bwrap
async def test_network_access_fails_in_the_sandbox(dirs: tuple[Path, Path]) -> None:
    work, _ = dirs
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        probe = "exec 3<>/dev/tcp/1.1.1.1/53 && echo connected"
        result = await host.call("bash", {"command": probe, "timeout": 60})
        assert not result.success and "connected" not in result.output["stdout"]
        assert "unreachable" in result.output["stderr"].lower()
        local = await host.call("bash", {"command": "tail -n +3 /proc/net/dev | wc -l"})
        assert local.output["stdout"].strip() == "1"  # only the loopback device exists
    finally:
        await host.close()


@needs_bwrap
async def test_sandbox_hides_the_hosts_processes_and_environment(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    work, _ = dirs
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv("AMP_CANARY_SECRET", canary)
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        result = await host.call("bash", {"command": "cat /proc/[0-9]*/environ 2>/dev/null; env; ls /proc"})
        assert result.success and canary not in result.output["stdout"]
        assert str(os.getpid()) not in result.output["stdout"].split()
    finally:
        await host.close()


@needs_bwrap
async def test_no_orphans_in_the_sandbox_even_after_setsid(dirs: tuple[Path, Path]) -> None:
    work, _ = dirs
    tag = marker()
    host = await bash_host(work, sandbox="bubblewrap", kill_grace=1)
    try:
        command = f"setsid bash -c 'sleep 1000 # {tag}' & (exec -a {tag} sleep 1000) & sleep 1000"
        result = await host.call("bash", {"command": command, "timeout": 3})
        assert result.output["timed_out"] is True
        assert processes_with(tag) == []
        exited = await host.call("bash", {"command": f"setsid bash -c 'sleep 1000 # {tag}' & echo bye"})
        assert exited.success and processes_with(tag) == []
    finally:
        await host.close()


async def test_missing_bwrap_is_a_system_error_and_nothing_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else f"/usr/bin/{name}")
    host = await bash_host(tmp_path, sandbox="bubblewrap")
    try:
        result = await host.call("bash", {"command": "touch ran"})
        assert result.error["type"] == "SystemError" and result.error["code"] == "sandbox_unavailable"
        assert "bwrap" in result.error["message"] and 'sandbox = "off"' in result.error["message"]
        assert not (tmp_path / "ran").exists()
    finally:
        await host.close()


@pytest.fixture(params=["json-status", "start-probe"])
def status_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a setup failure is told from the command's exit: bwrap's own ``--json-status-fd``
    (bubblewrap 0.3.2+, this machine's), and the start probe kept for older bubblewraps."""
    from amplifier_tools import sandbox as engine

    if request.param == "start-probe":
        monkeypatch.setattr(engine, "reports_exit", lambda bwrap: False)
    return str(request.param)


@needs_bwrap
async def test_bwrap_that_fails_to_start_is_a_system_error_and_nothing_runs(
        dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, status_kind: str) -> None:
    from amplifier_tools.builtins.bash import sandbox

    work, _ = dirs
    real = sandbox.bwrap_argv

    def broken(*args: object, **kwargs: object) -> list[str]:
        argv = real(*args, **kwargs)  # type: ignore[arg-type]
        return [argv[0], "--bind", "/no/such/source", "/mnt", *argv[1:]]

    monkeypatch.setattr(sandbox, "bwrap_argv", broken)
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        result = await host.call("bash", {"command": "touch ran"}, context=ToolContext())
        assert result.error["type"] == "SystemError" and result.error["code"] == "sandbox_failed"
        assert "/no/such/source" in result.error["message"]
        assert not (work / "ran").exists()
    finally:
        await host.close()


@needs_bwrap
async def test_the_start_probe_runs_in_bash_when_no_single_digit_descriptor_is_free(
        dirs: tuple[Path, Path], status_kind: str) -> None:
    from amplifier_tools.builtins.bash import sandbox

    work, _ = dirs
    view = View(cwd=str(work), writable=(str(work),))
    assert "/bin/sh" in sandbox.bwrap_argv("bwrap", view, status_fd=5, bash="/bin/bash")
    assert "/bin/sh" not in sandbox.bwrap_argv("bwrap", view, status_fd=12, bash="/bin/bash")
    held = []
    while True:  # occupy every free descriptor from 3 to 9: the status pipe must keep a two-digit one
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd > 9:
            os.close(fd)
            break
        held.append(fd)
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        result = await host.call("bash", {"command": "echo inside"}, context=ToolContext())
        assert result.success and result.output["stdout"] == "inside\n", result
    finally:
        await host.close()
        for fd in held:
            os.close(fd)


PROBE_SCRIPT = """
import asyncio, sys
from amplifier_tools import ToolHost
from amplifier_tools.builtins.bash import sandbox

shells = []
real = sandbox.bwrap_argv
def spy(*args, **kwargs):
    argv = real(*args, **kwargs)
    after = argv[argv.index("--") + 1:]
    shells.append(after[0] if after else "-")
    return argv
sandbox.bwrap_argv = spy
if sys.argv[2] == "start-probe":
    from amplifier_tools import sandbox as engine
    engine.reports_exit = lambda bwrap: False

async def main():
    config = {"plugins": {"bash": {"sandbox": "bubblewrap"}}}
    async with ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=sys.argv[1],
                        discover=False) as host:
        result = await host.call("bash", {"command": "echo inside"})
        print(shells[0], result.success, result.output and result.output["stdout"].strip())
asyncio.run(main())
"""


@needs_bwrap
@pytest.mark.parametrize("kind", ["json-status", "start-probe"])
def test_the_start_probe_runs_in_sh_in_a_fresh_process_and_none_runs_with_json_status(
        dirs: tuple[Path, Path], kind: str) -> None:
    """With a bubblewrap that reports the exit (0.3.2+, this machine's), nothing runs before the
    command (it follows ``--``: one exec fewer a call); an older one's start probe runs in sh."""
    import subprocess
    import sys

    work, _ = dirs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, str(work), kind], capture_output=True, text=True,
                         env=env, timeout=120)
    first = "-" if kind == "json-status" else "/bin/sh"
    assert out.stdout.split() == [first, "True", "inside"], out.stdout + out.stderr


@needs_bwrap
async def test_a_bwrap_killed_while_its_command_runs_reports_the_signal_not_a_failed_start(
        dirs: tuple[Path, Path], status_kind: str) -> None:
    """bwrap itself killed (the OOM killer, an operator) writes no exit code: the command did run,
    and the call says it was killed, never "the sandbox failed to start ... was not run"."""
    import asyncio
    import signal

    work, _ = dirs
    tag = marker()
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        call = asyncio.ensure_future(host.call("bash", {"command": f"touch ran; sleep 30 # {tag}"}))
        for _ in range(200):
            bwraps = [pid for pid in processes_with(tag) if _is_bwrap(pid)]
            if bwraps and (work / "ran").exists():
                break
            await asyncio.sleep(0.05)
        assert bwraps, "the sandbox never started"
        os.kill(min(bwraps), signal.SIGKILL)  # the outer bwrap: the first started
        result = await asyncio.wait_for(call, 30)
        assert result.error is not None and result.error["code"] == "nonzero_exit", result.error
        assert result.output["signal"] == "SIGKILL" and result.output["exit_code"] is None
    finally:
        await host.close()


def _is_bwrap(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0]) == b"bwrap"
    except OSError:
        return False


@needs_bwrap
def test_a_bubblewrap_without_json_status_is_probed_working_and_gets_the_start_probe(tmp_path: Path) -> None:
    """A bubblewrap before 0.3.2 refuses ``--json-status-fd`` ("Unknown option"): the probe tries
    again without it, the sandbox works, and its commands get the start probe."""
    from amplifier_tools import sandbox as engine
    from amplifier_tools.builtins.bash import sandbox

    real = shutil.which("bwrap")
    assert real is not None
    old = tmp_path / "bwrap-0.4"
    old.write_text("#!/bin/sh\n"
                   'for a in "$@"; do [ "$a" = --json-status-fd ] && { echo "bwrap: Unknown option $a" >&2; exit 1; }; '
                   f"done\nexec {real} \"$@\"\n")
    old.chmod(0o755)
    assert engine.probe(str(old)) is None
    assert not engine.reports_exit(str(old))
    assert engine.probe(real) is None and engine.reports_exit(real)  # this machine's bubblewrap is 0.8
    view = View(cwd=str(tmp_path), writable=(str(tmp_path),))
    assert "--json-status-fd" not in sandbox.bwrap_argv(str(old), view, status_fd=5, bash="/bin/bash")
    assert "--json-status-fd" in sandbox.bwrap_argv(real, view, status_fd=5, bash="/bin/bash", reports_exit=True)


def test_the_exit_code_is_read_from_bwraps_json_status_lines() -> None:
    from amplifier_tools import sandbox as engine

    child = '{ "child-pid": 12, "pid-namespace": 4026532184 }'
    assert engine.exit_reported(f'{child}\n{{ "exit-code": 3 }}\n') == 3
    assert engine.exit_reported(f"{child}\n") is None  # the setup or the exec failed
    assert engine.exit_reported("") is None
    assert engine.exit_reported('{ "exit-code": true }\nnot json\n[1]\n') is None
