"""The compiled schema fast path never accepts what jsonschema rejects."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools.schema_fastpath import compile_check, generate_check

scalars = (
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5) | st.sampled_from([1.0, 2.5, -0.0])
    | st.sampled_from([float("nan"), float("inf")]) | st.text(max_size=4) | st.sampled_from(["a", "b", "ab", ""])
)
instances = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), c, max_size=4),
    max_leaves=8,
)

types = st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"])


def leaf_schemas() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": types | st.lists(types, min_size=1, max_size=3, unique=True),
            "enum": st.lists(st.sampled_from(["a", "b", None, "ab"]), min_size=1, max_size=3),
            "minimum": st.integers(-3, 3),
            "maximum": st.floats(-3, 3),
            "exclusiveMinimum": st.integers(-3, 3),
            "minLength": st.integers(0, 3),
            "maxLength": st.integers(0, 3),
            "pattern": st.sampled_from(["^a", "b$", "[0-9]"]),
            "minItems": st.integers(0, 2),
            "maxItems": st.integers(0, 3),
            "description": st.text(max_size=3),
        },
    )


#: Type sets that no two ``oneOf`` branches may share (integer and number overlap).
disjoint_types = st.lists(st.sampled_from([["string"], ["boolean"], ["null"], ["object"], ["array"], ["number"],
                                           ["integer"], ["string", "null"], ["array", "boolean"]]),
                          min_size=1, max_size=3).filter(
    lambda kinds: len({n if n != "integer" else "number" for k in kinds for n in k})
    == sum(len(k) for k in kinds))


def one_of(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[list[dict[str, Any]]]:
    """``oneOf`` branches with disjoint types: each an ``inner`` schema with its ``type`` set."""
    return disjoint_types.flatmap(lambda kinds: st.tuples(*(
        inner.map(lambda branch, kind=kind: {**branch, "type": kind if len(kind) > 1 else kind[0]})
        for kind in kinds)).map(list))


schemas = st.recursive(
    leaf_schemas(),
    lambda inner: st.fixed_dictionaries(
        {},
        optional={
            "type": st.just("object") | types,
            "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            "required": st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=3, unique=True),
            "additionalProperties": st.booleans() | inner,
            "items": inner,
            "minProperties": st.integers(0, 2),
            "maxProperties": st.integers(0, 4),
            "oneOf": one_of(inner),
        },
    ),
    max_leaves=6,
)


@settings(max_examples=1500, deadline=None)
@given(schemas, st.lists(instances, min_size=1, max_size=6))
def test_fast_path_accepts_only_what_jsonschema_accepts(schema: dict[str, Any], values: list[Any]) -> None:
    closures, generated = compile_check(schema), generate_check(schema)
    assert closures is not None and generated is not None, schema  # every keyword drawn is in the subset
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        expected = validator.is_valid(value)
        assert closures(value) == expected, (schema, value)
        assert generated(value) == expected, (schema, value)


def test_a_schema_nested_past_the_compilers_block_limit_keeps_the_closures() -> None:
    """Python's compiler refuses more than 20 nested blocks: such a schema still gets a fast path."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(30):
        schema = {"type": "array", "items": schema}
    check = generate_check(schema)
    assert check is not None
    value: Any = "deep"
    for _ in range(30):
        value = [value]
    assert check(value) and not check([[1]])
    assert check(value) == jsonschema.Draft202012Validator(schema).is_valid(value)


def test_nothing_of_a_schema_becomes_code() -> None:
    """Property names and values are data in the generated function, never its source."""
    hostile = 'a"] or __import__("os").system("exit 3") or v["'
    schema = {"type": "object", "properties": {hostile: {"type": "string", "pattern": "^x"},
                                               "n": {"type": "integer", "maximum": 1e308}},
              "required": [hostile], "additionalProperties": False}
    check = generate_check(schema)
    assert check is not None
    assert check({hostile: "xy", "n": 3})
    assert not check({hostile: "yy"}) and not check({"n": 1}) and not check({hostile: "x", "other": 1})
    assert hostile not in repr(check.__code__.co_consts)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"allOf": [{"type": "string"}]},
        {"enum": [1, True]},
        {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 1, "exclusiveMinimum": True},
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
        {"items": [{"type": "string"}]},
        {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]},  # 3 matches both
        {"oneOf": [{"type": ["string", "null"]}, {"type": "null"}]},
        {"oneOf": [{"type": "string"}, {"minLength": 2}]},  # a branch without a type
        {"oneOf": []},
    ],
)
def test_schemas_outside_the_subset_are_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None and generate_check(schema) is None
