"""Amplifier hook modules run inside the call chain (issue: plugins/Amplifier).

The fixture modules in ``amplifier_fixtures/`` use Amplifier's module API as its own hook modules
do: ``coordinator.get("hooks").register("tool:pre", handler, priority=..., name=...)``, handlers
reading ``data["tool_input"]`` and returning ``HookResult``-shaped answers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from amplifier_fixtures import hook_module
from helpers import EchoTool, ToolsPlugin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amplifier_tools import PluginLoadError, ToolHost, ToolResult, hookimpl

MODULE = "amplifier_fixtures.hook_module"
MODULE_B = "amplifier_fixtures.hook_module_b"


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    hook_module.SEEN.clear()


def host_with(tmp_path: Path, echo: EchoTool, *modules: tuple[str, dict[str, Any]], plugins: tuple[Any, ...] = (),
              plugin_config: dict[str, Any] | None = None) -> ToolHost:
    config: dict[str, Any] = {"modules": [{"module": name, "config": cfg} for name, cfg in modules]}
    if plugin_config:
        config["plugins"] = plugin_config
    return ToolHost(config=config, plugins=[ToolsPlugin(echo), *plugins], builtins=False, entry_points=False,
                    working_dir=tmp_path, discover=False)


@pytest.mark.parametrize("via", ["get", "attr"])
async def test_a_deny_handler_blocks_the_call_and_is_attributed_to_its_module(
    tmp_path: Path, echo: EchoTool, via: str
) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": "deny", "via": via})) as host:
        result = await host.call("echo", {"path": "prod.cfg"})
    assert echo.calls == []
    assert result.error["type"] == "PolicyError" and result.error["code"] == "hook_denied"
    assert result.error["plugin"] == MODULE and "writes to production are blocked" in result.error["message"]
    (_name, event, data), = hook_module.SEEN
    assert event == "tool:pre" and data["tool_name"] == "echo" and data["tool_input"] == {"path": "prod.cfg"}
    assert data["tool_call_id"] == result.tool_call_id


async def test_a_modify_handler_rewrites_tool_input_and_is_revalidated(tmp_path: Path, echo: EchoTool) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": "modify"})) as host:
        result = await host.call("echo", {"path": "a.txt"})
    assert result.success and echo.calls == [{"path": "rewritten-a.txt"}]
    assert any(d["plugin"] == MODULE and d["action"] == "modify" for d in result.metadata["trail"])


async def test_a_modify_that_breaks_the_schema_is_a_contract_error_naming_the_module(tmp_path: Path) -> None:
    class Numbered(EchoTool):
        input_schema = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 5}},
                        "required": ["path"]}

    tool = Numbered()
    async with host_with(tmp_path, tool, (MODULE, {"action": "modify"})) as host:
        result = await host.call("echo", {"path": "a"})
    assert tool.calls == []
    assert result.error["type"] == "ContractError" and result.error["plugin"] == MODULE


@pytest.mark.parametrize("action", ["raise", "garbage"])
async def test_a_raising_or_unparseable_handler_fails_the_call_closed(
    tmp_path: Path, echo: EchoTool, action: str
) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": action})) as host:
        result = await host.call("echo", {"path": "a"})
    assert echo.calls == []
    assert result.error["type"] == "SystemError" and result.error["code"] == "hook_failed"
    assert result.error["plugin"] == MODULE


async def test_on_error_ignore_lets_a_raising_observer_module_fail_open(tmp_path: Path, echo: EchoTool) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": "raise"}),
                         plugin_config={MODULE: {"on_error": "ignore"}}) as host:
        result = await host.call("echo", {"path": "a"})
    assert result.success


class Approver:
    name = "approver"

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.prompts: list[str] = []

    @hookimpl
    def tool_approval(self, call: Any, prompt: str, options: list[str], default: str) -> bool | None:
        self.prompts.append(prompt)
        return self.answer


async def test_hook_tool_approval_ask_user_without_an_approval_plugin_is_denied(
    tmp_path: Path, echo: EchoTool
) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": "ask_user"})) as host:
        result = await host.call("echo", {"path": "a"})
    assert echo.calls == []
    assert result.error["code"] == "approval_unavailable" and result.error["plugin"] == MODULE


@pytest.mark.parametrize(("answer", "runs"), [(True, True), (False, False), (None, False)])
async def test_hook_tool_approval_decides_ask_user(tmp_path: Path, echo: EchoTool, answer: Any, runs: bool) -> None:
    approver = Approver(answer)
    async with host_with(tmp_path, echo, (MODULE, {"action": "ask_user"}), plugins=(approver,)) as host:
        result = await host.call("echo", {"path": "a"})
    assert approver.prompts == ["Allow this write?"]
    assert result.success is runs and bool(echo.calls) is runs
    if not runs:
        assert result.error["code"] == "approval_denied"


async def test_inject_context_is_recorded_in_the_trail(tmp_path: Path, echo: EchoTool) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": "inject_context"})) as host:
        result = await host.call("echo", {"path": "a"})
    assert result.success
    (injected,) = [d for d in result.metadata["trail"] if d["action"] == "inject_context"]
    assert injected["plugin"] == MODULE and injected["reason"] == "lint: 3 warnings"
    assert injected["details"]["role"] == "system"


async def test_handlers_run_lower_priority_first_across_modules(tmp_path: Path, echo: EchoTool) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"priority": 10, "name": "late"}),
                         (MODULE_B, {"priority": -5, "name": "early"})) as host:
        assert (await host.call("echo", {"path": "a"})).success
        assert host.events.list_handlers("tool:pre") == {"tool:pre": ["early", "late"]}
    assert [name for name, _, _ in hook_module.SEEN] == ["early", "late"]


@pytest.mark.parametrize(("action", "success", "output"), [("modify", True, "[rewritten by hook]"),
                                                           ("deny", False, None)])
async def test_tool_post_handlers_replace_or_withhold_the_output(
    tmp_path: Path, echo: EchoTool, action: str, success: bool, output: Any
) -> None:
    async with host_with(tmp_path, echo, (MODULE, {"action": action, "event": "tool:post"})) as host:
        result = await host.call("echo", {"path": "secret"})
    assert result.success is success and result.output == output
    (_, event, data), = hook_module.SEEN
    assert event == "tool:post" and data["tool_result"]["output"] == "secret"


async def test_unregistering_at_close_and_emit_returns_a_result(tmp_path: Path, echo: EchoTool) -> None:
    host = host_with(tmp_path, echo, (MODULE, {"action": "deny", "event": "custom:gate"}))
    async with host:
        outcome = await host.events.emit("custom:gate", {"x": 1})
        assert outcome.action == "deny" and outcome.reason == "writes to production are blocked"
        assert (await host.call("echo", {"path": "a"})).success  # not a tool event: calls unaffected
    assert host.events.list_handlers("custom:gate") == {"custom:gate": []}


async def test_amplifier_core_hookresult_objects_are_understood(tmp_path: Path, echo: EchoTool) -> None:
    pytest.importorskip("amplifier_core.models")
    async with host_with(tmp_path, echo, (MODULE, {"action": "deny", "result_type": "hookresult"})) as host:
        result = await host.call("echo", {"path": "a"})
    assert result.error["code"] == "hook_denied"


# -- seed edge cases ------------------------------------------------------------------------


async def test_seed_tool_module_edge_cases_behave_as_the_seed_describes(tmp_path: Path) -> None:
    from amplifier_fixtures import tool_module

    tool_module.INPUTS.clear()
    config = {"modules": [{"module": "amplifier_fixtures.tool_module"}]}
    async with ToolHost(config=config, builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        # mount returned the tool: it is mounted
        assert [s.name for s in host.specs] == ["run"]
        # get_schema() is used despite the inherited empty input_schema: input is validated
        invalid = await host.call("run", {"command": 3})
        assert invalid.error["type"] == "ContractError" and invalid.error["pointer"] == "/command"
        ok = await host.call("run", {"command": "true"}, call_id="call-7")
        failed = await host.call("run", {"command": "false"})
        picture = await host.call("run", {"command": "picture"})
    assert ok.success
    # Amplifier's orchestrators pass _tool_call_id; the tool sees it, validation never did
    assert tool_module.INPUTS[0] == {"command": "true", "_tool_call_id": "call-7"}
    # a failure with output and no error keeps its output and says what it was
    assert not failed.success and failed.output["returncode"] == 2
    assert "boom: no such file" in failed.error["message"]
    # content blocks are kept (in metadata["content"]: ToolResult's fields are fixed)
    assert picture.success and [b["type"] for b in picture.metadata["content"]] == ["text", "image"]
    assert picture.metadata["content"][1]["source"]["media_type"] == "image/png"


async def test_a_module_needing_amplifier_core_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from amplifier_tools import PluginLoadError

    for name in ("amplifier_core", "amplifier_core.models"):  # as if it were not installed
        monkeypatch.setitem(sys.modules, name, None)
    config = {"modules": [{"module": "amplifier_fixtures.needs_core"}]}
    with pytest.raises(PluginLoadError, match="pip install amplifier-core"):
        async with ToolHost(config=config, builtins=False, entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass


async def test_handlers_registered_with_on_and_reading_older_keys_work(tmp_path: Path, echo: EchoTool) -> None:
    """amplifier-core's registry also has ``on``; its orchestrators put ``result`` beside
    ``tool_result`` and ``session_id`` in every event (hooks-logging files records by it)."""
    seen: list[dict[str, Any]] = []

    class OnUser:
        name = "on-user"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            coordinator.hooks.on("tool:post", lambda event, data: seen.append(data) or None, name="logger")

    async with host_with(tmp_path, echo, plugins=(OnUser(),)) as host:
        assert (await host.call("echo", {"path": "a"})).success
    (data,) = seen
    assert data["result"]["output"] == "a" and data["session_id"] == host.session_id


@pytest.mark.parametrize(("action", "output", "code"), [
    ("continue", {"stdout": "", "stderr": "boom: no such file", "returncode": 2}, "returned_failure"),
    ("deny", None, "hook_denied"),
])
async def test_tool_post_handlers_also_see_a_failure_the_tool_reported(
    tmp_path: Path, action: str, output: Any, code: str
) -> None:
    """Amplifier's orchestrators emit tool:post for a result with success=False (bash's non-zero
    exit): its handlers must see it, with the output, and may withhold it."""
    config = {"modules": [{"module": "amplifier_fixtures.tool_module"},
                          {"module": MODULE, "config": {"action": action, "event": "tool:post"}}]}
    async with ToolHost(config=config, builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        failed = await host.call("run", {"command": "false"})
        raised = await host.call("run", {"command": 3})  # the host's own refusal: not a tool:post event
    assert not failed.success and failed.output == output
    if code == "hook_denied":
        assert failed.error["code"] == "hook_denied"
    (_, event, data), = hook_module.SEEN
    assert event == "tool:post" and data["tool_result"]["success"] is False
    assert data["tool_result"]["output"]["stderr"] == "boom: no such file"
    assert "boom: no such file" in data["tool_result"]["error"]["message"]
    assert not raised.success


async def test_a_handler_for_a_misspelled_tool_event_is_reported(
        tmp_path: Path, echo: EchoTool, caplog: pytest.LogCaptureFixture) -> None:
    """Amplifier accepts any event name, so ``tool_pre`` registered silently and never ran (new-user trial)."""

    class Misspelled:
        name = "misspelled"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            coordinator.hooks.register("tool_pre", lambda event, data: {"action": "deny"}, name="gate")
            coordinator.hooks.register("session:start", lambda event, data: None, name="fine")

    caplog.set_level("WARNING", logger="amplifier_tools")
    async with ToolHost(plugins=[ToolsPlugin(echo), Misspelled()], builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False):
        pass
    warnings = [r.getMessage() for r in caplog.records if "no tool call emits" in r.getMessage()]
    assert len(warnings) == 1 and "'gate'" in warnings[0] and "did you mean 'tool:pre'?" in warnings[0]


async def test_a_handler_changing_tool_input_in_place_changes_nothing(tmp_path: Path) -> None:
    """Only ``modify`` rewrites a call (re-validated, attributed); a nested in-place change reached the
    tool unvalidated before."""
    seen: list[Any] = []

    class Nested:
        name = "nested"
        description = "nested"
        input_schema = {"type": "object", "properties": {"opts": {"type": "object"}}}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            seen.append(input)
            return ToolResult(output="ok")

    class Meddler:
        name = "meddler"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            def meddle(event: str, data: dict[str, Any]) -> None:
                data["tool_input"]["opts"]["evil"] = True
                data["tool_input"]["added"] = 1
            coordinator.hooks.register("tool:pre", meddle, name="meddle")

    async with ToolHost(plugins=[ToolsPlugin(Nested()), Meddler()], builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        assert (await host.call("nested", {"opts": {"safe": 1}})).success
    assert seen == [{"opts": {"safe": 1}}]


class PostHandlers:
    """Registers Amplifier handlers on one event from its mount, as a hook module does."""

    name = "post-handlers"

    def __init__(self, event: str, *handlers: tuple[str, int, Any]) -> None:
        self.event, self.handlers = event, handlers

    @hookimpl
    def mount(self, coordinator: Any) -> None:
        for name, priority, handler in self.handlers:
            coordinator.hooks.register(self.event, handler, priority=priority, name=name)


async def test_a_tool_post_deny_is_not_overturned_by_a_later_modify(tmp_path: Path, echo: EchoTool) -> None:
    """Found by a new-user trial: a guard's ``deny`` withheld the output, then a formatter's
    ``modify`` (a later handler) turned the call back into a success carrying the denial's text.
    In Amplifier a deny ends the event; here later handlers still observe, but nothing they return
    gives the output back."""
    seen: list[Any] = []

    def guard(event: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"action": "deny", "reason": "sensitive output withheld"}

    def formatter(event: str, data: dict[str, Any]) -> dict[str, Any]:
        seen.append(data["tool_result"])
        return {"action": "modify", "data": {**data, "tool_result": {"success": True, "output": "formatted"}}}

    async with host_with(tmp_path, echo, plugins=(PostHandlers("tool:post", ("guard", 0, guard),
                                                              ("formatter", 10, formatter)),)) as host:
        result = await host.call("echo", {"path": "secret"})
    assert not result.success and result.output is None and result.error["code"] == "hook_denied"
    assert "sensitive output withheld" in result.error["message"]
    actions = [(d["hook"], d["action"]) for d in result.metadata["trail"]]
    assert actions == [("tool_post", "deny"), ("tool_post", "replace_ignored")]
    assert seen and seen[0]["success"] is False  # the later handler saw the denial


async def test_a_deny_of_a_reported_failure_is_recorded_as_a_deny_not_a_recovery(tmp_path: Path) -> None:
    """Found by a new-user trial: a tool:post deny of bash's non-zero exit was recorded in the
    trail and the audit record as ``tool_error``/``recover``."""
    config = {"modules": [{"module": "amplifier_fixtures.tool_module"},
                          {"module": MODULE, "config": {"action": "deny", "event": "tool:post"}}]}
    async with ToolHost(config=config, builtins=False, entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        failed = await host.call("run", {"command": "false"})
    assert failed.error["code"] == "hook_denied" and failed.output is None
    assert [(d["hook"], d["action"]) for d in failed.metadata["trail"]] == [("tool_error", "deny")]


async def test_what_a_tool_error_handler_cannot_do_is_recorded_not_dropped(tmp_path: Path) -> None:
    """Amplifier's tool:error handlers' ``deny`` and ``modify`` have no effect on a failure; they
    were dropped without a word (new-user trial: hooks-redaction returns modify on every error)."""
    config = {"modules": [{"module": "amplifier_fixtures.tool_module"}]}
    handlers = PostHandlers("tool:error", ("redactor", 0, lambda event, data: {"action": "modify", "data": data}))
    async with ToolHost(config=config, plugins=[handlers], builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        raised = await host.call("run", {"command": 3})
    assert not raised.success and raised.error["code"] == "invalid_input"
    noted = [d for d in raised.metadata["trail"] if d["hook"] == "tool_error"]
    assert [(d["plugin"], d["action"]) for d in noted] == [("post-handlers", "modify_ignored")]


async def test_the_trace_shows_amplifier_handlers_and_what_they_came_to(
        tmp_path: Path, echo: EchoTool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by a new-user trial: ``AMPLIFIER_TOOLS_TRACE=1`` showed no line for the Amplifier
    handler that denied the call, and async hooks only as "returned coroutine"."""
    monkeypatch.setenv("AMPLIFIER_TOOLS_TRACE", "1")
    async with host_with(tmp_path, echo, (MODULE, {"action": "deny"})) as host:
        result = await host.call("echo", {"path": "prod.cfg"})
    assert result.error["code"] == "hook_denied"
    err = capsys.readouterr().err
    assert f"calling tool_pre of plugin {MODULE!r} (Amplifier handler)" in err
    assert f"tool_pre of plugin {MODULE!r} (awaited) returned Deny" in err


