"""Which arguments of a call are paths: the input of every path rule that is not the tools' own.

The policy plugin's path rules decide on these, through ``PathRules.resolve_real`` and
``PathPattern``. Two sources:

- the built-in filesystem tools, whose path arguments are known: ``/path`` of ``read_file``,
  ``write_file`` and ``edit_file`` names one file; ``/path`` of ``list_dir``, ``glob`` and
  ``grep`` (default ``.``) is a *walk*: the tool reads entries below it;
- every other tool (imported MCP tools, third-party plugins): its input schema (read once per
  schema) and the call's own argument names. A value is a path when its schema says
  ``"format"`` is one of ``PATH_FORMATS``, or when one of the words of its key (split at ``_``,
  ``-`` and camelCase) is in ``PATH_WORDS`` (``path``, ``file_path``, ``targetFile``,
  ``output_dir``, ``paths``, ``src``...), declared or not. A string is one path; each string item
  of an array is a path (``/paths/0``); objects are searched to ``MAX_DEPTH``. Every such path
  is treated as a walk, since what a server does with it (list it, search below it) cannot be
  known.

What it does not cover: a path the schema does not reveal (a property named ``query`` or
``spec`` holding a path, a path inside a free-form string or a URL, ``anyOf``/``oneOf`` branches,
``additionalProperties``), and what a server really does with a path — it may resolve it
differently (against its own working directory, through its own symlinks), and we cannot verify
that.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final, NamedTuple

from ..._json import json_pointer

FILE_TOOLS: Final = frozenset({"local::fs.read_file", "local::fs.write_file", "local::fs.edit_file"})
WALK_TOOLS: Final = frozenset({"local::fs.list_dir", "local::fs.glob", "local::fs.grep"})
PATH_FORMATS: Final = frozenset({"path", "file-path", "filepath", "file", "directory", "dir", "dir-path",
                                 "directory-path", "uri-reference"})
PATH_WORDS: Final = frozenset({"path", "paths", "file", "files", "filename", "filenames", "filepath",
                               "filepaths", "dir", "dirs", "directory", "directories", "folder", "folders",
                               "cwd", "workdir", "root", "roots", "target", "dest", "destination", "source",
                               "sources", "src", "location"})
MAX_DEPTH: Final = 8
_WORDS: Final = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


class PathArgument(NamedTuple):
    """One path in a call's arguments: where it is, its text, and whether the tool reads below it
    (a tuple: one is made for every path of every call)."""

    pointer: str
    value: Any  # a string when usable; anything else is refused by the rules (fail closed)
    walk: bool


#: A location: property names from the top, ``None`` standing for "every item of an array".
Location = tuple[str | None, ...]


@functools.lru_cache(maxsize=4096)
def _is_path_name(name: str) -> bool:
    return any(word.lower() in PATH_WORDS for word in _WORDS.findall(name))


@functools.lru_cache(maxsize=4096)
def _top_pointer(name: str) -> str:
    """The JSON pointer of a top-level property (``json_pointer((name,))``), computed once per name."""
    return json_pointer((name,))


def _locations(schema: Any, prefix: Location, depth: int) -> Iterator[Location]:
    """Locations the schema marks as paths by ``format`` or by a property's name."""
    if depth > MAX_DEPTH or not isinstance(schema, Mapping):
        return
    properties = schema.get("properties")
    for name, sub in properties.items() if isinstance(properties, Mapping) else ():
        if not isinstance(sub, Mapping):
            continue
        here = (*prefix, str(name))
        if sub.get("format") in PATH_FORMATS or _is_path_name(str(name)):
            yield here
            yield (*here, None)
        items = sub.get("items")
        if isinstance(items, Mapping):
            if items.get("format") in PATH_FORMATS:
                yield (*here, None)
            yield from _locations(items, (*here, None), depth + 1)
        yield from _locations(sub, here, depth + 1)


