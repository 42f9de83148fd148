"""Session 29 review: defects found reading the day's changes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from bash_helpers import bash_host, needs_bwrap

from amplifier_tools import ToolResult, ToolSpec, sandbox
from amplifier_tools.procfs import proc_stat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")


def test_a_namespace_whose_first_process_ends_during_the_scan_has_no_members(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The ``ns/pid`` link is a number the kernel reuses: once the first process (and so the namespace)
    # is gone, the same link may name another sandbox's namespace, whose processes the host would then
    # SIGKILL. Stand-in: a namespace known by the host's own link, whose first process ends mid-scan.
    first = subprocess.Popen(["sleep", "30"])
    try:
        stat = proc_stat(first.pid)
        assert stat is not None
        namespace = sandbox.Namespace(first.pid, stat.started, os.readlink("/proc/self/ns/pid"))
        real_is_live = sandbox.is_live

        def first_ends(pid: int | str) -> bool:
            if first.poll() is None:
                first.kill()
                first.wait()
            return real_is_live(pid)

        monkeypatch.setattr(sandbox, "is_live", first_ends)
        assert namespace.members() == []
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


@needs_bwrap
async def test_a_command_timed_out_during_the_sandbox_setup_never_writes_afterwards() -> None:
    # test_bash_sandbox_attack_2's version looks for the file at once, before the command could write
    # it (1.2 s in) even had it run on; here the look comes after that moment.
    work = Path(tempfile.mkdtemp(prefix="amp-review29-", dir="/var/tmp"))
    try:
        host = await bash_host(work, kill_grace=0.2)
        try:
            started = time.monotonic()
            for _ in range(3):
                result = await host.call("bash", {"command": "sleep 0.6; echo late >> late.txt", "timeout": 1e-6})
                assert result.output["timed_out"] is True
        finally:
            await host.close()
        await asyncio.sleep(max(0.0, started + 1.0 - time.monotonic()))
        assert not (work / "late.txt").exists(), "a command ran on after it was reported killed"
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Widen:
    """A Pure tool that turns a nested integer of its arguments into a float, in place."""

    spec = ToolSpec(name="local::items.widen", version="1.0.0", description="Widen a number.", effect="Pure",
                    input_schema={"type": "object", "properties": {"options": {"type": "object"}}},
                    examples=[{"input": {"options": {"n": 1}}, "output": 1}])
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        input["options"]["n"] = float(input["options"]["n"])
        return ToolResult(output=1)


async def test_a_nested_integer_turned_into_a_float_is_a_changed_argument() -> None:
    """Found by review: the kit compared arguments as JSON numbers (``1 == 1.0``), so an in-place
    change a tool (and the audit record) can tell apart passed; outputs still compare so."""
    from amplifier_tools.conformance import check_target_async

    report = await check_target_async(_Widen())
    failed = [(c.name, c.message) for c in report.checks if not c.passed]
    assert failed == [("local::items.widen: example 1: arguments",
                       "the tool changed the arguments it was given (changed 'options'): the audit record and a "
                       "retry see the changed ones; work on a copy")]


SIGNALS_KEPT = '''
import asyncio, signal, sys
from amplifier_tools import ToolHost
from amplifier_tools.mcp.server import serve

def mine(signum, frame):
    pass

async def main():
    signal.signal(signal.SIGTERM, mine)
    before = signal.getsignal(signal.SIGINT)  # asyncio.run's own (3.11+), or Python's default
    async with ToolHost(config={"state_dir": sys.argv[1]}, builtins=False, entry_points=False,
                        discover=False, working_dir=sys.argv[2]) as host:
        await serve(host)  # stdin is at its end: serving ends at once
    print(signal.getsignal(signal.SIGTERM) is mine, signal.getsignal(signal.SIGINT) == before)

asyncio.run(main())
'''


def test_serving_on_stdio_puts_back_the_signal_handlers_it_found(tmp_path: Path) -> None:
    """Found by review: ``serve`` on stdio took SIGINT and SIGTERM for its calls and, when it ended,
    left SIG_DFL and Python's default in place of an embedding application's handlers (and of
    ``asyncio.run``'s SIGINT handler, which cancels the main task for a graceful close)."""
    pytest.importorskip("mcp")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    (tmp_path / "work").mkdir()
    done = subprocess.run([sys.executable, "-c", SIGNALS_KEPT, str(tmp_path / "state"), str(tmp_path / "work")],
                          stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=environ, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout


@pytest.mark.slow
@needs_bwrap
async def test_a_timeout_that_cuts_the_sandbox_setup_is_the_timeout() -> None:
    """Found by CI: a timeout that passed while bwrap set up the sandbox (one call in thirty at
    1e-6 s) failed as "the bubblewrap sandbox failed to start", a ToolSystemError with no output,
    where it was the call's timeout; it is now the timeout, with ``timed_out`` in the output."""
    work = Path(tempfile.mkdtemp(prefix="amp-review29-", dir="/var/tmp"))
    try:
        host = await bash_host(work, kill_grace=0.2)
        try:
            outcomes = set()
            for _ in range(60):
                result = await host.call("bash", {"command": "sleep 0.6", "timeout": 1e-6})
                outcomes.add((result.error or {}).get("code") if result.output is None else result.output["timed_out"])
        finally:
            await host.close()
        assert outcomes == {True}, outcomes
    finally:
        shutil.rmtree(work, ignore_errors=True)
