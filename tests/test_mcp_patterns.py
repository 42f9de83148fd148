"""Regular expressions in an imported server's schemas (issue 14, finding 7): run on RE2 in
linear time, or the tool is refused at mount; the host's own tools keep Python's ``re``."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("re2")

from mcp_helpers import hostile

from amplifier_tools import Effect, PluginLoadError, ToolHost, ToolResult, ToolSpec

EVIL = "^(a+)+$"  # catastrophic backtracking on Python's re: seconds at 25 characters, doubling
ATTACK = "a" * 26 + "!"


def evil_tool(name: str = "evil", **schemas: Any) -> dict[str, Any]:
    return {"name": name, "description": "hostile schema",
            "inputSchema": schemas.get("input", {"type": "object"}), **(
                {"outputSchema": schemas["output"]} if "output" in schemas else {})}


TEXT_WITH_EVIL_PATTERN = {"type": "object", "properties": {"text": {"type": "string", "pattern": EVIL}}}


async def test_backtracking_output_pattern_is_checked_in_linear_time(tmp_path: Path) -> None:
    async with hostile(tmp_path, tools=[evil_tool(output=TEXT_WITH_EVIL_PATTERN)]) as host:
        start = time.perf_counter()
        result = await host.call("mcp::h::evil", {"text": ATTACK})
        elapsed = time.perf_counter() - start
        assert not result.success and result.error is not None
        assert result.error["type"] == "ContractError" and "does not match" in result.error["message"]
        assert elapsed < 2.0, f"checking the output took {elapsed:.1f} s"
        ok = await host.call("mcp::h::evil", {"text": "aaaa"})
        assert ok.success and ok.output == {"text": "aaaa"}


async def test_backtracking_input_pattern_is_checked_in_linear_time(tmp_path: Path) -> None:
    async with hostile(tmp_path, tools=[evil_tool(input=TEXT_WITH_EVIL_PATTERN)]) as host:
        start = time.perf_counter()
        result = await host.call("mcp::h::evil", {"text": ATTACK})
        elapsed = time.perf_counter() - start
        assert not result.success and result.error is not None
        assert result.error["type"] == "ContractError" and result.error.get("pointer") == "/text"
        assert elapsed < 2.0, f"checking the input took {elapsed:.1f} s"
        assert (await host.call("mcp::h::evil", {"text": "aaa"})).success


async def test_backtracking_pattern_properties_are_checked_in_linear_time(tmp_path: Path) -> None:
    schema = {"type": "object", "patternProperties": {EVIL: {"type": "string"}}, "additionalProperties": False}
    async with hostile(tmp_path, tools=[evil_tool(input=schema)]) as host:
        start = time.perf_counter()
        result = await host.call("mcp::h::evil", {ATTACK: "x"})
        elapsed = time.perf_counter() - start
        assert not result.success and result.error is not None
        assert "does not match any of the regexes" in result.error["message"]
        assert elapsed < 2.0, f"checking the input took {elapsed:.1f} s"
        assert (await host.call("mcp::h::evil", {"aaa": "x"})).success
        bad = await host.call("mcp::h::evil", {"aaa": 1})  # the matching property's schema applies
        assert not bad.success and bad.error is not None and bad.error["type"] == "ContractError"


@pytest.mark.parametrize(("schema", "pointer"), [
    ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"}}},
     "/properties/p/pattern"),
    ({"type": "object", "patternProperties": {"^(a)\\1$": {}}}, "/patternProperties/^(a)\\1$"),
    ({"type": "object", "$defs": {"d": {"pattern": "(?<!x)y"}},
      "properties": {"p": {"$ref": "#/$defs/d"}}}, "/$defs/d/pattern"),
    ({"type": "object", "properties": {"p": {"$schema": "https://json-schema.org/draft/2020-12/schema",
                                             "pattern": "a"}}}, "/properties/p/$schema"),
    ({"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False},
     "/unevaluatedProperties"),
])
async def test_pattern_re2_cannot_run_refuses_start_naming_server_tool_and_pointer(
        tmp_path: Path, schema: dict[str, Any], pointer: str) -> None:
    with pytest.raises(PluginLoadError) as caught:
        async with hostile(tmp_path, tools=[evil_tool(input=schema)]):
            pass
    message = str(caught.value)
    assert "MCP server 'h' tool 'evil'" in message and f"inputSchema at {pointer}" in message
    assert "plugins.mcp.servers.h.on_unsupported_pattern" in message


async def test_unsupported_pattern_with_skip_mounts_the_other_tools(tmp_path: Path) -> None:
    lookahead = {"type": "object", "properties": {"text": {"type": "string", "pattern": "a(?=b)"}}}
    async with hostile(tmp_path, tools=[evil_tool(output=lookahead)], on_unsupported_pattern="skip") as host:
        names = {spec.name for spec in host.specs}
        assert "mcp::h::evil" not in names and "mcp::h::echo" in names


async def test_ecma_unicode_escape_runs_on_re2(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": "^caf\\u00e9$"}}}
    async with hostile(tmp_path, tools=[evil_tool(input=schema)]) as host:
        assert (await host.call("mcp::h::evil", {"text": "café"})).success
        assert not (await host.call("mcp::h::evil", {"text": "cafe"})).success


class LocalLookahead:
    """The host's own tool, with a pattern only Python's re can run (a lookahead)."""

    name = "local_lookahead"
    spec = ToolSpec(name="local_lookahead", description="local", effect=Effect.Pure, input_schema={
        "type": "object", "properties": {"p": {"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]+$"}}})

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(True, input["p"])


async def test_host_own_tools_keep_python_re(tmp_path: Path) -> None:
    async with ToolHost(plugins=[LocalLookahead()], builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        assert (await host.call("local_lookahead", {"p": "abc1"})).success
        assert not (await host.call("local_lookahead", {"p": "abc"})).success


#: RE2's DFA explodes on this (2^n states for "the n-th character from the end is an a"); its
#: fallback costs time per character times the program's size (found by review: 11 s end to end).
DFA_BOMB = "^[ab]*a[ab]{999}$"


async def test_a_pattern_too_large_for_re2_to_run_fast_is_refused_at_start(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": DFA_BOMB}}}
    with pytest.raises(PluginLoadError) as caught:
        async with hostile(tmp_path, tools=[evil_tool(output=schema)]):
            pass
    assert "instructions, more than 1000" in str(caught.value) and "outputSchema" in str(caught.value)


async def test_a_long_string_against_a_costly_pattern_fails_validation_without_stalling(tmp_path: Path) -> None:
    """Below the size limit a DFA-exploding pattern still costs per character: a string too long for
    the work bound is not matched (the call fails validation) instead of stalling the event loop."""
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": "^[ab]*a[ab]{400}$"}}}
    rng = random.Random(7)  # random text: every position starts new DFA states
    long_text = "".join(rng.choice("ab") for _ in range(600_000))
    async with hostile(tmp_path, tools=[evil_tool(output=schema)]) as host:
        start = time.perf_counter()
        result = await host.call("mcp::h::evil", {"text": long_text})
        elapsed = time.perf_counter() - start
        assert not result.success and result.error is not None and result.error["type"] == "ContractError"
        assert elapsed < 3.0, f"checking the output took {elapsed:.1f} s"
        assert (await host.call("mcp::h::evil", {"text": "a" + "b" * 400})).success
