"""A half-open probe held up by a later plugin's ``tool_pre`` hook, on an in-process breaker.

Found by review: the probe's bound (its admission waits and its longest run) does not cover
other plugins' ``tool_pre`` hooks, which run after the policy's and before the tool's timeout
starts. On an in-process breaker a probe is never lost (every end of the call releases it), yet
a probe slowed by such a hook was taken as lost once its bound passed, and a second call was let
through as another probe while the first still ran: two probes against a backend the breaker had
found failing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, ToolHost, ToolResult, ToolSpec, hookimpl

COOLDOWN_MS = 200


class Flaky:
    name, description = "flaky", "flaky"

    def __init__(self) -> None:
        self.spec = ToolSpec(name="flaky", description="flaky", effect="Pure",
                             policies={"timeout_ms": 50,
                                       "circuit_breaker": {"failure_threshold": 1, "cooldown_ms": COOLDOWN_MS}})
        self.fail, self.entered = True, 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.entered += 1
        if self.fail:
            raise ExecutionError("backend down", code="backend_down")
        return ToolResult(output="ok")


class SlowApproval:
    """A later ``tool_pre`` hook (an approval, say) that holds the first call it sees after ``arm``."""

    name = "slow_approval"

    def __init__(self) -> None:
        self.hold: asyncio.Event | None = None

    @hookimpl(trylast=True)
    async def tool_pre(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None:
            await hold.wait()


async def test_a_probe_held_by_a_later_hook_is_the_only_probe_on_an_in_process_breaker(tmp_path: Path) -> None:
    tool, approval = Flaky(), SlowApproval()
    (tmp_path / "work").mkdir()
    async with ToolHost(config={"state_dir": str(tmp_path / "state")}, plugins=[ToolsPlugin(tool), approval],
                        builtins=["policy"], entry_points=False, discover=False,
                        working_dir=tmp_path / "work") as host:
        assert (await host.call("flaky", {})).error["code"] == "backend_down"
        await asyncio.sleep(COOLDOWN_MS / 1000 + 0.05)
        tool.fail, release = False, asyncio.Event()
        approval.hold = release
        probe = asyncio.ensure_future(host.call("flaky", {}))
        await asyncio.sleep(0.4)  # past the probe's bound (50 ms timeout + 50 ms admission), its hook still waiting
        second = await host.call("flaky", {})
        release.set()
        assert (await probe).output == "ok"
        assert second.error is not None and second.error["code"] == "circuit_open", second
        assert tool.entered == 2  # the failure, then the probe alone
