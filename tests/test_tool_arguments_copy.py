"""A tool that changes the arguments it was given (found by attack on the conformance kit: the host
handed the tool the caller's own dict, so the change reached the caller, the audit record and the
next attempt of a retry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec


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
