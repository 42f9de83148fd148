"""A tool that changes the arguments it was given (found by attack on the conformance kit: the host
handed the tool the caller's own dict, so the change reached the caller, the audit record and the
next attempt of a retry). A retried tool's attempts each get a deep copy of the arguments as the
``tool_pre`` chain left them (found by attack: a change made after the policy's rules checked them
reached the next attempt)."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.builtins.policy import PolicyPlugin


class Rewriter:
    """Pops ``path`` and sets ``injected`` in its input; fails its first attempt as retryable."""

    spec = ToolSpec(name="rewriter", description="Rewrite the input.", effect="Pure",
                    input_schema={"type": "object", "properties": {"path": {"type": "string"}},
                                  "additionalProperties": True},
                    policies={"retry": {"max_attempts": 2, "initial_backoff_ms": 1}})
    name, description = spec.name, spec.description

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.seen.append(dict(input))
        input.pop("path", None)
        input["injected"] = 1
        if len(self.seen) == 1:
            raise ConnectionError("first attempt fails")
        return ToolResult(output="done")


async def test_a_tool_changing_its_input_changes_nothing_outside_it(tmp_path: Path) -> None:
    tool = Rewriter()
    (tmp_path / "work").mkdir()
    host = ToolHost(config={"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(tool)], builtins=["audit"], entry_points=False, discover=False,
                    working_dir=tmp_path / "work")
    arguments = {"path": "/etc/x"}
    async with host:
        result = await host.call("rewriter", arguments)
        log = Path(host.capabilities["audit.path"])
    assert result.success and result.metadata["attempts"] == 2, result.error
    assert arguments == {"path": "/etc/x"}  # the caller's dict
    assert tool.seen == [{"path": "/etc/x"}, {"path": "/etc/x"}]  # the retry's arguments
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["arguments"] == {"path": "/etc/x"}, record  # the audit record


class Flaky:
    """Records what each attempt gets, changes ``l[0]`` of its input in place, fails its first
    attempt as retryable (after ``started`` is set and it waited a turn)."""

    spec = ToolSpec(name="flaky", description="Fails once.", effect="Pure",
                    input_schema={"type": "object", "properties": {
                        "m": {"type": "string"}, "l": {"type": "array", "items": {"type": "string"}}}},
                    policies={"retry": {"max_attempts": 2, "initial_backoff_ms": 1}})
    name, description = spec.name, spec.description

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.started = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.seen.append(copy.deepcopy(input))
        self.started.set()
        await asyncio.sleep(0)
        input["l"][0] = "secret"
        if len(self.seen) == 1:
            raise ConnectionError("first attempt fails")
        return ToolResult(output="done")


class Later:
    """A ``tool_pre`` hook after the policy's that changes ``m`` in place one turn later (a callback
    it scheduled): after the host's check of the chain's end."""

    name = "later"

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> None:
        arguments = call.arguments
        asyncio.get_running_loop().call_soon(arguments.__setitem__, "m", "secret")


NO_SECRET = {"rules": [{"name": "no-secret", "action": "deny", "arguments": {"/m": "secret"}},
                       {"name": "no-secret-item", "action": "deny", "arguments": {"/l/0": "secret"}}]}


async def test_a_retry_runs_with_the_arguments_the_policy_checked(host_factory: Any) -> None:
    """Found by attack: a retry's next attempt ran with the call's arguments object as it was by
    then, not as the policy's rules had checked it: a hook's change landing after the host's check,
    and the first attempt's change inside a nested value, reached the second attempt past the
    deny rules refusing them."""
    tool = Flaky()
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), Later(), config={"plugins": {"policy": NO_SECRET}})
    result = await host.call("flaky", {"m": "ok", "l": ["ok"]})
    assert result.success and result.metadata["attempts"] == 2, result.error
    # before: the second attempt got {"m": "secret", "l": ["secret"]}
    assert tool.seen == [{"m": "ok", "l": ["ok"]}, {"m": "ok", "l": ["ok"]}]


async def test_a_retry_runs_with_the_arguments_as_the_caller_sent_them(host_factory: Any) -> None:
    """The caller's dict changed while the first attempt runs does not reach the second one."""
    tool = Flaky()
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), config={"plugins": {"policy": NO_SECRET}})
    arguments = {"m": "ok", "l": ["ok"]}
    call = asyncio.create_task(host.call("flaky", arguments))
    await asyncio.wait_for(tool.started.wait(), 10)
    arguments["m"] = "secret"
    result = await call
    assert result.success and [seen["m"] for seen in tool.seen] == ["ok", "ok"], (result.error, tool.seen)
