"""serve-mcp over Streamable HTTP attacked as a hostile client, and a ``url`` server imported with
``headers`` attacked as a hostile upstream: what the attack found, held.

- A tool of ours reporting progress (``tool:progress`` with a ``message``) sent the message to the
  HTTP client as it was, with a token the tool held; a result with the same text was redacted.
- An upstream that echoed its header's token where the importing host clips what it shows (a
  block's media type in a result's text or in an error, pydantic's text of a malformed result)
  got all of the token but its last character (or pydantic's tail of it) into the call's output,
  its error and the audit log: cut first, the token was no longer one the redaction finds.
- A client's token sent in its ``Origin`` or ``Host`` header reached the server's stderr in the
  SDK's refusal line (``Invalid Origin header: …``) as it came; the audit event never had it.
- A client with a valid token that sent a request head and then stopped sending its body held its
  connection (and the SDK's buffer of the request) for ever: the head's timeout ended with the head.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2
from mcp_helpers import http_session as session
from mcp_helpers import served_http as served

from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef-bob"


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ALICE_TOKEN", ALICE)
    monkeypatch.setenv("TEST_BOB_TOKEN", BOB)


def config(tmp_path: Path, **serve: Any) -> dict[str, Any]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    clients = [{"token_ref": "alice_token", "principal": "alice"}, {"token_ref": "bob_token", "principal": "bob"}]
    return {"working_dir": str(root), "state_dir": str(tmp_path / "state"),
            "secrets": {"alice_token": "TEST_ALICE_TOKEN", "bob_token": "TEST_BOB_TOKEN"},
            "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                        "mcp": {"serve": {"transport": "streamable-http", "port": 0, "clients": clients,
                                          "tools": ["*"], **serve}}}}


class _Reporter:
    """A tool of ours that holds a secret and mentions it in its progress and in its result."""

    name = "report"
    description = "Reports progress."
    spec = ToolSpec(name="report", effect="Pure")

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
        await self.coordinator.hooks.emit("tool:progress", {
            "tool_call_id": context.call_id, "progress": 1, "total": 2, "message": f"using {BOB} now"})
        return ToolResult(output=f"used {BOB}")


class _ReporterPlugin:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Reporter(coordinator))


async def test_a_progress_message_reaches_the_client_without_the_hosts_secrets(tmp_path: Path) -> None:
    received: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(message)

    async with served(config(tmp_path), ("audit", "mcp"), plugins=(_ReporterPlugin(),)) as url, \
            session(url, ALICE) as alice:
        result = await alice.call_tool("report", {}, progress_callback=on_progress)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error and BOB not in text and "[REDACTED]" in text  # the result, as it always was
    assert received == ["using [REDACTED] now"]  # and now its progress too



@pytest.mark.parametrize("header", ["Origin", "Host"])
async def test_a_token_in_a_refused_origin_or_host_is_not_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                 header: str) -> None:
    value = f"http://rebound.example/{ALICE}" if header == "Origin" else f"{ALICE}.rebound.example"
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {ALICE}", header: value}
    with caplog.at_level("WARNING", logger="mcp.server.transport_security"):
        async with served(config(tmp_path), ("audit", "mcp")) as url, httpx2.AsyncClient() as http:
            refused = await http.post(url, json=initialize, headers=headers)
    assert refused.status_code == (403 if header == "Origin" else 421)
    lines = [r.getMessage() for r in caplog.records if r.name == "mcp.server.transport_security"]
    assert lines and all(f"Invalid {header} header" in line for line in lines)
    assert all(ALICE not in line and "[REDACTED]" in line for line in lines), lines
    assert ALICE not in (tmp_path / "audit.jsonl").read_text()

@pytest.mark.parametrize("limit", [64 * 1024, None])
async def test_a_request_body_past_max_message_bytes_is_refused_413(tmp_path: Path, limit: int | None) -> None:
    """``[plugins.mcp.serve] max_message_bytes`` bounds a client's message over HTTP as over stdio
    (found by review: it bounded stdio lines only, and HTTP kept the SDK's own 4 MiB, so a
    configured bound was silently not the one applied). Unset, the bound is the default, 16 MiB."""
    serve = {} if limit is None else {"max_message_bytes": limit}
    size = 100 * 1024 if limit is not None else 5 * 1024 * 1024  # past 64 KiB; past the SDK's 4 MiB, under 16
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "nothing", "arguments": {"pad": "z" * size}}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {ALICE}",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2025-06-18"}
    async with served(config(tmp_path, **serve), ("audit", "mcp")) as url, httpx2.AsyncClient() as http:
        answer = await http.post(url, content=json.dumps(call).encode(), headers=headers)
    if limit is not None:
        assert answer.status_code == 413, answer.text
        # a refusal, in the audit log as the others are (found by attack: it was not)
        events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(e["data"]["status"], e["data"]["client"]) for e in events
                if e.get("event") == "mcp.http.unauthorized"] == [(413, "alice_token")]
    else:  # read whole and answered by the server (no session yet), not refused for its size
        assert answer.status_code != 413, answer.text



async def _post_trickled(port: int, body: bytes, pieces: list[tuple[bytes, float]]) -> tuple[bytes, float]:
    """A raw HTTP POST of ``body`` to ``/mcp`` with Alice's token, its body sent as ``pieces``
    (each sent, then a pause of its seconds): what came back until the server closed, and when."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = asyncio.get_running_loop().time()
    try:
        writer.write((f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {ALICE}\r\n"
                      "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n").encode())
        for piece, pause in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pause)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return answer, asyncio.get_running_loop().time() - started
    finally:
        writer.close()


