"""What a newcomer meets following README.md and docs/*.md literally, where the library was at fault.

Each test is a step of such a pass that did not do what the docs say (the doc fixes themselves are
checked by tests/test_docs_snippets.py, which runs the examples).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import PACKAGE_ROOT, cli, cli_environ

from amplifier_tools import PluginLoadError, ToolHost
from amplifier_tools.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_plugin_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "AMPLIFIER_TOOLS_LOAD_PLUGINS", "AMPLIFIER_TOOLS_CONFIG"):
        monkeypatch.delenv(env, raising=False)


async def test_a_misspelled_section_that_switches_a_plugin_off_stops_the_start(tmp_path: Path) -> None:
    """docs/builtins.md: ``[plugins.name] enabled = false`` turns a plugin off, like
    ``disable_plugins``; configuration.md: a name in ``disable_plugins`` close to a plugin's stops
    the start, "since a typo there leaves the plugin running". ``[plugins.bsh] enabled = false``
    (or ``[plugins.my_policy]`` for the entry point ``my-policy``) was taken without a word, and
    the plugin meant went on running."""
    config = tmp_path / "amplifier-tools.toml"
    config.write_text("[plugins.bsh]\nenabled = false\n")
    host = ToolHost(config, builtins=["bash"], working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    assert info.value.key == "plugins.bsh" and info.value.file == str(config)
    assert "names no installed plugin, so there is none to disable" in str(info.value)
    assert info.value.hint == "did you mean 'bash'?"
    assert host.plugins == []


async def test_switching_off_a_plugin_not_installed_here_is_still_no_error(tmp_path: Path) -> None:
    """As with ``disable_plugins``: a name close to no plugin is an optional one absent here."""
    config = {"plugins": {"http-fetch-extra": {"enabled": False}, "bash": {"enabled": False}}}
    async with ToolHost(config, builtins=["bash", "filesystem"], working_dir=tmp_path) as host:
        names = {p.name for p in host.plugins}
    assert "filesystem" in names and "bash" not in names


def test_validate_of_a_module_beside_the_user_says_why_it_is_not_found(tmp_path: Path) -> None:
    """plugins.md/cli.md: write a module, ``amplifier-tools validate TARGET``. The console script
    does not import from the current directory (docs/cli.md, ``list``), so ``validate demo_tools``
    next to ``demo_tools.py`` said "No module named 'demo_tools'", and its hint only repeated what
    a TARGET may be: nothing said to run ``python -m amplifier_tools`` there or set PYTHONPATH."""
    (tmp_path / "demo_tools.py").write_text("from amplifier_tools import tool\n\n"
                                            "@tool(name='local::demo.greet', effect='Pure')\n"
                                            "def greet(who: str) -> str:\n    '''Greet.'''\n"
                                            "    return 'hi ' + who\n")
    # As the console script runs: the current directory is not on sys.path.
    script = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
              "from amplifier_tools.cli import main; raise SystemExit(main(sys.argv[1:]))")
    environ = cli_environ(tmp_path)
    environ["PYTHONPATH"] = str(PACKAGE_ROOT)
    done = subprocess.run([sys.executable, "-c", script, "validate", "demo_tools:greet"], cwd=tmp_path,
                          env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "No module named 'demo_tools'" in done.stdout
    assert done.stderr == ("hint: 'demo_tools' is in the current directory, which amplifier-tools does not import "
                           "from: run 'PYTHONPATH=. amplifier-tools validate demo_tools:greet' here (for a module "
                           "of your own: a module a tool wrote there would be imported too)\n")
    # What the hint says works.
    ok = cli(tmp_path, "validate", "demo_tools:greet")
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.parametrize(("target", "hint"), [
    ("demo_tools.py", "hint: TARGET is an import path, not a file: run 'PYTHONPATH=. amplifier-tools validate "
                      "demo_tools' (or demo_tools:NAME for one of its tools)\n"),
    ("amplifier-tools.toml", "hint: TARGET is a module or plugin, not a file: a configuration file is checked by "
                             "every command that loads it ('amplifier-tools --config amplifier-tools.toml list'), "
                             "and a plugin it configures by 'amplifier-tools --config amplifier-tools.toml "
                             "validate PLUGIN'\n"),
])
def test_validate_of_a_file_says_target_is_no_file(tmp_path: Path, target: str, hint: str) -> None:
    """``amplifier-tools validate demo_tools.py`` (the file just written) was told to run
    ``PYTHONPATH=. amplifier-tools validate demo_tools.py``, which then failed with "demo_tools.py was
    found, and loading it raised"; ``validate amplifier-tools.toml`` was told only what a TARGET may be."""
    (tmp_path / "demo_tools.py").write_text("from amplifier_tools import tool\n\n"
                                            "@tool(name='local::demo.greet', effect='Pure')\n"
                                            "def greet(who: str) -> str:\n    '''Greet.'''\n"
                                            "    return 'hi ' + who\n")
    (tmp_path / "amplifier-tools.toml").write_text("[context]\nprincipal = 'me'\n")
    done = cli(tmp_path, "validate", target)
    assert done.returncode == 1 and "FAIL  importable" in done.stdout, done.stdout + done.stderr
    assert done.stderr.endswith(hint), done.stderr
    if target.endswith(".py"):  # what the hint says works
        ok = cli(tmp_path, "validate", "demo_tools:greet")
        assert ok.returncode == 0, ok.stdout + ok.stderr


