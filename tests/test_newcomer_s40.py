"""A newcomer's first hour (session 40): what a new user ran into, each pinned by a test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli

from amplifier_tools import ToolHost
from amplifier_tools.errors import ConfigError

pytest_plugins = ["pytester"]


def run_cli(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return cli(cwd, *args, env={"XDG_STATE_HOME": str(tmp_path / "state")})


def project_with(tmp_path: Path, text: str) -> Path:
    """A working directory whose discovered, trusted ``amplifier-tools.toml`` holds ``text``."""
    work = tmp_path / "work"
    work.mkdir()
    assert run_cli(["trust"], work, tmp_path).returncode == 0  # the first start: no file
    (work / "amplifier-tools.toml").write_text(text)
    assert run_cli(["trust"], work, tmp_path).returncode == 0
    return work


# -- 1. policy status and mcp pin name the configuration file, as list does ---------------------

@pytest.mark.parametrize(("text", "words", "said"), [
    ("[plugins.policy]\nstor = 'sqlite'\n", ["policy", "status"], "plugins.policy.stor: unknown key"),
    ("[plugins.filesystem]\n", ["mcp", "pin"], "plugins.mcp.servers: no MCP server is configured"),
    ("[plugins.mcp.servers.fx]\ncommand = 'x'\n", ["mcp", "pin", "--server", "fy"],
     "plugins.mcp.servers: no MCP server 'fy' is configured"),
])
def test_a_configuration_error_of_policy_status_and_mcp_pin_names_the_file(
        tmp_path: Path, text: str, words: list[str], said: str) -> None:
    """``list`` said "<file>: plugins.policy.stor: unknown key"; ``policy status`` and ``mcp pin``
    said the key alone, so with a discovered file the user did not learn which file."""
    if words[0] == "mcp":
        pytest.importorskip("mcp")
    work = project_with(tmp_path, text)
    done = run_cli(words, work, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"error: {work / 'amplifier-tools.toml'}: {said}" in done.stderr, done.stderr


def test_policy_status_with_an_unreachable_store_names_the_file_that_configures_it(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    work = project_with(tmp_path, "[plugins.policy]\nstore = 'redis://127.0.0.1:1/0'\nstore_timeout_ms = 200\n")
    done = run_cli(["policy", "status", "--json"], work, tmp_path)
    assert done.returncode == 1, done.stderr
    hint = done.stderr.splitlines()[-1]
    assert hint.startswith("hint: check the server named by [plugins.policy] store "
                           f"({work / 'amplifier-tools.toml'});"), done.stderr
    assert json.loads(done.stdout)["error"]["hint"] == hint.removeprefix("hint: ")


def test_mcp_pin_with_a_server_that_cannot_start_names_the_file_to_fix(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    work = project_with(tmp_path, "[plugins.mcp.servers.broken]\ncommand = 'no-such-server-xyz'\n")
    done = run_cli(["mcp", "pin"], work, tmp_path)
    assert done.returncode == 1, done.stderr
    assert "MCP server 'broken' could not start" in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"hint: fix the server or its settings, [plugins.mcp.servers.broken] ({work / 'amplifier-tools.toml'}), "
        "then run the command again"), done.stderr


# -- 2. a section for a plugin module that is not mounted ---------------------------------------

async def section_hint(tmp_path: Path, name: str) -> str | None:
    with pytest.raises(ConfigError) as caught:
        await ToolHost({"plugins": {name: {}}}, working_dir=tmp_path, entry_points=False).start()
    assert caught.value.key == f"plugins.{name}"
    return caught.value.hint


MOUNT = ("a module is mounted by a [[modules]] module = \"...\" entry in the configuration, or by its "
         "distribution's entry point")


async def test_a_section_for_a_module_not_mounted_says_how_one_is_mounted(tmp_path: Path) -> None:
    """``[plugins.my_policy]`` for a module of one's own, not in ``[[modules]]``, answered "did you
    mean 'policy'?": the built-in, not the user's plugin."""
    hint = await section_hint(tmp_path, "my_policy")
    assert hint == f"no loaded plugin is named 'my_policy': {MOUNT}; or did you mean 'policy'?"
    assert await section_hint(tmp_path, "weather") == f"no loaded plugin is named 'weather': {MOUNT}"


@pytest.mark.parametrize(("name", "meant"), [("polcy", "policy"), ("filesytem", "filesystem"),
                                             ("bahs", "bash"), ("Audit", "audit")])
