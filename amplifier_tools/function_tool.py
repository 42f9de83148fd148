"""``@tool``: turn a plain Python function into a tool with a derived input schema.

The input schema comes from the signature: ``str``/``int``/``float``/``bool``,
``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``set[X]``/``frozenset[X]``,
``dict[str, X]``, ``X | None``, ``Literal[...]``, ``Annotated[X, ...]`` with a
description string or constraints (``_constrained``) and defaults. A tuple, set or
frozenset argument arrives as one (JSON has only arrays): the host validates a
list, and the function gets the type its signature names. Parameters of other
types (``dict`` keyed by anything but ``str`` included: JSON keys are strings)
are refused at decoration time (name and type in the message) rather than
accepted unchecked. A default goes into the schema only when it is JSON data
(a default of ``math.inf`` or an object stays the function's own). The
description is the docstring's first paragraph unless given; each parameter's,
its entry in an ``Args:`` section or ``:param name:`` line.

A sync function runs in a worker thread so it does not block the event loop;
note that a timeout can abandon, but not stop, a running thread. The threads
are daemon threads of this module's own pool, not the event loop's default
executor (found by trial: ``asyncio.run`` and ``amplifier-tools validate`` waited
at exit, forever, for a hung function that the timeout had already abandoned).

A method decorated in a class body is a descriptor: ``obj.method`` is the tool
bound to ``obj``, ``self`` left out of the schema. Generator functions are
refused (their body would never run: the "output" was a generator object), a
sync callable returning an awaitable (a sync decorator around an ``async def``)
has it awaited, and ``SystemExit`` from the function (``sys.exit``, argparse)
is an ``ExecutionError`` ``tool_exited`` rather than the end of the host's
process.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import inspect
import json
import math
import os
import re
import threading
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from .errors import ContractError, ExecutionError
from .models import ToolContext, ToolResult
from .results import error_from_exception
from .spec import Effect, ToolSpec

_PRIMITIVES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}

#: Turns a validated JSON value into what the annotation names (a list into a tuple or set).
_Convert = Callable[[Any], Any]


def schema_for_annotation(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one annotation; ``TypeError`` naming ``where`` if unsupported."""
    return _schema_and_converter(annotation, where)[0]


def _schema_and_converter(annotation: Any, where: str) -> tuple[dict[str, Any], _Convert | None]:
    """The schema of ``annotation`` and, where JSON's spelling is not the annotated type (a tuple
    or set arrives as a list), the conversion the function's argument needs (else None).

    Found by trial: ``tuple[int, str]`` was ``{"items": {"type": "integer"}}`` (``[1, "a"]``
    refused, ``[1, 2]`` accepted), ``set[int]`` reached the function as a list with duplicates,
    and ``dict[int, str]`` was accepted although JSON keys are strings (``d[1]`` never found).
    """
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *metadata = typing.get_args(annotation)
        schema, convert = _schema_and_converter(base, where)
        return _constrained(schema, metadata, where), convert
    if annotation in _PRIMITIVES:
        return dict(_PRIMITIVES[annotation]), None
    args = typing.get_args(annotation)
    if origin is Literal:
        # Found by trial: ``Literal[Color.RED]`` (an Enum member) went into the schema as the object.
        odd = [arg for arg in args if type(arg) not in (str, int, float, bool, type(None))]
        if odd:
            raise TypeError(f"{where}: Literal value {odd[0]!r} is not a JSON string, number, boolean or null")
        return {"enum": list(args)}, None
    if origin in (Union, types.UnionType):
        others = [arg for arg in args if arg is not type(None)]
        if len(others) == 1 and len(args) == 2 and _takes_none(others[0]):
            # ``Optional[Annotated[X | None, ...]]``: what Python 3.10's ``get_type_hints`` makes of
            # ``Annotated[X | None, ...] = None``; the annotated union already takes None.
            return _schema_and_converter(others[0], where)
        arms = [_schema_and_converter(arg, where) for arg in args]
        return {"anyOf": [schema for schema, _ in arms]}, _union_converter(arms)
    if origin is tuple or annotation is tuple:
        if annotation in (tuple, typing.Tuple) or (len(args) == 2 and args[1] is Ellipsis):  # noqa: UP006
            item, convert = _schema_and_converter(args[0] if args else Any, where)
            return {"type": "array", "items": item}, _sequence_converter(tuple, convert)
        if args in ((), ((),)):  # tuple[()]: the empty tuple (spelled ((),) before Python 3.11)
            return {"type": "array", "maxItems": 0}, lambda value: ()
        parts = [_schema_and_converter(arg, where) for arg in args]
        schema = {"type": "array", "prefixItems": [part for part, _ in parts], "items": False,
                  "minItems": len(parts), "maxItems": len(parts)}
        converters = [convert for _, convert in parts]
        return schema, lambda value: tuple(
            convert(item) if convert is not None else item for convert, item in zip(converters, value, strict=True))
    if origin in (set, frozenset) or annotation in (set, frozenset):
        item, convert = _set_item(args[0] if args else Any, where)
        kind = frozenset if frozenset in (origin, annotation) else set
        return {"type": "array", "items": item, "uniqueItems": True}, _set_converter(kind, convert)
    if origin is list or annotation is list:
        item, convert = _schema_and_converter(args[0] if args else Any, where)
        return {"type": "array", "items": item}, _sequence_converter(list, convert) if convert else None
    if origin is dict or annotation is dict:
        if len(args) == 2 and args[0] not in (str, Any):
            raise TypeError(f"{where}: type {annotation!r}: JSON object keys are strings; use dict[str, ...]")
        value, convert = _schema_and_converter(args[1] if len(args) == 2 else Any, where)
        converter = (lambda data: {key: convert(item) for key, item in data.items()}) if convert else None
        return {"type": "object", "additionalProperties": value}, converter
    raise TypeError(f"{where}: type {annotation!r} has no JSON Schema mapping; use str, int, float, "
                    "bool, list, tuple, set, dict[str, ...], Literal or Optional of these")


