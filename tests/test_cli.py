"""The command line, through real subprocesses: output and exit statuses."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import cli, cli_environ

import amplifier_tools

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

class Vault:
    spec = ToolSpec(
        name="local::demo.vault", version="1.0.0", description="Needs the vault:read scope.", effect="Pure",
        input_schema={"type": "object"}, security={"required_scopes": ["vault:read"]},
    )
    name, description = spec.name, spec.description

    async def execute(self, input):
        return ToolResult(output="opened")

async def mount(coordinator, config):
    await coordinator.mount("tools", Greet())
    await coordinator.mount("tools", Vault())
'''

SOURCE_MODULE = '''
from amplifier_tools import ToolResult

class Source:
    name = "local::demo.source"
    description = "Say which configuration file mounted it."
    input_schema = {"type": "object"}

    def __init__(self, source):
        self.source = source

    async def execute(self, input):
        return ToolResult(output=self.source)

async def mount(coordinator, config):
    await coordinator.mount("tools", Source(config["source"]))
'''

@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "demo_tools.py").write_text(TOOLS_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text(textwrap.dedent('''
        [[modules]]
        module = "demo_tools"
    '''))
    return tmp_path


def test_list_and_describe(project: Path) -> None:
    listed = cli(project, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert {"local::demo.greet", "local::fs.read_file"} <= set(rows)
    assert rows["local::demo.greet"]["effect"] == "Pure" and rows["local::demo.greet"]["model_name"] == "demo_greet"
    assert rows["local::fs.read_file"]["plugin"] == "filesystem"
    assert (rows["local::fs.read_file"]["distribution"], rows["local::fs.read_file"]["distribution_version"]) == (
        "amplifier-tools", amplifier_tools.__version__)
    # A module next to the config belongs to no installed distribution.
    assert (rows["local::demo.greet"]["distribution"], rows["local::demo.greet"]["distribution_version"]) == (
        None, None)
    plain = cli(project, "list")
    lines = plain.stdout.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "EFFECT", "PLUGIN", "DISTRIBUTION"]
    assert ["local::fs.read_file", "1.0.0", "Pure", "filesystem", "amplifier-tools", amplifier_tools.__version__] \
        in [line.split() for line in lines]
    assert ["local::demo.greet", "1.2.0", "Pure", "demo_tools", "-"] in [line.split() for line in lines]
    described = json.loads(cli(project, "describe", "demo_greet", "--json").stdout)
    assert described["version"] == "1.2.0" and described["output_schema"] == {"type": "string"}
    readable = cli(project, "describe", "local::demo.greet").stdout
    assert "version: 1.2.0" in readable and "effect: Pure" in readable and "timeout_ms" not in readable
    missing = cli(project, "describe", "nope")
    assert missing.returncode == 3
    assert missing.stderr.splitlines() == ["error: unknown tool 'nope'",
                                           "hint: see 'amplifier-tools list' for the mounted tools"]
    typo = cli(project, "describe", "local::demo.gret")  # found by a newcomer: call suggested, describe did not
    assert typo.returncode == 3
    assert typo.stderr.startswith("error: unknown tool 'local::demo.gret'; did you mean 'local::demo.greet'")


def test_schema_formats(project: Path) -> None:
    for fmt, key in (("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")):
        out = cli(project, "schema", "--format", fmt)
        assert out.returncode == 0
        assert all(key in definition for definition in json.loads(out.stdout))
    bad = cli(project, "schema", "--format", "gemini")
    assert bad.returncode == 2
    error, hint = bad.stderr.splitlines()
    assert error.startswith("error: argument --format: invalid choice: 'gemini'")
    assert hint == "hint: see 'amplifier-tools schema --help'"


def test_call_exit_statuses(project: Path) -> None:
    ok = cli(project, "call", "demo_greet", '{"who": "Ada"}')
    assert (ok.returncode, ok.stdout.strip()) == (0, "hello Ada")
    from_stdin = cli(project, "call", "local::demo.greet", "-", stdin='{"who": "Bo"}')
    assert from_stdin.stdout.strip() == "hello Bo"
    contract = cli(project, "call", "demo_greet", '{"who": 3}')
    assert contract.returncode == 3 and "ContractError[invalid_input]" in contract.stderr
    assert "/who" in contract.stderr
    assert contract.stderr.splitlines()[-1] == "hint: see 'amplifier-tools describe demo_greet' for its input schema"
    unknown = cli(project, "call", "nope", "{}")
    assert unknown.returncode == 3 and "unknown tool 'nope'" in unknown.stderr
    assert unknown.stderr.splitlines()[-1] == "hint: see 'amplifier-tools list' for the mounted tools"
    invalid_json = cli(project, "call", "demo_greet", "{who: Ada}")
    assert invalid_json.returncode == 3
    assert invalid_json.stderr.splitlines() == [
        "error: arguments are not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        """hint: pass a JSON object, e.g. '{"path": "README.md"}'""",
    ]
    failed = cli(project, "call", "demo_greet", '{"who": "crash"}')
    assert failed.returncode == 1
    error, hint = failed.stderr.splitlines()
    assert error.startswith("ExecutionError[") and "backend exploded" in error
    assert hint.startswith("hint: run with --json for the whole result")
    verbose = cli(project, "-v", "call", "demo_greet", '{"who": "crash"}')
    assert verbose.returncode == 1 and '"type": "ExecutionError"' in verbose.stderr
    as_json = json.loads(cli(project, "call", "demo_greet", '{"who": "Cy"}', "--json").stdout)
    assert as_json["success"] is True and as_json["metadata"]["trail"] == []


def test_call_scopes_from_the_command_line_reach_the_policy(project: Path) -> None:
    denied = cli(project, "call", "demo_vault", "{}", "--principal", "ada")
    assert denied.returncode == 4, denied.stderr
    assert denied.stderr.splitlines() == [
        "AuthError[missing_scope]: denied by plugin 'policy': missing scope 'vault:read' for 'local::demo.vault'",
        "hint: grant it: --scope vault:read",
    ]
    assert denied.stdout == ""
    granted = cli(project, "call", "demo_vault", "{}", "--principal", "ada",
                  "--scope", "other", "--scope", "vault:read")
    assert (granted.returncode, granted.stdout.strip(), granted.stderr) == (0, "opened", "")


def test_bad_config_is_one_line_naming_file_and_key(project: Path) -> None:
    (project / "amplifier-tools.toml").write_text("default_timeout_ms = 'soon'\n")
    out = cli(project, "list")
    assert out.returncode == 2
    error, hint = out.stderr.splitlines()
    assert error.startswith("error: ") and "amplifier-tools.toml: default_timeout_ms:" in error
    assert hint == f"hint: fix the configuration ({project / 'amplifier-tools.toml'}); " \
                   "run with --verbose for the traceback"
    verbose = cli(project, "-v", "list")
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr
    flag = cli(project, "--config", "missing.toml", "list")
    assert flag.returncode == 2
    assert flag.stderr.splitlines() == [
        "error: missing.toml: cannot read configuration: No such file or directory",
        "hint: fix the configuration (--config missing.toml); run with --verbose for the traceback",
    ]


def test_config_precedence(project: Path) -> None:
    """--config, then $AMPLIFIER_TOOLS_CONFIG, then ./amplifier-tools.toml, then ./pyproject.toml."""
    (project / "source_tools.py").write_text(SOURCE_MODULE)

    def config(source: str) -> str:
        return f'[[modules]]\nmodule = "source_tools"\nconfig = {{source = "{source}"}}\n'

    (project / "flag.toml").write_text(config("from-flag"))
    (project / "env.toml").write_text(config("from-env"))
    (project / "amplifier-tools.toml").write_text(config("from-local-toml"))
    (project / "pyproject.toml").write_text(config("from-pyproject").replace("[[modules]]",
                                                                             "[[tool.amplifier-tools.modules]]"))
    env = {"AMPLIFIER_TOOLS_CONFIG": str(project / "env.toml")}

    def source(*args: str, env: dict[str, str] | None = None) -> str:
        # Each switch to another config in the working directory is a change the operator accepts.
        assert cli(project, *args, "trust", env=env).returncode == 0
        out = cli(project, *args, "call", "demo_source", "{}", env=env)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert source("--config", "flag.toml", env=env) == "from-flag"
    assert source(env=env) == "from-env"
    assert source() == "from-local-toml"
    (project / "amplifier-tools.toml").unlink()
    assert source() == "from-pyproject"
    assert source("--config", "flag.toml") == "from-flag"


def test_failing_plugin_is_listed_with_its_reason(project: Path) -> None:
    (project / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "no_such_module_here"\n')
    out = cli(project, "list")
    assert out.returncode == 2
    error, hint = out.stderr.splitlines()
    assert error.startswith("error: plugin 'no_such_module_here': failed to load:") and "No module named" in error
    assert hint.startswith("hint: the module 'no_such_module_here' is not importable: install it, or put its "
                           "directory on PYTHONPATH")


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
    assert missing.stderr.startswith("hint: TARGET is an import path")


def test_validate_module_function_target(project: Path) -> None:
    """``module:function`` names a seed-style mount function."""
    ok = cli(project, "validate", "demo_tools:mount")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS  mount well-formed: async def mount(coordinator, config)" in ok.stdout
    missing = cli(project, "validate", "demo_tools:nope")
    assert missing.returncode == 1
    assert "FAIL  importable: AttributeError: module 'demo_tools' has no attribute 'nope'" in missing.stdout


def test_usage_errors_are_one_line_and_a_hint(project: Path) -> None:
    out = cli(project, "list", "--bogus")
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: unrecognized arguments: --bogus",
                                       "hint: see 'amplifier-tools list --help'"]
    out = cli(project, "describe")
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: the following arguments are required: tool",
                                       "hint: see 'amplifier-tools describe --help'"]


@pytest.mark.parametrize("command", [["list"], ["schema"], ["plugins", "--json"]])
def test_closed_stdout_is_not_an_error(project: Path, command: list[str]) -> None:
    """``amplifier-tools list | head -1``: the reader goes away; the CLI stops quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with EPIPE
    environ = cli_environ(project)
    try:
        out = subprocess.run([sys.executable, "-m", "amplifier_tools", *command], cwd=project, env=environ,
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert out.stderr == ""
    assert out.returncode == 141


def test_head_of_a_pipeline(project: Path) -> None:
    environ = cli_environ(project)
    command = f"{shlex.quote(sys.executable)} -m amplifier_tools list | head -1"
    out = subprocess.run(["sh", "-c", command], cwd=project, env=environ, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["NAME", "VERSION", "EFFECT", "PLUGIN", "DISTRIBUTION"]
    assert out.stderr == ""


def test_read_only_commands_leave_the_directory_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in (["list"], ["list", "--json"], ["plugins"], ["describe", "fs_read_file"],
                    ["schema", "--format", "mcp"], ["--version"]):
        out = cli(empty, *command)
        assert out.returncode == 0, (command, out.stderr)
        assert sorted(p.name for p in empty.iterdir()) == [], command


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


EXIT_MODULE = '''
from amplifier_tools import ExecutionError, ToolResult

class Run:
    name = "local::demo.run"
    description = "Report an exit code the way bash does."
    input_schema = {"type": "object", "properties": {"code": {"type": "integer"}}}

    async def execute(self, input):
        output = {"stdout": "hi\\n", "exit_code": input["code"]}
        if input["code"]:
            error = ExecutionError("exited with 3", code="nonzero_exit")
            return ToolResult(False, output, {"type": error.category, "code": error.code, "message": error.message})
        return ToolResult(output=output)

async def mount(coordinator, config):
    await coordinator.mount("tools", Run())
'''


def test_call_prints_the_output_the_same_way_whatever_the_outcome(project: Path) -> None:
    """stdout: the tool's output as compact JSON for success and failure alike; the error line and
    hint go to stderr; --json: the whole result, with the same keys either way."""
    (project / "exit_tools.py").write_text(EXIT_MODULE)
    (project / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "exit_tools"\n')
    ok = cli(project, "call", "local::demo.run", '{"code": 0}')
    failed = cli(project, "call", "local::demo.run", '{"code": 3}')
    assert ok.returncode == 0 and failed.returncode == 1
    assert json.loads(ok.stdout) == {"stdout": "hi\n", "exit_code": 0} and ok.stdout.count("\n") == 1
    assert json.loads(failed.stdout) == {"stdout": "hi\n", "exit_code": 3} and failed.stdout.count("\n") == 1
    assert "ExecutionError[nonzero_exit]: exited with 3" in failed.stderr and "hint:" in failed.stderr
    whole = [json.loads(cli(project, "call", "local::demo.run", f'{{"code": {n}}}', "--json").stdout) for n in (0, 3)]
    assert whole[0].keys() == whole[1].keys() and whole[1]["output"]["exit_code"] == 3


def test_a_bash_timeout_hint_names_the_calls_own_timeout_argument(project: Path) -> None:
    (project / "amplifier-tools.toml").write_text('[plugins.bash]\nsandbox = "off"\n')
    out = cli(project, "call", "local::bash", '{"command": "sleep 5", "timeout": 1}')
    assert out.returncode == 4 and "PolicyError[timeout]" in out.stderr
    hint = out.stderr.splitlines()[-1]
    assert 'larger "timeout" argument' in hint and "[plugins.bash] max_timeout" in hint



def test_a_missing_secret_hint_says_what_to_set(project: Path) -> None:
    """Found by a new-user trial: the hint read "denied by the policy; ... describe bash shows the
    tool's scopes and policies", where the error itself said which variable to set."""
    (project / "amplifier-tools.toml").write_text('[secrets]\ndeploy = "AMP_TEST_DEPLOY_KEY"\n'
                                                  '[plugins.bash]\nsandbox = "off"\nsecrets = { DEPLOY = "deploy" }\n')
    out = cli(project, "call", "local::bash", '{"command": "echo hi"}')
    assert out.returncode == 4 and "AuthError[missing_secret]" in out.stderr
    assert out.stderr.splitlines()[-1] == "hint: set AMP_TEST_DEPLOY_KEY in the environment the host starts in"

COUNTER_MODULE = '''
from pathlib import Path
from amplifier_tools import ToolResult, ToolSpec

class Stamp:
    spec = ToolSpec(
        name="local::demo.stamp", version="1.0.0", description="Append a line to runs.txt.",
        effect="IdempotentWrite", idempotency_key="optional",
        input_schema={"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]},
    )
    name, description = spec.name, spec.description

    async def execute(self, input):
        runs = Path("runs.txt")
        with runs.open("a") as f:
            f.write(input["line"] + "\\n")
        return ToolResult(output=f"run {len(runs.read_text().splitlines())}")

async def mount(coordinator, config):
    await coordinator.mount("tools", Stamp())
'''


def test_idempotency_key_replays_across_invocations_without_running_the_tool(project: Path) -> None:
    """Each invocation is a new process; the key holds through <state_dir>/policy.sqlite3."""
    (project / "stamp_tools.py").write_text(COUNTER_MODULE)
    (project / "amplifier-tools.toml").write_text(textwrap.dedent('''
        [[modules]]
        module = "stamp_tools"
    '''))
    runs = project / "runs.txt"
    first = cli(project, "call", "demo_stamp", '{"line": "a"}', "--idempotency-key", "k1", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["output"] == "run 1"
    again = cli(project, "call", "demo_stamp", '{"line": "a"}', "--idempotency-key", "k1", "--json")
    assert again.returncode == 0, again.stderr
    replayed = json.loads(again.stdout)
    assert replayed["output"] == "run 1" and replayed["metadata"]["replayed"] is True
    assert runs.read_text() == "a\n"  # the tool ran once
    other = cli(project, "call", "demo_stamp", '{"line": "a"}', "--idempotency-key", "k2", "--json")
    assert json.loads(other.stdout)["output"] == "run 2"
    conflict = cli(project, "call", "demo_stamp", '{"line": "b"}', "--idempotency-key", "k1")
    assert conflict.returncode != 0 and "idempotency_conflict" in conflict.stderr
    assert "hint: the key was used with other arguments: a new call needs a new --idempotency-key" in conflict.stderr
    assert runs.read_text() == "a\na\n"
    # In text mode a replay looked exactly like a run (found by a newcomer's pass): stderr says so.
    text = cli(project, "call", "demo_stamp", '{"line": "a"}', "--idempotency-key", "k1")
    assert text.returncode == 0 and text.stdout == "run 1\n", text.stdout + text.stderr
    assert "(replayed: the stored result of the earlier call with this idempotency key" in text.stderr
    fresh = cli(project, "call", "demo_stamp", '{"line": "c"}', "--idempotency-key", "k3")
    assert fresh.returncode == 0 and "replayed" not in fresh.stderr
    empty = cli(project, "call", "demo_stamp", '{"line": "a"}', "--idempotency-key", " ")
    assert empty.returncode == 2 and "an idempotency key must not be empty" in empty.stderr
    assert runs.read_text() == "a\na\nc\n"


def test_policy_status_before_any_decision_shows_nothing_and_creates_nothing(project: Path) -> None:
    out = cli(project, "policy", "status")
    assert out.returncode == 0, out.stderr
    store_line, message = out.stdout.splitlines()
    assert store_line.startswith("store: sqlite ") and message == "no live policy state"
    assert not Path(store_line.split(" ", 2)[2]).exists()


def test_schema_accepts_json_like_every_other_command(project: Path) -> None:
    out = cli(project, "schema", "--json", "--format", "anthropic")
    assert out.returncode == 0, out.stderr
    names = [d["name"] for d in json.loads(out.stdout)]
    assert "demo_greet" in names


def test_the_command_line_names_the_same_settings_and_formats_as_the_host() -> None:
    """cli.py repeats three constants so that ``--help`` imports no host code; they must agree."""
    from amplifier_tools import cli as cli_module
    from amplifier_tools import definitions, host

    assert (cli_module.ENV_CONFIG, cli_module.ENV_DISABLE) == (host.ENV_CONFIG, host.ENV_DISABLE)
    assert cli_module.FORMATS == definitions.FORMATS


#: What ``--help`` and usage errors must not import: the host and what it is built on.
HEAVY_MODULES = ("amplifier_tools.host", "amplifier_tools.config", "amplifier_tools._converter",
                 "amplifier_tools.models", "amplifier_tools._markers", "cattrs", "attrs", "attr", "jsonschema",
                 "referencing", "pluggy", "asyncio", "importlib.metadata", "logging")


@pytest.mark.parametrize("argv", [["--help"], ["list", "--help"], ["describe", "--help"], ["no-such-command"],
                                  ["describe"]])
def test_help_and_usage_errors_import_no_host_code(argv: list[str]) -> None:
    """The start-up target (bench/bench_cli.py): ``--help`` costs the interpreter and argparse, not the
    host. Counts only what the command line imports, not what the interpreter's site hooks did."""
    code = ("import runpy, sys\n"
            "before = set(sys.modules)\n"
            f"sys.argv = ['amplifier-tools', *{argv!r}]\n"
            "try:\n    runpy.run_module('amplifier_tools', run_name='__main__', alter_sys=True)\n"
            "except SystemExit:\n    pass\n"
            f"heavy = {HEAVY_MODULES!r}\n"
            "new = set(sys.modules) - before\n"
            "print('imported:', sorted(m for m in new if any(m == h or m.startswith(h + '.') for h in heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(amplifier_tools.__file__).parent.parent)})
    assert out.stdout.strip().splitlines()[-1] == "imported: []", out.stdout + out.stderr


#: What ``list`` and ``describe`` must not import with no configuration: the pieces only a call,
#: a configured feature or an installed plugin needs (docs/performance.md, "Command-line start-up").
LAZY_MODULES = ("importlib.metadata", "amplifier_tools.mcp.settings", "amplifier_tools.builtins.bash.shellparse",
                "tree_sitter", "tree_sitter_bash", "jsonschema", "tenacity", "orjson", "secrets", "tomllib",
                "cattrs", "amplifier_tools._converter", "sqlite3", "amplifier_tools.builtins.policy.sqlite_store",
                "difflib")


@pytest.mark.parametrize("argv", [["list"], ["describe", "local::bash"]])
def test_list_and_describe_import_only_what_they_use(tmp_path: Path, argv: list[str]) -> None:
    """The start-up target (bench/bench_cli.py). ``importlib.metadata`` is imported only where an
    installed distribution declares a plugin (then it must be, to load it); cattrs neither by a
    host's start nor by ``describe``, which prints a contract with ``cli._plain``."""
    lazy = LAZY_MODULES
    code = ("import runpy, sys\n"
            "before = set(sys.modules)\n"
            f"sys.argv = ['amplifier-tools', *{argv!r}]\n"
            "try:\n    runpy.run_module('amplifier_tools', run_name='__main__', alter_sys=True)\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            f"lazy = {lazy!r}\n"
            "new = set(sys.modules) - before\n"
            "imported = sorted(m for m in new if any(m == h or m.startswith(h + '.') for h in lazy))\n"
            "import importlib.metadata as md\n"
            "installed = md.entry_points()\n"
            "plugins = [*installed.select(group='amplifier_tools'), *(ep for ep in "
            "installed.select(group='amplifier.modules') if not ep.value.startswith('amplifier_tools.'))]\n"
            "print('imported:', [m for m in imported if not (plugins and m.startswith('importlib.metadata'))])\n"
            # settings classes get their annotations resolved (typing at work) only to structure a table
            "from amplifier_tools import plugin_settings, redaction\n"
            "print('settings resolved:', sorted(cls.__name__ for cls in plugin_settings._SETTINGS))\n"
            "print('patterns compiled:', redaction._default_re.cache_info().currsize)")
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=work,
                         env={**cli_environ(work), "XDG_STATE_HOME": str(tmp_path / "state")})
    assert out.stdout.strip().splitlines()[-3:] == ["imported: []", "settings resolved: []", "patterns compiled: 0"], \
        out.stdout + out.stderr


@pytest.mark.parametrize(("argv", "named"), [
    (["list"], "list"), (["-v", "describe", "local::bash", "--json"], "describe"),
    (["--config", "list", "describe", "x"], "describe"), (["--config=a.toml", "schema"], "schema"),
    (["--conf", "a.toml", "--verb", "--vers", "plugins"], "plugins"), (["--c=a.toml", "call", "t", "{}"], "call"),
    (["audit", "-h"], "audit"), (["policy", "status", "--json"], "policy"), (["mcp", "pin", "--print"], "mcp"),
    (["serve-mcp", "--port", "0"], "serve-mcp"), (["validate", "x", "--no-run"], "validate"), (["trust"], "trust"),
    (["list", "--bogus"], "list"),
    ([], None), (["-h"], None), (["--he", "list"], None), (["--ver", "list"], None), (["-vv", "list"], None),
    (["--config"], None), (["--config", "-v", "list"], None), (["--version=1", "list"], None),
    (["lst"], None), (["--", "list"], None), (["-x", "list"], None),
])
def test_the_parser_for_one_command_parses_as_the_whole_one(argv: list[str], named: str | None) -> None:
    """``main`` builds only the named command's parser when the line surely names it: the same
    namespace as the whole parser's, and None wherever the whole parser must decide."""
    from amplifier_tools.cli import _command_named, _parser

    assert _command_named(argv) == named
    if named is not None:
        whole = _parser().parse_known_args(argv)
        one = _parser(named).parse_known_args(argv)
        assert (vars(one[0]), one[1]) == (vars(whole[0]), whole[1])


def test_a_command_s_help_is_the_same_from_its_own_parser(tmp_path: Path) -> None:
    """``describe --help`` from the parser of ``describe`` alone, and from the whole one (``-vv``
    is not foreseen by ``_command_named``)."""
    own, whole = (cli(tmp_path, *argv) for argv in (["describe", "--help"], ["-vv", "describe", "--help"]))
    assert own.returncode == whole.returncode == 0
    assert own.stdout.startswith("usage: amplifier-tools describe") and own.stdout == whole.stdout


def test_inspection_commands_run_as_a_program_leave_the_collector_off(tmp_path: Path) -> None:
    """``main()`` as the console script calls it turns the cyclic collector off for an inspection
    command and freezes the heap for the exit; ``main(argv)`` (a process that goes on) and a
    command that runs tools leave it alone."""
    code = ("import contextlib, gc, io, sys\n"
            "from amplifier_tools.cli import main\n"
            "def run(argv, as_program):\n"
            "    sys.argv = ['amplifier-tools', *argv]\n"
            "    frozen = gc.get_freeze_count()  # not 0 at start on some builds (pyenv's 3.12.1: 375)\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        status = main() if as_program else main(argv)\n"
            "    print(argv[0], as_program, status, gc.isenabled(), gc.get_freeze_count() > frozen)\n"
            "run(['list'], False)\n"
            "run(['call', 'local::nosuch'], True)\n"
            "run(['describe', 'local::bash'], True)\n")
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=work,
                         env={**cli_environ(work), "XDG_STATE_HOME": str(tmp_path / "state")})
    assert out.stdout.splitlines() == ["list False 0 True False", "call True 3 True False",
                                       "describe True 0 False True"], out.stdout + out.stderr


def test_describe_prints_a_contract_as_the_converter_unstructures_it() -> None:
    """``describe`` builds its data without cattrs (``cli._plain``): the same data as the converter's,
    for the built-in tools and a contract with every part set; anything else goes to the converter."""
    from amplifier_tools import ToolHost, ToolSpec
    from amplifier_tools._converter import converter
    from amplifier_tools.cli import _NotPlain, _plain, _spec_data

    full = ToolSpec(
        name="a::b", description="d", version="1.2.3-rc.1+x", title="t", owner="o", tags=["x", "y"],
        input_schema={"type": "object", "enum": ("a", 1, 2.5, True, None), "nested": [{"k": ("v",)}]},
        output_schema={"type": ["string", "null"]}, effect="Pure", idempotency_key="optional",
        examples=[{"input": {"a": (1,)}, "output": ("o",), "error_code": "e", "description": "x",
                   "files": {"f.txt": "text"}}],
        policies={"timeout_ms": 5, "retry": {"max_attempts": 2}, "rate_limit": {"limit": 3},
                  "concurrency": {"limit": 1}, "circuit_breaker": {"failure_rate": 0.5},
                  "budgets": [{"per": "role", "max_calls": 3}]},
        security={"required_scopes": ["s"], "secret_refs": ["k"], "redaction_rules": ["arguments/p"],
                  "data_classification": "restricted"},
        deprecation={"since": "1.0.0", "replacement": "c::d"}, annotations={"readOnlyHint": True, "k": (1,)},
    )

    async def builtin_specs() -> list[ToolSpec]:
        async with ToolHost(discover=False, entry_points=False) as host:
            return host.specs

    import asyncio

    specs = [*asyncio.run(builtin_specs()), full, ToolSpec(name="c::d")]
    for spec in specs:
        assert _plain(spec) == converter.unstructure(spec), spec.name
    odd = ToolSpec(name="e::f", input_schema={"type": "object", "default": b"bytes"})
    with pytest.raises(_NotPlain):
        _plain(odd)
    assert _spec_data(odd) == converter.unstructure(odd)


@pytest.mark.parametrize(("toml", "hint"), [
    ("defualt_timeout_ms = 5\n", "did you mean 'default_timeout_ms'"),
    ("[context]\nprincpal = \"x\"\n", "did you mean 'principal'?"),
])
def test_a_misspelled_config_key_gets_a_did_you_mean_hint(tmp_path: Path, toml: str, hint: str) -> None:
    config = tmp_path / "elsewhere.toml"
    config.write_text(toml)
    work = tmp_path / "work"
    work.mkdir()
    out = cli(work, "--config", str(config), "list")
    assert out.returncode == 2
    assert f"error: {config}: " in out.stderr and "is not an allowed property" in out.stderr
    assert f"hint: {hint}" in out.stderr


def test_a_config_that_appeared_in_the_working_directory_hints_at_trust(tmp_path: Path) -> None:
    (tmp_path / "amplifier-tools.toml").write_text("[context]\nprincipal = \"me\"\n")
    env = {"XDG_STATE_HOME": str(tmp_path.parent / f"{tmp_path.name}-state")}
    assert cli(tmp_path, "list", env=env).returncode == 0  # first start: trusted as found
    (tmp_path / "amplifier-tools.toml").write_text("[context]\nprincipal = \"someone-else\"\n")
    out = cli(tmp_path, "list", env=env)
    assert out.returncode == 2 and "changed since the host last started" in out.stderr
    assert f"hint: review {tmp_path / 'amplifier-tools.toml'}, then run: amplifier-tools trust" in out.stderr


def test_a_path_outside_the_roots_hints_at_the_setting_that_governs_it(tmp_path: Path) -> None:
    out = cli(tmp_path, "call", "local::fs.read_file", '{"path": "/etc/hostname"}',
              env={"XDG_STATE_HOME": str(tmp_path.parent / f"{tmp_path.name}-state")})
    assert out.returncode == 4
    assert "hint: the path is outside the filesystem plugin's read roots" in out.stderr
    assert "[plugins.filesystem] allowed_read_paths" in out.stderr
    assert "describe" not in out.stderr  # describe says nothing about roots


def test_a_symlink_out_of_the_roots_hints_at_the_roots_not_the_policy(tmp_path: Path) -> None:
    """It said "denied by the policy; describe shows the tool's scopes" (found by a newcomer's pass)."""
    (tmp_path / "link").symlink_to("/etc/hostname")
    out = cli(tmp_path, "call", "local::fs.read_file", '{"path": "link"}',
              env={"XDG_STATE_HOME": str(tmp_path.parent / f"{tmp_path.name}-state")})
    assert out.returncode == 4 and "symbolic link" in out.stderr
    assert "hint: the path is a symbolic link leading outside the filesystem plugin's roots" in out.stderr
    assert "allowed_read_paths" in out.stderr and "policy" not in out.stderr


def test_a_timeout_hint_names_the_timeouts_not_the_policy(project: Path) -> None:
    (project / "slow_tools.py").write_text(textwrap.dedent('''
        import asyncio
        from amplifier_tools import ToolResult, ToolSpec

        class Slow:
            spec = ToolSpec(name="local::demo.slow", version="1.0.0", description="Sleeps.", effect="Pure",
                            input_schema={"type": "object"}, policies={"timeout_ms": 50})
            name, description = spec.name, spec.description

            async def execute(self, input):
                await asyncio.sleep(5)
                return ToolResult(output="late")

        async def mount(coordinator, config):
            await coordinator.mount("tools", Slow())
    '''))
    (project / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "slow_tools"\n')
    out = cli(project, "call", "demo_slow", "{}")
    assert out.returncode == 4, out.stderr
    assert "PolicyError[timeout]" in out.stderr
    assert "hint: the call ran out of time; raise the tool's timeout_ms" in out.stderr
    assert '([tools."local::demo.slow".policies] timeout_ms)' in out.stderr
    assert "denied by" not in out.stderr


def test_a_misspelled_plugin_key_gets_a_did_you_mean_hint(tmp_path: Path) -> None:
    config = tmp_path / "elsewhere.toml"
    config.write_text("[plugins.bash]\ndefualt_timeout = 5\n")
    work = tmp_path / "work"
    work.mkdir()
    out = cli(work, "--config", str(config), "list")
    assert out.returncode == 2
    assert "plugins.bash.defualt_timeout: unknown key" in out.stderr
    assert "hint: did you mean 'default_timeout'?" in out.stderr


def test_fixing_a_typo_in_a_first_config_needs_no_trust(tmp_path: Path) -> None:
    """A first start that failed on the file's own mistake recorded it as trusted, so each fix then
    asked for ``amplifier-tools trust`` (new-user trial)."""
    config = tmp_path / "amplifier-tools.toml"
    config.write_text("[plugins.bash]\nmax_timout = 600\n")
    env = {"XDG_STATE_HOME": str(tmp_path.parent / f"{tmp_path.name}-state")}
    out = cli(tmp_path, "list", env=env)
    assert out.returncode == 2 and "plugins.bash.max_timout" in out.stderr
    config.write_text("[plugins.bash]\nmax_timeout = 600\n")
    fixed = cli(tmp_path, "list", env=env)
    assert fixed.returncode == 0, fixed.stderr
    config.write_text("[plugins.bash]\nmax_timeout = 900\n")  # once started, a change is not taken on trust
    assert "changed since the host last started" in cli(tmp_path, "list", env=env).stderr


def test_policy_status_of_a_store_that_does_not_answer_reports_it_as_every_command_does(project: Path) -> None:
    """Found by attack: the error went to stdout as plain text, also under ``--json``."""
    pytest.importorskip("redis")
    with open(project / "amplifier-tools.toml", "a") as config:
        config.write('\n[plugins.policy]\nstore = "redis://127.0.0.1:1/0"\nstore_timeout_ms = 200\n')
    plain = cli(project, "policy", "status")
    assert plain.returncode == 1 and plain.stdout == ""
    assert "error: Redis store redis://127.0.0.1:1/0" in plain.stderr
    assert "hint: " in plain.stderr and "[plugins.policy] store" in plain.stderr
    as_json = cli(project, "policy", "status", "--json")
    assert as_json.returncode == 1
    error = json.loads(as_json.stdout)["error"]
    assert error["exit_status"] == 1 and "redis://127.0.0.1:1/0" in error["message"]


def test_a_malformed_redis_url_names_the_setting(project: Path) -> None:
    pytest.importorskip("redis")
    with open(project / "amplifier-tools.toml", "a") as config:
        config.write('\n[plugins.policy]\nstore = "redis://127.0.0.1:notaport/0"\n')
    out = cli(project, "call", "demo_greet", '{"who": "Ada"}')
    assert out.returncode != 0
    assert "plugins.policy.store" in out.stderr and "malformed" in out.stderr


def test_an_unknown_tool_suggests_each_close_tool_once(project: Path) -> None:
    """``read_file`` suggested 'fs_read_file', 'fs_edit_file' and 'local::fs.read_file': one tool
    twice (found by a newcomer's pass)."""
    out = cli(project, "call", "read_file", "{}")
    assert out.returncode == 3
    line = out.stderr.splitlines()[0]
    assert "did you mean 'fs_read_file'" in line and "local::fs.read_file" not in line, out.stderr


def test_call_with_a_principal_or_scope_of_no_safe_shape_is_refused_without_quoting_it(project: Path) -> None:
    """``ToolContext``'s identifiers are checked (docs/contract.md, 'Identifiers'); the command names the option."""
    token = "ghp_" + "a" * 36
    principal = cli(project, "call", "demo_greet", '{"who": "Ada"}', "--principal", token)
    assert principal.returncode == 3 and "ToolContext.principal" in principal.stderr and token not in principal.stderr
    assert principal.stderr.splitlines()[-1].startswith("hint: pass --principal as a name")
    scope = cli(project, "call", "demo_greet", '{"who": "Ada"}', "--scope", "fs:read fs:write")
    assert scope.returncode == 3 and scope.stderr.splitlines()[-1].startswith("hint: pass --scope as a name")
