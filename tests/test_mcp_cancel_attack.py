"""Attacks on an imported call's cancellation (``mcp.cancels.LetGoCancels``, ``ServerConnection.call_tool``)
with a real SDK server (tests/mcp_fixtures/stall_server.py) over stdio and Streamable HTTP: many calls
cut at once while the server has stopped reading, calls cut by their caller while the host closes, the
server killed or stopped while courtesy ``notifications/cancelled`` are still being written, and a server
that answers a call after the host gave up on it.

Each call must end once, at its deadline (or at once when its caller cancels it), with one
``tool_complete`` and one audit record; nothing is left referenced in ``cancels.PENDING`` once the host
has closed, and asyncio logs nothing ("Task was destroyed but it is pending", "… exception was never
retrieved")."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import FIXTURES, Completions, Kept, audited_import, call_records

from amplifier_tools import ToolHost
from amplifier_tools.mcp import cancels

STALL_SERVER = str(FIXTURES / "stall_server.py")

#: Larger than a pipe's buffer (64 KiB): a few of these fill the pipe of a server that stopped reading.
FILLER = "x" * 200_000


def stalling(tmp_path: Path, *plugins: Any, **server: Any) -> ToolHost:
    """A host importing the stall server over stdio as ``s`` (a call's deadline 1 s unless given)."""
    section = {"command": sys.executable, "args": [STALL_SERVER], "timeout_ms": 1000, **server}
    return audited_import(tmp_path, {"s": section}, *plugins)


@contextmanager
def asyncio_log() -> Iterator[list[str]]:
    """What asyncio logs in the block and at the collections that end it."""
    kept = Kept()
    logging.getLogger("asyncio").addHandler(kept)
    try:
        yield kept.lines
        for _ in range(3):
            gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(kept)


def connection_of(host: ToolHost) -> Any:
    """The host's connection to its one MCP server."""
    plugin = host.plugin_manager.get_plugin("mcp")
    assert plugin is not None
    return plugin.connections[0]


def codes(results: list[Any]) -> list[str | None]:
    return [type(r).__name__ if isinstance(r, BaseException) else (r.error or {}).get("code") for r in results]


async def test_calls_cut_at_their_deadline_while_the_server_stopped_reading_leave_nothing_behind(
        tmp_path: Path) -> None:
    """30 calls at once to a server that has stopped reading (its pipe full of the calls' own
    arguments): every one ends ``timeout`` at its deadline, its courtesy cancel left pending; the
    host's close takes them all (``PENDING`` empty when it returns) and asyncio logs nothing.

    Found by attack on Python 3.10: the close of such a server's stdin, bounded at 0.2 s, outlived
    its bound (the pipe drains only once the server is killed), and the ``BrokenPipeError`` the wait
    ended with was logged as "Task exception was never retrieved" at every such close."""
    completions = Completions()
    with asyncio_log() as logged:
        async with stalling(tmp_path, completions, stop_grace_ms=200) as host:
            started = time.monotonic()
            calls = [host.call("mcp::s::stall", {"seconds": 30})]
            calls += [host.call("mcp::s::echo", {"text": FILLER}) for _ in range(29)]
            results = await asyncio.gather(*calls)
            took = time.monotonic() - started
            assert codes(results) == ["timeout"] * 30
            assert took < 3.5, took  # the deadline is 1 s; the SDK's own bound on a cancel's write is 5 s
            assert cancels.PENDING  # the courtesy cancels wait for a pipe nobody reads
        assert not cancels.PENDING
    assert not logged, logged
    assert len(completions.calls) == 30 and len(call_records(tmp_path)) == 30


async def test_calls_their_caller_cancels_while_the_host_closes_are_each_recorded_once(tmp_path: Path) -> None:
    """The caller cancels its calls (to a server that stopped reading) in the same turn as the host
    begins to close with no grace: each ends once (cancelled), is recorded once, and nothing is
    left pending or logged."""
    completions = Completions()
    with asyncio_log() as logged:
        host = stalling(tmp_path, completions, timeout_ms=20000, stop_grace_ms=200)
        await host.start()
        tasks = [asyncio.ensure_future(host.call("mcp::s::stall", {"seconds": 30}))]
        tasks += [asyncio.ensure_future(host.call("mcp::s::echo", {"text": FILLER})) for _ in range(20)]
        await asyncio.sleep(0.5)  # all sent (or waiting for the full pipe)
        closing = asyncio.ensure_future(host.close(grace_ms=0))
        await asyncio.sleep(0)
        started = time.monotonic()
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert time.monotonic() - started < 1.0
        await closing
        assert not cancels.PENDING
    assert not logged, logged
    assert set(codes(outcomes)) <= {"CancelledError", "host_closing"}, codes(outcomes)
    assert len(completions.calls) == 21 and len(call_records(tmp_path)) == 21


@pytest.mark.slow
async def test_a_server_killed_under_pending_cancellations_lets_them_go_and_is_restarted(tmp_path: Path) -> None:
    """Courtesy cancels pending on a full pipe when the server is SIGKILLed: they end at once (the
    transport is gone), and the next call restarts the server and gets its own answer."""
    with asyncio_log() as logged:
        async with stalling(tmp_path, timeout_ms=20000) as host:
            connection = connection_of(host)
            tasks = [asyncio.ensure_future(host.call("mcp::s::stall", {"seconds": 30}))]
            tasks += [asyncio.ensure_future(host.call("mcp::s::echo", {"text": FILLER})) for _ in range(10)]
            await asyncio.sleep(0.5)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert cancels.PENDING
            assert connection.pid is not None
            os.kill(connection.pid, signal.SIGKILL)
            started = time.monotonic()
            while cancels.PENDING and time.monotonic() - started < 2:
                await asyncio.sleep(0.01)
            assert not cancels.PENDING
            again = await host.call("mcp::s::echo", {"text": "after"})
            assert again.success and again.output == "after", again.error
            assert connection.restarts == 1
    assert not logged, logged


@pytest.mark.slow
async def test_a_stopped_server_holding_pending_cancellations_is_closed_with_them(tmp_path: Path) -> None:
    """A server SIGSTOPped (it reads nothing, and SIGTERM waits for a SIGCONT): the calls end at
    their deadline; the host's close kills it and takes the pending cancels with it."""
    with asyncio_log() as logged:
        async with stalling(tmp_path, stop_grace_ms=200) as host:
            pid = connection_of(host).pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                results = await asyncio.gather(*(host.call("mcp::s::echo", {"text": FILLER}) for _ in range(10)))
            finally:
                closing = time.monotonic()
            assert codes(results) == ["timeout"] * 10
            assert cancels.PENDING
        assert time.monotonic() - closing < 3.0
        assert not cancels.PENDING
    assert not logged, logged


async def test_an_answer_after_the_cancellation_is_not_taken_for_a_later_calls(tmp_path: Path) -> None:
    """The server answers the first call after the host gave up on it (its cancellation still in
    the pipe): that answer goes to nobody; every later call gets its own."""
    async with stalling(tmp_path) as host:
        first = await host.call("mcp::s::stall", {"seconds": 1.3})
        assert first.error is not None and first.error["code"] == "timeout"
        later = await asyncio.gather(*(host.call("mcp::s::echo", {"text": f"n{i}"}) for i in range(10)))
        assert [r.output for r in later] == [f"n{i}" for i in range(10)], [r.error for r in later]


@asynccontextmanager
async def http_stall_server(mode: str = "http") -> AsyncIterator[str]:
    """The stall server over Streamable HTTP in a process of its own (``mode``: ``http`` or
    ``http-deaf``): its endpoint URL."""
    process = subprocess.Popen([sys.executable, STALL_SERVER, mode], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = await asyncio.get_running_loop().run_in_executor(None, process.stdout.readline)
        assert url.startswith("http://"), url
        yield url.strip()
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["deadline", "caller"])
async def test_http_calls_cut_while_the_server_stalls_end_at_once_and_later_calls_get_their_own(
        tmp_path: Path, cut: str) -> None:
    """Over Streamable HTTP, a server whose loop is held: 20 calls cut by their deadline or their
    caller end then; once the server is back, later calls get their own answers (not the stalled
    call's), and the close leaves nothing pending."""
    completions = Completions()
    with asyncio_log() as logged:
        async with http_stall_server() as url:
            host = audited_import(tmp_path, {"s": {"url": url, "timeout_ms": 1000 if cut == "deadline" else 20000}},
                                  completions)
            async with host:
                started = time.monotonic()
                tasks = [asyncio.ensure_future(host.call("mcp::s::stall", {"seconds": 2}))]
                await asyncio.sleep(0.2)
                tasks += [asyncio.ensure_future(host.call("mcp::s::echo", {"text": "x" * 100_000}))
                          for _ in range(19)]
                if cut == "caller":
                    await asyncio.sleep(0.5)
                    for task in tasks:
                        task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
                assert time.monotonic() - started < 3.5
                assert codes(results) == (["timeout"] if cut == "deadline" else ["CancelledError"]) * 20
                await asyncio.sleep(max(0.0, 2.2 - (time.monotonic() - started)))  # the server is back
                later = await asyncio.gather(*(host.call("mcp::s::echo", {"text": f"n{i}"}) for i in range(5)))
                assert [r.output for r in later] == [f"n{i}" for i in range(5)], [r.error for r in later]
            assert not cancels.PENDING
    assert not logged, logged
    assert len(completions.calls) == 25


async def test_a_server_that_never_acknowledges_a_cancellation_is_taken_for_dead_not_waited_on_forever(
        tmp_path: Path) -> None:
    """Over Streamable HTTP the SDK writes a session's notifications one after another and waits
    for each POST's answer; our HTTP client has no read timeout (a call is bounded by its
    deadline). A server that never answered the POST of a ``notifications/cancelled`` held the
    session's writer for good: every later call of the session ended at its deadline, and the
    session was never taken for dead (found by attack). A POST carrying no request is bounded
    (``client.NOTIFICATION_READ_TIMEOUT_S``): once it runs out the session is ended; the first call
    after it fails retryable (``mcp_server_died``), as after any server's death, and the next
    starts a new session."""
    from amplifier_tools.mcp import client

    async with http_stall_server("http-deaf") as url:
        host = audited_import(tmp_path, {"s": {"url": url, "timeout_ms": 500}})
        async with host:
            first = await host.call("mcp::s::wait", {"seconds": 30})
            assert codes([first]) == ["timeout"]
            # the cancellation's POST hangs; wait out its bound, then the session is a new one
            await asyncio.sleep(client.NOTIFICATION_READ_TIMEOUT_S + 0.5)
            # the session's end is seen by the first call after it, as any dead server's: retryable
            again = await host.call("mcp::s::echo", {"text": "n0"})
            assert again.output == "n0" or (codes([again]) == ["mcp_server_died"] and again.error["retryable"])
            started = time.monotonic()
            later = [await host.call("mcp::s::echo", {"text": f"n{i}"}) for i in range(3)]
            assert [r.output for r in later] == ["n0", "n1", "n2"], [r.error for r in later]
            assert time.monotonic() - started < 1.5
        assert not cancels.PENDING


@pytest.mark.parametrize(("body", "bounded"), [
    (b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}', True),
    (b'{"jsonrpc":"2.0","method":"notifications/initialized"}', True),
    (b'{"jsonrpc":"2.0","id":7,"result":{}}', True),  # a response to the server's request
    (b'{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"no"}}', True),
    (b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"add","arguments":{"a":2}}}', False),
    # a request whose arguments hold the words a notification or a response would
    (b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":'
     b'{"text":"notifications/cancelled \\"result\\" \\"error\\""}}}', False),
    (b'not json "result"', False),
    (b'["notifications/cancelled"]', False),
    (b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"' + b"x" * 5000 + b'"}}', False),
])
def test_only_a_post_without_a_request_is_bounded(body: bytes, bounded: bool) -> None:
    from amplifier_tools.mcp.client import carries_no_request

    assert carries_no_request(body) is bounded
