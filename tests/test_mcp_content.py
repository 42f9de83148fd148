"""Rich content, annotations and notifications through import, ``host.call`` and re-serve.

The fixture server (``mcp_fixtures/content_server.py``) answers with every MCP content type,
lists a tool whose hints differ from every default, and sends progress and log messages; the
re-serve side is driven by the official SDK client.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

pytest.importorskip("mcp")

import attrs
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_helpers import FIXTURES, REPO

from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.mcp.http import serve_http
from amplifier_tools.mcp.server import build_server, serve_settings
from amplifier_tools.mcp.settings import ServeSettings

CONTENT_SERVER = str(FIXTURES / "content_server.py")
sys.path.insert(0, str(FIXTURES))
from content_server import GALLERY, HINTS, PNG  # noqa: E402


class EventLog:
    """A plugin that keeps every ``tool_event`` of the MCP notification kinds."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def tool_event(self, event: str, data: dict[str, Any]) -> None:
        if event in ("tool:progress", "mcp:message"):
            self.events.append((event, data))


def content_config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    server = {"command": sys.executable, "args": [CONTENT_SERVER], "stderr": "discard",
              "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}}
    return {"plugins": {"mcp": {"servers": {"c": server}, "serve": {"tools": ["*"]}}}, **extra}


@pytest.fixture
async def importing(tmp_path: Path) -> AsyncIterator[tuple[ToolHost, EventLog]]:
    log = EventLog()
    audit = tmp_path / "audit.jsonl"
    config = content_config(tmp_path, plugins={**content_config(tmp_path)["plugins"], "audit": {"path": str(audit)}})
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(config=config, builtins=["mcp", "audit"], entry_points=False, working_dir=work,
                        discover=False, plugins=[log]) as host:
        yield host, log


def audit_records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "call"]


# -- content -----------------------------------------------------------------


async def test_imported_rich_content_is_kept_unchanged_and_rendered_as_text_for_a_model(
        importing: tuple[ToolHost, EventLog], tmp_path: Path) -> None:
    host, _ = importing
    result = await host.call("mcp::c::gallery", {})
    assert result.success, result.error
    assert result.metadata["content"] == GALLERY  # every block, as the server sent it
    text = result.get_serialized_output()
    assert text.splitlines()[:4] == [
        "here is everything", "[image: image/png, 66 bytes]", "[audio: audio/wav, 16 bytes]",
        "[resource link: report.pdf <file:///srv/report.pdf> (application/pdf)] the quarterly report"]
    assert "[resource <file:///srv/notes.txt> (text/plain)]\nline one\nline two" in text
    assert "[resource <file:///srv/blob.bin> (application/octet-stream): 256 bytes]" in text
    assert PNG not in text and "iVBOR" not in text  # a model never gets the bytes as text

    record = audit_records(tmp_path)[-1]
    assert [entry["type"] for entry in record["content"]] == [b["type"] for b in GALLERY]
    image = record["content"][1]
    assert image["mimeType"] == "image/png" and len(image["sha256"]) == 64
    assert PNG not in json.dumps(record)  # digests, not the data


async def test_imported_content_is_re_served_as_the_same_mcp_blocks(importing: tuple[ToolHost, EventLog]) -> None:
    host, _ = importing
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        served = await client.call_tool("mcp__c__gallery", {})
    assert not served.is_error
    assert [block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in served.content] == GALLERY


async def test_imported_content_reaches_amplifier_as_its_text_and_image_blocks(
        importing: tuple[ToolHost, EventLog]) -> None:
    """Amplifier has text and image blocks only: audio and resources reach it as their text, never
    as blocks amplifier-core refuses (its ToolResult raised on an MCP-spelled image)."""
    pytest.importorskip("amplifier_core")
    from amplifier_tools.amplifier_module import to_amplifier_result

    host, _ = importing
    back = to_amplifier_result(await host.call("mcp::c::gallery", {}))
    blocks = back.model_dump()["content"]
    assert [b["type"] for b in blocks] == ["text", "image", "text", "text", "text", "text"]
    assert blocks[1]["source"] == {"type": "base64", "media_type": "image/png", "data": PNG}
    assert blocks[2]["text"] == "[audio: audio/wav, 16 bytes]"


