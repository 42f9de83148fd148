"""The Redis store when a command ran on the server and only its reply was lost.

``RedisLink`` sends a command once more when it failed with a connection error on a connection
that had been idle (the server restarted, a link dropped). If the first send had already run,
the command runs twice. These tests lose exactly one reply, after the server ran the command,
through a proxy between the store and a real Redis server, and check that no command whose
second run admits more is run twice (a give-back), and that a claim sent twice is still its
sender's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer

from amplifier_tools.builtins.policy.store import StoreUnavailable, open_store


class ReplyDropper:
    """A TCP proxy to Redis on 127.0.0.1 that, once armed, closes the client's connection instead
    of passing on the next reply: the server ran the command, its sender never hears of it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.armed = False
        self.dropped = 0
        self.server: asyncio.Server | None = None
        self.sides: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.sides += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while data := await source.read(65536):
                    if replies and self.armed:
                        self.armed = False
                        self.dropped += 1
                        break  # the reply is lost: close the client's side
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for side in (writer, up_writer):
                    side.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for side in self.sides:
            side.close()
        await asyncio.sleep(0.05)  # the pipes see their ends and return


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
        proxy.armed = True  # the give-back runs on the server; its reply never comes back
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
        proxy.armed = True
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
        proxy.armed = True
        state, _, _ = await store.claim("idem:k", "digest-1", "holder-1", 60.0)
        assert proxy.dropped == 1
        assert state == "claimed"
        other, digest, _ = await store.claim("idem:k", "digest-1", "holder-2", 60.0)
        assert (other, digest) == ("running", "digest-1")  # another holder still waits for it
    finally:
        await store.close()
        await proxy.close()
