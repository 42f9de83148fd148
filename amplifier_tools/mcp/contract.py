"""Contracts for imported MCP tools: effect from annotations, ``ToolSpec`` from a definition.

MCP annotations come from the server and are untrusted hints. They only pick
a default effect; config overrides it (``[plugins.mcp.servers.<s>.tools."<t>"]
effect``, or the host's ``[tools."mcp::<s>::<t>"]`` section). Missing hints
take the MCP defaults (not read-only, destructive, not idempotent, open
world), which map to ``ExternalSideEffects``: nothing is retried unless a
hint or the config says it is safe. Works on plain JSON data; never needs
the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..spec import SEMVER_PATTERN, Effect, Policies, ToolSpec


def effect_from_annotations(annotations: Mapping[str, Any] | None) -> Effect:
    """The effect the hints claim.

    ``readOnlyHint`` -> ``Pure``; otherwise ``idempotentHint`` ->
    ``IdempotentWrite``; otherwise ``openWorldHint`` (default true) ->
    ``ExternalSideEffects``, and a closed-world write -> ``NonIdempotentWrite``.
    """
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:
        return Effect.Pure
    if hints.get("idempotentHint") is True:
        return Effect.IdempotentWrite
    if hints.get("openWorldHint", True) is False:
        return Effect.NonIdempotentWrite
    return Effect.ExternalSideEffects


def spec_version(server_version: str | None) -> str:
    """The server's version when it is SemVer, else ``0.0.0`` (the raw one goes into the tags)."""
    if server_version and SEMVER_PATTERN.match(server_version):
        return server_version
    return "0.0.0"


def build_spec(
    *,
    server: str,
    definition: Mapping[str, Any],
    digest: str,
    server_name: str | None,
    server_version: str | None,
    effect: Effect | None = None,
    timeout_ms: float | None = None,
) -> ToolSpec:
    """The contract of ``mcp::<server>::<tool>`` from the server's tool definition.

    ``effect`` (from config) wins over the annotations. The server's reported
    name is the spec's ``owner``; its version is the spec's ``version`` (if
    SemVer) and a ``mcp-server-version:`` tag; the definition hash is a tag
    ``sha256:...``. The annotations are kept as given (``annotations``: shown to MCP clients and by
    ``describe``); only the effect is derived from them. Raises ``ValueError`` (from ``ToolSpec``) on an invalid name.
    """
    annotations = definition.get("annotations") or {}
    tags = ["mcp", f"mcp-server:{server}", digest]
    if server_version:
        tags.append(f"mcp-server-version:{server_version}")
    return ToolSpec(
        name=f"mcp::{server}::{definition['name']}",
        description=definition.get("description") or "",
        version=spec_version(server_version),
        title=definition.get("title") or annotations.get("title"),
        owner=server_name,
        tags=tuple(tags),
        input_schema=dict(definition.get("inputSchema") or {"type": "object"}),
        output_schema=definition.get("outputSchema"),
        effect=effect if effect is not None else effect_from_annotations(annotations),
        annotations=dict(annotations),
        policies=Policies(timeout_ms=timeout_ms),
    )
