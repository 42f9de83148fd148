"""Serving the host's tools to MCP clients over stdio (``amplifier-tools serve-mcp``).

Every ``tools/call`` runs through ``ToolHost.call``: the same input checks,
``tool_pre``/``tool_post`` hooks, policies and audit records as any other
call. The caller is the principal, role, environment and scopes of
``[plugins.mcp.serve]`` (falling back to the host's ``[context]``); an MCP
client cannot claim other rights. Every failure — veto, policy, contract,
tool error — reaches the client as an ``isError`` result whose text is
``{"error": {...}}`` with the typed error dict, never as a protocol error.
Tools are listed under their model-facing names (``fs_read_file``) with
annotations derived from their effects (``definitions.mcp_annotations``).

Limits: stdio only; the client's identity is whatever the config says (there
is no authentication on stdio: whoever can start the process is the caller).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import attrs
import mcp_types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from ..config import plugin_section
from ..errors import ConfigError
from ..host import ToolHost
from ..models import ToolContext, ToolResult
from ..plugin_settings import structure_settings
from .settings import PLUGIN, McpSettings, ServeSettings


def serve_settings(host: ToolHost) -> ServeSettings:
    """The ``[plugins.mcp.serve]`` settings of ``host`` (checked; defaults when absent)."""
    plugin = host.plugin_manager.get_plugin(PLUGIN)
    settings = getattr(plugin, "settings", None)
    serve = getattr(settings, "serve", None)
    if isinstance(serve, ServeSettings):
        return serve
    own, _ = plugin_section(host.config, PLUGIN)
    return structure_settings(own, McpSettings, f"plugins.{PLUGIN}").serve


def caller_context(host: ToolHost, settings: ServeSettings) -> ToolContext:
    """The context every call from the MCP client runs with."""
    base = host.default_context
    return attrs.evolve(
        base,
        principal=settings.principal if settings.principal is not None else base.principal,
        role=settings.role if settings.role is not None else base.role,
        environment=settings.environment if settings.environment is not None else base.environment,
        scopes=frozenset(settings.scopes) if settings.scopes is not None else base.scopes,
        attributes={**base.attributes, "transport": "mcp-stdio"},
    )


def to_call_tool_result(result: ToolResult) -> mcp_types.CallToolResult:
    """A ``ToolResult`` as MCP sees it: text (and ``structuredContent`` for object
    output) on success; ``isError`` with ``{"error": {...}}`` text on failure."""
    if not result.success:
        text = json.dumps({"error": result.error}, ensure_ascii=False, default=str)
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], is_error=True)
    text = result.get_serialized_output(max_chars=None)
    structured = result.output if isinstance(result.output, dict) else None
    blocks = content_blocks(result.metadata.get("content"))
    return mcp_types.CallToolResult(content=blocks or [mcp_types.TextContent(type="text", text=text)],
                                    structured_content=structured)


def content_blocks(blocks: Any) -> list[mcp_types.ContentBlock]:
    """A result's rich content (``metadata["content"]``: text and image blocks, in Amplifier's
    ``{"type": "image", "source": {"media_type", "data"}}`` or MCP's ``{"data", "mimeType"}``
    spelling) as MCP content blocks; ``[]`` when there are none or one cannot be carried, so the
    caller falls back to the text rendering rather than sending part of the content."""
    if not isinstance(blocks, list) or not blocks:
        return []
    converted: list[mcp_types.ContentBlock] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            converted.append(mcp_types.TextContent(type="text", text=block["text"]))
            continue
        if kind == "image":
            source = block.get("source") if isinstance(block.get("source"), dict) else block
            data = source.get("data")
            mime = source.get("media_type") or source.get("mimeType")
            if isinstance(data, str) and isinstance(mime, str):
                converted.append(mcp_types.ImageContent(type="image", data=data, mime_type=mime))
                continue
        return []
    return converted


def build_server(host: ToolHost, settings: ServeSettings | None = None) -> Server[Any]:
    """An SDK low-level ``Server`` exposing ``host``'s tools (or ``settings.tools`` only).

    Raises ``ConfigError`` when ``settings.tools`` names a tool that is not mounted.
    """
    settings = settings or serve_settings(host)
    context = caller_context(host, settings)
    definitions = host.tool_definitions("mcp")
    if settings.tools is not None:
        mounted = {spec.name for spec in host.specs}
        for name in settings.tools:
            if name not in mounted:
                raise ConfigError(f"names no mounted tool {name!r}", key=f"plugins.{PLUGIN}.serve.tools")
        exposed = set(settings.tools)
        definitions = [d for d in definitions if d["_meta"]["amplifier_tools/name"] in exposed]
    tools = [mcp_types.Tool.model_validate(d, by_name=False) for d in definitions]
    by_name: Mapping[str, str] = {d["name"]: d["_meta"]["amplifier_tools/name"] for d in definitions}

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        # Only exposed tools, by the names we listed; anything else is the host's
        # unknown-tool ContractError, as an isError result.
        name = by_name.get(params.name, f"(not exposed) {params.name}")
        result = await host.call(name, params.arguments if params.arguments is not None else {}, context=context)
        return to_call_tool_result(result)

    return Server(settings.name, version=host_version(), on_list_tools=list_tools, on_call_tool=call_tool)


def host_version() -> str:
    from .._version import __version__

    return __version__


async def serve(host: ToolHost, settings: ServeSettings | None = None) -> None:
    """Serve ``host``'s tools over this process's stdin/stdout until the client closes stdin."""
    server = build_server(host, settings)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_stdio(
    host_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    working_dir: str | os.PathLike[str] | None = None,
    builtins: bool = True,
    entry_points: bool = True,
) -> None:
    """Start a ``ToolHost`` from ``host_config`` (a mapping, a file, or discovered)
    and serve its tools over stdio; the host closes when the client goes away."""
    async with ToolHost(config=host_config, working_dir=working_dir, builtins=builtins,
                        entry_points=entry_points) as host:
        await serve(host)
