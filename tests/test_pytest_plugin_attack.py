"""Attacks on what a third-party tool author tests with: the pytest plugin's ``tool_host`` fixture
(run in a project of the author's own, through ``pytester``) and the conformance kit
(``assert_conforms`` / ``check_target_async``) with tools that break their contract."""

from __future__ import annotations

from typing import Any

import pytest

from amplifier_tools import ToolResult, ToolSpec
from amplifier_tools.conformance import check_target_async
from amplifier_tools.pytest_plugin import assert_conforms

pytest_plugins = ["pytester"]

#: The inner run without the plugins it does not need (each loads for a while), nor a cache.
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:langsmith_plugin",
         "-p", "no:amplifier_module")

#: A plugin author's test module: a policy plugin under test, on a host from ``tool_host``.
AUTHOR_TESTS = '''
from amplifier_tools import Deny, hookimpl
from amplifier_tools.pytest_plugin import MockTool


class NoDeletes:
    name = "no-deletes"

    @hookimpl
    def tool_pre(self, call, spec, context):
        if spec.effect.value == "NonIdempotentWrite":
            return Deny("no deletes here", code="no_deletes")


async def test_deletes_are_refused(tool_host):
    delete = MockTool(name="local::files.delete", return_value="deleted", effect="NonIdempotentWrite")
    async with tool_host(NoDeletes(), delete) as host:
        result = await host.call("files_delete", {"path": "x"})
    assert result.error is not None and result.error["code"] == "no_deletes"
    assert delete.call_count == 0


async def test_only_the_named_entry_point_loads(tool_host):
    async with tool_host(NoDeletes(), builtins=["audit"]) as host:
        assert sorted(info.name for info in host.plugins) == ["audit", "no-deletes"]
'''


@pytest.mark.parametrize("variable", ["AMPLIFIER_TOOLS_DISABLE_PLUGINS", "AMPLIFIER_TOOLS_LOAD_PLUGINS"])
def test_tool_host_is_not_steered_by_the_developers_plugin_variables(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    # Found by attack: with ``AMPLIFIER_TOOLS_DISABLE_PLUGINS=no-deletes`` left in the shell the
    # author runs pytest from (as the operator's docs suggest for a plugin that misbehaves), the
    # plugin passed to ``tool_host`` was silently not loaded: its test saw the delete succeed. A
    # test of a plugin that must *not* deny would have passed for the wrong reason.
    monkeypatch.setenv(variable, "no-deletes,audit")
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_author=AUTHOR_TESTS)
    run = pytester.runpytest(*QUIET)
    run.assert_outcomes(passed=2)


def test_a_test_can_still_set_the_variables_itself(pytester: pytest.Pytester) -> None:
    # The isolation is of the inherited environment: a test that sets the variable (to test how its
    # plugin behaves when an operator disables it) gets what it set.
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_author=AUTHOR_TESTS + '''

async def test_disabled_by_the_test(tool_host, monkeypatch):
    monkeypatch.setenv("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "no-deletes")
    async with tool_host(NoDeletes()) as host:
        assert [info.name for info in host.plugins] == []
''')
    run = pytester.runpytest(*QUIET)
    run.assert_outcomes(passed=3)


def _tool(output: Any, example_output: Any, *, output_schema: dict[str, Any] | None = None) -> Any:
    class Tool:
        spec = ToolSpec(name="local::flags.read", version="1.0.0", description="Read the flags.", effect="Pure",
                        input_schema={"type": "object"}, output_schema=output_schema,
                        examples=[{"input": {}, "output": example_output}])
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output=output)

    return Tool()


@pytest.mark.parametrize(("output", "promised"), [
    (True, 1),
    (0, False),
    ({"enabled": 1, "count": 2}, {"enabled": True, "count": 2}),
    ([1, [False]], [True, [0]]),
])
async def test_an_example_output_of_another_json_type_fails(output: Any, promised: Any) -> None:
    # Found by attack: the example's output was compared with Python's ``==``, where ``True == 1``:
    # a tool returning ``true`` where its example promised ``1`` (JSON: a boolean, not a number)
    # passed ``assert_conforms``.
    report = await check_target_async(_tool(output, promised))
    assert not report.ok
    failed = [c for c in report.checks if not c.passed and not c.warning]
    assert [c.name for c in failed] == ["local::flags.read: example 1"]
    assert failed[0].message == f"ran; output {output!r} != example {promised!r}"


@pytest.mark.parametrize(("output", "promised"), [
    (2.0, 2),
    ({"a": [1, {"b": None}], "c": "x"}, {"c": "x", "a": [1.0, {"b": None}]}),
])
async def test_an_example_output_equal_as_json_passes(output: Any, promised: Any) -> None:
    # JSON has one number type: 2.0 is the 2 an ``integer`` schema accepts; key order is no difference.
    report = await check_target_async(_tool(output, promised))
    assert report.ok, report.render()


class _Double:
    """A tool class, as an author writes one."""

    spec = ToolSpec(name="local::math.double", version="1.0.0", description="Double it.", effect="Pure",
                    input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
                    examples=[{"input": {"n": 2}, "output": 4}])
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=input["n"] * 2)


async def test_assert_conforms_takes_a_tool_class_as_validate_does() -> None:
    # ``validate module:_Double`` instantiates the class; ``assert_conforms(_Double)`` mounted the class
    # itself, and its example "ran and failed: ... execute() missing 1 required positional argument".
    report = await assert_conforms(_Double)
    assert report.target == "tool 'local::math.double'"
    assert any(c.name == "local::math.double: example 1" and c.message == "valid; ran" for c in report.checks)


class _NeedsEndpoint(_Double):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint


async def test_a_tool_class_that_cannot_be_instantiated_is_a_failed_check() -> None:
    report = await check_target_async(_NeedsEndpoint)
    assert [(c.name, c.passed) for c in report.checks] == [("importable", False)]
    assert report.checks[0].message.startswith("instantiating _NeedsEndpoint: TypeError: ")


class _Paginate:
    """A Pure tool that pops its cursor out of, and writes its page size into, the arguments it was given."""

    spec = ToolSpec(name="local::items.page", version="1.0.0", description="One page of items.", effect="Pure",
                    input_schema={"type": "object", "properties": {"cursor": {"type": "integer"},
                                                                   "filter": {"type": "object"}}},
                    examples=[{"input": {"cursor": 0, "filter": {"tags": ["a"]}}, "output": [0, 1]}])
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        start = input.pop("cursor")
        input["size"] = 2
        input["filter"]["tags"].append("seen")
        return ToolResult(output=[start, start + 1])


async def test_a_tool_that_changes_its_arguments_fails_naming_them() -> None:
    # Found by attack: it passed (the host handed a tool the caller's own dict, so the spec's example was
    # rewritten by the run), and the audit record of such a call shows the arguments as the tool left them.
    # The host now hands a shallow copy: a key popped or set is the tool's own; a nested change is not.
    report = await check_target_async(_Paginate())
    assert not report.ok
    failed = [(c.name, c.message) for c in report.checks if not c.passed]
    assert failed == [("local::items.page: example 1: arguments",
                       "the tool changed the arguments it was given (changed 'filter'): the audit record and a "
                       "retry see the changed ones; work on a copy")]
    assert _Paginate.spec.examples[0].input == {"cursor": 0, "filter": {"tags": ["a"]}}
