"""Small tools and plugins shared by the core tests."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest

from amplifier_tools import ToolResult, hookimpl
from amplifier_tools.loader import ToolMount


async def leave_a_cancellation_pending() -> None:
    """Cancel the current task and catch the ``CancelledError`` without withdrawing the request
    (CPython 3.11+: ``Task.cancelling()`` stays 1), as an ``except CancelledError`` block that goes
    on does; a call, start or close after it must not take that request for its own."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        pass  # caught; the request stays counted


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


class WaitsUntilCut:
    """A tool that sets ``running`` and then sleeps 30 s: cut by a deadline, a cancellation or
    ``close()``."""

    name = "waits"
    description = "Waits until cut."
    input_schema = {"type": "object"}

    def __init__(self) -> None:
        self.running = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        await asyncio.sleep(30)
        return ToolResult(True, "slept")


class LoggingCleanup:
    """A plugin whose cleanup appends its name to ``log``; with ``raises``, it awaits a task it
    cancelled and lets that task's ``CancelledError`` out (its own, not close()'s)."""

    def __init__(self, name: str, log: list[str], raises: bool = False) -> None:
        self.name, self.log, self.raises = name, log, raises

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> Any:
        async def cleanup() -> None:
            self.log.append(self.name)
            if self.raises:
                worker = asyncio.ensure_future(asyncio.sleep(10))
                await asyncio.sleep(0)
                worker.cancel()
                await worker

        return cleanup


class ToolsPlugin(ToolMount):
    """Mounts the given tool objects (the host's own ``ToolMount``, with the tools first)."""

    def __init__(self, *tools: Any, name: str = "tools") -> None:
        super().__init__(name, *tools)


def run(coro: Any) -> Any:
    """Run a coroutine from sync test code (hypothesis tests)."""
    return asyncio.run(coro)


#: The event loops a user's application may run the host on: asyncio's own, and uvloop (which
#: ``uvicorn[standard]`` installs): in the ``test`` extra; its cases skip where it is not installed.
EVENT_LOOPS = ["asyncio", "uvloop"]


def run_on(loop_kind: str, coro: Any) -> Any:
    """Run ``coro`` to its end on a new loop of ``loop_kind`` (one of ``EVENT_LOOPS``), closed after."""
    if loop_kind == "uvloop":
        try:
            uvloop = importlib.import_module("uvloop")  # a test dependency only (and not typed everywhere)
        except ImportError:
            coro.close()
            pytest.skip("uvloop is not installed")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


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
