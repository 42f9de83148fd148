"""Small tools and plugins shared by the core tests."""

from __future__ import annotations

import asyncio
from typing import Any

from amplifier_tools import ToolResult
from amplifier_tools.loader import ToolMount


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


class ToolsPlugin(ToolMount):
    """Mounts the given tool objects (the host's own ``ToolMount``, with the tools first)."""

    def __init__(self, *tools: Any, name: str = "tools") -> None:
        super().__init__(name, *tools)


def run(coro: Any) -> Any:
    """Run a coroutine from sync test code (hypothesis tests)."""
    return asyncio.run(coro)


class FakeClock:
    """A clock for the policy plugin (``PolicyPlugin(clock=clock, sleep=clock.sleep)``): time moves
    only when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)