def _takes_none(annotation: Any) -> bool:
    """Whether ``annotation`` is an ``Annotated`` union that includes ``None``."""
    if typing.get_origin(annotation) is not Annotated:
        return False
    base = typing.get_args(annotation)[0]
    return typing.get_origin(base) in (Union, types.UnionType) and type(None) in typing.get_args(base)


#: ``annotated_types`` constraint attributes -> the JSON Schema keyword of a number's bound.
_BOUNDS: dict[str, str] = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum",
                           "multiple_of": "multipleOf"}
#: ``min_length``/``max_length`` by the JSON type they bound.
_LENGTHS: dict[str, tuple[str, str]] = {"string": ("minLength", "maxLength"), "array": ("minItems", "maxItems"),
                                        "object": ("minProperties", "maxProperties")}
#: What ``pydantic.Field(...)`` may set besides constraints: the rest has no meaning for a tool's schema.
_FIELD_KEEPS: frozenset[str] = frozenset({"description", "title", "examples"})


def _constrained(schema: dict[str, Any], metadata: list[Any], where: str) -> dict[str, Any]:
    """``schema`` with what ``Annotated`` metadata says: a string is the description (as in
    LangChain), ``annotated_types`` constraints (``Ge``, ``Gt``, ``Le``, ``Lt``, ``Interval``,
    ``MultipleOf``, ``MinLen``, ``MaxLen``, ``Len``) and ``pydantic.Field(...)`` with those, a
    ``pattern``, a ``description``, ``title`` or ``examples`` become the schema's keywords.

    Anything else is refused (``TypeError`` naming ``where``): found by trial, ``Annotated[int,
    Field(ge=0)]`` was read as a plain ``int``, so the host ran the function with -5, which the
    author had ruled out.
    """
    schema = dict(schema)
    for item in metadata:
        if isinstance(item, str):
            schema["description"] = item
            continue
        package = type(item).__module__.split(".")[0]
        if package in ("typing", "typing_extensions") and type(item).__name__ == "Doc":  # PEP 727
            schema["description"] = str(item.documentation)
            continue
        if package == "pydantic" and type(item).__name__ == "FieldInfo":
            odd = sorted(set(getattr(item, "_attributes_set", {})) - _FIELD_KEEPS)
            if odd:
                raise TypeError(f"{where}: Field({odd[0]}=...) has no meaning for a tool's schema"
                                + ("; give the default in the signature" if odd[0] == "default" else ""))
            for keyword in ("title", "description", "examples"):
                value = getattr(item, keyword, None)
                if value is None:
                    continue
                # Found by attack: ``Field(examples=[object()])`` made a schema that is no JSON (a
                # framework's request fails to encode it), ``Field(title=5)`` one that failed the mount.
                if (keyword != "examples" and not isinstance(value, str)) or (keyword == "examples" and (
                        not isinstance(value, list) or not _json_default(value)[0])):
                    raise TypeError(f"{where}: Field({keyword}={value!r}) is not a JSON Schema {keyword} "
                                    + ("(a list of JSON values)" if keyword == "examples" else "(a string)"))
                schema[keyword] = value
            schema = _constrained(schema, list(item.metadata), where)
            continue
        if package not in ("annotated_types", "pydantic"):
            raise TypeError(f"{where}: Annotated metadata {item!r} has no JSON Schema mapping; use a description "
                            "string, annotated_types constraints or pydantic.Field(...)")
        _constrain(schema, item, where)
    return schema


