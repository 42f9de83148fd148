"""A rewrite made after the policy's rules or the protected-path guard decided is decided again.

Found by attack: a ``tool_pre`` hook running after the policy plugin's (``trylast``, or registered
before it) returned ``Modify`` into arguments a deny rule refuses, and the tool ran with them: the
rules had been checked on the arguments the policy saw. The filesystem plugin's protected-path guard
(``tryfirst``) was escaped the same way. Now ``tool_rewritten`` runs once after a chain that
rewrote, for the plugins whose ``tool_pre`` did not see the final arguments; its ``Deny`` ends the
call as a ``tool_pre`` denial does.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import Deny, Modify, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.builtins.policy import PolicyPlugin

DENY_SECRET = {"rules": [{"name": "no-secret", "action": "deny", "arguments": {"/m": "secret"}}]}


class Echo:
    name = description = "echo"

    def __init__(self, **policies: Any) -> None:
        self.spec = ToolSpec(name="echo", description="echo", policies=policies,
                             input_schema={"type": "object", "properties": {"m": {"type": "string"}}})
        self.seen: list[Any] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.seen.append(input["m"])
        return ToolResult(output=input["m"])


class Rewriter:
    """Rewrites ``m`` to ``to`` (or to what ``to(call)`` gives), after the policy (``trylast``)."""

    name = "normaliser"

    def __init__(self, to: Any) -> None:
        self.to = to

    def rewrite(self, call: Any) -> Modify:
        return Modify(self.to(call) if callable(self.to) else {"m": self.to}, reason="normalised")

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> Modify:
        return self.rewrite(call)


class Early(Rewriter):
    """The same, before the policy (``tryfirst``)."""

    name = "early"

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: Any) -> Modify:
        return self.rewrite(call)


class Ends:
    name = "ends"

    def __init__(self) -> None:
        self.hooks: list[str] = []

    @hookimpl
    def tool_error(self, error: Any) -> None:
        self.hooks.append("tool_error")

    @hookimpl
    def tool_complete(self, result: Any) -> None:
        self.hooks.append("tool_complete")


class Observer(Ends):
    name = "observer"

    @hookimpl
    def tool_rewritten(self, call: Any) -> None:
        self.hooks.append("tool_rewritten")


def audit_records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_a_later_rewrite_into_a_denied_value_is_denied_by_the_rule(tmp_path: Path) -> None:
    tool, ends, log = Echo(concurrency={"limit": 1, "queue": False}), Ends(), tmp_path / "audit.jsonl"
    (tmp_path / "work").mkdir()
    policy, normaliser = PolicyPlugin(), Rewriter("secret")
    host = ToolHost(config={"plugins": {"policy": DENY_SECRET, "audit": {"path": str(log)}}},
                    plugins=[ToolsPlugin(tool), policy, normaliser, ends], builtins=["audit"],
                    entry_points=False, working_dir=tmp_path / "work", discover=False)
    async with host:
        result = await host.call("echo", {"m": "ok"})
        assert tool.seen == []  # before: ["secret"]
        assert (result.error["type"], result.error["code"]) == ("PolicyError", "rule_denied"), result.error
        assert result.error["plugin"] == "policy" and result.error["rule"] == "no-secret"
        assert "no-secret" in result.error["message"]
        trail = result.metadata["trail"]
        assert [(d["plugin"], d["hook"], d["action"]) for d in trail] == [
            ("normaliser", "tool_pre", "modify"), ("policy", "tool_rewritten", "deny")]
        assert trail[-1]["details"]["rule"] == "no-secret"
        assert ends.hooks == ["tool_error", "tool_complete"]
        assert not any(policy.held_resources().values())  # the concurrency slot tool_pre took is back
        normaliser.to = "fine"
        again = await host.call("echo", {"m": "ok"})  # the one slot is free: not concurrency_limited
        assert again.success and tool.seen == ["fine"], again.error
    first = audit_records(log)[0]
    assert first["error"]["code"] == "rule_denied" and first["error"]["plugin"] == "policy"
    # as for any denial in the chain, the record holds the arguments the caller sent; the trail the rewrite
    assert first["arguments"] == {"m": "ok"}
    assert [(d["plugin"], d["hook"], d["action"], d["details"]) for d in first["trail"]] == [
        ("normaliser", "tool_pre", "modify", {"changed": ["m"]}),
        ("policy", "tool_rewritten", "deny", {"rule": "no-secret"})]


async def test_a_later_rewrite_into_an_allowed_value_runs(host_factory: Any) -> None:
    tool = Echo()
    rules = {"default_action": "deny", "rules": [{"name": "plain", "action": "allow", "arguments": {"/m": "?*"}},
                                                 *DENY_SECRET["rules"]]}
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), Rewriter("fine"),
                              config={"plugins": {"policy": rules}})
    result = await host.call("echo", {"m": "ok"})
    assert result.success and tool.seen == ["fine"], result.error
    # one allow entry: the same rule allows the rewritten arguments
    assert [(d["plugin"], d["hook"], d["action"]) for d in result.metadata["trail"]] == [
        ("policy", "tool_pre", "allow"), ("normaliser", "tool_pre", "modify")]


async def test_a_rewrite_before_the_policy_is_checked_once(host_factory: Any,
                                                           monkeypatch: Any) -> None:
    checks: list[Any] = []
    check = PolicyPlugin._check_rules

    def counted(self: PolicyPlugin, call: Any, *args: Any) -> Any:
        checks.append(call.arguments["m"])
        return check(self, call, *args)

    monkeypatch.setattr(PolicyPlugin, "_check_rules", counted)
    tool, early = Echo(), Early("fine")
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), early, config={"plugins": {"policy": DENY_SECRET}})
    assert (await host.call("echo", {"m": "ok"})).success
    early.to = "secret"
    denied = await host.call("echo", {"m": "ok"})
    assert denied.error["code"] == "rule_denied" and denied.metadata["trail"][-1]["hook"] == "tool_pre"
    assert checks == ["fine", "secret"] and tool.seen == ["fine"]


async def test_a_rewrite_back_to_the_arguments_sent_is_decided_again(host_factory: Any) -> None:
    """An earlier hook rewrites ``secret`` to ``ok``, the policy allows that, a later one gives back
    the very object the chain began with: the policy never saw it (why the host does not compare the
    arguments object before and after the chain, but asks whether any hook returned ``Modify``)."""
    began: list[Any] = []

    def back(call: Any) -> Any:
        return began[0]

    class Keeping(Early):
        def rewrite(self, call: Any) -> Modify:
            began.append(call.arguments)
            return super().rewrite(call)

    tool = Echo()
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), Keeping("ok"), Rewriter(back),
                              config={"plugins": {"policy": DENY_SECRET}})
    result = await host.call("echo", {"m": "secret"})
    assert result.error["code"] == "rule_denied" and tool.seen == [], result.error
    assert result.metadata["trail"][-1]["hook"] == "tool_rewritten"


async def test_a_later_rewrite_naming_a_protected_path_is_refused_by_the_guard(tmp_path: Path) -> None:
    class Writer:
        name = description = "writer"
        input_schema = {"type": "object", "properties": {"path": {"type": "string"}}}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output=f"wrote {input['path']}")

    (tmp_path / "work").mkdir()
    host = ToolHost(plugins=[ToolsPlugin(Writer())], builtins=["filesystem"], entry_points=False,
                    working_dir=tmp_path / "work", discover=False)
    async with host:
        target = str(host.state_dir / "audit.jsonl")
        host.plugin_manager.register(Rewriter(lambda call: {"path": target}), name="normaliser")
        result = await host.call("writer", {"path": "notes.txt"})
    assert (result.error["type"], result.error["code"]) == ("AuthError", "path_protected"), result.error
    assert result.error["plugin"] == "filesystem" and target.startswith(result.error["path"])
    assert result.metadata["trail"][-1]["hook"] == "tool_rewritten"


async def test_hook_tool_rewritten_is_never_called_without_a_modify(host_factory: Any) -> None:
    tool, observer = Echo(), Observer()
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), observer, config={"plugins": {"policy": DENY_SECRET}})
    assert (await host.call("echo", {"m": "ok"})).success
    assert observer.hooks == ["tool_complete"]
    host.plugin_manager.register(Rewriter("fine"), name="normaliser")
    assert (await host.call("echo", {"m": "ok"})).success
    assert observer.hooks == ["tool_complete", "tool_rewritten", "tool_complete"]


async def test_a_raising_tool_rewritten_fails_closed_naming_the_plugin(host_factory: Any) -> None:
    class Broken:
        name = "broken"

        @hookimpl
        def tool_rewritten(self) -> None:
            raise RuntimeError("boom")

    tool = Echo()
    host = await host_factory(ToolsPlugin(tool), Broken(), Rewriter("fine"))
    result = await host.call("echo", {"m": "ok"})
    assert (result.error["type"], result.error["code"]) == ("SystemError", "hook_failed"), result.error
    assert result.error["plugin"] == "broken" and result.error["hook"] == "tool_rewritten"
    assert tool.seen == []


async def test_tool_rewritten_cannot_rewrite(host_factory: Any) -> None:
    class Sneaky:
        name = "sneaky"

        def __init__(self, in_place: bool) -> None:
            self.in_place = in_place

        @hookimpl
        def tool_rewritten(self, call: Any) -> Any:
            if self.in_place:
                call.arguments["m"] = "secret"
                return None
            return Modify({"m": "secret"})

    for in_place, code in ((False, "hook_invalid_return"), (True, "hook_changed_arguments")):
        tool = Echo()
        host = await host_factory(ToolsPlugin(tool), Sneaky(in_place), Rewriter("fine"))
        result = await host.call("echo", {"m": "ok"})
        assert (result.error["type"], result.error["code"]) == ("SystemError", code), result.error
        assert tool.seen == []


async def test_a_deny_from_tool_rewritten_stops_later_ones(host_factory: Any) -> None:
    class No:
        name = "no"

        @hookimpl(tryfirst=True)
        def tool_rewritten(self) -> Deny:
            return Deny("not after a rewrite", code="no_rewrites")

    observer = Observer()
    host = await host_factory(ToolsPlugin(Echo()), No(), observer, Rewriter("fine"))
    result = await host.call("echo", {"m": "ok"})
    assert (result.error["type"], result.error["code"], result.error["plugin"]) == ("PolicyError", "no_rewrites", "no")
    assert observer.hooks == ["tool_error", "tool_complete"]


async def test_an_amplifier_modify_handler_cannot_rewrite_past_the_rules(tmp_path: Path) -> None:
    """An Amplifier ``tool:pre`` handler runs after the plain plugins, so after the policy: its
    ``modify`` reached the tool past a deny rule (found by attack, the same hole)."""
    from amplifier_fixtures import hook_module
    from helpers import EchoTool

    hook_module.SEEN.clear()
    echo = EchoTool()
    rules = [{"name": "no-rewritten", "action": "deny", "arguments": {"/path": f"{tmp_path}/rewritten-*"}}]
    config = {"modules": [{"module": "amplifier_fixtures.hook_module", "config": {"action": "modify"}}],
              "plugins": {"policy": {"rules": rules}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(echo), PolicyPlugin()], builtins=False,
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        result = await host.call("echo", {"path": "a.txt"})
    assert echo.calls == [] and result.error["code"] == "rule_denied", result.error  # before: it ran
    assert result.error["rule"] == "no-rewritten"


async def test_an_amplifier_handler_of_the_deciding_plugin_after_the_rewrite_does_not_skip_its_check(
        host_factory: Any) -> None:
    """Found by attack: which plugins saw the final arguments was told by plugin name, and an
    Amplifier handler is named by the plugin that registered it (``coordinator.hooks``): a guard
    plugin's own ``tool:pre`` observer, running after another handler's ``modify``, counted as its
    ``tool_pre`` having seen the rewrite, and its ``tool_rewritten`` was skipped."""

    class Guard:
        name = "guard"

        @hookimpl(tryfirst=True)
        def tool_pre(self, call: Any) -> Deny | None:
            return Deny("no secret", code="guarded") if call.arguments["m"] == "secret" else None

        @hookimpl
        def tool_rewritten(self, call: Any) -> Deny | None:
            return self.tool_pre(call)

    async def rewrite(event: str, data: dict[str, Any]) -> Any:
        return {"action": "modify", "data": {**data, "tool_input": {"m": "secret"}}}

    async def observe(event: str, data: dict[str, Any]) -> Any:
        return None

    tool = Echo()
    host = await host_factory(ToolsPlugin(tool), Guard())
    host.events.register("tool:pre", rewrite, priority=0, name="rewrite", owner="host")
    host.events.register("tool:pre", observe, priority=10, name="observe", owner="guard")
    result = await host.call("echo", {"m": "ok"})
    assert tool.seen == [] and result.error["code"] == "guarded", result.error  # before: it ran with "secret"
    assert result.error["plugin"] == "guard"
    assert [(d["plugin"], d["hook"], d["action"]) for d in result.metadata["trail"]][-1] == (
        "guard", "tool_rewritten", "deny")


class SlowGuard:
    """A guard whose ``tool_rewritten`` waits (an async check against a service, say)."""

    name = "slow-guard"

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: Any) -> None:
        return None

    @hookimpl
    async def tool_rewritten(self, call: Any) -> None:
        self.entered.set()
        await asyncio.sleep(30)


async def test_a_call_cancelled_while_tool_rewritten_waits_ends_once_and_gives_back_its_slot(tmp_path: Path) -> None:
    """The edge of the completion promise: cancelled in ``tool_rewritten``, the call is recorded
    once (``cancelled``), ends in one ``tool_error`` and ``tool_complete``, never runs the tool, and
    the concurrency slot the policy took in ``tool_pre`` is free for the next call."""
    tool, ends, guard, log = Echo(concurrency={"limit": 1, "queue": False}), Ends(), SlowGuard(), tmp_path / "a.jsonl"
    (tmp_path / "work").mkdir()
    policy, normaliser = PolicyPlugin(), Rewriter("fine")
    host = ToolHost(config={"plugins": {"policy": DENY_SECRET, "audit": {"path": str(log)}}},
                    plugins=[ToolsPlugin(tool), policy, normaliser, ends, guard], builtins=["audit"],
                    entry_points=False, working_dir=tmp_path / "work", discover=False)
    async with host:
        task = asyncio.create_task(host.call("echo", {"m": "ok"}))
        await asyncio.wait_for(guard.entered.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tool.seen == [] and ends.hooks == ["tool_error", "tool_complete"]
        assert not any(policy.held_resources().values())
        host.plugin_manager.unregister(guard)
        again = await host.call("echo", {"m": "ok"})  # the one slot is free: not concurrency_limited
        assert again.success and tool.seen == ["fine"], again.error
    records = audit_records(log)
    assert [r["error"]["code"] if r["error"] else "ok" for r in records] == ["cancelled", "ok"], records
