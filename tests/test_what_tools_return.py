"""What a tool returns, at the edges (found by attack): a ``ToolResult`` whose ``metadata`` is no
dict, whose ``success`` is no bool, whose properties raise or change between reads, whose error
cannot be read; content blocks JSON cannot hold.

Each ends in one typed result and exactly one ``tool_complete`` (the audit record); before these
tests ``host.call`` raised (no record), a non-bool ``success`` reached the caller, the host's
``internal`` error stood for the tool's, or the audit plugin failed and wrote no record."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, hookimpl


class Completions:
    name = "completions"

    def __init__(self) -> None:
        self.results: list[ToolResult] = []

    @hookimpl(trylast=True)
    def tool_complete(self, result: ToolResult) -> None:
        self.results.append(result)


class Returns:
    description = "Returns."
    input_schema = {"type": "object"}

    def __init__(self, name: str, value: Any, output_schema: Any = None) -> None:
        self.name, self.value = name, value
        if output_schema is not None:
            self.output_schema = output_schema

    async def execute(self, input: dict[str, Any]) -> Any:
        return self.value


class Hostile:
    def __str__(self) -> str:
        raise RuntimeError("str")

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise RuntimeError("bool")


class RaisingOutput(ToolResult):
    @property
    def output(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no output")


class Flipping(ToolResult):
    reads = 0

    @property
    def success(self) -> bool:  # type: ignore[override]
        Flipping.reads += 1
        return Flipping.reads % 2 == 1


class KeysRaise(dict):  # type: ignore[type-arg]
    def keys(self) -> Any:
        raise RuntimeError("keys")

    def __iter__(self) -> Any:
        raise RuntimeError("iter")


@pytest.mark.parametrize(
    ("value", "code", "fragment"),
    [
        (ToolResult(True, "x", metadata=5), "invalid_result", "metadata that is int, not a dict"),
        (ToolResult(True, "x", metadata=[1, 2]), "invalid_result", "metadata that is list, not a dict"),
        (ToolResult(True, "x", metadata=KeysRaise(a=1)), "invalid_result", "could not be read: RuntimeError: keys"),
        (ToolResult("yes", "x"), "invalid_result", "'success' is str, not bool"),
        (RaisingOutput(True, "x"), "invalid_result", "could not be read: RuntimeError: no output"),
        (ToolResult(False, "x", error="plain"), "execution_failed", "plain"),
        (ToolResult(False, "x", error=[1, 2]), "execution_failed", "[1, 2]"),
        (ToolResult(False, "x", error={1: 2, "message": "m"}), "execution_failed", "m"),
        (ToolResult(False, "x", error={"message": Hostile()}), "invalid_result", "error that could not be read"),
        (ToolResult(False, Hostile()), "execution_failed", "reported failure"),
        (ToolResult(True, Hostile()), "invalid_output", "could not be checked"),
    ],
    ids=["metadata-int", "metadata-list", "metadata-keys-raise", "success-str", "property-raises", "error-str",
         "error-list", "error-int-key", "error-message-hostile", "failed-hostile-output", "hostile-output-schema"],
)
async def test_a_sloppy_or_hostile_result_is_the_tools_typed_failure_and_is_recorded(
    host_factory: Any, value: Any, code: str, fragment: str,
) -> None:
    completions = Completions()
    schema = {"type": "string"} if code == "invalid_output" else None
    host = await host_factory(ToolsPlugin(Returns("t", value, schema)), completions)
    result = await host.call("t", {})  # HEAD: metadata-*: raised TypeError/RuntimeError, no record
    assert result.success is False
    assert result.error["code"] == code  # HEAD: SystemError 'internal' for most of the rest
    assert fragment in result.error["message"]
    assert result.error["tool"] == "t"
    assert len(completions.results) == 1
    result.get_serialized_output()


async def test_a_subclass_is_read_once(host_factory: Any) -> None:
    completions = Completions()
    host = await host_factory(ToolsPlugin(Returns("t", Flipping(True, "x"))), completions)
    result = await host.call("t", {})
    # HEAD: success False with error None (read True, then False): a failure with no typed error
    assert result.success is True and result.error is None
    assert completions.results == [result]


async def test_retryable_that_is_no_bool_is_not_read_as_true(host_factory: Any) -> None:
    value = ToolResult(False, "x", error={"message": "m", "retryable": "no"})
    host = await host_factory(ToolsPlugin(Returns("t", value)))
    assert (await host.call("t", {})).error["retryable"] is False  # HEAD: True (bool("no"))


_CYCLE: dict[str, Any] = {"type": "text"}
_CYCLE["self"] = _CYCLE


@pytest.mark.parametrize(
    "block",
    [{"type": "text", "text": "\ud800"}, _CYCLE, {"type": "text", "x": Hostile()}, {"type": "text", "n": 10**5000},
     {"type": "text", 1: "a", "b": 2}],
    ids=["lone-surrogate", "cycle", "hostile-str", "huge-int", "mixed-keys"],
)
async def test_content_json_cannot_hold_is_recorded(tmp_path: Any, block: Any) -> None:
    completions = Completions()
    value = ToolResult(True, "x", metadata={"content": [block]})
    async with ToolHost(plugins=[ToolsPlugin(Returns("t", value)), completions], builtins=["audit"],
                        config={"plugins": {"audit": {"fsync": "never"}}}, discover=False, entry_points=False,
                        working_dir=tmp_path) as host:
        result = await host.call("t", {})
        # HEAD: SystemError hook_failed ("plugin 'audit' failed in tool_complete"), and no record
        assert result.success, result.error
    assert len(completions.results) == 1
    (log,) = glob.glob(os.path.join(os.environ["XDG_STATE_HOME"], "amplifier-tools", "workspaces", "*", "audit.jsonl"))
    with open(log, encoding="utf-8") as lines:
        records = [json.loads(line) for line in lines if '"kind":"call"' in line]
    assert [record["tool"] for record in records] == ["t"]
    assert records[0]["content"][0]["sha256"]


class Echo:
    name = "echo"
    description = "Echo."
    input_schema = {"type": "object", "properties": {"fail": {"type": "boolean"}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if input.get("fail"):
            return ToolResult(False, None, {"message": "failed as asked"})
        return ToolResult(True, "ok")


@pytest.mark.parametrize("hook", ["tool_post", "tool_error"])
async def test_an_unusable_result_a_plugin_returns_is_its_failure_and_is_recorded(host_factory: Any, hook: str) -> None:
    """The same for a plugin's result (a ``tool_post`` replacement, a ``tool_error`` recovery):
    before, ``metadata=5`` made ``host.call`` raise, with no ``tool_complete``."""

    class Replaces:
        name = "replaces"

    def implementation(self: Any) -> ToolResult:
        return ToolResult(True, "replaced", metadata=5)  # type: ignore[arg-type]

    implementation.__name__ = hook
    setattr(Replaces, hook, hookimpl(implementation))
    completions = Completions()
    host = await host_factory(ToolsPlugin(Echo()), completions, Replaces())
    result = await host.call("echo", {"fail": hook == "tool_error"})
    assert result.success is False
    if hook == "tool_post":  # fails closed, naming the plugin
        assert (result.error["code"], result.error["plugin"]) == ("hook_invalid_return", "replaces")
        assert "metadata that is int, not a dict" in result.error["message"]
    else:  # a failure inside tool_error: the call's own error stands
        assert result.error["message"] == "failed as asked"
    trail = [(d["plugin"], d["action"]) for d in result.metadata["trail"]]
    assert ("replaces", "failed") in trail
    assert len(completions.results) == 1


class WithContent(ToolResult):
    """A subclass with a ``content`` attribute of its own (no seed content blocks)."""

    @property
    def content(self) -> str:
        return "a summary the tool keeps for itself"


async def test_a_subclass_with_its_own_content_attribute_is_not_refused(host_factory: Any) -> None:
    """Found by review: since subclasses were rebuilt, a subclass's own ``content`` attribute was read
    as seed content blocks and the call failed ``invalid_result`` (it succeeded before)."""
    completions = Completions()
    host = await host_factory(ToolsPlugin(Returns("t", WithContent(True, "x"))), completions)
    result = await host.call("t", {})
    assert result.success and result.output == "x" and "content" not in result.metadata
    assert len(completions.results) == 1


class Unreadable(dict):  # type: ignore[type-arg]
    def get(self, *args: Any) -> Any:
        raise RuntimeError("get")


@pytest.mark.parametrize(
    ("value", "success", "fragment"),
    [(ToolResult(True, "r", error={"message": "stray"}), True, None),
     (ToolResult(False, "r"), False, "without an error"),
     (ToolResult(False, "r", error={"message": Hostile()}), False, "cannot use"),
     (ToolResult(True, "r", metadata=5), False, "(metadata that is int, not a dict)")],  # type: ignore[arg-type]
    ids=["stray-error", "failed-no-error", "hostile-message", "names-the-plugin"],
)
async def test_a_plugins_result_is_read_as_a_tools(host_factory: Any, value: ToolResult, success: bool,
                                                  fragment: str | None) -> None:
    """Found by review: a plugin's result kept a stray error beside success (the caller read
    'Error: stray'), a failure with no error, or an error message whose ``str`` raises (the
    caller's ``get_serialized_output`` raised)."""

    class Replaces:
        name = "replaces"

        @hookimpl
        def tool_post(self) -> ToolResult:
            return value

    completions = Completions()
    host = await host_factory(ToolsPlugin(Echo()), completions, Replaces())
    result = await host.call("echo", {})
    assert result.success is success
    if success:
        assert result.error is None and result.get_serialized_output() == "r"
    else:
        assert fragment in result.error["message"] and "tool 'echo' returned" not in result.error["message"]
        result.get_serialized_output()
    assert len(completions.results) == 1


async def test_a_content_block_that_cannot_be_read_is_recorded(tmp_path: Any) -> None:
    """Found by review: a block in ``metadata["content"]`` whose ``get`` raises failed the audit plugin
    (``hook_failed``, no record)."""
    value = ToolResult(True, "x", metadata={"content": [Unreadable(type="text")]})
    async with ToolHost(plugins=[ToolsPlugin(Returns("t", value))], builtins=["audit"],
                        config={"plugins": {"audit": {"fsync": "never"}}}, discover=False, entry_points=False,
                        working_dir=tmp_path) as host:
        result = await host.call("t", {})
        assert result.success, result.error
