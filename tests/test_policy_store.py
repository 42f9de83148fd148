"""Shared policy stores (SQLite, Redis) across real host processes.

Each multi-process test spawns host processes (``policy_store_worker.py``) that share one
store: a SQLite file in one ``state_dir``, or a ``redis-server`` the tests start on
127.0.0.1 (``redis_server.py``). The default run keeps the call counts lean; the ``slow``
variants run the issue's full 4 x 2,000 calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin
from redis_server import RedisServer

from amplifier_tools import ConfigError, ExecutionError, ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.store import open_store

WORKER = str(Path(__file__).with_name("policy_store_worker.py"))
ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ``store`` setting for each kind of shared store (Redis: a fresh server)."""
    if request.param == "sqlite":
        return "sqlite"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


def work(tmp_path: Path) -> Path:
    """A working directory beside (not around) the state directory."""
    (tmp_path / "work").mkdir(exist_ok=True)
    return tmp_path / "work"


def spawn(spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, WORKER, json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def fleet_policy(store: str) -> dict[str, Any]:
    """The policy settings of a fleet test's hosts: the shared store, with a store timeout long
    enough that a host descheduled for seconds on a loaded machine does not fail the others
    closed (``policy_store_unavailable``); that failure mode has its own tests below."""
    return {"store": store, "store_timeout_ms": 30_000}


def run_hosts(specs: list[dict[str, Any]], timeout: float = 120) -> list[dict[str, Any]]:
    procs = [spawn(spec) for spec in specs]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def live_counters(store: str, state_dir: Path, prefix: str) -> dict[str, float]:
    """The store's live rate-limit counters, as ``policy status`` reads them."""
    async def read() -> list[dict[str, Any]]:
        shared = open_store(store, "amplifier-tools:", 2.0, state_dir)
        try:
            return await shared.status()
        finally:
            await shared.close()
    return {row["key"]: float(row["value"]) for row in asyncio.run(read()) if row["key"].startswith(prefix)}


def rate_limited_fleet(store: str, tmp_path: Path, calls: int) -> None:
    spec = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store), "calls": calls, "parallel": 8,
            "tool": {"name": "limited", "description": "limited", "effect": "Pure",
                     "policies": {"rate_limit": {"limit": 50, "interval_ms": 3_600_000}}}}
    outs = run_hosts([spec] * 4)
    admitted = sum(out["codes"].get("ok", 0) for out in outs)
    assert admitted + sum(out["codes"].get("rate_limited", 0) for out in outs) == 4 * calls, \
        [out["errors"] for out in outs]
    windows = live_counters(store, tmp_path / "state", "rate:limited@")
    assert windows and all(value <= 50 for value in windows.values())  # never over the limit in any window
    assert sum(windows.values()) == admitted and max(windows.values()) == 50  # and the limit is reached


def test_four_hosts_share_one_rate_limit_of_50_per_window(store: str, tmp_path: Path) -> None:
    rate_limited_fleet(store, tmp_path, calls=300)


@pytest.mark.slow
def test_four_hosts_x_2000_calls_share_one_rate_limit_of_50_per_window(store: str, tmp_path: Path) -> None:
    rate_limited_fleet(store, tmp_path, calls=2000)


def test_a_concurrency_cap_of_8_holds_across_4_hosts(store: str, tmp_path: Path) -> None:
    inflight = tmp_path / "inflight"
    spec = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store),
            "calls": 24, "parallel": 6, "hold": 0.03,
            "inflight": str(inflight),
            "tool": {"name": "capped", "description": "capped", "effect": "Pure",
                     "policies": {"timeout_ms": 30_000, "concurrency": {"limit": 8}}}}
    outs = run_hosts([spec] * 4)
    assert sum(out["codes"].get("ok", 0) for out in outs) == 4 * 24, [out["errors"] for out in outs]  # all ran
    peak = int((tmp_path / "inflight.max").read_text())
    assert peak <= 8, f"{peak} calls in flight fleet-wide"
    assert peak >= 4  # the hosts did overlap: the cap, not luck, kept it at 8


