"""The ``[plugins.mcp]`` config section, checked strictly: unknown keys and wrong
types are ``ConfigError`` naming the key. Needs no SDK, so a bad config is
reported the same way whether or not the ``mcp`` extra is installed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..errors import ConfigError
from ..spec import Effect

PLUGIN: Final = "mcp"
_SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9_\-]+$")
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Largest JSON-RPC message (one line) read from a server unless configured: 16 MiB.
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Most tools one server may list unless configured (each costs memory and time to mount).
DEFAULT_MAX_TOOLS: Final = 1000


@attrs.frozen
class ToolOverride:
    """Per-tool settings of an imported server: effect override, or not mounted at all."""

    effect: Effect | None = None
    enabled: bool = True


@attrs.frozen
class ServerSettings:
    """One imported stdio MCP server."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    env_passthrough: tuple[str, ...] = ()
    cwd: str | None = None
    stderr: str = "inherit"
    version: str | None = None
    pins: Mapping[str, str] = attrs.field(factory=dict)
    on_pin_mismatch: str = "refuse"
    require_pins: bool = False
    timeout_ms: float | None = None
    startup_timeout_ms: float = 10_000.0
    max_restarts: int = 3
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_tools: int = DEFAULT_MAX_TOOLS
    on_unsupported_pattern: str = "refuse"
    sandbox: str = "off"
    sandbox_read_paths: tuple[str, ...] = ()
    sandbox_write_paths: tuple[str, ...] = ()
    sandbox_network: bool = False
    tools: Mapping[str, ToolOverride] = attrs.field(factory=dict)


@attrs.frozen
class ServeSettings:
    """Who the MCP client calling ``serve-mcp`` is, and which tools it sees."""

    name: str = "amplifier-tools"
    principal: str | None = None
    role: str | None = None
    environment: str | None = None
    scopes: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None  # None: every mounted tool


@attrs.frozen
class McpSettings:
    servers: tuple[ServerSettings, ...] = ()
    serve: ServeSettings = ServeSettings()


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _is_str_table(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())


def _is_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


_Check = tuple[Callable[[Any], bool], str]

_SERVER_KEYS: Final[dict[str, _Check]] = {
    "command": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "args": (_is_str_list, "a list of strings"),
    "env": (_is_str_table, "a table of string values"),
    "env_passthrough": (lambda v: _is_str_list(v) and all(_ENV_NAME.match(n) for n in v),
                        "a list of environment variable names"),
    "cwd": (_is_str, "a directory path"),
    "stderr": (lambda v: v in ("inherit", "discard"), "'inherit' or 'discard'"),
    "version": (_is_str, "a version string"),
    "pins": (_is_str_table, "a table of tool name -> 'sha256:<hex>'"),
    "on_pin_mismatch": (lambda v: v in ("refuse", "skip"), "'refuse' or 'skip'"),
    "require_pins": (lambda v: isinstance(v, bool), "true or false"),
    "timeout_ms": (_is_positive, "a positive number"),
    "startup_timeout_ms": (_is_positive, "a positive number"),
    "max_restarts": (lambda v: type(v) is int and v >= 0, "a non-negative integer"),
    "max_message_bytes": (lambda v: type(v) is int and v >= 1024, "an integer number of bytes, at least 1024"),
    "max_tools": (lambda v: type(v) is int and v >= 1, "a positive integer"),
    "on_unsupported_pattern": (lambda v: v in ("refuse", "skip"), "'refuse' or 'skip'"),
    "sandbox": (lambda v: v in ("off", "auto", "bubblewrap"), "'off', 'auto' or 'bubblewrap'"),
    "sandbox_read_paths": (lambda v: _is_str_list(v) and all(p.startswith(("/", "~")) for p in v),
                           "a list of absolute paths"),
    "sandbox_write_paths": (lambda v: _is_str_list(v) and all(p.startswith(("/", "~")) for p in v),
                            "a list of absolute paths"),
    "sandbox_network": (lambda v: isinstance(v, bool), "true or false"),
    "tools": (lambda v: isinstance(v, Mapping), "a table of tool name -> settings"),
}
_SERVE_KEYS: Final[dict[str, _Check]] = {
    "name": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "principal": (_is_str, "a string"),
    "role": (_is_str, "a string"),
    "environment": (_is_str, "a string"),
    "scopes": (_is_str_list, "a list of strings"),
    "tools": (_is_str_list, "a list of tool names"),
}


def _checked(section: Any, keys: Mapping[str, _Check], where: str) -> dict[str, Any]:
    if not isinstance(section, Mapping):
        raise ConfigError(f"must be a table, got {type(section).__name__}", key=where)
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key not in keys:
            raise ConfigError(f"unknown key (expected one of {sorted(keys)})", key=f"{where}.{key}", expected=keys)
        check, expected = keys[key]
        if not check(value):
            raise ConfigError(f"must be {expected}, got {value!r}", key=f"{where}.{key}")
        out[key] = value
    return out


def _tool_override(value: Any, where: str) -> ToolOverride:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a table, got {type(value).__name__}", key=where)
    effect: Effect | None = None
    enabled = True
    for key, item in value.items():
        if key == "effect":
            try:
                effect = Effect(item)
            except ValueError:
                raise ConfigError(f"must be one of {[e.value for e in Effect]}, got {item!r}",
                                  key=f"{where}.effect") from None
        elif key == "enabled":
            if not isinstance(item, bool):
                raise ConfigError(f"must be true or false, got {item!r}", key=f"{where}.enabled")
            enabled = item
        else:
            raise ConfigError("unknown key (expected one of ['effect', 'enabled'])", key=f"{where}.{key}")
    return ToolOverride(effect, enabled)


def parse_settings(config: Mapping[str, Any]) -> McpSettings:
    """The plugin's settings; ``ConfigError`` naming ``plugins.mcp.<key>`` otherwise."""
    where = f"plugins.{PLUGIN}"
    top = _checked(config, {"servers": (lambda v: isinstance(v, Mapping), "a table of servers"),
                            "serve": (lambda v: isinstance(v, Mapping), "a table")}, where)
    servers = []
    for name, raw in top.get("servers", {}).items():
        at = f"{where}.servers.{name}"
        if not _SERVER_NAME.match(name):
            raise ConfigError("server names may use letters, digits, '_' and '-' only", key=at)
        fields = _checked(raw, _SERVER_KEYS, at)
        if "command" not in fields:
            raise ConfigError("missing 'command' (only stdio servers are supported)", key=f"{at}.command")
        fields["tools"] = {tool: _tool_override(value, f"{at}.tools.{tool}")
                           for tool, value in fields.get("tools", {}).items()}
        for key in ("args", "env_passthrough", "sandbox_read_paths", "sandbox_write_paths"):
            if key in fields:
                fields[key] = tuple(fields[key])
        servers.append(ServerSettings(name=name, **fields))
    serve_fields = _checked(top.get("serve", {}), _SERVE_KEYS, f"{where}.serve")
    for key in ("scopes", "tools"):
        if key in serve_fields:
            serve_fields[key] = tuple(serve_fields[key])
    return McpSettings(tuple(servers), ServeSettings(**serve_fields))
