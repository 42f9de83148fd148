"""Policy store cases: the policy plugin's per-call overhead with each store (memory, SQLite, Redis)
side by side in one run, and the throughput of 4 host processes sharing one Redis rate limit.

The per-call case configures one rate limit (one decision: one SQLite transaction, one Redis
round trip) and compares each store with the same host without the policy plugin. The Redis
cases start their own ``redis-server`` on 127.0.0.1 (skipped, with a note, when it or the
``redis`` extra is missing). The reference for the target "≤ 1 round trip + 30 µs" is a ``PING``
on the store's own connections (``RedisStore.ping``, the path every decision takes), measured in
the same interleaved run right after a call of the plain host — what one bare round trip adds to a
call; the same ``PING`` alone in a tight loop and redis-py's ``Redis.ping`` are shown beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from amplifier_tools import ToolHost

from .bench_core import ARGS, Mount, NoopTool
from .harness import Row, interleaved, isolated_state, row, run_async

RATE = {"policies": {"rate_limit": {"limit": 10**9, "interval_ms": 60_000}}}


def _host(store: str | None, state_dir: str) -> ToolHost:
    config: dict[str, Any] = {"state_dir": state_dir}
    if store is not None:
        config.update({"tools": {"noop": RATE}, "plugins": {"policy": {"store": store}}})
    work = Path(state_dir).parent / "work"
    work.mkdir(parents=True, exist_ok=True)
    return ToolHost(plugins=[Mount([NoopTool()])], builtins=["policy"] if store else False, entry_points=False,
                    discover=False, config=config, working_dir=work)


class _Redis:
    """A throwaway redis-server (no persistence) on a free loopback port."""

    def __init__(self, directory: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        binary = shutil.which("redis-server")
        assert binary is not None
        self.process = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", directory,
                                         "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.01)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _redis_available() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis extra is not installed (pip install 'amplifier-tools[redis]')"
    return None


async def _ping_us(url: str, n: int) -> float:
    """µs per ``PING`` through redis-py's client (``Redis.ping``): what the store paid per
    command before it kept its own connections; shown for comparison only."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        for _ in range(100):
            await client.ping()
        start = time.perf_counter()
        for _ in range(n):
            await client.ping()
        return (time.perf_counter() - start) / n * 1e6
    finally:
        await client.aclose()


async def _overhead(quick: bool, redis_url: str | None, base: str) -> list[Row]:
    n, rounds = (200, 1) if quick else (2000, 5)
    stores: dict[str, str | None] = {"plain": None, "memory": "memory", "sqlite": "sqlite"}
    if redis_url is not None:
        stores["redis"] = redis_url
    hosts = {name: _host(store, os.path.join(base, name, "state")) for name, store in stores.items()}
    for host in hosts.values():
        await host.start()
    try:
        variants: dict[str, Callable[[], Awaitable[Any]]] = {
            name: (lambda h=host: h.call("noop", ARGS)) for name, host in hosts.items()}
        if redis_url is not None:
            # The reference round trip, on the store's own connections (the path a decision takes):
            # alone in a tight loop, and after a call of the plain host, as a decision's round trip
            # comes after the host's work (on this 2-core machine that costs ≈ 20-40 µs more).
            store: Any = hosts["redis"].plugin_manager.get_plugin("policy").shared.store  # type: ignore[union-attr]
            plain = hosts["plain"]

            async def call_then_ping() -> None:
                await plain.call("noop", ARGS)
                await store.ping()

            variants["ping"] = store.ping
            variants["plain+ping"] = call_then_ping
        t = await interleaved(variants, n=n, rounds=rounds)
        client_ping = await _ping_us(redis_url, n) if redis_url is not None else None
    finally:
        for host in hosts.values():
            await host.close()
    plain_us = t["plain"][0]
    rows = [row("policy store: memory, added per call (one rate limit)", t["memory"][0] - plain_us, plain_us,
                "µs/call", notes="reference = the same host without the policy plugin", spread=t["memory"][1])]
    added = t["sqlite"][0] - plain_us
    rows.append(row("policy store: SQLite, added per call (one rate limit)", added, plain_us, "µs/call",
                    target="≤ 60 µs", met=added <= 60, notes="one INSERT … RETURNING statement per decision (WAL)",
                    spread=t["sqlite"][1]))
    if redis_url is not None:
        added = t["redis"][0] - plain_us
        trip = t["plain+ping"][0] - plain_us
        rows.append(row("policy store: Redis on loopback, added per call (one rate limit)", added, trip, "µs/call",
                        target="≤ 1 round trip + 30 µs", met=added <= trip + 30,
                        notes=f"reference = one PING round trip on the store's connection after a plain call "
                              f"({trip:.1f} µs; alone in a loop {t['ping'][0]:.1f} µs, against which +"
                              f"{added - t['ping'][0]:.1f} µs; through redis-py's Redis.ping {client_ping:.1f} µs); "
                              f"one EVALSHA per decision",
                        spread=t["redis"][1]))
    return rows


WORKER = """
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
from bench.bench_policy_store import _host
from bench.bench_core import ARGS

async def main():
    async with _host({url!r}, {state!r}) as host:
        await host.call("noop", ARGS)
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        async def caller():
            for _ in range({calls}):
                await host.call("noop", ARGS)
        await asyncio.gather(*(caller() for _ in range(8)))
        print(json.dumps({{"elapsed": time.perf_counter() - start}}), flush=True)

asyncio.run(main())
"""


def _fleet(url: str, base: str, calls: int) -> tuple[float, float]:
    """4 host processes x 8 callers x ``calls`` each against one Redis limit: (calls/s, seconds)."""
    root = str(Path(__file__).resolve().parent.parent)
    procs = []
    for i in range(4):
        state = os.path.join(base, f"fleet{i}", "state")
        code = WORKER.format(root=root, url=url, state=state, calls=calls)
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    start = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())
        proc.wait(60)
    elapsed = time.perf_counter() - start
    return 4 * 8 * calls / elapsed, elapsed


def run(quick: bool) -> list[Row]:
    missing = _redis_available()
    with tempfile.TemporaryDirectory() as base:
        server = _Redis(base) if missing is None else None
        try:
            rows: list[Row] = run_async(_overhead(quick, server.url if server else None, base))
            if server is not None:
                calls = 50 if quick else 500
                rate, elapsed = _fleet(server.url, base, calls)
                rows.append(row("policy store: throughput, 4 processes sharing one Redis rate limit", rate, None,
                                "calls/s", notes=f"{4 * 8 * calls:,} calls in {elapsed:.2f} s (8 callers each)"))
            else:
                rows.append(row("policy store: Redis cases", 0.0, None, "-", notes=f"skipped: {missing}"))
        finally:
            if server is not None:
                server.stop()
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick="--quick" in sys.argv):
            print(r)
