"""The Redis store under attack (breaker updates, lost replies, foreign records): what was found.

- A lease or a time-budget reservation whose reply was lost, sent once more by ``RedisLink`` on a
  new connection, found its own first run in the store and counted it against itself: the lease
  was refused (with ``limit = 1`` a queued call waited on its own slot until its wait ran out) and
  the reservation answered "reserved by calls in flight"; neither was given back, so the slot or
  the seconds were held fleet-wide for the entry's whole TTL. A holder's own live entry is now
  its answer.
- Many concurrent breaker updates of one key from one host (a tool failing under load: every
  call records its failure) raced each other through ``WATCH``: each round only one of them
  wrote, the rest read again, so the work grew with the square of their number and most ran out
  of their store timeout (400 at once: 33 recorded within 2 s). A host now sends the updates of
  one key one after another; only other hosts' writes make one decide again.
- A breaker record that is not one this version wrote (not JSON, another shape: another
  deployment or version writing the key) failed every call of the tool with ``hook_failed``
  (a key of another type: ``policy_store_unavailable``), and nothing ever replaced it. It is
  now read as no record (a closed breaker, logged) and the breaker's next write replaces it;
  the same for a SQLite store's record.
- An update whose idle connection dropped after the ``WATCH``'s ``OK`` but before the rest of
  that reply (the ``GET``, the ``TIME``) was not sent again, though it had written nothing (fixed
  meanwhile by a3a42b2, without a test; the test here loses the reply part-way through a proxy).
- After a failover that turned the old primary into a replica while the store's address came to
  lead to the new primary (DNS, a virtual IP, a proxy), the store kept its idle connections to
  the old one: a ``READONLY`` error is a reply read in full, so each went back to the free list,
  and every call failed ``policy_store_unavailable`` for as long as they lived. A ``READONLY``
  reply (nothing ran) now drops the connection and the idle ones, and the command is sent once
  more on a new connection.
- ``policy status`` escaped only ``*`` of the prefix in its ``SCAN`` pattern: a prefix with ``?``
  or ``[`` listed other deployments' keys, or none of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import ToolsPlugin
from redis_proxy import ReplyDropper
from redis_server import RedisServer

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.store import open_store


async def _proxied(redis_server: RedisServer, tmp_path: Path) -> tuple[Any, ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    store = open_store(await proxy.start(), "t:", 2.0, tmp_path / "state")
    # Each script once, on other keys: the server knows them (the lost reply is the command's own),
    # and the store has an idle connection, whose failure is what makes it resend.
    await store.lease("warm", 1, "warm", 1.0)
    await store.reserve("warm", 3600.0, None, 1.0, 1.0, "warm", 1.0)
    return store, proxy


async def test_a_lease_whose_reply_is_lost_is_its_holders_when_resent(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    store, proxy = await _proxied(redis_server, tmp_path)
    try:
        proxy.armed = 1  # the lease is granted on the server; its reply never comes back
        assert await store.lease("slots:x", 1, "h1", 30.0)  # resent: it finds its own lease
        assert proxy.dropped == 1
        assert not await store.lease("slots:x", 1, "h2", 30.0)  # still one slot, held once
        await store.release("slots:x", "h1")
        assert await store.lease("slots:x", 1, "h2", 30.0)
    finally:
        await store.close()
        await proxy.close()


async def test_a_reservation_whose_reply_is_lost_is_its_holders_when_resent(redis_server: RedisServer,
                                                                            tmp_path: Path) -> None:
    store, proxy = await _proxied(redis_server, tmp_path)
    try:
        proxy.armed = 1  # 10 s of a 10 s budget reserved on the server; the reply is lost
        outcome, window, reserved = await store.reserve("budget:b", 3600.0, None, 10.0, 10.0, "h1", 60.0)
        assert (outcome, reserved) == ("ok", 10.0)  # resent: its own reservation, not "reserved"
        assert proxy.dropped == 1
        await store.settle("budget:b", 3600.0, window, "h1", 1.0)
        outcome, _, reserved = await store.reserve("budget:b", 3600.0, None, 10.0, 10.0, "h2", 60.0)
        assert (outcome, reserved) == ("ok", 9.0)  # 1 s spent, nothing else held
    finally:
        await store.close()
        await proxy.close()


def _increment(data: Any, now: float) -> tuple[Any, Any]:
    count = (data or {"count": 0})["count"] + 1
    return {"count": count}, count


async def test_an_update_whose_link_drops_mid_read_reply_is_sent_again(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    """Only the ``WATCH``'s ``OK`` arrives, then the idle link drops: nothing was written yet."""
    store, proxy = await _proxied(redis_server, tmp_path)
    try:
        proxy.armed, proxy.keep = 1, len(b"+OK\r\n")
        assert await store.update("breaker:m", _increment, 60.0) == 1
        assert proxy.dropped == 1
        assert (await store.get("breaker:m"))["count"] == 1
    finally:
        await store.close()
        await proxy.close()


