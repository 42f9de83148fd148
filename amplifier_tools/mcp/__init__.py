"""MCP both ways: import MCP servers' tools under the host's contracts and policies
(``McpImportPlugin``), and serve the host's tools to MCP clients
(:mod:`amplifier_tools.mcp.server`, ``amplifier-tools serve-mcp``).

The plugin is a built-in and inert unless ``[plugins.mcp.servers]`` names a
server: the ``mcp`` SDK (the ``amplifier-tools[mcp]`` extra) is imported only
then, so the core runs without it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from .._markers import hookimpl
from ..errors import AuthError, ConfigError, ContractError, ToolError
from ..hoststate import ProtectedPaths
from ..plugin_settings import structure_settings
from ..redaction import redact_text
from ..secrets_table import EnvironmentSecrets

if TYPE_CHECKING:  # imported at the first mount with a [plugins.mcp] table, or when settings are read
    from .settings import McpSettings

#: The plugin's name and config section (``[plugins.mcp]``).
PLUGIN: Final = "mcp"

log = logging.getLogger("amplifier_tools.mcp")

__all__ = ["McpImportPlugin", "MISSING_SDK_HINT", "MISSING_SDK_MESSAGE", "sdk_available"]

#: The contributor channel on which plugins report parts of theirs that are not available
#: (``amplifier-tools plugins`` shows them): a list of ``{"plugin", "name", "reason"}``.
UNAVAILABLE_CHANNEL: Final = "plugins.unavailable"
#: Least seconds between two attempts to start a server left out at start.
RETRY_AFTER_S: Final = 10.0
#: Where a start error's stderr tail begins (``client.start_error``).
STDERR_TAIL_MARK: Final = "; its stderr ended with:"

MISSING_SDK_MESSAGE: Final = (
    "MCP servers are configured but the 'mcp' extra is not installed (pip install 'amplifier-tools[mcp]')"
)
#: The next step for ``MISSING_SDK_MESSAGE`` (the command line's hint line). Without it the command
#: line fell back to its generic hint for a key, "set plugins.mcp.servers in the configuration", to a
#: user who had set it and lacked only the extra (found by a new-user trial of the core install).
MISSING_SDK_HINT: Final = ("pip install 'amplifier-tools[mcp]' in this environment, or remove "
                           "[plugins.mcp.servers] to run without MCP servers")


def sdk_available() -> bool:
    """Whether the ``mcp`` SDK can be imported (called only when it is needed)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


#: An RFC 9110 ``token``: a header name, an auth scheme.
_TOKEN: Final = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_HEADER_NAME: Final = re.compile(_TOKEN)
#: ``<auth-scheme> <credentials>`` (RFC 9110 §11.4): the credentials are a secret of their own.
_SCHEMED: Final = re.compile(f"{_TOKEN} +(\\S.*)", re.DOTALL)


def resolve_headers(resolve: Any, name: str, server: Any, secrets: Any,
                    table: Mapping[str, str]) -> dict[str, str]:
    """A ``url`` server's headers, each value resolved from its ``[secrets]`` reference (and so
    registered for redaction) by ``resolve`` (``session.secret``); ``ConfigError`` naming the
    header's key when one does not resolve — saying why from ``table``, the host's ``[secrets]``
    (no such key, or the variable it names, named, is unset) — or could not be sent as it is (a
    name that is no HTTP token; a value with a control character, a character beyond ASCII, or
    space at either end: an ``.env`` file's CR). The reference and the value are never shown: an
    inline value (a token written into the config instead of a reference) would otherwise be
    printed. With ``secrets`` (the host's ``session.secrets``), the credentials of a value
    ``<scheme> <credentials>`` (``Bearer …``) are registered on their own too: a server that
    echoes the bare token gets it redacted."""
    values: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for header, ref in server.headers.items():
        key = f"plugins.{PLUGIN}.servers.{name}.headers.{header}"
        if not _HEADER_NAME.fullmatch(header):
            raise ConfigError(f"{header!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)",
                              key=key)
        if header.lower() in spelled:  # HTTP header names are case-insensitive: both would be sent
            raise ConfigError(f"{header!r} and {spelled[header.lower()]!r} are one HTTP header", key=key,
                              hint="keep one of them")
        spelled[header.lower()] = header
        try:
            value = resolve(ref)
        except AuthError:
            raise _unresolved_header(header, ref, key, table) from None
        problem = _header_value_problem(value)
        if problem is not None:
            raise ConfigError(f"the value of header {header!r} (from [secrets] {ref!r}, not shown) {problem}: "
                              "an HTTP request cannot carry it as it is", key=key,
                              hint="fix the variable's value (an .env file with CRLF line ends adds a CR)")
        scheme = _SCHEMED.fullmatch(value)
        if secrets is not None and scheme is not None:
            secrets.add(scheme.group(1))
        values[header] = value
    return values


