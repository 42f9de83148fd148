"""The ``[plugins.mcp]`` config section, structured strictly by ``plugin_settings`` (unknown keys
and wrong types are a ``ConfigError`` naming the key). Needs no SDK, so a bad config is reported
the same way whether or not the ``mcp`` extra is installed. docs/mcp.md describes each key.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import attrs

from ..plugin_settings import Count, EnvNames, EnvTable, Expect, Invalid, Number, Text, settings_class
from ..spec import Effect
from . import PLUGIN as PLUGIN

_SERVER_NAME: Final = re.compile(r"^[A-Za-z0-9_\-]+$")
#: Largest JSON-RPC message (one line) read from a server, or by ``serve-mcp`` on stdio from its
#: client, unless configured: 16 MiB.
DEFAULT_MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
#: Most tools one server may list unless configured (each costs memory and time to mount).
DEFAULT_MAX_TOOLS: Final = 1000
#: Most content blocks one result may carry unless configured: each block costs about a
#: kilobyte and tens of microseconds on the event loop to parse, check and redact.
DEFAULT_MAX_CONTENT_BLOCKS: Final = 4096

AbsolutePaths = Annotated[tuple[str, ...], Expect("a list of absolute paths",
                                                  lambda paths: all(p.startswith(("/", "~")) for p in paths))]
Refuse = Literal["refuse", "skip"]
MessageBytes = Annotated[int, Expect("an integer number of bytes, at least 1024", lambda n: n >= 1024)]
#: The longest ``stop_grace_ms``: 10 minutes. A stop takes up to twice the grace (after the stdin
#: closes, then after SIGTERM), and the host's close waits for it.
MAX_STOP_GRACE_MS: Final = 600_000
#: Milliseconds a stdio server gets to exit once its stdin closes, and again once it has SIGTERM.
StopGrace = Annotated[float, Expect(
    f"a positive number of milliseconds, at most {MAX_STOP_GRACE_MS} (10 minutes)",
    lambda ms: 0 < ms <= MAX_STOP_GRACE_MS,  # NaN compares false; inf is above the maximum
    hint="stop_grace_ms is how long the server gets to exit after its stdin closes, and again after "
         "SIGTERM, before SIGKILL (default 1000)")]


@settings_class
@attrs.frozen
class ToolOverride:
    """Per-tool settings of an imported server: effect override, or not mounted at all."""

    effect: Effect | None = None
    enabled: bool = True


def _is_http_url(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


#: Keys that only a stdio server (``command``) may set.
STDIO_ONLY: Final = ("args", "env", "env_passthrough", "cwd", "stderr", "stop_grace_ms", "sandbox",
                     "sandbox_read_paths", "sandbox_write_paths", "sandbox_network")


@settings_class
@attrs.frozen
class ServerSettings:
    """One imported MCP server (``[plugins.mcp.servers.<name>]``; its name is the table's key): a
    stdio server started with ``command``, or a Streamable HTTP server at ``url``."""

    command: Annotated[str, Expect("the command that starts a stdio server (a non-empty string)", bool)] | None = None
    url: Annotated[str, Expect("the http:// or https:// URL of a Streamable HTTP server", _is_http_url)] | None = None
    #: HTTP header name -> the name of a secret reference (a key of the host's [secrets]); never a value.
    headers: Annotated[Mapping[str, str], Expect("a table of HTTP header names to secret references (keys of the "
                                                 "host's [secrets]), never to values")] = attrs.field(factory=dict)
    args: tuple[str, ...] = ()
    env: EnvTable = attrs.field(factory=dict)
    env_passthrough: EnvNames = ()
    cwd: Annotated[str, Expect("a directory path", bool)] | None = None  # "" was taken as unset (found by attack)
    stderr: Literal["inherit", "discard"] = "inherit"
    version: Annotated[str, Expect("a version string")] | None = None
    pins: Annotated[Mapping[str, str], Expect("a table of tool name -> 'sha256:<hex>'")] = attrs.field(factory=dict)
    on_pin_mismatch: Refuse = "refuse"
    require_pins: bool = False
    timeout_ms: Number | None = None
    startup_timeout_ms: Number = 10_000.0
    #: Both waits of a stop (stdin closed, then SIGTERM) before SIGKILL: at close, restart, failed start.
    stop_grace_ms: StopGrace = 1000.0
    #: False: a server that cannot start (or fails its pins) is left out, logged, and the host starts.
    required: bool = True
    max_restarts: Annotated[int, Expect("a non-negative integer", lambda n: n >= 0)] = 3
    max_message_bytes: MessageBytes = DEFAULT_MAX_MESSAGE_BYTES
    max_tools: Count = DEFAULT_MAX_TOOLS
    max_content_blocks: Count = DEFAULT_MAX_CONTENT_BLOCKS
    on_unsupported_pattern: Refuse = "refuse"
    sandbox: Literal["off", "auto", "bubblewrap"] = "off"
    sandbox_read_paths: AbsolutePaths = ()
    sandbox_write_paths: AbsolutePaths = ()
    sandbox_network: bool = False
    tools: Mapping[str, ToolOverride] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise Invalid("a server has either command (stdio) or url (Streamable HTTP), not both or neither",
                          at=("url" if self.url is not None else "command",))
        if self.url is None:
            if self.headers:
                raise Invalid("headers are sent to url servers only; a stdio server gets env", at=("headers",))
            return
        for field in attrs.fields(ServerSettings):
            if field.name not in STDIO_ONLY:
                continue
            default: Any = field.default
            if getattr(self, field.name) != (default.factory() if hasattr(default, "factory") else default):
                raise Invalid(f"{field.name} is for stdio servers (command); a url server is not started by the "
                              "host", at=(field.name,))
        parts = urllib.parse.urlsplit(self.url)
        if parts.username is not None or parts.password is not None:
            # found by attack: httpx sends them as Basic auth in place of headers' Authorization,
            # silently, and they are a credential written in the config, not a [secrets] reference
            raise Invalid("credentials in the url (user:password@) would replace the Authorization header and "
                          "live in the config; put them in headers, from a [secrets] reference", at=("url",))
        if parts.scheme == "http" and not is_loopback(parts.hostname or ""):
            raise Invalid("plain http:// to another machine sends the headers (tokens) in the clear; use https://",
                          at=("url",))


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ToolNames = Annotated[tuple[str, ...], Expect('a list of tool names, or ["*"] alone for every mounted tool ("*" '
                                              'is not combined with names)', lambda names: (
    "" not in names and ("*" not in names or len(names) == 1)))]
Port = Annotated[int, Expect("a TCP port number (0 to 65535; 0 picks a free one)", lambda port: 0 <= port <= 65535)]


@settings_class
@attrs.frozen
class ServeClient:
    """An HTTP client of ``serve-mcp`` (``[[plugins.mcp.serve.clients]]``): the bearer token that
    identifies it and who its calls run as. Unset fields fall back to ``[plugins.mcp.serve]``."""

    token_ref: Annotated[str, Expect("the name of a secret reference (a key of the host's [secrets])", bool)]
    principal: Text | None = None
    role: str | None = None
    environment: str | None = None
    scopes: tuple[str, ...] | None = None
    tools: ToolNames | None = None


def _unique_token_refs(instance: Any, attribute: attrs.Attribute[Any], clients: tuple[ServeClient, ...]) -> None:
    seen: set[str] = set()
    for index, client in enumerate(clients):
        if client.token_ref in seen:
            raise Invalid(f"token_ref {client.token_ref!r} is used by two clients; each client needs its own token",
                          at=(attribute.name, index, "token_ref"))
        seen.add(client.token_ref)


@settings_class
@attrs.frozen
class ServeSettings:
    """How ``serve-mcp`` serves (stdio or Streamable HTTP), who its callers are, which tools they see."""

    name: Text = "amplifier-tools"
    transport: Literal["stdio", "streamable-http"] = "stdio"
    host: Text = "127.0.0.1"
    port: Port = 8765
    principal: str | None = None
    role: str | None = None
    environment: str | None = None
    scopes: tuple[str, ...] | None = None
    tools: ToolNames | None = None  # None: no tool (say which with `tools`, or ["*"] for all)
    clients: tuple[ServeClient, ...] = attrs.field(default=(), validator=_unique_token_refs)
    allow_anonymous: bool = False
    #: Longest message read from a client: a stdio line (longer: dropped unparsed, answered -32600)
    #: or an HTTP request body (longer: HTTP 413).
    max_message_bytes: MessageBytes = DEFAULT_MAX_MESSAGE_BYTES
    #: Streamable HTTP sessions open at once, all clients together (the SDK's limit: 503 past it),
    #: and per client (``amplifier_tools.mcp.http_sessions``: 429 past it); a session without a
    #: request in flight for ``session_idle_s`` is ended.
    max_sessions: Count = 10_000
    max_sessions_per_client: Count = 1_000
    session_idle_s: Number = 1800.0


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