async def test_a_huge_image_is_carried_but_never_rendered_or_audited_as_bytes(
        importing: tuple[ToolHost, EventLog], tmp_path: Path) -> None:
    host, _ = importing
    result = await host.call("mcp::c::big_image", {"size": 6_000_000})
    assert result.success, result.error
    assert len(result.metadata["content"][0]["data"]) == 8_000_000
    assert result.get_serialized_output() == "[image: image/png, 6000000 bytes]"
    record = audit_records(tmp_path)[-1]
    assert record["content"][0]["bytes"] > 8_000_000 and len(json.dumps(record)) < 5_000


@pytest.mark.parametrize(("tool", "problem"), [
    ("bad_base64", "its data is not valid base64"),
    ("bad_mime", "mimeType '<script>' is not a media type"),
])
async def test_unusable_binary_content_is_a_typed_error_naming_the_block(
        importing: tuple[ToolHost, EventLog], tool: str, problem: str) -> None:
    host, _ = importing
    result = await host.call(f"mcp::c::{tool}", {})
    assert result.error is not None
    assert (result.error["type"], result.error["code"]) == ("ExecutionError", "mcp_invalid_content")
    assert "content block 0 (image)" in result.error["message"] and problem in result.error["message"]


async def test_a_block_type_mcp_does_not_define_is_a_typed_protocol_error(tmp_path: Path) -> None:
    config = content_config(tmp_path)
    config["plugins"]["mcp"]["servers"]["c"]["env"]["CONTENT_RAW"] = "1"
    async with ToolHost(config=config, builtins=["mcp"], entry_points=False, discover=False,
                        working_dir=tmp_path) as host:
        result = await host.call("mcp::c::odd_type", {})
        assert result.error is not None
        assert (result.error["type"], result.error["code"]) == ("ExecutionError", "mcp_protocol_error")
        assert "malformed tools/call result" in result.error["message"]
        assert (await host.call("mcp::c::odd_type", {})).error is not None  # the server stays usable


class _Painter:
    name = "paint"
    description = "Returns an image and a resource."
    spec = ToolSpec(name="paint", effect="Pure")

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=None, metadata={"content": [
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "mem://notes", "text": "a note"}}]})


class _PainterPlugin:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Painter())


async def test_our_tool_returning_content_is_served_as_mcp_content_blocks(host_factory: Any) -> None:
    host = await host_factory(_PainterPlugin())
    result = await host.call("paint", {})
    assert result.get_serialized_output() == "[image: image/png, 66 bytes]\n[resource <mem://notes>]\na note"
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        served = await client.call_tool("paint", {})
    assert [block.type for block in served.content] == ["image", "resource"]
    assert served.content[0].data == PNG  # type: ignore[union-attr]
    assert base64.b64decode(served.content[0].data).startswith(b"\x89PNG")  # type: ignore[union-attr]


# -- annotations ---------------------------------------------------------------


async def test_annotations_are_re_served_and_described_as_the_server_gave_them(
        importing: tuple[ToolHost, EventLog]) -> None:
    host, _ = importing
    spec = {s.name: s for s in host.specs}["mcp::c::hinted"]
    given = {"title": "Hinted tool", "readOnlyHint": True, "destructiveHint": False, "idempotentHint": False,
             "openWorldHint": True}
    assert spec.annotations == given
    assert spec.effect.value == "Pure"  # policy follows the effect derived from the hints
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    served = tools["mcp__c__hinted"].annotations
    assert served is not None and served.open_world_hint is True  # was False: Pure's derived hints
    assert served.model_dump(by_alias=True, exclude_none=True) == given
    assert tools["mcp__c__bad_mime"].annotations is None  # given none, served none


def test_describe_shows_the_upstream_hints(tmp_path: Path) -> None:
    from cli_helpers import cli

    config = tmp_path / "amplifier-tools.toml"
    config.write_text(f"""
[plugins.mcp.servers.c]
command = {json.dumps(sys.executable)}
args = [{json.dumps(CONTENT_SERVER)}]
stderr = "discard"
env = {{ PATH = {json.dumps(os.environ.get("PATH", "/usr/bin:/bin"))} }}
""")
    done = cli(tmp_path, "--config", str(config), "describe", "--json", "mcp::c::hinted")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["annotations"]["openWorldHint"] is True


# -- notifications -----------------------------------------------------------------


