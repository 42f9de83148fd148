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


def run(coro: Any) -> Any:
    """Run a coroutine from sync test code (hypothesis tests)."""
    return asyncio.run(coro)