def _constrain(schema: dict[str, Any], item: Any, where: str) -> None:
    """Add one ``annotated_types`` (or pydantic) constraint to ``schema`` — to each arm of a union
    it fits (``Annotated[int | None, Ge(0)]`` bounds the integer) — refusing one that fits none."""
    given = ({field.name: getattr(item, field.name) for field in dataclasses.fields(item)}
             if dataclasses.is_dataclass(item) else dict(vars(item)) if hasattr(item, "__dict__") else {})
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        raise TypeError(f"{where}: Annotated metadata {item!r} has no JSON Schema mapping")
    arms: list[dict[str, Any]] = schema.get("anyOf", [schema])
    for name, value in given.items():
        keyword = _keyword(name, value)
        if keyword is None:
            raise TypeError(f"{where}: Annotated metadata {item!r} ({name}) has no JSON Schema mapping")
        if name == "pattern":
            try:
                re.compile(value)
            except re.error as exc:
                raise TypeError(f"{where}: pattern {value!r} is not a regular expression ({exc})") from None
        fitting = [(arm, key) for arm in arms if (key := keyword(arm.get("type"))) is not None]
        if not fitting:
            kinds = " or ".join(str(arm.get("type", "(any)")) for arm in arms)
            raise TypeError(f"{where}: {item!r} ({name}) does not apply to a parameter of JSON type {kinds}")
        for arm, key in fitting:
            arm[key] = value


def _keyword(name: str, value: Any) -> Callable[[Any], str | None] | None:
    """For constraint ``name`` with ``value``: the schema keyword it is for an arm of a JSON type
    (None where it does not apply), or None for a constraint with no keyword."""
    if name in _BOUNDS and (type(value) is int or (type(value) is float and math.isfinite(value))) \
            and (name != "multiple_of" or value > 0):
        # Found by attack: ``Ge(nan)`` went into the schema as NaN, which bounds nothing (-1e9 ran)
        # and is no JSON; ``Gt(inf)`` is Infinity, no JSON either; ``MultipleOf(0)`` failed the mount.
        return lambda kind: _BOUNDS[name] if kind in ("integer", "number") else None
    if name in ("min_length", "max_length") and type(value) is int and value >= 0:
        return lambda kind: _LENGTHS[kind][name == "max_length"] if kind in _LENGTHS else None
    if name == "pattern" and isinstance(value, str):
        return lambda kind: "pattern" if kind == "string" else None
    return None


#: What a set of ``Any`` holds: the JSON values Python can hash (an array or object cannot be).
_HASHABLE_JSON: dict[str, Any] = {"type": ["string", "number", "boolean", "null"]}


def _set_item(annotation: Any, where: str) -> tuple[dict[str, Any], _Convert | None]:
    """The schema and converter of a set's items, refusing an item type that is not hashable
    once converted (``set[list[int]]``, ``set[dict[str, int]]``, ``frozenset[set[int]]``), and
    limiting ``set``/``set[Any]`` to JSON scalars.

    Found by attack: such a set was accepted at decoration and every call whose set was not
    empty failed in the conversion, before the function ran, as ``tool_raised`` ``TypeError:
    unhashable type`` — the model was blamed for the author's type, and told nothing it could fix.
    """
    if annotation is Any:
        return dict(_HASHABLE_JSON), None
    if not _hashable(annotation):
        raise TypeError(f"{where}: type {annotation!r} cannot be a set's item (a JSON array or object "
                        "arrives as a list or dict, which cannot be hashed); use tuple[...] or frozenset[...]")
    return _schema_and_converter(annotation, where)