class SlowApprover(Approver):
    @hookimpl
    async def tool_approval(self, call: Any, prompt: str, options: list[str], default: str) -> bool | None:
        self.prompts.append(prompt)
        await asyncio.sleep(5)
        return False


@pytest.mark.parametrize("approver", [Approver(True), SlowApprover(False)], ids=["approving", "slow"])
async def test_a_fail_open_module_cannot_ask_for_approval(tmp_path: Path, echo: EchoTool, approver: Approver) -> None:
    """Found by attack: the approval is awaited inside the asking module's hook timeout, and a
    module configured ``on_error = "ignore"`` let the call go on unapproved when the approval was
    still pending then. Such a module's ``ask_user`` is denied, naming the setting."""
    async with host_with(tmp_path, echo, (MODULE, {"action": "ask_user"}), plugins=(approver,),
                         plugin_config={MODULE: {"on_error": "ignore", "hook_timeout_ms": 200}}) as host:
        result = await host.call("echo", {"path": "a"})
    assert echo.calls == [] and approver.prompts == []
    assert result.error is not None and result.error["code"] == "approval_unavailable"
    assert result.error["plugin"] == MODULE and "on_error = 'ignore'" in result.error["message"]
    assert f"[plugins.{MODULE}]" in result.error["hint"]


