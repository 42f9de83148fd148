"""The ``[plugins.mcp]`` config section, structured strictly by ``plugin_settings`` (unknown keys
and wrong types are a ``ConfigError`` naming the key). Needs no SDK, so a bad config is reported
the same way whether or not the ``mcp`` extra is installed. docs/mcp.md describes each key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import attrs

from ..plugin_settings import Count, EnvNames, EnvTable, Expect, Invalid, Number, Text, settings_class
from ..spec import Effect

PLUGIN: Final = "mcp"
_SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9_\-]+$")
#: Largest JSON-RPC message (one line) read from a server unless configured: 16 MiB.
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Most tools one server may list unless configured (each costs memory and time to mount).
DEFAULT_MAX_TOOLS: Final = 1000

AbsolutePaths = Annotated[tuple[str, ...], Expect("a list of absolute paths",
                                                  lambda paths: all(p.startswith(("/", "~")) for p in paths))]
Refuse = Literal["refuse", "skip"]


@settings_class
@attrs.frozen
class ToolOverride:
    """Per-tool settings of an imported server: effect override, or not mounted at all."""

    effect: Effect | None = None
    enabled: bool = True


@settings_class
@attrs.frozen
class ServerSettings:
    """One imported stdio MCP server (``[plugins.mcp.servers.<name>]``; its name is the table's key)."""

    command: Annotated[str, Expect("the command that starts the server (a non-empty string; only stdio servers "
                                   "are supported)", bool)]
    args: tuple[str, ...] = ()
    env: EnvTable = attrs.field(factory=dict)
    env_passthrough: EnvNames = ()
    cwd: Annotated[str, Expect("a directory path")] | None = None
    stderr: Literal["inherit", "discard"] = "inherit"
    version: Annotated[str, Expect("a version string")] | None = None
    pins: Annotated[Mapping[str, str], Expect("a table of tool name -> 'sha256:<hex>'")] = attrs.field(factory=dict)
    on_pin_mismatch: Refuse = "refuse"
    require_pins: bool = False
    timeout_ms: Number | None = None
    startup_timeout_ms: Number = 10_000.0
    max_restarts: Annotated[int, Expect("a non-negative integer", lambda n: n >= 0)] = 3
    max_message_bytes: Annotated[int, Expect("an integer number of bytes, at least 1024",
                                             lambda n: n >= 1024)] = DEFAULT_MAX_MESSAGE_BYTES
    max_tools: Count = DEFAULT_MAX_TOOLS
    on_unsupported_pattern: Refuse = "refuse"
    sandbox: Literal["off", "auto", "bubblewrap"] = "off"
    sandbox_read_paths: AbsolutePaths = ()
    sandbox_write_paths: AbsolutePaths = ()
    sandbox_network: bool = False
    tools: Mapping[str, ToolOverride] = attrs.field(factory=dict)


@settings_class
@attrs.frozen
class ServeSettings:
    """Who the MCP client calling ``serve-mcp`` is, and which tools it sees."""

    name: Text = "amplifier-tools"
    principal: str | None = None
    role: str | None = None
    environment: str | None = None
    scopes: tuple[str, ...] | None = None
    tools: Annotated[tuple[str, ...], Expect("a list of tool names")] | None = None  # None: every mounted tool


def _server_names(instance: Any, attribute: attrs.Attribute[Any], servers: Mapping[str, ServerSettings]) -> None:
    for name in servers:
        if not _SERVER_NAME.match(name):
            raise Invalid("server names may use letters, digits, '_' and '-' only", at=(attribute.name, name))


@settings_class
@attrs.frozen
class McpSettings:
    """``[plugins.mcp]``: the servers to import, by name, and what ``serve-mcp`` serves."""

    servers: Annotated[Mapping[str, ServerSettings], Expect("a table of servers")] = attrs.field(
        factory=dict, validator=_server_names)
    serve: ServeSettings = ServeSettings()
