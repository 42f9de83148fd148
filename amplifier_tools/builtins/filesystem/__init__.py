"""The filesystem plugin: ``read_file``, ``write_file``, ``edit_file``, ``list_dir``, ``glob``, ``grep``.

A built-in that uses only the public hooks: ``mount`` reads its config
section, builds one ``PathRules`` engine and mounts the six tools, all of which
resolve every path through it. The engine holds the host's protected paths
(capability ``session.protected_paths``), so no tool reads, writes, lists or
searches the host's own files. One instance per host (``FilesystemPlugin``),
so the read-before-write log is never shared between hosts.
"""

from __future__ import annotations

from typing import Any, Final

from ..._markers import hookimpl
from ...errors import ConfigError
from ...hoststate import ProtectedPaths
from ...models import Deny, ToolCall
from ...spec import ToolSpec
from .guard import ArgumentGuard
from .paths import DEFAULT_WRITE_DENIED, PathRules
from .tools import TOOL_CLASSES, ReadLog

PLUGIN: Final = "filesystem"
#: Built-in tools that decide paths themselves (the path engine; bash: its cwd rule and sandbox).
BUILTIN_PATH_TOOLS: Final = frozenset({"local::fs.read_file", "local::fs.write_file", "local::fs.edit_file",
                                       "local::fs.list_dir", "local::fs.glob", "local::fs.grep", "local::bash"})

DEFAULTS: Final[dict[str, Any]] = {
    "allowed_read_paths": None,  # None: the working directory
    "allowed_write_paths": None,
    "denied_paths": [],
    "write_denied_paths": list(DEFAULT_WRITE_DENIED),
    "allow_hardlinks": False,
    "require_read_before_write": False,
    "max_size": 10 * 1024 * 1024,
    "default_limit": 2000,
    "max_line_chars": 2000,
    "max_results": 1000,
    "max_matches": 200,
    "new_file_mode": None,  # None: 0o644 & ~umask
}


def parse_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The plugin's settings with defaults; ``ConfigError`` naming the key otherwise."""
    settings = dict(DEFAULTS)
    for key, value in config.items():
        where = f"plugins.{PLUGIN}.{key}"
        if key not in DEFAULTS:
            raise ConfigError(f"unknown key (expected one of {sorted(DEFAULTS)})", key=where, expected=DEFAULTS)
        default = DEFAULTS[key]
        if key == "new_file_mode":
            value = parse_mode(value, where)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError("must be true or false", key=where)
        elif isinstance(default, int):
            if type(value) is not int or value <= 0:
                raise ConfigError("must be a positive integer", key=where)
        elif not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError("must be a list of paths or patterns", key=where)
        settings[key] = value
    return settings


MODE_HINT: Final = 'write permission bits in octal, e.g. new_file_mode = 0o640 or "0640"'


def parse_mode(value: Any, where: str) -> int:
    """``new_file_mode``: permission bits only (``0o640`` in TOML, or the string ``"0640"``); setuid,
    setgid and sticky bits are refused, since the tools never create such files."""
    if isinstance(value, str):
        try:
            value = int(value.removeprefix("0o"), 8)
        except ValueError:
            raise ConfigError(f"{value!r} is not an octal mode; {MODE_HINT}", key=where, hint=MODE_HINT) from None
    if type(value) is not int or not 0 <= value <= 0o777:
        shown = oct(value) if type(value) is int else repr(value)
        raise ConfigError(f"{shown} is not a permission mode between 0o000 and 0o777 (setuid, setgid and "
                          f"sticky bits are never set); {MODE_HINT}", key=where, hint=MODE_HINT)
    return value


class FilesystemPlugin:
    """Mounts the six tools over one ``PathRules``."""

    name = PLUGIN

    def __init__(self) -> None:
        self.rules: PathRules | None = None
        self._guard: ArgumentGuard | None = None

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        settings = parse_settings(config)
        working_dir = coordinator.get_capability("session.working_dir")
        protected = coordinator.get_capability("session.protected_paths")
        self.rules = PathRules(
            working_dir,
            read_roots=settings["allowed_read_paths"] or [working_dir],
            write_roots=settings["allowed_write_paths"] or [working_dir],
            denied=settings["denied_paths"],
            write_denied=settings["write_denied_paths"],
            allow_hardlinks=settings["allow_hardlinks"],
            protected=protected if isinstance(protected, ProtectedPaths) else None,
        )
        coordinator.register_capability("fs.path_rules", self.rules)
        read_log = ReadLog()
        for cls in TOOL_CLASSES:
            await coordinator.mount("tools", cls(self.rules, settings, read_log))
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