# -- events emitted while the host starts --------------------------------------------------------------------


class Emits:
    """Emits ``plugin:ready`` at mount, after waiting (``wait``) as a plugin starting a server does."""

    name = "emits"

    def __init__(self, wait: bool = True) -> None:
        self.wait = wait

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        if self.wait:
            await asyncio.sleep(0.01)
        await coordinator.hooks.emit("plugin:ready", {"who": "emits"})


class Listens:
    """Registers a ``plugin:ready`` handler at mount; ``seen`` is what it got."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail = name, fail
        self.seen: list[dict[str, Any]] = []

    @hookimpl
    def mount(self, coordinator: Any) -> None:
        coordinator.hooks.register("plugin:ready", lambda event, data: self.seen.append(data))

    @hookimpl
    def tool_pre(self) -> None:
        return None


async def test_an_event_emitted_at_start_reaches_handlers_registered_after_it_once(tmp_path: Path,
                                                                                   echo: EchoTool) -> None:
    """Found by attack: an event emitted while the host started (``audit:tamper`` at start) reached
    only the handlers of plugins mounted before it; a handler mounted later never saw it."""
    before, after = Listens("before"), Listens("after")
    async with ToolHost(plugins=[ToolsPlugin(echo), before, Emits(), after], builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        assert before.seen == [{"who": "emits"}] and after.seen == [{"who": "emits"}]  # each once
        await host.events.emit("plugin:ready", {"who": "later"})  # after start: delivered as ever
        assert before.seen[-1] == after.seen[-1] == {"who": "later"} and len(after.seen) == 2


async def test_events_emitted_by_a_start_that_fails_are_not_replayed(tmp_path: Path, echo: EchoTool) -> None:
    class Fails:
        name = "fails"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            raise RuntimeError("cannot start")

    late = Listens("late")
    host = ToolHost(plugins=[ToolsPlugin(echo), Emits(), late, Fails()], builtins=False, entry_points=False,
                    working_dir=tmp_path, discover=False)
    with pytest.raises(PluginLoadError, match="cannot start"):
        await host.start()
    assert late.seen == []  # a host that did not start delivers nothing more


@pytest.mark.parametrize("core", [True, False], ids=["amplifier-core", "no-amplifier-core"])
async def test_emit_hands_back_ask_user_and_inject_context_as_amplifier_core_does(
        tmp_path: Path, echo: EchoTool, core: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: ``emit`` turned a handler's ``ask_user`` (and ``inject_context``) into
    ``continue``, so a module asking ``emit`` whether to go on went on unasked; amplifier-core's
    ``emit`` hands back the first ``ask_user`` answer whole (a later ``deny`` still wins) and the
    injected texts. An answer with values its ``HookResult`` refuses is denied, as amplifier-core
    denies it; a ``modify`` chain answers ``continue`` with the data."""
    if core:
        pytest.importorskip("amplifier_core.models")
    else:
        import sys
        monkeypatch.setitem(sys.modules, "amplifier_core.models", None)  # the import fails
    answers: list[Any] = []

    def answer(event: str, data: dict[str, Any]) -> Any:
        return answers.pop(0)

    async with host_with(tmp_path, echo) as host:
        for _ in range(3):
            host.events.register("custom:gate", answer, owner="m")
        answers[:] = [{"action": "inject_context", "context_injection": "c1"},
                      {"action": "ask_user", "approval_prompt": "really?", "approval_options": ["yes"],
                       "approval_timeout": 5, "user_message": "asking"},
                      {"action": "ask_user", "approval_prompt": "second"}]
        asked = await host.events.emit("custom:gate", {"x": 1})
        assert (asked.action, asked.approval_prompt, asked.approval_options, asked.approval_timeout,
                asked.user_message) == ("ask_user", "really?", ["yes"], 5, "asking")
        answers[:] = [{"action": "ask_user", "approval_prompt": "p", "approval_default": "maybe"},
                      {"action": "continue"}, {"action": "continue"}]
        assert (await host.events.emit("custom:gate", {"x": 1})).action == "deny"
        answers[:] = [{"action": "inject_context", "context_injection": "c1", "context_injection_role": "user"},
                      {"action": "modify", "data": {"x": 2}},
                      {"action": "inject_context", "context_injection": "c2", "ephemeral": True}]
        injected = await host.events.emit("custom:gate", {"x": 1})
        assert (injected.action, injected.context_injection, injected.context_injection_role, injected.ephemeral,
                injected.data) == ("inject_context", "c1\n\nc2", "user", True, None)
        assert [item.content for item in injected.context_injections] == ["c1", "c2"]
        answers[:] = [{"action": "modify", "data": {"x": 2}}, {"action": "continue"}, None]
        modified = await host.events.emit("custom:gate", {"x": 1})
        assert (modified.action, modified.data) == ("continue", {"x": 2})


