"""Attacks on the MCP gateway over Streamable HTTP (session mcp38).

An imported ``url`` server whose answer trickles in (a header line every 0.7 s, never the end of
the headers): httpx's timeouts bound each network read, not the whole answer, so the bounds set on
a POST carrying no request (``NOTIFICATION_READ_TIMEOUT_S``) and on the DELETE that ends a session
(``SESSION_END_TIMEOUT_S``) never ran out. Found by attack: a server trickling the answer to a
timed-out call's ``notifications/cancelled`` held the session's writer for good (every later call
ended at its deadline, the session never taken for dead), and one trickling the DELETE's answer
held the host's close for ``close_bound()`` (10 s) instead of 2 s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import Completions, audited_import, call_records
from test_mcp_http_import_attack import read_request

from amplifier_tools.mcp import client

TOOL = {"name": "echo", "description": "echo",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}


class Trickling:
    """An MCP server over HTTP/1.1 on 127.0.0.1: ``initialize``, ``tools/list`` and ``tools/call``
    of ``echo`` answered as JSON; a call of the text ``stall`` never answered; requests of a kind in
    ``trickle`` (``notifications/cancelled``, ``DELETE``) answered with a status line and then a
    header line every 0.7 s, for ever. ``seen`` keeps each request's kind."""

    def __init__(self, trickle: set[str]) -> None:
        self.trickle = trickle
        self.seen: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/mcp"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while (request := await read_request(reader)) is not None:
                method, _, message = request
                kind = message.get("method", "response") if isinstance(message, dict) else method
                self.seen.append(kind)
                if kind in self.trickle:
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                    while True:
                        await writer.drain()
                        await asyncio.sleep(0.7)
                        writer.write(b"x-slow: 1\r\n")
                if kind == "tools/call" and message["params"]["arguments"].get("text") == "stall":
                    await asyncio.Event().wait()
                status, extra, payload = (200 if method == "DELETE" else 405 if method != "POST" else 202), {}, b""
                if isinstance(message, dict) and "id" in message and "method" in message:
                    status, extra = 200, {"content-type": "application/json"}
                    if kind == "initialize":
                        extra["mcp-session-id"] = f"s{self.seen.count('initialize')}"
                        result: Any = {"protocolVersion": message["params"]["protocolVersion"],
                                       "capabilities": {"tools": {}},
                                       "serverInfo": {"name": "trickling", "version": "1.0.0"}}
                    elif kind == "tools/list":
                        result = {"tools": [TOOL]}
                    else:
                        result = {"content": [{"type": "text", "text": message["params"]["arguments"]["text"]}]}
                    payload = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
                head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(payload)}\r\n"
                head += "".join(f"{name}: {value}\r\n" for name, value in extra.items())
                writer.write(head.encode() + b"\r\n" + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()


@contextlib.asynccontextmanager
async def trickling(*kinds: str) -> AsyncIterator[tuple[Trickling, str]]:
    server = Trickling(set(kinds))
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.close()


async def test_a_cancellation_answered_a_header_at_a_time_does_not_hold_the_session_for_good(
        tmp_path: Path) -> None:
    """The bound on a POST without a request (``NOTIFICATION_READ_TIMEOUT_S``) was httpx's read
    timeout, which each trickled header line restarted: the session's writer waited on the
    cancellation's answer for ever, and every later call ended at its deadline (``timeout``), the
    server never taken for dead. As with a server that never answers it: the first call after the
    bound fails retryable or succeeds, and the next ones succeed."""
    completions = Completions()
    async with trickling("notifications/cancelled") as (server, url):
        host = audited_import(tmp_path, {"s": {"url": url, "timeout_ms": 500}}, completions)
        async with host:
            first = await host.call("mcp::s::echo", {"text": "stall"})
            assert first.error is not None and first.error["code"] == "timeout", first.error
            await asyncio.sleep(client.NOTIFICATION_READ_TIMEOUT_S + 1.0)
            assert "notifications/cancelled" in server.seen
            again = await host.call("mcp::s::echo", {"text": "n0"})
            assert again.output == "n0" or (again.error is not None and again.error["code"] == "mcp_server_died"
                                            and again.error["retryable"]), again.error
            later = [await host.call("mcp::s::echo", {"text": f"n{i}"}) for i in range(1, 3)]
            assert [r.output for r in later] == ["n1", "n2"], [r.error for r in later]
    # each call ended once, with one record
    assert [r["call_id"] for r in call_records(tmp_path)] == [call_id for call_id, _ in completions.calls]


async def test_a_session_end_answered_a_header_at_a_time_does_not_hold_the_close(tmp_path: Path) -> None:
    """``SESSION_END_TIMEOUT_S`` (2 s) bounds the DELETE only per network read: a server trickling
    its answer held the host's close until ``close_bound()`` cut the run (10 s)."""
    async with trickling("DELETE") as (server, url):
        host = audited_import(tmp_path, {"s": {"url": url}})
        await host.start()
        assert (await host.call("mcp::s::echo", {"text": "hi"})).output == "hi"
        started = time.monotonic()
        await host.close()
        took = time.monotonic() - started
        assert "DELETE" in server.seen
    assert took < client.SESSION_END_TIMEOUT_S + 2.0, took


def test_a_progress_too_large_for_a_float_is_no_number() -> None:
    """``_number`` promises a finite float or None; an int past the float range raised
    ``OverflowError`` (``math.isfinite``), so a tool reporting such progress made serve-mcp's
    ``tool:progress`` handler fail with a traceback in the log instead of ignoring it."""
    from amplifier_tools.mcp.server import _number

    assert _number(10 ** 400) is None
    assert _number(-(10 ** 400)) is None
    assert _number(3) == 3.0


async def test_a_connection_that_never_finishes_its_request_head_is_not_held_for_ever(tmp_path: Path,
                                                                                       monkeypatch: Any) -> None:
    """Found by attack, before any token is checked: uvicorn (h11) has no timeout for a request
    head, so a connection that sends ``POST /mcp HTTP/1.1`` and one header, and nothing more, is
    held open for ever (``timeout_keep_alive`` only runs between requests). Enough of them take
    every file descriptor the server has: run under ``ulimit -n 256``, 300 such connections from a
    client without a token made the accept loop fail (``EMFILE``) and a client with a valid token
    got no answer at all (its ``initialize`` read timed out) until the attacker let go."""
    import socket

    from mcp_helpers import served_http

    token = "alice-token-0123456789abcdef"
    monkeypatch.setenv("TEST_MCP38_TOKEN", token)
    (tmp_path / "work").mkdir()
    cfg = {"working_dir": str(tmp_path / "work"), "state_dir": str(tmp_path / "state"),
           "secrets": {"alice": "TEST_MCP38_TOKEN"},
           "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                       "mcp": {"serve": {"transport": "streamable-http", "host": "127.0.0.1", "port": 0,
                                         "tools": ["local::fs.list_dir"],
                                         "clients": [{"token_ref": "alice", "principal": "alice"}]}}}}
    async with served_http(cfg) as url:
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        try:
            for sock in held:
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                sock.setblocking(False)
            await asyncio.sleep(15)  # three times uvicorn's keep-alive timeout
            still_open = 0
            for sock in held:
                try:
                    if sock.recv(1024):
                        continue  # an answer (408/400) is as good as closing
                except BlockingIOError:
                    still_open += 1
                except ConnectionError:
                    pass
        finally:
            for sock in held:
                sock.close()
    assert still_open == 0, f"{still_open} connections with half a request head still held after 15 s"


async def test_the_whole_answer_wrapper_enters_and_exits_the_transports_it_wraps() -> None:
    """Found by review: ``whole_answer_timeouts`` put ``WholeAnswerTimeout`` in front of the
    client's transports, whose ``__aenter__``/``__aexit__`` (``AsyncBaseTransport``'s) did not pass
    them on: ``async with client`` no longer entered the transports (a no-op for httpcore's pool
    today, not for a transport that sets itself up there)."""
    import httpx2

    seen: list[str] = []

    class Recording(httpx2.AsyncBaseTransport):
        async def __aenter__(self) -> Recording:
            seen.append("enter")
            return self

        async def __aexit__(self, *exc_info: Any) -> None:
            seen.append("exit")

        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(202, request=request)

    http = httpx2.AsyncClient(transport=Recording())
    client.whole_answer_timeouts(http)
    async with http:
        assert seen == ["enter"]
        response = await http.post("http://127.0.0.1:9/mcp", content=b"{}",
                                   extensions={client.WHOLE_ANSWER_TIMEOUT: 1.0})
        assert response.status_code == 202
    assert seen == ["enter", "exit"]
