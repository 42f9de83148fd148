"""The fast paths of issue #16 give the answers of the plain walks they replace: which arguments are
paths (``filesystem.arguments.path_arguments``: top-level properties looked up, scalars skipped
without the ``Mapping`` check) and which protected entry covers a path (``ProtectedPaths.protects``:
one ``startswith`` over every entry first)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools._json import json_pointer
from amplifier_tools.builtins.filesystem import arguments
from amplifier_tools.hoststate import ProtectedPaths


class Frozen(Mapping[str, Any]):
    """A mapping that is no dict: the ``Mapping`` branch must still see it."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def reference_named(data: Any, keys: tuple[Any, ...], path_name: bool, depth: int, found: dict[str, str]) -> None:
    """``_named`` as it was: every value through one recursive call."""
    if isinstance(data, str):
        if path_name:
            found.setdefault(json_pointer(keys), data)
    elif depth < arguments.MAX_DEPTH:
        if isinstance(data, Mapping):
            for key, value in data.items():
                if isinstance(value, (str, Mapping, list)):
                    name = str(key)
                    reference_named(value, (*keys, name), arguments._is_path_name(name), depth + 1, found)
        elif isinstance(data, list):
            for index, item in enumerate(data):
                reference_named(item, (*keys, index), path_name, depth + 1, found)


def reference(tool: str, schema: Any, args: Any) -> list[tuple[str, Any, bool]]:
    found: dict[str, str] = {}
    for location in arguments.schema_locations(tool, schema):
        arguments._at(args, location, (), found)
    reference_named(args, (), False, 0, found)
    return [(pointer, value, True) for pointer, value in found.items()]


SCHEMA = {"type": "object", "properties": {
    "path": {"type": "string"}, "limit": {"type": "integer"}, "query": {"type": "string", "format": "path"},
    "files": {"type": "array", "items": {"type": "string"}},
    "options": {"type": "object", "properties": {"cwd": {"type": "string"}, "n": {"type": "integer"}}}}}

#: The same properties with the nested and array ones first: the answer keeps the schema's order.
SCHEMA_NESTED_FIRST = {"type": "object", "properties": {
    key: SCHEMA["properties"][key] for key in ("options", "files", "path", "limit", "query")}}

KEYS = st.sampled_from(["path", "limit", "query", "files", "options", "cwd", "n", "targetFile", "text", "a/b~c",
                        "output_dir", "src"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4),
    st.dictionaries(KEYS, inner, max_size=3).map(Frozen)), max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.dictionaries(KEYS, VALUES, max_size=6), st.dictionaries(KEYS, VALUES, max_size=4).map(Frozen),
                 VALUES), st.sampled_from([("third::tool", SCHEMA), ("third::nested-first", SCHEMA_NESTED_FIRST)]))
def test_path_arguments_match_the_plain_walk(args: Any, tool_schema: tuple[str, Any]) -> None:
    tool, schema = tool_schema
    got = [(a.pointer, a.value, a.walk) for a in arguments.path_arguments(tool, schema, args)]
    assert got == reference(tool, schema, args)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["/", "/srv/app", "/srv/app/", "/srv/app/config.toml", "/home/u/.state", "/srv"]),
                max_size=4),
       st.sampled_from(["/", "/srv", "/srv/app", "/srv/apple", "/srv/app/x", "/srv/app/config.toml.bak",
                        "/home/u/.state/audit.jsonl", "/home/u", "/etc/passwd", "relative"]))
def test_protects_matches_the_plain_loop(entries: list[str], path: str) -> None:
    protected = ProtectedPaths()
    for entry in entries:
        protected.add(entry, "test")
    expected = next((e for e in protected if path == e.path or path.startswith(e.path.rstrip(os.sep) + os.sep)),
                    None)
    assert protected.protects(path) == expected


PATH_TEXT = st.one_of(
    st.sampled_from(["~", "~/x", "~root", "~root/x", "~nobody-here/x", "/", "/etc/passwd", "//x", ".", "..",
                     "a//b", "./a", "a/../b", "é", "\udcff", "x" * 1025, "é" * 1025, "\U0001f600" * 1024]),
    st.text(min_size=1, max_size=12).filter(lambda text: "\x00" not in text))


@settings(max_examples=400, deadline=None)
@given(PATH_TEXT, st.sampled_from(["/srv/app", "/", "/home/u/work"]))
def test_a_joined_path_is_os_path_join_of_the_expanded_path(path: str, working_dir: str) -> None:
    """``PathRules._joined`` (a path made absolute without ``os.path.join``, measured without
    encoding when short) answers what the plain spelling answers, or refuses the same paths."""
    from amplifier_tools.builtins.filesystem.paths import MAX_PATH_BYTES, PathRules
    from amplifier_tools.errors import ContractError

    rules = PathRules(working_dir, read_roots=[working_dir], write_roots=[working_dir])
    too_long = len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES
    try:
        got = rules._joined(path)
    except ContractError:
        assert too_long
    else:
        assert not too_long
        assert got == os.path.join(working_dir, os.path.expanduser(path))


class Disagreeing(dict):  # type: ignore[type-arg]
    """Arguments whose ``get`` and ``[]`` answer differently (a caller's own mapping type)."""

    def __getitem__(self, key: Any) -> Any:
        return {"file_path": "/state/audit.jsonl"} if key == "options" else dict.__getitem__(self, key)


def test_a_dict_subclass_is_walked_as_the_tool_will_read_it() -> None:
    """Found by attack: the walk below a top-level string was skipped after ``get`` said it was a
    string, while a tool reads with ``[]``: a nested path naming the audit log went unseen."""
    schema = {"type": "object", "properties": {"options": {"type": "object",
                                                           "properties": {"file_path": {"type": "string"}}}}}
    found = arguments.path_arguments("third::writer", schema, Disagreeing(options="harmless"))
    assert ("/options/file_path", "/state/audit.jsonl") in [(a.pointer, a.value) for a in found]