class _Plan(NamedTuple):
    """A schema's path locations as ``path_arguments`` uses them, in the schema's order, each with
    the JSON pointer of a top-level property (looked up, not walked) or None (walked)."""

    locations: tuple[Location, ...]
    steps: tuple[tuple[Location, str | None], ...]


_CACHE: dict[str, tuple[Any, _Plan]] = {}


def _plan(tool: str, schema: Any) -> _Plan:
    """The path locations of a tool's input schema (cached per tool while its schema object is the same)."""
    cached = _CACHE.get(tool)
    if cached is not None and cached[0] is schema:
        return cached[1]
    found = tuple(dict.fromkeys(_locations(schema, (), 0)))
    steps = tuple((location, _top_pointer(location[0]) if len(location) == 1 and location[0] is not None else None)
                  for location in found)
    plan = _Plan(found, steps)
    _CACHE[tool] = (schema, plan)
    return plan


def schema_locations(tool: str, schema: Any) -> tuple[Location, ...]:
    """The path locations of a tool's input schema (cached per tool while its schema object is the same)."""
    return _plan(tool, schema).locations


def _at(data: Any, location: Location, keys: tuple[str | int, ...], found: dict[str, str]) -> None:
    """Add the strings at ``location`` in ``data`` to ``found`` (by JSON pointer, first one kept)."""
    if not location:
        if isinstance(data, str):
            found.setdefault(json_pointer(keys), data)
        return
    head, rest = location[0], location[1:]
    if head is None:
        if isinstance(data, list):
            for index, item in enumerate(data):
                _at(item, rest, (*keys, index), found)
    elif isinstance(data, Mapping) and head in data:
        _at(data[head], rest, (*keys, head), found)


#: Argument values that hold no path and are no container (skip the ``Mapping`` ABC check).
_SCALARS: Final = (int, float, type(None))


def _named(data: Any, keys: tuple[str | int, ...], path_name: bool, depth: int, found: dict[str, str]) -> None:
    """Add the strings under a path-like key in the call's own arguments (schemas may not declare them)."""
    if isinstance(data, str):
        if path_name:
            found.setdefault(json_pointer(keys), data)
    elif depth < MAX_DEPTH:
        if isinstance(data, (dict, Mapping)):  # a dict is found before the ABC's slower check
            for key, value in data.items():
                if isinstance(value, str):  # the common case, without a call per value
                    name = str(key)
                    if _is_path_name(name):
                        found.setdefault(json_pointer((*keys, name)) if keys else _top_pointer(name), value)
                elif not isinstance(value, _SCALARS) and isinstance(value, (dict, list, Mapping)):
                    name = str(key)
                    _named(value, (*keys, name), _is_path_name(name), depth + 1, found)
        elif isinstance(data, list):
            for index, item in enumerate(data):
                _named(item, (*keys, index), path_name, depth + 1, found)


def path_arguments(tool: str, schema: Any, arguments: Any) -> list[PathArgument]:
    """Every path in ``arguments`` of a call of ``tool`` (its ``input_schema``: ``schema``)."""
    if tool in FILE_TOOLS or tool in WALK_TOOLS:
        value = arguments.get("path", "." if tool in WALK_TOOLS else None) if isinstance(arguments, Mapping) \
            else None
        return [PathArgument("/path", value, tool in WALK_TOOLS)]
    found: dict[str, str] = {}
    plan = _plan(tool, schema)
    if arguments.__class__ is dict:  # a plain dict: ``get`` and ``[]`` agree (a subclass may not)
        for location, pointer in plan.steps:
            head = location[0]
            if pointer is not None:  # a top-level property: one lookup
                value = arguments.get(head)
                if isinstance(value, str):
                    found.setdefault(pointer, value)
            elif head is None or not isinstance(arguments.get(head), str):  # nothing lies below a string
                _at(arguments, location, (), found)
    else:
        for location in plan.locations:
            _at(arguments, location, (), found)
    _named(arguments, (), False, 0, found)
    return [PathArgument(pointer, value, True) for pointer, value in found.items()]
