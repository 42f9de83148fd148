"""Policy cases: added per-call overhead with a rate limit, a concurrency cap and a circuit breaker
configured, and throughput under 1,000 concurrent callers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from amplifier_tools import ToolHost

from .bench_core import ARGS, Mount, NoopTool, noop_plugin
from .harness import Row, interleaved, isolated_state, row, run_async

POLICIES = {"policies": {"rate_limit": {"limit": 10**9, "interval_ms": 1000}, "concurrency": {"limit": 64},
                         "circuit_breaker": {"failure_threshold": 5}}}


def _host(policy: bool) -> ToolHost:
    plugins: list[Any] = [Mount([NoopTool()]), *(noop_plugin(i) for i in range(4))]
    return ToolHost(plugins=plugins, builtins=["policy"] if policy else False, entry_points=False, discover=False,
                    config={"tools": {"noop": POLICIES}} if policy else None)


async def _all(quick: bool) -> list[Row]:
    n, rounds = (200, 1) if quick else (3000, 5)
    async with _host(False) as plain, _host(True) as policed:
        t = await interleaved({"plain": lambda: plain.call("noop", ARGS),
                               "policed": lambda: policed.call("noop", ARGS)}, n=n, rounds=rounds)
        added = t["policed"][0] - t["plain"][0]
        callers = 1000
        calls = 20 if quick else 100

        async def caller() -> None:
            for _ in range(calls):
                await policed.call("noop", ARGS)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        elapsed = time.perf_counter() - start
    return [
        row("policy: added per-call overhead (rate limit + concurrency cap + breaker)", added, t["plain"][0],
            "µs/call", ratio=t["policed"][0] / t["plain"][0], target="≤ 10 µs", met=added <= 10,
            notes="reference = the same host without the policy plugin"),
        row(f"policy: throughput, {callers:,} concurrent callers", callers * calls / elapsed, None, "calls/s",
            notes=f"{callers * calls:,} calls in {elapsed:.2f} s"),
    ]


def run(quick: bool) -> list[Row]:
    rows: list[Row] = run_async(_all(quick))
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
