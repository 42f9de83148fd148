"""Attack on 6ef02ec (bwrap's ``--json-status-fd`` instead of the start probe): how a call is
reported when the command never ran.

1. docs/bash.md (new in 6ef02ec): "A command that could not be executed inside the sandbox (bash
   or prlimit missing from its view) counts as a failed setup too". It did not when a limit is set
   (bwrap execs ``prlimit``, whose exec of bash fails: exit 127) nor with an older bubblewrap's start
   probe (its ``sh`` execs bash and fails: exit 127): "command exited with code 127", though the
   command never ran.
2. bwrap killed (OOM killer, operator) before it even released the sandbox's first process (no
   ``{"child-pid": N}`` on its status pipe yet) was reported as the command killed by SIGKILL; the
   start probe said, rightly, that the sandbox failed and nothing ran.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import bash_host, marker, needs_bwrap, processes_with

from amplifier_tools import sandbox as engine
from amplifier_tools.builtins.bash import sandbox


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory outside /tmp (the sandbox replaces it) holding ``work`` and ``bin``."""
    path = Path(tempfile.mkdtemp(prefix="amp-bwrap38-", dir="/var/tmp"))
    (path / "work").mkdir()
    (path / "bin").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["json-status", "start-probe"])
def status_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "start-probe":
        monkeypatch.setattr(engine, "reports_exit", lambda bwrap: False)
    return str(request.param)


@needs_bwrap
@pytest.mark.parametrize("limits", [{}, {"max_cpu_seconds": 100}], ids=["no-limits", "prlimit"])
async def test_bash_missing_from_the_view_is_a_failed_setup_not_exit_127(
        base: Path, monkeypatch: pytest.MonkeyPatch, status_kind: str, limits: dict[str, int]) -> None:
    """The host's ``bash`` (first on PATH) lies outside the sandbox's view: nothing can run."""
    outside = Path(tempfile.mkdtemp(prefix="amp-bwrap38-bash-"))  # under /tmp: never in the view
    try:
        (outside / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
        monkeypatch.setenv("PATH", f"{outside}{os.pathsep}{os.environ['PATH']}")
        host = await bash_host(base / "work", sandbox="bubblewrap", **limits)
        try:
            result = await host.call("bash", {"command": "touch ran"})
            assert result.error is not None
            assert result.error["code"] == "sandbox_failed", result.error
            assert not (base / "work" / "ran").exists()
        finally:
            await host.close()
    finally:
        shutil.rmtree(outside, ignore_errors=True)


@needs_bwrap
async def test_a_bwrap_killed_before_it_released_the_sandbox_is_a_failed_start(
        base: Path, monkeypatch: pytest.MonkeyPatch, status_kind: str) -> None:
    """A ``bwrap`` (first on PATH, outside the working directory) that execs the real one, and holds
    before it while ``hold`` exists: killed there, nothing ran. Never "command was killed"."""
    real = shutil.which("bwrap")
    assert real is not None
    hold, held = base / "hold", base / "held"
    wrapper = base / "bin" / "bwrap"
    wrapper.write_text(f"#!/bin/sh\n[ -e {hold} ] && {{ : > {held}; sleep 30; }}\nexec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    work = base / "work"
    host = await bash_host(work, sandbox="bubblewrap")
    try:
        hold.touch()
        tag = marker()
        call = asyncio.ensure_future(host.call("bash", {"command": f"touch ran # {tag}"}))
        for _ in range(400):
            if held.exists():
                break
            await asyncio.sleep(0.025)
        assert held.exists(), "the wrapper never ran"
        os.kill(min(processes_with(tag)), signal.SIGKILL)  # the "bwrap": nothing else carries the tag yet
        result = await asyncio.wait_for(call, 30)
        assert not (work / "ran").exists()
        assert result.error is not None
        assert result.error["code"] == "sandbox_failed", result.error
    finally:
        await host.close()


def test_check_started_with_json_status() -> None:
    """The unit view of finding 2: killed with nothing on the status pipe is a failed start; killed
    once bwrap released its first process (it may have run the command) is the signal."""
    from amplifier_tools.errors import ToolSystemError

    with pytest.raises(ToolSystemError):
        sandbox.check_started("", "", reports_exit=True, returncode=-9)
    child = '{ "child-pid": 12, "cgroup-namespace": 4026532184 }\n'
    sandbox.check_started(child, "", reports_exit=True, returncode=-9)
    sandbox.check_started(child + '{ "exit-code": 1 }\n', "", reports_exit=True, returncode=1)
    with pytest.raises(ToolSystemError):
        sandbox.check_started(child, "", reports_exit=True, returncode=1)
