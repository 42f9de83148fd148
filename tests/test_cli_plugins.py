"""The command line against third-party plugins discovered through entry points.

Each test builds a throwaway "site" directory holding plugin modules and the
``*.dist-info`` metadata that ``importlib.metadata`` reads, and puts it on
``PYTHONPATH`` of the subprocess: the plugins are discovered exactly as if they
were installed, without installing anything into the test environment.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from cli_helpers import EXAMPLE_PLUGIN_NAMES, cli

import amplifier_tools

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# The repository's plugins/ beside tests/ (not beside the package: under tox the package is installed
# in site-packages, and a path relative to it would find nothing and skip the test for good).
EXAMPLE_PLUGINS = Path(__file__).resolve().parent.parent / "plugins"

FIXTURE_PLUGINS = '''
from amplifier_tools import ConfigError, Deny, ToolResult, ToolSpec, hookimpl


class Echo:
    spec = ToolSpec(
        name="local::fixture.echo", version="2.0.0", description="Echo the text after a configured prefix.",
        effect="Pure",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                      "required": ["text"], "additionalProperties": False},
        output_schema={"type": "string"},
        examples=[{"input": {"text": "hi"}, "output": "> hi"}],
    )
    name, description = spec.name, spec.description

    def __init__(self, prefix):
        self.prefix = prefix

    async def execute(self, input):
        return ToolResult(output=self.prefix + input["text"])


class EchoPlugin:
    """A class-style tool plugin that needs its config section: [plugins.fixture-echo] prefix."""

    name = "fixture-echo"

    @hookimpl
    async def mount(self, coordinator, config):
        prefix = config.get("prefix")
        if not isinstance(prefix, str):
            raise ConfigError("must be a string", key="plugins.fixture-echo.prefix")
        await coordinator.mount("tools", Echo(prefix))


class GuardPlugin:
    """A class-style policy plugin: reads the principal and scopes of the call's context."""

    name = "fixture-guard"

    @hookimpl
    def tool_pre(self, call, spec, context):
        if context.principal == "mallory":
            return Deny("mallory may not call tools", code="banned")
        if call.arguments.get("text") == "secret" and "fixture:admin" not in context.scopes:
            return Deny(f"{context.principal!r} needs scope fixture:admin for secrets", code="needs_admin")
        context.record("fixture-guard", "tool_pre", "allow",
                       f"principal={context.principal} scopes={','.join(sorted(context.scopes))}")
        return None
