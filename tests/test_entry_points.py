"""Third-party plugins and seed-style modules installed as real distributions."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import PluginLoadError, ToolHost, amplifier_module
from amplifier_tools.pytest_plugin import HookRecorder as Recorder

PLUGIN_SOURCE = '''
"""A third-party policy plugin: denies paths under /etc."""
from amplifier_tools import Deny, hookimpl

calls = []

@hookimpl
def tool_pre(call, spec):
    calls.append(call.name)
    path = call.arguments.get("path", "")
    if isinstance(path, str) and path.startswith("/etc"):
        return Deny("no /etc please", code="etc_denied")
'''

# Written exactly as the seed contract describes a tool module.
SEED_SOURCE = '''
from pathlib import Path

class ReadFileTool:
    name = "seed_read"
    description = "Read the contents of a file"
    input_schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "File path"}},
        "required": ["path"],
    }

    def __init__(self, config):
        self.prefix = config.get("prefix", "")

    async def execute(self, input):
        try:
            return {"success": True, "output": self.prefix + Path(input["path"]).read_text()}
        except Exception as e:
            return {"success": False, "error": {"message": str(e), "type": type(e).__name__}}

closed = []

async def mount(coordinator, config=None):
    config = config or {}
    tool = ReadFileTool(config)
    await coordinator.mount("tools", tool, name=tool.name)
    return lambda: closed.append(True)
'''

BROKEN_SOURCE = "raise ImportError('missing optional dependency frobnicate')\n"

PYPROJECT = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "amplifier-tools-testplugins"
version = "1.2.3"

[project.entry-points.amplifier_tools]
etc-guard = "etc_guard_plugin"
broken-plugin = "broken_plugin"

[project.entry-points."amplifier.modules"]
seed-read = "seed_read_module:mount"

[tool.setuptools]
py-modules = ["etc_guard_plugin", "seed_read_module", "broken_plugin"]
'''


@pytest.fixture(scope="session")
def installed_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build and install the test distribution into a private site directory."""
    src = tmp_path_factory.mktemp("src")
    (src / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (src / "etc_guard_plugin.py").write_text(PLUGIN_SOURCE)
    (src / "seed_read_module.py").write_text(SEED_SOURCE)
    (src / "broken_plugin.py").write_text(BROKEN_SOURCE)
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(src)],
        check=True,
    )
    return site


