"""A ``tool_pre`` rewrite is on the record even when ``==`` cannot see it.

Found by a review (older than the change it reviewed): a ``Modify`` that turned ``1`` into ``True``
(or ``1.0``) is a rewrite the tool receives, yet the trail's ``changed`` omitted the key and the
audit record said ``original_arguments: null``, as if no plugin had rewritten anything: Python's
``==`` holds ``1 == 1.0 == True``. Both now compare as JSON data (``_json.same_json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import Modify, ToolHost, ToolResult, hookimpl
from amplifier_tools._json import same_json


class Loose:
    name = "loose"
    description = "any n"
    input_schema = {"type": "object", "properties": {"n": {}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=repr(input["n"]))


class Rewrite:
    name = "rewrite"

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments

    @hookimpl
    def tool_pre(self, call: Any) -> Modify:
        return Modify(self.arguments)


@pytest.mark.parametrize("path", ["spliced", "reference"])
@pytest.mark.parametrize(("sent", "rewritten", "tool_saw"), [
    ({"n": 1}, {"n": True}, "True"),
    ({"n": 1}, {"n": 1.0}, "1.0"),
    ({"n": [0, {"k": 1}]}, {"n": [False, {"k": 1}]}, "[False, {'k': 1}]"),
    ({"n": 0.0}, {"n": -0.0}, "-0.0"),  # found by an attack on the fix: same_json held them the same
])
async def test_a_rewrite_only_of_a_type_is_in_the_trail_and_the_record(
        tmp_path: Path, path: str, sent: dict[str, Any], rewritten: dict[str, Any], tool_saw: str) -> None:
    log = tmp_path / "audit" / "log.jsonl"
    (tmp_path / "work").mkdir()
    audit: dict[str, Any] = {"path": str(log)}
    tools: dict[str, Any] = {}
    if path == "reference":  # redaction rules send the record through build_record, not the splice
        tools = {"loose": {"security": {"redaction_rules": ["/nothing"]}}}
    host = ToolHost(config={"plugins": {"audit": audit}, "tools": tools},
                    plugins=[ToolsPlugin(Loose()), Rewrite(rewritten)],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path / "work", discover=False)
    async with host:
        result = await host.call("loose", sent)
    assert result.output == tool_saw  # the tool saw the rewrite
    assert result.metadata["trail"][0]["details"]["changed"] == ["n"]  # before: []
    record = json.loads(log.read_text().splitlines()[0])
    assert record["original_arguments"] == sent and record["arguments"] == rewritten  # before: null
    assert json.dumps(record["original_arguments"]) == json.dumps(sent)  # 1 stays 1, not 1.0 or true


async def test_an_unchanged_modify_is_not_a_change(tmp_path: Path) -> None:
    log = tmp_path / "audit" / "log.jsonl"
    (tmp_path / "work").mkdir()
    host = ToolHost(config={"plugins": {"audit": {"path": str(log)}}},
                    plugins=[ToolsPlugin(Loose()), Rewrite({"n": [1, {"k": "v"}]})],
                    builtins=["audit"], entry_points=False, working_dir=tmp_path / "work", discover=False)
    async with host:
        result = await host.call("loose", {"n": [1, {"k": "v"}]})
    assert result.metadata["trail"][0]["details"]["changed"] == []
    assert json.loads(log.read_text().splitlines()[0])["original_arguments"] is None


class NotJson:
    name = "notjson"

    @hookimpl
    def tool_pre(self, call: Any) -> Modify:
        return Modify({"n": {1, 2}})


async def test_a_non_json_modify_names_the_plugin_in_its_message(host_factory: Any) -> None:
    """Found by the same review: the ``invalid_json`` refusal set ``plugin`` but its message, unlike
    the ``invalid_input`` ones ("rewritten by plugin ..."), read as if the caller had sent it."""
    host = await host_factory(ToolsPlugin(Loose()), NotJson())
    result = await host.call("loose", {"n": 1})
    assert result.error["code"] == "invalid_json" and result.error["plugin"] == "notjson"
    assert "rewritten by plugin 'notjson'" in result.error["message"]


@pytest.mark.parametrize(("a", "b", "same"), [
    (1, 1, True), (1, True, False), (1, 1.0, False), (0, False, False), ("a", "a", True),
    ({"a": [1, None]}, {"a": [1, None]}, True), ({"a": [1]}, {"a": [1.0]}, False), ({"a": 1}, {"b": 1}, False),
    ({"a": 1}, {"a": 1, "b": 2}, False), ([1, 2], [1, 2, 3], False), ([1], (1,), False), (None, None, True),
])
def test_same_json_tells_types_apart(a: Any, b: Any, same: bool) -> None:
    assert same_json(a, b) is same and same_json(b, a) is same


def test_same_json_of_the_same_nan_object_is_same() -> None:
    nan = float("nan")
    assert same_json({"x": [nan]}, {"x": [nan]}) and not same_json(float("nan"), float("nan"))


# -- a rewrite made in place, not through Modify ------------------------------------------------

class Typed:
    name = "typed"
    description = "n is an integer"
    input_schema = {"type": "object", "properties": {"n": {"type": "integer"}, "list": {"type": "array"}}}

    def __init__(self) -> None:
        self.ran: list[Any] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.ran.append(dict(input))
        return ToolResult(output="ran")


class InPlace:
    """Changes the arguments object it was given; ``modify``: then returns ``Modify`` of it."""

    name = "inplace"

    def __init__(self, change: Any, modify: bool) -> None:
        self.change, self.modify = change, modify

    @hookimpl
    def tool_pre(self, call: Any) -> Modify | None:
        self.change(call.arguments)
        return Modify(call.arguments) if self.modify else None


@pytest.mark.parametrize("modify", [False, True])
@pytest.mark.parametrize(("change", "schema_refuses"), [
    (lambda a: a.__setitem__("n", "not an integer"), True),
    (lambda a: a.__setitem__("n", True), True),  # equal to 1, another type
    (lambda a: a.__setitem__("extra", 1), False),
    (lambda a: a["list"].append(2), False),  # inside a container
], ids=["refused value", "another type", "key added", "nested"])
async def test_arguments_changed_in_place_by_tool_pre_are_refused_not_run(
        tmp_path: Path, change: Any, schema_refuses: bool, modify: bool) -> None:
    """Found by an attack (older than this fix): a tool_pre plugin that changed the arguments
    object in place, instead of returning a Modify, reached the tool unvalidated ("not an integer"
    for an integer) and unrecorded (no trail entry, the record named the changed value as the
    caller's). Now the call ends before the tool runs, typed, naming Modify, and is recorded. A
    plugin that also returns ``Modify`` of that object has it checked first, as any Modify."""
    log = tmp_path / "audit" / "log.jsonl"
    (tmp_path / "work").mkdir()
    tool = Typed()
    async with ToolHost(config={"plugins": {"audit": {"path": str(log)}}},
                        plugins=[ToolsPlugin(tool), InPlace(change, modify)],
                        builtins=["audit"], entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        result = await host.call("typed", {"n": 1, "list": [1]})
    assert tool.ran == []  # before: the tool ran with what the plugin put there
    code = "invalid_input" if modify and schema_refuses else "hook_changed_arguments"
    assert not result.success and result.error["code"] == code
    assert "inplace" in result.error["message"]
    if code == "hook_changed_arguments":
        assert "Modify" in result.error["hint"]
        assert [step["action"] for step in result.metadata["trail"]][-1] == "changed_in_place"
    record = json.loads(log.read_text().splitlines()[0])
    assert record["status"] == "error" and record["error"]["code"] == code


async def test_a_modify_with_a_new_object_is_not_a_change_in_place(tmp_path: Path) -> None:
    """The check compares the object the chain was given, not what the tool gets."""
    tool = Typed()
    (tmp_path / "work").mkdir()
    async with ToolHost(plugins=[ToolsPlugin(tool), Rewrite({"n": 2, "list": [1]})], builtins=False,
                        entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        result = await host.call("typed", {"n": 1, "list": [1]})
    assert result.success and tool.ran == [{"n": 2, "list": [1]}]


class ModifyFirst:
    name = "modify_first"

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: Any) -> Modify:
        return Modify({"n": 2, "list": [1]})


class ChangeLater:
    name = "change_later"

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> None:
        call.arguments["n"] = "not an integer"


async def test_a_change_in_place_of_an_earlier_modify_is_refused_too(tmp_path: Path) -> None:
    """Found by a review of the first version of this check, which fingerprinted only the object
    the chain was given: after one plugin's Modify, a later plugin that assigned into the new
    arguments sent a string for an integer to the tool."""
    tool = Typed()
    (tmp_path / "work").mkdir()
    async with ToolHost(plugins=[ToolsPlugin(tool), ModifyFirst(), ChangeLater()], builtins=False,
                        entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        result = await host.call("typed", {"n": 1, "list": [1]})
    assert tool.ran == [] and result.error["code"] == "hook_changed_arguments"
    assert "change_later" in result.error["message"] and "new object" in result.error["hint"]


class Reader:
    name = "reader"

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        assert isinstance(call.arguments, dict)


@pytest.mark.parametrize("builtins", [False, ["audit"]])
@pytest.mark.parametrize("arguments", [{"s": "a\ud800"}, {"list": [{"k\ud800": 1}]}], ids=["value", "key"])
async def test_a_lone_surrogate_is_no_change_in_place(tmp_path: Path, builtins: Any, arguments: Any) -> None:
    """Found by the same review: a lone surrogate (valid JSON text, accepted by the checks) made
    the fingerprint raise (orjson refuses it, and the stdlib fallback's UTF-8 encoding did too):
    with any tool_pre hook, the audit's included, the call ended as an internal error."""
    tool = Typed()
    (tmp_path / "work").mkdir()
    config = {"plugins": {"audit": {"path": str(tmp_path / "log.jsonl")}}} if builtins else None
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool), Reader()], builtins=builtins,
                        entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        result = await host.call("typed", arguments)
    assert result.success, result.error
    assert tool.ran == [arguments]


class ChangeThenFail:
    """Changes the arguments in place, then raises; configured to fail open (the chain goes on)."""

    name = "change_then_fail"

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        call.arguments["n"] = "not an integer"
        raise RuntimeError("broken after the change")


async def test_a_hook_failing_open_after_a_change_in_place_is_still_refused(tmp_path: Path) -> None:
    """A fail-open hook's failure lets the chain go on; what it changed before failing must not
    reach the tool all the same."""
    tool = Typed()
    (tmp_path / "work").mkdir()
    config = {"plugins": {"change_then_fail": {"on_error": "ignore"}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool), ChangeThenFail()], builtins=False,
                        entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        result = await host.call("typed", {"n": 1, "list": [1]})
    assert tool.ran == [] and result.error["code"] == "hook_changed_arguments"
    actions = [step["action"] for step in result.metadata["trail"]]
    assert actions == ["ignored_failure", "changed_in_place"]