@pytest.mark.parametrize("answers", [
    [{"action": "inject_context", "context_injection": "c1", "context_injection_role": "user"},
     {"action": "modify", "data": {"x": 2}}, {"action": "inject_context", "context_injection": "c2"}],
    [{"action": "inject_context", "context_injection": "c1"}, {"action": "ask_user", "approval_prompt": "really?"},
     {"action": "ask_user", "approval_prompt": "second"}],
    [{"action": "ask_user", "approval_prompt": "p", "reason": "why"}, {"action": "deny", "reason": "no"}],
], ids=["inject", "ask", "deny"])
async def test_emit_answers_what_amplifier_cores_own_registry_answers(
        tmp_path: Path, echo: EchoTool, answers: list[dict[str, Any]]) -> None:
    """The same handlers' answers through amplifier-core's ``HookRegistry.emit`` and the host's:
    the same action, texts (joined as core joins them), role, prompt, reason and data."""
    core_hooks = pytest.importorskip("amplifier_core.hooks")
    from amplifier_core.models import HookResult

    registry = core_hooks.HookRegistry()
    for index, fields in enumerate(answers):
        async def core_handler(event: str, data: dict[str, Any], fields: dict[str, Any] = fields) -> Any:
            return HookResult(**fields)
        registry.register("custom:gate", core_handler, name=f"h{index}")
    expected = await registry.emit("custom:gate", {"x": 1})

    pending = list(answers)
    async with host_with(tmp_path, echo) as host:
        for _ in answers:
            host.events.register("custom:gate", lambda event, data: pending.pop(0), owner="m")
        got = await host.events.emit("custom:gate", {"x": 1})

    def seen(result: Any) -> tuple[Any, ...]:
        return (result.action, result.context_injection, result.context_injection_role, result.approval_prompt,
                result.reason, result.data)

    assert seen(got) == seen(expected)


