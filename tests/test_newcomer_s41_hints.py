"""A newcomer's first hour (session 41), did-you-means and hints: what a new user ran into, each
pinned by a test."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli

from amplifier_tools import ToolHost
from amplifier_tools.conformance import check_target

pytest_plugins = ["pytester"]


# -- 1. an argument the input schema does not allow names the closest one it does ----------------

async def test_a_misspelt_argument_gets_a_did_you_mean(tmp_path: Path) -> None:
    """Found by a newcomer's trial: ``{"path": "README.md", "limt": 3}`` said only "/limt: is not an
    allowed property", the model and the user left to guess which one is."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("one\ntwo\nthree\nfour\n")
    async with ToolHost(builtins=["filesystem"], entry_points=False, discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state")}) as host:
        result = await host.call("fs_read_file", {"path": "README.md", "limt": 3, "qqqq": 1})
    assert result.error is not None
    assert result.error["code"] == "invalid_input" and result.error["pointer"] == "/limt"
    assert result.error["message"].endswith(
        ": /limt: is not an allowed property (did you mean 'limit'?); /qqqq: is not an allowed property")


def test_the_command_line_call_says_it_too(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("one\n")
    done = cli(work, "call", "fs_read_file", '{"path": "README.md", "limt": 3}',
               env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 3, done.stderr
    assert "/limt: is not an allowed property (did you mean 'limit'?)\n" in done.stderr


# -- 2. validate: a misspelt built-in plugin or entry point ----------------------------------------

@pytest.mark.parametrize(("target", "meant"), [("polcy", "policy"), ("filesytem", "filesystem"),
                                               ("amplifer-tools", "amplifier-tools")])
def test_validate_a_misspelt_builtin_gets_a_did_you_mean(target: str, meant: str) -> None:
    """Found by a newcomer's trial: ``validate polcy`` said "No module named 'polcy' (nor is it the name
    of an installed entry point or distribution)", naming neither the built-in nor what was close."""
    report = check_target(target)
    assert [(c.name, c.passed) for c in report.checks] == [("importable", False)]
    assert report.checks[0].message == (
        f"ModuleNotFoundError: No module named {target!r} (nor is it the name of a built-in plugin, an installed "
        f"entry point or distribution; did you mean {meant!r}?)")


def test_validate_a_misspelt_entry_point_names_the_installed_one(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``validate my-plicy`` with the entry point ``my-policy`` installed: that one, not the built-in
    ``policy``; a name close to nothing gets no guess."""
    info = tmp_path / "my_policy-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policy\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[amplifier_tools]\nmy-policy = my_policy_module:Plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert check_target("my-plicy").checks[0].message.endswith("distribution; did you mean 'my-policy'?)")
    assert check_target("zzqqxx").checks[0].message.endswith("entry point or distribution)")


# -- 3. a PluginLoadError in a pytest test shows the hint of the ConfigError it wraps --------------

PLUGIN_TEST = '''
from amplifier_tools import ConfigError, hookimpl


class NeedsPrefix:
    name = "needs-prefix"

    @hookimpl
    async def mount(self, coordinator, config):
        raise ConfigError("must be a string", key="plugins.needs-prefix.prefix",
                          hint="set prefix in [plugins.needs-prefix]")


async def test_mounts(tool_host):
    async with tool_host(NeedsPrefix()):
        pass
'''


def test_a_plugin_load_error_in_a_test_shows_its_hint(pytester: pytest.Pytester) -> None:
    """Found by a newcomer's trial: a plugin refusing its configuration failed the ``tool_host`` test
    with a PluginLoadError whose line said no hint (its ``hint`` was None), where the ConfigError it
    wraps has one; with ``--tb=short`` the wrapped error is not shown at all. On Python 3.10, which
    has no ``add_note``, no error showed its hint."""
    pytest.importorskip("pytest_asyncio")
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(PLUGIN_TEST)
    run = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:langsmith_plugin",
                             "-p", "no:amplifier_module", "--tb=short")
    run.assert_outcomes(failed=1)
    text = run.stdout.str()
    assert "E   amplifier_tools.errors.PluginLoadError: plugin 'needs-prefix': failed to mount: ConfigError: " \
           "plugins.needs-prefix.prefix: must be a string\nE   hint: set prefix in [plugins.needs-prefix]" in text, text
