"""Attacks on the tool-author surface: ``amplifier-tools validate``, ``assert_conforms`` and the
pytest plugin's ``MockTool``, with hostile targets (one that exits, one whose ``mount`` never returns)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli

from amplifier_tools import PluginLoadError, ToolHost, hookimpl
from amplifier_tools.conformance import check_target_async
from amplifier_tools.pytest_plugin import MockTool

#: Why the mount-bound tests skip on 3.10.
UNBOUNDED_BEFORE_311 = "before 3.11 a mount is not bounded (wait_for would run it in a task of its own)"


def _module(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")


def test_validate_reports_a_module_that_exits_at_import_as_a_failed_check(tmp_path: Path) -> None:
    # It ended ``validate`` with the module's own status (3: a "contract error"), no report and no JSON.
    _module(tmp_path, "exits_at_import", "raise SystemExit(3)\n")
    run = cli(tmp_path, "validate", "exits_at_import", "--json")
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is False and report["target"] == "exits_at_import"
    assert report["checks"] == [{"name": "importable", "passed": False,
                                 "message": "SystemExit: it called sys.exit(3)", "warning": False}]


def test_validate_reports_a_mount_that_exits_as_a_failed_check(tmp_path: Path) -> None:
    _module(tmp_path, "exits_in_mount", """
        import sys

        async def mount(coordinator, config):
            sys.exit(4)
    """)
    run = cli(tmp_path, "validate", "exits_in_mount")
    assert run.returncode == 1, run.stderr
    assert "FAIL  mounts on a fresh host: plugin 'exits_in_mount': failed to mount: SystemExit: it called " \
           "sys.exit(4)" in run.stdout
    assert run.stdout.rstrip().endswith("FAILED") and "Traceback" not in run.stderr


class _ExitsInInit:
    name = "exits-in-init"

    def __init__(self) -> None:
        raise SystemExit(6)

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        return None


class _NeedsArguments:
    name = "needs-arguments"

    def __init__(self, setting: str) -> None:
        self.setting = setting

    @hookimpl
    def tool_pre(self, call: Any) -> None:
        return None


@pytest.mark.parametrize(("cls", "message"), [
    (_ExitsInInit, "instantiating _ExitsInInit: SystemExit: it called sys.exit(6)"),
    (_NeedsArguments, "instantiating _NeedsArguments: TypeError: "),
])
async def test_a_plugin_class_that_cannot_be_instantiated_is_a_failed_check(cls: type, message: str) -> None:
    # ``assert_conforms(MyPlugin)`` raised the class's TypeError (or exited) instead of reporting it.
    report = await check_target_async(cls)
    assert not report.ok
    assert [(c.name, c.passed) for c in report.checks] == [("importable", False)]
    assert report.checks[0].message.startswith(message)


@pytest.mark.skipif(sys.version_info < (3, 11), reason=UNBOUNDED_BEFORE_311)
def test_validate_bounds_a_mount_that_never_returns(tmp_path: Path) -> None:
    # The host's start awaited a plugin's ``mount`` for ever: ``validate`` hung with it.
    _module(tmp_path, "hangs_in_mount", """
        import asyncio

        async def mount(coordinator, config):
            await asyncio.Event().wait()
    """)
    (tmp_path / "amplifier-tools.toml").write_text("[plugins.hangs_in_mount]\nhook_timeout_ms = 300\n")
    started = time.monotonic()
    run = cli(tmp_path, "validate", "hangs_in_mount", "--json")
    assert time.monotonic() - started < 60
    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    mount = next(c for c in report["checks"] if c["name"] == "mounts on a fresh host")
    assert not mount["passed"]
    assert "plugin 'hangs_in_mount': failed to mount: mount did not finish within 0.3 s (hook_timeout_ms)" \
        in mount["message"]
    assert "[plugins.hangs_in_mount] hook_timeout_ms" in mount["message"]


class _HangsInMount:
    name = "hangs-in-mount"

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await asyncio.Event().wait()


@pytest.mark.skipif(sys.version_info < (3, 11), reason=UNBOUNDED_BEFORE_311)
async def test_a_host_start_bounds_a_mount_by_the_plugins_hook_timeout(tmp_path: Path) -> None:
    host = ToolHost(config={"state_dir": str(tmp_path / "state"),
                            "plugins": {"hangs-in-mount": {"hook_timeout_ms": 200}}}, plugins=[_HangsInMount()],
                    builtins=False, entry_points=False, working_dir=tmp_path, discover=False)
    started = time.monotonic()
    with pytest.raises(PluginLoadError) as raised:
        await asyncio.wait_for(host.start(), 30)  # (without the bound: for ever)
    assert time.monotonic() - started < 10
    assert raised.value.plugin == "hangs-in-mount"
    assert "mount did not finish within 0.2 s (hook_timeout_ms)" in str(raised.value)
    assert raised.value.hint is not None and "[plugins.hangs-in-mount] hook_timeout_ms" in raised.value.hint


class _SlowMount:
    """A mount that takes 50 ms (a probe, a connection)."""

    name = "slow-mount"

    @hookimpl
    async def mount(self, coordinator: Any, config: Any) -> None:
        await asyncio.sleep(0.05)


async def test_a_short_host_wide_hook_timeout_does_not_shorten_a_mount(tmp_path: Path) -> None:
    """A host-wide ``hook_timeout_ms`` set for call hooks (here 1 ms) would fail every start whose
    plugins probe or connect at mount (the bash plugin probes for bubblewrap): the mount's bound is
    never below the default 10 s unless the plugin's own setting says so."""
    (tmp_path / "work").mkdir()
    async with ToolHost(config={"state_dir": str(tmp_path / "state"), "hook_timeout_ms": 1}, plugins=[_SlowMount()],
                        builtins=False, entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        assert host.started


async def test_mock_tool_refuses_a_side_effect_it_cannot_raise() -> None:
    # A callable (as ``unittest.mock`` takes) became "raised TypeError: exceptions must derive from
    # BaseException" at call time: a test of the failure path passed for the wrong reason.
    async def respond(input: dict[str, Any]) -> str:
        return "x"

    with pytest.raises(TypeError, match=r"side_effect must be an exception \(instance or class\), got function"):
        MockTool(name="local::mock.call", side_effect=respond)  # type: ignore[arg-type]


async def test_mock_tool_raises_a_side_effect_given_as_a_class(tool_host: Any) -> None:
    mock = MockTool(name="local::mock.fails", side_effect=ValueError)
    async with tool_host(mock) as host:
        result = await host.call("mock_fails", {})
    assert result.error is not None and result.error["cause"] == "ValueError" and mock.call_count == 1
