"""Nothing of a call outlives it, output floods stay out of the host's memory, rlimits contain abuse.

Timing on shared 2-core CI machines is noisy: deadlines here are generous and
start only once the command runs; the assertions are about outcomes (which
processes remain, which limits hit), not about how fast.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from bash_helpers import (
    PYTHON_READ_PATHS,
    bash_host,
    describe_processes,
    group_members,
    launchers_outside_sandbox,
    marker,
    processes_alive_together,
    processes_with,
)

from amplifier_tools import ToolHost

ROOT = Path(__file__).resolve().parent.parent


def _tree(tag: str) -> str:
    """A command leaving a background child, a grandchild and a detached subshell, all tagged."""
    return (f"echo $$; (exec -a {tag}-child sleep 1000) & "
            f"bash -c '(exec -a {tag}-grandchild sleep 1000) & wait' & "
            f"( (exec -a {tag}-subshell sleep 1000) & ) ; sleep 1000 # {tag}")


async def _wait_for_processes(tag: str, count: int, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(processes_with(tag)) < count and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert len(processes_with(tag)) >= count, processes_with(tag)


async def test_no_orphans_after_timeout(tmp_path: Path) -> None:
    tag = marker()
    host = await bash_host(tmp_path, kill_grace=1)
    try:
        result = await host.call("bash", {"command": _tree(tag), "timeout": 3})
        assert result.output["timed_out"] is True
        pgid = int(result.output["stdout"].split()[0])
        assert group_members(pgid) == []
        assert processes_with(tag) == []
    finally:
        await host.close()


async def test_no_orphans_after_the_command_exits_leaving_background_children(tmp_path: Path) -> None:
    tag = marker()
    host = await bash_host(tmp_path)
    try:
        result = await host.call("bash", {"command": f"(exec -a {tag} sleep 1000) & echo started", "timeout": 60})
        assert result.success and result.output["stdout"] == "started\n"
        assert processes_with(tag) == []
    finally:
        await host.close()


async def test_no_orphans_after_cancellation(tmp_path: Path) -> None:
    tag = marker()
    host = await bash_host(tmp_path, kill_grace=1)
    try:
        task = asyncio.create_task(host.call("bash", {"command": _tree(tag), "timeout": 600}))
        await _wait_for_processes(tag, 4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert processes_with(tag) == []
    finally:
        await host.close()


async def test_no_orphans_after_the_hosts_policy_timeout(tmp_path: Path) -> None:
    tag = marker()
    config = {"plugins": {"bash": {"kill_grace": 1}}, "tools": {"local::bash": {"policies": {"timeout_ms": 3000}}}}
    async with ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        result = await host.call("bash", {"command": _tree(tag), "timeout": 600})
        assert result.error["type"] == "PolicyError" and result.error["code"] == "timeout"
        assert processes_with(tag) == []


async def test_term_ignoring_command_is_killed_after_the_grace(tmp_path: Path) -> None:
    tag = marker()
    host = await bash_host(tmp_path, kill_grace=0.5)
    try:
        result = await host.call("bash", {"command": f"trap '' TERM; sleep 1000 # {tag}", "timeout": 2})
        assert result.output["timed_out"] is True
        assert processes_with(tag) == []
    finally:
        await host.close()


FLOOD_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from amplifier_tools import ToolHost

    def hwm():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    async def main(size):
        async with ToolHost(builtins=["bash"], entry_points=False, working_dir=sys.argv[2], discover=False,
                            config={"plugins": {"bash": {"max_timeout": 3600, "default_timeout": 3600}}}) as host:
            await host.call("bash", {"command": "yes | head -c 10000000"})  # warm up: imports, first spawn
            try:
                Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current RSS
            except OSError:
                pass
            before = hwm()
            result = await host.call("bash", {"command": f"yes | head -c {size}; yes err | head -c 1000 >&2"})
            after = hwm()
        print(json.dumps({"before": before, "after": after, "output": result.output, "success": result.success}))

    asyncio.run(main(int(sys.argv[1])))
""")


