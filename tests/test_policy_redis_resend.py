"""The Redis store when a command ran on the server and only its reply was lost.

``RedisLink`` sends a command once more when it failed with a connection error on a connection
that had been idle (the server restarted, a link dropped). If the first send had already run,
the command runs twice. These tests lose exactly one reply, after the server ran the command,
through a proxy between the store and a real Redis server, and check that no command whose
second run admits more is run twice (a give-back), and that a claim sent twice is still its
sender's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis_proxy import ReplyDropper
from redis_server import RedisServer

from amplifier_tools.builtins.policy.store import StoreUnavailable, open_store


async def _store(redis_server: RedisServer, tmp_path: Path) -> tuple[Any, ReplyDropper]:
    proxy = ReplyDropper(redis_server.port)
    url = await proxy.start()
    store = open_store(url, "t:", 2.0, tmp_path / "state")
    # Each script once on other keys: the server knows them, so the lost reply is the command's
    # own, not a NOSCRIPT that would only make the store send the script's text.
    await store.untake("warm", 3600.0, 0)
    await store.settle("warm", 3600.0, 0, "warm", None)
    await store.claim("warm", "warm", "warm", 1.0)
    return store, proxy


async def test_a_give_back_whose_reply_is_lost_is_not_given_back_twice(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    store, proxy = await _store(redis_server, tmp_path)
    try:
        windows = [await store.take("rate:g", 3600.0, 3) for _ in range(3)]
        assert all(window >= 0 for window in windows)
        proxy.armed = 1  # the give-back runs on the server; its reply never comes back
        with pytest.raises(StoreUnavailable, match="Connection closed"):  # reported, not resent
            await store.untake("rate:g", 3600.0, windows[0])
        assert proxy.dropped == 1
        # One unit was given back: one more call is admitted in this window, not two.
        admitted = [await store.take("rate:g", 3600.0, 3) >= 0 for _ in range(3)]
        assert admitted == [True, False, False]
    finally:
        await store.close()
        await proxy.close()


async def test_a_budget_give_back_whose_reply_is_lost_is_not_given_back_twice(redis_server: RedisServer,
                                                                              tmp_path: Path) -> None:
    store, proxy = await _store(redis_server, tmp_path)
    try:
        reserved = [await store.reserve("budget:b", 3600.0, 2, None, None, f"h{i}", 60.0) for i in range(2)]
        assert [outcome for outcome, _, _ in reserved] == ["ok", "ok"]
        proxy.armed = 1
        with pytest.raises(StoreUnavailable):
            await store.settle("budget:b", 3600.0, reserved[0][1], "h0", None)
        assert proxy.dropped == 1
        outcomes = [(await store.reserve("budget:b", 3600.0, 2, None, None, f"n{i}", 60.0))[0] for i in range(2)]
        assert outcomes == ["ok", "calls"]  # one call back, not two
    finally:
        await store.close()
        await proxy.close()


async def test_a_claim_whose_reply_is_lost_is_still_its_senders(redis_server: RedisServer, tmp_path: Path) -> None:
    """Resent, the claim used to find its own record and answer "running": the call then waited
    for itself until its deadline and was refused as still running."""
    store, proxy = await _store(redis_server, tmp_path)
    try:
        await store.ping()  # an idle connection, which is what gets resent on
        proxy.armed = 1
        state, _, _ = await store.claim("idem:k", "digest-1", "holder-1", 60.0)
        assert proxy.dropped == 1
        assert state == "claimed"
        other, digest, _ = await store.claim("idem:k", "digest-1", "holder-2", 60.0)
        assert (other, digest) == ("running", "digest-1")  # another holder still waits for it
    finally:
        await store.close()
        await proxy.close()
