"""Regressions found by a plugin author following only the docs (docs/plugins.md, docs/cli.md)."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ConfigError, ToolHost, ToolSystemError, hookimpl
from amplifier_tools.conformance import check_target_async
from amplifier_tools.pytest_plugin import MockTool

SECRET = "s3cr3t-token-value"


def _state(tmp_path: Path) -> str:
    return str(tmp_path.parent / (tmp_path.name + "-state"))


def _host(tmp_path: Path, *plugins: Any, config: dict[str, Any] | None = None) -> ToolHost:
    config = {"state_dir": _state(tmp_path), **(config or {})}
    return ToolHost(config=config, plugins=list(plugins), builtins=False, entry_points=False,
                    working_dir=str(tmp_path), discover=False)


class RaisingHook:
    name = "raising"

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> None:
        coordinator.get_capability("session.secrets").add(SECRET)

    @hookimpl
    def tool_pre(self, call: Any, spec: Any, context: Any) -> None:
        raise RuntimeError(f"kaboom in hook {SECRET}")


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "amplifier_tools" and r.exc_info]


async def test_raising_hook_traceback_is_logged_at_info_without_secrets(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """docs/cli.md: `-v/--verbose` (the INFO level) shows tracebacks; a hook that raised showed
    its message only, so its author could not tell where it raised."""
    caplog.set_level(logging.INFO, logger="amplifier_tools")
    async with _host(tmp_path, RaisingHook(), MockTool(name="local::x.echo", return_value="ok")) as host:
        result = await host.call("x_echo", {})
    assert result.error is not None and result.error["code"] == "hook_failed"
    records = _tracebacks(caplog)
    assert records, "no traceback logged for the hook that raised"
    assert all(r.levelno == logging.INFO for r in records)  # not shown without --verbose
    assert records[0].exc_info is not None
    text = "".join(traceback.format_exception(*records[0].exc_info))
    assert "tool_pre" in text and "kaboom in hook" in text
    assert SECRET not in text and SECRET not in caplog.text


async def test_raising_tool_traceback_is_logged_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amplifier_tools")
    tool = MockTool(name="local::x.boom", side_effect=ValueError("tool blew up"))
    async with _host(tmp_path, tool) as host:
        result = await host.call("x_boom", {})
    assert result.error is not None and result.error["code"] == "tool_raised"
    records = _tracebacks(caplog)
    assert records and all(r.levelno == logging.INFO for r in records)
    assert records[0].exc_info is not None
    assert "tool blew up" in "".join(traceback.format_exception(*records[0].exc_info))


async def test_no_traceback_at_the_default_level(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="amplifier_tools")
    async with _host(tmp_path, RaisingHook(), MockTool(name="local::x.echo", return_value="ok")) as host:
        await host.call("x_echo", {})
    assert not _tracebacks(caplog)


class ShoutPlugin:
    """A plugin passed in code without a ``name``: named after its class."""

    @hookimpl
    def tool_pre(self, call: Any, spec: Any, context: Any) -> None:
        return None


async def test_section_for_a_code_plugin_says_how_it_is_named(tmp_path: Path) -> None:
    """Passed in code (the tool_host fixture), a plugin is named by its ``name`` attribute, else
    its module's or class's name, not by the entry point it ships under: `[plugins.shout]` was
    refused with no hint at why."""
    with pytest.raises(ConfigError) as info:
        async with _host(tmp_path, ShoutPlugin(), config={"plugins": {"shout": {}}}):
            pass
    assert info.value.key == "plugins.shout"
    assert info.value.hint is not None and "name" in info.value.hint and "ShoutPlugin" in info.value.hint


class NeedsSettings:
    name = "needs"

    @hookimpl
    def mount(self, coordinator: Any, config: Any) -> None:
        if "colour" in config:
            raise ConfigError("unknown setting 'colour'", key="plugins.needs.colour", hint="did you mean 'color'?")


async def test_validate_keeps_the_plugins_own_hint() -> None:
    """hooks.md: a ``hint=`` on the typed error raised in ``mount`` becomes the error's hint; the
    `validate` report dropped it."""
    report = await check_target_async(NeedsSettings(), config={"plugins": {"needs": {"colour": "red"}}})
    failed = [c for c in report.checks if not c.passed]
    assert failed and "did you mean 'color'?" in failed[0].message, report.render()


async def test_default_state_dir_inside_the_working_dir_names_xdg_state_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not configured, state_dir comes from $XDG_STATE_HOME: the refusal said only 'state_dir'."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(ConfigError) as info:
        async with ToolHost(config={}, builtins=False, entry_points=False, working_dir=str(tmp_path),
                            discover=False):
            pass
    assert info.value.key == "state_dir"
    assert info.value.hint is not None and "XDG_STATE_HOME" in info.value.hint


class RaisingObserver:
    name = "observer"

    @hookimpl
    def tool_error(self, call: Any, spec: Any, error: Any, context: Any) -> None:
        raise RuntimeError("kaboom in tool_error")


async def test_raising_tool_error_observer_traceback_is_logged_at_info(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="amplifier_tools")
    async with _host(tmp_path, RaisingObserver(), MockTool(name="local::x.boom", side_effect=ToolSystemError("x"))) \
            as host:
        await host.call("x_boom", {})
    texts = ["".join(traceback.format_exception(*r.exc_info)) for r in _tracebacks(caplog) if r.exc_info]
    assert any("kaboom in tool_error" in text for text in texts)
