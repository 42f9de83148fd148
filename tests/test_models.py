"""The data models: result helpers, the error taxonomy, JSON round trips, function tools."""

from __future__ import annotations

import base64
import builtins
import json
import os
import subprocess
import sys
from typing import Any, Literal

import cattrs
import pytest
from helpers import ToolsPlugin
from hypothesis import given
from hypothesis import strategies as st

import amplifier_tools
from amplifier_tools import (
    Decision,
    Effect,
    ToolCall,
    ToolContext,
    ToolResult,
    ToolSpec,
    ToolSystemError,
    converter,
    tool,
)
from amplifier_tools.errors import CATEGORIES
from amplifier_tools.integrations._common import model_parts, model_text
from amplifier_tools.models import truncate_text


def test_is_error_and_serialized_output() -> None:
    assert ToolResult(output="x").is_error is False
    failed = ToolResult(success=False, error={"message": "boom"})
    assert failed.is_error and failed.get_serialized_output() == "Error: boom"
    assert ToolResult(output={"a": 1}).get_serialized_output() == '{"a": 1}'
    assert ToolResult().get_serialized_output() == ""


def test_serialized_output_says_how_much_was_cut() -> None:
    text = ToolResult(output="x" * 1000).get_serialized_output(max_chars=100)
    assert text.startswith("x" * 100)
    assert text.endswith("[Truncated: 900 of 1000 characters omitted]")
    assert ToolResult(output="x" * 1000).get_serialized_output(max_chars=None) == "x" * 1000


@pytest.mark.parametrize(("text", "max_chars", "expected"), [
    ("abc", None, "abc"),
    ("abc", 5, "abc"),
    ("abc", 3, "abc"),
    ("abcdef", 2, "ab\n\n[Truncated: 4 of 6 characters omitted]"),
    ("abc", 0, "\n\n[Truncated: 3 of 3 characters omitted]"),
    ("", 0, ""),
])
def test_truncate_text_cuts_at_max_chars_with_the_one_notice(text: str, max_chars: int | None,
                                                            expected: str) -> None:
    assert truncate_text(text, max_chars) == expected


@pytest.mark.parametrize("max_chars", [0, 10, 1029, 1030, None])
def test_every_path_to_a_model_cuts_with_the_same_notice(max_chars: int | None) -> None:
    """``get_serialized_output``, the adapters' ``model_text`` (a failure's own text) and
    ``model_parts`` (the text beside an image) cut the same over-long text the same way: they
    once wrote three notices, one without the total."""
    text = "Error (ExecutionError, boom): " + "x" * 1000
    assert len(text) == 1030
    expected = truncate_text(text, max_chars)
    if max_chars is not None and max_chars < len(text):
        assert expected.endswith(f"\n\n[Truncated: {1030 - max_chars} of 1030 characters omitted]")
    failure = ToolResult(success=False, error={"type": "ExecutionError", "code": "boom", "message": "x" * 1000})
    image = {"type": "image", "data": base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(40)).decode(),
             "mimeType": "image/png"}
    parts = model_parts(ToolResult(output=text, metadata={"content": [image]}), max_chars)
    assert parts is not None and [part[0] for part in parts] == ["text", "image"]
    assert ToolResult(output=text).get_serialized_output(max_chars) == expected
    assert model_text(ToolResult(output=text), max_chars) == expected
    assert model_text(failure, max_chars) == expected
    assert parts[0][1] == expected


def test_fifth_category_does_not_shadow_builtin_system_error() -> None:
    assert builtins.SystemError is SystemError
    assert not hasattr(amplifier_tools, "SystemError")
    assert ToolSystemError("x").category == "SystemError"
    assert CATEGORIES == {"ContractError", "PolicyError", "AuthError", "ExecutionError", "SystemError"}


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=10,
)


