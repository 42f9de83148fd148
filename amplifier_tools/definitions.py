"""Tool definitions for model APIs, and the reversible model-facing names.

Model APIs accept names matching ``^[a-zA-Z0-9_-]{1,64}$``; canonical names
(``local::fs.write``, ``mcp::github::issues.create``) do not. ``model_name``
derives the short name (``fs_write``, ``mcp__github__issues_create``); the
host keeps the mapping both ways, refuses a mount whose short name collides
with another tool's, and accepts either form in ``ToolHost.call``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Final

from .spec import Effect, ToolSpec

FORMATS: Final = ("openai", "anthropic", "mcp")
#: ``_meta`` keys of an MCP tool definition: the tool's contract name and version. The prefix is a
#: label (letters, digits, hyphens) and a slash, as the MCP spec requires of ``_meta`` keys.
META_NAME: Final = "amplifier-tools/name"
META_VERSION: Final = "amplifier-tools/version"
_INVALID: Final = re.compile(r"[^A-Za-z0-9_-]")


def model_name(canonical: str) -> str:
    """The API-safe short name of a canonical tool name.

    The default ``local::`` origin is dropped, ``::`` becomes ``__`` and ``.``
    becomes ``_``; names longer than 64 characters keep a prefix and a hash of
    the full name, so different long names stay different.
    """
    name = canonical[len("local::"):] if canonical.startswith("local::") else canonical
    name = _INVALID.sub("_", name.replace("::", "__"))
    if len(name) > 64:
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
        name = f"{name[:55]}_{digest}"
    return name


def mcp_annotations(spec: ToolSpec) -> dict[str, Any]:
    """The tool's MCP annotations: ``spec.annotations`` as given when set (an imported tool's
    upstream hints), else derived from the tool's effect."""
    if spec.annotations is not None:
        return dict(spec.annotations)
    effect = spec.effect
    return {
        "title": spec.title or spec.name,
        "readOnlyHint": effect is Effect.Pure,
        "idempotentHint": effect in (Effect.Pure, Effect.IdempotentWrite),
        "destructiveHint": effect in (Effect.NonIdempotentWrite, Effect.ExternalSideEffects),
        "openWorldHint": effect is Effect.ExternalSideEffects,
    }


def tool_definition(spec: ToolSpec, fmt: str) -> dict[str, Any]:
    """One tool's definition for ``fmt`` (``"openai"``, ``"anthropic"`` or ``"mcp"``)."""
    short = model_name(spec.name)
    description = spec.description or spec.title or spec.name
    if fmt == "openai":
        return {
            "type": "function",
            "function": {"name": short, "description": description, "parameters": spec.input_schema},
        }
    if fmt == "anthropic":
        return {"name": short, "description": description, "input_schema": spec.input_schema}
    if fmt == "mcp":
        definition: dict[str, Any] = {
            "name": short,
            "title": spec.title or spec.name,
            "description": description,
            "inputSchema": spec.input_schema,
            "_meta": {META_NAME: spec.name, META_VERSION: spec.version},
        }
        annotations = mcp_annotations(spec)
        if annotations:  # an imported tool given no hints is served with none
            definition["annotations"] = annotations
        if spec.output_schema is not None and spec.output_schema.get("type") == "object":
            # MCP sends structured output only as an object (``structuredContent``), and its
            # ``outputSchema`` takes an object root only (before 2026-07-28 on the wire; the SDK's
            # client, whatever the version, requires ``structuredContent`` of a tool that declares
            # one). Found by a newcomer's trial: one served tool declaring ``{"type": "integer"}``
            # made every ``tools/list`` fail, and the client saw no tool at all. The host still
            # checks the output against the whole schema.
            definition["outputSchema"] = spec.output_schema
        return definition
    raise ValueError(f"unknown tool definition format {fmt!r}; expected one of {', '.join(FORMATS)}")


def tool_definitions(specs: Iterable[ToolSpec], fmt: str) -> list[dict[str, Any]]:
    """Definitions of all ``specs`` for ``fmt``, in the order given."""
    return [tool_definition(spec, fmt) for spec in specs]
