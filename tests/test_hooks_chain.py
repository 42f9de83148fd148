"""Hook chaining, vetoes, rewrites, attribution and fail-closed behaviour (hookspec semantics)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from helpers import EchoTool, ToolsPlugin

from amplifier_tools import Deny, Modify, PolicyError, ToolResult, hookimpl
from amplifier_tools.pytest_plugin import HookRecorder as Recorder


class Rewriter:
    name = "rewriter"

    @hookimpl
    def tool_pre(self, call: Any) -> Modify:
        return Modify({"path": "/rewritten/" + call.arguments["path"]}, reason="prefix paths")


class SeesAndDenies:
    """Registered before Rewriter, so pluggy calls it after Rewriter (LIFO)."""

    name = "guard"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        self.seen.append(call.arguments["path"])
        if "secret" in call.arguments["path"]:
            return Deny("paths with 'secret' are not allowed", code="secret_path")
        return None


async def test_hook_tool_pre_later_plugin_sees_rewritten_arguments(host_factory: Any, echo: EchoTool) -> None:
    guard = SeesAndDenies()
    host = await host_factory(ToolsPlugin(echo), guard, Rewriter())
    result = await host.call("echo", {"path": "a.txt"})
    assert result.success
    assert guard.seen == ["/rewritten/a.txt"]
    assert echo.calls == [{"path": "/rewritten/a.txt"}]
    trail = result.metadata["trail"]
    assert trail[0]["plugin"] == "rewriter" and trail[0]["action"] == "modify"
    assert trail[0]["details"]["changed"] == ["path"]


async def test_deny_stops_call_and_tool_error_sees_policy_error_naming_plugin(
    host_factory: Any, echo: EchoTool
) -> None:
    recorder = Recorder()
    host = await host_factory(ToolsPlugin(echo), recorder, SeesAndDenies(), Rewriter())
    result = await host.call("echo", {"path": "secret.txt"})
    assert not result.success
    assert echo.calls == []
    assert result.error["type"] == "PolicyError"
    assert result.error["code"] == "secret_path"
    assert result.error["plugin"] == "guard"
    assert "guard" in result.error["message"]
    errors = [e for e in recorder.calls if e[0] == "tool_error"]
    assert len(errors) == 1
    assert isinstance(errors[0][2], PolicyError) and errors[0][2].plugin == "guard"
    assert [d["action"] for d in result.metadata["trail"]] == ["modify", "deny"]


async def test_async_tool_pre_chains_like_a_sync_one(host_factory: Any, echo: EchoTool) -> None:
    class AsyncRewriter:
        name = "async-rewriter"

        @hookimpl
        async def tool_pre(self, call: Any) -> Modify:
            await asyncio.sleep(0)
            return Modify({"path": call.arguments["path"].upper()})

    guard = SeesAndDenies()
    host = await host_factory(ToolsPlugin(echo), guard, AsyncRewriter())
    result = await host.call("echo", {"path": "abc"})
    assert result.output == "ABC"
    assert guard.seen == ["ABC"]


async def test_invalid_rewrite_is_contract_error_naming_the_plugin(host_factory: Any, echo: EchoTool) -> None:
    class BadRewriter:
        name = "bad-rewriter"

        @hookimpl
        def tool_pre(self, call: Any) -> Modify:
            return Modify({"path": 42})

    recorder = Recorder()
    host = await host_factory(ToolsPlugin(echo), recorder, BadRewriter())
    result = await host.call("echo", {"path": "a"})
    assert result.error["type"] == "ContractError"
    assert result.error["plugin"] == "bad-rewriter"
    assert result.error["pointer"] == "/path"
    assert "bad-rewriter" in result.error["message"]
    assert echo.calls == []
    assert recorder.hooks().count("tool_error") == 1


class RaisesIn:
    def __init__(self, hook: str, *, name: str = "broken") -> None:
        self.name = name
        self.hook = hook

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        if self.hook == "tool_pre":
            raise RuntimeError("pre exploded")

    @hookimpl
    def tool_post(self, result: ToolResult) -> None:
        if self.hook == "tool_post":
            raise RuntimeError("post exploded")


async def test_raising_tool_pre_fails_closed_and_names_plugin(host_factory: Any, echo: EchoTool) -> None:
    host = await host_factory(ToolsPlugin(echo), RaisesIn("tool_pre"))
    result = await host.call("echo", {"path": "a"})
    assert not result.success
    assert result.error["type"] == "SystemError"
    assert result.error["code"] == "hook_failed"
    assert result.error["plugin"] == "broken"
    assert "tool_pre" in result.error["message"] and "pre exploded" in result.error["message"]
    assert echo.calls == []


async def test_raising_tool_post_withholds_output(host_factory: Any, echo: EchoTool) -> None:
    recorder = Recorder()
    host = await host_factory(ToolsPlugin(echo), recorder, RaisesIn("tool_post"))
    result = await host.call("echo", {"path": "sensitive"})
    assert not result.success
    assert result.output is None
    assert result.error["type"] == "SystemError" and result.error["plugin"] == "broken"
    assert "sensitive" not in repr(result.error)
    # The observer after the failing plugin sees the failed result, once, in tool_post.
    posts = [result for hook, _, result in recorder.calls if hook == "tool_post"]
    assert len(posts) == 1 and posts[0].output is None and posts[0].error["plugin"] == "broken"
    assert "tool_error" not in recorder.hooks()


class PostDeny:
    """Denies in ``tool_post`` (withholding a successful call's output) or in ``tool_error``."""

    name = "post-guard"

    @hookimpl
    def tool_post(self) -> Deny:
        return Deny("sensitive output", code="output_withheld")

    @hookimpl
    def tool_error(self) -> Deny:
        return Deny("sensitive failure output")


class Restorer:
    name = "restorer"

    @hookimpl(trylast=True)
    def tool_post(self) -> ToolResult:
        return ToolResult(output="restored")

    @hookimpl(trylast=True)
    def tool_error(self) -> ToolResult:
        return ToolResult(output="recovered")


async def test_a_deny_in_tool_post_withholds_the_output_and_no_later_plugin_restores_it(
        host_factory: Any, echo: EchoTool) -> None:
    """A ``Deny`` from ``tool_post`` is the plugin's denial (it was ``hook_invalid_return``), and,
    as after a fail-closed failure, a later replacement is ignored (found by attack through the
    Amplifier bridge: a later handler's modify made a denied call a success)."""
    host = await host_factory(ToolsPlugin(echo), PostDeny(), Restorer())
    result = await host.call("echo", {"path": "sensitive"})
    assert not result.success and result.output is None
    assert result.error["type"] == "PolicyError" and result.error["code"] == "output_withheld"
    assert result.error["plugin"] == "post-guard" and "sensitive output" in result.error["message"]
    assert [(d["plugin"], d["action"]) for d in result.metadata["trail"]] == [
        ("post-guard", "deny"), ("restorer", "replace_ignored")]


async def test_a_deny_in_tool_error_withholds_a_reported_failures_output(host_factory: Any) -> None:
    class Failing(EchoTool):
        async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
            return {"success": False, "output": "partial secret", "error": "backend down"}

    host = await host_factory(ToolsPlugin(Failing()), PostDeny(), Restorer())
    result = await host.call("echo", {"path": "a"})
    assert not result.success and result.output is None and result.error["code"] == "denied"
    assert [(d["plugin"], d["action"]) for d in result.metadata["trail"]] == [
        ("post-guard", "deny"), ("restorer", "recover_ignored")]


async def test_a_deny_in_tool_error_withholds_the_retried_attempts_messages_too(host_factory: Any) -> None:
    """Found by attack: a ``Pure`` tool's retried failures were noted in the trail with each
    attempt's message, which quoted the output the denial withheld."""
    from amplifier_tools import ToolSpec

    class Leaky(EchoTool):
        spec = ToolSpec(name="echo", description="d", effect="Pure", input_schema=EchoTool.input_schema,
                        policies={"retry": {"max_attempts": 2, "initial_backoff_ms": 1}})

        async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
            return {"success": False, "error": {"message": "partial read: secret-rows", "retryable": True}}

    host = await host_factory(ToolsPlugin(Leaky()), PostDeny())
    result = await host.call("echo", {"path": "a"})
    assert result.error["code"] == "denied" and "secret-rows" not in repr(result.metadata)
    assert [d["action"] for d in result.metadata["trail"]] == ["retry", "deny"]


async def test_fail_open_plugin_failure_is_ignored_and_logged(
    host_factory: Any, echo: EchoTool, caplog: Any
) -> None:
    config = {"plugins": {"broken": {"on_error": "ignore"}}}
    host = await host_factory(ToolsPlugin(echo), RaisesIn("tool_post"), config=config)
    with caplog.at_level(logging.WARNING, logger="amplifier_tools"):
        result = await host.call("echo", {"path": "a"})
    assert result.success and result.output == "a"
    assert any("broken" in rec.getMessage() and "ignored" in rec.getMessage() for rec in caplog.records)
    assert result.metadata["trail"][0]["action"] == "ignored_failure"


async def test_on_error_ignore_does_not_excuse_a_failed_mount_and_the_error_says_so(tmp_path: Any) -> None:
    """``on_error = "ignore"`` is an observer's opt-in to fail open in its hooks; a plugin that did not
    mount may be a missing policy, so its start still stops the host — saying the setting was not
    applied, instead of ignoring it silently (found with the mcp plugin's servers)."""
    import pytest

    from amplifier_tools import ExecutionError, PluginLoadError, ToolHost

    class CannotMount:
        name = "cannot-mount"

        @hookimpl
        def mount(self) -> None:
            raise ExecutionError("its backend is down", hint="start the backend")

    config = {"plugins": {"cannot-mount": {"on_error": "ignore"}}}
    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(config, plugins=[CannotMount()], builtins=False, entry_points=False,
                            working_dir=tmp_path, discover=False):
            pass
    assert "its backend is down; [plugins.cannot-mount] on_error = 'ignore' does not apply" in str(caught.value)
    assert caught.value.hint == "start the backend"


async def test_async_hook_overrunning_its_timeout_fails_closed(host_factory: Any, echo: EchoTool) -> None:
    class Slow:
        name = "slow"

        @hookimpl
        async def tool_pre(self) -> None:
            await asyncio.sleep(5)

    config = {"plugins": {"slow": {"hook_timeout_ms": 50}}}
    host = await host_factory(ToolsPlugin(echo), Slow(), config=config)
    result = await host.call("echo", {"path": "a"})
    assert result.error["code"] == "hook_timeout"
    assert result.error["plugin"] == "slow"
    assert echo.calls == []


async def test_hook_tool_post_replacement_is_validated_against_output_schema(host_factory: Any) -> None:
    class Typed(EchoTool):
        output_schema = {"type": "string"}

    class Replacer:
        name = "replacer"

        @hookimpl
        def tool_post(self, result: ToolResult) -> ToolResult:
            return ToolResult(output={"not": "a string"})

    host = await host_factory(ToolsPlugin(Typed()), Replacer())
    result = await host.call("echo", {"path": "a"})
    assert result.error["type"] == "ContractError"
    assert result.error["code"] == "invalid_output"
    assert result.error["plugin"] == "replacer"
    assert result.output is None


async def test_hook_tool_post_chain_sees_previous_replacement(host_factory: Any, echo: EchoTool) -> None:
    class Upper:
        name = "upper"

        @hookimpl(tryfirst=True)
        def tool_post(self, result: ToolResult) -> ToolResult:
            return ToolResult(output=result.output.upper())

    class Suffix:
        name = "suffix"

        @hookimpl
        def tool_post(self, result: ToolResult) -> ToolResult:
            return ToolResult(output=result.output + "!")

    # Suffix is registered last, so pluggy would call it first; Upper's tryfirst wins.
    host = await host_factory(ToolsPlugin(echo), Upper(), Suffix())
    result = await host.call("echo", {"path": "a"})
    assert result.output == "A!"
    assert [d["plugin"] for d in result.metadata["trail"]] == ["upper", "suffix"]


async def test_hook_tool_error_recovery_replaces_failure(host_factory: Any) -> None:
    class Failing(EchoTool):
        async def execute(self, input: dict[str, Any]) -> dict[str, Any]:
            return {"success": False, "error": "backend down"}

    class Fallback:
        name = "fallback"

        @hookimpl
        def tool_error(self, error: Any) -> ToolResult:
            return ToolResult(output=f"cached ({error.code})")

    recorder = Recorder()
    host = await host_factory(ToolsPlugin(Failing()), recorder, Fallback())
    result = await host.call("echo", {"path": "a"})
    assert result.success and result.output == "cached (execution_failed)"
    assert result.metadata["trail"][-1] == {
        "plugin": "fallback", "hook": "tool_error", "action": "recover", "reason": None, "code": None,
        "details": {},
    }
    # The recorder still observed the failure once, and saw the final (recovered) result once.
    assert recorder.hooks() == ["tool_pre", "tool_error", "tool_complete"]
    assert recorder.calls[-1][2].output == "cached (execution_failed)"


async def test_hook_tool_error_failure_keeps_original_error(host_factory: Any) -> None:
    class Broken:
        name = "broken-observer"

        @hookimpl
        def tool_error(self) -> None:
            raise ValueError("observer bug")

    host = await host_factory(ToolsPlugin(EchoTool()), Broken())
    result = await host.call("echo", {"path": 1})
    assert result.error["type"] == "ContractError"
    assert result.metadata["trail"][0]["action"] == "failed"


async def test_hook_tool_complete_sees_every_outcome_exactly_once(host_factory: Any, echo: EchoTool) -> None:
    class Hangs(EchoTool):
        name = "hangs"
        timeout_ms = None

        async def execute(self, input: dict[str, Any]) -> Any:
            await asyncio.sleep(10)

    recorder = Recorder()
    host = await host_factory(
        ToolsPlugin(echo, Hangs()), recorder, SeesAndDenies(),
        config={"tools": {"hangs": {"policies": {"timeout_ms": 30}}}},
    )
    outcomes = [
        await host.call("echo", {"path": "ok"}),
        await host.call("echo", {"path": "secret"}),
        await host.call("echo", {"nope": 1}),
        await host.call("missing", {}),
        await host.call("hangs", {"path": "x"}),
    ]
    completes = [e for e in recorder.calls if e[0] == "tool_complete"]
    assert len(completes) == len(outcomes)
    assert [c[2].success for c in completes] == [True, False, False, False, False]
    assert [o.error["code"] for o in outcomes[1:]] == ["secret_path", "invalid_input", "unknown_tool", "timeout"]
    # exactly one of tool_post / tool_error per call
    assert recorder.hooks().count("tool_post") + recorder.hooks().count("tool_error") == len(outcomes)


async def test_hook_tool_complete_failure_withholds_output(host_factory: Any, echo: EchoTool) -> None:
    class AuditDown:
        name = "audit-down"

        @hookimpl
        def tool_complete(self) -> None:
            raise OSError("disk full")

    host = await host_factory(ToolsPlugin(echo), AuditDown())
    result = await host.call("echo", {"path": "private"})
    assert not result.success and result.output is None
    assert result.error["plugin"] == "audit-down"
    assert "disk full" in result.error["message"]


async def test_hook_tool_complete_decisions_reach_the_result_trail(host_factory: Any, echo: EchoTool) -> None:
    class Reviewer:
        name = "reviewer"

        @hookimpl
        def tool_complete(self, call: Any, context: Any) -> None:
            context.record("reviewer", "tool_complete", "flagged", "output mentions a path", code="flagged")

    host = await host_factory(ToolsPlugin(echo), Reviewer())
    result = await host.call("echo", {"path": "ok"})
    assert result.success and result.output == "ok"
    assert result.metadata["trail"][-1]["plugin"] == "reviewer"
    assert result.metadata["trail"][-1]["action"] == "flagged"


async def test_hook_tool_event_receives_emitted_and_seed_events(host_factory: Any, echo: EchoTool) -> None:
    seen: list[tuple[str, Any]] = []

    class Events:
        name = "events"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.hooks.emit("custom:ready", {"ok": True})

        @hookimpl
        def tool_event(self, event: str, data: dict[str, Any]) -> None:
            seen.append((event, data))

    host = await host_factory(ToolsPlugin(echo), Events())
    await host.call("echo", {"path": "p"})
    await host.call("echo", {"bad": 1})
    names = [event for event, _ in seen]
    assert names == ["custom:ready", "tool:pre", "tool:post", "tool:error"]
    # Amplifier's event data keys.
    pre = seen[1][1]
    assert (pre["tool_name"], pre["tool_canonical_name"], pre["tool_input"]) == ("echo", "echo", {"path": "p"})
    assert pre["name"] == "echo" and pre["input"] == {"path": "p"}  # the older spellings too
    assert pre["tool_call_id"] and pre["session_id"] == host.session_id
    assert seen[2][1]["tool_result"]["output"] == "p" and seen[2][1]["tool_result"]["success"] is True
    assert seen[2][1]["result"] == seen[2][1]["tool_result"]
    assert seen[3][1]["error"]["type"] == "ContractError"
    assert seen[3][1]["error"]["msg"] == seen[3][1]["error"]["message"]


async def test_hook_wrappers_are_rejected_naming_the_plugin(host_factory: Any) -> None:
    import pytest

    from amplifier_tools import PluginLoadError

    class Wrapper:
        name = "wrapper-plugin"

        @hookimpl(wrapper=True)
        def tool_pre(self) -> Any:
            return (yield)

    with pytest.raises(PluginLoadError, match="wrapper-plugin.*hook wrapper"):
        await host_factory(Wrapper())


async def test_hook_mount_receives_own_section_and_cleanups_run_in_reverse(host_factory: Any) -> None:
    order: list[str] = []
    received: dict[str, Any] = {}

    def make(name: str) -> Any:
        class P:
            @hookimpl
            def mount(self, config: dict[str, Any]) -> Any:
                received[name] = config
                return lambda: order.append(name)

        p = P()
        p.name = name  # type: ignore[attr-defined]
        return p

    config = {"plugins": {"first": {"limit": 3, "on_error": "ignore"}, "second": {}}}
    host = await host_factory(make("first"), make("second"), config=config)
    assert received == {"first": {"limit": 3}, "second": {}}
    await host.close()
    assert order == ["second", "first"]


async def test_raising_mount_of_required_plugin_fails_start_naming_it(host_factory: Any) -> None:
    import pytest

    from amplifier_tools import PluginLoadError

    class BadMount:
        name = "bad-mount"

        @hookimpl
        def mount(self) -> None:
            raise RuntimeError("no database")

    with pytest.raises(PluginLoadError, match="bad-mount.*no database"):
        await host_factory(BadMount())


async def test_trace_env_var_prints_hook_calls(
    echo: EchoTool, tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    from amplifier_tools import ToolHost

    monkeypatch.setenv("AMPLIFIER_TOOLS_TRACE", "1")
    async with ToolHost(plugins=[ToolsPlugin(echo), Rewriter()], builtins=False, entry_points=False,
                        working_dir=tmp_path) as host:
        await host.call("echo", {"path": "a"})
    assert "amplifier_tools: calling tool_pre of plugin 'rewriter'" in capsys.readouterr().err


async def test_pluggy_hook_call_monitoring_sees_every_chained_call(echo: EchoTool, tmp_path: Any) -> None:
    """A plugin author's ``add_hookcall_monitoring`` works as in any pluggy project, although the
    dispatcher walks the implementations itself. As in any pluggy project, an async implementation's
    outcome is the coroutine it returned (the host awaits it after the monitors ran)."""
    from amplifier_tools import ToolHost

    seen: list[tuple[str, tuple[str, ...]]] = []
    host = ToolHost(plugins=[ToolsPlugin(echo), Rewriter()], builtins=False, entry_points=False,
                    working_dir=tmp_path)
    undo = host.plugin_manager.add_hookcall_monitoring(
        lambda hook, impls, kwargs: seen.append((hook, tuple(i.plugin_name for i in impls))),
        lambda outcome, hook, impls, kwargs: None)
    async with host:
        result = await host.call("echo", {"path": "a"})
        assert result.success
        assert ("tool_pre", ("rewriter",)) in seen
        undo()
        seen.clear()
        await host.call("echo", {"path": "a"})
    assert seen == []


async def test_a_monitor_installed_by_an_earlier_hook_sees_the_rest_of_the_chain(
        echo: EchoTool, tmp_path: Any) -> None:
    """Whether a monitor is installed is asked before each implementation, not once per chain: one
    that an earlier ``tool_pre`` installs sees the later ones of the same call (found by attack,
    after the chains started calling unmonitored implementations directly)."""
    from amplifier_tools import ToolHost

    seen: list[tuple[str, tuple[str, ...]]] = []

    class Installer:
        name = "installer"
        manager: Any = None

        @hookimpl(tryfirst=True)
        def tool_pre(self, call: Any) -> None:
            if not seen:
                seen.append(("installed", ()))
                self.manager.add_hookcall_monitoring(
                    lambda hook, impls, kwargs: seen.append((hook, tuple(i.plugin_name for i in impls))),
                    lambda outcome, hook, impls, kwargs: None)

    installer = Installer()
    async with ToolHost(plugins=[ToolsPlugin(echo), installer, Rewriter()], builtins=False, entry_points=False,
                        working_dir=tmp_path) as host:
        installer.manager = host.plugin_manager
        assert (await host.call("echo", {"path": "a"})).success
    assert ("tool_pre", ("rewriter",)) in seen


async def test_trace_prints_each_hook_failure_once(
    echo: EchoTool, tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    """A sync failure is seen by pluggy's monitor, an async one only when awaited: one line each
    (a sync failure was printed twice, found by review)."""
    from amplifier_tools import ToolHost

    class SyncBoom:
        name = "sync-boom"

        @hookimpl
        def tool_post(self, call: Any, result: Any) -> None:
            raise RuntimeError("plain-hook-failed")

    class AsyncBoom:
        name = "async-boom"

        @hookimpl
        async def tool_post(self, call: Any, result: Any) -> None:
            raise RuntimeError("coroutine-hook-failed")

    monkeypatch.setenv("AMPLIFIER_TOOLS_TRACE", "1")
    config = {"plugins": {"sync-boom": {"on_error": "ignore"}, "async-boom": {"on_error": "ignore"}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(echo), SyncBoom(), AsyncBoom()], builtins=False,
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        await host.call("echo", {"path": "a"})
    err = capsys.readouterr().err
    assert err.count("plain-hook-failed") == 1 and err.count("coroutine-hook-failed") == 1, err


def test_registration_finds_the_hooks_pluggy_finds() -> None:
    """``dispatch.PluginManager`` skips the names a plugin only inherits from ``object`` before
    pluggy's static lookup; for every name of every kind of plugin, the answer is pluggy's."""
    import types

    import pluggy

    from amplifier_tools import hookspecs
    from amplifier_tools.builtins import BUILTIN_PLUGINS
    from amplifier_tools.dispatch import PluginManager
    from amplifier_tools.loader import load_target

    class Odd:
        @hookimpl(specname="mount")
        def __init_subclass__(cls) -> None: ...  # a dunder of object's, overridden and marked

        @hookimpl
        def tool_pre(self, call: Any) -> None: ...

    odd = Odd()
    odd.__dict__["__repr__"] = hookimpl(lambda: None)  # an instance attribute shadowing object's
    module = types.ModuleType("plugin_module")
    module.tool_pre = hookimpl(lambda call: None)  # type: ignore[attr-defined]
    pm = PluginManager("amplifier_tools")
    pm.add_hookspecs(hookspecs)
    plugins = [load_target(path) for path in BUILTIN_PLUGINS.values()] + [odd, Odd, module, Recorder()]
    for plugin in plugins:
        for name in dir(plugin):
            assert pm.parse_hookimpl_opts(plugin, name) == pluggy.PluginManager.parse_hookimpl_opts(
                pm, plugin, name), (plugin, name)
    assert pm.parse_hookimpl_opts(odd, "__init_subclass__") is not None
    assert pm.parse_hookimpl_opts(odd, "__repr__") is not None


async def test_registering_a_plugin_runs_none_of_its_properties(tmp_path: Any, echo: EchoTool) -> None:
    """Found by the floors env (tox -e floors): pluggy before 1.7 (setup.cfg allows 1.5) looked at every
    name of a plugin with ``getattr``, so registration ran its properties — one that raised failed
    the plugin's load, and the MCP plugin's ``settings`` imported its module at every start. With any
    pluggy, ``ToolHost(plugins=[obj])``'s own look for hooks (``loader.has_hookimpls``) ran them too."""
    import functools

    from amplifier_tools import ToolHost

    ran: list[str] = []

    class Lazy:
        name = "lazy"

        @property
        def settings(self) -> Any:
            ran.append("settings")
            raise RuntimeError("not configured yet")

        @functools.cached_property
        def client(self) -> Any:
            ran.append("client")
            return object()

        @hookimpl
        def tool_pre(self, call: Any) -> None:
            ran.append("tool_pre")

    async with ToolHost(plugins=[ToolsPlugin(echo), Lazy()], builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        assert [info.name for info in host.failed_plugins] == []
        result = await host.call("echo", {"path": "a"})
    assert result.success and ran == ["tool_pre"]


class EveryCallHook:
    """tool_pre, tool_post and tool_event, each noting that it ran."""

    name = "late"

    def __init__(self) -> None:
        self.ran: list[str] = []

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        self.ran.append("tool_pre")

    @hookimpl
    def tool_post(self, result: Any) -> None:
        self.ran.append("tool_post")

    @hookimpl
    def tool_event(self, event: str) -> None:
        self.ran.append(event)


async def test_a_plugin_registered_or_unregistered_between_calls_is_heard_from_the_next_call(
        host_factory: Any, echo: EchoTool) -> None:
    """Which hooks a call runs is asked once per call (``HookDispatcher.present``): the answer
    follows plugins registered and unregistered after the host started."""
    host = await host_factory(ToolsPlugin(echo))
    assert (await host.call("echo", {"path": "a"})).success
    late = EveryCallHook()
    host.plugin_manager.register(late, name="late")
    assert (await host.call("echo", {"path": "b"})).success
    assert late.ran == ["tool:pre", "tool_pre", "tool_post", "tool:post"]
    host.plugin_manager.unregister(late)
    late.ran.clear()
    assert (await host.call("echo", {"path": "c"})).success
    assert late.ran == []
