"""The documentation's examples run as written, so they cannot drift from the code.

Every fenced block in README.md and docs/*.md is one of:

- ``python``: the blocks of one file run in order, in one fresh interpreter, in a temporary working
  directory holding a copy of README.md (the examples read it), with the host's state directory in
  the temporary directory too;
- ``toml`` that configures a host (not a ``[project...]`` packaging fragment): a valid host
  configuration, and a host starts with it (so each plugin accepts its section) unless it
  configures MCP servers, which would be started;
- ``sh``: each ``amplifier-tools`` command line that only reads (``list``, ``describe``,
  ``schema``, ``call`` of a read tool, ``validate``) runs in that working directory and exits 0.
  Installation lines (``pip``, ``python3 -m venv``, ``tox``) are exercised by the slow
  ``test_readme_quickstart_in_a_fresh_venv`` and by CI itself; ``serve-mcp`` waits for a client.

Blocks with no language (transcripts, diagrams) are not run. docs/integrations.md's examples need the
agent frameworks; ``tox -e integrations`` runs them (tests/integrations/test_integration_docs.py).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_helpers import cli

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: docs/integrations.md's examples need the agent frameworks, which these envs do not install: they
#: run in ``tox -e integrations`` (tests/integrations/test_integration_docs.py), never skipped here
#: (test_integrations_env.py checks that env runs them).
FRAMEWORK_DOCS = ("integrations.md",)
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in FRAMEWORK_DOCS)]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
READ_ONLY_COMMANDS = ("list", "describe", "schema", "call", "validate", "plugins")


def blocks(language: str) -> list[tuple[str, int, str]]:
    """``(file, index, text)`` of every block in ``language``."""
    found = []
    for path in DOCS:
        for index, match in enumerate(FENCE.finditer(path.read_text())):
            if match.group(1) == language:
                found.append((path.name, index, match.group(2)))
    return found


def workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "README.md", work / "README.md")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "AMPLIFIER_TOOLS_CONFIG": ""}
    return work, env


@pytest.mark.parametrize("name", sorted({name for name, _, _ in blocks("python")}))
def test_python_examples_run(name: str, tmp_path: Path) -> None:
    code = "\n\n".join(text for file, _, text in blocks("python") if file == name)
    work, env = workspace(tmp_path)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
    environ.update(env, PYTHONPATH=str(Path(__import__("amplifier_tools").__file__).resolve().parent.parent))
    environ.pop("AMPLIFIER_TOOLS_CONFIG")
    done = subprocess.run([sys.executable, "-c", code], cwd=work, env=environ, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{name}: the Python examples failed:\n{done.stderr}"


def _host_config(text: str) -> dict[str, object] | None:
    data = tomllib.loads(text)
    return None if "project" in data or "tool" in data else data


@pytest.mark.parametrize(("name", "index", "text"), blocks("toml"), ids=lambda v: str(v)[:40])
async def test_toml_examples_are_valid_configuration(name: str, index: int, text: str, tmp_path: Path) -> None:
    from amplifier_tools import ToolHost
    from amplifier_tools.config import validate_config

    config = _host_config(text)
    if config is None:
        return  # a packaging fragment (entry points), checked by the plugin tests
    validated = validate_config(config, file=f"{name} block {index}")
    if "mcp" in validated.get("plugins", {}) or any(name.startswith("mcp::") for name in validated.get("tools", {})):
        return  # needs the MCP server it configures
    validated["state_dir"] = str(tmp_path / "state")
    if validated.get("plugins", {}).get("bash", {}).get("user") is None:
        (tmp_path / "work").mkdir()
        async with ToolHost(config=validated, working_dir=tmp_path / "work", entry_points=False,
                            discover=False) as host:
            assert host.tools
        return
    # Commands run as another user, who must reach the working directory (pytest's tmp_path is
    # private to its owner): one it can enter, as a deployment would give it.
    base = Path(tempfile.mkdtemp(prefix="amp-docs-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        (base / "work").mkdir()
        async with ToolHost(config=validated, working_dir=base / "work", entry_points=False,
                            discover=False) as host:
            assert host.tools
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _commands(text: str) -> list[list[str]]:
    """The read-only ``amplifier-tools`` command lines of an ``sh`` block (after ``&&`` too)."""
    commands = []
    for line in text.splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["amplifier-tools"]:
                rest = words[1:]
                while rest and rest[0].startswith("-"):  # global options: --config FILE, -v
                    rest = rest[2:] if rest[0] == "--config" else rest[1:]
                if rest and rest[0] in READ_ONLY_COMMANDS:
                    commands.append(rest)
    return commands


SH_COMMANDS = [(name, command) for name, _, text in blocks("sh") for command in _commands(text)]


def test_the_readme_quickstart_command_is_among_those_run() -> None:
    assert ("README.md", ["call", "local::fs.read_file", '{"path": "README.md", "limit": 5}']) in SH_COMMANDS


@pytest.mark.parametrize(("name", "command"), SH_COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_shell_examples_run(name: str, command: list[str], tmp_path: Path) -> None:
    work, env = workspace(tmp_path)
    done = cli(work, *command, env={"XDG_STATE_HOME": env["XDG_STATE_HOME"]})
    assert done.returncode == 0, f"{name}: amplifier-tools {shlex.join(command)}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_readme_quickstart_in_a_fresh_venv(tmp_path: Path) -> None:
    """The README's first two lines as a newcomer runs them: a venv, ``pip install .``, the call."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".git", ".tox", "*.egg-info", "build", "__pycache__",
                                                                   ".venv", "_build", "results"))
    quickstart = next(text for name, _, text in blocks("sh") if name == "README.md")
    lines = [line for line in quickstart.splitlines() if not line.startswith("pip install tox")]
    script = "set -e\n" + "\n".join(lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMPLIFIER_TOOLS_", "VIRTUAL_ENV", "PYTHON"))}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    done = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# amplifier-tools" in done.stdout
