"""The compiled schema fast path never accepts what jsonschema rejects."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools.schema import MAX_INT_BITS, is_plain_json
from amplifier_tools.schema_fastpath import compile_check, generate_check, generate_plain_check, proves_plain

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


@pytest.mark.slow
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


class Key(str):
    """A key that is not plain JSON but compares equal to a property name."""


#: Values a caller may pass that are not plain JSON data, or not within the host's limits, and
#: the largest integers within them.
hostile = st.sampled_from([2 ** MAX_INT_BITS, -(2 ** MAX_INT_BITS), 2 ** MAX_INT_BITS - 1, -(2 ** MAX_INT_BITS - 1),
                           float("nan"), float("-inf"), (1, 2), {"a"}, {Key("a"): "x"}, {1: "x"}, True, b"a"])
plain_scalar_types = st.sampled_from(["string", "integer", "number", "boolean", "null"])
plain_schemas = st.recursive(
    st.fixed_dictionaries({"type": plain_scalar_types | st.lists(plain_scalar_types, min_size=1, max_size=3,
                                                                 unique=True)},
                          optional={"minimum": st.integers(-3, 3), "maxLength": st.integers(0, 3),
                                    "pattern": st.sampled_from(["^a", "b$"])})
    | st.fixed_dictionaries({"enum": st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=3)}),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
         "additionalProperties": st.just(False) | inner},
        optional={"required": st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True)})
    | st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                            optional={"maxItems": st.integers(0, 3), "minItems": st.integers(0, 2)}),
    max_leaves=6,
)


@settings(max_examples=1000, deadline=None)
@given(plain_schemas, st.lists(st.recursive(
    scalars | hostile,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), c, max_size=4)
    | st.dictionaries(st.sampled_from([Key("a"), 1]), c, max_size=1),
    max_leaves=8), min_size=1, max_size=6))
@pytest.mark.slow
def test_the_plain_predicate_is_plain_json_and_valid(schema: dict[str, Any], values: list[Any]) -> None:
    """One generated predicate answers both questions of an argument check (the host's limits
    on integers and floats included, a key that only compares equal to a name refused)."""
    assert proves_plain(schema), schema
    plain = generate_plain_check(schema, MAX_INT_BITS)
    assert plain is not None, schema
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        assert plain(value) == (is_plain_json(value) and validator.is_valid(value)), (schema, value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}},  # any other key, any value
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False},  # "a" may hold anything
        {"type": "array"},
        {"type": ["object", "string"], "additionalProperties": False},
        {"oneOf": [{"type": "string"}, {"type": "null"}]},
        {"minLength": 1},
    ],
)
def test_schemas_that_let_any_value_through_get_no_plain_predicate(schema: dict[str, Any]) -> None:
    assert generate_plain_check(schema, MAX_INT_BITS) is None


@pytest.mark.parametrize("kind", ["integer", "number"])
@pytest.mark.parametrize("value", [2 ** MAX_INT_BITS - 1, -(2 ** MAX_INT_BITS - 1), 2 ** MAX_INT_BITS,
                                   -(2 ** MAX_INT_BITS)], ids=["largest", "smallest", "one-over", "one-under"])
def test_the_plain_predicate_takes_integers_up_to_the_bit_limit(kind: str, value: int) -> None:
    """At the host's integer limit exactly: an ``int`` of ``MAX_INT_BITS`` bits is plain, one more
    bit is not, whether the value stands alone or in an object with a bound."""
    within = value.bit_length() <= MAX_INT_BITS
    alone = generate_plain_check({"type": kind}, MAX_INT_BITS)
    nested = generate_plain_check({"type": "object", "properties": {"n": {"type": kind, "minimum": -(2 ** 20000)}},
                                   "additionalProperties": False}, MAX_INT_BITS)
    assert alone is not None and nested is not None
    assert alone(value) is within and nested({"n": value}) is within
    assert is_plain_json(value) is within


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "string", "minLength": 2, "pattern": "^a"}, "ab", "ba"),
    ({"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1}, [1, 2], [1, 0]),
    ({"type": "object", "properties": {"a": {"type": "number", "maximum": 3}}, "additionalProperties": False},
     {"a": 3}, {"a": 3.5}),
])
def test_a_keyword_whose_type_is_already_tested_needs_no_guard_of_its_own(schema: dict[str, Any], good: Any,
                                                                          bad: Any) -> None:
    """One tested type makes the keyword's own type guard redundant: the generated code leaves it
    out, and still answers as jsonschema does (also for values of other types)."""
    plain = generate_plain_check(schema, MAX_INT_BITS)
    assert plain is not None
    validator = jsonschema.Draft202012Validator(schema)
    for value in (good, bad, None, 1, "a", [], {}, True):
        assert plain(value) == validator.is_valid(value), value
    assert plain(good) and not plain(bad)