async def test_a_misspelled_section_keeps_its_did_you_mean(tmp_path: Path, name: str, meant: str) -> None:
    assert await section_hint(tmp_path, name) == f"did you mean {meant!r}?"


# -- a table at the top level that the configuration has no key for ------------------------------

@pytest.mark.parametrize(("text", "said"), [
    ("[filesystem]\nallowed_read_paths = ['.']\n",
     "if 'filesystem' is a plugin, its settings go in [plugins.filesystem]; else remove or rename the table"),
    ("[tool.amplifier-tools.plugins.bash]\nsandbox = 'off'\n",
     "[tool.amplifier-tools] is the table of a pyproject.toml; in a file of its own, write its keys at the top "
     "level ([tool.amplifier-tools.plugins.bash] as [plugins.bash])"),
])
def test_a_top_level_table_that_belongs_elsewhere_says_where(tmp_path: Path, text: str, said: str) -> None:
    """``[filesystem]`` (for ``[plugins.filesystem]``) was only told to be removed, and
    ``[tool.amplifier-tools]`` pasted from a pyproject.toml into amplifier-tools.toml was asked
    "did you mean 'tools'?"."""
    from amplifier_tools.config import load_config_file, validate_config

    config = tmp_path / "amplifier-tools.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config_file(config)
    assert caught.value.hint is not None and caught.value.hint.startswith(said), caught.value.hint
    # a misspelt top-level key keeps its did-you-mean, a value that is no table the keys allowed
    with pytest.raises(ConfigError, match="secret") as caught:
        validate_config({"secret": {"A": "B"}})
    assert caught.value.hint == "did you mean 'secrets'?"
    with pytest.raises(ConfigError) as caught:
        validate_config({"filesystem": 1})
    assert caught.value.hint is not None and caught.value.hint.startswith("remove or rename 'filesystem'")


# -- 3. the pytest plugin without pytest ------------------------------------------------------

def test_importing_the_pytest_plugin_without_pytest_names_the_test_extra() -> None:
    code = "import sys\nsys.modules['pytest'] = None\nimport amplifier_tools.pytest_plugin\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "ImportError: amplifier_tools.pytest_plugin needs the 'test' extra (pytest is not installed): "
        "pip install 'amplifier-tools[test]'"), done.stderr


def test_one_slip_apart_is_an_optimal_string_alignment_distance_of_at_most_one() -> None:
    import random

    from amplifier_tools.errors import one_slip_apart

    def distance(a: str, b: str) -> int:
        d = [[i + j if not i * j else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
                if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                    d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
        return d[-1][-1]

    rng = random.Random(40)
    for _ in range(20000):
        a, b = ("".join(rng.choice("abc") for _ in range(rng.randint(0, 5))) for _ in range(2))
        assert one_slip_apart(a, b) == (distance(a, b) <= 1), (a, b)
    assert one_slip_apart("Bash", "bash") and not one_slip_apart("my_policy", "policy")


# -- the pytest plugin's async tests without asyncio_mode -----------------------------------------

DOCS_EXAMPLE = '''
import pytest

pytest_plugins = ["pytester"]
from amplifier_tools.pytest_plugin import MockTool, assert_conforms

async def test_uses_the_fixture(tool_host):
    async with tool_host(MockTool(name="local::t.x", return_value=1)) as host:
        assert (await host.call("t_x", {})).success

async def test_conforms():
    await assert_conforms(MockTool(name="local::t.y"))

@pytest.mark.asyncio
async def test_marked(tool_host):
    async with tool_host() as host:
        assert host.tools is not None

async def test_of_another_project():
    pass
'''


def test_an_async_test_of_the_fixtures_without_asyncio_mode_says_what_runs_it(pytester: pytest.Pytester) -> None:
    """docs/plugins.md's example, run where ``asyncio_mode`` is not set (pytest-asyncio installed),
    failed with pytest's "async def functions are not natively supported ... install pytest-asyncio"."""
    pytest.importorskip("pytest_asyncio")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(DOCS_EXAMPLE)
    run = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:langsmith_plugin",
                             "-p", "no:amplifier_module")
    run.assert_outcomes(passed=1, failed=3)
    said = 'is async: it needs asyncio_mode = "auto" in the pytest configuration'
    text = run.stdout.str()
    assert f"test_uses_the_fixture {said}" in text and f"test_conforms {said}" in text, text
    # a test that does not use the plugin keeps pytest's own message: the plugin is loaded in every project
    assert "test_of_another_project is async" not in text and "not natively supported" in text, text