def _unresolved_header(header: str, ref: str, key: str, table: Mapping[str, str]) -> ConfigError:
    """The error for a header whose reference does not resolve, with the reason of the host's
    ``[secrets]`` table (the key missing, its keys listed; or the variable unset, named), as
    serve-mcp's ``token_ref`` error gives it; never the reference, which may be a token."""
    reason, hint = EnvironmentSecrets(table).why_missing(ref)
    if ref not in table:
        reason += "; header values must be references to [secrets] entries, never the value itself"
    return ConfigError(f"the value of header {header!r} (not shown here) {reason}", key=key, hint=hint)


def with_required_hint(exc: BaseException, server: str) -> BaseException:
    """A required server's start failure (``exc``, which stops the host), given the hint the command
    line prints: the per-server ``required = false`` is what lets the host start without it —
    ``[plugins.mcp] on_error`` is not (it governs the plugin's hooks; the host says so when it is
    set). Only typed errors carry a hint (a ``ConfigError`` has its own); ``exc`` is returned."""
    if isinstance(exc, ToolError):
        exc.details.setdefault("hint", (
            f"fix the server or its settings, or let the host start without it: [plugins.{PLUGIN}.servers.{server}] "
            "required = false (it is then started again when a call names one of its tools)"))
    return exc


def _header_value_problem(value: str) -> str | None:
    if value != value.strip(" \t"):
        return "begins or ends with a space or tab"
    if any((char < " " and char != "\t") or char == "\x7f" for char in value):
        return "holds a control character (a CR or LF, say)"
    if not value.isascii():
        return "holds a character beyond ASCII"
    return None