async def test_many_concurrent_updates_of_one_key_all_land_within_the_store_timeout(redis_server: RedisServer,
                                                                                   tmp_path: Path) -> None:
    """400 at once from one host, 5 s each: before, most ran out of time (quadratic retries)."""
    store = open_store(redis_server.url, "t:", 5.0, tmp_path / "state")
    try:
        answers = await asyncio.gather(*(store.update("breaker:storm", _increment, 60.0) for _ in range(400)),
                                       return_exceptions=True)
        assert sorted(answers) == list(range(1, 401))  # type: ignore[type-var]
        assert (await store.get("breaker:storm"))["count"] == 400
        assert not store.link._updating  # nothing kept per key once its updates ended
    finally:
        await store.close()


class Failing:
    spec = ToolSpec(name="failing", description="failing", effect="Pure",
                    policies={"timeout_ms": 10_000,
                              "circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 600_000}})
    name, description = "failing", "failing"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        raise RuntimeError("the service behind it is down")


def _host(tmp_path: Path, url: str, *tools: Any) -> ToolHost:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": url, "store_timeout_ms": 5000}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(*tools)], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=work)


FOREIGN = {
    "hash": {"a hash": "of another deployment"}, "not-json": b"not json", "not-utf8": b"\xff",
    "nested-too-deep": b"[" * 100_000, "number": b"5", "empty": b"{}", "list": b"[1, 2]",
    "no-fields": b'{"state": "open"}',
    "a-field-of-another-type": json.dumps({"state": "open", "opened_at": "soon", "probe": None, "tokens": 0,
                                           "outcomes": []}).encode(),
    "an-outcome-of-another-shape": json.dumps({"state": "closed", "opened_at": 0, "probe": None, "tokens": 0,
                                               "outcomes": [[0, True, 1]]}).encode(),
}


@pytest.mark.parametrize("foreign", FOREIGN.values(), ids=FOREIGN.keys())
async def test_a_foreign_breaker_record_is_replaced_not_fatal(redis_server: RedisServer, tmp_path: Path,
                                                              foreign: bytes | dict[str, str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis(port=redis_server.port)
    # No expiry: it would stay for good.
    if isinstance(foreign, dict):
        client.hset("amplifier-tools:breaker:failing", mapping=foreign)  # type: ignore[arg-type]
    else:
        client.set("amplifier-tools:breaker:failing", foreign)
    try:
        with caplog.at_level(logging.WARNING, "amplifier_tools.policy"):
            async with _host(tmp_path, redis_server.url, Failing()) as host:
                codes = []
                for _ in range(3):
                    result = await host.call("failing", {})
                    assert not result.success
                    codes.append(result.error["code"])
        # The tool ran and failed twice (not hook_failed), then its breaker opened.
        assert codes[2] == "circuit_open" and "hook_failed" not in codes, codes
        record = json.loads(client.get("amplifier-tools:breaker:failing") or b"null")
        assert record["state"] == "open"
        assert "not a breaker record" in caplog.text
    finally:
        client.close()


@pytest.mark.parametrize("prefix", ["team?:", "team[ab]:", "team\\:"])
async def test_status_lists_only_the_deployments_own_keys_whatever_its_prefix(redis_server: RedisServer,
                                                                              tmp_path: Path, prefix: str) -> None:
    client = redis.Redis(port=redis_server.port)
    client.set("teamb:rate:other@1", b"3", px=60_000)  # another deployment's, that a glob would match
    client.set(prefix + "rate:own@1", b"1", px=60_000)
    store = open_store(redis_server.url, prefix, 2.0, tmp_path / "state")
    try:
        assert [row["key"] for row in await store.status()] == ["rate:own@1"]
    finally:
        await store.close()
        client.close()


async def test_a_foreign_breaker_record_in_sqlite_is_replaced_not_fatal(tmp_path: Path) -> None:
    """The same in the SQLite store, whose records are read back through the same JSON reader."""
    import sqlite3
    import time

    async with _host(tmp_path, "sqlite", Failing()) as host:
        await host.call("failing", {})  # the file and its tables exist
        with sqlite3.connect(tmp_path / "state" / "policy.sqlite3") as db:
            db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)",
                       ("amplifier-tools:breaker:failing", "not json", time.time() + 3600))
        codes = [(await host.call("failing", {})).error["code"] for _ in range(3)]
    assert codes == ["tool_raised", "tool_raised", "circuit_open"], codes


async def test_a_failover_to_a_new_primary_behind_the_same_address_is_followed(redis_server: RedisServer,
                                                                              tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    new_primary = RedisServer(tmp_path / "b").start()
    old, new = redis.Redis(port=redis_server.port), redis.Redis(port=new_primary.port)
    proxy = ReplyDropper(redis_server.port)  # the store's address: leads to the old primary, for now
    store = open_store(await proxy.start(), "t:", 5.0, tmp_path / "state")
    try:
        # Idle connections to the old primary, for each kind of operation.
        assert await store.take("rate:x", 60.0, 10) >= 0
        assert await store.update("breaker:x", _increment, 60.0) == 1
        new.replicaof("127.0.0.1", redis_server.port)
        for _ in range(500):
            if new.info("replication").get("master_link_status") == "up":
                break
            await asyncio.sleep(0.02)
        # The failover: the replica becomes the primary, the old primary its replica, the address moves.
        new.replicaof("NO", "ONE")
        old.replicaof("127.0.0.1", new_primary.port)
        proxy.port = new_primary.port
        window = await store.take("rate:x", 60.0, 10)  # a READONLY reply: sent again, to the new primary
        assert window >= 0
        taken = int(new.get(f"t:rate:x@{window}") or 0)
        assert taken >= 1
        assert await store.update("breaker:x", _increment, 60.0) >= 1
        assert store.link._idle and all(connection.is_connected for connection in store.link._idle)
        for _ in range(500):  # the old primary, a replica now, has the new one's count
            if int(old.get(f"t:rate:x@{window}") or 0) == taken:
                break
            await asyncio.sleep(0.02)
        new.replicaof("127.0.0.1", redis_server.port)  # and back: a give-back, never resent, reaches it too
        old.replicaof("NO", "ONE")
        proxy.port = redis_server.port
        for _ in range(500):
            if new.info("replication").get("master_link_status") == "up":
                break
            await asyncio.sleep(0.02)
        before = int(old.get(f"t:rate:x@{window}") or 0)
        assert before == taken
        await store.untake("rate:x", 60.0, window)
        assert int(old.get(f"t:rate:x@{window}") or 0) == before - 1
    finally:
        await store.close()
        await proxy.close()
        old.close()
        new.close()
        new_primary.stop()
