"""Finding and loading plugins: what an entry point, an import path, a seed-style module or an
object passed in code becomes before the host registers it.

Public helpers, used by the host and the conformance checker (``validate``): ``instantiate``
(a class gets one instance per host), ``load_target`` (``package.module[:Attribute]``),
``plugin_name``, ``as_plugin`` (what ``ToolHost(plugins=[...])`` accepts), ``misfit_hooks``
(unknown hooks and wrappers refused at registration), ``seed_from_entry_point`` and
``seed_from_config`` (Amplifier-style modules as ``SeedModule`` plugins), ``installed_entry_points``
(the installed distributions' entry points, or ``None`` when none can be a plugin). The host keeps
the order, the config sections and the failure policy (``host.py``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from ._markers import PROJECT_NAME, hookimpl
from .coordinator import Coordinator
from .dispatch import PluginManager, runs_code_on_access
from .errors import PluginLoadError, did_you_mean

if TYPE_CHECKING:  # importlib.metadata is imported only where an installed plugin may exist (installed_entry_points)
    import importlib.metadata

ENTRY_POINT_GROUP = "amplifier_tools"
SEED_ENTRY_POINT_GROUP = "amplifier.modules"


@attrs.frozen
class PluginInfo:
    """A loaded plugin: its name, where it came from, and the hooks it implements."""

    name: str
    source: str  # "builtin", "code", "entry_point", "module"
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]


@attrs.frozen
class FailedPlugin:
    """A plugin that could not be loaded or mounted, and why."""

    name: str
    source: str
    reason: str


def env_names(name: str) -> set[str]:
    return {part.strip() for part in os.environ.get(name, "").split(",") if part.strip()}


class SeedModule:
    """Adapts a seed-style ``async def mount(coordinator, config)`` to a plugin."""

    def __init__(self, name: str, mount_function: Callable[..., Any], config: Mapping[str, Any]) -> None:
        self.name = name
        self._mount = mount_function
        self._config = dict(config)
        #: A tool ``mount`` returned instead of mounting it (the host mounts it).
        self.returned_tool: Any = None

    @hookimpl
    async def mount(self, coordinator: Coordinator, config: dict[str, Any]) -> Any:
        out = self._mount(coordinator, {**self._config, **config})
        if inspect.isawaitable(out):
            out = await out
        # The seed allows returning the tool itself, a cleanup callable, or None.
        if out is not None and hasattr(out, "execute"):
            self.returned_tool = out
            return None
        return out if callable(out) else None


def misfit_hooks(pm: PluginManager, plugin: Any) -> str | None:
    """Why ``plugin`` cannot be run as written: an implementation of a hook that does not exist
    (with a did-you-mean), or a hook wrapper on a hook the host calls; None when it is fine."""
    known = sorted(name for name, caller in vars(pm.hook).items() if caller.has_spec())
    for caller in pm.get_hookcallers(plugin) or []:
        if not caller.has_spec():
            close = did_you_mean(caller.name, known)
            hint = f"; {close}" if close else f" (hooks: {', '.join(known)})"
            return f"implements unknown hook {caller.name!r}{hint}"
        for impl in caller.get_hookimpls():
            if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                return (f"implements {caller.name} as a hook wrapper; the host calls each implementation "
                        "itself (use tryfirst/trylast for order)")
    return None


def plugin_name(plugin: Any) -> str:
    name = getattr(plugin, "name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return type(plugin).__name__ if not isinstance(plugin, type) else plugin.__name__


class ToolMount:
    """A plugin that mounts tools given to ``ToolHost(plugins=[...])`` directly (e.g. ``@tool`` functions)."""

    def __init__(self, name: str, *tools: Any) -> None:
        self.name = name
        self.tools = tools

    @hookimpl
    async def mount(self, coordinator: Coordinator, config: dict[str, Any]) -> None:
        for tool in self.tools:
            await coordinator.mount("tools", tool)


def has_hookimpls(obj: Any) -> bool:
    """Whether ``obj`` has ``@hookimpl`` methods; its properties are not run to find out."""
    marker = f"{PROJECT_NAME}_impl"
    return any(hasattr(getattr(obj, attr, None), marker) for attr in dir(obj)
               if not attr.startswith("__") and not runs_code_on_access(obj, attr))


def as_plugin(obj: Any, name: str) -> Any:
    """What ``ToolHost(plugins=[obj])`` registers: a pluggy plugin as it is, a seed-style module
    (a ``mount(coordinator, config)`` without hook markers) through ``SeedModule``, a tool (``@tool``
    function or an object with ``name`` and ``execute``) through ``ToolMount``; anything else is
    refused, naming what it lacks."""
    if has_hookimpls(obj):
        return obj
    if callable(getattr(obj, "mount", None)):
        return SeedModule(name, obj.mount, {})
    if callable(getattr(obj, "execute", None)) and isinstance(getattr(obj, "name", None), str):
        return ToolMount(name, obj)
    raise PluginLoadError(name, "is neither a plugin (no @amplifier_tools.hookimpl methods), a seed-style module "
                                "(no mount(coordinator, config)) nor a tool (no name and execute)")


def instantiate(load: Callable[[], Any]) -> Any:
    """An entry point may name a module, an object, or a class; a class gets one
    instance per host, which is how a plugin keeps per-host state."""
    loaded = load()
    return loaded() if isinstance(loaded, type) else loaded


def load_target(target: str) -> Any:
    """``"package.module"`` or ``"package.module:Attribute"`` (a class is instantiated per host)."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return instantiate(lambda: getattr(module, attribute) if attribute else module)


