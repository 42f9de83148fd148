"""Audit cases: records/s under each fsync policy, added per-call overhead, verify time for many records."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from amplifier_tools import ToolHost

from .bench_core import ARGS, Mount, NoopTool, noop_plugin
from .harness import Row, interleaved, row, run_async


def _host(work: Path, audit: dict[str, Any] | None) -> ToolHost:
    plugins = [Mount([NoopTool()]), *(noop_plugin(i) for i in range(4))]
    session = work / "session"  # the log lives beside the working directory, never inside it
    session.mkdir(parents=True, exist_ok=True)
    if audit is None:
        return ToolHost(plugins=plugins, builtins=False, entry_points=False, working_dir=session, discover=False)
    return ToolHost(config={"plugins": {"audit": {"path": str(work / "state" / "a.jsonl"), **audit}}},
                    plugins=plugins, builtins=["audit"], entry_points=False, working_dir=session, discover=False)


async def _throughput(work: Path, fsync: str, calls: int) -> Row:
    async with _host(work / fsync, {"fsync": fsync}) as host:
        start = time.perf_counter()
        for _ in range(calls):
            await host.call("noop", ARGS)
        elapsed = time.perf_counter() - start
    waits = "each call waits for the fsync of its record (shared by concurrent calls)" if fsync == "always" else \
        "each call writes its record before returning; " + ("a thread fsyncs every 100 ms" if fsync == "interval"
                                                             else "the OS flushes it")
    return row(f"audit: sequential calls/s with fsync={fsync}", calls / elapsed, None, "records/s", notes=waits)


async def _overhead(work: Path, quick: bool) -> list[Row]:
    from amplifier_tools import _json

    fast = _json.orjson

    async def with_stdlib_json() -> Any:
        _json.orjson = None
        try:
            return await audited.call("noop", ARGS)
        finally:
            _json.orjson = fast

    n, rounds = (200, 1) if quick else (3000, 5)
    async with _host(work / "plain", None) as plain, _host(work / "audited", {"fsync": "never"}) as audited, \
            _host(work / "interval", {}) as interval:
        variants = {"plain": lambda: plain.call("noop", ARGS), "audited": lambda: audited.call("noop", ARGS),
                    "interval": lambda: interval.call("noop", ARGS)}
        if fast is not None:
            variants["stdlib"] = with_stdlib_json
        t = await interleaved(variants, n=n, rounds=rounds)
    added = t["audited"][0] - t["plain"][0]
    rows = [row("audit: added per-call overhead (fsync=never)", added, t["plain"][0], "µs/call",
                ratio=t["audited"][0] / t["plain"][0], target="≤ 10 µs", met=added <= 10,
                notes=f"JSON: {_json.encoder_name()}; reference = the same host without the audit plugin")]
    added_interval = t["interval"][0] - t["plain"][0]
    rows.append(row("audit: added per-call overhead (fsync=interval, the default)", added_interval, t["plain"][0],
                    "µs/call", ratio=t["interval"][0] / t["plain"][0], target="≤ 10 µs", met=added_interval <= 10,
                    notes="same run; the fsync thread runs every 100 ms"))
    if fast is not None:
        added_stdlib = t["stdlib"][0] - t["plain"][0]
        rows.append(row("audit: added per-call overhead, stdlib json (no `fast` extra)", added_stdlib,
                        t["plain"][0], "µs/call", ratio=t["stdlib"][0] / t["plain"][0], target="≤ 10 µs",
                        met=added_stdlib <= 10, notes="same run, the record encoded by the json module"))
    return rows


def _verify(work: Path, count: int) -> Row:
    from amplifier_tools.builtins.audit.chain import GENESIS, encode_body, link, verify

    path = work / "big.jsonl"
    prev = GENESIS
    with path.open("wb") as f:
        for i in range(count):
            line, prev = link(encode_body({"v": 1, "kind": "call", "tool": "local::noop", "call_id": f"c{i}",
                                           "status": "ok", "arguments": {"i": i}, "duration_ms": 0.1}), prev)
            f.write(line)
    times = []
    for _ in range(3 if count < 100_000 else 1):
        start = time.perf_counter()
        report = verify(path)
        times.append(time.perf_counter() - start)
        assert report.ok and report.records == count
    seconds = statistics.median(times)
    scaled = seconds * 1_000_000 / count
    return row(f"audit: verify {count:,} records", seconds, None, "s", target="1,000,000 records < 10 s",
               met=scaled < 10, notes=f"≈ {scaled:.1f} s per million records")


async def _all(quick: bool) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="amplifier-bench-audit-"))
    try:
        calls = 200 if quick else 2000
        rows = [await _throughput(work, mode, calls) for mode in ("always", "interval", "never")]
        rows.extend(await _overhead(work, quick))
        rows.append(_verify(work, 20_000 if quick else 1_000_000))
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> list[Row]:
    rows: list[Row] = run_async(_all(quick))
    return rows


if __name__ == "__main__":
    for r in run(quick=False):
        print(r)
