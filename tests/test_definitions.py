"""Tool definitions for model APIs and the reversible short names."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ConfigError, ContractError, PluginLoadError, ToolResult, ToolSpec
from amplifier_tools.definitions import model_name

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Namespaced:
    def __init__(self, name: str, **fields: Any) -> None:
        self.spec = ToolSpec(name=name, description=f"tool {name}", **fields)
        self.name = name
        self.description = self.spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=self.name)


@pytest.mark.parametrize(
    ("canonical", "short"),
    [
        ("local::fs.write", "fs_write"),
        ("mcp::github::issues.create", "mcp__github__issues_create"),
        ("read_file", "read_file"),
        ("local::a-b", "a-b"),
    ],
)
def test_model_name_is_api_safe(canonical: str, short: str) -> None:
    assert model_name(canonical) == short
    assert OPENAI_NAME.match(short)


def test_long_names_stay_distinct_and_within_64_chars() -> None:
    a = model_name("mcp::server::" + "x" * 80 + ".one")
    b = model_name("mcp::server::" + "x" * 80 + ".two")
    assert a != b and len(a) <= 64 and len(b) <= 64 and OPENAI_NAME.match(a)


async def test_definitions_are_valid_for_each_api_and_calls_accept_both_names(host_factory: Any) -> None:
    tools = [
        Namespaced("local::fs.write", effect="IdempotentWrite", output_schema={"type": "string"}),
        Namespaced("mcp::github::issues.create", effect="NonIdempotentWrite"),
    ]
    host = await host_factory(ToolsPlugin(*tools))
    openai = host.tool_definitions("openai")
    assert [d["function"]["name"] for d in openai] == ["fs_write", "mcp__github__issues_create"]
    assert all(OPENAI_NAME.match(d["function"]["name"]) for d in openai)
    assert openai[0]["function"]["parameters"] == {"type": "object"}
    anthropic = host.tool_definitions("anthropic")
    assert anthropic[1] == {
        "name": "mcp__github__issues_create",
        "description": "tool mcp::github::issues.create",
        "input_schema": {"type": "object"},
    }
    mcp = host.tool_definitions("mcp")
    assert "outputSchema" not in mcp[0]  # MCP takes an object root only (tests/test_newcomer_s39.py)
    assert mcp[0]["annotations"]["idempotentHint"] is True and mcp[0]["annotations"]["readOnlyHint"] is False
    assert mcp[1]["annotations"]["destructiveHint"] is True
    assert mcp[1]["_meta"]["amplifier-tools/name"] == "mcp::github::issues.create"
    by_short = await host.call("fs_write", {})
    by_canonical = await host.call("local::fs.write", {})
    assert by_short.output == by_canonical.output == "local::fs.write"
    with pytest.raises(ValueError, match="unknown tool definition format 'gemini'"):
        host.tool_definitions("gemini")


async def test_hooks_see_the_canonical_name_when_called_by_short_name(host_factory: Any) -> None:
    from amplifier_tools.pytest_plugin import HookRecorder as Recorder

    recorder = Recorder()
    host = await host_factory(ToolsPlugin(Namespaced("local::fs.write")), recorder)
    await host.call("fs_write", {})
    assert recorder.calls[0][1] == "local::fs.write"


async def test_short_name_collision_fails_mount_naming_both_tools(host_factory: Any) -> None:
    with pytest.raises(PluginLoadError, match="'local::fs.write'.*'fs_write'.*give each tool its own name"):
        await host_factory(ToolsPlugin(Namespaced("fs_write"), Namespaced("local::fs.write")))


async def test_duplicate_tool_names_fail_mount(host_factory: Any) -> None:
    """One plugin mounting two tools of one name is the plugin's bug: disable_plugins is no advice
    for it (it was, found by a new-user trial)."""
    with pytest.raises(PluginLoadError, match="already mounted.*give each tool its own name") as caught:
        await host_factory(ToolsPlugin(EchoTool(), EchoTool()))
    assert "disable_plugins" not in str(caught.value)


async def test_a_tool_colliding_with_another_plugins_tool_stops_the_start_naming_both(host_factory: Any) -> None:
    """An installed module whose ``bash`` collides with the built-in never falls back to the other tool."""

    class Bash(EchoTool):
        name = "bash"

    class LocalBash(EchoTool):
        name = "local::bash"

    with pytest.raises(ConfigError) as caught:
        await host_factory(ToolsPlugin(LocalBash(), name="builtin-like"), ToolsPlugin(Bash(), name="tool-bash"))
    message = str(caught.value)
    assert "'builtin-like'" in message and "'tool-bash'" in message and "disable_plugins" in message



async def test_a_bash_colliding_with_the_built_in_says_which_one_is_sandboxed(tmp_path: Any) -> None:
    """Found by a new-user trial: the hint offered ``disable_plugins = ['bash']`` as freely as the
    module's name, and following it gave the model Amplifier's bash, unconfined (the host's
    environment, filesystem and network) without a word."""
    from amplifier_tools import ToolHost

    class Bash(EchoTool):
        name = "bash"

    host = ToolHost(plugins=[ToolsPlugin(Bash(), name="tool-bash")], builtins=["bash"], entry_points=False,
                    working_dir=tmp_path, discover=False)
    with pytest.raises(ConfigError) as caught:
        await host.start()
    await host.close()
    message, hint = str(caught.value), caught.value.hint or ""
    assert "disable_plugins = ['tool-bash']" in message and "runs commands in the sandbox" in message
    assert "unconfined" in message and "'tool-bash'" in hint and "disable_plugins = ['bash']" not in message

@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"name": "bad name"}, "tool name 'bad name' is not valid"),
        ({"name": "t", "version": "1.0"}, "not a SemVer version"),
        ({"name": "t", "input_schema": {"type": "objekt"}}, "input_schema is not a valid JSON Schema at /type"),
        ({"name": "t", "input_schema": {"type": "string"}}, "input_schema must describe an object"),
        ({"name": "t", "effect": "Sometimes"}, "effect must be 'Pure', 'IdempotentWrite', 'NonIdempotentWrite' or "
                                               "'ExternalSideEffects', got 'Sometimes'"),
        ({"name": "t", "effect": "puree"}, "got 'puree' (did you mean 'Pure'?)"),
        ({"name": "t", "idempotency_key": "yes"},
         "idempotency_key must be 'required', 'optional' or 'none', got 'yes'"),
    ],
)
async def test_invalid_contracts_are_refused_at_mount(host_factory: Any, fields: dict[str, Any], fragment: str) -> None:
    class Tool:
        description = "d"

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult()

    tool = Tool()
    for key, value in fields.items():
        setattr(tool, key, value)
    with pytest.raises(PluginLoadError) as info:
        await host_factory(ToolsPlugin(tool))
    assert fragment in str(info.value)
    assert isinstance(info.value.__cause__, ContractError)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"effect": "Puree"}, "effect must be 'Pure', 'IdempotentWrite', 'NonIdempotentWrite' or "
                              "'ExternalSideEffects', got 'Puree' (did you mean 'Pure'?)"),
        ({"effect": 3}, "effect must be 'Pure', 'IdempotentWrite', 'NonIdempotentWrite' or "
                        "'ExternalSideEffects', got 3"),
        ({"idempotency_key": "require"}, "idempotency_key must be 'required', 'optional' or 'none', "
                                         "got 'require' (did you mean 'required'?)"),
    ],
)
def test_spec_enum_fields_name_the_field_and_its_values(fields: dict[str, Any], message: str) -> None:
    """Found by a newcomer's trial: ``ToolSpec(effect="Puree")`` (and ``@tool(effect=...)``,
    ``MockTool(effect=...)``) said only "'Puree' is not a valid Effect": neither the field nor the
    values it takes."""
    from amplifier_tools import tool
    from amplifier_tools.pytest_plugin import MockTool

    with pytest.raises(ValueError) as direct:
        ToolSpec(name="local::x.y", **fields)
    assert str(direct.value) == message
    with pytest.raises(ValueError) as mocked:
        MockTool(name="local::x.y", **fields)
    assert str(mocked.value) == message
    with pytest.raises(ValueError) as decorated:
        tool(lambda: None, name="local::x.y", **fields)
    assert str(decorated.value) == message
    assert ToolSpec(name="t", effect="Pure", idempotency_key="optional").effect.value == "Pure"


async def test_seed_tool_may_carry_policy_objects_as_attributes(host_factory: Any) -> None:
    from amplifier_tools import Policies, Security

    class Seedish:
        name = "seedish"
        description = "a seed-style tool with contract objects"
        policies = Policies(timeout_ms=1234)
        security = Security(required_scopes=("x:read",))

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output="ok")

    host = await host_factory(ToolsPlugin(Seedish()))
    assert host.specs[0].policies.timeout_ms == 1234 and host.specs[0].security.required_scopes == ("x:read",)
