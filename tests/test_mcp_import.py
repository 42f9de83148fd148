"""Importing a real MCP server (tests/mcp_fixtures/fixture_server.py, written with the SDK)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import alive, fixture_server, read_pid, wait_dead

from amplifier_tools import Deny, Effect, PluginLoadError, ToolHost, hookimpl


def host_with(tmp_path: Path, *plugins: Any, host_tools: dict[str, Any] | None = None, **server: Any) -> ToolHost:
    config: dict[str, Any] = {"plugins": {"mcp": {"servers": {"fx": fixture_server(**server)}}}}
    if host_tools:
        config["tools"] = host_tools
    return ToolHost(config=config, builtins=["mcp"], plugins=plugins, entry_points=False,
                    working_dir=tmp_path, discover=False)


def hash_of(definition: dict[str, Any]) -> str:
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


ADD_DEFINITION = {
    "name": "add", "description": "Add two integers.",
    "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]},
    "annotations": {"readOnlyHint": False, "idempotentHint": True},
}


async def test_tools_are_mounted_with_names_effects_server_version_and_hashes(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        specs = {spec.name: spec for spec in host.specs}
        assert set(specs) == {f"mcp::fx::{n}" for n in (
            "echo", "add", "issues.create", "local_write", "fail", "bad_output", "sleep", "crash", "getenv")}
        assert specs["mcp::fx::echo"].effect is Effect.Pure  # readOnlyHint
        assert specs["mcp::fx::add"].effect is Effect.IdempotentWrite  # idempotentHint
        assert specs["mcp::fx::issues.create"].effect is Effect.ExternalSideEffects  # no hints: MCP defaults
        assert specs["mcp::fx::local_write"].effect is Effect.NonIdempotentWrite  # destructive, closed world
        add = specs["mcp::fx::add"]
        assert add.version == "1.4.2" and add.owner == "fixture-server"
        assert add.input_schema == ADD_DEFINITION["inputSchema"]
        assert hash_of(ADD_DEFINITION) in add.tags
        assert "mcp-server-version:1.4.2" in add.tags
        assert specs["mcp::fx::echo"].output_schema == {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        names = {d["function"]["name"] for d in host.tool_definitions("openai")}
        assert "mcp__fx__issues_create" in names


async def test_call_returns_structured_content_and_records_the_server(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        result = await host.call("mcp::fx::echo", {"text": "hi"})
        assert result.success, result.error
        assert result.output == {"text": "hi"}
        assert result.metadata["mcp"]["server_version"] == "1.4.2"
        text = await host.call("mcp__fx__add", {"a": 2, "b": 3})  # model-facing name works too
        assert text.output == "5"


async def test_input_is_checked_against_the_server_schema_before_it_is_sent(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        result = await host.call("mcp::fx::add", {"a": 2, "b": "three"})
        assert result.error is not None and result.error["code"] == "invalid_input"
        assert result.error["pointer"] == "/b"


async def test_veto_hook_blocks_the_call_before_the_server_runs_it(tmp_path: Path) -> None:
    log = tmp_path / "issues.log"

    class NoIssues:
        @hookimpl
        def tool_pre(self, call: Any, spec: Any) -> Deny | None:
            if spec.name == "mcp::fx::issues.create" and call.arguments.get("title") == "spam":
                return Deny("no spam issues", code="no_spam")
            return None

    async with host_with(tmp_path, NoIssues(), env={"FIXTURE_LOG_FILE": str(log)}) as host:
        denied = await host.call("mcp::fx::issues.create", {"title": "spam"})
        assert denied.error is not None
        assert (denied.error["type"], denied.error["code"]) == ("PolicyError", "no_spam")
        assert not log.exists()
        allowed = await host.call("mcp::fx::issues.create", {"title": "bug"})
        assert allowed.success
        assert log.read_text() == "issues.create bug\n"


async def test_pinned_hash_mismatch_refuses_start_naming_tool_and_both_hashes(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with host_with(tmp_path) as host:
        pinned = next(t for t in host.specs if t.name == "mcp::fx::echo").tags[2]
    host = host_with(tmp_path, pins={"echo": pinned},
                     env={"FIXTURE_VARIANT": "changed", "FIXTURE_PID_FILE": str(pid_file)})
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    message = str(info.value)
    assert "'echo' definition changed" in message and pinned in message
    assert "server now sends sha256:" in message
    assert message.count("sha256:") == 2
    assert wait_dead(read_pid(pid_file))  # the refused server is not left running


async def test_pin_mismatch_with_skip_mounts_only_the_unchanged_tools(tmp_path: Path) -> None:
    async with host_with(tmp_path, pins={"echo": "sha256:" + "0" * 64, "add": hash_of(ADD_DEFINITION)},
                         on_pin_mismatch="skip") as host:
        names = {spec.name for spec in host.specs}
        assert "mcp::fx::echo" not in names and "mcp::fx::add" in names


async def test_pinned_server_version_mismatch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match=r"reports version '1\.4\.2', pinned '1\.5\.0'"):
        async with host_with(tmp_path, version="1.5.0"):
            pass


async def test_is_error_result_becomes_an_execution_error_with_the_server_text(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        result = await host.call("mcp::fx::fail", {})
        assert result.error is not None
        assert (result.error["type"], result.error["code"]) == ("ExecutionError", "mcp_tool_error")
        assert "the backend said no" in result.error["message"]


async def test_output_breaking_the_server_output_schema_is_a_contract_error(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        result = await host.call("mcp::fx::bad_output", {})
        assert result.error is not None
        assert (result.error["type"], result.error["code"]) == ("ContractError", "invalid_output")
        assert result.error["pointer"] == "/n" and result.output is None


async def test_timeout_fails_the_call_and_cancels_the_request_on_the_server(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    async with host_with(tmp_path, env={"FIXTURE_CANCEL_FILE": str(marker)},
                         host_tools={"mcp::fx::sleep": {"policies": {"timeout_ms": 200}}}) as host:
        result = await host.call("mcp::fx::sleep", {"seconds": 30})
        assert result.error is not None and result.error["code"] == "timeout"
        for _ in range(1000):  # up to 20 s on a loaded machine; usually a few ms
            if marker.exists():
                break
            await asyncio.sleep(0.02)
        assert marker.read_text() == "cancelled"
        assert (await host.call("mcp::fx::echo", {"text": "still up"})).success


async def test_dead_server_is_an_execution_error_and_restarts_on_the_next_call(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    async with host_with(tmp_path, env={"FIXTURE_PID_FILE": str(pid_file)}) as host:
        first = read_pid(pid_file)
        crashed = await host.call("mcp::fx::crash", {})
        assert crashed.error is not None
        assert (crashed.error["type"], crashed.error["code"]) == ("ExecutionError", "mcp_server_died")
        assert crashed.error["retryable"] is True
        again = await host.call("mcp::fx::echo", {"text": "back"})
        assert again.success, again.error
        second = read_pid(pid_file)
        assert second != first and alive(second) and not alive(first)


async def test_a_restarted_server_reporting_another_version_than_pinned_is_refused(tmp_path: Path) -> None:
    """Only the tool hashes were compared on restart (found by review)."""
    version = tmp_path / "version"
    version.write_text("1.4.2")
    async with host_with(tmp_path, version="1.4.2", env={"FIXTURE_VERSION_FILE": str(version)}) as host:
        assert (await host.call("mcp::fx::echo", {"text": "pinned"})).success
        version.write_text("6.6.6")
        await host.call("mcp::fx::crash", {})
        result = await host.call("mcp::fx::echo", {"text": "after restart"})
        assert result.error is not None and result.error["code"] == "pin_mismatch", result.error
        assert "'6.6.6'" in result.error["message"] and "'1.4.2'" in result.error["message"]


async def test_restarts_are_bounded_by_max_restarts(tmp_path: Path) -> None:
    async with host_with(tmp_path, max_restarts=1) as host:
        await host.call("mcp::fx::crash", {})
        assert (await host.call("mcp::fx::echo", {"text": "1"})).success
        await host.call("mcp::fx::crash", {})
        result = await host.call("mcp::fx::echo", {"text": "2"})
        assert result.error is not None and result.error["code"] == "mcp_server_unavailable"


async def test_server_process_group_never_outlives_the_host(tmp_path: Path) -> None:
    pid_file, child_file = tmp_path / "pid", tmp_path / "child"
    async with host_with(tmp_path, env={"FIXTURE_PID_FILE": str(pid_file),
                                        "FIXTURE_CHILD_PID_FILE": str(child_file)}):
        server, child = read_pid(pid_file), read_pid(child_file)
        assert alive(server) and alive(child)
    # The server exits on stdin EOF; the child it started must not survive either.
    assert wait_dead(server, 20.0) and wait_dead(child, 20.0)


async def test_server_environment_is_only_the_allowlist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_SECRET_TOKEN", "s3cret")
    monkeypatch.setenv("PASS_ME", "passed")
    async with host_with(tmp_path, env={"LITERAL": "v"}, env_passthrough=["PASS_ME", "NOT_SET_ANYWHERE"]) as host:
        result = await host.call("mcp::fx::getenv", {"names": ["HOST_SECRET_TOKEN", "PASS_ME", "LITERAL", "HOME"]})
        assert json.loads(result.output) == {"HOST_SECRET_TOKEN": None, "PASS_ME": "passed",
                                             "LITERAL": "v", "HOME": None}


async def test_config_overrides_untrusted_effect_hints(tmp_path: Path) -> None:
    async with host_with(tmp_path, host_tools={"mcp::fx::add": {"effect": "NonIdempotentWrite"}},
                         tools={"echo": {"effect": "ExternalSideEffects"}, "crash": {"enabled": False}}) as host:
        specs = {spec.name: spec for spec in host.specs}
        assert specs["mcp::fx::echo"].effect is Effect.ExternalSideEffects  # plugin section
        assert specs["mcp::fx::add"].effect is Effect.NonIdempotentWrite  # host per-tool override
        assert "mcp::fx::crash" not in specs
        # The override decides the effect, for policy; the server's hints are shown as it gave them.
        annotations = {d["name"]: d.get("annotations") for d in host.tool_definitions("mcp")}
        assert annotations["mcp__fx__echo"] == {"readOnlyHint": True}
        assert annotations["mcp__fx__issues_create"] is None  # given none, shown none


@pytest.mark.parametrize(("server", "key"), [
    ({"bogus": 1}, r"plugins\.mcp\.servers\.fx\.bogus: unknown key"),
    ({"args": "not-a-list"}, r"plugins\.mcp\.servers\.fx\.args: must be a list of strings"),
    ({"tools": {"echo": {"effect": "Harmless"}}}, r"plugins\.mcp\.servers\.fx\.tools\.echo\.effect"),
    ({"tools": {"nope": {"enabled": False}}}, r"lists no tool 'nope'"),
    ({"on_pin_mismatch": "warn"}, r"plugins\.mcp\.servers\.fx\.on_pin_mismatch"),
])
async def test_bad_server_config_names_the_key(tmp_path: Path, server: dict[str, Any], key: str) -> None:
    with pytest.raises(PluginLoadError, match=key):
        async with host_with(tmp_path, **server):
            pass


async def test_missing_command_is_a_config_error(tmp_path: Path) -> None:
    host = ToolHost(config={"plugins": {"mcp": {"servers": {"fx": {"args": []}}}}}, builtins=["mcp"],
                    entry_points=False, working_dir=tmp_path, discover=False)
    with pytest.raises(PluginLoadError, match=r"plugins\.mcp\.servers\.fx\.command: a server has either command"):
        await host.start()


async def test_server_that_cannot_start_fails_host_start(tmp_path: Path) -> None:
    host = ToolHost(config={"plugins": {"mcp": {"servers": {"fx": {"command": str(tmp_path / "no-such-server")}}}}},
                    builtins=["mcp"], entry_points=False, working_dir=tmp_path, discover=False)
    with pytest.raises(PluginLoadError, match="no-such-server"):
        await host.start()


async def test_configured_servers_without_the_sdk_give_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # what an environment without the extra looks like
    with pytest.raises(PluginLoadError, match=r"'mcp' extra is not installed \(pip install 'amplifier-tools\[mcp\]'\)"):
        async with host_with(tmp_path):
            pass


def test_plugin_is_inert_and_never_imports_the_sdk_without_servers(tmp_path: Path) -> None:
    import subprocess

    code = ("import asyncio, sys\n"
            "from amplifier_tools import ToolHost\n"
            "async def main():\n"
            "    async with ToolHost(config={}, entry_points=False, discover=False) as host:\n"
            "        print(sorted(p.name for p in host.plugins), 'mcp' in sys.modules)\n"
            "asyncio.run(main())\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("False")
    assert "'mcp'" in out.stdout



async def test_concurrent_calls_share_one_server_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    async with host_with(tmp_path) as host:
        results = await asyncio.gather(*(host.call("mcp::fx::add", {"a": i, "b": 1}) for i in range(20)))
        assert [r.output for r in results] == [str(i + 1) for i in range(20)]
