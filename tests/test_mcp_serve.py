"""serve-mcp: the host's tools served over stdio, driven by the SDK's own client,
and imported back by a second host (round trip)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import mcp_types
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_helpers import REPO

from amplifier_tools import ContractError, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.errors import ConfigError
from amplifier_tools.mcp.server import build_server, to_call_tool_result
from amplifier_tools.mcp.settings import ServeSettings


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def write_inner_config(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A served host: files under root/, write needs a scope the MCP caller lacks, audit on."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the root\n")
    (tmp_path / "secret.txt").write_text("outside the root\n")
    audit = tmp_path / "audit.jsonl"
    config = tmp_path / "inner.toml"
    config.write_text(f"""
working_dir = {toml_string(str(root))}

[tools."local::fs.write_file".security]
required_scopes = ["fs.write"]

[plugins.audit]
path = {toml_string(str(audit))}

[plugins.mcp.serve]
principal = "mcp-client"
scopes = ["fs.read"]
tools = ["*"]
""")
    return config, root, audit


def server_params(args: list[str], tmp_path: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=args, env={"PYTHONPATH": REPO}, cwd=str(tmp_path))


def audit_records(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "call"]


async def test_serve_mcp_lists_tools_serves_read_file_denies_outside_and_audits_both(tmp_path: Path) -> None:
    config, _root, audit = write_inner_config(tmp_path)
    params = server_params(["-m", "amplifier_tools", "--config", str(config), "serve-mcp"], tmp_path)
    async with Client(params) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"fs_read_file", "fs_write_file", "fs_list_dir"} <= set(tools)
        read = tools["fs_read_file"]
        assert read.annotations is not None and read.annotations.read_only_hint is True
        assert tools["fs_write_file"].annotations.read_only_hint is False  # type: ignore[union-attr]
        assert read.input_schema["properties"]["path"]["type"] == "string"

        ok = await client.call_tool("fs_read_file", {"path": "hello.txt"})
        assert not ok.is_error
        assert "hello from the root" in ok.content[0].text  # type: ignore[union-attr]

        denied = await client.call_tool("fs_read_file", {"path": "../secret.txt"})
        assert denied.is_error
        error = json.loads(denied.content[0].text)["error"]  # type: ignore[union-attr]
        assert (error["type"], error["code"]) == ("AuthError", "path_denied")
        assert "outside the root" not in denied.content[0].text  # type: ignore[union-attr]

    records = audit_records(audit)
    assert [(r["tool"], r["status"]) for r in records] == [
        ("local::fs.read_file", "ok"), ("local::fs.read_file", "error")]
    assert {r["principal"] for r in records} == {"mcp-client"}
    assert records[1]["error"]["code"] == "path_denied"


async def test_serve_mcp_caller_scopes_come_from_config_not_the_client(tmp_path: Path) -> None:
    config, root, audit = write_inner_config(tmp_path)
    params = server_params(["-m", "amplifier_tools.mcp", "serve", "--config", str(config)], tmp_path)
    async with Client(params) as client:
        result = await client.call_tool("fs_write_file", {"path": "new.txt", "content": "x"})
        assert result.is_error
        error = json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
        assert (error["type"], error["code"]) == ("AuthError", "missing_scope")
    assert not (root / "new.txt").exists()
    assert audit_records(audit)[-1]["scopes"] == ["fs.read"]


async def test_round_trip_import_of_our_own_server_still_enforces_the_inner_policies(tmp_path: Path) -> None:
    config, root, audit = write_inner_config(tmp_path)
    outer = {"plugins": {"mcp": {"servers": {"inner": {
        "command": sys.executable, "args": ["-m", "amplifier_tools.mcp", "serve", "--config", str(config)],
        "env": {"PYTHONPATH": REPO, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    }}}}}
    async with ToolHost(config=outer, builtins=["mcp"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        specs = {spec.name: spec for spec in host.specs}
        assert specs["mcp::inner::fs_read_file"].effect.value == "Pure"
        ok = await host.call("mcp::inner::fs_read_file", {"path": "hello.txt"})
        assert ok.success, ok.error
        assert "hello from the root" in json.dumps(ok.output)

        outside = await host.call("mcp::inner::fs_read_file", {"path": "../secret.txt"})
        assert outside.error is not None
        assert (outside.error["remote_type"], outside.error["remote_code"]) == ("AuthError", "path_denied")

        write = await host.call("mcp::inner::fs_write_file", {"path": "x.txt", "content": "x"})
        assert write.error is not None and write.error["remote_code"] == "missing_scope"
    assert not (root / "x.txt").exists()
    assert [r["status"] for r in audit_records(audit)] == ["ok", "error", "error"]


class _Greeter:
    name = "greet"
    description = "Greets."
    spec = ToolSpec(name="greet", effect="Pure", input_schema={"type": "object", "properties": {
        "who": {"type": "string"}}, "required": ["who"]})

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output={"greeting": f"hello {input['who']}"})


class _Hidden(_Greeter):
    name = "hidden"
    spec = ToolSpec(name="hidden", effect="Pure")


class _GreeterAndHidden:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Greeter())
        await coordinator.mount("tools", _Hidden())


async def test_only_listed_tools_are_exposed_and_others_cannot_be_called(host_factory: Any) -> None:
    host = await host_factory(_GreeterAndHidden())
    server = build_server(host, ServeSettings(tools=("greet",)))
    async with Client(server) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["greet"]
        ok = await client.call_tool("greet", {"who": "you"})
        assert ok.structured_content == {"greeting": "hello you"}
        for name in ("hidden", "nosuch"):  # not exposed, not mounted: both the spec's unknown-tool error
            with pytest.raises(MCPError) as refused:
                await client.call_tool(name, {})
            assert refused.value.error.code == mcp_types.INVALID_PARAMS and name in refused.value.error.message
        bad = await client.call_tool("greet", {"who": 3})
        assert bad.is_error and json.loads(bad.content[0].text)["error"]["pointer"] == "/who"  # type: ignore[union-attr]


async def test_no_tool_is_exposed_unless_listed_and_star_exposes_all(host_factory: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    host = await host_factory(_GreeterAndHidden())
    async with Client(build_server(host, ServeSettings())) as client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError):
            await client.call_tool("greet", {"who": "you"})
    assert "no tool is exposed" in caplog.text and "plugins.mcp.serve] tools" in caplog.text
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        assert sorted(tool.name for tool in (await client.list_tools()).tools) == ["greet", "hidden"]


def test_tools_star_stands_alone() -> None:
    from amplifier_tools.plugin_settings import structure_settings

    with pytest.raises(ConfigError, match=r"plugins\.mcp\.serve\.tools"):
        structure_settings({"tools": ["*", "greet"]}, ServeSettings, "plugins.mcp.serve")


def test_meta_keys_follow_the_spec_prefix_rule() -> None:
    import re

    from amplifier_tools.definitions import tool_definitions

    (definition,) = tool_definitions([_Greeter.spec], "mcp")
    label = r"[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    assert definition["_meta"] and all(re.fullmatch(rf"{label}(?:\.{label})*/[A-Za-z0-9_.-]+", key)
                                       for key in definition["_meta"])


async def test_exposing_an_unmounted_tool_is_a_config_error(host_factory: Any) -> None:
    host = await host_factory()
    with pytest.raises(ConfigError, match=r"plugins\.mcp\.serve\.tools: names no mounted tool 'nope'"):
        build_server(host, ServeSettings(tools=("nope",)))


@pytest.mark.parametrize("typo", ["read_fiel", "fs_raed_file", "local::fs.read_fiel"])
async def test_a_misspelled_exposed_tool_gets_a_did_you_mean(host_factory: Any, typo: str) -> None:
    """Found by a newcomer's trial: ``tools = ["read_fiel"]`` said only that no such tool is mounted,
    where calling an unknown tool names the close ones; a close model name suggests the contract name."""
    host = await host_factory(builtins=["filesystem"])
    with pytest.raises(ConfigError, match=rf"plugins\.mcp\.serve\.tools: names no mounted tool '{typo}'") as refused:
        build_server(host, ServeSettings(tools=(typo,)))
    hint = refused.value.hint
    assert hint is not None and hint.startswith("did you mean 'local::fs.read_file'"), hint
    assert "'fs_" not in hint, hint  # the setting takes contract names: none suggested by its model name


def test_failed_result_becomes_is_error_with_the_typed_error_as_json() -> None:
    error = ContractError("bad", code="invalid_input")
    result = ToolResult(False, None, {"type": error.category, "code": error.code, "message": error.message})
    mapped = to_call_tool_result(result)
    assert mapped.is_error is True
    assert json.loads(mapped.content[0].text) == {  # type: ignore[union-attr]
        "error": {"type": "ContractError", "code": "invalid_input", "message": "bad"}}


def test_content_blocks_are_served_as_mcp_text_and_image_content() -> None:
    """A seed tool's text and image blocks (Amplifier's spelling) reach MCP clients as such."""
    result = ToolResult(True, "see image", None, {"content": [
        {"type": "text", "text": "see image"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]})
    mapped = to_call_tool_result(result)
    assert [block.type for block in mapped.content] == ["text", "image"]
    assert mapped.content[1].data == "iVBORw0KGgo=" and mapped.content[1].mime_type == "image/png"  # type: ignore[union-attr]
    # a block MCP cannot carry: the whole result falls back to its text, never a part of the content
    odd = ToolResult(True, "x", None, {"content": [{"type": "text", "text": "a"}, {"type": "video"}]})
    assert [block.type for block in to_call_tool_result(odd).content] == ["text"]
    assert to_call_tool_result(odd).content[0].text == "x"  # type: ignore[union-attr]
