"""Bash cases: ``echo hi`` through the full host, sandboxed (the default) and with ``sandbox = "off"``, beside raw
``bwrap`` with the same view and a raw ``bash`` spawn, in one interleaved run; an output flood's wall time and
host peak RSS growth; and the time from a command's deadline to its last process gone."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from amplifier_tools import ToolHost
from amplifier_tools import sandbox as engine
from amplifier_tools.termination import live_members

from .harness import Row, interleaved, isolated_state, row, run_async

ROOT = Path(__file__).resolve().parent.parent


async def _raw(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
    await proc.communicate()


async def _spawn_cases(work: Path, quick: bool) -> list[Row]:
    """``echo hi`` four ways in one interleaved run: through the host sandboxed (the default) and with
    ``sandbox = "off"``, and raw: ``bwrap`` with the same view the engine builds, and plain bash."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return [row("sandbox (bubblewrap) echo hi vs raw bwrap", 0.0, None, "ms",
                    notes="skipped: bwrap not installed", met=None)]
    off = {"plugins": {"bash": {"sandbox": "off"}}}
    async with ToolHost(config=off, builtins=["bash"], entry_points=False, working_dir=work,
                        discover=False) as unconfined, \
            ToolHost(builtins=["bash"], entry_points=False, working_dir=work, discover=False) as sandboxed:
        def call(host: ToolHost) -> Any:
            async def one() -> None:
                result = await host.call("bash", {"command": "echo hi"})
                assert result.success and result.output["stdout"] == "hi\n", result.error
            return one

        raw_bwrap = engine.command(engine.View(cwd=str(work), writable=(str(work),)), ["bash", "-c", "echo hi"],
                                   bwrap=bwrap)

        async def raw_sandbox() -> None:
            await _raw(*raw_bwrap)

        async def raw_bash() -> None:
            await _raw("bash", "-c", "echo hi")

        n, rounds = (5, 3) if quick else (40, 7)
        got = await interleaved({"sandboxed": call(sandboxed), "off": call(unconfined), "raw_bwrap": raw_sandbox,
                                 "raw_bash": raw_bash}, n=n, rounds=rounds, warmup=3 if quick else 20)
    ms = {name: value[0] / 1000 for name, value in got.items()}
    spread = {name: value[1] / 1000 for name, value in got.items()}
    note = f"median of {rounds} rounds x {n} calls, the four variants interleaved"
    sandbox_ratio = ms["sandboxed"] / ms["raw_bwrap"]
    off_ratio = ms["off"] / ms["raw_bash"]
    return [
        row("bash echo hi via ToolHost, sandbox = off, vs raw bash spawn", ms["off"], ms["raw_bash"], "ms",
            ratio=off_ratio, target="≤ 1.3x raw", met=off_ratio <= 1.3, spread=spread["off"],
            notes=f"ours/raw = {off_ratio:.2f}; {note} (ours: scrubbed env, prlimit, group kill check, bounded "
                  "capture, full pipeline)"),
        row("bash echo hi via ToolHost, sandboxed (default), vs raw bwrap with the same view", ms["sandboxed"],
            ms["raw_bwrap"], "ms", ratio=sandbox_ratio, target="≤ 1.3x raw bwrap", met=sandbox_ratio <= 1.3,
            spread=spread["sandboxed"],
            notes=f"ours/raw bwrap = {sandbox_ratio:.2f}; {note} (ours adds the masks, the status pipe and, "
                  "with a bubblewrap before 0.5.0, the start probe)"),
        row("sandbox start cost: raw bwrap echo hi vs raw bash echo hi", ms["raw_bwrap"], ms["raw_bash"], "ms",
            ratio=ms["raw_bwrap"] / ms["raw_bash"], target="stated", met=None, spread=spread["raw_bwrap"],
            notes=f"bubblewrap's own cost: +{ms['raw_bwrap'] - ms['raw_bash']:.1f} ms per command"),
        row("sandboxed call vs sandbox = off call (both via ToolHost)", ms["sandboxed"], ms["off"], "ms",
            ratio=ms["sandboxed"] / ms["off"], target="stated", met=None,
            notes=f"what the default costs per call: +{ms['sandboxed'] - ms['off']:.1f} ms"),
    ]


