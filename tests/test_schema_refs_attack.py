"""Found by attack on the $ref checks at mount: schemas the expansion count undercounted (LangChain's
``convert_to_openai_tool`` writes every one out in full: seconds to minutes and hundreds of MB for
the sizes here, without end for the larger ones), and references that resolve to nothing yet
mounted (every call reaching them ended as an internal error)."""

from __future__ import annotations

from typing import Any

import pytest

from amplifier_tools.errors import ContractError
from amplifier_tools.schema import MAX_EXPANDED_VALUES, compile_validator

TOO_LARGE = f"more than {MAX_EXPANDED_VALUES:,} values with its \\$refs written out"


def _mount(schema: dict[str, Any]) -> Any:
    return compile_validator(schema, owner="x::t", which="input_schema")


def _doubling(levels: int, first: str, prefix: str = "#/$defs/C") -> dict[str, Any]:
    """C1..C<levels>, each referring twice to the one before; C1 to ``first``."""
    defs: dict[str, Any] = {}
    below = first
    for level in range(1, levels + 1):
        defs[f"C{level}"] = {"type": "object", "properties": {"l": {"$ref": below}, "r": {"$ref": below}}}
        below = f"{prefix}{level}"
    return defs


def test_data_is_counted_where_it_is_written_out() -> None:
    """An ``enum`` counted as one value: 256 copies of a 1,000-value enum (LangChain wrote 257,285
    values in 1.2 s; 100,000 values and 12 levels: 409 million)."""
    defs = {"E": {"enum": list(range(1000))}, **_doubling(8, "#/$defs/E")}
    with pytest.raises(ContractError, match=TOO_LARGE):
        _mount({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/C8"}}})


def test_a_key_named_like_a_data_keyword_is_no_data() -> None:
    """Definitions under a ``$defs`` entry named ``default``, used by a property named ``default``:
    both were skipped as data, and 40 doubling levels counted 6 values."""
    inner: dict[str, Any] = {"D0": {"type": "string"}}
    for level in range(1, 41):
        below = {"$ref": f"#/$defs/default/$defs/D{level - 1}"}
        inner[f"D{level}"] = {"type": "object", "properties": {"l": below, "r": dict(below)}}
    schema = {"type": "object", "$defs": {"default": {"$defs": inner}},
              "properties": {"default": {"$ref": "#/$defs/default/$defs/D40"}}}
    with pytest.raises(ContractError, match=TOO_LARGE):
        _mount(schema)


def test_a_count_made_inside_a_cycle_is_not_reused_outside_it() -> None:
    """A cycle of 10 definitions, each referring twice to the next: the last one's count, made
    while the first was being counted, was 3 values; LangChain writes 2 ** 10 of them at every
    entry. 2 ** 8 uses of it counted 21,378 values; LangChain wrote 1,048,581 (39 s, 227 MB)."""
    defs: dict[str, Any] = {}
    for index in range(10):
        below = {"$ref": f"#/$defs/D{(index + 1) % 10}"}
        defs[f"D{index}"] = {"type": "object", "properties": {"l": below, "r": dict(below)}}
    defs.update(_doubling(8, "#/$defs/D9"))
    with pytest.raises(ContractError, match=TOO_LARGE):
        _mount({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/C8"}}})


def test_a_ref_beside_an_id_is_counted() -> None:
    """``{"$id": ..., "$ref": "#/$defs/..."}`` was neither counted nor checked; LangChain resolves it
    from the root, whatever the $id: 40 doubling levels counted 376 values."""
    defs: dict[str, Any] = {"D0": {"type": "string"}}
    for level in range(1, 41):
        defs[f"D{level}"] = {"type": "object", "properties": {
            side: {"$id": f"urn:{side}{level}", "$ref": f"#/$defs/D{level - 1}",
                   "$defs": {f"D{level - 1}": {"type": "string"}}}  # resolvable under its own base too
            for side in ("l", "r")}}
    with pytest.raises(ContractError, match=TOO_LARGE):
        _mount({"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/D40"}}})


def test_refs_back_to_the_root_are_written_out_once_more() -> None:
    """1,000 properties each ``{"$ref": "#"}`` counted 2,003 values; LangChain writes the root out
    once per property: 1,004,008 values, 20 s, 180 MB."""
    with pytest.raises(ContractError, match=TOO_LARGE):
        _mount({"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(1000)}})


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$dynamicRef": "#nope"}}},
    {"type": "object", "properties": {"a": {"$dynamicRef": "http://127.0.0.1:9/x#a"}}},
    {"type": "object", "properties": {"a": {"$id": "urn:a", "properties": {"b": {"$ref": "#/nope"}}}}},
], ids=["dynamicRef-anchor", "dynamicRef-remote", "ref-under-nested-id"])
def test_a_reference_that_resolves_to_nothing_is_refused_at_mount(schema: dict[str, Any]) -> None:
    """These mounted, and every call reaching them was an internal error (_WrappedReferencingError)."""
    with pytest.raises(ContractError, match="resolves to nothing"):
        _mount(schema)


@pytest.mark.parametrize(("schema", "good", "bad"), [
    ({"type": "object", "properties": {"name": {"type": "string"},
                                       "children": {"type": "array", "items": {"$ref": "#"}}}},
     {"name": "a", "children": [{"name": "b", "children": []}]}, {"name": 1}),
    ({"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}},
      "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/$defs/B"}}},
     {"a": {"b": {"a": {}}}}, {"a": {"b": 1}}),
    ({"type": "object", "properties": {"a": {"$id": "urn:a", "$defs": {"x": {"type": "integer"}},
                                             "properties": {"b": {"$ref": "#/$defs/x"}}}}},
     {"a": {"b": 1}}, {"a": {"b": "s"}}),
    ({"type": "object", "properties": {"default": {"type": "string"}, "enum": {"type": "integer"},
                                       "$ref": {"type": "boolean"}}},
     {"default": "d", "enum": 1, "$ref": True}, {"enum": "e"}),
], ids=["tree", "mutual", "nested-id-local", "keyword-names"])
def test_legitimate_recursive_and_scoped_schemas_still_mount(schema: dict[str, Any], good: Any, bad: Any) -> None:
    validator = _mount(schema)
    assert validator.is_valid(good) and not validator.is_valid(bad)
