"""Review of session 27's changes: regressions found in them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ToolHost, hookimpl


class SlowEvents:
    """An async ``tool_event`` observer that waits on ``tool:post`` (its place: ``first``/``second``)."""

    def __init__(self, name: str, entered: asyncio.Event | None, seen: list[tuple[str, str]]) -> None:
        self.name = name
        self.entered, self.seen = entered, seen

    @hookimpl
    async def tool_event(self, event: str, data: dict[str, Any]) -> None:
        self.seen.append((self.name, event))
        if event == "tool:post" and self.entered is not None:
            self.entered.set()
            await asyncio.sleep(0.05)


async def test_a_cancel_while_tool_post_events_are_delivered_sends_each_observer_one_end_event(
        tmp_path: Path) -> None:
    """A caller that cancels while an async ``tool_event`` observer is awaited on ``tool:post``: each
    observer sees exactly one of ``tool:post``/``tool:error`` (docs/hooks.md, ``tool_event``)."""
    entered = asyncio.Event()
    seen: list[tuple[str, str]] = []
    plugins: list[Any] = [ToolsPlugin(EchoTool()), SlowEvents("first", entered, seen), SlowEvents("second", None, seen)]
    async with ToolHost(plugins=plugins, builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        task = asyncio.ensure_future(host.call("echo", {"path": "x"}, call_id="c1"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for name in ("first", "second"):
        ends = [event for who, event in seen if who == name and event in ("tool:post", "tool:error")]
        assert len(ends) == 1, seen


async def test_a_tool_failing_with_code_deadline_exceeded_itself_still_opens_its_breaker() -> None:
    """``NOT_RUN_CODES`` are the host's own ends of a call before its tool started (``PolicyError``
    ``deadline_exceeded``, ``AuthError`` ``missing_secret``); a tool's own ``ExecutionError`` that
    happens to use one of those codes (an upstream deadline) is still the tool's failure."""
    from helpers import FakeClock
    from test_policy import Tool, host_with

    from amplifier_tools import ToolResult
    from amplifier_tools.errors import ExecutionError

    class UpstreamTimesOut(Tool):
        async def execute(self, input: dict[str, Any]) -> ToolResult:
            self.runs += 1
            raise ExecutionError("upstream deadline passed", code="deadline_exceeded")

    tool = UpstreamTimesOut("upstream", policies={"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 5000}})
    host = await host_with(tool, clock=FakeClock())
    try:
        for _ in range(2):
            assert (await host.call("upstream", {})).error["code"] == "deadline_exceeded"
        assert (await host.call("upstream", {})).error["code"] == "circuit_open"
        assert tool.runs == 2
    finally:
        await host.close()


class TakesCodes:
    """A third-party plugin whose settings have integer keys (HTTP status codes)."""

    name = "takes-codes"

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None

    @hookimpl
    def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        self.config = config


async def test_a_plugins_own_settings_with_keys_that_are_not_strings_still_reach_it(tmp_path: Path) -> None:
    """The host refuses keys that are not strings in its own tables; a plugin's own section is passed
    to the plugin as it is (it was before): ``codes: {429: 5}`` from YAML or code is the plugin's."""
    plugin = TakesCodes()
    config = {"plugins": {"takes-codes": {"codes": {429: 5, 503: 2}}}}
    async with ToolHost(config=config, plugins=[plugin], builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False):
        assert plugin.config == {"codes": {429: 5, 503: 2}}


def test_a_mount_plan_with_keys_that_are_not_strings_in_a_modules_config_or_an_agent_section_loads() -> None:
    """A mount plan's module ``config`` is the plugin's own; its agent sections (``providers``,
    ``session``) are dropped unread, so nothing in them refuses the plan."""
    from amplifier_tools.config import validate_config

    plan = {"tools": [{"module": "tool-x", "config": {"codes": {429: 5}}}],
            "providers": [{"module": "provider-x", "config": {1: 2}}], "session": {"note": "a\x00b"}}
    assert validate_config(plan)["modules"] == [{"module": "tool-x", "config": {"codes": {429: 5}}}]


def test_a_key_that_is_not_a_string_in_the_hosts_own_tables_is_still_refused() -> None:
    from amplifier_tools.config import validate_config
    from amplifier_tools.errors import ConfigError

    for config, key in (({"plugins": {1: {}}}, "plugins.1"), ({"tools": {"x": {1: 2}}}, "tools.x.1")):
        with pytest.raises(ConfigError) as info:
            validate_config(config)
        assert info.value.key == key


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 runs a hook under a timeout in a task of its own")
async def test_close_awaited_from_an_async_tool_post_hook_is_refused_at_once(tmp_path: Path) -> None:
    """docs/design.md: a tool or hook awaiting ``close()`` of its own host, from inside the call, gets
    ``close_inside_call`` at once (3.11+). An async ``tool_post`` implementation now runs in a task
    of its own (to finish despite a cancellation), which ``close()`` must still tell for the call's."""
    holder: dict[str, Any] = {}

    class ClosesInPost:
        name = "closes-in-post"

        @hookimpl
        async def tool_post(self) -> None:
            try:
                await holder["host"].close()
            except Exception as exc:  # what the hook saw is the assertion
                holder["error"] = exc

    host = holder["host"] = ToolHost(plugins=[ToolsPlugin(EchoTool()), ClosesInPost()], builtins=False,
                                     entry_points=False, working_dir=tmp_path, discover=False,
                                     config={"shutdown_grace_ms": 2000})
    await host.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await asyncio.wait_for(host.call("echo", {"path": "x"}), 10)
        assert loop.time() - started < 1.5
        assert result.success, result.error
        assert getattr(holder.get("error"), "code", None) == "close_inside_call"
    finally:
        await host.close()


class HangsInPost:
    """An async ``tool_post`` implementation with no hook timeout that never returns."""

    name = "hangs-in-post"
    hook_timeout_ms = None

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    @hookimpl
    async def tool_post(self) -> None:
        self.entered.set()
        await asyncio.sleep(3600)


async def test_a_call_cut_by_close_in_a_tool_post_hook_without_a_timeout_is_still_recorded(tmp_path: Path) -> None:
    """Before session 27 a cut by ``close()`` cut the ``tool_post`` chain, and the call was recorded
    ``host_closing``. Run to its end despite the cut, a hook that nothing bounds never ended, and
    ``close()`` ran the cleanups (the audit log's) without the call's record."""
    import json

    hangs = HangsInPost()
    host = ToolHost(plugins=[ToolsPlugin(EchoTool()), hangs], builtins=["audit"], entry_points=False,
                    discover=False, working_dir=tmp_path, config={"hook_timeout_ms": 100})
    await host.start()
    path = Path(host.capabilities["audit.path"])
    call = asyncio.ensure_future(host.call("echo", {"path": "x"}, call_id="c1"))
    await hangs.entered.wait()
    await asyncio.wait_for(host.close(grace_ms=0), 20)
    assert call.done() and call.result().error["code"] == "host_closing"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["call_id"] for r in records if r.get("kind") == "call"] == ["c1"]