'''


def _dist_info(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> None:
    """Metadata of an installed distribution, as an installer would write it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, points in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{ep} = {target}" for ep, target in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text("")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """Two fixture distributions: one with a tool plugin and a policy plugin, one whose plugin cannot import."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fixture_plugins.py").write_text(FIXTURE_PLUGINS)
    _dist_info(site, "amplifier-tools-fixture", "0.3.1", {"amplifier_tools": {
        "fixture-echo": "fixture_plugins:EchoPlugin", "fixture-guard": "fixture_plugins:GuardPlugin"}})
    _dist_info(site, "amplifier-tools-broken", "9.9.9", {"amplifier_tools": {
        "fixture-broken": "fixture_no_such_module:Plugin"}})
    return site


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "amplifier-tools.toml").write_text(textwrap.dedent('''
        [plugins.fixture-echo]
        prefix = "> "
    '''))
    return project


def test_plugins_text_lists_hooks_distributions_and_failures(site: Path, project: Path) -> None:
    out = cli(project, "plugins", site=site)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert rows[0] == ["PLUGIN", "SOURCE", "DISTRIBUTION", "HOOKS"]
    assert ["filesystem", "builtin", "amplifier-tools", amplifier_tools.__version__, "mount,", "tool_pre,",
            "tool_rewritten"] in rows
    by_name = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert by_name["fixture-echo"].split() == ["fixture-echo", "entry_point", "amplifier-tools-fixture", "0.3.1",
                                               "mount"]
    assert by_name["fixture-guard"].split() == ["fixture-guard", "entry_point", "amplifier-tools-fixture",
                                                "0.3.1", "tool_pre"]
    broken = by_name["fixture-broken"]
    assert broken.split()[:3] == ["fixture-broken", "entry_point", "FAILED"]
    assert "failed to load: ModuleNotFoundError: No module named 'fixture_no_such_module'" in broken
    # A plugin that fails to load is not required: a warning, and the other plugins still run.
    assert "plugin 'fixture-broken' failed to load" in out.stderr


def test_a_broken_plugins_warning_says_how_to_silence_it(site: Path, project: Path) -> None:
    """Found by a newcomer's trial: the warning came at every command ("continuing without it")
    without saying how to stop it. Both ways it names do."""
    out = cli(project, "list", site=site)
    assert out.returncode == 0, out.stderr
    assert ("No module named 'fixture_no_such_module'; continuing without it (fix or uninstall it, or skip it: "
            "AMPLIFIER_TOOLS_DISABLE_PLUGINS=fixture-broken, or disable_plugins = ['fixture-broken'] in the "
            "configuration)") in out.stderr
    disabled = cli(project, "list", site=site,
                   env={"AMPLIFIER_TOOLS_DISABLE_PLUGINS": f"{EXAMPLE_PLUGIN_NAMES},fixture-broken"})
    assert disabled.returncode == 0 and "fixture-broken" not in disabled.stderr, disabled.stderr
    config = project.parent / "elsewhere.toml"
    config.write_text("disable_plugins = ['fixture-broken']\n[plugins.fixture-echo]\nprefix = '> '\n")
    configured = cli(project, "--config", str(config), "list", site=site)
    assert configured.returncode == 0 and "fixture-broken" not in configured.stderr, configured.stderr


def test_plugins_json(site: Path, project: Path) -> None:
    out = cli(project, "plugins", "--json", site=site)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    loaded = {p["name"]: p for p in data["loaded"]}
    assert loaded["fixture-guard"] == {"name": "fixture-guard", "source": "entry_point",
                                       "distribution": "amplifier-tools-fixture", "version": "0.3.1",
                                       "hooks": ["tool_pre"]}
    assert loaded["policy"]["distribution"] == "amplifier-tools" and "tool_pre" in loaded["policy"]["hooks"]
    assert [f["name"] for f in data["failed"]] == ["fixture-broken"]
    assert data["failed"][0]["source"] == "entry_point"
    assert "No module named 'fixture_no_such_module'" in data["failed"][0]["reason"]


def test_list_shows_the_plugin_distribution(site: Path, project: Path) -> None:
    rows = {r["name"]: r for r in json.loads(cli(project, "list", "--json", site=site).stdout)}
    assert rows["local::fixture.echo"] == {
        "name": "local::fixture.echo", "model_name": "fixture_echo", "version": "2.0.0", "effect": "Pure",
        "plugin": "fixture-echo", "distribution": "amplifier-tools-fixture", "distribution_version": "0.3.1"}
    text = cli(project, "list", site=site).stdout.splitlines()
    assert ["local::fixture.echo", "2.0.0", "Pure", "fixture-echo", "amplifier-tools-fixture", "0.3.1"] in [
        line.split() for line in text]
    version = cli(project, "--version", site=site).stdout
    assert "  fixture-echo 0.3.1 (amplifier-tools-fixture)" in version.splitlines()


def test_call_principal_and_scopes_reach_a_plugin(site: Path, project: Path) -> None:
    shutil.rmtree(next(site.glob("amplifier_tools_broken-*.dist-info")))  # no load warning on stderr
    ok = cli(project, "call", "fixture_echo", '{"text": "hi"}', site=site)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "> hi\n", "")

    trail = json.loads(cli(project, "call", "fixture_echo", '{"text": "hi"}', "--json", "--principal", "ada",
                           "--scope", "b", "--scope", "a", site=site).stdout)["metadata"]["trail"]
    assert {"plugin": "fixture-guard", "hook": "tool_pre", "action": "allow",
            "reason": "principal=ada scopes=a,b"}.items() <= trail[0].items()

    denied = cli(project, "call", "fixture_echo", '{"text": "secret"}', "--principal", "ada", site=site)
    assert denied.returncode == 4 and denied.stdout == ""
    assert denied.stderr.splitlines() == [
        "PolicyError[needs_admin]: denied by plugin 'fixture-guard': 'ada' needs scope fixture:admin for secrets",
        "hint: denied by plugin 'fixture-guard'; 'amplifier-tools describe fixture_echo' shows the tool's "
        "scopes and policies",
    ]
    granted = cli(project, "call", "fixture_echo", '{"text": "secret"}', "--principal", "ada",
                  "--scope", "fixture:admin", site=site)
    assert (granted.returncode, granted.stdout) == (0, "> secret\n")

    banned = cli(project, "call", "fixture_echo", '{"text": "hi"}', "--principal", "mallory",
                 "--scope", "fixture:admin", site=site)
    assert banned.returncode == 4 and "PolicyError[banned]" in banned.stderr


def test_a_required_plugin_missing_its_config_names_the_key(site: Path, project: Path) -> None:
    (project / "amplifier-tools.toml").write_text('[plugins.fixture-echo]\nprefix = 3\n')
    out = cli(project, "list", site=site)
    assert out.returncode == 2
    error, hint = out.stderr.splitlines()[-2:]
    assert error.startswith("error: plugin 'fixture-echo': failed to mount: ConfigError: ")
    assert error.endswith("plugins.fixture-echo.prefix: must be a string")
    assert hint == (f"hint: set plugins.fixture-echo.prefix in the configuration "
                    f"({project / 'amplifier-tools.toml'}), or skip the plugin with "
                    "AMPLIFIER_TOOLS_DISABLE_PLUGINS=fixture-echo; run with --verbose for the traceback")


# -- validate ------------------------------------------------------------------------------------


def test_validate_a_class_style_entry_point(site: Path, project: Path) -> None:
    out = cli(project, "validate", "fixture-echo", site=site)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "conformance of fixture-echo:",
        "  PASS  importable: entry point 'fixture-echo' = 'fixture_plugins:EchoPlugin' "
        "(amplifier_tools, distribution amplifier-tools-fixture 0.3.1)",
        "  PASS  hook implementations",
        "  PASS  mounts on a fresh host: 1 tool(s) with its config section",
        "  PASS  local::fixture.echo: contract: version 2.0.0, effect Pure",
        "  PASS  local::fixture.echo: description",
        "  PASS  local::fixture.echo: effect vs policies",
        "  PASS  local::fixture.echo: example 1: valid; ran",
        "  PASS  local::fixture.echo: name free beside the built-ins",
        "OK",
    ]


def test_validate_without_the_config_names_the_missing_key(site: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    out = cli(bare, "validate", "fixture-echo", "--json", site=site)
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False and report["config"] is None
    failed = [c for c in report["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["mounts on a fresh host"]
    assert "the plugin needs config key 'plugins.fixture-echo.prefix', and no [plugins.fixture-echo] section " \
           "was found" in failed[0]["message"]
    assert out.stderr == "hint: pass a config with the plugin's section: --config FILE\n"
    # The same config as every other command: --config supplies the section.
    (tmp_path / "elsewhere.toml").write_text('[plugins.fixture-echo]\nprefix = "> "\n')
    passed = cli(bare, "--config", str(tmp_path / "elsewhere.toml"), "validate", "fixture-echo", site=site)
    assert passed.returncode == 0, passed.stdout


def test_validate_a_distribution_checks_each_entry_point(site: Path, project: Path) -> None:
    out = cli(project, "validate", "amplifier-tools-fixture", "--json", site=site)
    assert out.returncode == 0, out.stdout
    names = [c["name"] for c in json.loads(out.stdout)["checks"]]
    assert "fixture-echo: importable" in names and "fixture-guard: importable" in names
    assert "fixture-guard: mounts on a fresh host" in names
    broken = cli(project, "validate", "amplifier-tools-broken", site=site)
    assert broken.returncode == 1
    assert "FAIL  importable: entry point 'fixture-broken' = 'fixture_no_such_module:Plugin' (amplifier_tools, " \
           "distribution amplifier-tools-broken 9.9.9): ModuleNotFoundError: No module named " \
           "'fixture_no_such_module'" in broken.stdout
    assert broken.stderr == "hint: each FAIL line says what to fix\n"


def test_validate_module_colon_class(tmp_path: Path) -> None:
    """``module:Class`` on PYTHONPATH, no entry point: the class is instantiated as the host would."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "fixture_plugins.py").write_text(FIXTURE_PLUGINS)
    no_config = cli(work, "validate", "fixture_plugins:EchoPlugin")
    assert no_config.returncode == 1
    assert "FAIL  mounts on a fresh host: plugin 'fixture-echo': failed to mount: ConfigError: " \
           "plugins.fixture-echo.prefix: must be a string" in no_config.stdout
    assert "needs config key 'plugins.fixture-echo.prefix'" in no_config.stdout
    (work / "amplifier-tools.toml").write_text('[plugins.fixture-echo]\nprefix = "> "\n')
    ok = cli(work, "validate", "fixture_plugins:EchoPlugin")
    assert ok.returncode == 0, ok.stdout
    assert "  PASS  importable: object fixture_plugins:EchoPlugin" in ok.stdout
    assert "  PASS  local::fixture.echo: example 1: valid; ran" in ok.stdout
    guard = cli(work, "validate", "fixture_plugins:GuardPlugin")
    assert guard.returncode == 0 and "PASS  mounts on a fresh host: 0 tool(s)" in guard.stdout


# -- the repository's own example plugins -------------------------------------------------------


def _example_site(tmp_path: Path, *directories: str) -> Path:
    """The example plugins as if installed: their package and dist-info built from their pyproject.toml."""
    site = tmp_path / "examples-site"
    site.mkdir()
    for directory in directories:
        root = EXAMPLE_PLUGINS / directory
        assert (root / "pyproject.toml").is_file(), f"example plugin {directory} is missing from {EXAMPLE_PLUGINS}"
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
        for package in tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]:
            shutil.copytree(root / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
        _dist_info(site, project["name"], project["version"], project["entry-points"])
    return site


def test_validate_the_example_plugins(tmp_path: Path) -> None:
    site = _example_site(tmp_path, "amplifier-tools-approval", "amplifier-tools-http-fetch")
    work = tmp_path / "work"
    work.mkdir()
    for target, key in (("amplifier-tools-approval", "plugins.approval.approvers"),
                        ("http-fetch", "plugins.http-fetch.allowed_hosts")):
        out = cli(work, "validate", target, site=site, examples=True)
        assert out.returncode == 1, out.stdout
        assert "missing 1 required positional argument" not in out.stdout
        assert f"needs config key '{key}'" in out.stdout
    (work / "amplifier-tools.toml").write_text(textwrap.dedent('''
        [plugins.approval]
        approvers = ["alice"]
        [plugins.http-fetch]
        allowed_hosts = ["127.0.0.1"]
    '''))
    approval = cli(work, "validate", "amplifier-tools-approval", site=site, examples=True)
    assert approval.returncode == 0, approval.stdout
    assert "PASS  mounts on a fresh host: 0 tool(s) with its config section" in approval.stdout
    # --no-run: the plugin's first example fetches from a server on 127.0.0.1 that the test does not start.
    fetch = cli(work, "validate", "http-fetch", "--no-run", site=site, examples=True)
    assert fetch.returncode == 0, fetch.stdout
    assert "PASS  mounts on a fresh host: 1 tool(s) with its config section" in fetch.stdout


# -- validate of the built-ins ------------------------------------------------------------------


@pytest.mark.parametrize("target", ["policy", "audit", "amplifier_tools.builtins.policy:PolicyPlugin"])
def test_validate_accepts_a_built_in_plugin_by_name(tmp_path: Path, target: str) -> None:
    out = cli(tmp_path, "validate", target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  mounts on a fresh host: 0 tool(s)" in out.stdout
    if "." not in target:
        assert f"PASS  importable: built-in plugin {target!r}" in out.stdout


def test_validate_of_the_distribution_checks_every_built_in(tmp_path: Path) -> None:
    """``amplifier-tools`` has no entry points of its own: its plugins are built in, and every one of
    them passes (their examples run in a workspace holding the files they name)."""
    out = cli(tmp_path, "validate", "amplifier-tools", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ok"], [c for c in report["checks"] if not c["passed"]]
    checks = report["checks"]
    ran = [c["name"] for c in checks if c["message"] == "valid; ran"]
    assert {"local::fs.read_file: example 1", "local::fs.grep: example 1", "local::fs.glob: example 1"} <= set(ran)
    mounted = {c["name"].split(":")[0] for c in checks if c["name"].endswith("mounts on a fresh host")}
    assert mounted >= {"filesystem", "bash", "policy", "audit"}


def test_validate_leaves_nothing_in_the_users_state_directory(tmp_path: Path) -> None:
    """Found by a newcomer: each "mounts on a fresh host" check left an empty workspace directory
    under ~/.local/state/amplifier-tools/workspaces (five for ``validate amplifier-tools``)."""
    state_home = tmp_path / "xdg-state"
    state_home.mkdir()
    (tmp_path / "work").mkdir()
    out = cli(tmp_path / "work", "validate", "amplifier-tools", env={"XDG_STATE_HOME": str(state_home)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert [str(p.relative_to(state_home)) for p in state_home.rglob("*")] == []


def test_validate_runs_examples_in_a_workspace_holding_their_files() -> None:
    import os
    from typing import Any

    from amplifier_tools import ToolResult, ToolSpec, hookimpl
    from amplifier_tools.conformance import check_target

    class Head:
        spec = ToolSpec(name="local::demo.head", version="1.0.0", description="First line of a file.", effect="Pure",
                        input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
                        examples=[{"input": {"path": "notes/a.txt"}, "output": "first",
                                   "files": {"notes/a.txt": "first\nsecond\n"}}])
        name, description = spec.name, spec.description

        def __init__(self, working_dir: str) -> None:
            self.working_dir = working_dir

        async def execute(self, input: dict[str, str]) -> ToolResult:
            with open(os.path.join(self.working_dir, input["path"])) as handle:
                return ToolResult(output=handle.readline().strip())

    class HeadPlugin:
        name = "demo-head"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", Head(coordinator.get_capability("session.working_dir")))

    report = check_target(HeadPlugin())
    assert report.ok, report.render()
    assert "local::demo.head: example 1: valid; ran" in report.render()


def test_example_files_must_stay_inside_the_workspace() -> None:
    from amplifier_tools import ToolSpec

    with pytest.raises((ValueError, TypeError), match="relative path inside the workspace"):
        ToolSpec(name="local::demo.x", version="1.0.0", description="x", input_schema={"type": "object"},
                 examples=[{"input": {}, "files": {"../escape.txt": "x"}}])


def test_validate_reports_a_tool_named_like_a_built_in() -> None:
    """Amplifier's tool-bash next to the built-in bash: validate must not say OK."""
    from amplifier_tools import ToolResult
    from amplifier_tools.conformance import check_target

    class OtherBash:
        name = "bash"
        description = "Run a shell command (someone else's)."
        input_schema = {"type": "object", "properties": {"command": {"type": "string"}}}

        async def execute(self, input: dict[str, str]) -> ToolResult:
            return ToolResult(output="")

    report = check_target(OtherBash())
    clash = next(c for c in report.checks if c.name.endswith("name free beside the built-ins"))
    assert not clash.passed and not report.ok
    assert "collides with built-in tool 'local::bash' of plugin 'bash'" in clash.message
    assert "disable_plugins = ['bash']" in clash.message