def _hashable(annotation: Any) -> bool:
    """Whether every value of ``annotation``, as converted for the function, can be hashed."""
    if annotation in _PRIMITIVES:
        return annotation is not Any
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal or origin is frozenset or annotation is frozenset:
        return True
    if origin in (Union, types.UnionType):
        return all(_hashable(arg) for arg in args)
    if origin is tuple:  # bare ``typing.Tuple`` (no args) holds anything
        return bool(args) and all(arg is Ellipsis or arg == () or _hashable(arg) for arg in args)
    return False


class _EqualInPython(ValueError):
    """Two items of a set argument that JSON tells apart (``uniqueItems`` passed them) and a Python
    set holds as one: ``1`` and ``true``, ``0`` and ``false`` (also inside tuples)."""


def _set_converter(kind: Callable[[Any], Any], convert: _Convert | None) -> _Convert:
    """A JSON array to a ``set``/``frozenset``, refusing items Python counts as one (found by
    attack: ``[1, true]`` for ``Annotated[set, MinLen(2)]`` reached the function as ``{1}``, an
    item dropped and the length constraint broken, silently)."""

    def to_set(value: Any) -> Any:
        items = list(map(convert, value)) if convert is not None else value
        result = kind(items)
        if len(result) != len(items):
            seen: dict[Any, Any] = {}
            for item in items:
                if item in seen:
                    raise _EqualInPython(f"{_json_text(seen[item])} and {_json_text(item)}")
                seen[item] = item
        return result

    return to_set


def _json_text(value: Any) -> str:
    """An argument's item as the caller wrote it in JSON (a tuple was an array)."""
    return json.dumps(value, default=repr)


def _sequence_converter(kind: Callable[[Any], Any], convert: _Convert | None) -> _Convert:
    if convert is None:
        return kind
    return lambda value: kind(convert(item) for item in value)


def _union_converter(arms: list[tuple[dict[str, Any], _Convert | None]]) -> _Convert | None:
    """A union converts a JSON array when exactly one of its arms is an array (``tuple[int, int] |
    None``), and a JSON object when exactly one is an object; else the value is left as it came."""
    def only(json_type: str) -> _Convert | None:
        found = [convert for schema, convert in arms if schema.get("type") == json_type]
        return found[0] if len(found) == 1 else None

    for_list, for_dict = only("array"), only("object")
    if for_list is None and for_dict is None:
        return None

    def convert(value: Any) -> Any:
        if isinstance(value, list) and for_list is not None:
            return for_list(value)
        if isinstance(value, dict) and for_dict is not None:
            return for_dict(value)
        return value

    return convert


def _json_default(value: Any) -> tuple[bool, Any]:
    """``(True, value as JSON data)`` when a parameter's default can go into the schema.

    Found by trial: a default of ``math.inf`` (or a ``Path``, an object) went into the schema
    as it was, and ``tool_definitions()`` then handed a model a schema that is not JSON. Such a
    default stays the function's own: the schema leaves it out.
    """
    try:
        return True, json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return False, None


def _is_context(annotation: Any) -> bool:
    """``ToolContext``, ``ToolContext | None`` or no annotation: the parameter receives the call's context."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if annotation is None or annotation is ToolContext:
        return True
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return set(typing.get_args(annotation)) == {ToolContext, type(None)}
    return False


def _target(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations describe ``func``: a ``functools.partial``'s function, a
    callable object's ``__call__`` (``typing.get_type_hints`` refuses both themselves)."""
    while isinstance(func, functools.partial):  # (``tool`` unwraps a ``staticmethod`` first)
        func = func.func
    if not (inspect.isfunction(func) or inspect.ismethod(func) or inspect.isbuiltin(func)) and callable(func):
        return type(func).__call__
    return func


