"""Attacks on importing tools from hostile or broken MCP servers: a server that comes back from a
restart as another version, and one that stops reading our answers while it floods its output.
Every call ends with one typed error naming the server, one ``tool_complete`` and one audit
record; nothing of the server outlives the host."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import mcp_types
from mcp_helpers import Completions, audited_import, call_records, fixture_server, wait_dead

from amplifier_tools import ToolHost


def audited(tmp_path: Path, *plugins: Any, **server: Any) -> ToolHost:
    return audited_import(tmp_path, {"fx": fixture_server(**server)}, *plugins)


async def test_a_restarted_server_reporting_another_version_is_refused_without_a_version_pin(
        tmp_path: Path) -> None:
    """Only a configured ``version`` pin was compared on restart: a server that died and came back
    as 6.6.6 had its calls run, while the mounted contract (``version``, the
    ``mcp-server-version:`` tag) and so every audit record still said 1.4.2 — the record, meant to
    tie each call to the exact definition and server it ran under, named a server version the
    call never ran on (its own result's ``metadata["mcp"]`` said 6.6.6)."""
    version = tmp_path / "version"
    version.write_text("1.4.2")
    completions = Completions()
    async with audited(tmp_path, completions, env={"FIXTURE_VERSION_FILE": str(version)}) as host:
        assert (await host.call("mcp::fx::echo", {"text": "first"})).success
        version.write_text("6.6.6")
        crashed = await host.call("mcp::fx::crash", {})
        assert crashed.error is not None and crashed.error["code"] == "mcp_server_died"
        result = await host.call("mcp::fx::echo", {"text": "after restart"})
        assert result.error is not None and result.error["code"] == "pin_mismatch", (result.output, result.error)
        assert result.error["type"] == "ContractError"
        assert "MCP server 'fx'" in result.error["message"]
        assert "'6.6.6'" in result.error["message"] and "'1.4.2'" in result.error["message"]
        again = await host.call("mcp::fx::echo", {"text": "and again"})  # not restarted over and over
        assert again.error is not None and again.error["code"] == "mcp_server_unavailable", again.error
    assert [code for _, code in completions.calls] == [None, "mcp_server_died", "pin_mismatch",
                                                       "mcp_server_unavailable"]
    records = call_records(tmp_path)
    assert [r["call_id"] for r in records] == [call_id for call_id, _ in completions.calls]
    ran = [r for r in records if r.get("error") is None]
    assert all(r["definition"]["server_version"] == "1.4.2" for r in ran)


#: A stdio server, JSON-RPC by hand. ``spew`` answers nothing and writes log messages without end;
#: ``blocks`` answers with ``count`` content items written as ``item`` (raw JSON text).
HOSTILE_SCRIPT = r'''
import json, sys

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    request = json.loads(line)
    method, rid = request.get("method"), request.get("id")
    if rid is None or method is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile", "version": "1.0.0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [
            {"name": "spew", "inputSchema": {"type": "object"}},
            {"name": "blocks", "inputSchema": {"type": "object"}}]}})
    elif request["params"]["name"] == "blocks":
        arguments = request["params"]["arguments"]
        items = ",".join([arguments["item"]] * arguments["count"])
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"content": [%s]}}\n' % (json.dumps(rid), items))
        sys.stdout.flush()
    else:
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "x" * 200}}) + "\n"
        while True:
            sys.stdout.write(note * 100)
'''


def hostile_host(tmp_path: Path, *plugins: Any, **server: Any) -> ToolHost:
    """A host (audited) importing ``HOSTILE_SCRIPT`` as server ``h``, with ``server`` settings."""
    script = tmp_path / "hostile_server.py"
    script.write_text(HOSTILE_SCRIPT)
    section = {"command": sys.executable, "args": [str(script)], "stderr": "discard", **server}
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")}, "mcp": {"servers": {"h": section}}}}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return ToolHost(config=config, builtins=["audit", "mcp"], plugins=list(plugins), entry_points=False,
                    working_dir=work, discover=False)