async def test_server_progress_and_log_messages_reach_the_host_as_tool_events(
        importing: tuple[ToolHost, EventLog]) -> None:
    host, log = importing
    result = await host.call("mcp::c::work", {}, call_id="call-work-1")
    assert result.success, result.error
    progress = [data for event, data in log.events if event == "tool:progress"]
    assert [(p["progress"], p["total"], p["message"]) for p in progress] == [
        (1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"), (3.0, 3.0, "step 3 of 3")]
    assert {(p["tool_name"], p["tool_call_id"], p["server"]) for p in progress} == {
        ("mcp::c::work", "call-work-1", "c")}
    messages = [data for event, data in log.events if event == "mcp:message"]
    assert messages == [
        {"server": "c", "level": "info", "logger": "fixture", "data": "starting the work"},
        {"server": "c", "level": "warning", "logger": "fixture", "data": {"note": "almost done"}}]


async def test_a_servers_notifications_are_redacted_of_the_hosts_secrets(
        importing: tuple[ToolHost, EventLog]) -> None:
    """What a server says in its progress and log messages may quote what it was given: the host's
    secrets are redacted before any observer sees it (``coordinator.hooks.emit`` does it for every
    emitter, MCP servers included)."""
    host, log = importing
    host.secrets.add("step 2 of 3")
    host.secrets.add("the work")
    result = await host.call("mcp::c::work", {})
    assert result.success, result.error
    events = [(event, data) for event, data in log.events if event in ("tool:progress", "mcp:message")]
    assert events and "the work" not in repr(events) and "step 2 of 3" not in repr(events)
    assert [data["message"] for event, data in events if event == "tool:progress"][1] == "[REDACTED]"


async def test_serve_forwards_progress_to_a_client_that_sent_a_progress_token(
        importing: tuple[ToolHost, EventLog]) -> None:
    host, _ = importing
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        done = await client.call_tool("mcp__c__work", {}, progress_callback=on_progress)
        assert not done.is_error
        quiet = await client.call_tool("mcp__c__work", {})  # no token: nothing is sent, nothing breaks
        assert not quiet.is_error
    assert received == [(1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"), (3.0, 3.0, "step 3 of 3")]


class _Counter:
    """A tool of ours that reports progress the documented way: coordinator.hooks.emit("tool:progress")."""

    name = "count"
    description = "Counts to three, reporting progress."
    spec = ToolSpec(name="count", effect="Pure")

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
        for step in (1, 2, 3):
            await self.coordinator.hooks.emit("tool:progress", {
                "tool_name": "count", "tool_call_id": context.call_id, "progress": step, "total": 3})
        await self.coordinator.hooks.emit("tool:progress", {"tool_call_id": context.call_id, "progress": "NaN"})
        return ToolResult(output="counted")


class _CounterPlugin:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Counter(coordinator))


async def test_serve_forwards_our_own_tools_progress_and_ignores_what_is_no_number(host_factory: Any) -> None:
    host = await host_factory(_CounterPlugin())
    received: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total))

    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        done = await client.call_tool("count", {}, progress_callback=on_progress)
    assert not done.is_error and done.content[0].text == "counted"  # type: ignore[union-attr]
    assert received == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]