def _input_schema(func: Callable[..., Any], *, skip_first: bool = False, static: bool = False,
                  ) -> tuple[dict[str, Any], bool, dict[str, _Convert]]:
    """The input schema of ``func``'s parameters, whether it takes ``context``, and the converters
    of the parameters that need one (``skip_first``: a ``classmethod``'s ``cls``; ``static``: a
    ``staticmethod``'s function, whose first parameter is the model's even when named ``self``
    or ``cls``: found by attack, ``@tool @staticmethod def f(cls: str)`` was refused as "a
    classmethod under @tool", and a ``self`` parameter left out of the schema)."""
    target = _target(func)
    defining = _defining_locals(target)
    try:
        hints = typing.get_type_hints(target, localns=defining, include_extras=True)
    except NameError:
        # Found by trial: under ``from __future__ import annotations`` a type defined in the
        # decorating function's body (a test's own ``Literal`` alias, Enum, ...) could not be
        # resolved. Its names are the decorating frame's locals: try those, as pydantic does.
        try:
            hints = typing.get_type_hints(target, localns={**_decorating_locals(), **(defining or {})},
                                          include_extras=True)
        except NameError as exc:
            raise TypeError(f"{_label(func)}: cannot resolve an annotation ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, _Convert] = {}
    takes_context = False
    described = _parameter_docs(inspect.getdoc(func) or "")
    parameters = list(inspect.signature(func).parameters.values())
    if skip_first or (not static and _is_method(func)):
        parameters = parameters[1:]  # ``self`` or ``cls``: what the method is reached through
    elif not static and parameters and parameters[0].name == "cls" and _in_class_body(func):
        raise TypeError(f"{_label(func)}: a classmethod under @tool: put @tool above @classmethod "
                        "(else cls would be an argument the model sends)")
    for param in parameters:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{_label(func)}: *args/**kwargs cannot be described by a schema")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"{_label(func)}({param.name}): a positional-only parameter cannot be passed "
                            "by name; make it an ordinary parameter")
        if param.name == "context" and _is_context(hints.get("context")):
            takes_context = True
            continue
        annotation = hints.get(param.name, Any)
        schema, convert = _schema_and_converter(annotation, f"{_label(func)}({param.name})")
        if convert is not None:
            converters[param.name] = convert
        if param.default is param.empty:
            required.append(param.name)
        else:
            is_json, default = _json_default(param.default)
            if is_json:
                schema["default"] = default
        if param.name in described and "description" not in schema:  # ``Annotated``'s wins
            schema["description"] = described[param.name]
        properties[param.name] = schema
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, takes_context, converters


def _in_class_body(func: Callable[..., Any]) -> bool:
    """Whether ``func`` was defined in a class body (its qualified name's parent is no function)."""
    parts = getattr(func, "__qualname__", "").split(".")
    return len(parts) > 1 and parts[-2] != "<locals>"


def _is_method(func: Callable[..., Any]) -> bool:
    """A plain function whose first parameter is ``self``: ``@tool`` on a method in a class body.

    Found by trial: ``self`` became a required argument of any JSON value, the model's to send.
    Its ``FunctionTool`` is a descriptor now: ``obj.method`` is the tool bound to ``obj``."""
    if not inspect.isfunction(func):
        return False
    first = next(iter(inspect.signature(func).parameters.values()), None)
    return first is not None and first.name == "self" and first.kind is first.POSITIONAL_OR_KEYWORD


_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params)\s*:\s*$")
#: Found by attack: ``\s*(?:\(...\))?\s*:`` tried every split of a run of spaces between its two
#: ``\s*`` (quadratic: an ``Args:`` line of 16,000 spaces took a second, 100,000 about a minute).
_GOOGLE_ITEM = re.compile(r"^(\*{0,2}\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ITEM = re.compile(r"^:param\s+(?:[^:\s]+\s+)?(\w+)\s*:\s*(.*)$")


def _parameter_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a docstring: a Google-style ``Args:`` section (``name: text``
    or ``name (type): text``, continuation lines indented deeper) or Sphinx ``:param name: text``.

    Found by trial: they were dropped, so the model saw bare types where the author had written
    what each parameter means (pydantic-ai and the Agents SDK put them into the schema).
    """
    found: dict[str, str] = {}
    current: str | None = None  # the parameter whose description continues on the next line
    section: int | None = None  # the indent of the ``Args:`` line while inside that section
    item: int | None = None  # the indent of the section's items
    for line in doc.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:  # a blank line ends an item and a section
            current = section = item = None
            continue
        sphinx = _SPHINX_ITEM.match(stripped)
        if sphinx:
            current, section = sphinx.group(1), None
            found[current] = sphinx.group(2)
        elif _SECTION.match(stripped):
            current, section, item = None, indent, None
        elif section is not None and indent <= section:  # the next section begins
            current = section = None
        elif section is not None and (item is None or indent <= item) and _GOOGLE_ITEM.match(stripped):
            google = _GOOGLE_ITEM.match(stripped)
            assert google is not None
            item, current = indent, google.group(1).lstrip("*")
            found[current] = google.group(2)
        elif current is not None and not stripped.startswith(":"):
            found[current] = f"{found[current]} {stripped}"
        else:
            current = None
    return {name: text.strip() for name, text in found.items() if text.strip()}


def _defining_locals(target: Any) -> dict[str, Any] | None:
    """The local names of the scopes ``target`` was defined in (innermost first in priority),
    from the frames on the stack that ``__qualname__`` names; None for a module-level function
    or when none of those frames is running any more.

    Found by attack: the decorating frame's locals were consulted only after the module's
    globals had failed, so a local type shadowing a global of the same name (``Mode =
    Literal["local"]`` in the function, ``Mode = Literal["global"]`` in the module) gave the
    global's schema, silently: Python resolves the local. And ``[tool(f, ...) for ...]`` on
    Python 3.10 and 3.11 (a comprehension is a frame of its own there) found no local at all.
    """
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(qualname, str):
        return None
    parts = qualname.split(".")[:-1]
    # The enclosing scopes, innermost first: "a.<locals>.C.m" -> "a.<locals>.C" (a class body), "a".
    scopes = [".".join(parts[:end]) for end in range(len(parts), 0, -1) if parts[end - 1] != "<locals>"]
    if not scopes:
        return None
    found: list[dict[str, Any]] = []
    frame = inspect.currentframe()
    try:
        while frame is not None and len(found) < len(scopes):
            code = frame.f_code
            wanted = scopes[len(found)]
            if getattr(code, "co_qualname", wanted) == wanted and code.co_name == wanted.rsplit(".", 1)[-1]:
                found.append(dict(frame.f_locals))
            frame = frame.f_back
    finally:
        del frame
    if not found:
        return None
    merged: dict[str, Any] = {}
    for names in reversed(found):  # the innermost scope's names win
        merged.update(names)
    return merged


def _decorating_locals() -> dict[str, Any]:
    """The local names of the nearest frame outside this module: where ``@tool`` was applied."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    try:
        return dict(frame.f_locals) if frame is not None else {}
    finally:
        del frame


def _label(func: Callable[..., Any]) -> str:
    return str(getattr(_target(func), "__qualname__", None) or repr(func))


class _DaemonPool:
    """Worker threads for sync functions, as ``ThreadPoolExecutor`` keeps them (reused, at most
    ``max_workers``) but daemon and never joined: a function the timeout abandoned keeps its
    thread, and neither the event loop's shutdown nor the interpreter's exit waits for it.

    Found by attack: the pool is the process's, not an event loop's, so the threads of hung
    functions counted against ``max_workers`` forever, and once that many had hung (six on a
    two-core machine) every later sync tool call, on any host, waited in the queue until its
    timeout. A thread whose job was abandoned while running (``lost``) no longer counts: another
    takes its place, and the thread ends when its function returns. The idle workers are
    counted exactly (a semaphore released at every job's end counted more than there were).
    """

    def __init__(self, max_workers: int) -> None:
        self._jobs: collections.deque[Callable[[], bool]] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._workers = 0  # threads counted against ``max_workers``
        self._idle = 0  # of those, the ones waiting for a job and not yet woken for one
        self._max = max_workers

    def submit(self, job: Callable[[], bool]) -> None:
        """Queue ``job``; it returns False when its thread must end (its job was ``lost``)."""
        with self._ready:
            self._jobs.append(job)
            if self._idle:
                self._idle -= 1
                self._ready.notify()
                return
            self._start_if_room()

    def lost(self) -> None:
        """A running job was abandoned: its thread no longer counts (and stops after it)."""
        with self._ready:
            self._workers -= 1
            if len(self._jobs) > self._idle:
                self._start_if_room()

    def _start_if_room(self) -> None:  # under ``self._ready``
        if self._workers >= self._max:
            return
        self._workers += 1
        threading.Thread(target=self._work, name=f"amplifier-tools-function-{self._workers}", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs:
                    self._idle += 1
                    self._ready.wait()
                job = self._jobs.popleft()
            if not job():
                return


_POOL = _DaemonPool(min(32, (os.cpu_count() or 1) + 4))


async def _in_thread(name: str, func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """``func(**kwargs)`` in a daemon worker thread (with the caller's context variables, as
    ``asyncio.to_thread``); its ``SystemExit`` comes back as ``ExecutionError``.

    Found by attack: a call abandoned (timeout, cancellation) while its job still waited in the
    queue ran later all the same — a side effect after the caller was told it timed out, and
    perhaps after its retry. ``to_thread`` cancelled a job that had not started; so does this.
    And a ``StopIteration`` (``next()`` on an empty iterator) could not be set on the future
    (``TypeError`` in the loop's callback): the call hung until its timeout, or for ever.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    variables = contextvars.copy_context()
    state = ["queued"]  # -> "running" -> "done"; or "abandoned" (never runs), "lost" (abandoned running)
    lock = threading.Lock()

    def settle(failed: BaseException | None, value: Any) -> None:
        if future.done():  # abandoned (timeout, cancellation)
            return
        if failed is not None:
            future.set_exception(failed)
        else:
            future.set_result(value)

    def job() -> bool:
        with lock:
            if state[0] == "abandoned":
                return True
            state[0] = "running"
        failed: BaseException | None = None
        value: Any = None
        try:
            value = variables.run(func, **kwargs)
        except SystemExit as exc:
            failed = error_from_exception(exc, name)
        except StopIteration as exc:  # a future refuses it
            failed = error_from_exception(exc, name)
        except BaseException as exc:  # handed to the awaiting call, as to_thread does
            failed = exc
        with lock:
            keep = state[0] != "lost"
            state[0] = "done"
        try:
            loop.call_soon_threadsafe(settle, failed, value)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass
        return keep

    _POOL.submit(job)
    try:
        return await future
    finally:
        if not future.done() or future.cancelled():
            with lock:
                was, state[0] = state[0], {"queued": "abandoned", "running": "lost"}.get(state[0], state[0])
            if was == "running":
                _POOL.lost()


class FunctionTool:
    """A tool wrapping a function; its contract is in ``spec``."""

    def __init__(self, func: Callable[..., Any], spec: ToolSpec, takes_context: bool,
                 converters: dict[str, _Convert] | None = None, *, on_class: bool = False,
                 static: bool = False) -> None:
        self.func = func
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.input_schema = spec.input_schema
        self._takes_context = takes_context
        self._converters = converters or {}
        self._is_async = inspect.iscoroutinefunction(func)
        #: A ``classmethod``'s function: bound to the class it is reached through.
        self._on_class = on_class
        self._unbound_method = on_class or (not static and _is_method(func))

    def __get__(self, instance: Any, owner: type | None = None) -> FunctionTool:
        """On an instance, a decorated method is the tool bound to it (``self`` is not in the
        schema); a decorated ``classmethod``, on its class or an instance, is bound to the class."""
        if self._on_class:
            cls = owner if owner is not None else type(instance)
            return FunctionTool(self.func.__get__(cls, type(cls)), self.spec, self._takes_context, self._converters)
        if instance is None or not self._unbound_method:
            return self
        bound = FunctionTool(self.func.__get__(instance, owner), self.spec, self._takes_context, self._converters)
        return bound

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r} of {_label(self.func)}>"

    async def execute(self, input: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        if self._unbound_method:
            where = "its class or an instance" if self._on_class else "an instance"
            raise ExecutionError(f"tool {self.name!r} is a method: mount it from {where} "
                                 f"(obj.{getattr(self.func, '__name__', 'method')})", code="unbound_method")
        kwargs = dict(input)
        for key, convert in self._converters.items():
            if key in kwargs:
                try:
                    kwargs[key] = convert(kwargs[key])
                except _EqualInPython as exc:
                    raise ContractError(
                        f"invalid arguments for tool {self.name!r}: /{key}: {exc} are one item in a Python set",
                        code="invalid_input", pointer=f"/{key}",
                        hint="send one of them: JSON tells 1 from true and 0 from false, a Python set does not",
                    ) from None
        if self._takes_context:
            kwargs["context"] = context
        try:
            if self._is_async:
                value = await self.func(**kwargs)
            else:
                value = await _in_thread(self.name, self.func, kwargs)
                if inspect.isawaitable(value):  # a sync wrapper around an async function
                    value = await value
        except SystemExit as exc:
            raise error_from_exception(exc, self.name) from None
        if inspect.isgenerator(value) or inspect.isasyncgen(value):
            if inspect.isgenerator(value):
                value.close()
            raise ContractError(f"tool {self.name!r} returned a generator; return its items as a list",
                                code="invalid_result")
        return value if isinstance(value, ToolResult) else ToolResult(success=True, output=value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the decorated name still calls the plain function."""
        return self.func(*args, **kwargs)


def _check_spec_fields(fields: dict[str, Any]) -> None:
    """Refuse a keyword of ``@tool`` that is no ``ToolSpec`` field, naming where it belongs when it
    is a field of a table below (found by a newcomer's trial: ``@tool(secret_refs=["api"])`` failed
    the plugin's import with ``ToolSpec.__init__() got an unexpected keyword argument
    'secret_refs'``, saying neither that it is ``security``'s nor which decorator)."""
    import attrs

    from .errors import did_you_mean
    from .spec import Policies, Security

    known = {field.name for field in attrs.fields(ToolSpec)} - {"input_schema"}
    for key in fields:
        if key == "input_schema":
            raise TypeError("@tool(input_schema=...): the input schema is derived from the function's signature "
                            "(Annotated adds constraints, docs/plugins.md); for a schema of your own, write a "
                            "class with a ToolSpec")
        if key in known:
            continue
        home = next((table for table, cls in (("security", Security), ("policies", Policies))
                     if key in {field.name for field in attrs.fields(cls)}), None)
        if home is not None:
            raise TypeError(f"@tool({key}=...): {key!r} is a field of {home}, not of the contract itself: "
                            f"write @tool({home}={{{key!r}: ...}})")
        close = did_you_mean(key, known)
        raise TypeError(f"@tool({key}=...): {key!r} is no ToolSpec field"
                        + (f"; {close}" if close else f" (the fields: {', '.join(sorted(known))})"))


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
    ``context`` (annotated ``ToolContext``, ``ToolContext | None`` or not at all)
    receives the call's ``ToolContext`` and is not in the schema. A
    ``functools.partial`` or a callable object works too, given a ``name``.
    """

    _check_spec_fields(spec_fields)

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        static = False
        if isinstance(f, staticmethod):
            # Found by attack: ``@tool`` over ``@staticmethod`` (or ``tool(staticmethod(f))``) was
            # taken for a callable object, its hints read from ``staticmethod.__call__``: every
            # parameter's type silently became "any JSON value". The function is what it wraps.
            f, static = f.__func__, True
        on_class, given = False, typing.cast(Any, f)  # (typeshed: a classmethod is not callable)
        if isinstance(given, classmethod):  # bound to the class it is reached through (``FunctionTool.__get__``)
            f, on_class = given.__func__, True
        target = _target(f)
        if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
            raise TypeError(f"{_label(f)}: a generator function cannot be a tool (its body would not run "
                            "until iterated); return a list")
        schema, takes_context, converters = _input_schema(f, skip_first=on_class, static=static)
        own_name = getattr(f, "__name__", None)
        if name is None and not isinstance(own_name, str):
            raise TypeError(f"{_label(f)} has no __name__: pass @tool(name=...)")
        doc = inspect.getdoc(f) or ""
        spec = ToolSpec(
            name=name or typing.cast(str, own_name),
            description=description if description is not None else doc.split("\n\n")[0].strip(),
            input_schema=schema,
            effect=effect,
            **spec_fields,
        )
        return FunctionTool(f, spec, takes_context, converters, on_class=on_class, static=static)

    return wrap(func) if func is not None else wrap
