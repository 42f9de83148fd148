"""Attacks on importing a Streamable HTTP server (``[plugins.mcp.servers.<name>] url = …``): a raw
asyncio HTTP/1.1 server on 127.0.0.1 whose every answer a test scripts — redirects, stalls, error
statuses with HTML bodies, a session it forgets, bodies that are no JSON-RPC, oversized events.
Every call that fails ends with one typed error naming the server, one ``tool_complete`` and one
audit record; no header value is shown."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import Completions, audited_import, call_records

from amplifier_tools import PluginLoadError, ToolHost

TOKEN = "imp0rt-t0ken-0123456789abcdefghijklmnopqrstuv"
TOOL = {"name": "echo", "description": "echo", "inputSchema": {"type": "object",
                                                              "properties": {"text": {"type": "string"}}}}
Answer = tuple[int, dict[str, str], bytes]
Behave = Callable[["Hostile", str, dict[str, str], Any], Awaitable[Answer | None]]



async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], Any] | None:
    """One HTTP/1.1 request from ``reader``: its method, its headers (names lowercased) and its
    JSON body (None without one); None once the client closed the connection."""
    line = await reader.readline()
    if not line:
        return None
    method = line.decode().split(" ", 1)[0]
    headers: dict[str, str] = {}
    while (header := (await reader.readline()).decode()).strip():
        name, value = header.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, headers, json.loads(body) if body else None

class Hostile:
    """An MCP server over HTTP/1.1 written by hand: it answers ``initialize`` (a new session each
    time), ``tools/list`` and ``tools/call`` of ``echo`` as JSON, unless ``behave`` (called with the
    method, the headers in lower case and the JSON body) returns an answer of its own, or never
    returns. ``requests`` keeps every request as (method, headers, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.sessions = 0
        self.behave: Behave | None = None
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/mcp"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while (request := await read_request(reader)) is not None:
                method, headers, message = request
                self.requests.append((method, headers, message))
                answer = await self.behave(self, method, headers, message) if self.behave is not None else None
                status, extra, payload = answer if answer is not None else self.default(method, message)
                head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(payload)}\r\n"
                head += "".join(f"{name}: {value}\r\n" for name, values in extra.items()
                                for value in (values if isinstance(values, list) else [values]))
                writer.write(head.encode() + b"\r\n" + payload)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    def default(self, method: str, message: Any) -> Answer:
        if method == "DELETE":
            return 200, {}, b""
        if method != "POST":
            return 405, {}, b""
        if not isinstance(message, dict) or "id" not in message:
            return 202, {}, b""
        result: dict[str, Any] = {}
        extra = {"content-type": "application/json"}
        if message["method"] == "initialize":
            self.sessions += 1
            extra["mcp-session-id"] = f"session-{self.sessions}"
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "hostile-http", "version": "1.0.0"}}
        elif message["method"] == "tools/list":
            result = {"tools": [TOOL]}
        elif message["method"] == "tools/call":
            result = {"content": [{"type": "text", "text": message["params"]["arguments"].get("text", "")}]}
        return 200, extra, json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()

    def posted(self, rpc_method: str) -> list[dict[str, str]]:
        """The headers of each POST of ``rpc_method``."""
        return [headers for method, headers, message in self.requests
                if method == "POST" and isinstance(message, dict) and message.get("method") == rpc_method]