async def test_round_trip_through_serve_mcp_over_stdio_keeps_content_hints_and_progress(tmp_path: Path) -> None:
    """The whole path: the fixture server imported by a serve-mcp process, driven by the SDK client."""
    config = tmp_path / "inner.toml"
    config.write_text(f"""
[plugins.mcp.servers.c]
command = {json.dumps(sys.executable)}
args = [{json.dumps(CONTENT_SERVER)}]
stderr = "discard"
env = {{ PATH = {json.dumps(os.environ.get("PATH", "/usr/bin:/bin"))} }}

[plugins.mcp.serve]
tools = ["*"]
""")
    params = StdioServerParameters(command=sys.executable, args=["-m", "amplifier_tools", "--config", str(config),
                                   "serve-mcp"], env={"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "")},
                                   cwd=str(tmp_path))
    received: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(progress)

    async with Client(params) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["mcp__c__hinted"].annotations.open_world_hint is True  # type: ignore[union-attr]
        gallery = await client.call_tool("mcp__c__gallery", {})
        assert [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in gallery.content] == GALLERY
        work = await client.call_tool("mcp__c__work", {}, progress_callback=on_progress)
        assert not work.is_error
    assert received == [1.0, 2.0, 3.0]


@asynccontextmanager
async def served_over_http(host: ToolHost) -> AsyncIterator[str]:
    """The URL of ``host``'s tools served over Streamable HTTP in this process (anonymous, loopback)."""
    settings = attrs.evolve(serve_settings(host), transport="streamable-http", host="127.0.0.1", port=0,
                            allow_anonymous=True, tools=("*",))
    url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve_http(host, settings, ready=url.set_result, stop=stop))
    done, _ = await asyncio.wait({url, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    try:
        yield url.result()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_over_http_content_hints_and_progress_survive_two_hops(importing: tuple[ToolHost, EventLog],
                                                                    tmp_path: Path) -> None:
    """fixture server -> host (stdio import) -> serve-mcp over HTTP -> the SDK's HTTP client, and -> a
    second host importing that URL: the blocks, the hints and the progress arrive unchanged."""
    inner, _ = importing
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async with served_over_http(inner) as url:
        async with httpx2.AsyncClient() as http, streamable_http_client(url, http_client=http) as streams, \
                ClientSession(streams[0], streams[1]) as client:
            await client.initialize()
            gallery = await client.call_tool("mcp__c__gallery", {})
            assert [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in gallery.content] == GALLERY
            assert not (await client.call_tool("mcp__c__work", {}, progress_callback=on_progress)).is_error
        assert received == [(1.0, 3.0, "step 1 of 3"), (2.0, 3.0, "step 2 of 3"), (3.0, 3.0, "step 3 of 3")]

        log = EventLog()
        outer_config = {"plugins": {"mcp": {"servers": {"inner": {"url": url}}}}}
        async with ToolHost(config=outer_config, builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path / "work", plugins=[log]) as outer:
            hinted = {s.name: s for s in outer.specs}["mcp::inner::mcp__c__hinted"]
            assert hinted.annotations is not None and hinted.annotations["openWorldHint"] is True
            again = await outer.call("mcp::inner::mcp__c__gallery", {})
            assert again.success and again.metadata["content"] == GALLERY
            work = await outer.call("mcp::inner::mcp__c__work", {}, call_id="outer-1")
            assert work.success, work.error
        progress = [(d["tool_call_id"], d["progress"]) for event, d in log.events if event == "tool:progress"]
        assert progress == [("outer-1", 1.0), ("outer-1", 2.0), ("outer-1", 3.0)]


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # the fixture's logging
async def test_an_sdk_http_server_imported_by_url_passes_content_progress_and_log_messages(tmp_path: Path) -> None:
    """The fixture server's own Streamable HTTP app (the SDK's), imported by URL."""
    import socket

    import content_server
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(content_server.server.streamable_http_app(), log_level="warning",
                                           lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)
        log = EventLog()
        config = {"plugins": {"mcp": {"servers": {"h": {"url": f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"}}}}}
        async with ToolHost(config=config, builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path, plugins=[log]) as host:
            gallery = await host.call("mcp::h::gallery", {})
            assert gallery.success and gallery.metadata["content"] == GALLERY
            assert {s.name: s for s in host.specs}["mcp::h::hinted"].annotations == HINTS.model_dump(
                by_alias=True, exclude_none=True)
            assert (await host.call("mcp::h::work", {})).success
        assert [(event, d.get("progress", d.get("data"))) for event, d in log.events] == [
            ("mcp:message", "starting the work"), ("tool:progress", 1.0), ("tool:progress", 2.0),
            ("tool:progress", 3.0), ("mcp:message", {"note": "almost done"})]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


class _Flooder:
    """A tool that reports 3000 progress notifications of 100 KB each, then says it is done."""

    name = "flood"
    description = "Floods its caller with progress."
    spec = ToolSpec(name="flood", effect="Pure")

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.emitted = asyncio.Event()

    async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
        for step in range(1, 3001):
            await self.coordinator.hooks.emit("tool:progress", {
                "tool_call_id": context.call_id, "progress": step, "total": 3000, "message": "p" * 100_000})
        self.emitted.set()
        return ToolResult(output="flooded")


async def test_a_client_that_does_not_read_its_progress_holds_no_more_than_a_bounded_backlog(
        host_factory: Any) -> None:
    flooder: list[_Flooder] = []

    class Plugin:
        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            flooder.append(_Flooder(coordinator))
            await coordinator.mount("tools", flooder[0])

    host = await host_factory(Plugin())
    reading = asyncio.Event()
    received: list[tuple[float, str | None]] = []

    async def stuck_client(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, message))
        await reading.wait()  # the client does not read until the tool has emitted everything

    from amplifier_tools.mcp.server import PROGRESS_BACKLOG, PROGRESS_MESSAGE_CHARS

    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        call = asyncio.ensure_future(client.call_tool("flood", {}, progress_callback=stuck_client))
        emitted = asyncio.ensure_future(flooder[0].emitted.wait())
        await asyncio.wait([call, emitted], return_when=asyncio.FIRST_COMPLETED, timeout=60)
        assert emitted.done(), "the tool's progress waited for a client that does not read"
        reading.set()
        done = await call
    assert not done.is_error
    assert len(received) <= 1 + PROGRESS_BACKLOG
    assert received[-1][0] == 3000.0  # lossy, but the latest is kept
    assert all(message is not None and len(message) == PROGRESS_MESSAGE_CHARS for _, message in received)


class _Leaker:
    """A tool of ours whose image and embedded blob are base64 of text holding a secret."""

    name = "leak"
    description = "Returns binary content that holds a secret."
    spec = ToolSpec(name="leak", effect="Pure")

    async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
        secret = os.environ["LEAKY_SECRET"]
        data = base64.b64encode(f"x{secret}".encode()).decode()
        return ToolResult(output="leaked", metadata={"content": [
            {"type": "text", "text": "before"},
            {"type": "image", "data": data, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///blob", "mimeType": "application/octet-stream",
                                              "blob": data}},
            {"type": "image", "data": base64.b64encode(b"no secret here").decode(), "mimeType": "image/png"}]})


class _LeakerPlugin:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Leaker())


async def test_binary_content_with_a_secret_redacted_becomes_a_text_block_and_is_served_valid(
        host_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAKY_SECRET", "leaky-secret-value-42")
    host = await host_factory(_LeakerPlugin(), config={"secrets": {"leaky": "LEAKY_SECRET"}})
    result = await host.call("leak", {})
    blocks = result.metadata["content"]
    assert blocks[1] == {"type": "text", "text": "[image (image/png): binary content withheld because it "
                                                 "contained a secret]"}
    assert blocks[2] == {"type": "text", "text": "[resource <file:///blob> (application/octet-stream): binary "
                                                 "content withheld because it contained a secret]"}
    assert blocks[0]["type"] == "text" and blocks[3]["type"] == "image"  # the others as they were
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        served = await client.call_tool("leak", {})
    assert [block.type for block in served.content] == ["text", "text", "text", "image"]
    base64.b64decode(served.content[3].data, validate=True)  # type: ignore[union-attr]


async def test_progress_a_client_can_no_longer_take_is_dropped_without_failing_the_call() -> None:
    from amplifier_tools.mcp.server import ProgressRelay

    class Gone:
        async def report_progress(self, *args: Any) -> None:
            raise ConnectionResetError("the client went away")

    relay = ProgressRelay(Gone())
    relay.offer(1.0, 2.0, "half")
    await asyncio.sleep(0.05)  # the relay's task tries to send it, and the client is gone
    relay.offer(2.0, 2.0, "done")
    assert relay.waiting == 0  # no more is taken
    await asyncio.wait_for(relay.finish(), 5)  # returns: no exception reaches the call


async def test_a_served_call_that_reports_no_progress_builds_no_relay(host_factory: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Most calls report no progress: they get no relay (no queue, no event, no task, nothing to
    wait for before the result); a call that reports some gets one, at its first progress."""
    import amplifier_tools.mcp.server as served

    built: list[Any] = []

    class Counted(served.ProgressRelay):
        __slots__ = ()

        def __init__(self, session: Any) -> None:
            super().__init__(session)
            built.append(self)

    monkeypatch.setattr(served, "ProgressRelay", Counted)
    host = await host_factory(_CounterPlugin(), ToolsPlugin(EchoTool()))
    received: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(progress)

    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        quiet = await client.call_tool("echo", {"path": "hi"}, progress_callback=on_progress)
        assert not quiet.is_error and built == []
        busy = await client.call_tool("count", {}, progress_callback=on_progress)
    assert not busy.is_error and len(built) == 1 and received == [1.0, 2.0, 3.0]