def _flood(size: int, tmp_path: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FLOOD_SCRIPT, str(size), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def _check_flood(data: dict[str, object], size: int) -> None:
    output = data["output"]
    assert isinstance(output, dict) and data["success"] is True
    assert output["stdout_bytes"] == size and output["stdout_truncated"] is True
    assert output["stderr_bytes"] == 1000
    assert len(output["stdout"]) < 40_000
    growth_mib = (int(data["after"]) - int(data["before"])) / 1024  # type: ignore[call-overload]
    assert growth_mib < 16, f"host peak RSS grew by {growth_mib:.1f} MiB for a {size >> 20} MiB flood"


def test_output_flood_stays_within_the_memory_bound(tmp_path: Path) -> None:
    size = 200 * 1024 * 1024
    _check_flood(_flood(size, tmp_path), size)


@pytest.mark.slow
def test_2gb_output_flood_stays_within_the_memory_bound(tmp_path: Path) -> None:
    size = 2 * 1024 * 1024 * 1024
    _check_flood(_flood(size, tmp_path), size)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory an unprivileged user can enter (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="amp-bash-", dir="/var/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as_nobody() -> dict[str, object]:
    if os.geteuid() == 0:  # RLIMIT_NPROC does not apply to root: drop to an unprivileged user
        return {"user": "nobody"}
    return {}


def _processes_of(user: str) -> int:
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += 1
        except OSError:
            pass
    return count


async def test_fork_bomb_is_contained_and_reported(shared_dir: Path) -> None:
    tag = marker()
    as_user = _as_nobody()
    if as_user:  # RLIMIT_NPROC counts every process of the user: the bomb's 64 must be its own
        others = _processes_of("nobody")
        assert others < 8, f"{others} processes already run as nobody; the process limit test needs that user"
    host = await bash_host(shared_dir, max_processes=64, kill_grace=1, **as_user)
    seen: list[int] = []

    async def sample() -> None:
        while True:
            # the count the limit governs: bwrap's launcher outside the sandbox is the host's
            seen.append(processes_alive_together(tag) - launchers_outside_sandbox(tag))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        bomb = f"bomb() {{ bomb | bomb & }}; bomb; sleep 3; echo survived # {tag}"
        result = await host.call("bash", {"command": bomb, "timeout": 20})
        sampler.cancel()
        assert result.output is not None and "stderr" in result.output, result
        assert 1 < max(seen) <= 64, f"the process limit did not hold: {max(seen)} processes at once"
        assert "fork" in result.output["stderr"] or result.output["timed_out"], result.output
        assert processes_with(tag) == [], describe_processes(tag)
        assert (await host.call("bash", {"command": "echo still-working"})).output["stdout"] == "still-working\n"
    finally:
        sampler.cancel()
        await host.close()


async def test_memory_hog_is_contained_by_the_address_space_limit(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, max_memory_bytes=512 * 1024 * 1024, sandbox_read_paths=PYTHON_READ_PATHS)
    try:
        hog = f"{sys.executable} -c 'b = bytearray(4 * 1024 ** 3)'"
        result = await host.call("bash", {"command": hog, "timeout": 120})
        assert not result.success and result.output["timed_out"] is False
        assert "MemoryError" in result.output["stderr"]
        assert (await host.call("bash", {"command": "echo ok"})).success
    finally:
        await host.close()


async def test_cpu_limit_stops_a_busy_loop(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, max_cpu_seconds=1)
    try:
        result = await host.call("bash", {"command": "while :; do :; done", "timeout": 120})
        assert not result.success and result.output["timed_out"] is False
        assert result.output["signal"] in ("SIGXCPU", "SIGKILL")
    finally:
        await host.close()


async def test_file_size_limit_stops_a_disk_filler(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, max_file_size_bytes=1024 * 1024)
    try:
        result = await host.call("bash", {"command": "head -c 5000000 /dev/zero > big", "timeout": 120})
        assert not result.success
        assert (tmp_path / "big").stat().st_size <= 1024 * 1024
    finally:
        await host.close()
