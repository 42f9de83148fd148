"""The Redis store's connections are capped and trimmed. Found by test: 3,000 concurrent calls of a
rate-limited tool opened 3,000 connections, and opening them kept the loop so busy that 2,590
calls ran out of the store timeout (``policy_store_unavailable``); a burst's connections then
stayed open for the host's life."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import ToolsPlugin
from redis_server import RedisServer

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import redis_link
from amplifier_tools.builtins.policy.redis_link import DEFAULT_MAX_CONNECTIONS, pack
from amplifier_tools.builtins.policy.store import StoreUnavailable, open_store


class Limited:
    spec = ToolSpec(name="limited", description="Rate limited.", effect="Pure",
                    policies={"rate_limit": {"limit": 100_000, "interval_ms": 60_000}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0.01)
        return ToolResult(output="ok")


def _host(tmp_path: Path, url: str, timeout_ms: float = 20_000) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": url, "store_timeout_ms": timeout_ms}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(Limited())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


def _accepted(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


@pytest.mark.parametrize(("query", "cap"), [("", DEFAULT_MAX_CONNECTIONS), ("?max_connections=4", 4)])
async def test_a_burst_of_calls_opens_at_most_the_cap_and_every_call_is_decided(
        redis_server: RedisServer, tmp_path: Path, query: str, cap: int) -> None:
    client = redis.Redis(port=redis_server.port)
    try:
        async with _host(tmp_path, redis_server.url + query) as host:
            before = _accepted(client)
            results = await asyncio.gather(*(host.call("limited", {}) for _ in range(600)))
            opened = _accepted(client) - before
        assert [r.error for r in results if not r.success] == []
        assert 1 <= opened <= cap, opened  # before: one connection per call in flight (600)
    finally:
        client.close()


async def test_connections_left_idle_are_closed(redis_server: RedisServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_link, "IDLE_S", 0.3)
    client = redis.Redis(port=redis_server.port)
    store = open_store(redis_server.url, "t:", 5.0, tmp_path / "state")
    try:
        await asyncio.gather(*(store.link.command(pack("PING")) for _ in range(20)))
        assert len(store.link._all) == 20
        await asyncio.sleep(1.0)  # at most two trims: every connection went unused
        assert len(store.link._all) == 0
        assert int(client.info("clients")["connected_clients"]) == 1  # this test's own
        assert await store.link.command(pack("PING")) == b"PONG"  # a new connection when needed
        # One in steady use stays open: a command every 0.1 s, through two trims.
        for _ in range(8):
            assert await store.link.command(pack("PING")) == b"PONG"
            await asyncio.sleep(0.1)
        assert len(store.link._all) == 1
    finally:
        await store.close()
        client.close()


async def test_a_waiter_cancelled_or_timed_out_passes_its_turn_on(redis_server: RedisServer,
                                                                  tmp_path: Path) -> None:
    store = open_store(redis_server.url + "?max_connections=1", "t:", 5.0, tmp_path / "state")
    link = store.link
    try:
        holder = asyncio.create_task(link.command(pack("BLPOP", "nothing", "0.5")))  # holds the one connection
        await asyncio.sleep(0.1)
        cancelled = asyncio.create_task(link.command(pack("PING")))
        await asyncio.sleep(0.01)
        link.wait = 0.2  # read as the next command starts
        timed_out = asyncio.create_task(link.command(pack("PING")))
        await asyncio.sleep(0.01)
        waiting = asyncio.create_task(link.command(pack("PING")))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        with pytest.raises(StoreUnavailable, match="did not answer within 0.2 s"):
            await timed_out
        assert await holder is None and await waiting == b"PONG"
        assert cancelled.cancelled()
        assert len(link._all) == 1 and not [w for w in link._waiters if not w.done()]
    finally:
        await store.close()


async def test_a_dropped_connection_makes_room_for_a_waiter(redis_server: RedisServer, tmp_path: Path) -> None:
    store = open_store(redis_server.url + "?max_connections=1", "t:", 5.0, tmp_path / "state")
    link = store.link
    try:
        link.wait = 0.2
        holder = asyncio.create_task(link.command(pack("BLPOP", "nothing", "5")))  # cut at 0.2 s: dropped
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(link.command(pack("PING")))
        with pytest.raises(StoreUnavailable):
            await holder
        assert await waiting == b"PONG" and len(link._all) == 1
    finally:
        await store.close()


async def test_closing_the_store_fails_its_waiters_instead_of_leaving_them(redis_server: RedisServer,
                                                                           tmp_path: Path) -> None:
    store = open_store(redis_server.url + "?max_connections=1", "t:", 5.0, tmp_path / "state")
    holder = asyncio.create_task(store.link.command(pack("BLPOP", "nothing", "1")))
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(store.link.command(pack("PING")))
    await asyncio.sleep(0.05)
    await store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await asyncio.wait_for(waiting, 2)
    await asyncio.gather(holder, return_exceptions=True)


async def test_commands_in_flight_at_close_leave_no_connection_nor_timer(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    # Found by attack: commands started as the store closed made new connections after close()
    # (and a connection given back after close() armed the idle trimmer again): sockets left open.
    client = redis.Redis(port=redis_server.port)
    try:
        for spins in range(6):
            store = open_store(redis_server.url + "?max_connections=2", "t:", 5.0, tmp_path / "state")
            link = store.link
            await asyncio.gather(*(link.command(pack("PING")) for _ in range(2)))
            tasks = [asyncio.create_task(link.command(pack("PING"))) for _ in range(30)]
            for _ in range(spins):
                await asyncio.sleep(0)
            await store.close()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.05)  # disconnections under way end
            assert (link._all, link._idle, link._trimmer) == (set(), [], None), spins
            assert int(client.info("clients")["connected_clients"]) == 1, spins  # this test's own
    finally:
        client.close()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0?max_connections=0", "redis://h:1/0?max_connections=-1",
                                 "unix:///tmp/redis.sock?db=0&max_connections=0"])
def test_a_cap_of_no_connection_is_refused(url: str) -> None:
    """Found by attack: ``max_connections=0`` was read by redis-py as 100 (not the cap it says, nor
    the default 32), and ``-1`` failed the mount with a bare ``ValueError``."""
    from amplifier_tools import ConfigError

    with pytest.raises(ConfigError) as caught:
        open_store(url, "t:", 1.0, None)
    assert caught.value.key == "plugins.policy.store" and "max_connections" in str(caught.value)