FLOOD = textwrap.dedent("""
    import asyncio, json, sys, time
    from pathlib import Path
    from amplifier_tools import ToolHost

    def hwm():
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    async def main(size):
        config = {"plugins": {"bash": {"max_timeout": 3600, "default_timeout": 3600}}}
        async with ToolHost(builtins=["bash"], entry_points=False, working_dir=sys.argv[2], discover=False,
                            config=config) as host:
            await host.call("bash", {"command": "yes | head -c 10000000"})
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
            before = hwm()
            start = time.perf_counter()
            result = await host.call("bash", {"command": f"yes | head -c {size}"})
            wall = time.perf_counter() - start
            after = hwm()
        start = time.perf_counter()
        raw = await asyncio.create_subprocess_exec("bash", "-c", f"yes | head -c {size} > /dev/null")
        await raw.wait()
        print(json.dumps({"wall": wall, "raw": time.perf_counter() - start, "growth_kib": after - before,
                          "bytes": result.output["stdout_bytes"]}))

    asyncio.run(main(int(sys.argv[1])))
""")


def _flood_case(work: Path, size: int) -> Row:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FLOOD, str(size), str(work)], capture_output=True, text=True,
                          env=env, check=True)
    data = json.loads(done.stdout)
    growth = data["growth_kib"] / 1024
    assert data["bytes"] == size
    label = f"{size / 2**30:g} GiB output flood" if size >= 2**30 else f"{size >> 20} MiB output flood"
    return row(f"{label}: wall time (vs the same command to /dev/null)", data["wall"], data["raw"], "s",
               ratio=data["wall"] / data["raw"], target="host peak RSS +few MiB", met=growth < 16,
               notes=f"host peak RSS growth {growth:.1f} MiB; {size / data['wall'] / 2**20:,.0f} MiB/s captured")


async def _kill_case(work: Path, quick: bool) -> Row:
    times = []
    # Unsandboxed: the case reads the group id from `echo $$`, which inside a PID namespace is not the host's.
    async with ToolHost(config={"plugins": {"bash": {"kill_grace": 1, "sandbox": "off"}}}, builtins=["bash"],
                        entry_points=False, working_dir=work, discover=False) as host:
        for _ in range(2 if quick else 5):
            command = "echo $$; trap '' TERM; for i in 1 2 3 4 5 6 7 8; do (trap '' TERM; sleep 1000) & done; wait"
            timeout = 1.0
            start = time.perf_counter()
            result = await host.call("bash", {"command": command, "timeout": timeout})
            gone = time.perf_counter()
            pgid = int(result.output["stdout"].split()[0])
            assert result.output["timed_out"] and live_members(pgid) == []
            times.append((gone - start) - timeout)  # the spawn before the deadline starts is ~2 ms
    median = statistics.median(times)
    return row("deadline → last process gone (9 TERM-ignoring processes, grace 1 s)", median * 1000, None, "ms",
               target="grace + a few ms", met=median < 1.5,
               notes="includes the 1 s TERM grace; SIGKILL then waits until /proc shows no live member")


async def _all(quick: bool) -> list[Row]:
    base = Path(tempfile.mkdtemp(prefix="amplifier-bench-bash-", dir="/var/tmp"))
    try:
        rows = await _spawn_cases(base, quick)
        rows.append(await asyncio.to_thread(_flood_case, base, (64 << 20) if quick else (2 << 30)))
        rows.append(await _kill_case(base, quick))
        return rows
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(quick: bool) -> list[Row]:
    rows: list[Any] = run_async(_all(quick))
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
    os._exit(0)
