"""Amplifier's own modules on our host (found by attack, amp38).

Run against Microsoft's real modules (tool-filesystem, tool-bash, hooks-approval, hooks-redaction)
and amplifier-core 2.0.2's own ``HookRegistry``; the tests here use small modules written the same
way, so that they need neither the network nor those packages.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from amplifier_fixtures import hook_module
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import ConfigError, ToolHost

MODULE = "amplifier_fixtures.hook_module"


@pytest.fixture(autouse=True)
def _clear_seen() -> None:
    hook_module.SEEN.clear()


def _host(tmp_path: Path, echo: EchoTool, modules: list[dict[str, Any]] | None = None,
          plugins: tuple[Any, ...] = ()) -> ToolHost:
    return ToolHost(config={"modules": modules or []}, plugins=[ToolsPlugin(echo), *plugins], builtins=False,
                    entry_points=False, working_dir=tmp_path, discover=False)


async def test_a_module_named_twice_in_the_mount_plan_is_not_silently_dropped(tmp_path: Path,
                                                                               echo: EchoTool) -> None:
    """Two mount-plan entries of one hook module with different configs (a deny rule, then an
    observer): the first entry was dropped without a word (``{entry["module"]: entry}``), so its deny
    handler never registered and the call ran. Amplifier mounts each entry; the host refuses the
    plan instead, naming the module."""
    modules = [{"module": MODULE, "config": {"action": "deny", "name": "guard"}},
               {"module": MODULE, "config": {"action": "continue", "name": "observer"}}]
    with pytest.raises(ConfigError, match="amplifier_fixtures.hook_module") as caught:
        async with _host(tmp_path, echo, modules) as host:
            await host.call("echo", {"path": "a"})
    assert "twice" in str(caught.value)
    assert echo.calls == []


async def test_the_same_entry_twice_still_mounts_once(tmp_path: Path, echo: EchoTool) -> None:
    """An entry repeated as it is (a plan merged from two bundles) changes nothing: it mounts once."""
    entry = {"module": MODULE, "config": {"action": "deny", "name": "guard"}}
    async with _host(tmp_path, echo, [entry, dict(entry)]) as host:
        result = await host.call("echo", {"path": "a"})
        assert host.events.list_handlers("tool:pre") == {"tool:pre": ["guard"]}
    assert result.error["code"] == "hook_denied" and echo.calls == []


async def test_inject_context_given_as_context_injections_keeps_its_text(tmp_path: Path, echo: EchoTool) -> None:
    """amplifier-core 2.x's lossless form, ``HookResult(context_injections=[ContextInjection(...)])``
    (its registry projects ``context_injection`` from it): the trail entry had no text at all."""
    models = pytest.importorskip("amplifier_core.models")

    class Lint:
        name = "lint"

        async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
            async def handler(event: str, data: dict[str, Any]) -> Any:
                return models.HookResult(action="inject_context", context_injections=[
                    models.ContextInjection(content="lint: 3 warnings"),
                    models.ContextInjection(content="line 4 too long")])
            coordinator.hooks.register("tool:post", handler, name="lint")

    async with _host(tmp_path, echo, plugins=(Lint(),)) as host:
        result = await host.call("echo", {"path": "a"})
    entry, = [e for e in result.metadata["trail"] if e["action"] == "inject_context"]
    assert entry["reason"] == "lint: 3 warnings\n\nline 4 too long"
    assert entry["details"]["role"] == "system"


async def test_a_dict_with_context_injections_keeps_its_text(tmp_path: Path, echo: EchoTool) -> None:
    """The same as a plain dict (amplifier-core need not be installed)."""
    class Lint:
        name = "lint"

        async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
            coordinator.hooks.register("tool:pre", lambda event, data: {
                "action": "inject_context",
                "context_injections": [{"content": "remember the style guide", "role": "user", "ephemeral": True}]},
                name="lint")

    async with _host(tmp_path, echo, plugins=(Lint(),)) as host:
        result = await host.call("echo", {"path": "a"})
    entry, = [e for e in result.metadata["trail"] if e["action"] == "inject_context"]
    assert entry["reason"] == "remember the style guide"
    assert entry["details"]["role"] == "user" and entry["details"]["ephemeral"] is True


async def test_unregister_by_name_as_amplifier_spells_it_removes_the_handler(tmp_path: Path,
                                                                              echo: EchoTool) -> None:
    """amplifier-core's ``HookRegistry.unregister(name)`` takes a handler's name; here the name was
    taken for an event, nothing was removed and 0 came back, so the handler kept running."""
    class Swapper:
        name = "swapper"

        async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
            hooks = coordinator.hooks
            hooks.register("tool:pre", lambda event, data: {"action": "deny", "reason": "old rule"}, name="rule")
            hooks.register("tool:post", lambda event, data: None, name="rule")
            hooks.unregister("rule")  # Amplifier's spelling

    async with _host(tmp_path, echo, plugins=(Swapper(),)) as host:
        assert host.events.list_handlers() == {"tool:post": [], "tool:pre": []}
        result = await host.call("echo", {"path": "a"})
    assert result.success, result.error


async def test_unregister_by_event_still_works(tmp_path: Path, echo: EchoTool) -> None:
    """Our own spellings are unchanged: ``unregister(event)`` and ``unregister(event, name)``."""
    async with _host(tmp_path, echo) as host:
        host.events.register("tool:pre", lambda e, d: None, name="a")
        host.events.register("tool:pre", lambda e, d: None, name="b")
        host.events.register("tool:post", lambda e, d: None, name="a")
        assert host.events.unregister("tool:pre", "a") == 1
        assert host.events.list_handlers() == {"tool:post": ["a"], "tool:pre": ["b"]}
        assert host.events.unregister("tool:pre") == 1
        assert host.events.list_handlers() == {"tool:post": ["a"], "tool:pre": []}


@pytest.mark.parametrize("answer", [{"action": "block"}, "deny", 42, {"action": None}])
async def test_emit_fails_closed_on_a_handler_answer_it_cannot_read(tmp_path: Path, echo: EchoTool, answer: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """amplifier-core's own ``emit`` denies when a handler's result cannot be parsed ("Hook handler
    returned invalid response"); ours skipped it and answered ``continue``, so a module asking
    ``emit`` whether to go on (a custom gate event) went on: fail open, where Amplifier fails closed.
    A handler that raises is still logged and skipped, as in Amplifier."""
    async with _host(tmp_path, echo) as host:
        host.events.register("custom:gate", lambda event, data: answer, name="gate")
        host.events.register("custom:gate", lambda event, data: 1 / 0, priority=-1, name="broken")
        with caplog.at_level(logging.ERROR, logger="amplifier_tools"):
            outcome = await host.events.emit("custom:gate", {"x": 1})
    assert outcome.action == "deny"
    assert "gate" in (outcome.reason or "")