@given(
    st.builds(ToolCall, st.text(min_size=1, max_size=10), st.text(min_size=1, max_size=10),
              st.dictionaries(st.text(max_size=5), json_data, max_size=3)),
    st.builds(ToolResult, st.booleans(), json_data,
              st.none() | st.dictionaries(st.text(max_size=5), json_data, max_size=3),
              st.dictionaries(st.text(max_size=5), json_data, max_size=3), st.none() | st.text(max_size=8)),
)
def test_call_and_result_round_trip_through_json(call: ToolCall, result: ToolResult) -> None:
    for obj in (call, result):
        data = json.loads(json.dumps(converter.unstructure(obj)))
        assert converter.structure(data, type(obj)) == obj


def test_spec_round_trips_with_every_field() -> None:
    spec = ToolSpec(
        name="mcp::github::issues.create", version="2.1.0-rc.1", title="Create issue", owner="platform",
        tags=("write", "comm"), input_schema={"type": "object", "properties": {"title": {"type": "string"}}},
        output_schema={"type": "object"},
        examples=[{"input": {"title": "x"}, "output": {"id": 1}}],  # type: ignore[list-item]
        effect="NonIdempotentWrite", idempotency_key="optional",  # type: ignore[arg-type]
        policies={"timeout_ms": 5000, "rate_limit": {"limit": 10, "interval_ms": 1000},  # type: ignore[arg-type]
                  "concurrency": {"limit": 2}, "circuit_breaker": {"failure_threshold": 3},
                  "budgets": [{"per": "principal", "max_calls": 100}]},
        security={"required_scopes": ["issues:write"], "secret_refs": ["GITHUB_TOKEN"],  # type: ignore[arg-type]
                  "redaction_rules": ["output/token"], "data_classification": "confidential"},
        deprecation={"since": "2.0.0", "replacement": "mcp::github::issues.open"},  # type: ignore[arg-type]
    )
    data = json.loads(json.dumps(converter.unstructure(spec)))
    assert data["effect"] == "NonIdempotentWrite"
    assert converter.structure(data, ToolSpec) == spec
    assert spec.origin == "mcp"


def test_context_unstructures_without_secrets() -> None:
    ctx = ToolContext(principal="a", scopes={"x"}, secrets={"K": "canary-value-91"})  # type: ignore[arg-type]
    data = converter.unstructure(ctx)
    assert data["scopes"] == ["x"] and "secrets" not in data and "canary-value-91" not in json.dumps(data)


def test_decision_is_json_data() -> None:
    d = Decision("p", "tool_pre", "deny", "why", "code", {"rule": "r1"})
    assert converter.structure(converter.unstructure(d), Decision) == d


def test_values_typed_any_unstructure_as_json_data() -> None:
    """Found by the floors env (tox -e floors): cattrs 23.2, setup.cfg's floor, handed a value typed
    ``Any`` back as it was — a contract's schema kept its tuples and a decision's details their
    frozenset, which is not JSON; cattrs 24.1 and later unstructure it by its class, as now always."""
    spec = ToolSpec(name="a::b", input_schema={"type": "object", "enum": ("a", 1), "nested": [{"k": ("v",)}]},
                    annotations={"k": (1,), "set": frozenset({"y", "x"})})
    data = converter.unstructure(spec)
    assert data["input_schema"] == {"type": "object", "enum": ["a", 1], "nested": [{"k": ["v"]}]}
    assert type(data["input_schema"]["enum"]) is list and type(data["annotations"]["k"]) is list
    assert data["annotations"]["set"] == ["x", "y"]
    d = Decision("p", "tool_pre", "deny", details={"missing": frozenset({"b", "a"}), "spec": ToolSpec(name="c::d")})
    details = converter.unstructure(d)["details"]
    assert details["missing"] == ["a", "b"] and details["spec"]["name"] == "c::d"
    json.dumps(details)


async def test_function_tool_schema_and_call(host_factory: Any) -> None:
    @tool(name="local::math.scale", effect=Effect.Pure, version="1.0.0")
    def scale(value: float, factor: int = 2, unit: Literal["m", "km"] = "m", note: str | None = None) -> str:
        """Scale a value.

        More text that is not the description.
        """
        return f"{value * factor}{unit}"

    assert scale.spec.description == "Scale a value."
    assert scale.spec.input_schema["required"] == ["value"]
    assert scale.spec.input_schema["properties"]["unit"] == {"enum": ["m", "km"], "default": "m"}
    assert scale(1.5) == "3.0m"  # still callable as a function
    host = await host_factory(ToolsPlugin(scale))
    assert (await host.call("math_scale", {"value": 2, "factor": 3})).output == "6m"
    bad = await host.call("math_scale", {"value": "two"})
    assert bad.error["type"] == "ContractError" and bad.error["pointer"] == "/value"


