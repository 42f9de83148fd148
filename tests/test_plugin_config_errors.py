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
