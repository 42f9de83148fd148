"""Soak: many calls through the default pipeline (policy + audit), some cut by random timeouts.

200,000 sequential calls, then 20,000 calls in batches of 100 concurrent callers under
``asyncio.wait_for`` with random timeouts (about half are cancelled: queued for a slot, running,
or being recorded). Reports what a leak would show: RSS, open file descriptors and threads
before and after, audit records written against calls made (they must be equal: a cancelled
call is recorded too), resources the policy plugin still holds, and p50/p99 latency of the first
and the last 10,000 sequential calls. ``--quick`` runs 2,000 + 1,000 calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from amplifier_tools import ToolHost, ToolResult

from .bench_core import Mount
from .harness import Row, isolated_state, row, run_async


class Jitter:
    """A tool that sleeps 0-2 ms (``seconds`` argument), so timeouts can land anywhere."""

    name = "jitter"
    description = "Sleep a little."
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if input["seconds"]:
            await asyncio.sleep(input["seconds"])
        return ToolResult(True, "ok")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _snapshot() -> dict[str, float]:
    return {"rss_mib": round(_rss_mib(), 1), "fds": _fds(), "threads": threading.active_count()}


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _soak(quick: bool, root: Path) -> list[Row]:
    sequential, cancelled_total, window = (2_000, 1_000, 500) if quick else (200_000, 20_000, 10_000)
    config = {"state_dir": str(root / "state"),
              "tools": {"jitter": {"policies": {"concurrency": {"limit": 8, "queue": True},
                                                "rate_limit": {"limit": 10**9, "interval_ms": 1000},
                                                "circuit_breaker": {"failure_threshold": 10**6}}}}}
    workdir = root / "work"
    workdir.mkdir()
    rng = random.Random(12)
    async with ToolHost(config=config, plugins=[Mount([Jitter()])], builtins=["policy", "audit"],
                        entry_points=False, discover=False, working_dir=workdir) as host:
        log_path = Path(host.capabilities["audit.path"])
        before = _snapshot()
        latencies: list[float] = []
        for _ in range(sequential):
            start = time.perf_counter()
            await host.call("jitter", {"seconds": 0})
            latencies.append((time.perf_counter() - start) * 1e6)
        outcomes = {"ok": 0, "timed_out": 0}

        async def one() -> None:
            try:
                await asyncio.wait_for(host.call("jitter", {"seconds": rng.uniform(0, 0.002)}),
                                       rng.uniform(0, 0.03))
                outcomes["ok"] += 1
            except (asyncio.TimeoutError, TimeoutError):
                outcomes["timed_out"] += 1

        for _ in range(cancelled_total // 100):
            await asyncio.gather(*(one() for _ in range(100)))
        policy = host.plugin_manager.get_plugin("policy")
        held = policy.held_resources()
        after = _snapshot()
    calls = sequential + cancelled_total
    records = sum(1 for line in log_path.read_text().splitlines()
                  if line.strip() and json.loads(line).get("kind") == "call")
    first, last = latencies[:window], latencies[-window:]
    leaked = {k: v for k, v in (held or {}).items() if v}
    holds = leaked or "nothing"
    notes = (f"before {before}, after {after}; {outcomes['timed_out']:,} of {cancelled_total:,} cut by wait_for; "
             f"policy still holds {holds}")
    return [
        row(f"soak: audit records vs calls ({sequential:,} sequential + {cancelled_total:,} under random timeouts)",
            records, calls, "records", ratio=records / calls, target="records == calls, nothing held",
            met=records == calls and not leaked, notes=notes),
        row(f"soak: p50 first vs last {window:,} sequential calls", statistics.median(last),
            statistics.median(first), "µs/call", ratio=statistics.median(last) / statistics.median(first),
            notes="ours = last window, reference = first window"),
        row(f"soak: p99 first vs last {window:,} sequential calls", _pct(last, 0.99), _pct(first, 0.99),
            "µs/call", ratio=_pct(last, 0.99) / _pct(first, 0.99),
            notes="ours = last window, reference = first window"),
        row("soak: RSS growth over the run", after["rss_mib"] - before["rss_mib"], before["rss_mib"], "MiB",
            ratio=after["rss_mib"] / before["rss_mib"],
            notes=f"fds {before['fds']} -> {after['fds']}, threads {before['threads']} -> {after['threads']}"),
    ]


def run(quick: bool) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="amplifier-tools-soak-") as tmp:
        rows: list[Row] = run_async(_soak(quick, Path(tmp)))
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