async def test_a_stalled_request_body_is_answered_408_and_a_slow_steady_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: a client with a valid token that sent a request head and then stopped
    sending the body (or sent a byte now and then) held its connection, and the SDK's buffer of the
    request, for ever; the head's timeout ended with the head. The body now has
    ``REQUEST_BODY_TIMEOUT_S`` between two reads (nginx's ``client_body_timeout``), not for the
    whole body: a body stalled that long is answered 408 and recorded, a slow steady one is served."""
    from amplifier_tools.mcp import http

    monkeypatch.setattr(http, "REQUEST_BODY_TIMEOUT_S", 0.5, raising=False)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    async with served(config(tmp_path), ("audit", "mcp")) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        # a byte every 0.2 s for 2 s, four times the timeout in all: served
        steady, took = await _post_trickled(port, body, [(body[i:i + 1], 0.2) for i in range(10)] + [(body[10:], 0)])
        assert steady.startswith(b"HTTP/1.1 200 ") and b"mcp-session-id" in steady.lower(), steady
        assert took >= 2
        # one byte, then nothing: cut after the timeout, not held
        stalled, took = await _post_trickled(port, body, [(body[:1], 0)])
        assert stalled.startswith(b"HTTP/1.1 408 "), stalled
        assert 0.5 <= took < 5
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["data"]["status"], e["data"]["client"], e["data"]["bearer_token_sent"]) for e in events
            if e.get("event") == "mcp.http.unauthorized"] == [(408, "alice_token", True)]


# -- a hostile upstream: a url server that echoes the token its headers carry ----------------------

UPSTREAM = "upstream-secret-0123456789abcdefXYZ"
#: What the upstream answers each tool with: the token placed where the importing host clips.
ECHOES: dict[str, dict[str, Any]] = {
    # an image whose media type is refused: the error shows its first 80 characters
    "bad_mime": {"content": [{"type": "image", "data": "QUFB", "mimeType": "x" * (81 - len(UPSTREAM)) + UPSTREAM}]},
    # a valid media type with a parameter: the output text shows its first 100 characters
    "long_mime": {"content": [{"type": "image", "data": "QUFB",
                               "mimeType": "image/png; a=" + "a" * (88 - len(UPSTREAM)) + UPSTREAM}]},
    # a resource link: the output text shows the first 500 characters of its URI
    "long_uri": {"content": [{"type": "resource_link", "name": "report",
                              "uri": "file:///" + "b" * (493 - len(UPSTREAM)) + UPSTREAM}]},
    # no CallToolResult: pydantic's text of it shows the tail of the value it found
    "malformed": {"content": [{"type": "text", "text": 5, "pad": "a" * 40 + UPSTREAM}]},
}


async def _upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Just enough Streamable HTTP (JSON answers) to be imported, answering ``ECHOES``."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body) if scope["method"] == "POST" else {}
    if "id" not in request:  # a notification, or a GET for an event stream this server has not
        await send({"type": "http.response.start", "status": 202 if request else 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    method = request["method"]
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": request["params"]["protocolVersion"],
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "echo", "version": "1.0.0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in ECHOES]}
    else:
        result = ECHOES[request["params"]["name"]]
    answer = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"mcp-session-id", b"one")]})
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def upstream() -> AsyncIterator[str]:
    import uvicorn

    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_upstream, log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not serving.done()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
        sock.close()


def _pieces(text: str) -> list[str]:
    """Every 12 characters of the upstream's token found in ``text``."""
    return [UPSTREAM[i:i + 12] for i in range(len(UPSTREAM) - 11) if UPSTREAM[i:i + 12] in text]


@pytest.mark.parametrize("tool", sorted(ECHOES))
async def test_an_upstream_echoing_its_token_where_the_host_clips_gets_no_part_of_it_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str) -> None:
    monkeypatch.setenv("TEST_UPSTREAM_AUTH", f"Bearer {UPSTREAM}")
    (tmp_path / "work").mkdir()
    async with upstream() as url:
        cfg = {"secrets": {"upstream_auth": "TEST_UPSTREAM_AUTH"},
               "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                           "mcp": {"servers": {"up": {"url": url, "headers": {"Authorization": "upstream_auth"}}}}}}
        async with ToolHost(config=cfg, builtins=["audit", "mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path / "work") as host:
            result = await host.call(f"mcp::up::{tool}", {})
    seen = json.dumps([result.output, result.error])
    assert "[REDACTED]" in seen or result.error is not None, seen  # the echo arrived
    assert _pieces(seen) == [], seen
    assert _pieces((tmp_path / "audit.jsonl").read_text()) == []
