"""Small tools and plugins shared by the core tests."""

from __future__ import annotations

import asyncio
from typing import Any

from amplifier_tools import ToolResult, hookimpl


class EchoTool:
    """A seed-style tool: returns its ``path`` argument; counts executions."""

    name = "echo"
    description = "Echo the path back."
    input_schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.calls.append(input)
        return ToolResult(success=True, output=input["path"] * input.get("times", 1))


class ToolsPlugin:
    """Mounts the given tool objects."""

    def __init__(self, *tools: Any, name: str = "tools") -> None:
        self.name = name
        self.tools = tools

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        for tool in self.tools:
            await coordinator.mount("tools", tool)


class Recorder:
    """Observes every hook; records (hook, call name, detail) tuples."""

    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.events: list[tuple[str, str, Any]] = []

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> None:
        self.events.append(("tool_pre", call.name, dict(call.arguments)))

    @hookimpl(trylast=True)
    def tool_post(self, call: Any, result: ToolResult) -> None:
        self.events.append(("tool_post", call.name, result.output))

    @hookimpl(trylast=True)
    def tool_error(self, call: Any, error: Any) -> None:
        self.events.append(("tool_error", call.name, error))

    @hookimpl(trylast=True)
    def tool_complete(self, call: Any, result: ToolResult) -> None:
        self.events.append(("tool_complete", call.name, result))

    def hooks(self) -> list[str]:
        return [event[0] for event in self.events]


def run(coro: Any) -> Any:
    """Run a coroutine from sync test code (hypothesis tests)."""
    return asyncio.run(coro)
