"""Turning whatever a tool returns or raises into one ``ToolResult`` shape.

Tools may return a ``ToolResult``, a seed-shaped dict (``success``/``output``/
``error``/``metadata``, or ``output``/``is_error``/``tool_call_id``), or a
foreign result object with those attributes (a pydantic model of another
framework). Anything else is a contract violation of the tool. Tools may raise
any exception; each maps to one of the five error categories.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from .errors import (
    AUTH_ERROR,
    CATEGORIES,
    ERROR_CLASSES,
    ContractError,
    ExecutionError,
    ToolError,
)
from .models import ToolContext, ToolResult
from .redaction import redact_cut, sanitize_message

_SEED_KEYS: Final = frozenset({"success", "output", "error", "metadata", "is_error", "tool_call_id", "content"})
_AUTH_TYPES: Final = frozenset({"PermissionError", "SecurityError", "AuthenticationError", "Unauthorized"})
_CAMEL: Final = re.compile(r"(?<!^)(?=[A-Z])")


def _snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def normalize_result(raw: Any, tool: str) -> ToolResult:
    """A ``ToolResult`` for what ``execute`` returned; ``ContractError`` naming the
    tool when it is none of the accepted shapes.

    A ``ToolResult`` is checked too (found by attack): a ``success`` that is no bool (``"yes"``
    reached the caller and the record as it was), ``metadata`` that is no dict (``5`` made
    ``host.call`` raise ``TypeError``, with no ``tool_complete`` and no record), an ``error``
    that is no dict (read as the host's internal error). A subclass is read once
    through its attributes (properties that raise or change between reads). Whatever reading it
    raises is the tool's ``ContractError`` ``invalid_result``, naming the tool and the exception.

    Not covered: a tool that changes its output object after returning it (from a task of its
    own) changes it after the output schema check and the secret scan; copying every output to
    prevent that would cost every call."""
    try:
        if type(raw) is ToolResult:
            fields = raw.__dict__
            success, metadata, error = fields["success"], fields["metadata"], fields["error"]
            if (success is True or success is False) and type(metadata) is dict and (
                    error is None or type(error) is dict):
                return raw  # the common result: nothing to check further
            return _build(_attribute_getter(raw), tool, result=True)
        return _normalize(raw, tool)
    except ContractError:
        raise
    except Exception as exc:  # a hostile property, __bool__, __str__, keys(): the tool's failure
        raise ContractError(
            f"tool {tool!r} returned a result that could not be read: {type(exc).__name__}: {_safe_str(exc)}",
            code="invalid_result",
        ) from exc


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _normalize(raw: Any, tool: str) -> ToolResult:
    if isinstance(raw, ToolResult):
        return _build(_attribute_getter(raw), tool, result=True)
    if isinstance(raw, Mapping):
        unknown = set(raw) - _SEED_KEYS
        if unknown or not ({"success", "is_error"} & set(raw)):
            detail = (
                f"unknown keys {sorted(map(str, unknown))}" if unknown else "neither 'success' nor 'is_error'"
            )
            raise ContractError(
                f"tool {tool!r} returned a dict that is not a tool result ({detail})",
                code="invalid_result",
            )
        return _build(raw.get, tool)
    if hasattr(raw, "output") and (hasattr(raw, "success") or hasattr(raw, "is_error")):
        return _build(_attribute_getter(raw), tool)
    raise ContractError(
        f"tool {tool!r} returned {type(raw).__name__}, not a ToolResult, a result dict "
        "or an object with success/output/error",
        code="invalid_result",
    )


def _attribute_getter(raw: Any) -> Callable[..., Any]:
    """``get(key, default)`` over ``raw``'s attributes (a helper: an inline lambda would make ``raw``
    a cell on every ``normalize_result`` call)."""
    return lambda key, default=None: getattr(raw, key, default)


def _build(get: Any, tool: str, *, result: bool = False) -> ToolResult:
    """The ``ToolResult`` of a seed dict or a foreign result (``get`` reads its fields, each
    once); ``result``: of a ``ToolResult`` (a subclass's), whose ``error`` beside
    ``success=True`` is a stray the host drops, as it does a plain ``ToolResult``'s."""
    success = get("success", None)
    if success is None:
        success = not get("is_error", False)
    if not isinstance(success, bool):
        raise ContractError(
            f"tool {tool!r} returned a result whose 'success' is {type(success).__name__}, not bool",
            code="invalid_result",
        )
    error = get("error", None)
    if error is not None and not isinstance(error, Mapping):
        error = {"message": str(error)}
    metadata = get("metadata", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise ContractError(f"tool {tool!r} returned metadata that is {type(metadata).__name__}, not a dict",
                            code="invalid_result")
    metadata = dict(metadata)
    # ``content`` is a seed dict's or a foreign result's field, not ``ToolResult``'s: a subclass's own
    # ``content`` attribute (whatever it holds) is not read, as before subclasses were rebuilt
    content = None if result else get("content", None)
    if content:
        metadata["content"] = content_blocks(content, tool)
    if result and success:
        error = None
    return ToolResult(
        success=success and error is None,
        output=get("output", None),
        error=dict(error) if error is not None else None,
        metadata=metadata,
        tool_call_id=get("tool_call_id", None),
    )


def content_blocks(content: Any, tool: str) -> list[dict[str, Any]]:
    """A seed result's ``content`` (Amplifier's text and image blocks, as objects or dicts) as plain
    dicts, kept in ``metadata["content"]`` (``ToolResult``'s fields are fixed by the design).

    Each block must be a mapping (or an object with ``model_dump()``, as pydantic blocks are) with
    a string ``type``; anything else is the tool's ``ContractError``. A pydantic block is dumped as
    its fields' aliases, without ``None`` fields: found by attack, the MCP SDK's ``ImageContent``
    became ``mime_type`` (its Python name) beside ``"annotations": None``, so its image was
    ``[image: unknown type, …]`` for a model and ``serve-mcp`` and Amplifier got text instead of it.
    """
    if not isinstance(content, (list, tuple)):
        raise ContractError(f"tool {tool!r} returned 'content' that is not a list of blocks", code="invalid_result")
    blocks = []
    for index, block in enumerate(content):
        data = _dumped(block) if callable(getattr(block, "model_dump", None)) else block
        if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
            raise ContractError(f"tool {tool!r} returned content block {index} without a string 'type'",
                                code="invalid_result")
        blocks.append(dict(data))
    return blocks


def _dumped(block: Any) -> Any:
    """A pydantic block's fields by their aliases, without ``None`` ones (a ``model_dump`` that takes
    no arguments, of an object that only looks like a pydantic model: its own output)."""
    try:
        return block.model_dump(by_alias=True, exclude_none=True)
    except TypeError:
        return block.model_dump()


def _failure_summary(output: Any, tool: str, limit: int = 500, secrets: Collection[str] = ()) -> str:
    """The message of a failure reported with no error message: what the output says (e.g. a
    command's stderr and exit status), shortened; the output itself stays in the result. A secret
    (of ``secrets``, the host's) the shortening cuts through is redacted: the message's redaction
    later finds whole secrets only (found by attack: it showed all but the end of one)."""
    if output is None or (isinstance(output, str) and not output):
        return f"tool {tool!r} reported failure without a message"
    if isinstance(output, str):
        text = output
    else:
        try:
            text = json.dumps(output, ensure_ascii=False, default=str, sort_keys=True)
        except Exception:  # ValueError, RecursionError, a hostile __str__
            from .models import output_text

            text = output_text(output)
    text = text.strip()
    shown = redact_cut(text[:limit], secrets, cut_after=len(text) > limit)
    return f"tool {tool!r} reported failure: {shown}{' …' if len(text) > limit else ''}"


def error_from_result(result: ToolResult, tool: str, secrets: Collection[str] = ()) -> ToolError:
    """The typed error for a result in which the tool reported failure; ``ContractError``
    ``invalid_result`` naming the tool when its error cannot be read (found by attack: an error
    whose message's ``__bool__`` or ``__str__`` raised, or with a key that is no string, read as
    the host's internal error)."""
    try:
        return _error_from_result(result, tool, secrets)
    except Exception as exc:
        error = ContractError(
            f"tool {tool!r} reported failure with an error that could not be read: "
            f"{type(exc).__name__}: {_safe_str(exc)}",
            code="invalid_result",
        )
        error.reported = result
        return error


#: Keys of a reported error that are not taken as its details: those read above, and those only the
#: host sets — ``plugin`` (a plugin is responsible), ``by_deadline`` (the caller's deadline cut the
#: call), the call's ``tool``, ``call_id``, ``trace_id`` and ``session_id``. Found by attack: a tool
#: whose reported error held ``"plugin"`` or ``"by_deadline"`` (an upstream API's error passed on as
#: it came) was attributed to a plugin that does not exist, and its failures never counted against
#: its circuit breaker; a ``session_id`` or ``trace_id`` stood in the error of a call that had none.
_READ_OR_HOSTS: Final = frozenset({"type", "code", "message", "retryable", "cause", "plugin", "by_deadline", "tool",
                                   "call_id", "trace_id", "session_id"})


def _error_from_result(result: ToolResult, tool: str, secrets: Collection[str]) -> ToolError:
    payload: Any = result.error or {}
    if not isinstance(payload, Mapping):  # a retry's outcome or a plugin's result, not normalized
        payload = {"message": str(payload)}
    reported = payload.get("type")
    message = str(payload.get("message") or _failure_summary(result.output, tool, secrets=secrets))
    code = payload.get("code")
    if reported in CATEGORIES:
        cls = ERROR_CLASSES[reported]
    elif reported in _AUTH_TYPES:
        cls = ERROR_CLASSES[AUTH_ERROR]
    else:
        cls = ExecutionError
        if code is None and isinstance(reported, str) and reported:
            code = _snake(reported)
    details = {
        key: value
        for key, value in payload.items()
        if isinstance(key, str) and key not in _READ_OR_HOSTS and _is_scalar(value)
    }
    retryable = payload.get("retryable")
    error = cls(
        message,
        code=code if isinstance(code, str) else None,
        retryable=retryable if isinstance(retryable, bool) else None,
        cause=str(payload.get("cause") or reported or "") or None,
        **details,
    )
    error.reported = result
    return error


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def error_from_exception(exc: BaseException, tool: str) -> ToolError:
    """The typed error for an exception a tool raised."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, SystemExit):  # ``sys.exit``, argparse: the tool's failure, not the host's end
        return ExecutionError(f"tool {tool!r} called sys.exit({exc.code!r})", code="tool_exited", cause="SystemExit")
    # asyncio.TimeoutError (an inner ``wait_for``) is no builtin TimeoutError before 3.11 (found by attack)
    retryable = isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError))
    return ExecutionError(
        f"tool {tool!r} raised {type(exc).__name__}: {exc}",
        code="tool_raised",
        retryable=retryable,
        cause=type(exc).__name__,
    )


def error_dict(
    error: ToolError,
    *,
    tool: str | None,
    context: ToolContext,
    secrets: Collection[str] = (),
) -> dict[str, Any]:
    """The JSON error dict of a failed result: category, code, sanitized message,
    retryable, cause, attribution and correlation fields."""
    data: dict[str, Any] = {
        "type": error.category,
        "code": error.code,
        "message": sanitize_message(error.message, secrets),
        "retryable": error.retryable,
        "cause": sanitize_message(error.cause, secrets) if error.cause else None,
    }
    if error.plugin is not None:
        data["plugin"] = error.plugin
    for key, value in error.details.items():
        if key not in data:
            data[key] = sanitize_message(value, secrets) if isinstance(value, str) else value
    data["tool"] = tool
    data["call_id"] = context.call_id
    if context.trace_id is not None:
        data["trace_id"] = context.trace_id
    if context.session_id is not None:
        data["session_id"] = context.session_id
    return data
