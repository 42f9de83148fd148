"""Property-based tests: random JSON arguments never crash the host, and every
rejection is a ContractError naming the offending field by JSON pointer."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from helpers import ToolsPlugin, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amplifier_tools import ToolHost, ToolResult

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "mode": {"enum": ["read", "write", "append"]},
        "limits": {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 0, "maximum": 100},
                "ratio": {"type": "number", "exclusiveMaximum": 1},
                "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 3},
            },
            "required": ["count"],
            "additionalProperties": False,
        },
        "dry_run": {"type": "boolean"},
    },
    "required": ["name", "mode"],
    "additionalProperties": False,
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=25),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

near_valid = st.fixed_dictionaries(
    {"name": st.text(max_size=22) | json_values, "mode": st.sampled_from(["read", "write", "x"]) | json_values},
    optional={
        "limits": st.fixed_dictionaries(
            {"count": st.integers(-5, 105) | json_values},
            optional={
                "ratio": st.floats(-2, 2, allow_nan=False) | json_values,
                "tags": st.lists(st.sampled_from(["ok", "Bad", "x1", "fine"]), max_size=4) | json_values,
                "junk": json_values,
            },
        ) | json_values,
        "dry_run": st.booleans() | json_values,
        "extra": json_values,
    },
)


class Target:
    name = "target"
    description = "accepts anything its schema allows"
    input_schema = SCHEMA

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ran")


def resolve(instance: Any, pointer: str) -> tuple[bool, Any]:
    """Walk ``pointer`` into ``instance``; (found, value)."""
    value = instance
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


async def _call_all(arguments: list[Any]) -> list[ToolResult]:
    async with ToolHost(plugins=[ToolsPlugin(Target())], builtins=False, entry_points=False) as host:
        return [await host.call("target", args) for args in arguments]


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(near_valid | json_values, min_size=1, max_size=5))
def test_random_arguments_are_accepted_or_rejected_with_a_pointer(arguments: list[Any]) -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    results = run(_call_all(arguments))
    for args, result in zip(arguments, results, strict=True):
        if args is None:  # host.call treats None as "no arguments", i.e. {}
            args = {}
        if not isinstance(args, dict):
            assert result.error["type"] == "ContractError" and "must be a JSON object" in result.error["message"]
            continue
        assert result.success is validator.is_valid(args), (args, result)
        if result.success:
            assert result.output == "ran"
            continue
        error = result.error
        assert error["type"] == "ContractError" and error["code"] == "invalid_input"
        pointer = error["pointer"]
        assert f"{pointer or '/'}:" in error["message"]
        parent, _, last = pointer.rpartition("/")
        found, _ = resolve(args, pointer)
        parent_found, parent_value = resolve(args, parent)
        # The pointer names a field that is there, or one that is missing from an object that is there.
        assert found or (parent_found and isinstance(parent_value, dict) and last not in parent_value), (
            args, pointer)
