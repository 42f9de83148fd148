"""Found by attack: a lease or idempotency claim the store granted, whose reply never came back
(the command timed out, or the call was cancelled during the round trip), was not given back: the
slot stayed taken fleet-wide for the lease's TTL, the key answered "still running" until the claim
expired. A SQLite file the host cannot open (a read-only file system, no permission) failed every
call as hook_failed instead of as the store being down; a foreign string under the Redis prefix
made ``status`` (``policy status``) raise."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin
from redis_proxy import ReplyDropper
from redis_server import RedisServer

from amplifier_tools import ToolContext, ToolHost, ToolResult, ToolSpec


class Capped:
    spec = ToolSpec(name="capped", description="capped", effect="IdempotentWrite", idempotency_key="optional",
                    policies={"timeout_ms": 30_000, "concurrency": {"limit": 1, "queue": False}})
    name, description = "capped", "capped"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


def _host(tmp_path: Path, url: str, timeout_ms: int) -> ToolHost:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": url, "store_timeout_ms": timeout_ms}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(Capped())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=work)


async def test_a_lease_whose_reply_timed_out_is_given_back(redis_server: RedisServer, tmp_path: Path) -> None:
    proxy = ReplyDropper(redis_server.port)
    url = await proxy.start()
    try:
        async with _host(tmp_path, url, timeout_ms=200) as host:
            assert (await host.call("capped", {})).success  # warm connection
            proxy.delay = 0.4  # the store is slow: the lease is taken, its reply comes too late
            slow = await host.call("capped", {})
            assert slow.error is not None and slow.error["code"] == "policy_store_unavailable", slow.error
            proxy.delay = 0.0
            await asyncio.sleep(1.0)  # the store answers promptly again; background give-backs done
            again = await host.call("capped", {})
            assert again.success, again.error  # saw: concurrency_limited for the lease TTL (32 s)
    finally:
        await proxy.close()


async def test_a_lease_whose_call_was_cancelled_mid_round_trip_is_given_back(redis_server: RedisServer,
                                                                             tmp_path: Path) -> None:
    proxy = ReplyDropper(redis_server.port)
    url = await proxy.start()
    try:
        async with _host(tmp_path, url, timeout_ms=2000) as host:
            assert (await host.call("capped", {})).success
            proxy.delay = 0.3
            task = asyncio.ensure_future(host.call("capped", {}))
            await asyncio.sleep(0.15)  # the lease command is at the server, its reply on the way
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            proxy.delay = 0.0
            await asyncio.sleep(1.0)
            again = await host.call("capped", {})
            assert again.success, again.error
    finally:
        await proxy.close()


async def test_a_claim_whose_reply_timed_out_is_freed(redis_server: RedisServer, tmp_path: Path) -> None:
    proxy = ReplyDropper(redis_server.port)
    url = await proxy.start()
    try:
        async with _host(tmp_path, url, timeout_ms=200) as host:
            assert (await host.call("capped", {}, context=ToolContext(idempotency_key="warm"))).success
            proxy.delay = 0.4
            slow = await host.call("capped", {}, context=ToolContext(idempotency_key="k"))
            assert slow.error is not None and slow.error["code"] == "policy_store_unavailable", slow.error
            proxy.delay = 0.0
            await asyncio.sleep(1.0)
            again = await host.call("capped", {}, context=ToolContext(idempotency_key="k",
                                                                      deadline=time.monotonic() + 3))
            assert again.success, again.error  # saw: idempotency_in_progress until the claim expires (62 s)
    finally:
        await proxy.close()


class Quick:
    spec = ToolSpec(name="quick", description="quick", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 1000}, "concurrency": {"limit": 2}})
    name, description = "quick", "quick"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


@pytest.mark.parametrize("mode", ["fail", "local"])
@pytest.mark.parametrize("tool", ["quick", "rated"])
async def test_a_sqlite_file_that_cannot_be_opened_is_the_store_being_down(mode: str, tool: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from amplifier_tools.builtins.policy import sqlite_store

    def read_only(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.EROFS, "Read-only file system", "policy.sqlite3")

    monkeypatch.setattr(sqlite_store, "open_host_file", read_only)
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": "sqlite", "store_unavailable": mode}}}

    class Rated(Quick):
        spec = ToolSpec(name="rated", description="rated", effect="Pure",
                        policies={"rate_limit": {"limit": 1000, "interval_ms": 1000}})
        name = "rated"

    async with ToolHost(config=config, plugins=[ToolsPlugin(Quick(), Rated())], builtins=["policy"],
                        entry_points=False, discover=False, working_dir=tmp_path / "work") as host:
        result = await host.call(tool, {})
    if mode == "local":
        assert result.success, result.error
    else:
        assert result.error is not None and result.error["code"] == "policy_store_unavailable", result.error


async def test_status_shows_a_foreign_string_under_the_prefix(redis_server: RedisServer) -> None:
    import redis.asyncio as aioredis

    from amplifier_tools.builtins.policy.store import open_store

    client = aioredis.Redis(port=redis_server.port)
    await client.set("amplifier-tools:note", "not a number")
    await client.aclose()
    store = open_store(redis_server.url, "amplifier-tools:", 2.0, None)
    try:
        rows = await store.status()
    finally:
        await store.close()
    assert [row["value"] for row in rows] == ["not a number"]


async def test_status_shows_hostile_rows_of_the_sqlite_store(tmp_path: Path) -> None:
    """Found by attack: a row written by hand into the SQLite store (a record that is not JSON, an
    expiry that is text) made ``status`` (``policy status``) raise instead of listing it."""
    import sqlite3

    from amplifier_tools.builtins.policy.store import open_store

    store = open_store("sqlite", "amplifier-tools:", 2.0, tmp_path)
    try:
        assert await store.status() == []  # creates the database
        with sqlite3.connect(tmp_path / "policy.sqlite3") as db:
            db.execute("INSERT INTO blobs VALUES ('amplifier-tools:breaker:x', 'not json', 1e12)")
            db.execute("INSERT INTO counters VALUES ('amplifier-tools:rate:y', 3, 'soon')")
        rows = {row["key"]: row for row in await store.status()}
    finally:
        await store.close()
    assert rows["breaker:x"]["value"] == "not json" and rows["breaker:x"]["expires_in"] > 0
    assert rows["rate:y"]["value"] == 3 and rows["rate:y"]["expires_in"] is None