def open_pipes() -> set[str]:
    """This process's open pipe descriptors (``pipe:[inode]`` by fd)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("pipe:"):
                found.add(f"{fd}->{target}")
    return found


async def test_a_server_flooding_its_output_leaves_no_pipe_open_after_close(tmp_path: Path) -> None:
    """A server that writes faster than the host reads fills the stdout pipe's buffer, and asyncio
    pauses reading it; the reader, stopped at the close, never resumed it, so its EOF was never
    read and its descriptor stayed open after ``close()`` — until a garbage
    collection, which at interpreter exit printed ``Exception ignored … Event loop is closed``
    from the unclosed subprocess transport."""
    completions = Completions()
    before = open_pipes()
    gc.disable()  # the leaked transport sits in a reference cycle: only a collection closed it
    try:
        async with hostile_host(tmp_path, completions, timeout_ms=1000) as host:
            pid = host.plugin_manager.get_plugin("mcp").connections[0].pid
            result = await host.call("mcp::h::spew", {})
            assert result.error is not None and result.error["code"] == "timeout", result.error
        assert wait_dead(pid)
        assert open_pipes() - before == set()
    finally:
        gc.enable()
    assert [code for _, code in completions.calls] == ["timeout"]
    assert len(call_records(tmp_path)) == 1


@pytest.mark.parametrize(("item", "why"), [
    ('{"\\u0074ype": "text", "text": ""}', "the key type spelled with a JSON escape"),
    ("{}", "items that are no blocks"),
    ("0", "items that are no objects"),
])
def test_the_raw_block_count_is_not_fooled_by_how_the_items_are_written(item: str, why: str) -> None:
    """The cheap test before the SDK parses a response counted the bytes ``"type"``: a server that
    wrote the key as ``"\\u0074ype"`` (the same JSON), or sent items that are no blocks, passed it
    with 200,000 items, and the SDK's validation held the event loop for seconds (1.6 million
    validation errors, 14 s, for 200,000 empty objects)."""
    from amplifier_tools.mcp.transport import TOO_MANY_BLOCKS, _too_many_blocks

    line = bytearray(('{"jsonrpc": "2.0", "id": 7, "result": {"content": [' + ",".join([item] * 5000) + "]}}").encode())
    refused = _too_many_blocks(line, 4096)
    assert refused is not None, why
    error = refused.message
    assert isinstance(error, mcp_types.JSONRPCError) and error.id == 7 and error.error.code == TOO_MANY_BLOCKS
    assert error.error.data == {"reason": "amplifier-tools/too-many-content-blocks", "blocks": 5000, "limit": 4096}
    head = '{"jsonrpc": "2.0", "id": 7, "result": {"content": ['
    assert _too_many_blocks(bytearray((head + ",".join([item] * 4096) + "]}}").encode()), 4096) is None


async def test_a_result_of_items_that_are_no_blocks_is_refused_before_the_sdk_validates_them(tmp_path: Path) -> None:
    """20,000 empty objects passed the raw count (no ``"type"`` in them): the SDK validated each
    against every block type, and the call failed after that as a malformed result instead of
    naming ``max_content_blocks``."""
    completions = Completions()
    async with hostile_host(tmp_path, completions, max_content_blocks=100, timeout_ms=30000) as host:
        connection = host.plugin_manager.get_plugin("mcp").connections[0]
        result = await host.call("mcp::h::blocks", {"item": "{}", "count": 20000})
        assert result.error is not None and result.error["code"] == "mcp_too_many_content_blocks", result.error
        assert "MCP server 'h'" in result.error["message"]
        assert result.error["blocks"] == 20000 and result.error["limit"] == 100
        assert result.metadata["mcp"]["tool"] == "blocks"
        assert connection.restarts == 0
    assert [code for _, code in completions.calls] == ["mcp_too_many_content_blocks"]
    assert len(call_records(tmp_path)) == 1
