"""The filesystem plugin: ``read_file``, ``write_file``, ``edit_file``, ``list_dir``, ``glob``, ``grep``.

A built-in that uses only the public hooks: ``mount`` reads its config
section, builds one ``PathRules`` engine and mounts the six tools, all of which
resolve every path through it. The engine holds the host's protected paths
(capability ``session.protected_paths``), so no tool reads, writes, lists or
searches the host's own files. One instance per host (``FilesystemPlugin``),
so the read-before-write log is never shared between hosts.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

from ..._markers import hookimpl
from ...hoststate import ProtectedPaths
from ...models import Deny, ToolCall
from ...plugin_settings import structure_settings
from ...spec import ToolSpec
from .guard import ArgumentGuard
from .paths import PathRules
from .settings import FilesystemSettings
from .tools import TOOL_CLASSES, ReadLog

log = logging.getLogger("amplifier_tools.filesystem")

PLUGIN: Final = "filesystem"
#: Built-in tools that decide paths themselves (the path engine; bash: its cwd rule and sandbox).
BUILTIN_PATH_TOOLS: Final = frozenset({"local::fs.read_file", "local::fs.write_file", "local::fs.edit_file",
                                       "local::fs.list_dir", "local::fs.glob", "local::fs.grep", "local::bash"})


class FilesystemPlugin:
    """Mounts the six tools over one ``PathRules``."""

    name = PLUGIN

    def __init__(self) -> None:
        self.rules: PathRules | None = None
        self._guard: ArgumentGuard | None = None

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        settings = structure_settings(config, FilesystemSettings, f"plugins.{PLUGIN}")
        working_dir = coordinator.get_capability("session.working_dir")
        protected = coordinator.get_capability("session.protected_paths")
        self.rules = PathRules(
            working_dir,
            read_roots=settings.allowed_read_paths or [working_dir],
            write_roots=settings.allowed_write_paths or [working_dir],
            denied=settings.denied_paths,
            write_denied=settings.write_denied_paths,
            allow_hardlinks=settings.allow_hardlinks,
            protected=protected if isinstance(protected, ProtectedPaths) else None,
            keys=(f"plugins.{PLUGIN}.allowed_read_paths", f"plugins.{PLUGIN}.allowed_write_paths"),
        )
        coordinator.register_capability("fs.path_rules", self.rules)
        configured = coordinator.get_capability("session.configured_paths")
        if isinstance(configured, list):  # checked again once every plugin is mounted
            for key, paths in (("allowed_read_paths", settings.allowed_read_paths),
                               ("allowed_write_paths", settings.allowed_write_paths)):
                configured.extend((path, f"plugins.{PLUGIN}.{key}") for path in paths or ())
        rules = self.rules
        for key, roots in (("allowed_read_paths", rules.read_roots), ("allowed_write_paths", rules.write_roots)):
            for root in roots:
                if not os.path.isdir(root):  # found by a new-user trial: every call failed, the start said nothing
                    log.warning("[plugins.%s] %s: %s is not a directory here; no path under it can be read or "
                                "written until it is", PLUGIN, key, root)
        read_log = ReadLog()
        # The registry itself, not ``registry or ()``: it is empty until a secret is resolved, often
        # after this mount (a caller's resolver), and it is read at each call.
        registry = coordinator.get_capability("session.secrets")
        secrets = () if registry is None else registry
        for cls in TOOL_CLASSES:
            await coordinator.mount("tools", cls(self.rules, settings, read_log, secrets=secrets))
        if isinstance(protected, ProtectedPaths):
            self._guard = ArgumentGuard(self.rules)

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: ToolCall, spec: ToolSpec) -> Deny | None:
        """Refuse a call of another plugin's tool whose arguments name a protected path (``guard.py``).

        The built-in filesystem and bash tools decide paths themselves, through the path engine
        and the sandbox; every other tool gets this best-effort check."""
        if self._guard is None or spec.name in BUILTIN_PATH_TOOLS:
            return None
        entry = self._guard.protected_argument(spec.name, spec.input_schema, call.arguments)
        if entry is None:
            return None
        return Deny(f"an argument names {entry.path} ({entry.reason}), which no tool may touch",
                    code="path_protected", category="AuthError",
                    details={"path": entry.path, "hint": "host state and config are out of the tools' reach; "
                                                         "see docs/configuration.md (state_dir)"})

    @hookimpl
    def tool_rewritten(self, call: ToolCall, spec: ToolSpec) -> Deny | None:
        """The guard again, on arguments a ``tool_pre`` hook after it rewrote. Found by attack: the
        guard runs first (``tryfirst``), so a later ``Modify`` naming a protected path escaped it."""
        return self.tool_pre(call, spec)