def on_call(answer: Callable[[dict[str, Any]], Awaitable[Answer | None]]) -> Behave:
    """A ``behave`` answering ``tools/call`` requests with ``answer`` (everything else as usual)."""
    async def behave(server: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
        if method == "POST" and isinstance(message, dict) and message.get("method") == "tools/call":
            return await answer(message)
        return None
    return behave


async def never() -> Answer:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_IMPORT_AUTH", f"Bearer {TOKEN}")


@contextlib.asynccontextmanager
async def hostile_server() -> AsyncIterator[tuple[Hostile, str]]:
    server = Hostile()
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.close()


def importing(tmp_path: Path, url: str, *plugins: Any, **server: Any) -> ToolHost:
    section = {"url": url, "headers": {"Authorization": "import_auth"}, "startup_timeout_ms": 3000, **server}
    return audited_import(tmp_path, {"h": section}, *plugins, secrets={"import_auth": "TEST_IMPORT_AUTH"})


def html(status: int) -> Callable[[dict[str, Any]], Awaitable[Answer]]:
    async def answer(message: dict[str, Any]) -> Answer:
        return status, {"content-type": "text/html"}, f"<html><body>{status}: Bearer {TOKEN}</body></html>".encode()
    return answer


# -- found by attack ----------------------------------------------------------------------------

@pytest.mark.parametrize("body", ["html", "sdk"])
async def test_a_session_the_server_forgot_is_opened_again_not_failed_for_good(tmp_path: Path, body: str) -> None:
    """An HTTP 404 on a request naming the session means the server no longer knows it (an SDK
    server ends a session idle for 30 minutes; a restarted server knows none): the spec has the
    client open a new one. Every later call failed the same way (``mcp_protocol_error``, not
    retryable, "-32600: Session terminated", or the server's own "Session not found") until the
    host restarted. Now the call is ``mcp_server_died`` (retryable: it did not run), the next one
    opens a new session — not counted as a restart (``max_restarts = 0`` here)."""
    completions = Completions()
    async with hostile_server() as (server, url), importing(tmp_path, url, completions, max_restarts=0) as host:
        assert (await host.call("mcp::h::echo", {"text": "first"})).success

        async def forget(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            if headers.get("mcp-session-id") == "session-1":
                if body == "html":
                    return 404, {"content-type": "text/html"}, b"<html>Not Found</html>"
                error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}
                return 404, {"content-type": "application/json"}, json.dumps(error).encode()
            return None

        server.behave = forget
        lost = await host.call("mcp::h::echo", {"text": "lost"})
        assert lost.error is not None and lost.error["code"] == "mcp_server_died", lost.error
        assert lost.error["retryable"] is True
        assert "MCP server 'h'" in lost.error["message"] and "HTTP 404" in lost.error["message"]
        for text in ("again", "and again"):
            result = await host.call("mcp::h::echo", {"text": text})
            assert result.success, result.error
            assert result.output == text
    assert server.sessions == 2
    assert "mcp-session-id" not in server.posted("initialize")[1]  # a new session, as the spec asks
    assert [code for _, code in completions.calls] == [None, "mcp_server_died", None, None]
    assert [r["call_id"] for r in call_records(tmp_path)] == [call_id for call_id, _ in completions.calls]


async def test_a_server_that_forgets_every_session_at_once_is_restarted_within_max_restarts(
        tmp_path: Path) -> None:
    """Found by review: a session forgotten before it served a call was taken for an expired one,
    reopened uncounted at every call; only a session that served a call can have expired."""
    async with hostile_server() as (server, url), importing(tmp_path, url, max_restarts=1) as host:
        assert (await host.call("mcp::h::echo", {"text": "first"})).success

        async def forget(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            if method == "POST" and "mcp-session-id" in headers:  # every session, from its first request
                return 404, {"content-type": "text/html"}, b"<html>Not Found</html>"
            return None

        server.behave = forget
        codes = [(await host.call("mcp::h::echo", {"text": str(n)})).error["code"] for n in range(6)]
    # the served session expired (reopened, uncounted); the next one's start is its one restart
    assert codes[-1] == "mcp_server_unavailable", codes
    assert server.sessions <= 4, (server.sessions, codes)


async def test_closing_does_not_wait_on_a_server_that_never_answers(tmp_path: Path) -> None:
    """A server that stops answering: the call in flight is cut by ``close`` (one ``tool_complete``,
    one audit record, ``host_closing``), and the close is not held by the DELETE that ends the
    session (it held it 10 s: nothing bounded it)."""
    completions = Completions()
    async with hostile_server() as (server, url):
        host = importing(tmp_path, url, completions)
        async with host:
            async def stall(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
                return await never() if method in ("POST", "DELETE") else None

            server.behave = stall
            call = asyncio.ensure_future(host.call("mcp::h::echo", {"text": "stuck"}))
            while not server.posted("tools/call"):
                await asyncio.sleep(0.01)
            started = time.monotonic()
            await host.close(grace_ms=100)
            took = time.monotonic() - started
            result = await call
        assert took < 4.0, took
        assert any(method == "DELETE" for method, _, _ in server.requests)
    assert result.error is not None and result.error["code"] == "host_closing", result.error
    assert [code for _, code in completions.calls] == ["host_closing"]
    assert [r["call_id"] for r in call_records(tmp_path)] == [call_id for call_id, _ in completions.calls]


@pytest.mark.parametrize("status", [401, 403, 500])
async def test_an_error_status_during_a_call_names_the_status_and_the_url(tmp_path: Path, status: int) -> None:
    """It said only "returned error -32603: Server returned an error response" (the SDK's stand-in):
    not which status, so a revoked token (401) read like a server bug. The HTML body is not shown."""
    completions = Completions()
    async with hostile_server() as (server, url), importing(tmp_path, url, completions) as host:
        server.behave = on_call(html(status))
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
        assert result.error["type"] == "ExecutionError"
        assert f"MCP server 'h' returned error -32603: HTTP {status} from {url}" == result.error["message"]
        assert result.error["http_status"] == status
        server.behave = None
        assert (await host.call("mcp::h::echo", {"text": "fine"})).success
    assert [code for _, code in completions.calls] == ["mcp_protocol_error", None]
    assert len(call_records(tmp_path)) == 2
    assert TOKEN[-12:] not in (tmp_path / "audit.jsonl").read_text()


def echoing_garbage(kind: str) -> Callable[[dict[str, Any]], Awaitable[Answer]]:
    """A call handler answering 200 with a body that is no JSON-RPC and holds ``TOKEN`` well past
    its start, as a plain JSON body (``kind="json"``) or one server-sent event (``"sse"``)."""
    async def garbage(message: dict[str, Any]) -> Answer:
        junk = f"{{not json {'x' * 30}{TOKEN}{'y' * 8}"
        if kind == "json":
            return 200, {"content-type": "application/json"}, junk.encode()
        return 200, {"content-type": "text/event-stream"}, f"event: message\ndata: {junk}\n\n".encode()

    return garbage


@pytest.mark.parametrize("kind", ["json", "sse"])
async def test_a_body_that_is_no_json_rpc_does_not_show_a_cut_secret(tmp_path: Path, kind: str) -> None:
    """The SDK's error for such a body is pydantic's text, which quotes the body cut in the middle
    (``b'{not json xxxx...nopqrstuvyyyy'``): a token the server echoed showed its last characters,
    which no redaction finds (the whole token is what is registered)."""
    completions = Completions()
    async with hostile_server() as (server, url), importing(tmp_path, url, completions) as host:
        server.behave = on_call(echoing_garbage(kind))
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
        assert "MCP server 'h' returned error -32700: Failed to parse" in result.error["message"]
        assert TOKEN[-12:] not in json.dumps(result.error)
    assert TOKEN[-12:] not in (tmp_path / "audit.jsonl").read_text()
    assert len(completions.calls) == len(call_records(tmp_path)) == 1


@pytest.mark.parametrize("kind", ["json", "sse"])
async def test_the_sdks_log_of_such_a_body_does_not_show_the_cut_secret_either(
        tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: the SDK's client logger wrote "Error parsing JSON response" with a traceback
    whose text is pydantic's, quoting the body cut, to the host's log and stderr."""
    caplog.set_level(logging.DEBUG, logger="mcp.client.streamable_http")
    async with hostile_server() as (server, url), importing(tmp_path, url) as host:
        server.behave = on_call(echoing_garbage(kind))
        assert not (await host.call("mcp::h::echo", {"text": "x"})).success
    shown = [logging.Formatter().format(record) for record in caplog.records
             if record.name.startswith("mcp.client")]
    assert any("Error parsing" in line for line in shown), shown
    assert not [line for line in shown if TOKEN[-12:] in line], shown


@pytest.mark.parametrize("encoding", [None, "gzip"])
async def test_a_json_body_past_max_message_bytes_is_not_read_whole(tmp_path: Path, encoding: str | None) -> None:
    """``max_message_bytes`` bounded only a server-sent event: a JSON body was read whole (a 200 MB
    answer with the limit at 1 MiB took 16 s and 1.3 GB, and succeeded). A gzip body, whose size
    is known only once decoded (a few hundred kilobytes make gigabytes), is refused: identity was
    asked for."""
    completions = Completions()
    async with hostile_server() as (server, url), \
            importing(tmp_path, url, completions, max_message_bytes=64 * 1024) as host:
        async def huge(message: dict[str, Any]) -> Answer:
            text = "z" * (1 << 20) if encoding is None else "z"
            data = json.dumps({"jsonrpc": "2.0", "id": message["id"],
                               "result": {"content": [{"type": "text", "text": text}]}}).encode()
            if encoding is not None:
                return 200, {"content-type": "application/json", "content-encoding": encoding}, gzip.compress(data)
            return 200, {"content-type": "application/json"}, data

        server.behave = on_call(huge)
        started = time.monotonic()
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert time.monotonic() - started < 2
        assert result.error is not None and result.error["code"] == "mcp_message_too_large", result.error
        assert result.error["type"] == "ExecutionError" and result.error["limit"] == 64 * 1024
        assert "MCP server 'h'" in result.error["message"]
        assert "plugins.mcp.servers.h.max_message_bytes" in result.error["message"]
        server.behave = None
        assert (await host.call("mcp::h::echo", {"text": "fine"})).success
    assert all(headers.get("accept-encoding") == "identity" for _, headers, _ in server.requests)
    assert [code for _, code in completions.calls] == ["mcp_message_too_large", None]
    assert len(call_records(tmp_path)) == 2


@pytest.mark.parametrize("extra", [
    {"content-type": ["application/json", "text/event-stream"]},
    {"content-type": "application/json", "content-encoding": ["identity", "gzip"]},
])
async def test_repeated_headers_are_read_as_the_sdk_reads_them(tmp_path: Path, extra: dict[str, Any]) -> None:
    """A type or encoding header sent twice is read joined (``Headers.get``), as the SDK reads it:
    a JSON body is never taken for an event stream (left unbounded), nor a second encoding missed."""
    async with hostile_server() as (server, url), importing(tmp_path, url, max_message_bytes=64 * 1024) as host:
        async def huge(message: dict[str, Any]) -> Answer:
            data = json.dumps({"jsonrpc": "2.0", "id": message["id"],
                               "result": {"content": [{"type": "text", "text": "z" * (1 << 20)}]}}).encode()
            return 200, extra, data

        server.behave = on_call(huge)
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert result.error is not None and result.error["code"] == "mcp_message_too_large", result.error


@pytest.mark.parametrize("url", ["http://bob:pa55word-zz@127.0.0.1:9/mcp", "https://:pa55word-zz@example.com/mcp",
                                 "https://bob@example.com/mcp"])
def test_credentials_in_the_url_are_refused_without_showing_them(url: str) -> None:
    """httpx sent them as ``Authorization: Basic …`` in place of the configured ``headers``'
    Authorization (the secret was silently not sent), and they are a credential in the config,
    where the docs have header values come only from ``[secrets]``."""
    from amplifier_tools.errors import ConfigError
    from amplifier_tools.mcp.settings import McpSettings
    from amplifier_tools.plugin_settings import structure_settings

    with pytest.raises(ConfigError) as refused:
        structure_settings({"servers": {"s": {"url": url, "headers": {"Authorization": "ref"}}}}, McpSettings,
                           "plugins.mcp")
    assert "plugins.mcp.servers.s.url" in str(refused.value) and "credentials in the url" in str(refused.value)
    assert "pa55word" not in str(refused.value)


async def test_a_start_answered_with_no_json_rpc_does_not_show_a_cut_secret(tmp_path: Path) -> None:
    """The same at start: the start error quoted the SDK's words whole."""
    async with hostile_server() as (server, url):
        async def garbage(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            return 200, {"content-type": "application/json"}, f"{{not json {'x' * 30}{TOKEN}{'y' * 8}".encode()

        server.behave = garbage
        with pytest.raises(PluginLoadError) as refused:
            async with importing(tmp_path, url):
                pass
    assert "MCP server 'h' could not start: it returned error -32700: Failed to parse JSON response" in str(
        refused.value)
    assert TOKEN[-12:] not in str(refused.value)


async def test_a_get_stream_answered_404_is_not_taken_for_a_lost_session(tmp_path: Path) -> None:
    """The optional GET stream may be answered 404 by a server that does not offer it; a tool's own
    error after that is the tool's error, not a lost session (the session is not reopened)."""
    async with hostile_server() as (server, url):
        async def no_stream(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            if method == "GET":
                return 404, {"content-type": "text/plain"}, b"no such route"
            if isinstance(message, dict) and message.get("method") == "tools/call":
                error = {"code": -32602, "message": "bad arguments"}
                return 200, {"content-type": "application/json"}, json.dumps(
                    {"jsonrpc": "2.0", "id": message["id"], "error": error}).encode()
            return None

        server.behave = no_stream
        async with importing(tmp_path, url) as host:
            while not any(method == "GET" for method, _, _ in server.requests):
                await asyncio.sleep(0.01)
            result = await host.call("mcp::h::echo", {"text": "x"})
            assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
            assert result.error["message"] == "MCP server 'h' returned error -32602: bad arguments"
        assert server.sessions == 1


# -- attacked, and held -------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["start", "call"])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_to_another_origin_is_not_followed_and_gets_no_header(tmp_path: Path, where: str,
                                                                               status: int) -> None:
    async with hostile_server() as (server, url), hostile_server() as (elsewhere, other):
        async def redirect(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            if where == "start" or (isinstance(message, dict) and message.get("method") == "tools/call"):
                return status, {"location": other}, b""
            return None

        server.behave = redirect
        if where == "start":
            with pytest.raises(PluginLoadError) as refused:
                async with importing(tmp_path, url):
                    pass
            assert "MCP server 'h' could not start" in str(refused.value)
            assert other in str(refused.value) and "not followed" in str(refused.value)
        else:
            async with importing(tmp_path, url) as host:
                result = await host.call("mcp::h::echo", {"text": "x"})
                assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
                assert other in result.error["message"] and "not followed" in result.error["message"]
        assert elsewhere.requests == []  # the Authorization header never left for the other port


async def test_a_redirect_loop_on_the_same_origin_ends_in_a_typed_error(tmp_path: Path) -> None:
    async with hostile_server() as (server, url), importing(tmp_path, url) as host:
        server.behave = on_call(lambda message: asyncio.sleep(0, (307, {"location": "/mcp"}, b"")))
        started = time.monotonic()
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert time.monotonic() - started < 3
        assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
        assert "not followed" in result.error["message"]


async def test_a_server_that_never_answers_is_bounded_by_the_startup_timeout_and_the_deadline(
        tmp_path: Path) -> None:
    async with hostile_server() as (server, url):
        async def stall(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            return await never()

        server.behave = stall
        started = time.monotonic()
        with pytest.raises(PluginLoadError, match="did not start within 500 ms"):
            async with importing(tmp_path, url, startup_timeout_ms=500):
                pass
        assert time.monotonic() - started < 3
        server.behave = None
        completions = Completions()
        async with importing(tmp_path, url, completions, timeout_ms=500) as host:
            server.behave = on_call(lambda message: never())
            result = await host.call("mcp::h::echo", {"text": "x"})
            assert result.error is not None and result.error["code"] == "timeout", result.error
        assert [code for _, code in completions.calls] == ["timeout"]


async def test_an_event_larger_than_max_message_bytes_fails_the_call(tmp_path: Path) -> None:
    async with hostile_server() as (server, url), importing(tmp_path, url, max_message_bytes=64 * 1024) as host:
        async def huge(message: dict[str, Any]) -> Answer:
            text = "z" * (256 * 1024)
            data = json.dumps({"jsonrpc": "2.0", "id": message["id"],
                               "result": {"content": [{"type": "text", "text": text}]}})
            return 200, {"content-type": "text/event-stream"}, f"event: message\ndata: {data}\n\n".encode()

        server.behave = on_call(huge)
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert result.error is not None and result.error["type"] == "ExecutionError", result.error
        assert "MCP server 'h'" in result.error["message"]
        server.behave = None
        assert (await host.call("mcp::h::echo", {"text": "fine"})).success


async def test_a_wrong_content_type_is_a_typed_error_and_the_connection_stays_usable(tmp_path: Path) -> None:
    async with hostile_server() as (server, url), importing(tmp_path, url) as host:
        server.behave = on_call(lambda message: asyncio.sleep(0, (200, {"content-type": "text/plain"}, b"hi")))
        result = await host.call("mcp::h::echo", {"text": "x"})
        assert result.error is not None and result.error["code"] == "mcp_protocol_error", result.error
        assert "Unexpected content type: text/plain" in result.error["message"]
        server.behave = None
        assert (await host.call("mcp::h::echo", {"text": "fine"})).success


def test_a_json_answer_nested_past_pythons_stack_is_left_to_the_sdk() -> None:
    """A body nested past the SDK parser's limit (200 levels) fails the id check's parse, which is
    that parser: the body goes on as it is, for the SDK to refuse as it would any such body (with
    ``json`` first, deep nesting raised ``RecursionError``, no ``ValueError``)."""
    from amplifier_tools.mcp.client import answered_as

    deep = b'{"a":' * 200_000 + b"1" + b"}" * 200_000
    assert answered_as(deep, b'{"jsonrpc":"2.0","id":1,"method":"tools/call"}') is deep


@pytest.mark.parametrize(("text", "encoding"), [
    ('{"jsonrpc":"2.0","id":ID,"result":{}}', "utf-8-sig"),  # a byte order mark
    ('{"jsonrpc":"2.0","id":ID,"result":{}}', "utf-16"),
    ('{"jsonrpc":"2.0","id":ID,"result":{}}', "utf-32-le"),
    ('{"jsonrpc":"2.0","id":ID,"result":{"x":' + "1" * 5000 + '.5}}', "utf-8"),  # a float of 5,000 digits
    ('{"jsonrpc":"2.0","id":ID,"result":{"x":NaN,"y":-Infinity,"z":1e400}}', "utf-8"),
    ('{"jsonrpc":"2.0","id":9,"result":{},"id":ID}', "utf-8"),  # duplicate keys: the last, for both parsers
    ('{"jsonrpc":"2.0","id":ID,"result":{},"error":{"code":1,"message":"m"}}', "utf-8"),
    ('{"jsonrpc":"2.0","id":ID,"method":"ping","result":{}}', "utf-8"),  # a request to the host
])
def test_a_json_answer_naming_another_id_is_judged_as_it_would_be_naming_its_own(text: str, encoding: str) -> None:
    """Found by attack: the id check parsed the body with ``json``, laxer than the SDK's parser (it
    takes a byte order mark, UTF-16 and UTF-32, a float of any length), and wrote it again as plain
    JSON: a body the SDK refuses naming its request's id (a parse error, at once) was a success
    naming another call's; and ``true`` passed for id 1, and was refused. Naming another id now
    changes only the id the SDK reads."""
    from mcp_types import jsonrpc_message_adapter

    from amplifier_tools.mcp.client import answered_as

    def verdict(answer_id: str) -> str:
        request = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}'
        body = answered_as(text.replace("ID", answer_id).encode(encoding), request)
        try:
            return repr(jsonrpc_message_adapter.validate_json(body, by_name=False))  # repr: NaN != NaN
        except ValueError:
            return "refused"

    assert verdict("8") == verdict("true") == verdict("1")  # true is no id to the SDK, not 1


@pytest.mark.parametrize("answer_id", ["other", "null"])
async def test_a_json_answer_naming_another_calls_id_is_its_own_calls_answer(tmp_path: Path, answer_id: str) -> None:
    """Found by attack: the SDK routes a JSON body by the id in it (an event stream's answer gets the
    request's id), so a server answering Alice's POST with the id of Bob's call in flight gave Bob
    Alice's result — and dropped Bob's own answer as late — while Alice waited for her deadline.
    The answer to a POST is now that POST's request's, whatever id it names (``null`` too: the
    call got nothing and waited for its deadline)."""
    completions = Completions()
    async with hostile_server() as (server, url), importing(tmp_path, url, completions, timeout_ms=3000) as host:
        bobs: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def swap(message: dict[str, Any]) -> Answer | None:
            text = message["params"]["arguments"]["text"]
            if text == "bob":
                bobs.set_result(message["id"])
                await asyncio.sleep(0.3)  # answered after Alice's
                return None
            rid = await bobs if answer_id == "other" else None
            body = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "alice's"}]}}
            return 200, {"content-type": "application/json"}, json.dumps(body).encode()

        server.behave = on_call(swap)
        bob = asyncio.ensure_future(host.call("mcp::h::echo", {"text": "bob"}))
        await asyncio.wait_for(asyncio.shield(bobs), 5)
        started = time.monotonic()
        alice = await host.call("mcp::h::echo", {"text": "alice"})
        assert time.monotonic() - started < 2, alice.error  # not her deadline
        assert alice.success and alice.output == "alice's", alice.error
        assert (await bob).output == "bob"
    assert [code for _, code in completions.calls] == [None, None]


@pytest.mark.parametrize("served", [True, False])
async def test_a_reconnect_its_caller_cuts_is_not_counted_as_a_restart(tmp_path: Path, served: bool) -> None:
    """Found by attack: a call cancelled by its caller (or its deadline) while it opened a new
    session was counted against ``max_restarts`` — also when the session it replaced had expired,
    which is never counted (the start had cleared what said so) — so a few callers cutting a slow
    reconnect left a healthy server's tools unavailable for the host's lifetime. ``served``: the
    forgotten session had served a call (an expiry, free) or not (the server's failure, counted)."""
    async with hostile_server() as (server, url), \
            importing(tmp_path, url, max_restarts=0 if served else 1) as host:
        if served:
            assert (await host.call("mcp::h::echo", {"text": "first"})).success
        slow = asyncio.Event()

        async def forget(srv: Hostile, method: str, headers: dict[str, str], message: Any) -> Answer | None:
            if headers.get("mcp-session-id") == "session-1":
                return 404, {"content-type": "text/html"}, b"<html>Not Found</html>"
            if slow.is_set() and isinstance(message, dict) and message.get("method") == "initialize":
                return await never()
            return None

        server.behave = forget
        lost = await host.call("mcp::h::echo", {"text": "lost"})
        assert lost.error is not None and lost.error["code"] == "mcp_server_died", lost.error
        slow.set()
        for _ in range(2):  # two callers give up on the slow reconnect once it reached the server
            opened = len(server.posted("initialize"))
            call = asyncio.ensure_future(host.call("mcp::h::echo", {"text": "cut"}))
            while len(server.posted("initialize")) == opened and not call.done():
                await asyncio.sleep(0.01)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
        slow.clear()
        result = await host.call("mcp::h::echo", {"text": "again"})
        assert result.success and result.output == "again", result.error
