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
from .redaction import sanitize_message

_SEED_KEYS: Final = frozenset({"success", "output", "error", "metadata", "is_error", "tool_call_id", "content"})
_AUTH_TYPES: Final = frozenset({"PermissionError", "SecurityError", "AuthenticationError", "Unauthorized"})
_CAMEL: Final = re.compile(r"(?<!^)(?=[A-Z])")


def _snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


def normalize_result(raw: Any, tool: str) -> ToolResult:
    """A ``ToolResult`` for what ``execute`` returned; ``ContractError`` naming the
    tool when it is none of the accepted shapes."""
    if isinstance(raw, ToolResult):
        return raw
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


def _build(get: Any, tool: str) -> ToolResult:
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
    metadata = get("metadata", None) or {}
    if not isinstance(metadata, Mapping):
        raise ContractError(f"tool {tool!r} returned non-mapping metadata", code="invalid_result")
    metadata = dict(metadata)
    content = get("content", None)
    if content:
        metadata["content"] = content_blocks(content, tool)
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
    a string ``type``; anything else is the tool's ``ContractError``.
    """
    if not isinstance(content, (list, tuple)):
        raise ContractError(f"tool {tool!r} returned 'content' that is not a list of blocks", code="invalid_result")
    blocks = []
    for index, block in enumerate(content):
        data = block.model_dump() if callable(getattr(block, "model_dump", None)) else block
        if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
            raise ContractError(f"tool {tool!r} returned content block {index} without a string 'type'",
                                code="invalid_result")
        blocks.append(dict(data))
    return blocks


def _failure_summary(output: Any, tool: str, limit: int = 500) -> str:
    """The message of a failure reported with no error message: what the output says (e.g. a
    command's stderr and exit status), shortened; the output itself stays in the result."""
    if output is None or output == "":
        return f"tool {tool!r} reported failure without a message"
    if isinstance(output, str):
        text = output
    else:
        try:
            text = json.dumps(output, ensure_ascii=False, default=str, sort_keys=True)
        except (TypeError, ValueError):
            text = repr(output)
    text = text.strip()
    return f"tool {tool!r} reported failure: {text[:limit]}{' …' if len(text) > limit else ''}"


def error_from_result(result: ToolResult, tool: str) -> ToolError:
    """The typed error for a result in which the tool reported failure."""
    payload = result.error or {}
    reported = payload.get("type")
    message = str(payload.get("message") or _failure_summary(result.output, tool))
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
        if key not in ("type", "code", "message", "retryable", "cause") and _is_scalar(value)
    }
    error = cls(
        message,
        code=code if isinstance(code, str) else None,
        retryable=bool(payload["retryable"]) if "retryable" in payload else None,
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