async def test_tool_pre_answers_are_read_as_amplifier_core_reads_them(tmp_path: Path, echo: EchoTool) -> None:
    """Found by the differential test below: an answer with a value ``HookResult`` cannot hold
    (a role ``"bogus"``) was reshaped and the call went on, where amplifier-core's registry denies
    it: the call now fails closed naming the handler. ``context_injections``, when given, are what
    is injected (amplifier-core ignores ``context_injection`` then); the text was that scalar."""
    answers = [{"action": "inject_context", "context_injection": "scalar",
                "context_injections": [{"content": "first", "role": "user"}, {"content": "second", "ephemeral": True}]},
               {"action": "inject_context", "context_injection": "c", "context_injection_role": "bogus"}]
    async with host_with(tmp_path, echo) as host:
        host.events.register("tool:pre", lambda event, data: answers[0], name="listed", owner="m")
        result = await host.call("echo", {"path": "a"})
        assert result.success
        injected, = [entry for entry in result.metadata["trail"] if entry["action"] == "inject_context"]
        assert (injected["reason"], injected["details"]["role"], injected["details"]["ephemeral"]) == \
            ("first\n\nsecond", "user", True)
        host.events.unregister("tool:pre")
        host.events.register("tool:pre", lambda event, data: answers[1], name="gate", owner="m")
        result = await host.call("echo", {"path": "a"})
    assert not result.success and result.error["code"] == "hook_failed"
    assert "'gate'" in result.error["message"] and "context_injection_role" in result.error["message"]