def test_slots_of_a_sigkilled_host_come_back_after_the_lease_ttl(store: str, tmp_path: Path) -> None:
    """A host killed while holding both slots: they stay taken until the lease runs out, then
    exactly two are granted again (none lost, none granted twice)."""
    started = tmp_path / "started"
    tool = {"name": "held", "description": "held", "effect": "Pure",
            "policies": {"timeout_ms": 1000, "concurrency": {"limit": 2, "queue": False}}}
    victim = spawn({"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store), "calls": 2, "parallel": 2,
                    "hold": 0.9, "started": str(started), "tool": tool})
    deadline = time.monotonic() + 30
    while not (started.exists() and len(started.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline and victim.poll() is None, victim.stderr.read() if victim.stderr else ""
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.monotonic()
    probe = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store),
            "calls": 3, "parallel": 3, "hold": 0.3,
             "tool": tool}
    (early,) = run_hosts([probe])
    if time.monotonic() - killed_at < 2.5:  # well inside the lease (1 s timeout + 2 s grace)
        assert early["codes"] == {"concurrency_limited": 3}, early["errors"]
    time.sleep(max(0.0, killed_at + 3.2 - time.monotonic()))
    (late,) = run_hosts([probe])
    assert late["codes"] == {"ok": 2, "concurrency_limited": 1}, late["errors"]


def test_idempotency_holds_across_hosts_per_principal(store: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    spec = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store),
            "calls": 3, "parallel": 3, "hold": 0.05,
            "runs": str(runs), "key": "order-42", "principal": "alice", "arguments": {"n": 1},
            "tool": {"name": "order", "description": "order", "effect": "IdempotentWrite",
                     "idempotency_key": "optional", "input_schema": {"type": "object"}}}
    outs = run_hosts([spec] * 4)
    assert len(runs.read_text().splitlines()) == 1, [out["errors"] for out in outs]  # ran once fleet-wide
    outputs = [o for out in outs for o in out["outputs"]]
    assert len(outputs) == 12 and all(o == outputs[0] for o in outputs)
    assert sum(out["replayed"] for out in outs) == 11
    (bob,) = run_hosts([{**spec, "principal": "bob", "calls": 1}])
    assert bob["replayed"] == 0 and bob["outputs"][0]["run"] == 2  # another principal: its own call
    (conflict,) = run_hosts([{**spec, "arguments": {"n": 2}, "calls": 1}])
    assert conflict["codes"] == {"idempotency_conflict": 1}, conflict["errors"]


def test_a_call_budget_is_shared_by_the_hosts(store: str, tmp_path: Path) -> None:
    # A window of ~30 years: no window boundary falls inside the test (a new window is a new budget).
    spec = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store),
            "calls": 5, "parallel": 5, "principal": "alice",
            "tool": {"name": "metered", "description": "metered", "effect": "Pure",
                     "policies": {"budgets": [{"per": "principal", "max_calls": 5, "max_seconds": 600,
                                               "window_ms": 10**12}]}}}
    outs = run_hosts([spec] * 4)
    codes: Counter[str] = Counter()
    for out in outs:
        codes.update(out["codes"])
    assert codes == {"ok": 5, "budget_exceeded": 15}, [out["errors"] for out in outs]


def test_a_breaker_opened_by_one_host_rejects_calls_on_another(store: str, tmp_path: Path) -> None:
    tool = {"name": "flaky", "description": "flaky", "effect": "Pure",
            "policies": {"circuit_breaker": {"failure_threshold": 3, "cooldown_ms": 60_000}}}
    base = {"state_dir": str(tmp_path / "state"), "policy": fleet_policy(store), "tool": tool}
    (failing,) = run_hosts([{**base, "calls": 3, "fail": True}])
    assert failing["codes"] == {"backend_down": 3}, failing["errors"]
    (other,) = run_hosts([{**base, "calls": 2}])
    assert other["codes"] == {"circuit_open": 2}, other["errors"]


class Gated:
    """Fails while ``fail`` is set; otherwise waits for ``gate`` (so a probe stays in flight)."""

    def __init__(self, gate: asyncio.Event, entered: list[str]) -> None:
        self.spec = ToolSpec(name="gated", description="gated", effect="Pure",
                             policies={"circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 300}})
        self.name, self.description = "gated", "gated"
        self.gate, self.entered, self.fail = gate, entered, False

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.entered.append("x")
        if self.fail:
            raise ExecutionError("backend down", code="backend_down")
        await self.gate.wait()
        return ToolResult(output="ok")


async def test_one_half_open_probe_across_hosts(store: str, tmp_path: Path) -> None:
    """Two hosts (two plugins, two store connections) after the cooldown: one probe fleet-wide."""
    gate, entered = asyncio.Event(), []
    tools = [Gated(gate, entered), Gated(gate, entered)]
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store}}}
    hosts = [ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                      discover=False, working_dir=work(tmp_path)) for tool in tools]
    for host in hosts:
        await host.start()
    try:
        tools[0].fail = True
        assert (await hosts[0].call("gated", {})).error["code"] == "backend_down"
        assert (await hosts[1].call("gated", {})).error["code"] == "circuit_open"  # opened fleet-wide
        tools[0].fail = False
        await asyncio.sleep(0.35)  # past the cooldown
        entered.clear()
        calls = [asyncio.ensure_future(host.call("gated", {})) for host in hosts for _ in range(4)]
        while not entered:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert len(entered) == 1  # exactly one probe is running
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        codes = sorted("ok" if r.success else r.error["code"] for r in results)
        assert codes == ["circuit_open"] * 7 + ["ok"]
        assert (await hosts[1].call("gated", {})).success  # the probe closed it for every host
    finally:
        for host in hosts:
            await host.close()