async def test_a_module_of_tools_named_in_modules_says_how_to_mount_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of ``@tool`` functions named in ``[[modules]]`` (the example configuration's "Seed-style
    modules to mount") stops the start: it has no ``mount``. The hint was the generic "fix or
    uninstall the plugin, or skip it", for a module the user had just written."""
    (tmp_path / "newcomer_tools.py").write_text("from amplifier_tools import tool\n\n"
                                                "@tool(name='local::demo.greet', effect='Pure')\n"
                                                "def greet(who: str) -> str:\n    '''Greet.'''\n"
                                                "    return 'hi ' + who\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "newcomer_tools", raising=False)
    host = ToolHost({"modules": [{"module": "newcomer_tools"}]}, builtins=False, working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    assert "module has no callable 'mount(coordinator, config)'" in str(info.value)
    assert info.value.hint is not None and "it holds tools (greet)" in info.value.hint
    assert "coordinator.mount(\"tools\", greet)" in info.value.hint
    sys.modules.pop("newcomer_tools", None)


async def test_a_module_attribute_named_in_modules_says_modules_takes_a_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[[modules]] module = "newcomer_tools2:greet"`` (the ``module:Attribute`` form ``validate``
    takes) was "not importable: install it, or put its directory on PYTHONPATH", with the module's
    directory on ``sys.path``: the import was of a module named ``newcomer_tools2:greet``."""
    (tmp_path / "newcomer_tools2.py").write_text("from amplifier_tools import tool\n\n"
                                                 "@tool(name='local::demo.greet', effect='Pure')\n"
                                                 "def greet(who: str) -> str:\n    '''Greet.'''\n"
                                                 "    return 'hi ' + who\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    host = ToolHost({"modules": [{"module": "newcomer_tools2:greet"}]}, builtins=False, working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    assert "names a module (or an amplifier.modules entry point), not a module's attribute ('greet')" in str(
        info.value)
    assert info.value.hint is not None and info.value.hint.startswith("write module = 'newcomer_tools2'")
    assert not isinstance(info.value.__cause__, ModuleNotFoundError)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (PEP 678) are Python 3.11+")
async def test_a_python_traceback_of_a_config_error_shows_its_hint(tmp_path: Path) -> None:
    """The command line prints a ``ConfigError``'s hint line; a Python user of ``ToolHost`` saw only
    the message in the traceback (and pytest's report), never what to do. The hint is now a note."""
    import traceback

    config = tmp_path / "amplifier-tools.toml"
    config.write_text("[plugins.bsh]\nenabled = false\n")
    host = ToolHost(config, builtins=["bash"], working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    assert "hint: did you mean 'bash'?" in "".join(traceback.format_exception(info.value))

    # A plugin's own settings error reaches the caller as the plugin's load error, caused by it.
    config.write_text("[plugins.bash]\ndefault_timeot = 5\n")
    host = ToolHost(config, builtins=["bash"], working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as loaded:
        await host.start()
    assert "hint: did you mean 'default_timeout'?" in "".join(traceback.format_exception(loaded.value))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (PEP 678) are Python 3.11+")
def test_a_plugin_load_error_traceback_shows_its_hint() -> None:
    import traceback

    error = PluginLoadError("demo", "cannot import it", hint="pip install demo")
    assert "hint: pip install demo" in "".join(traceback.format_exception(error))
    assert "hint:" not in "".join(traceback.format_exception(PluginLoadError("demo", "no hint")))


def test_an_unset_variable_in_the_config_names_what_to_set(tmp_path: Path) -> None:
    """configuration.md: "an unset variable is an error". Its hint was the generic "fix the
    configuration", leaving open whether the file or the shell was wrong."""
    config = tmp_path / "amplifier-tools.toml"
    config.write_text('state_dir = "${AMPLIFIER_TOOLS_TEST_UNSET}/state"\n')
    done = cli(tmp_path, "--config", str(config), "list")  # no AMPLIFIER_TOOLS_* variable is passed on
    assert done.returncode == 2, done
    assert "state_dir: environment variable ${AMPLIFIER_TOOLS_TEST_UNSET} is not set" in done.stderr
    assert "hint: export AMPLIFIER_TOOLS_TEST_UNSET=... in the host's environment" in done.stderr