def mount_function(name: str, loaded: Any) -> Callable[..., Any]:
    """The seed ``mount`` callable of an entry-point target or an imported module."""
    mount = getattr(loaded, "mount", None) if isinstance(loaded, ModuleType) else loaded
    if not callable(mount):
        hint = None
        if isinstance(loaded, ModuleType):
            # Found by a newcomer's pass: a module of ``@tool`` functions named in ``[[modules]]``
            # got the generic "fix or uninstall the plugin" hint; say what makes it mountable.
            tools = [attr for attr, value in vars(loaded).items()
                     if callable(getattr(value, "execute", None)) and hasattr(value, "spec")]
            if tools:
                hint = (f"it holds tools ({', '.join(tools[:5])}): add 'async def mount(coordinator, config)' "
                        f"to it that awaits coordinator.mount(\"tools\", {tools[0]}) for each, "
                        "or pass them to ToolHost(plugins=[...]) in code")
        raise PluginLoadError(name, "module has no callable 'mount(coordinator, config)'", hint=hint)
    result: Callable[..., Any] = mount
    return result


def seed_from_entry_point(ep: importlib.metadata.EntryPoint, config: Mapping[str, Any]) -> SeedModule:
    return SeedModule(ep.name, mount_function(ep.name, ep.load()), config)


def seed_from_config(entry: Mapping[str, Any]) -> Any:
    """A mount-plan entry: ``module`` names an ``amplifier.modules`` entry point or an import path.
    An imported module with ``@hookimpl`` hooks is a plugin of ours and is registered as it is
    (its settings come from ``[plugins.<name>]``, as for any plugin)."""
    import importlib.metadata

    name = entry["module"]
    for ep in importlib.metadata.entry_points(group=SEED_ENTRY_POINT_GROUP):
        if ep.name == name:
            return SeedModule(name, mount_function(name, ep.load()), entry.get("config", {}))
    if ":" in name:
        # Found by a newcomer's trial: ``module = "my_tools:word_count"`` (as ``validate`` takes it)
        # was "not importable: ... put its directory on PYTHONPATH", with the directory on it.
        module_name, _, attribute = name.partition(":")
        raise PluginLoadError(name, "a [[modules]] entry names a module (or an amplifier.modules entry point), "
                                    f"not a module's attribute ({attribute!r})",
                              hint=f"write module = {module_name!r}, a module whose 'async def mount(coordinator, "
                                   "config)' mounts its tools, or pass the object to ToolHost(plugins=[...]) in code")
    module = importlib.import_module(name)
    if has_hookimpls(module):
        if entry.get("config"):
            raise PluginLoadError(name, f"is an amplifier-tools plugin (it has @hookimpl hooks): give its settings "
                                        f"in [plugins.{name}], not in the mount plan entry's config")
        return module
    return SeedModule(name, mount_function(name, module), entry.get("config", {}))


def installed_entry_points() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """The installed distributions' entry points in ``amplifier_tools`` and ``amplifier.modules``, by
    group, from one scan (``importlib.metadata.entry_points()``, which reads every distribution).

    ``importlib.metadata`` costs a command like ``list`` more than all its other plugin loading (its
    import, then a parse of every distribution's metadata), and most installations declare no plugin.
    A first pass reads only the ``entry_points.txt`` files, where and as ``importlib.metadata`` finds
    them (the ``.dist-info`` and ``.egg-info`` directories of each ``sys.path`` directory, an ``.egg``
    directory's ``EGG-INFO``), and answers "none" itself only when it is sure: no entry point in
    ``amplifier_tools``, none in ``amplifier.modules`` but this package's own (which the host skips).
    Anything it does not read the same way — a zip on ``sys.path``, another finder of distributions
    on ``sys.meta_path``, an unreadable directory or file, a line it does not rule out — leaves the
    answer to ``importlib.metadata``."""
    groups = (ENTRY_POINT_GROUP, SEED_ENTRY_POINT_GROUP)
    if not _entry_points_may_exist():
        return {group: [] for group in groups}
    import importlib.metadata

    installed = importlib.metadata.entry_points()
    return {group: list(installed.select(group=group)) for group in groups}


def _entry_points_may_exist() -> bool:
    if any(getattr(finder, "find_distributions", None) is not None and finder is not importlib.machinery.PathFinder
           for finder in sys.meta_path):
        return True
    for entry in sys.path:
        root = entry or "."
        try:
            children = os.listdir(root)
        except (FileNotFoundError, NotADirectoryError):
            if os.path.lexists(root):
                return True  # a zip (or something else importlib.metadata may read)
            continue
        except OSError:
            return True
        egg = os.path.basename(root).lower().endswith(".egg")
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")) or (egg and low == "egg-info"):
                try:
                    with open(os.path.join(root, child, "entry_points.txt"), encoding="utf-8") as file:
                        text = file.read()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
                    continue  # what importlib.metadata reads as no entry points
                except (OSError, ValueError):
                    return True
                if _declares_plugins(text):
                    return True
    return False


def _declares_plugins(text: str) -> bool:
    """Whether an ``entry_points.txt``, read as ``importlib.metadata`` reads it, may declare an entry
    point the host loads: any in ``amplifier_tools``, one in ``amplifier.modules`` not of this package."""
    if "amplifier" not in text:
        return False
    group = None
    for line in map(str.strip, text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line.strip("[]")
        elif group == ENTRY_POINT_GROUP:
            return True
        elif group == SEED_ENTRY_POINT_GROUP:
            _, equals, value = line.partition("=")
            if not equals or not value.strip().startswith(f"{__package__}."):
                return True
    return False