def _comparable(result: Any) -> dict[str, Any]:
    """A ``HookResult``'s fields, without the ``timestamp`` amplifier-core stamps on the data."""
    fields = result.model_dump()
    if isinstance(fields["data"], dict):
        fields["data"].pop("timestamp", None)
    return dict(fields)


_WORDS = st.sampled_from(["", "a", "b"])
_ROLES = st.sampled_from(["system", "user", "assistant"])
_DATA = st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 2), max_size=2)
_ITEMS = st.fixed_dictionaries({"content": _WORDS}, optional={
    "role": _ROLES, "ephemeral": st.booleans(), "append_to_last_tool_result": st.booleans(),
    "hook_name": st.just("mine"), "event": st.just("other")})
_FIELDS = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from(["continue", "deny", "modify", "inject_context", "ask_user"]),
    "data": st.none() | _DATA, "reason": st.none() | _WORDS, "context_injection": st.none() | _WORDS,
    "context_injection_role": _ROLES, "ephemeral": st.booleans(), "approval_prompt": st.none() | _WORDS,
    "approval_options": st.none() | st.lists(_WORDS, max_size=2), "approval_timeout": st.sampled_from([1.5, 300.0]),
    "approval_default": st.sampled_from(["allow", "deny"]), "suppress_output": st.booleans(),
    "user_message": st.none() | _WORDS, "user_message_level": st.sampled_from(["info", "warning", "error"]),
    "user_message_source": st.none() | _WORDS, "append_to_last_tool_result": st.booleans(),
    "context_injections": st.lists(_ITEMS, max_size=2)})
