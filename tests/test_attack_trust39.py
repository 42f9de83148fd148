"""The trust boundary against names that read as one thing and are another (trust39).

- A policy rule's ``tools`` glob with a look-alike character (``local::fs.write_f\u0456le``, a Cyrillic
  ``i``), a trailing space, a case variant (``local::FS.write_file``) or a model-facing name
  (``fs_write_file``) matched no tool, and the host started: a deny rule that reads as denying
  writes — to whoever reviews a configuration before ``amplifier-tools trust`` — denied nothing,
  and every write ran. Now the start stops naming the rule; a glob matching nothing and close to
  nothing (a tool not mounted here) still starts.
- ``python -m amplifier_tools`` run in the working directory put that directory first on
  ``sys.path``: a module a tool wrote there (``pluggy.py``) ran in the host at the next start,
  before the trust check. The command line now says so on stderr.
- ``[tool."amplifier-tools"]`` with its first ``a`` Cyrillic (or a trailing or zero-width space) in
  ``pyproject.toml`` was no section of ours: the host found no configuration, the trust check said
  the file the operator could see was "gone", and ``amplifier-tools trust`` accepted the defaults,
  rules and all dropped. Now refused like ``[tool.amplifier_tools]``, naming the odd characters.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ConfigError, ToolHost, ToolResult, ToolSpec
from amplifier_tools.config import discover_config_file

ROOT = Path(__file__).resolve().parent.parent


class _Tool:
    spec = ToolSpec(name="local::fs.write_file", description="Writes.", effect="IdempotentWrite")
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, object]) -> ToolResult:
        return ToolResult(output="written")


def _host(tmp_path: Path, glob: str) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    rules = [{"action": "deny", "name": "no-writes", "tools": [glob]}]
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"rules": rules}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(_Tool())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


@pytest.mark.parametrize("glob", ["local::fs.write_f\u0456le", "local::fs.write_file ", "local::FS.write_file",
                                  "fs_write_file", "local::fs.write_fi\u200ble"])
async def test_a_rule_naming_a_tool_by_a_look_alike_stops_the_start(tmp_path: Path, glob: str) -> None:
    with pytest.raises(ConfigError) as caught:
        async with _host(tmp_path, glob):
            pass
    assert caught.value.key == "plugins.policy.rules"
    assert "no-writes" in str(caught.value) and repr(glob) in str(caught.value)


@pytest.mark.parametrize("glob", ["local::fs.write_file", "local::fs.*", "mcp::github::*", "*"])
async def test_a_rule_matching_a_tool_or_close_to_none_starts(tmp_path: Path, glob: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    async with _host(tmp_path, glob) as host:
        result = await host.call("local::fs.write_file", {})
    assert (result.error is not None) == (glob != "mcp::github::*")
    assert "tools glob" not in caplog.text


async def test_a_rule_close_to_a_mounted_tool_starts_with_a_warning(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    # A near miss may be a tool mounted later (an MCP server that is not up, required = false): warned, not refused.
    async with _host(tmp_path, "local::fs.wrte_file") as host:
        result = await host.call("local::fs.write_file", {})
    assert result.success
    assert "'no-writes'" in caplog.text and "'local::fs.wrte_file'" in caplog.text
    assert "plugins.policy.rules" in caplog.text


def test_python_m_in_the_working_directory_is_named(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("PYTHONSAFEPATH", None)
    ran = subprocess.run([sys.executable, "-m", "amplifier_tools", "list"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "is on sys.path" in ran.stderr and "amplifier-tools command" in ran.stderr
    if sys.version_info < (3, 11):
        return  # no -P
    assert "python -P" in ran.stderr
    safe = subprocess.run([sys.executable, "-P", "-m", "amplifier_tools", "list"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert safe.returncode == 0 and "sys.path" not in safe.stderr, safe.stderr
    chosen = subprocess.run([sys.executable, "-m", "amplifier_tools", "list"], cwd=work,
                            env={**env, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)])},
                            capture_output=True, text=True, timeout=120)
    assert chosen.returncode == 0 and "sys.path" not in chosen.stderr, chosen.stderr


@pytest.mark.parametrize("header", ["\u0430mplifier-tools", "amplifier-tools ", "amplifier-tools\u200b",
                                    "amplifier\u2010tools"])
def test_a_pyproject_section_spelled_with_a_look_alike_is_refused(tmp_path: Path, header: str) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[project]\nname = "x"\n[[tool."{header}".plugins.policy.rules]]\naction = "deny"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        discover_config_file(tmp_path)
    assert caught.value.key == f"tool.{header}" and "look-alike" in str(caught.value)


@pytest.mark.parametrize("header", ["amplifier", "black", "r\u00e9sum\u00e9"])
def test_other_pyproject_sections_are_not_taken_for_ours(tmp_path: Path, header: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[tool."{header}"]\nx = 1\n', encoding="utf-8")
    assert discover_config_file(tmp_path) is None