class Everything:
    """A tool under every stateful policy at once."""

    spec = ToolSpec(name="everything", description="everything", effect="IdempotentWrite", idempotency_key="optional",
                    policies={"rate_limit": {"limit": 2, "interval_ms": 60_000}, "concurrency": {"limit": 2},
                              "circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 1000},
                              "budgets": [{"per": "principal", "max_calls": 10, "max_seconds": 60}]})
    name, description = "everything", "everything"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if input.get("fail"):
            raise ExecutionError("backend down", code="backend_down")
        return ToolResult(output="done")


async def test_every_key_expires_and_prefixes_keep_deployments_apart(store: str, tmp_path: Path) -> None:
    results = {}
    for prefix in ("team-a:", "team-b:"):
        config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store, "store_prefix": prefix}}}
        async with ToolHost(config=config, plugins=[ToolsPlugin(Everything())], builtins=["policy"],
                            entry_points=False, discover=False, working_dir=work(tmp_path)) as host:
            keyed = ToolContext(idempotency_key="k")
            results[prefix] = [await host.call("everything", {}, context=keyed),
                               await host.call("everything", {"fail": True}),
                               await host.call("everything", {"n": 3})]
            rows = await host.plugin_manager.get_plugin("policy").shared.store.status()
        kinds = {row["key"].split(":")[0].split("@")[0] for row in rows}
        assert {"rate", "budget", "breaker", "idem"} <= kinds, kinds
        assert all(row["expires_in"] > 0 for row in rows), [row for row in rows if row["expires_in"] <= 0]
    for prefix in ("team-a:", "team-b:"):  # team-a's open breaker did not open team-b's
        codes = [r.error["code"] if r.error else "ok" for r in results[prefix]]
        assert codes == ["ok", "backend_down", "circuit_open"]


class Held:
    """Runs until ``gate`` opens; under a time budget of 1 s per principal."""

    spec = ToolSpec(name="timed", description="timed", effect="Pure",
                    policies={"timeout_ms": 1000,
                              "budgets": [{"per": "principal", "max_seconds": 1, "window_ms": 3_600_000}]})
    name, description = "timed", "timed"

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await self.gate.wait()
        return ToolResult(output="done")


async def test_a_time_budget_is_reserved_fleet_wide_before_a_call_runs(store: str, tmp_path: Path) -> None:
    """Host A's running call reserved the whole second; host B is refused until A settles."""
    gate = asyncio.Event()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store}}}
    hosts = [ToolHost(config=config, plugins=[ToolsPlugin(Held(gate))], builtins=["policy"], entry_points=False,
                      discover=False, working_dir=work(tmp_path)) for _ in range(2)]
    for host in hosts:
        await host.start()
    try:
        running = asyncio.ensure_future(hosts[0].call("timed", {}))
        await asyncio.sleep(0.1)
        refused = await hosts[1].call("timed", {})
        assert refused.error is not None and refused.error["code"] == "budget_exceeded"
        assert "reserved by calls in flight" in refused.error["message"]
        gate.set()
        assert (await running).success  # settled: ~0.1 s spent, the reservation released
        assert (await hosts[1].call("timed", {})).success
    finally:
        for host in hosts:
            await host.close()


# -- Redis down ----------------------------------------------------------------------------------


class Quick:
    spec = ToolSpec(name="quick", description="quick", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 1000}})
    name, description = "quick", "quick"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


async def test_redis_down_fails_closed_within_the_deadline_and_recovers(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": redis_server.url,
                                                                 "store_timeout_ms": 500}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work(tmp_path)) as host:
        assert (await host.call("quick", {})).success
        redis_server.stop()
        begun = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*(host.call("quick", {}) for _ in range(5))), 10)
        assert time.monotonic() - begun < 3  # no call hangs: each store operation is bounded
        for result in results:
            assert not result.success and result.error is not None
            assert result.error["code"] == "policy_store_unavailable" and result.error["retryable"] is True
        redis_server.start()
        recovered = await asyncio.wait_for(host.call("quick", {}), 10)
        assert recovered.success, recovered.error


