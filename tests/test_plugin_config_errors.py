"""A plugin that refuses its configuration stops the host, naming the key and the file.

An installed policy plugin that silently dropped out for want of config would
fail open; an operator must configure it or disable it explicitly.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import PluginLoadError, ToolHost
from amplifier_tools.errors import ConfigError

GATE_SOURCE = '''
from amplifier_tools import hookimpl
from amplifier_tools.errors import ConfigError

class Gate:
    name = "gate"

    @hookimpl
    def mount(self, coordinator, config):
        if "approvers" not in config:
            raise ConfigError("required: the list of approvers", key="plugins.gate.approvers")
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "amplifier-tools-gate"
version = "0.1.0"

[project.entry-points.amplifier_tools]
gate = "gate_plugin:Gate"

[tool.setuptools]
py-modules = ["gate_plugin"]
'''


@pytest.fixture(scope="module")
def gate_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("gate-src")
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (src / "gate_plugin.py").write_text(GATE_SOURCE)
    site = tmp_path_factory.mktemp("gate-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True)
    return site


@pytest.fixture
def with_gate(gate_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(gate_site))
    importlib.invalidate_caches()
    for env in ("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "AMPLIFIER_TOOLS_LOAD_PLUGINS"):
        monkeypatch.delenv(env, raising=False)
    yield gate_site
    sys.modules.pop("gate_plugin", None)


async def test_installed_plugin_missing_its_config_stops_the_host_naming_key_and_file(
        with_gate: Path, tmp_path: Path) -> None:
    config = tmp_path / "amplifier-tools.toml"
    config.write_text("[plugins.audit]\nfsync = 'never'\n")
    host = ToolHost(config, builtins=["audit"], working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    message = str(info.value)
    assert "plugin 'gate'" in message and "plugins.gate.approvers" in message and str(config) in message


async def test_configured_or_disabled_gate_lets_the_host_start(with_gate: Path, tmp_path: Path) -> None:
    async with ToolHost({"plugins": {"gate": {"approvers": ["ops"]}}}, builtins=False, working_dir=tmp_path) as host:
        assert "gate" in {p.name for p in host.plugins}
    async with ToolHost({"disable_plugins": ["gate"]}, builtins=False, working_dir=tmp_path) as host:
        assert "gate" not in {p.name for p in host.plugins}


async def test_bad_per_tool_override_names_the_field_and_file_not_a_plugin(tmp_path: Path) -> None:
    config = tmp_path / "amplifier-tools.toml"
    config.write_text('[tools."local::fs.read_file".policies.rate_limit]\nlimit = -1\n')
    host = ToolHost(config, builtins=["filesystem"], entry_points=False, working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    message = str(info.value)
    assert message.startswith(f"{config}: tools.local::fs.read_file"), message
    assert "policies.rate_limit.limit" in message and "plugin" not in message


@pytest.mark.parametrize(("where", "value", "meant"), [
    ("config", {"disable_plugins": ["bsh"]}, "bash"),
    ("env", "AMPLIFIER_TOOLS_DISABLE_PLUGINS", "gate"),
    ("config", {"load_plugins": ["gat"]}, "gate"),
    ("config", {"load_plugins": ["nosuch-plugin"]}, None),
])
async def test_a_misspelled_plugin_name_stops_the_host_naming_the_key_and_the_plugin_meant(
        with_gate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, value: Any,
        meant: str | None) -> None:
    """``disable_plugins = ["bsh"]`` was ignored without a word and left bash running (found by a
    newcomer's pass); a name in ``load_plugins`` that no plugin has loaded nothing, silently."""
    config: dict[str, Any] = {"plugins": {"gate": {"approvers": ["ops"]}}}
    if where == "env":
        monkeypatch.setenv(value, "gat")
        key = value
    else:
        config.update(value)
        key = next(iter(value))
    host = ToolHost(config, builtins=["bash"], working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    assert info.value.key == key and "names no installed plugin" in str(info.value)
    assert info.value.hint == (f"did you mean {meant!r}?" if meant else
                               "amplifier-tools plugins lists what is installed")
    assert host.plugins == []


async def test_disabling_a_plugin_not_installed_here_is_no_error(with_gate: Path, tmp_path: Path) -> None:
    """A name close to no installed plugin is an optional plugin absent from this machine."""
    config = {"plugins": {"gate": {"approvers": ["ops"]}}, "disable_plugins": ["http-fetch-extra"]}
    async with ToolHost(config, builtins=["bash"], working_dir=tmp_path) as host:
        assert {p.name for p in host.plugins} >= {"bash", "gate"}


def test_did_you_mean_answers_as_difflib_and_imports_it_only_for_a_close_name() -> None:
    """The letters-in-common bound spares the ``difflib`` import for names close to nothing (the
    start-up of ``list`` with an absent plugin disabled), and never changes the answer."""
    import difflib
    import random

    from amplifier_tools.errors import did_you_mean

    rng = random.Random(16)
    for _ in range(5000):
        name = "".join(rng.choice("abcde-") for _ in range(rng.randint(0, 8)))
        names = ["".join(rng.choice("abcdef") for _ in range(rng.randint(1, 7))) for _ in range(5)]
        close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
        assert did_you_mean(name, names) == (f"did you mean {close[0]!r}?" if close else None), (name, names)
    code = ("import sys\nfrom amplifier_tools.errors import did_you_mean\n"
            "assert did_you_mean('approval', ['bash', 'audit', 'filesystem', 'policy', 'mcp']) is None\n"
            "print('difflib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
