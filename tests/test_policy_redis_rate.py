"""The Redis store's rate limit at its edges: one ``TAKE`` script per unit, decided on the server.

Kept from an experiment that replaced the script with ``INCR`` + ``PEXPIRE`` and windows counted on
the host's reading of the server's clock (reverted: two attacks found that any stall while a host
read the clock, or a reply that came back after its window's edge, let two hosts admit twice the
limit; docs/policy.md). What the script must keep, and these tests check: a refused unit leaves
the counter at the units taken; a script the server runs after its caller gave up (cancelled,
its reply never read) still gives a key it made its expiry; no counter key is left without one;
a refusal answered late is never read as a unit taken.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer

from amplifier_tools.builtins.policy.store import not_taken, open_store


def _client(url: str) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(url)


def _signal(server: RedisServer, sig: signal.Signals) -> None:
    assert server.process is not None
    os.kill(server.process.pid, sig)


def test_a_refusal_is_never_read_as_a_window_whatever_the_clock_said() -> None:
    """``not_taken`` of a time already past (a window that ended while the answer was on its
    way) is still a refusal: ``-1 - ceil(negative)`` was ≥ 0, which reads as "taken"."""
    assert not_taken(-0.5) == -1 and not_taken(0.0) == -1 and not_taken(0.0101) == -12


async def test_a_refused_unit_is_given_back_so_the_counter_holds_what_was_taken(redis_server: RedisServer,
                                                                                tmp_path: Path) -> None:
    store = open_store(redis_server.url, "t:", 1.0, tmp_path / "state")
    try:
        outs = [await store.take("rate:r", 3600.0, 3) for _ in range(8)]
        assert [out >= 0 for out in outs] == [True] * 3 + [False] * 5
        rows = await store.status()
        assert [row["value"] for row in rows if row["key"].startswith("rate:r@")] == [3.0]
        await store.untake("rate:r", 3600.0, outs[0])
        assert [await store.take("rate:r", 3600.0, 3) >= 0 for _ in range(3)] == [True, False, False]
    finally:
        await store.close()


async def test_a_unit_whose_reply_nobody_reads_still_brings_its_expiry(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    """The server stopped, the call cancelled, the key gone meanwhile: when the server resumes it
    runs the script nobody waits for, which makes the key anew — with its expiry."""
    store = open_store(redis_server.url, "t:", 1.0, tmp_path / "state")
    client = _client(redis_server.url)
    try:
        window = await store.take("rate:c", 3600.0, 10)
        key = f"t:rate:c@{window}"
        await client.delete(key)
        _signal(redis_server, signal.SIGSTOP)
        try:
            call = asyncio.ensure_future(store.take("rate:c", 3600.0, 10))
            await asyncio.sleep(0.1)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        finally:
            _signal(redis_server, signal.SIGCONT)
        await asyncio.sleep(0.2)
        assert await client.get(key) == b"1"  # the server ran the script nobody waited for
        assert 0 < await client.pttl(key)
    finally:
        await client.aclose()
        await store.close()


async def test_every_counter_key_expires(redis_server: RedisServer, tmp_path: Path) -> None:
    """Admitted, refused, given back, vanished and made anew: no key without an expiry."""
    store = open_store(redis_server.url, "t:", 1.0, tmp_path / "state")
    client = _client(redis_server.url)
    try:
        for round_ in range(3):
            outs = [await store.take(f"rate:e{i}", 0.2, 2) for i in range(3) for _ in range(4)]
            assert sum(out >= 0 for out in outs) >= 6, outs
            if round_ == 1:
                await client.flushdb()
                assert await store.take("rate:e0", 0.2, 2) >= 0  # made anew
            await asyncio.sleep(0.25)  # the next window
        keys = [key async for key in client.scan_iter(match="t:*")]
        ttls = [await client.pttl(key) for key in keys]
        assert keys and all(ttl > 0 for ttl in ttls), ttls
    finally:
        await client.aclose()
        await store.close()