async def test_a_redis_that_stops_answering_fails_calls_within_the_store_timeout(redis_server: RedisServer,
                                                                                   tmp_path: Path) -> None:
    """SIGSTOP: the connection stays open but nothing answers; each call still ends in time."""
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": redis_server.url,
                                                                 "store_timeout_ms": 300}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work(tmp_path)) as host:
        assert (await host.call("quick", {})).success
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            begun = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*(host.call("quick", {}) for _ in range(3))), 10)
            assert time.monotonic() - begun < 2
            assert [r.error["code"] for r in results if r.error] == ["policy_store_unavailable"] * 3
            begun = time.monotonic()
            cut = await asyncio.wait_for(host.call("quick", {}, context=ToolContext().with_timeout(0.1)), 10)
            assert cut.error is not None and cut.error["code"] == "policy_store_unavailable"
            assert time.monotonic() - begun < 0.25  # bounded by the call's deadline, before the store timeout
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        recovered = await asyncio.wait_for(host.call("quick", {}), 10)
        assert recovered.success, recovered.error


async def test_redis_down_falls_back_to_local_memory_when_configured(redis_server: RedisServer,
                                                                     tmp_path: Path) -> None:
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {
        "store": redis_server.url, "store_unavailable": "local", "store_timeout_ms": 500}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work(tmp_path)) as host:
        redis_server.stop()
        result = await asyncio.wait_for(host.call("quick", {}, context=ToolContext()), 10)
        assert result.success
        assert any(step.get("action") == "store_unavailable" for step in result.metadata["trail"])
        redis_server.start()
        again = await asyncio.wait_for(host.call("quick", {}), 10)
        assert again.success and not any(step.get("action") == "store_unavailable"
                                         for step in again.metadata["trail"])


async def test_a_unix_socket_url_reaches_redis(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    server = RedisServer(tmp_path_factory.mktemp("redis-unix"), unix=True).start()
    try:
        config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": server.url}}}
        async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                            discover=False, working_dir=work(tmp_path)) as host:
            assert (await host.call("quick", {})).success
            rows = await host.plugin_manager.get_plugin("policy").shared.store.status()
        assert [row["value"] for row in rows if row["key"].startswith("rate:quick@")] == [1.0]
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["fail", "local"])
async def test_a_locked_sqlite_store_fails_closed_or_falls_back_and_recovers(mode: str, tmp_path: Path) -> None:
    """Another process holds the database's write lock past the store timeout."""
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {
        "store": "sqlite", "store_timeout_ms": 500, "store_unavailable": mode}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work(tmp_path)) as host:
        assert (await host.call("quick", {})).success
        locker = sqlite3.connect(tmp_path / "state" / "policy.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            begun = time.monotonic()
            result = await host.call("quick", {})
            assert time.monotonic() - begun < 2
            if mode == "fail":
                assert result.error is not None and result.error["code"] == "policy_store_unavailable"
                begun = time.monotonic()
                cut = await host.call("quick", {}, context=ToolContext().with_timeout(0.05))
                assert cut.error is not None and cut.error["code"] == "policy_store_unavailable"
                assert time.monotonic() - begun < 0.15  # the call's deadline, not the store timeout
            else:
                assert result.success
                assert any(step.get("action") == "store_unavailable" for step in result.metadata["trail"])
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert (await host.call("quick", {})).success


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [("store", "postgres://x"), ("store_unavailable", "maybe"),
                                            ("store_prefix", ""), ("store_timeout_ms", 0)])
async def test_a_bad_store_setting_is_refused_naming_the_key(key: str, value: Any, tmp_path: Path) -> None:
    host = ToolHost(config={"plugins": {"policy": {key: value}}}, builtins=["policy"], entry_points=False,
                    discover=False, working_dir=work(tmp_path))
    with pytest.raises(Exception) as raised:
        await host.start()
    error = raised.value if isinstance(raised.value, ConfigError) else raised.value.__cause__
    assert f"plugins.policy.{key}" in str(raised.value) or f"plugins.policy.{key}" in str(error)


async def test_the_sqlite_file_is_host_state_that_tools_cannot_reach(tmp_path: Path) -> None:
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite"}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work(tmp_path)) as host:
        assert (await host.call("quick", {})).success
        database = tmp_path / "state" / "policy.sqlite3"
        assert database.is_file() and (database.stat().st_mode & 0o077) == 0
        assert host.protected_paths.protects(str(database.resolve())) is not None
