"""The pytest plugin's fixtures and helpers, as a plugin author uses them."""

from __future__ import annotations

from typing import Any

import pytest

from amplifier_tools import Deny, ToolResult, ToolSpec, hookimpl
from amplifier_tools.pytest_plugin import HookRecorder, MockTool, assert_conforms


class DenyDelete:
    name = "deny-delete"

    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        return Deny("no deletes", code="no_delete") if call.arguments.get("op") == "delete" else None


class Mount:
    name = "mount-mock"

    def __init__(self, tool: Any) -> None:
        self.tool = tool

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", self.tool)


async def test_tool_host_mock_tool_and_recorder(tool_host: Any, hook_recorder: HookRecorder) -> None:
    mock = MockTool(name="local::store.op", return_value="done")
    async with tool_host(Mount(mock), DenyDelete(), hook_recorder) as host:
        ok = await host.call("store_op", {"op": "read"})
        denied = await host.call("store_op", {"op": "delete"})
    assert ok.output == "done"
    assert denied.error["code"] == "no_delete"
    assert mock.call_count == 1 and mock.last_input == {"op": "read"} and mock.calls == [{"op": "read"}]
    # The denied call never reaches the recorder's (trylast) tool_pre: the chain stops at the Deny.
    assert hook_recorder.hooks() == ["tool_pre", "tool_post", "tool_complete", "tool_error", "tool_complete"]
    assert [r.success for r in hook_recorder.results()] == [True, False]


async def test_mock_tool_side_effect_becomes_typed_error(tool_host: Any) -> None:
    mock = MockTool(side_effect=ConnectionError("reset by peer"))
    async with tool_host(Mount(mock)) as host:
        result = await host.call("mock_tool", {})
    assert result.error["type"] == "ExecutionError" and result.error["retryable"] is True


async def test_assert_conforms_passes_a_good_tool_and_fails_a_bad_one() -> None:
    class Good:
        spec = ToolSpec(name="local::math.double", version="1.0.0", description="Double it.", effect="Pure",
                        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
                        examples=[{"input": {"n": 2}, "output": 4}])  # type: ignore[list-item]
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output=input["n"] * 2)

    report = await assert_conforms(Good())
    assert any(c.name == "local::math.double: example 1" and c.passed for c in report.checks)

    class Wrong(Good):
        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output=input["n"] * 3)

    with pytest.raises(pytest.fail.Exception, match="output 6 != example 4"):
        await assert_conforms(Wrong())


async def test_tool_host_keeps_state_out_of_the_users_state_directory(tool_host: Any, tmp_path: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)  # as in a plugin author's test run
    async with tool_host(Mount(MockTool(name="local::store.op", return_value="done")),
                         builtins=["audit"]) as host:
        assert (await host.call("store_op", {})).success
    assert not (home / ".local").exists()
    assert (host.state_dir / "audit.jsonl").exists()
