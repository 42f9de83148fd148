"""The reverse direction: this host's tools mounted on an Amplifier coordinator.

An Amplifier mount plan names this module (entry point ``tool-amplifier-tools`` in the
``amplifier.modules`` group)::

    tools:
      - module: tool-amplifier-tools
        config:
          config: amplifier-tools.toml      # optional: our configuration file (default: discovered)
          working_dir: .                    # optional: the session's working directory
          tools: ["local::fs.read_file"]    # optional: which of our tools to mount (default: all)

``mount(coordinator, config)`` starts one ``ToolHost`` (its built-in tools, plugins, policies and
audit, from our own configuration), and mounts each selected tool on the coordinator under its
model-facing name (``fs_read_file``, ``bash``). Every ``execute`` Amplifier's orchestrator makes runs
``ToolHost.call``: input and output validation, ``tool_pre``/``tool_post`` plugins, policies, the
audit record. The orchestrator's ``_tool_call_id`` becomes the call id, and the coordinator's
session id the context's ``session_id``, so Amplifier's events and our audit line up. Results come
back as ``amplifier_core.ToolResult`` (``success``, ``output``, ``error`` with our typed error's
fields), and a failed call is a result, never an exception. The host closes through the
coordinator's cleanup.

Installed Amplifier modules (``amplifier.modules`` entry points) are not loaded into this host
unless our configuration's ``modules`` names them: the Amplifier session mounts its own.

Limits: Amplifier's own ``tool:pre`` hooks run in its orchestrator before ``execute``; ours run
inside it, so a call passes both (each can deny). The principal, role and scopes of each call are
the host's configured ``[context]``; Amplifier passes no caller identity to a tool.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs

from .content import amplifier_spelling, blocks_of
from .errors import ConfigError
from .host import ToolHost
from .integrations._common import framework_call_id
from .models import MAX_NAME, ToolResult, identifier_problem
from .redaction import chain_without_secrets
from .registry import MountedTool

log = logging.getLogger("amplifier_tools")

#: Keys of this module's config in an Amplifier mount plan.
CONFIG_KEYS = frozenset({"config", "working_dir", "tools"})


class AmplifierTool:
    """One of our tools as Amplifier's ``Tool`` protocol: ``name``, ``description``,
    ``input_schema``, ``async execute(input) -> ToolResult``."""

    def __init__(self, host: ToolHost, mounted: MountedTool, session_id: str | None) -> None:
        self._host = host
        self._canonical = mounted.spec.name
        self._session_id = session_id
        self.name = mounted.model_name
        self.description = mounted.spec.description
        self.input_schema = dict(mounted.spec.input_schema)

    def get_schema(self) -> dict[str, Any]:
        return self.input_schema

    async def execute(self, input: dict[str, Any]) -> Any:
        arguments = dict(input) if isinstance(input, Mapping) else input
        call_id = arguments.pop("_tool_call_id", None) if isinstance(arguments, dict) else None
        context = self._host.default_context
        if self._session_id and context.session_id != self._session_id:
            context = attrs.evolve(context, session_id=self._session_id)
        # A provider's id the host would refuse (too long, control characters) gets a bounded stand-in.
        result = await self._host.call(self._canonical, arguments, context=context,
                                       call_id=framework_call_id(call_id) if isinstance(call_id, str) else None)
        return to_amplifier_result(result)


def to_amplifier_result(result: ToolResult) -> Any:
    """Our result as ``amplifier_core.ToolResult`` (amplifier-core is installed wherever an
    Amplifier coordinator mounts this module)."""
    from amplifier_core import ToolResult as AmplifierResult

    error = None
    if not result.success:
        error = dict(result.error or {})
        error.setdefault("message", "the call failed")
    # Amplifier has text and image blocks: an imported MCP tool's audio or resources reach it as text.
    content = [amplifier_spelling(block) for block in blocks_of(result.metadata)]
    return AmplifierResult(success=result.success, output=result.output, error=error, content=content or None)


def _settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
    settings = dict(config or {})
    unknown = set(settings) - CONFIG_KEYS
    if unknown:
        raise ConfigError(f"unknown key {sorted(unknown)[0]!r} (expected one of {sorted(CONFIG_KEYS)})",
                          key="tool-amplifier-tools.config")
    tools = settings.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)):
        raise ConfigError("must be a list of tool names", key="tool-amplifier-tools.config.tools")
    for key in ("config", "working_dir"):
        if settings.get(key) is not None and not isinstance(settings[key], str):
            raise ConfigError("must be a path", key=f"tool-amplifier-tools.config.{key}")
    return settings


async def mount(coordinator: Any, config: Mapping[str, Any] | None = None) -> list[AmplifierTool]:
    """Start a ``ToolHost`` and mount its tools on the Amplifier ``coordinator``; returns them."""
    settings = _settings(config)
    # The session mounts its own Amplifier modules; loading every installed one again inside our host
    # would mount a second tool-bash (or any module's tools) beside ours.
    host = ToolHost(config=settings.get("config"), working_dir=settings.get("working_dir"), installed_modules=False)
    await host.start()
    try:
        wanted = settings.get("tools")
        selected = []
        for name in wanted if wanted is not None else [m.spec.name for m in host.tools]:
            mounted = host.tools.resolve(name)
            if mounted is None:
                raise ConfigError(f"names no tool of this host ({', '.join(sorted(s.name for s in host.specs))})",
                                  key="tool-amplifier-tools.config.tools")
            selected.append(mounted)
        session_id = getattr(coordinator, "session_id", None)
        if session_id is not None and (refused := identifier_problem(session_id, (), MAX_NAME)) is not None:
            # Not a session id the host takes (ToolContext refuses it): the calls keep the host's own.
            log.warning("tool-amplifier-tools: the session's id %s; calls are recorded under the host's "
                        "session id", refused)
            session_id = None
        tools = [AmplifierTool(host, mounted, session_id) for mounted in selected]
        for number, tool in enumerate(tools):
            try:
                await coordinator.mount("tools", tool, name=tool.name)
            except BaseException:
                # Amplifier's session logs a module that fails to mount and goes on: the tools
                # mounted before would stay, each call failing on the closed host (found by attack).
                for done in reversed(tools[:number]):
                    try:
                        await coordinator.unmount("tools", done.name)
                    except Exception as exc:  # its traceback without the host's secrets
                        log.error("could not unmount tool %r after the mount failed", done.name,
                                  exc_info=chain_without_secrets(exc, host.secrets))
                raise
    except BaseException:
        await host.close()
        raise
    coordinator.register_cleanup(host.close)
    return tools
