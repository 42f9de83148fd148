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
from typing import TYPE_CHECKING, Any, Final

from .._markers import hookimpl
from ..errors import AuthError, ConfigError
from ..hoststate import ProtectedPaths
from ..plugin_settings import structure_settings

if TYPE_CHECKING:  # imported at the first mount with a [plugins.mcp] table, or when settings are read
    from .settings import McpSettings

#: The plugin's name and config section (``[plugins.mcp]``).
PLUGIN: Final = "mcp"

log = logging.getLogger("amplifier_tools.mcp")

__all__ = ["McpImportPlugin", "MISSING_SDK_MESSAGE", "sdk_available"]

MISSING_SDK_MESSAGE: Final = (
    "MCP servers are configured but the 'mcp' extra is not installed (pip install amplifier-tools[mcp])"
)


def sdk_available() -> bool:
    """Whether the ``mcp`` SDK can be imported (called only when it is needed)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True


class McpImportPlugin:
    """Starts each configured MCP server at mount and mounts its tools as ``mcp::<server>::<tool>``.

    One instance per host. ``connections`` holds the live servers (with
    ``pid``, ``server_info``, ``hashes``); ``settings`` the checked config,
    which ``serve-mcp`` also reads (``[plugins.mcp.serve]``).
    """

    name = PLUGIN

    def __init__(self) -> None:
        self._settings: McpSettings | None = None
        self.connections: list[Any] = []
        #: Servers with ``required = false`` that could not be started, and why.
        self.unavailable: dict[str, str] = {}

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
            raise ConfigError(MISSING_SDK_MESSAGE, key=f"plugins.{PLUGIN}.servers")
        from .client import ServerConnection, import_server

        working_dir = coordinator.get_capability("session.working_dir") or "."
        found = coordinator.get_capability("session.protected_paths")
        protected = found if isinstance(found, ProtectedPaths) else ProtectedPaths()
        writable = coordinator.get_capability("session.writable_roots")
        for server in self.settings.servers.values():  # the host refuses its own state inside these at start
            if server.sandbox != "off" and isinstance(writable, list):
                writable.extend(os.path.realpath(os.path.expanduser(p)) for p in server.sandbox_write_paths)

        def protected_now() -> list[str]:
            return [entry.path for entry in protected if not entry.alias]

        headers = {name: self._headers(coordinator, name, server) for name, server in self.settings.servers.items()}
        connections = [ServerConnection(name, server, working_dir, protected_now, headers[name])
                       for name, server in self.settings.servers.items()]
        emit = self._events(coordinator)
        for connection in connections:
            connection.emit = emit
        self.connections.extend(connections)
        try:
            # Every server starts at once, each within its own startup_timeout_ms.
            imported = await asyncio.gather(*(import_server(c) for c in connections), return_exceptions=True)
            for connection, outcome in zip(connections, imported, strict=True):
                if isinstance(outcome, BaseException):
                    if connection.settings.required or not isinstance(outcome, Exception):
                        raise outcome
                    log.warning("MCP server %r is not mounted (required = false): %s", connection.name, outcome)
                    self.unavailable[connection.name] = str(outcome)
                    await connection.close()
                    self.connections.remove(connection)
                    continue
                for tool in outcome:
                    await coordinator.mount("tools", tool)
        except BaseException:
            await self.close()
            raise
        return self.close

    @staticmethod
    def _events(coordinator: Any) -> Any:
        """How servers' notifications reach the host: ``coordinator.hooks.emit`` (Amplifier's
        handlers, then every ``tool_event`` hook), with every secret the host resolved redacted
        from the data first (a server's log message may hold what it was given)."""
        from ..redaction import redact

        hooks = coordinator.hooks
        secrets = coordinator.get_capability("session.secrets")

        async def emit(event: str, data: dict[str, Any]) -> None:
            await hooks.emit(event, redact(data, secrets=secrets or (), patterns=False))

        return emit

    @staticmethod
    def _headers(coordinator: Any, name: str, server: Any) -> dict[str, str]:
        """A ``url`` server's headers, each value resolved from its ``[secrets]`` reference (and so
        registered for redaction); ``ConfigError`` naming the header's key when one is missing."""
        resolve = coordinator.get_capability("session.secret")
        values: dict[str, str] = {}
        for header, ref in server.headers.items():
            try:
                values[header] = resolve(ref)
            except AuthError as exc:
                raise ConfigError(f"{exc.message}: add it to the host's [secrets] and set the variable",
                                  key=f"plugins.{PLUGIN}.servers.{name}.headers.{header}") from None
        return values

    async def close(self) -> None:
        """Stop every server (their process groups are gone when this returns)."""
        connections, self.connections = self.connections, []
        await asyncio.gather(*(connection.close() for connection in connections), return_exceptions=True)