#: Answers amplifier-core's registry cannot read: it denies them.
_UNREADABLE = st.sampled_from([
    5, "deny", {"action": "nope"}, {"action": None}, {"action": "modify", "data": [1]}, {"action": "deny", "reason": 5},
    {"action": "inject_context", "context_injection": "c", "context_injection_role": "bogus"},
    {"action": "ask_user", "approval_default": "maybe"}, {"action": "ask_user", "approval_options": ["a", 3]},
    {"action": "inject_context", "context_injections": [{"role": "user"}]}, {"action": "continue", "ephemeral": 1},
    {"action": "inject_context", "context_injections": ["text"]}, {"action": "continue", "user_message_level": "x"}])
_ANSWERS = st.one_of(st.tuples(st.just("hookresult"), _FIELDS), st.tuples(st.just("dict"), _FIELDS),
                     st.tuples(st.just("answer"), _UNREADABLE),
                     st.tuples(st.sampled_from(["none", "raises", "changes in place"]), st.none()))
_CHAINS = st.lists(st.tuples(_ANSWERS, st.integers(-1, 1)), max_size=4)


def test_emit_answers_what_amplifier_cores_registry_answers_for_any_chain(tmp_path: Path, echo: EchoTool) -> None:
    """Differential: chains of handlers (HookResults, dicts, unreadable answers, None, raising,
    changing the data in place; priorities) through amplifier-core's own ``HookRegistry.emit``
    and the host's: the same answer, field for field, and each handler called in the same order
    with the same data. Found by it: a ``modify`` chain answered ``modify`` (amplifier-core:
    ``continue`` with the data), ``continue`` came without the data, a deny or ``ask_user`` lost
    the answer's other fields (``user_message``, ``approval_timeout``, ...), ``context_injections``
    were neither read first nor handed back, answers amplifier-core refuses were reshaped and
    let through, and a handler changing the data in place changed what the next one got.
    Limits: the reason of the deny for an unreadable answer is ours (it names the handler)."""
    core_hooks = pytest.importorskip("amplifier_core.hooks")
    from amplifier_core.models import HookResult

    loop = asyncio.new_event_loop()
    host = host_with(tmp_path, echo)
    loop.run_until_complete(host.start())

    def handlers(chain: list[tuple[tuple[str, Any], int]], answers: list[Any], seen: list[Any]) -> list[Any]:
        made = []
        for index, ((kind, _), _priority) in enumerate(chain):
            def handler(event: str, data: dict[str, Any], index: int = index, kind: str = kind) -> Any:
                seen.append((index, {key: value for key, value in data.items() if key != "timestamp"}))
                if kind == "raises":
                    raise RuntimeError("handler failed")
                if kind == "changes in place":
                    data["changed"] = True
                return answers[index]
            made.append(handler)
        return made

    async def compare(chain: list[tuple[tuple[str, Any], int]]) -> None:
        answers = [HookResult(**value) if kind == "hookresult" else value if kind in ("dict", "answer") else None
                   for (kind, value), _ in chain]
        core_seen: list[Any] = []
        registry = core_hooks.HookRegistry()
        for index, (handler, (_, priority)) in enumerate(zip(handlers(chain, answers, core_seen), chain, strict=True)):
            registry.register("custom:gate", handler, priority=priority, name=f"h{index}")
        expected = _comparable(await registry.emit("custom:gate", {"x": 1}))
        seen: list[Any] = []
        host.events.unregister("custom:gate")
        for index, (handler, (_, priority)) in enumerate(zip(handlers(chain, answers, seen), chain, strict=True)):
            host.events.register("custom:gate", handler, priority, f"h{index}", owner="m")
        got = _comparable(await host.events.emit("custom:gate", {"x": 1}))
        assert seen == core_seen
        if expected["reason"] == "Hook handler returned invalid response":
            assert got["action"] == "deny" and f"h{seen[-1][0]}" in got["reason"]
            got["reason"] = expected["reason"]
        assert got == expected

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(chain=_CHAINS)
    def check(chain: list[tuple[tuple[str, Any], int]]) -> None:
        loop.run_until_complete(compare(chain))

    try:
        check()
    finally:
        loop.run_until_complete(host.close())
        loop.close()
