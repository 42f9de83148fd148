"""``@tool``: turn a plain Python function into a tool with a derived input schema.

The input schema comes from the signature: ``str``/``int``/``float``/``bool``,
``list[X]``, ``dict[str, X]``, ``X | None``, ``Literal[...]`` and defaults.
Parameters of other types are refused at decoration time (name and type in the
message) rather than accepted unchecked. The description is the docstring's
first paragraph unless given.

A sync function runs in a worker thread so it does not block the event loop;
note that a timeout can abandon, but not stop, a running thread.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from .models import ToolContext, ToolResult
from .spec import Effect, ToolSpec

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


def schema_for_annotation(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one annotation; ``TypeError`` naming ``where`` if unsupported."""
    if annotation in _PRIMITIVES:
        return dict(_PRIMITIVES[annotation])
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [schema_for_annotation(arg, where) for arg in args]}
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": schema_for_annotation(item, where)}
    if origin is dict or annotation is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": schema_for_annotation(value, where)}
    raise TypeError(f"{where}: type {annotation!r} has no JSON Schema mapping; use str, int, float, "
                    "bool, list, dict, Literal or Optional of these")


def _input_schema(func: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    try:
        hints = typing.get_type_hints(func)
    except NameError as exc:
        raise TypeError(f"{func.__qualname__}: cannot resolve an annotation ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    takes_context = False
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{func.__qualname__}: *args/**kwargs cannot be described by a schema")
        if param.name == "context" and hints.get("context") in (ToolContext, None):
            takes_context = True
            continue
        annotation = hints.get(param.name, Any)
        schema = schema_for_annotation(annotation, f"{func.__qualname__}({param.name})")
        if param.default is param.empty:
            required.append(param.name)
        else:
            schema["default"] = param.default
        properties[param.name] = schema
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, takes_context


class FunctionTool:
    """A tool wrapping a function; its contract is in ``spec``."""

    def __init__(self, func: Callable[..., Any], spec: ToolSpec, takes_context: bool) -> None:
        self.func = func
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.input_schema = spec.input_schema
        self._takes_context = takes_context
        self._is_async = inspect.iscoroutinefunction(func)

    async def execute(self, input: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        kwargs = dict(input)
        if self._takes_context:
            kwargs["context"] = context
        if self._is_async:
            value = await self.func(**kwargs)
        else:
            value = await asyncio.to_thread(self.func, **kwargs)
        return value if isinstance(value, ToolResult) else ToolResult(success=True, output=value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the decorated name still calls the plain function."""
        return self.func(*args, **kwargs)


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect | str = Effect.ExternalSideEffects,
    **spec_fields: Any,
) -> Any:
    """Decorate a function (sync or async) to make it a tool.

    ``@tool`` or ``@tool(name="local::math.add", effect="Pure", version="1.0.0")``;
    any other ``ToolSpec`` field may be passed as a keyword. A parameter named
    ``context`` receives the call's ``ToolContext`` and is not in the schema.
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        schema, takes_context = _input_schema(f)
        doc = inspect.getdoc(f) or ""
        spec = ToolSpec(
            name=name or f.__name__,
            description=description if description is not None else doc.split("\n\n")[0].strip(),
            input_schema=schema,
            effect=Effect(effect),
            **spec_fields,
        )
        return FunctionTool(f, spec, takes_context)

    return wrap(func) if func is not None else wrap