async def test_async_function_tool_receives_context(host_factory: Any) -> None:
    @tool
    async def whoami(context: ToolContext) -> str:
        """Report the principal."""
        return context.principal

    assert "context" not in whoami.spec.input_schema["properties"]
    host = await host_factory(ToolsPlugin(whoami))
    assert (await host.call("whoami", {}, context=ToolContext(principal="agent-7"))).output == "agent-7"


class Custom:
    pass


def test_function_tool_refuses_types_without_a_schema() -> None:
    with pytest.raises(TypeError, match=r"bad\(x\): type .*Custom.* has no JSON Schema mapping"):
        @tool
        def bad(x: Custom) -> None:
            """Nope."""



def test_no_module_of_the_package_shares_a_public_name() -> None:
    """The package exports its names lazily; a module sharing one (as ``converter`` did) would
    replace the package's attribute with the module as soon as anything imported it."""
    import pkgutil

    modules = {module.name for module in pkgutil.iter_modules(amplifier_tools.__path__)}
    assert modules & set(amplifier_tools.__all__) == set()
    from amplifier_tools import _converter

    assert isinstance(amplifier_tools.converter, cattrs.Converter)
    assert amplifier_tools.converter is _converter.converter


def test_a_call_copy_of_a_context_keeps_every_field_and_has_a_trail_of_its_own() -> None:
    """``for_call`` copies the context field by field (no ``__init__``, it runs once per call):
    every field but ``call_id`` and ``trail`` is the caller's, each copy records into its own
    trail, and the caller's context is untouched. Enumerated from ``attrs.fields``, so a field
    added later is covered too."""
    import attrs

    given_values: dict[str, Any] = {
        "principal": "alice", "role": "admin", "environment": "prod", "scopes": frozenset({"fs:read"}),
        "secrets": {"K": "v" * 16}, "idempotency_key": "idem-1", "deadline": 123.5, "call_id": "caller-id",
        "trace_id": "trace-1", "session_id": "session-1", "attributes": {"approval": "yes"},
    }
    assert set(given_values) | {"trail"} == {field.name for field in attrs.fields(ToolContext)}
    context = ToolContext(**given_values)
    context.record("caller", "setup", "note")
    first, second = context.for_call("call-1"), context.for_call("call-2")
    for copy, call_id in ((first, "call-1"), (second, "call-2")):
        assert type(copy) is ToolContext
        assert copy.call_id == call_id
        assert copy.trail == []
        for name, value in given_values.items():
            if name != "call_id":
                assert getattr(copy, name) == value, name
        assert copy == attrs.evolve(context, call_id=call_id)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            copy.principal = "mallory"  # type: ignore[misc]
    first.record("plugin", "tool_pre", "allow")
    assert [d.action for d in first.trail] == ["allow"]
    assert second.trail == [] and [d.action for d in context.trail] == ["note"]
    assert context.call_id == "caller-id"
    # Each copy's fields are its own dict (on 3.11 and 3.12 a copy of the caller's, given whole).
    assert len({id(vars(context)), id(vars(first)), id(vars(second))}) == 3


_FORKED_CALL_IDS = """
import os
from amplifier_tools.models import new_call_id

new_call_id()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, new_call_id().encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 200).decode(), new_call_id())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX")
def test_a_forked_child_makes_call_ids_its_parent_does_not() -> None:
    """Found by review: the child repeated its parent's next call id (one id for two calls in a
    shared audit log). The fork happens in a fresh interpreter, not in the test run (a fork of a
    process with threads inherits their locks held)."""
    done = subprocess.run([sys.executable, "-c", _FORKED_CALL_IDS], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    theirs, mine = done.stdout.split()
    assert theirs != mine
    assert theirs.rsplit("_", 1)[0] != mine.rsplit("_", 1)[0] and theirs.endswith("_1")
