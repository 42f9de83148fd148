"""Found by attack on today's changes."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonschema.validators
import pytest

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.errors import ContractError, PluginLoadError
from amplifier_tools.schema import _local_registry, compile_validator


def _mount(schema: dict[str, Any]) -> Any:
    return compile_validator(schema, owner="x::t", which="input_schema")


def _jsonschema(schema: dict[str, Any], instance: Any) -> bool:
    return bool(jsonschema.validators.validator_for(schema)(schema, registry=_local_registry()).is_valid(instance))


# -- schema: a reference's target was scoped by its relative $id twice ------------------------------

def test_a_ref_to_a_schema_with_a_relative_id_mounts_as_jsonschema_reads_it() -> None:
    """The target's resolver is already in its $id; applying the relative $id again moved the base
    URI to .../sub/sub/ and a valid schema was refused."""
    schema = {"$id": "http://x.test/root.json",
              "$defs": {"t": {"$id": "sub/", "$defs": {"i": {"$id": "item.json", "type": "string"}},
                              "$ref": "item.json"}},
              "properties": {"a": {"$ref": "sub/"}, "b": {"$ref": "#/$defs/t"}}}
    validator = _mount(schema)
    for instance in ({"a": "s", "b": "s"}, {"a": 1}, {"b": 1}):
        assert validator.is_valid(instance) == _jsonschema(schema, instance)
    assert not validator.is_valid({"a": 1})


def test_a_ref_that_resolves_only_under_a_doubled_base_is_refused_at_mount() -> None:
    """It was accepted (the check resolved it against .../sub/sub/) and every call reaching it
    failed as an internal error (Unresolvable)."""
    schema = {"$id": "http://x.test/root.json",
              "$defs": {"t": {"$id": "sub/", "$ref": "x.json"}, "u": {"$id": "sub/sub/x.json", "type": "string"}},
              "properties": {"a": {"$ref": "sub/"}}}
    with pytest.raises(ContractError, match="resolves to nothing"):
        _mount(schema)


def test_an_object_shared_between_two_scopes_is_checked_in_each() -> None:
    """A plugin's schema may hold one dict in two places: it was searched once, in the scope it was
    first reached in, and a reference unresolvable in the other scope mounted."""
    shared = {"$ref": "item.json"}
    schema = {"$id": "http://x.test/root.json",
              "$defs": {"A": {"$id": "http://x.test/a/", "$defs": {"i": {"$id": "item.json", "type": "string"}},
                              "allOf": [shared]},
                        "B": {"$id": "http://x.test/b/", "allOf": [shared]}},
              "properties": {"b": {"$ref": "http://x.test/b/"}, "a": {"$ref": "http://x.test/a/"}}}
    with pytest.raises(ContractError, match="resolves to nothing"):
        _mount(schema)


# -- schema: a reference loop that never moves into the value ------------------------------------

D7 = "http://json-schema.org/draft-07/schema#"
LOOPS = {
    "root": {"$ref": "#"},
    "allOf": {"type": "object", "allOf": [{"$ref": "#"}]},
    "two-defs": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "anchor": {"$defs": {"a": {"$anchor": "A", "not": {"not": {"$ref": "#A"}}}}, "properties": {"x": {"$ref": "#A"}}},
    "draft7-dependencies": {"$schema": D7, "dependencies": {"a": {"$ref": "#"}}},
    "draft7-definitions": {"$schema": D7, "definitions": {"a": {"$ref": "#/definitions/a"}},
                           "properties": {"x": {"$ref": "#/definitions/a"}}},
    "if-then": {"if": {"type": "string"}, "then": {"$ref": "#"}},
}


@pytest.mark.parametrize("schema", LOOPS.values(), ids=LOOPS.keys())
def test_a_reference_loop_in_place_is_refused_at_mount(schema: dict[str, Any]) -> None:
    """jsonschema follows it until the stack runs out: every call failed as an internal RecursionError."""
    with pytest.raises(ContractError, match="refers back to itself") as caught:
        _mount(schema)
    assert caught.value.code == "invalid_schema"


RECURSIVE = {
    "items": ({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}},
              {"kids": [{"kids": []}]}, {"kids": [1]}),
    "anyOf-under-properties": ({"$defs": {"n": {"type": "object", "properties": {"v": {"$ref": "#/$defs/v"}}},
                                          "v": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/n"}]}},
                                "$ref": "#/$defs/n"}, {"v": {"v": "x"}}, {"v": 1}),
    "dynamicRef": ({"$id": "http://x.test/tree", "$dynamicAnchor": "node", "type": "object",
                    "properties": {"c": {"type": "array", "items": {"$dynamicRef": "#node"}}}},
                   {"c": [{"c": []}]}, {"c": [1]}),
    "recursiveRef": ({"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveAnchor": True,
                      "type": "object", "properties": {"c": {"type": "array", "items": {"$recursiveRef": "#"}}}},
                     {"c": [{"c": []}]}, {"c": [1]}),
    "draft7-sibling-of-ref": ({"$schema": D7, "definitions": {"a": {"$ref": "#/definitions/b",
                                                                    "allOf": [{"$ref": "#/definitions/a"}]},
                                                              "b": {"type": "string"}},
                               "properties": {"x": {"$ref": "#/definitions/a"}}}, {"x": "s"}, {"x": 1}),
    "draft6-if-is-no-keyword": ({"$schema": "http://json-schema.org/draft-06/schema#", "type": "string",
                                 "if": {"$ref": "#"}}, "s", 1),
}


@pytest.mark.parametrize("schema,good,bad", RECURSIVE.values(), ids=RECURSIVE.keys())
def test_a_loop_through_the_value_or_a_keyword_jsonschema_ignores_still_mounts(
        schema: dict[str, Any], good: Any, bad: Any) -> None:
    validator = _mount(schema)
    assert validator.is_valid(good) and _jsonschema(schema, good)
    assert not validator.is_valid(bad) and not _jsonschema(schema, bad)


def test_a_tool_whose_schema_loops_in_place_fails_the_start_not_every_call() -> None:
    class Loop:
        name = "loop"
        description = "refers to itself"
        input_schema = {"type": "object", "allOf": [{"$ref": "#"}]}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output="ok")

    class Mount:
        name = "loop-tools"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", Loop())

    async def start() -> None:
        async with ToolHost(plugins=[Mount()], builtins=False, entry_points=False) as host:
            result = await host.call("loop", {})
            raise AssertionError(f"mounted; the call gave {result.error}")

    with pytest.raises(PluginLoadError, match="refers back to itself"):
        asyncio.run(start())


# -- amplifier bridge: event data and results redaction or copying cannot walk -------------------

SECRET = "hunter2-fix-attack-secret"


class _EmittingTool:
    name = "emitter"
    description = "Emits progress."
    input_schema: dict[str, Any] = {"type": "object"}

    def __init__(self, hooks: Any, data: dict[str, Any]) -> None:
        self.hooks = hooks
        self.data = data

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await self.hooks.emit("tool:progress", self.data)
        return ToolResult(success=True, output="done")


class _Emitter:
    name = "emitter"

    def __init__(self, data: dict[str, Any], seen: list[Any]) -> None:
        self.data = data
        self.seen = seen

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        coordinator.hooks.register("tool:progress", lambda event, data: self.seen.append(data), name="seen")
        await coordinator.mount("tools", _EmittingTool(coordinator.hooks, self.data))


def _nested(levels: int) -> Any:
    value: Any = SECRET
    for _ in range(levels):
        value = [value]
    return value


async def test_event_data_the_scrub_cannot_walk_fails_not_the_tool_that_emitted_it(tmp_path: Any) -> None:
    """``emit`` now scrubs event data of the host's secrets: a cyclic or deeply nested value
    raised RecursionError there, and the tool that emitted it failed (the call returned before)."""
    cyclic: dict[str, Any] = {"note": f"using {SECRET}"}
    cyclic["self"] = cyclic
    seen: list[Any] = []
    data = {"cyclic": cyclic, "deep": _nested(5000), "message": f"with {SECRET}", "n": 1}
    async with ToolHost(plugins=[_Emitter(data, seen)], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path) as host:
        host.secrets.add(SECRET)
        result = await host.call("emitter", {})
    assert result.success and result.output == "done"
    assert seen == [{"cyclic": "[REDACTED]", "deep": "[REDACTED]", "message": "with [REDACTED]", "n": 1}]


class _Opaque:
    def __deepcopy__(self, memo: Any) -> Any:
        raise RuntimeError("cannot be copied")


class _OutputTool:
    name = "out"
    description = "Returns what it was built with."
    input_schema: dict[str, Any] = {"type": "object"}

    def __init__(self, output: Any) -> None:
        self.output = output

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(success=True, output=self.output)


class _PostHandler:
    name = "post"

    def __init__(self, output: Any, seen: list[Any]) -> None:
        self.output = output
        self.seen = seen

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        coordinator.hooks.register("tool:post", lambda event, data: self.seen.append(data["result"]["output"]),
                                   name="post")
        await coordinator.mount("tools", _OutputTool(self.output))


@pytest.mark.parametrize("kind", ["opaque", "deep"])
async def test_an_output_deepcopy_fails_on_still_reaches_tool_post_and_the_caller(tmp_path: Any, kind: str) -> None:
    """``result_data`` now deep-copies the output for ``tool:post`` handlers: an object whose
    ``__deepcopy__`` raises, or an output nested past the stack, failed the call ("plugin failed in
    tool_post") where it succeeded before; the handler still gets a copy of the containers."""
    opaque = _Opaque()
    output: Any = {"items": [opaque, "x"]} if kind == "opaque" else {"items": _nested(5000)}
    seen: list[Any] = []
    async with ToolHost(plugins=[_PostHandler(output, seen)], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path) as host:
        result = await host.call("out", {})
    assert result.success, result.error
    assert len(seen) == 1 and seen[0] is not output and seen[0]["items"] is not output["items"]
    if kind == "opaque":
        assert seen[0]["items"][0] is opaque


# -- serve-mcp over HTTP: a secret brought into view by the redaction before it ------------------

TOKEN = "tok_Zq7uObsCanary9Kx2TokAbCdEf0123456789"


def _straddling(window: int) -> str:
    """A credential-shaped run (redacted to ``[REDACTED]``) filling the searched window up to a
    token that crosses its end."""
    prefix = "Invalid Host header: "
    run = ("sk-" + "A1b2" * 2000)[:window - len(prefix) - 20]
    return f"{prefix}{run} {TOKEN} and the rest"


def test_a_refusal_log_line_never_shows_a_token_the_window_cut() -> None:
    """The line was the searched window redacted plus the rest as it came: the run shrank to
    ``[REDACTED]`` and the token crossing the window's end was written whole."""
    import logging

    from amplifier_tools.mcp.http import MAX_FIELD_CHARS, MAX_LOG_LINE_CHARS, REDACT_WINDOW, RefusalLogFilter
    from amplifier_tools.redaction import SecretSet

    secrets = SecretSet()
    secrets.add(TOKEN)
    guard = RefusalLogFilter(clock=lambda: 1000.0, secrets=secrets)
    record = logging.LogRecord("mcp.server.transport_security", logging.WARNING, __file__, 1,
                               _straddling(MAX_LOG_LINE_CHARS + REDACT_WINDOW - MAX_FIELD_CHARS), (), None)
    assert guard.filter(record)
    line = record.getMessage()
    assert TOKEN[:8] not in line and line.startswith("Invalid Host header: [REDACTED]")


def test_a_refusal_events_field_never_shows_the_head_of_a_token_the_window_cut() -> None:
    from amplifier_tools.mcp.http import REDACT_WINDOW, _clip
    from amplifier_tools.redaction import SecretSet

    secrets = SecretSet()
    secrets.add(TOKEN)
    shown = _clip(_straddling(REDACT_WINDOW), secrets)
    assert shown is not None and TOKEN[:8] not in shown and shown.startswith("Invalid Host header: [REDACTED]")


def test_a_secret_holding_whitespace_is_redacted_before_a_rendered_block_folds_it() -> None:
    """``_clip`` folded whitespace before it redacted (and redacted only what it cut): a secret
    holding a line break or two spaces came out folded, which no later redaction finds."""
    from amplifier_tools.content import render_block

    secret = "line-one-secret\nline-two  secret-0123456789"
    block = {"type": "resource_link", "uri": "file:///x", "name": "x", "description": f"see {secret} here"}
    shown = render_block(block, {secret})
    assert "line-one-secret" not in shown and "secret-0123456789" not in shown, shown
    assert "[REDACTED]" in shown
