"""What every framework adapter shares: refusing an unstarted host, picking tools, building the
call's ``ToolContext``, bounding the framework's call id, parsing the model's argument text, and
the text a model sees. Imports no framework, and never decides a call itself: whatever the model
sent reaches the host (``call_host``), which validates and records it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

import attrs

from .._json import utf8_text
from ..content import Part, blocks_of, is_base64, render
from ..content import model_parts as content_parts
from ..definitions import model_name
from ..host import ToolHost
from ..models import (
    MAX_CALL_ID,
    ContextFieldError,
    ToolCall,
    ToolContext,
    ToolResult,
    new_call_id,
    output_text,
    truncate_text,
)
from ..redaction import RecordingResolver
from ..spec import ToolSpec

__all__ = ["ContextSource", "call_context", "call_host", "framework_call_id", "is_strict_schema", "media_block",
           "model_parts", "model_text", "parse_arguments", "require_started", "rich_result", "select_specs",
           "sendable", "sendable_schema"]

log = logging.getLogger("amplifier_tools.integrations")

F = TypeVar("F")

#: Where a call's ``ToolContext`` comes from: nothing (the host's default context), one fixed
#: context, or a function of the framework's run context (its deps, config or tool context).
ContextSource = Union[ToolContext, Callable[[F], ToolContext], None]


def require_started(host: ToolHost) -> None:
    """Refuse a host that is not started: its tools are not mounted yet, so the adapter would
    silently offer none (or a closed host, whose calls all fail)."""
    if not host.started:
        # Also for a host closed under a running agent (found by a helper: "start it first" sent the
        # user looking for a start that had happened).
        raise RuntimeError("the host is not started, or was closed: start it first (`async with ToolHost(...) as "
                           "host:` or `await host.start()`) and keep it open while the agent runs; a closed host "
                           "cannot start again: make a new ToolHost")


def select_specs(host: ToolHost, tools: Iterable[str] | None, *, skip_unmounted: bool = False) -> list[ToolSpec]:
    """The contracts of ``tools`` (canonical or model-facing names), or of every mounted tool.

    An unknown name is a ``ValueError`` naming it and what is mounted: a typo must not silently
    leave a tool out of the agent. With ``skip_unmounted`` (a toolset reading the host again at a
    later run step, after the names were checked once) a name whose tool was unmounted since is
    left out with a warning instead.
    """
    require_started(host)
    if tools is None:
        return host.specs
    if isinstance(tools, str):
        raise TypeError("tools must be a list of tool names, not one string")
    chosen: list[ToolSpec] = []
    for name in tools:
        mounted = host.tools.resolve(name)
        if mounted is None:
            known = ", ".join(sorted(model_name(spec.name) for spec in host.specs)) or "none"
            if skip_unmounted:
                log.warning("tools: %r is no longer mounted on the host; not offered (mounted: %s)", name, known)
                continue
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
        try:
            context = attrs.evolve(context, trace_id=trace_id if isinstance(trace_id, str) else str(trace_id))
        except ContextFieldError as wrong:
            # Found by attack: the Agents SDK takes any ``RunConfig(trace_id=...)`` and LangGraph any
            # ``config={"run_id": ...}``; one the host refuses as a trace id (300 characters, a
            # non-ASCII letter) raised here, so every tool call of the run failed (the Agents SDK's
            # ``UserError``, LangGraph's run ended) and none was recorded. Its bounded stand-in
            # (``framework_call_id``'s) is used instead, or none.
            if wrong.field != "trace_id":
                raise
            bounded = framework_call_id(str(trace_id))
            try:
                context = attrs.evolve(context, trace_id=bounded)
            except ContextFieldError:
                log.warning("the framework's trace id is no id the host takes (%s); the call runs without one",
                            wrong)
    return context


def framework_call_id(call_id: object) -> str | None:
    """The host's call id for a framework's tool-call id: the id itself when it is printable ASCII
    of at most ``MAX_CALL_ID`` characters (what every framework sends; the host's own bound,
    ``models.identifier_problem``, which also refuses one holding a secret); otherwise a bounded,
    printable stand-in — its printable prefix and a hash of the whole — so a model cannot put
    200 KB or control characters into the audit log's ids, and the same id still maps to the same
    call id. An empty or missing id is ``None`` (the host makes one).
    """
    if not call_id:
        return None
    if not isinstance(call_id, str):  # frameworks are not type-checked: an id may be anything
        call_id = str(call_id)
    if len(call_id) <= MAX_CALL_ID and call_id.isascii() and call_id.isprintable():
        return call_id
    prefix = "".join(c for c in call_id[:64] if c.isascii() and c.isprintable())
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{prefix}~{digest}"


def parse_arguments(text: str | None) -> tuple[Any, str | None]:
    """A model's JSON argument string as data, and why it is not JSON (``None`` when it is).

    Text that does not parse, or is nested too deeply to parse, is returned as it is, so that the
    host refuses it as a ``ContractError`` and records the call like any other. An empty text is
    no arguments (``{}``, as the frameworks' own tools read it); the JSON text ``null`` is not:
    it parses to ``None``, which :func:`call_host` hands on as it is, for the host to refuse.
    """
    if not text:
        return {}, None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        return text, f"the arguments are not valid JSON: {exc}"
    except RecursionError:
        return text, "the arguments are not valid JSON: nested too deeply"
    if parsed is None:
        return None, "the arguments are JSON null, not an object"
    return parsed, None


async def call_host(host: ToolHost, name: str, arguments: Any, context: ToolContext,
                    call_id: str | None) -> ToolResult:
    """One call through ``host`` with exactly the arguments the model sent.

    Not ``host.call``: it reads ``arguments=None`` as "no arguments" and runs the tool with ``{}``,
    so a model sending the JSON text ``null`` (found by attack: the Agents SDK and Pydantic AI
    adapters ran a tool whose arguments are all optional with its defaults, recorded ``ok``) got a
    call the contract never allowed. The ``ToolCall`` carries ``None`` instead, which the host
    refuses as a ``ContractError`` and records.
    """
    return await host.execute(ToolCall(call_id or new_call_id(), name, arguments), context)


def model_text(result: ToolResult, max_chars: int | None = None, parse_problem: str | None = None) -> str:
    """The text a model sees: the output, or ``Error (<type>, <code>): <message>``.

    The error's category and code come first so a model (and a person reading the transcript) can
    tell a policy denial from a bad argument from a broken tool; the message is the host's
    sanitized one, which names the offending field for a contract error.
    """
    if result.success:
        return sendable(result.get_serialized_output(max_chars))
    error = result.error or {}
    text = f"Error ({error.get('type', 'SystemError')}, {error.get('code', 'error')}): " \
           f"{error.get('message', 'unknown error')}"
    if parse_problem is not None and error.get("type") == "ContractError":
        text += f" ({parse_problem})"
    return sendable(truncate_text(text, max_chars))


def sendable(text: str) -> str:
    """``text`` with its lone surrogates escaped (``\\udcff``), as the audit record escapes them:
    text a framework's HTTP client can encode as UTF-8. Found by attack: a tool that echoes what the
    model sent (JSON ``"\\ud83d"``, half an emoji) or lists a file whose name is not UTF-8
    (``fs.glob``: Python's ``surrogateescape`` names) returned a lone surrogate, the adapters
    handed it on, and the next model request of the run raised ``UnicodeEncodeError`` in the
    OpenAI client (Agents SDK, Pydantic AI): the whole agent run ended, the call recorded ``ok``."""
    return text if text.isascii() else utf8_text(text)


def sendable_schema(value: Any) -> Any:
    """A JSON schema (or any JSON value) with the lone surrogates of its strings and keys escaped as
    ``sendable`` escapes them; ``value`` itself when it has none. Found by review: the adapters
    escaped a tool's description but handed its input schema on as it was, and OpenAI's client
    raised ``UnicodeEncodeError`` at a run's first request for a server whose schema held
    ``"\\ud83d"`` (a property's description): every agent run offered that tool ended."""
    if isinstance(value, str):
        return sendable(value)
    if isinstance(value, dict):
        pairs = [(key, item, sendable(key) if isinstance(key, str) else key, sendable_schema(item))
                 for key, item in value.items()]
        if all(new_key is key and new_item is item for key, item, new_key, new_item in pairs):
            return value
        return {new_key: new_item for _, _, new_key, new_item in pairs}
    if isinstance(value, list):
        escaped = [sendable_schema(item) for item in value]
        return value if all(new is old for new, old in zip(escaped, value, strict=True)) else escaped
    return value


def model_parts(result: ToolResult, max_chars: int | None = None) -> list[Part] | None:
    """What a model is shown of a successful ``result`` whose content holds an image or a file:
    its parts (``amplifier_tools.content.model_parts``), in the blocks' order when the output is
    just the blocks rendered (an imported MCP result), else the output's text first and then the
    images and files. Text is cut, together, at ``max_chars`` with a notice, as ``model_text``
    cuts. None for a failure, or for a result whose content has no image or file: its text
    (``model_text``) says it all.

    Found by trial: every adapter showed a model a tool's image as a line naming it
    (``[image: image/png, 4096 bytes]``), never the picture, though each framework can send one."""
    blocks = blocks_of(result.metadata) if result.success else []
    parts = content_parts(blocks) if blocks else None
    if parts is None:
        return None
    if result.output is not None and result.output != render(blocks):
        parts = [("text", output_text(result.output), None, None), *(part for part in parts if part[0] != "text")]
    budget = max_chars
    shown: list[Part] = []
    for part in parts:
        text = part[1]
        if part[0] == "text" and budget is not None:
            if len(text) > budget:
                part = ("text", truncate_text(text, budget), None, None)
                budget = 0
            else:
                budget -= len(text)
        if part[0] == "text":
            part = ("text", sendable(part[1]), None, None)
        elif isinstance(part[3], str):
            part = (part[0], part[1], part[2], sendable(part[3]))
        shown.append(part)
    return shown


def media_block(url: str | None, file_id: str | None, kind: str, filename: str | None) -> dict[str, Any]:
    """An image or file a framework's tool returned as a content block (MCP spelling): a base64
    data URL as its data (an image block, or an embedded resource for a file), any other URL as a
    resource link, an uploaded file's id as a line naming it. Found by attack: any file URL but
    http(s) and file (``s3://bucket/key.pdf``) was kept as the file's base64 data, and the URL lost."""
    if url is not None and url.startswith("data:") and ";base64," in url:
        mime, data = url[len("data:"):].split(";base64,", 1)
        mime = mime.split(";", 1)[0]  # ``image/png;name=a.png``: its parameters are no media type
        if kind == "image":
            return {"type": "image", "data": data, "mimeType": mime or "application/octet-stream"}
        return {"type": "resource", "resource": {"uri": f"file:///{filename or 'file'}", "blob": data,
                                                 "mimeType": mime or "application/octet-stream"}}
    if url is not None and kind == "file" and is_base64(url):  # the Agents SDK's file_data: base64 alone
        return {"type": "resource", "resource": {"uri": f"file:///{filename or 'file'}", "blob": url}}
    if url is not None:
        return {"type": "resource_link", "uri": url, "name": filename or kind}
    return {"type": "text", "text": f"[{kind}: file id {file_id}]"}


def rich_result(blocks: list[dict[str, Any]], context: ToolContext | None) -> ToolResult:
    """A framework tool's text, image and file outputs (already content blocks, MCP spelling) as
    the host's successful result: the blocks in ``metadata["content"]``, their rendering as the
    output. Rendered with the host's secrets (the registry the call's resolver records into): the
    rendering cuts long URIs and folds whitespace, after which the host's scrub of the text no
    longer finds a secret cut in two (found by attack: a token's head at the cut of a file URL
    reached the model and the audit record). As the MCP client renders."""
    resolver = context.secrets if context is not None else None
    secrets = resolver.registry if isinstance(resolver, RecordingResolver) else ()
    return ToolResult(success=True, output=render(blocks, secrets), metadata={"content": blocks})


#: The keywords OpenAI's strict mode accepts in a schema (structured outputs' supported subset);
#: a schema using any other (``not``, ``if``/``then``, ``patternProperties``, ``oneOf``, ``allOf``,
#: ``default``, ...) is offered without strict mode.
STRICT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum", "const", "$ref", "$defs",
    "definitions", "description", "title", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
})
_JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def is_strict_schema(schema: Any) -> bool:
    """Whether ``schema`` already is what OpenAI's strict mode demands, so that turning strict mode
    on changes nothing: an object root; every object closed (``additionalProperties: false``) with
    every property required; every subschema saying what it is (``type``, ``anyOf``, ``$ref``,
    ``enum`` or ``const``; ``{}`` is not) with only the keywords strict mode supports, and a
    ``$ref`` with no siblings pointing at the root or a top-level definition (``#/$defs/...``);
    every array saying what its items are; a ``format`` strict mode knows (``STRICT_FORMATS``), a
    ``pattern`` without lookaround; within strict mode's size limits
    (``STRICT_MAX_DEPTH`` levels of nested objects, ``STRICT_MAX_PROPERTIES`` properties). A schema
    with optional properties is not: strict mode would make them required, and the model could no
    longer leave them out. Anything else a framework would rewrite (Pydantic AI moves an unknown
    ``format`` into the description) or refuse (an untyped array ends its run with a ``UserError``).
    """
    return (isinstance(schema, dict) and schema.get("type") == "object" and _strict(schema)
            and _within_strict_limits(schema))


#: The string formats OpenAI's strict mode supports.
STRICT_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
#: OpenAI's strict mode limits: levels of nested objects, and object properties in all.
STRICT_MAX_DEPTH = 10
STRICT_MAX_PROPERTIES = 5000
_LOOKAROUND = ("(?=", "(?!", "(?<=", "(?<!")
#: The ``$ref`` pointers strict mode resolves: the root (recursion) and a top-level definition. A
#: pointer elsewhere (``#/properties/from``, as zod-to-json-schema writes a reused subschema) is
#: refused by the API in strict mode (found by attack: both adapters offered such a schema as strict).
_STRICT_REF = re.compile(r"#(?:/(?:\$defs|definitions)/[^/]+)?")


def _within_strict_limits(schema: dict[str, Any]) -> bool:
    """Whether the schema and each of its definitions stay within strict mode's size limits
    (counted apart, ``$ref`` not followed, as the API counts them)."""
    parts = [schema, *(definitions for key in ("$defs", "definitions")
                       for definitions in schema.get(key, {}).values())]
    for part in parts:
        depth_max, properties = 0, 0
        stack: list[tuple[Any, int]] = [(part, 0)]
        while stack:
            node, depth = stack.pop()
            if not isinstance(node, dict):
                continue
            if isinstance(node.get("properties"), dict):
                depth += 1
                depth_max = max(depth_max, depth)
                properties += len(node["properties"])
                stack.extend((value, depth) for value in node["properties"].values())
            stack.extend((value, depth) for value in node.get("anyOf", []) or [])
            if "items" in node:
                stack.append((node["items"], depth))
        if depth_max > STRICT_MAX_DEPTH or properties > STRICT_MAX_PROPERTIES:
            return False
    return True


def _strict(node: Any) -> bool:
    if not isinstance(node, dict) or not node or not set(node) <= STRICT_KEYWORDS:
        return False
    if "$ref" in node and (len(node) > 1 or not isinstance(node["$ref"], str)
                           or not _STRICT_REF.fullmatch(node["$ref"])):
        return False
    if not {"type", "anyOf", "$ref", "enum", "const"} & set(node):
        return False
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in _JSON_TYPES for k in kinds):
        return False
    if "array" in kinds and "items" not in node:  # strict mode needs the items' type
        return False
    if "format" in node and not (isinstance(node["format"], str) and node["format"] in STRICT_FORMATS):
        return False
    pattern = node.get("pattern")
    if pattern is not None and (not isinstance(pattern, str) or any(token in pattern for token in _LOOKAROUND)):
        return False
    if "object" in kinds or "properties" in node:
        properties = node.get("properties", {})
        if node.get("additionalProperties") is not False or not isinstance(properties, dict):
            return False
        required = node.get("required", [])
        if not isinstance(required, list) or set(required) != set(properties):
            return False
        if not all(_strict(value) for value in properties.values()):
            return False
    elif "additionalProperties" in node or "required" in node:
        return False
    for key in ("$defs", "definitions"):
        if key in node and not (isinstance(node[key], dict) and all(_strict(v) for v in node[key].values())):
            return False
    if "items" in node and not _strict(node["items"]):
        return False
    any_of = node.get("anyOf")
    return any_of is None or (isinstance(any_of, list) and bool(any_of) and all(_strict(v) for v in any_of))
