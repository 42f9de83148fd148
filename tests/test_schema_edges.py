"""Schema edge cases refused or accepted at mount as validation would read them: nesting deeper
than jsonschema's own check can follow is a typed refusal naming the pointer (it was a bare
``RecursionError`` naming no tool), and a ``$ref`` is checked where the validator reads one —
not inside an unknown keyword's data, but inside draft 4-7 ``dependencies`` and wherever another
reference points."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.errors import ContractError, PluginLoadError
from amplifier_tools.schema import MAX_SCHEMA_DEPTH, compile_validator


def nested(levels: int) -> dict[str, Any]:
    """An object schema with ``levels`` properties inside each other (two containers a level)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nots(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"not": schema}
    return schema


def value(levels: int) -> Any:
    instance: Any = "x"
    for _ in range(levels):
        instance = {"a": instance}
    return instance


@pytest.mark.parametrize("schema", [nested(150), nested(1200), nots(130)], ids=["150", "1200", "not-130"])
def test_a_schema_nested_past_the_bound_is_refused_naming_the_pointer(schema: dict[str, Any]) -> None:
    with pytest.raises(ContractError) as caught:
        compile_validator(schema, owner="x::deep", which="input_schema")
    error = caught.value
    assert error.code == "invalid_schema"
    assert "'x::deep'" in error.message and f"more than {MAX_SCHEMA_DEPTH} deep" in error.message
    assert error.details["pointer"].count("/") == MAX_SCHEMA_DEPTH + 1
    assert "$defs" in error.details["hint"]


def test_a_schema_that_contains_itself_is_refused_not_a_recursion_error() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schema["properties"]["self"] = schema
    with pytest.raises(ContractError, match="more than"):
        compile_validator(schema, owner="x::loop", which="input_schema")


@pytest.mark.parametrize("schema,good,bad", [
    (nested(MAX_SCHEMA_DEPTH // 2), value(MAX_SCHEMA_DEPTH // 2), value(3)),
    (nots(MAX_SCHEMA_DEPTH), "x", 1),  # an even number of nots: a string
], ids=["properties", "not"])
def test_a_schema_at_the_bound_mounts_and_validates(schema: dict[str, Any], good: Any, bad: Any) -> None:
    validator = compile_validator(schema, owner="x::deep", which="input_schema")
    assert validator.is_valid(good)
    assert not validator.is_valid(bad)


def test_a_too_deep_tool_fails_the_start_naming_tool_and_pointer() -> None:
    class Deep:
        name = "deep"
        description = "nested too deep"
        input_schema = nested(200)

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output="ok")

    class Mount:
        name = "deep-tools"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", Deep())

    async def start() -> None:
        async with ToolHost(plugins=[Mount()], builtins=False, entry_points=False):
            pass

    with pytest.raises(PluginLoadError) as caught:
        asyncio.run(start())
    assert "RecursionError" not in str(caught.value)
    assert "'deep'" in str(caught.value) and "/properties/a/properties/a" in str(caught.value)


def test_a_ref_inside_an_unknown_keyword_is_data_and_mounts() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}},
              "x-origin": {"$ref": "#/nowhere", "note": "copied from an OpenAPI document"}}
    validator = compile_validator(schema, owner="x::ext", which="input_schema")
    assert validator.is_valid({"q": "a"})
    assert not validator.is_valid({"q": 1})


def test_a_ref_reached_through_another_ref_is_checked_even_inside_an_unknown_keyword() -> None:
    schema = {"type": "object", "properties": {"q": {"$ref": "#/x-lib/item"}},
              "x-lib": {"item": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(ContractError, match="#/\\$defs/missing"):
        compile_validator(schema, owner="x::ext", which="input_schema")


def test_a_draft7_dependency_named_like_a_keyword_is_checked() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "dependencies": {"enum": {"properties": {"x": {"$ref": "#/definitions/missing"}}}}}
    with pytest.raises(ContractError, match="/dependencies/enum/properties/x/\\$ref"):
        compile_validator(schema, owner="x::dep", which="input_schema")


def test_a_draft7_dependency_list_of_names_is_no_schema() -> None:
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "dependencies": {"a": ["b"], "c": {"required": ["d"]}}}
    validator = compile_validator(schema, owner="x::dep", which="input_schema")
    assert validator.is_valid({"a": 1, "b": 2})
    assert not validator.is_valid({"a": 1})
    assert not validator.is_valid({"c": 1})
