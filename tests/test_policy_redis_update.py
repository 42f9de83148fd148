"""The Redis store's read-decide-write (``update``: a breaker's state, shared by every host).

It runs as a check-and-set transaction on the store's own connections: ``WATCH``, ``GET`` and
``TIME`` in one round trip, ``MULTI``, ``SET`` and ``EXEC`` in the next. Checked here against a
real Redis server: concurrent writers from two stores each count once; a lost reply before the
write is sent again, a lost reply to the write is not (deciding again would count it twice).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from redis_proxy import ReplyDropper
from redis_server import RedisServer

from amplifier_tools.builtins.policy.store import StoreUnavailable, open_store


def _increment(data: Any, now: float) -> tuple[Any, Any]:
    count = (data or {"count": 0})["count"] + 1
    return {"count": count, "at": now}, count


async def test_concurrent_updates_from_two_hosts_each_count_once(redis_server: RedisServer, tmp_path: Path) -> None:
    stores = [open_store(redis_server.url, "t:", 5.0, tmp_path / "state") for _ in range(2)]
    try:
        answers = await asyncio.gather(*(store.update("breaker:x", _increment, 60.0)
                                         for _ in range(40) for store in stores))
        assert sorted(answers) == list(range(1, 81))  # each decided on the value before it
        assert (await stores[0].get("breaker:x"))["count"] == 80
    finally:
        for store in stores:
            await store.close()


async def test_an_update_whose_read_reply_is_lost_is_sent_again(redis_server: RedisServer, tmp_path: Path) -> None:
    proxy = ReplyDropper(redis_server.port)
    store = open_store(await proxy.start(), "t:", 2.0, tmp_path / "state")
    try:
        await store.ping()  # an idle connection, as after a server restart
        proxy.armed = 1  # the reply to WATCH, GET and TIME is lost
        assert await store.update("breaker:r", _increment, 60.0) == 1
        assert proxy.dropped == 1
        assert (await store.get("breaker:r"))["count"] == 1
    finally:
        await store.close()
        await proxy.close()


async def test_an_update_whose_write_reply_is_lost_is_not_decided_again(redis_server: RedisServer,
                                                                        tmp_path: Path) -> None:
    """The write ran on the server; sent again, a breaker's failure would count twice."""
    proxy = ReplyDropper(redis_server.port)
    store = open_store(await proxy.start(), "t:", 2.0, tmp_path / "state")
    decided = 0

    def lose_the_write_reply(data: Any, now: float) -> tuple[Any, Any]:
        nonlocal decided
        decided += 1
        proxy.armed = 1  # the next reply, the write's, is lost
        return _increment(data, now)

    try:
        await store.ping()
        with pytest.raises(StoreUnavailable):
            await store.update("breaker:w", lose_the_write_reply, 60.0)
        assert decided == 1 and proxy.dropped == 1
        assert (await store.get("breaker:w"))["count"] == 1  # it ran once
    finally:
        await store.close()
        await proxy.close()


async def test_a_decision_that_fails_writes_nothing_and_the_store_goes_on(redis_server: RedisServer,
                                                                          tmp_path: Path) -> None:
    store = open_store(redis_server.url, "t:", 2.0, tmp_path / "state")

    def refuse(data: Any, now: float) -> tuple[Any, Any]:
        raise ValueError("no")

    try:
        await store.update("breaker:f", _increment, 60.0)
        with pytest.raises(ValueError):
            await store.update("breaker:f", refuse, 60.0)
        assert (await store.get("breaker:f"))["count"] == 1
        assert await store.update("breaker:f", _increment, 60.0) == 2
    finally:
        await store.close()