class McpImportPlugin:
    """Starts each configured MCP server at mount and mounts its tools as ``mcp::<server>::<tool>``.

    One instance per host. ``connections`` holds the live servers (with
    ``pid``, ``server_info``, ``hashes``); ``settings`` the checked config,
    which ``serve-mcp`` also reads (``[plugins.mcp.serve]``).
    """

    name = PLUGIN
    #: Its hooks bound their own waits: a start by ``startup_timeout_ms`` (the host's default hook
    #: timeout would cut the retry of a server left out at start).
    hook_timeout_ms = None

    def __init__(self) -> None:
        self._settings: McpSettings | None = None
        self.connections: list[Any] = []
        #: Servers with ``required = false`` that could not be started, and why.
        self.unavailable: dict[str, str] = {}
        self._coordinator: Any = None
        self._protected_now: Any = tuple
        self._writable_now: Any = tuple
        self._headers_of: dict[str, dict[str, str]] = {}
        self._secrets: Any = ()
        self._retrying: dict[str, asyncio.Lock] = {}
        self._last_attempt: dict[str, float] = {}

    @property
    def settings(self) -> McpSettings:
        """The checked ``[plugins.mcp]`` table (the defaults before mount and without one)."""
        if self._settings is None:
            from .settings import McpSettings

            self._settings = McpSettings()
        return self._settings

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> Any:
        if not config:  # the defaults, which name no server; the settings module is not even imported
            self._settings = None
            return None
        from .settings import McpSettings

        self._settings = structure_settings(config, McpSettings, f"plugins.{PLUGIN}")
        if not self.settings.servers:
            return None
        if not sdk_available():
            raise ConfigError(MISSING_SDK_MESSAGE, key=f"plugins.{PLUGIN}.servers", hint=MISSING_SDK_HINT)
        from .client import ServerConnection, import_server

        working_dir = coordinator.get_capability("session.working_dir") or "."
        found = coordinator.get_capability("session.protected_paths")
        protected = found if isinstance(found, ProtectedPaths) else ProtectedPaths()
        writable = coordinator.get_capability("session.writable_roots")
        configured = coordinator.get_capability("session.configured_paths")
        for name, server in self.settings.servers.items():  # the host refuses its own state inside these at start
            if server.sandbox != "off" and isinstance(writable, list):
                writable.extend(os.path.realpath(os.path.expanduser(p)) for p in server.sandbox_write_paths)
            if server.sandbox != "off" and isinstance(configured, list):  # checked once every plugin is mounted
                where = f"plugins.{PLUGIN}.servers.{name}"
                configured.extend((p, f"{where}.sandbox_write_paths") for p in server.sandbox_write_paths)
                configured.extend((p, f"{where}.sandbox_read_paths") for p in server.sandbox_read_paths)
                configured.extend((p, f"{where}.cwd") for p in ((server.cwd,) if server.cwd else ()))

        def protected_now() -> list[str]:
            return [entry.path for entry in protected if not entry.alias]

        def writable_now() -> list[str]:
            rules = coordinator.get_capability("fs.path_rules")
            return [working_dir, *(writable if isinstance(writable, list) else ()),
                    *getattr(rules, "write_roots", ())]

        headers = {name: self._headers(coordinator, name, server) for name, server in self.settings.servers.items()}
        self._coordinator, self._headers_of, self._protected_now = coordinator, headers, protected_now
        self._writable_now = writable_now
        coordinator.register_contributor(UNAVAILABLE_CHANNEL, PLUGIN, self._report)
        # The registry itself, not ``registry or ()``: it is empty until a secret is resolved, often
        # after this mount (a caller's resolver), and it is read at each use (found by review).
        registry = coordinator.get_capability("session.secrets")
        secrets = () if registry is None else registry
        self._secrets = secrets
        connections = [ServerConnection(name, server, working_dir, protected_now, headers[name], secrets, writable_now)
                       for name, server in self.settings.servers.items()]
        emit = self._events(coordinator)
        for connection in connections:
            connection.emit = emit
        self.connections.extend(connections)
        try:
            # Every server starts at once, each within its own startup_timeout_ms.
            imported = await asyncio.gather(*(import_server(c) for c in connections), return_exceptions=True)
            for connection, outcome in zip(connections, imported, strict=True):
                if not isinstance(outcome, BaseException):
                    try:
                        await self._mount_tools(outcome)
                        continue
                    except ContractError as refused:  # a tool the host refuses (its schema): the server's failure
                        outcome = refused
                if connection.settings.required or not isinstance(outcome, Exception):
                    raise with_required_hint(outcome, connection.name)
                reason = redact_text(str(outcome), secrets)  # a server's words may hold what it was given
                log.warning("MCP server %r is not mounted (required = false): %s; it is started again when "
                            "a call names one of its tools", connection.name, reason)
                self.unavailable[connection.name] = reason
                self._last_attempt[connection.name] = time.monotonic()
                await connection.close()
                self.connections.remove(connection)
        except BaseException:
            await self.close()
            raise
        return self.close

    def _report(self) -> list[dict[str, str]] | None:
        """The ``plugins.unavailable`` contribution: each server left out, and why."""
        return [{"plugin": PLUGIN, "name": f"mcp::{name}", "reason": reason}
                for name, reason in sorted(self.unavailable.items())] or None

    def _left_out_server(self, tool: str) -> str | None:
        """The server left out at start whose tool ``tool`` names (``mcp::<server>::…`` or
        ``mcp__<server>__…``), if any."""
        for server in self.unavailable:
            if tool.startswith((f"mcp::{server}::", f"mcp__{server}__")):
                return server
        return None

    @hookimpl
    async def tool_error(self, call: Any, spec: Any, error: Any, context: Any) -> Any:
        """A call naming a tool of a server left out at start (``required = false``) starts that
        server again — one attempt at a time, at most one per ``RETRY_AFTER_S`` — and mounts its
        tools when it starts and meets its pins. The call itself is not run here (it would skip its
        input check, hooks and policies): it fails with a retryable error saying whether to call
        again (``mcp_server_started``) or why the server is still down (``mcp_server_unavailable``)."""
        if spec is not None or getattr(error, "code", None) != "unknown_tool" or not self.unavailable:
            return None
        server = self._left_out_server(str(call.name))
        if server is None:
            return None
        lock = self._retrying.setdefault(server, asyncio.Lock())
        async with lock:
            if server in self.unavailable and time.monotonic() - self._last_attempt.get(server, 0.0) >= RETRY_AFTER_S:
                await self._retry(server)
        from ..models import ToolResult

        if server not in self.unavailable:
            return ToolResult(False, None, {
                "type": "ExecutionError", "code": "mcp_server_started", "retryable": True, "server": server,
                "message": f"MCP server {server!r} was not available at start and has started now; its tools are "
                           f"mounted: call {call.name!r} again"}, {})
        reason = self.unavailable[server].split(STDERR_TAIL_MARK)[0]  # the tail is for the operator's log only
        return ToolResult(False, None, {
            "type": "ExecutionError", "code": "mcp_server_unavailable", "retryable": True, "server": server,
            "message": f"MCP server {server!r} is not available (required = false): {reason}; it is started "
                       f"again by a call of one of its tools at most every {RETRY_AFTER_S:g} s"}, {})

    async def _retry(self, server: str) -> None:
        from .client import ServerConnection, import_server

        self._last_attempt[server] = time.monotonic()
        settings = self.settings.servers[server]
        working_dir = self._coordinator.get_capability("session.working_dir") or "."
        connection = ServerConnection(server, settings, working_dir, self._protected_now, self._headers_of[server],
                                      self._secrets, self._writable_now)
        try:
            tools = await import_server(connection)
            await self._mount_tools(tools)  # a tool the host refuses: the server's failure, as at start
        except asyncio.CancelledError:
            # Cut (the call's deadline) once the server had started: stopped, not left running
            # unowned — neither closed nor among ``connections`` (found by review).
            await connection.close()
            raise
        except Exception as exc:
            await connection.close()
            reason = redact_text(str(exc), self._secrets)
            log.warning("MCP server %r is still not available: %s", server, reason)
            self.unavailable[server] = reason
            return
        self.connections.append(connection)
        del self.unavailable[server]
        log.warning("MCP server %r has started on a later call; %d tool(s) mounted", server, len(tools))

    async def _mount_tools(self, tools: list[Any]) -> None:
        """Mount one server's tools, all or none: when the host refuses one (its schema nests too
        deep, say: found by attack, a single such tool stopped the host even with ``required =
        false``), those mounted before it are taken down again and its error (a ``ContractError``
        naming the tool) raised."""
        mounted: list[str] = []
        try:
            for tool in tools:
                await self._coordinator.mount("tools", tool)
                mounted.append(tool.name)
        except Exception:
            for name in mounted:
                await self._coordinator.unmount("tools", name)
            raise

    @staticmethod
    def _events(coordinator: Any) -> Any:
        """How servers' notifications reach the host: ``coordinator.hooks.emit`` (Amplifier's
        handlers, then every ``tool_event`` hook), which redacts every secret the host resolved
        from the data first (a server's log message may hold what it was given)."""
        hooks = coordinator.hooks

        async def emit(event: str, data: dict[str, Any]) -> None:
            await hooks.emit(event, data)

        return emit

    @staticmethod
    def _headers(coordinator: Any, name: str, server: Any) -> dict[str, str]:
        return resolve_headers(coordinator.get_capability("session.secret"), name, server,
                               coordinator.get_capability("session.secrets"), coordinator.config.get("secrets") or {})

    async def close(self) -> None:
        """Stop every server (their process groups are gone when this returns)."""
        connections, self.connections = self.connections, []
        await asyncio.gather(*(connection.close() for connection in connections), return_exceptions=True)
