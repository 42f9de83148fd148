"""The command line, through real subprocesses: output and exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import amplifier_tools

PACKAGE_ROOT = str(Path(amplifier_tools.__file__).resolve().parent.parent)

TOOLS_MODULE = '''
from amplifier_tools import ToolResult, ToolSpec, ContractError

class Greet:
    spec = ToolSpec(
        name="local::demo.greet", version="1.2.0", description="Greet someone.", effect="Pure",
        input_schema={"type": "object", "properties": {"who": {"type": "string"}},
                      "required": ["who"], "additionalProperties": False},
        output_schema={"type": "string"},
        examples=[{"input": {"who": "Ada"}, "output": "hello Ada"}],
    )
    name, description = spec.name, spec.description

    async def execute(self, input):
        if input["who"] == "crash":
            raise RuntimeError("backend exploded")
        return ToolResult(output="hello " + input["who"])

async def mount(coordinator, config):
    await coordinator.mount("tools", Greet())
'''

GUARD_MODULE = '''
from amplifier_tools import Deny, hookimpl

class Guard:
    name = "guard"

    @hookimpl
    def tool_pre(self, call, context):
        if call.arguments.get("who") == "mallory" and "admin" not in context.scopes:
            return Deny("mallory needs the admin scope", code="needs_admin")

async def mount(coordinator, config):
    pass
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "demo_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text(textwrap.dedent('''
        [[modules]]
        module = "demo_tools"
    '''))
    return tmp_path


def cli(cwd: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(cwd), PACKAGE_ROOT])
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "amplifier_tools", *args], cwd=cwd, env=environ,
                          input=stdin, capture_output=True, text=True, timeout=60)


def test_list_and_describe(project: Path) -> None:
    listed = cli(project, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert {"local::demo.greet", "local::fs.read_file"} <= set(rows)
    assert rows["local::demo.greet"]["effect"] == "Pure" and rows["local::demo.greet"]["model_name"] == "demo_greet"
    assert rows["local::fs.read_file"]["plugin"] == "filesystem"
    plain = cli(project, "list")
    assert "local::demo.greet" in plain.stdout and "1.2.0" in plain.stdout
    described = json.loads(cli(project, "describe", "demo_greet", "--json").stdout)
    assert described["version"] == "1.2.0" and described["output_schema"] == {"type": "string"}
    readable = cli(project, "describe", "local::demo.greet").stdout
    assert "version: 1.2.0" in readable and "effect: Pure" in readable and "timeout_ms" not in readable
    missing = cli(project, "describe", "nope")
    assert missing.returncode == 3 and "unknown tool 'nope'" in missing.stderr


def test_schema_formats(project: Path) -> None:
    for fmt, key in (("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")):
        out = cli(project, "schema", "--format", fmt)
        assert out.returncode == 0
        assert all(key in definition for definition in json.loads(out.stdout))
    bad = cli(project, "schema", "--format", "gemini")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_call_exit_statuses(project: Path) -> None:
    ok = cli(project, "call", "demo_greet", '{"who": "Ada"}')
    assert (ok.returncode, ok.stdout.strip()) == (0, "hello Ada")
    from_stdin = cli(project, "call", "local::demo.greet", "-", stdin='{"who": "Bo"}')
    assert from_stdin.stdout.strip() == "hello Bo"
    contract = cli(project, "call", "demo_greet", '{"who": 3}')
    assert contract.returncode == 3 and "ContractError[invalid_input]" in contract.stderr
    assert "/who" in contract.stderr
    unknown = cli(project, "call", "nope", "{}")
    assert unknown.returncode == 3 and "unknown tool 'nope'" in unknown.stderr
    invalid_json = cli(project, "call", "demo_greet", "{who: Ada}")
    assert invalid_json.returncode == 3 and "not valid JSON" in invalid_json.stderr
    assert "Traceback" not in invalid_json.stderr
    failed = cli(project, "call", "demo_greet", '{"who": "crash"}')
    assert failed.returncode == 1 and "ExecutionError" in failed.stderr and "Traceback" not in failed.stderr
    as_json = json.loads(cli(project, "call", "demo_greet", '{"who": "Cy"}', "--json").stdout)
    assert as_json["success"] is True and as_json["metadata"]["trail"] == []


def test_policy_denial_exit_status_and_scopes(project: Path) -> None:
    (project / "guard_plugin.py").write_text(GUARD_MODULE)
    (project / "amplifier-tools.toml").write_text(textwrap.dedent('''
        load_plugins = []
        [[modules]]
        module = "demo_tools"
    '''))
    (project / "run_guarded.toml").write_text('[[modules]]\nmodule = "demo_tools"\n')
    code = (
        "import asyncio, sys, guard_plugin\n"
        "from amplifier_tools import ToolHost, ToolContext\n"
        "async def main():\n"
        "    async with ToolHost(config='run_guarded.toml', plugins=[guard_plugin.Guard()]) as h:\n"
        "        r = await h.call('demo_greet', {'who': 'mallory'})\n"
        "        print(r.error['type'], r.error['plugin'])\n"
        "asyncio.run(main())\n"
    )
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), PACKAGE_ROOT])}
    out = subprocess.run([sys.executable, "-c", code], cwd=project, env=environ, capture_output=True, text=True)
    assert out.stdout.strip() == "PolicyError guard", out.stderr


def test_bad_config_is_one_line_naming_file_and_key(project: Path) -> None:
    (project / "amplifier-tools.toml").write_text("default_timeout_ms = 'soon'\n")
    out = cli(project, "list")
    assert out.returncode == 2
    assert "amplifier-tools.toml: default_timeout_ms:" in out.stderr
    assert "Traceback" not in out.stderr
    verbose = cli(project, "-v", "list")
    assert "Traceback" in verbose.stderr


def test_config_precedence(project: Path) -> None:
    other = project / "other.toml"
    other.write_text("[context]\nprincipal = 'from-flag'\n")
    (project / "pyproject.toml").write_text("[tool.amplifier-tools.context]\nprincipal = 'from-pyproject'\n")
    script = ("import asyncio\nfrom amplifier_tools import ToolHost\n"
              "async def main():\n    async with ToolHost(entry_points=False) as h:\n"
              "        print(h.default_context.principal)\nasyncio.run(main())\n")

    def principal(env: dict[str, str]) -> str:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
        environ.update(env, PYTHONPATH=os.pathsep.join([str(project), PACKAGE_ROOT]))
        out = subprocess.run([sys.executable, "-c", script], cwd=project, env=environ, capture_output=True,
                             text=True)
        return out.stdout.strip() or out.stderr

    (project / "amplifier-tools.toml").write_text("[context]\nprincipal = 'from-local-toml'\n")
    assert principal({"AMPLIFIER_TOOLS_CONFIG": str(other)}) == "from-flag"
    assert principal({}) == "from-local-toml"
    (project / "amplifier-tools.toml").unlink()
    assert principal({}) == "from-pyproject"


def test_failing_plugin_is_listed_with_its_reason(project: Path) -> None:
    (project / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "no_such_module_here"\n')
    out = cli(project, "list")
    assert out.returncode == 2
    assert "no_such_module_here" in out.stderr and "No module named" in out.stderr


def test_validate_reports_each_check(project: Path) -> None:
    ok = cli(project, "validate", "demo_tools")
    assert ok.returncode == 0, ok.stdout
    assert "PASS  local::demo.greet: example 1: valid; ran" in ok.stdout
    (project / "bad_tools.py").write_text(TOOLS_MODULE.replace('"output": "hello Ada"', '"output": 42'))
    bad = cli(project, "validate", "bad_tools", "--json")
    report = json.loads(bad.stdout)
    assert bad.returncode == 1 and report["ok"] is False
    failed = [c for c in report["checks"] if not c["passed"]]
    assert failed[0]["name"] == "local::demo.greet: example 1"
    assert "output invalid" in failed[0]["message"]
    missing = cli(project, "validate", "not_a_module")
    assert missing.returncode == 1 and "FAIL  importable" in missing.stdout


def test_version_lists_plugins(project: Path) -> None:
    version = cli(project, "--version")
    assert version.stdout.startswith(f"amplifier-tools {amplifier_tools.__version__}")
    assert "demo_tools" in version.stdout


def test_read_file_prints_its_text_and_the_paging_notice(project: Path) -> None:
    (project / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    out = cli(project, "call", "local::fs.read_file", '{"path": "notes.txt", "limit": 2}')
    assert out.returncode == 0
    assert out.stdout == "     1\talpha\n     2\tbeta\n"
    assert "continue with offset=3" in out.stderr
    outside = cli(project, "call", "fs_read_file", '{"path": "/etc/hostname"}')
    assert outside.returncode == 4 and "AuthError[path_denied]" in outside.stderr
