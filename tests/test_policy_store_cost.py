"""What keeps a shared store's decision cheap, and the guarantees it must keep while it does.

SQLite: the busy timeout is set only when a call's wait bound changes it, and a bound left
behind by a call with a short deadline never shortens (or lengthens) the next call's wait.
Redis: a rate-limit decision is one ``EVALSHA`` on the store's own connections; those
connections survive a server restart and a script cache flush, and a cancelled or timed-out
command never leaves a late reply for the next one.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin
from redis_server import RedisServer

from amplifier_tools import ToolCall, ToolContext, ToolHost, ToolResult, ToolSpec


class Quick:
    spec = ToolSpec(name="quick", description="quick", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 60000}})
    name, description = "quick", "quick"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


def _host(tmp_path: Path, store: str, timeout_ms: float = 500) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": store, "store_timeout_ms": timeout_ms}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(Quick())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


def _store(host: ToolHost) -> Any:
    return host.plugin_manager.get_plugin("policy").shared.store  # type: ignore[union-attr]


# -- SQLite ---------------------------------------------------------------------------------------


async def test_the_busy_timeout_is_set_only_when_a_calls_bound_changes_it(tmp_path: Path) -> None:
    async with _host(tmp_path, "sqlite") as host:
        assert (await host.call("quick", {})).success
        pragmas: list[str] = []
        _store(host)._db.set_trace_callback(lambda sql: pragmas.append(sql) if "busy_timeout" in sql else None)
        for _ in range(20):  # no deadline shorter than the store timeout: no statement but the decision
            assert (await host.call("quick", {})).success
        assert pragmas == []
        assert (await host.call("quick", {}, context=ToolContext().with_timeout(0.2))).success
        assert len(pragmas) == 1 and int(pragmas[0].rsplit("=", 1)[1]) <= 200
        assert (await host.call("quick", {})).success  # back to the store timeout, once
        assert pragmas[1:] == ["PRAGMA busy_timeout = 500"]


async def test_a_short_deadline_does_not_shorten_the_next_calls_wait_for_a_lock(tmp_path: Path) -> None:
    """The busy timeout is no longer reset after every operation; the next operation sets its own."""
    async with _host(tmp_path, "sqlite") as host:
        assert (await host.call("quick", {})).success
        locker = sqlite3.connect(tmp_path / "state" / "policy.sqlite3", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            begun = time.monotonic()
            cut = await host.call("quick", {}, context=ToolContext().with_timeout(0.05))
            assert cut.error is not None and cut.error["code"] == "policy_store_unavailable"
            assert time.monotonic() - begun < 0.3  # bounded by the call's deadline
            begun = time.monotonic()
            full = await host.call("quick", {})
            waited = time.monotonic() - begun
            assert full.error is not None and full.error["code"] == "policy_store_unavailable"
            assert 0.45 <= waited < 3  # the whole store timeout (500 ms), not the 50 ms left behind
            begun = time.monotonic()
            cut = await host.call("quick", {}, context=ToolContext().with_timeout(0.05))
            assert cut.error is not None and time.monotonic() - begun < 0.3
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert (await host.call("quick", {})).success


# -- Redis ------------------------------------------------------------------------------------------


async def _command_counts(url: str, *command: str) -> dict[str, int]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        if command:
            await client.execute_command(*command)
            return {}
        stats = await client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(values["calls"]) for name, values in stats.items()}
    finally:
        await client.aclose()


async def test_a_rate_limit_decision_is_one_evalsha(redis_server: RedisServer, tmp_path: Path) -> None:
    async with _host(tmp_path, redis_server.url) as host:
        assert (await host.call("quick", {})).success  # connected, script known
        await _command_counts(redis_server.url, "CONFIG", "RESETSTAT")
        for _ in range(25):
            assert (await host.call("quick", {})).success
        counts = await _command_counts(redis_server.url)
    assert counts.pop("evalsha") == 25
    inside_the_script = {"time", "incr", "decr", "pexpire"}  # commandstats counts those too
    assert set(counts) - inside_the_script <= {"config|resetstat", "info", "hello", "client|setinfo"}, counts


async def test_idle_connections_outlive_a_redis_restart(redis_server: RedisServer, tmp_path: Path) -> None:
    """A connection idle in the store's list while the server restarted fails on its next command;
    the command is sent once more on a new connection, so no call fails closed for it."""
    async with _host(tmp_path, redis_server.url) as host:
        await asyncio.gather(*(host.call("quick", {}) for _ in range(4)))  # several idle connections
        redis_server.stop()
        redis_server.start()
        results = [await host.call("quick", {}) for _ in range(3)]
    assert all(result.success for result in results), [result.error for result in results]


async def test_a_flushed_script_cache_is_filled_again(redis_server: RedisServer, tmp_path: Path) -> None:
    async with _host(tmp_path, redis_server.url) as host:
        assert (await host.call("quick", {})).success
        await _command_counts(redis_server.url, "SCRIPT", "FLUSH")
        assert (await host.call("quick", {})).success
        rows = await _store(host).status()
    assert [row["value"] for row in rows if row["key"].startswith("rate:quick@")] == [2.0]


async def test_a_cancelled_or_late_command_leaves_no_reply_for_the_next(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    """SIGSTOP: one call is cancelled by its caller (the cancellation propagates as such), one
    runs past its deadline (fails closed in time); after SIGCONT their replies must not be read
    as the answers to later commands: every later decision sees its own count."""
    async with _host(tmp_path, redis_server.url, timeout_ms=2000) as host:
        assert (await host.call("quick", {})).success
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            cancelled = asyncio.ensure_future(host.call("quick", {}))
            await asyncio.sleep(0.1)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            begun = time.monotonic()
            late = await host.call("quick", {}, context=ToolContext().with_timeout(0.1))
            assert late.error is not None and late.error["code"] == "policy_store_unavailable"
            assert time.monotonic() - begun < 0.5
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        store = _store(host)
        await asyncio.sleep(0.2)  # the stopped server now runs the two commands it had received
        counts = [await store.take("rate:probe", 60.0, 1000) for _ in range(3)]
        assert all(out >= 0 for out in counts)  # taken (the window), not -1 - ms to the next
        rows = await store.status()
    assert [row["value"] for row in rows if row["key"].startswith("rate:probe@")] == [3.0]


QUEUED_INTERVAL_MS = 300


class Queued:
    spec = ToolSpec(name="queued", description="queued", effect="Pure", policies={
        "rate_limit": {"limit": 1, "interval_ms": QUEUED_INTERVAL_MS, "queue": True}, "timeout_ms": 5000})
    name, description = "queued", "queued"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


async def at_a_window_start(interval_ms: int) -> None:
    """Sleep until a rate-limit window of ``interval_ms`` has just begun. Windows are fixed,
    counted from the epoch on the wall clock (SQLite's and Redis's ``TIME``, the same clock
    here), so two calls back to back fall in one window unless the first came at its very end
    (found by CI: now and then the second call had a fresh window and did not wait)."""
    now_ms = time.time() * 1000
    await asyncio.sleep((interval_ms - now_ms % interval_ms + 5) / 1000)


async def test_a_lone_sqlite_rate_limit_is_decided_inside_tool_pre(tmp_path: Path) -> None:
    """No coroutine for the host to await: SQLite never suspends. A call that must wait for the
    next window still takes the coroutine path, and waits."""
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite"}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick(), Queued())], builtins=["policy"],
                        entry_points=False, discover=False, working_dir=tmp_path / "work") as host:
        plugin: Any = host.plugin_manager.get_plugin("policy")
        quick = next(spec for spec in host.specs if spec.name == "quick")
        assert plugin.tool_pre(ToolCall("c1", "quick", {}), quick, ToolContext()) is None
        await at_a_window_start(QUEUED_INTERVAL_MS)
        assert (await host.call("queued", {})).success
        second = await host.call("queued", {})
        assert second.success
        assert any(step.get("action") == "waited" for step in second.metadata["trail"])


class Watched:
    """A lone rate limit; each run notes what the policy plugin holds while it runs."""

    spec = ToolSpec(name="watched", description="watched", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 60000}})
    name, description = "watched", "watched"

    def __init__(self) -> None:
        self.plugin: Any = None
        self.held: list[dict[str, int]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.held.append(self.plugin.held_resources())
        return ToolResult(output="done")


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_a_call_with_a_lone_rate_limit_is_tracked_nowhere(kind: str, tmp_path: Path,
                                                                 request: pytest.FixtureRequest) -> None:
    """A spent rate-limit token holds nothing to release, so the plugin registers no such call
    (no record per call for ``tool_complete`` to find and settle for nothing) — in every store."""
    store = request.getfixturevalue("redis_server").url if kind == "redis" else kind
    (tmp_path / "work").mkdir()
    tool = Watched()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        tool.plugin = host.plugin_manager.get_plugin("policy")
        for _ in range(3):
            assert (await host.call("watched", {})).success
        assert tool.plugin.held_resources()["calls"] == 0
    assert [held["calls"] for held in tool.held] == [0, 0, 0]


async def test_a_lone_redis_rate_limit_waits_for_the_next_window(redis_server: RedisServer,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": redis_server.url}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Queued())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        await at_a_window_start(QUEUED_INTERVAL_MS)
        assert (await host.call("queued", {})).success
        second = await host.call("queued", {})
        assert second.success
        assert any(step.get("action") == "waited" for step in second.metadata["trail"])
        assert host.plugin_manager.get_plugin("policy").held_resources()["calls"] == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_take_answers_one_integer(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A rate-limit step answers one integer, the same in every store: the window when a unit was
    taken, else -1 - the whole milliseconds until the next window (rounded up, so a caller that
    sleeps that long is past the window's edge)."""
    from amplifier_tools.builtins.policy.store import next_window, open_store

    url = request.getfixturevalue("redis_server").url if kind == "redis" else kind
    store = open_store(url, "t:", 1.0, tmp_path / "state")
    try:
        first = await store.take("rate:t", 3600.0, 1)
        second = await store.take("rate:t", 3600.0, 1)
    finally:
        await store.close()
    assert type(first) is int and first == int(time.time() // 3600)
    assert type(second) is int and second < 0
    assert next_window(second) == pytest.approx((first + 1) * 3600 - time.time(), abs=0.5)