@pytest.fixture
def with_site(installed_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(installed_site))
    importlib.invalidate_caches()
    for env in ("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "AMPLIFIER_TOOLS_LOAD_PLUGINS"):
        monkeypatch.delenv(env, raising=False)
    yield installed_site
    for module in ("etc_guard_plugin", "seed_read_module", "broken_plugin"):
        sys.modules.pop(module, None)


async def start(tmp_path: Path, *plugins: Any, **kwargs: Any) -> ToolHost:
    host = ToolHost(plugins=plugins, builtins=False, working_dir=tmp_path, **kwargs)
    await host.start()
    return host


async def test_installed_plugin_is_discovered_and_its_hooks_run(with_site: Path, tmp_path: Path) -> None:
    host = await start(tmp_path)
    try:
        names = {info.name: info for info in host.plugins}
        assert names["etc-guard"].distribution == "amplifier-tools-testplugins"
        assert names["etc-guard"].version == "1.2.3"
        assert names["etc-guard"].hooks == ("tool_pre",)
        denied = await host.call("seed_read", {"path": "/etc/passwd"})
        assert denied.error["code"] == "etc_denied" and denied.error["plugin"] == "etc-guard"
        assert sys.modules["etc_guard_plugin"].calls == ["seed_read"]
    finally:
        await host.close()


async def test_broken_plugin_is_reported_and_host_stays_usable(with_site: Path, tmp_path: Path) -> None:
    host = await start(tmp_path)
    try:
        failed = {f.name: f.reason for f in host.failed_plugins}
        assert "broken-plugin" in failed
        assert "missing optional dependency frobnicate" in failed["broken-plugin"]
        (tmp_path / "a.txt").write_text("hello")
        assert (await host.call("seed_read", {"path": str(tmp_path / "a.txt")})).output == "hello"
    finally:
        await host.close()


async def test_broken_plugin_fails_start_when_explicitly_wanted(with_site: Path, tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match="broken-plugin.*frobnicate"):
        await start(tmp_path, config={"load_plugins": ["broken-plugin"]})


async def test_disable_env_var_removes_the_plugin(
    with_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "etc-guard, broken-plugin")
    host = await start(tmp_path)
    try:
        assert "etc-guard" not in {info.name for info in host.plugins}
        assert not host.failed_plugins
        result = await host.call("seed_read", {"path": "/etc/hostname"})
        assert result.error is None or result.error.get("code") != "etc_denied"
    finally:
        await host.close()


async def test_load_env_var_is_an_allowlist(
    with_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPLIFIER_TOOLS_LOAD_PLUGINS", "seed-read")
    host = await start(tmp_path)
    try:
        assert [info.name for info in host.plugins] == ["seed-read"]
    finally:
        await host.close()


async def test_seed_module_runs_unchanged_through_every_hook(with_site: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    (tmp_path / "note.txt").write_text("seed content")
    host = await start(tmp_path, recorder, config={"modules": []})
    try:
        info = {i.name: i for i in host.plugins}["seed-read"]
        assert info.source == "module"
        ok = await host.call("seed_read", {"path": str(tmp_path / "note.txt")})
        missing = await host.call("seed_read", {"path": str(tmp_path / "nope.txt")})
        invalid = await host.call("seed_read", {})
    finally:
        await host.close()
    assert ok.success and ok.output == "seed content"
    assert missing.error["type"] == "ExecutionError" and missing.error["code"] == "file_not_found_error"
    assert invalid.error["type"] == "ContractError" and "/path" in invalid.error["message"]
    assert recorder.hooks() == [
        "tool_pre", "tool_post", "tool_complete",
        "tool_pre", "tool_error", "tool_complete",
        "tool_error", "tool_complete",
    ]
    assert sys.modules["seed_read_module"].closed == [True]


async def test_seed_module_named_in_config_gets_its_config(tmp_path: Path, installed_site: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(installed_site))
    (tmp_path / "n.txt").write_text("body")
    host = ToolHost(config={"tools": [{"module": "seed_read_module", "config": {"prefix": ">> "}}]},
                    builtins=False, entry_points=False, working_dir=tmp_path)
    async with host:
        result = await host.call("seed_read", {"path": str(tmp_path / "n.txt")})
    assert result.output == ">> body"


def test_example_plugins_are_discovered_only_when_installed() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group="amplifier_tools")}
    installed = {d.metadata["Name"] for d in importlib.metadata.distributions()}
    for dist, ep_name in (("amplifier-tools-approval", "approval"), ("amplifier-tools-http-fetch", "http-fetch")):
        assert (ep_name in names) == (dist in installed)


async def test_mount_plan_naming_an_installed_module_uses_it_with_the_plans_config(
    with_site: Path, tmp_path: Path
) -> None:
    """The seed's mount plan names installed modules by their entry-point name (was: 'already registered')."""
    (tmp_path / "n.txt").write_text("hi")
    config = {"tools": [{"module": "seed-read", "config": {"prefix": ">> "}}]}
    async with ToolHost(config=config, builtins=False, working_dir=tmp_path) as host:
        assert [i.name for i in host.plugins].count("seed-read") == 1
        result = await host.call("seed_read", {"path": str(tmp_path / "n.txt")})
    assert result.output == ">> hi"


async def test_a_module_configured_in_two_places_names_both(with_site: Path, tmp_path: Path) -> None:
    from amplifier_tools import ConfigError

    config = {"tools": [{"module": "seed-read", "config": {"prefix": "a"}}],
              "plugins": {"seed-read": {"prefix": "b"}}}
    with pytest.raises(ConfigError, match=r"configured twice.*mount plan.*\[plugins.seed-read\]"):
        async with ToolHost(config=config, builtins=False, working_dir=tmp_path):
            pass


async def test_the_same_plugin_from_code_and_config_names_both_sources(with_site: Path, tmp_path: Path) -> None:
    seed = importlib.import_module("seed_read_module")

    class Named:
        name = "seed_read_module"
        mount = staticmethod(seed.mount)

    config = {"modules": [{"module": "seed_read_module"}]}
    with pytest.raises(PluginLoadError, match="from code; this one is from module"):
        async with ToolHost(config=config, plugins=[Named()], builtins=False, entry_points=False,
                            working_dir=tmp_path):
            pass


async def test_an_installed_plugin_also_named_in_config_names_both_names(with_site: Path, tmp_path: Path) -> None:
    """Found by a new-user trial: the plugin installed as ``etc-guard`` and listed again under
    ``[[modules]]`` by its module name failed with pluggy's own ValueError and its registry dump."""
    config = {"modules": [{"module": "etc_guard_plugin"}]}
    with pytest.raises(PluginLoadError) as raised:
        async with ToolHost(config=config, builtins=False, working_dir=tmp_path, discover=False):
            pass
    message = str(raised.value)
    assert "already registered as 'etc-guard' (from entry_point; this one is from module)" in message, message
    assert "ValueError" not in message and "{" not in message
    assert raised.value.hint is not None and "'etc_guard_plugin'" in raised.value.hint \
        and "'etc-guard'" in raised.value.hint


async def test_plugins_argument_accepts_seed_modules_and_tools_and_refuses_the_rest(
    with_site: Path, tmp_path: Path
) -> None:
    from amplifier_tools import tool

    seed = importlib.import_module("seed_read_module")

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    (tmp_path / "n.txt").write_text("x")
    async with ToolHost(plugins=[seed, add], builtins=False, entry_points=False, working_dir=tmp_path) as host:
        assert (await host.call("add", {"a": 2, "b": 3})).output == 5
        assert (await host.call("seed_read", {"path": str(tmp_path / "n.txt")})).output == "x"
    with pytest.raises(PluginLoadError, match="neither a plugin"):
        async with ToolHost(plugins=[object()], builtins=False, entry_points=False, working_dir=tmp_path):
            pass


class FakeCoordinator:
    """What ``amplifier_module.mount`` uses of an Amplifier coordinator."""

    session_id = "amp-session"

    def __init__(self) -> None:
        self.mounted: dict[str, Any] = {}
        self.cleanups: list[Any] = []

    async def mount(self, kind: str, tool: Any, name: str) -> None:
        self.mounted[name] = tool

    def register_cleanup(self, cleanup: Any) -> None:
        self.cleanups.append(cleanup)


async def test_the_reverse_module_does_not_load_the_installed_amplifier_modules(
        with_site: Path, tmp_path: Path) -> None:
    """Mounted on an Amplifier session, the host left installed modules to the session (it loaded them
    all too: an installed tool-bash collided with ours, found by review)."""
    coordinator = FakeCoordinator()
    await amplifier_module.mount(coordinator, {"working_dir": str(tmp_path)})
    try:
        assert "bash" in coordinator.mounted and "seed_read" not in coordinator.mounted
    finally:
        for cleanup in coordinator.cleanups:
            await cleanup()


async def test_without_installed_modules_a_planned_module_still_loads(with_site: Path, tmp_path: Path) -> None:
    (tmp_path / "n.txt").write_text("hi")
    config = {"tools": [{"module": "seed-read", "config": {"prefix": ">> "}}]}
    async with ToolHost(config=config, builtins=False, working_dir=tmp_path, installed_modules=False) as host:
        result = await host.call("seed_read", {"path": str(tmp_path / "n.txt")})
    assert result.output == ">> hi"
    async with ToolHost(config={}, builtins=False, working_dir=tmp_path, installed_modules=False) as host:
        assert "seed-read" not in [i.name for i in host.plugins]


PLUGIN_MODULE = '''
from amplifier_tools import hookimpl

class Note:
    name = "note"
    description = "Return a note."
    input_schema = {"type": "object"}

    async def execute(self, input):
        return {"success": True, "output": "noted"}

@hookimpl
async def mount(coordinator):
    await coordinator.mount("tools", Note())
'''


async def test_a_plugin_module_named_in_the_mount_plan_loads_as_a_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module written as docs/plugins.md shows (``@hookimpl`` hooks) failed when named in
    ``[[modules]]``: "implements unknown hook '_mount'" (found by a new-user trial)."""
    (tmp_path / "note_plugin.py").write_text(PLUGIN_MODULE)
    (tmp_path / "typo_plugin.py").write_text("from amplifier_tools import hookimpl\n\n@hookimpl\n"
                                             "def tool_pree(call):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    async with ToolHost(config={"modules": [{"module": "note_plugin"}]}, builtins=False, entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        assert (await host.call("note", {})).output == "noted"
    with pytest.raises(PluginLoadError, match="unknown hook 'tool_pree'; did you mean 'tool_pre'"):
        async with ToolHost(config={"modules": [{"module": "typo_plugin"}]}, builtins=False, entry_points=False,
                            working_dir=tmp_path, discover=False):
            pass
    with pytest.raises(PluginLoadError, match=r"\[plugins.note_plugin\]"):
        async with ToolHost(config={"modules": [{"module": "note_plugin", "config": {"x": 1}}]}, builtins=False,
                            entry_points=False, working_dir=tmp_path, discover=False):
            pass


#: ``entry_points.txt`` contents, and whether an entry point in them is one the host loads.
ENTRY_POINT_FILES = {
    "none": ("", False),
    "console scripts only": ("[console_scripts]\ntool = tool:main\n", False),
    "mentions amplifier elsewhere": ("[console_scripts]\namplifier-x = amplifier_x:main\n", False),
    "a plugin": ("[console_scripts]\nx = x:main\n\n[amplifier_tools]\nguard = guard_plugin\n", True),
    "a seed module": ("[amplifier.modules]\nseed = seed_module:mount\n", True),
    "this package's own seed module": ("[amplifier.modules]\ntool-amplifier-tools = "
                                       "amplifier_tools.amplifier_module:mount\n", False),
    "ours and another": ("[amplifier.modules]\ntool-amplifier-tools = amplifier_tools.amplifier_module:mount\n"
                         "other = other_module:mount\n", True),
    "a comment and spaces": ("# [amplifier_tools]\n  [amplifier_tools]  \n  guard =  guard_plugin \n", True),
    "an empty group": ("[amplifier_tools]\n\n[console_scripts]\nx = x:main\n", False),
}


def _plugin_entry_points() -> list[tuple[str, str, str]]:
    """What the host would load, by importlib.metadata alone (its own seed module left out)."""
    installed = importlib.metadata.entry_points()
    found = [(ep.group, ep.name, ep.value) for ep in installed.select(group="amplifier_tools")]
    found += [(ep.group, ep.name, ep.value) for ep in installed.select(group="amplifier.modules")
              if not ep.value.startswith("amplifier_tools.")]
    return found


@pytest.mark.parametrize("layout", ["dist-info", "egg-info", "EGG dir", "upper-case suffix"])
@pytest.mark.parametrize("case", list(ENTRY_POINT_FILES))
def test_the_entry_point_pre_scan_never_misses_a_plugin_importlib_metadata_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, layout: str) -> None:
    """``installed_entry_points`` skips importlib.metadata (a third of ``list``'s start-up) only when its
    own reading of the entry_points.txt files is sure that no plugin is installed; whatever it
    answers, the host gets exactly the entry points importlib.metadata gives."""
    from amplifier_tools import loader

    text, declares = ENTRY_POINT_FILES[case]
    site = tmp_path / "site"
    meta = {"dist-info": site / "demo-1.0.dist-info", "egg-info": site / "demo.egg-info",
            "EGG dir": site / "demo-1.0-py3.11.egg" / "EGG-INFO",
            "upper-case suffix": site / "Demo-1.0.DIST-INFO"}[layout]
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    (meta / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    (meta / "entry_points.txt").write_text(text)
    (site / "other-2.0.dist-info").mkdir()  # no entry_points.txt
    (site / "flat.egg-info").write_text("Metadata-Version: 1.0\nName: flat\n")  # a file, not a directory
    path = [str(meta.parent) if layout == "EGG dir" else str(site), str(tmp_path / "missing")]
    monkeypatch.setattr(sys, "path", path)
    importlib.invalidate_caches()
    expected = _plugin_entry_points()
    assert bool(expected) is declares
    assert loader._entry_points_may_exist() is declares
    found = loader.installed_entry_points()
    assert [(ep.group, ep.name, ep.value) for group in found.values() for ep in group
            if not ep.value.startswith("amplifier_tools.")] == expected


def test_the_pre_scan_leaves_what_it_cannot_read_to_importlib_metadata(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile

    from amplifier_tools import loader

    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        zf.writestr("demo-1.0.dist-info/entry_points.txt", "[amplifier_tools]\nguard = guard_plugin\n")
    monkeypatch.setattr(sys, "path", [str(archive)])
    importlib.invalidate_caches()
    assert loader._entry_points_may_exist() is True
    assert [ep.name for ep in loader.installed_entry_points()["amplifier_tools"]] == ["guard"]

    class Finder:  # another source of distributions, as a meta-path finder may be
        @staticmethod
        def find_distributions(context: Any = None) -> list[Any]:
            return []

    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder])
    assert loader._entry_points_may_exist() is True


def test_an_installed_plugin_is_loaded_after_the_pre_scan(with_site: Path, tmp_path: Path) -> None:
    from amplifier_tools import loader

    found = loader.installed_entry_points()
    assert {"etc-guard", "broken-plugin"} <= {ep.name for ep in found["amplifier_tools"]}
    assert "seed-read" in {ep.name for ep in found["amplifier.modules"]}
