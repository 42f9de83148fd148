"""What every framework adapter shares: picking tools, building the call's ``ToolContext``, and
the text a model sees. Imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

import attrs

from ..definitions import model_name
from ..host import ToolHost
from ..models import ToolContext, ToolResult
from ..spec import ToolSpec

__all__ = ["ContextSource", "call_context", "is_strict_schema", "model_text", "select_specs"]

F = TypeVar("F")

#: Where a call's ``ToolContext`` comes from: nothing (the host's default context), one fixed
#: context, or a function of the framework's run context (its deps, config or tool context).
ContextSource = Union[ToolContext, Callable[[F], ToolContext], None]


def select_specs(host: ToolHost, tools: Iterable[str] | None) -> list[ToolSpec]:
    """The contracts of ``tools`` (canonical or model-facing names), or of every mounted tool.

    An unknown name is a ``ValueError`` naming it and what is mounted: a typo must not silently
    leave a tool out of the agent.
    """
    if tools is None:
        return host.specs
    if isinstance(tools, str):
        raise TypeError("tools must be a list of tool names, not one string")
    chosen: list[ToolSpec] = []
    for name in tools:
        mounted = host.tools.resolve(name)
        if mounted is None:
            known = ", ".join(sorted(model_name(spec.name) for spec in host.specs)) or "none"
            raise ValueError(f"tools: {name!r} names no tool mounted on the host (mounted: {known})")
        if mounted.spec not in chosen:
            chosen.append(mounted.spec)
    return chosen


def call_context(host: ToolHost, source: ContextSource[F], framework_context: F,
                 trace_id: str | None = None) -> ToolContext:
    """The ``ToolContext`` for one call, from ``source``; ``trace_id`` (the framework's own
    correlation id) fills the context's ``trace_id`` when the source left it unset.

    A mapping function that returns anything but a ``ToolContext`` is a ``TypeError``: running the
    call under some other principal than the one meant would fail open.
    """
    if source is None:
        context = host.default_context
    elif isinstance(source, ToolContext):
        context = source
    else:
        context = source(framework_context)
        if not isinstance(context, ToolContext):
            raise TypeError(f"the context function {getattr(source, '__qualname__', source)!r} returned "
                            f"{type(context).__name__}, not a ToolContext")
    if trace_id is not None and context.trace_id is None:
        context = attrs.evolve(context, trace_id=trace_id)
    return context


def model_text(result: ToolResult, max_chars: int | None = None) -> str:
    """The text a model sees: the output, or ``Error (<type>, <code>): <message>``.

    The error's category and code come first so a model (and a person reading the transcript) can
    tell a policy denial from a bad argument from a broken tool; the message is the host's
    sanitized one, which names the offending field for a contract error.
    """
    if result.success:
        return result.get_serialized_output(max_chars)
    error = result.error or {}
    text = f"Error ({error.get('type', 'SystemError')}, {error.get('code', 'error')}): " \
           f"{error.get('message', 'unknown error')}"
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars] + f"\n\n[Truncated: {len(text) - max_chars} characters omitted]"
    return text


def is_strict_schema(schema: Any) -> bool:
    """Whether ``schema`` already is what OpenAI's strict mode demands, so that turning strict mode
    on changes nothing: an object root, and every object closed (``additionalProperties: false``)
    with every property required. A schema with optional properties is not: strict mode would make
    them required, and the model could no longer leave them out.
    """
    return isinstance(schema, dict) and schema.get("type") == "object" and _closed(schema)


def _closed(node: Any) -> bool:
    if isinstance(node, list):
        return all(_closed(item) for item in node)
    if not isinstance(node, dict):
        return True
    kind = node.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node
    if is_object:
        properties = node.get("properties", {})
        if node.get("additionalProperties") is not False or not isinstance(properties, dict):
            return False
        if set(node.get("required", ())) != set(properties):
            return False
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            if not isinstance(value, dict) or not all(_closed(v) for v in value.values()):
                return False
        elif key in ("items", "anyOf", "allOf", "oneOf", "prefixItems", "not", "additionalProperties") \
                and not _closed(value):
            return False
    return True
