"""The compiled schema fast path never accepts what jsonschema rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import ToolHost
from amplifier_tools.schema import (
    MAX_INT_BITS,
    MAX_JSON_DEPTH,
    PLAIN_JSON,
    CompiledSchema,
    compile_validator,
    is_plain_json,
)
from amplifier_tools.schema_fastpath import PlainJSON, compile_check, generate_check, generate_plain_check

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


class LooksLikeA:
    """A key of no JSON type that hashes and compares as the property name ``"a"``."""

    def __hash__(self) -> int:
        return hash("a")

    def __eq__(self, other: object) -> bool:
        return other == "a"


class Mapping(dict[Any, Any]):
    """A dict subclass: JSON-like, but not plain JSON data."""


class Number(int):
    """An int subclass: JSON-like, but not plain JSON data."""


def nested(levels: int, leaf: Any = 1) -> Any:
    """``leaf`` inside ``levels`` containers, arrays and objects in turn (the innermost an array)."""
    value = leaf
    for level in range(levels):
        value = {"a": value} if level % 2 else [value]
    return value


#: Values a caller may pass that are not plain JSON data, or not within the host's limits, and
#: the largest integers, floats and nestings within them.
hostile = st.sampled_from([
    2 ** MAX_INT_BITS, -(2 ** MAX_INT_BITS), 2 ** MAX_INT_BITS - 1, -(2 ** MAX_INT_BITS - 1), 1e308,
    float("nan"), float("-inf"), (1, 2), {"a"}, {Key("a"): "x"}, {LooksLikeA(): "x"}, {1: "x"}, {True: "x"},
    Mapping(a="x"), Key("a"), Number(1), True, 1, 1.0, b"a",
    nested(MAX_JSON_DEPTH - 2), nested(MAX_JSON_DEPTH - 1), nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH + 1),
])
hostile_instances = st.recursive(
    scalars | hostile,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), c, max_size=4)
    | st.dictionaries(st.sampled_from(["a", "b", Key("a"), Key("c"), LooksLikeA(), 1, True]), c, min_size=1, max_size=3)
    | st.dictionaries(st.sampled_from(["a", "b"]), c, max_size=2).map(Mapping),
    max_leaves=8,
)


def plain_predicate_agrees(schema: dict[str, Any], values: list[Any]) -> None:
    """The plain predicate of ``schema`` says True exactly for the ``values`` that are plain JSON
    data (``is_plain_json``) and valid (jsonschema)."""
    plain = generate_plain_check(schema, PLAIN_JSON)
    assert plain is not None, schema  # every keyword drawn is in the subset
    validator = jsonschema.Draft202012Validator(schema)
    for value in values:
        assert plain(value) == (is_plain_json(value) and validator.is_valid(value)), (schema, value)


@settings(max_examples=300, deadline=None)
@given(schemas, st.lists(hostile_instances, min_size=1, max_size=6))
def test_the_plain_predicate_is_plain_json_and_valid(schema: dict[str, Any], values: list[Any]) -> None:
    """One generated predicate answers both questions of an argument check, for every schema of
    the compiled subset (open objects and untyped subschemas included): the host's limits on
    integers, floats and nesting, exact types, keys that only compare equal to a name refused."""
    plain_predicate_agrees(schema, values)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(schemas, st.lists(hostile_instances, min_size=1, max_size=6))
def test_the_plain_predicate_is_plain_json_and_valid_at_length(schema: dict[str, Any], values: list[Any]) -> None:
    """``test_the_plain_predicate_is_plain_json_and_valid`` on ten times as many examples."""
    plain_predicate_agrees(schema, values)


@pytest.mark.parametrize("schema, good, bad", [
    ({"type": "object", "properties": {"a": {"type": "string"}}}, {"a": "x", "b": [1, {"c": None}]},
     {"a": "x", "b": {"c": (1,)}}),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
     {"a": "x", "b": 2, "c": 1.5, "d": True}, {"a": "x", "b": 2, "c": float("nan")}),
    ({"type": "object", "properties": {"a": {"description": "anything"}}}, {"a": {"b": [None]}}, {"a": {2: "x"}}),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, {"a": [1.5]}, {"a": [1e400]}),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"title": "t"}}}}, {"a": ["x", 1]},
     {"a": ["x", 2 ** MAX_INT_BITS]}),
    ({"type": "array"}, [{"a": 1}], [{"a": Number(1)}]),
    ({"type": ["object", "string"], "additionalProperties": True}, {"a": 1}, {"a": {1, 2}}),
    ({"oneOf": [{"type": "string"}, {"type": "object"}]}, {"a": [1]}, {"a": Key("x")}),
    ({"minLength": 1}, {"a": "x"}, {"a": b"x"}),
    ({"type": "object", "required": ["a"]}, {"a": 1, "b": 2}, {LooksLikeA(): 1, "b": 2}),
    ({"type": "object", "properties": {"a": {"type": "string"}}}, {"a": "x", "b": 1}, {Key("a"): "x", "b": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}}, {"a": "x", "b": 1}, {"a": "x", 1: 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, {"a": "x"},
     {LooksLikeA(): "x"}),
])
def test_values_the_schema_does_not_type_are_walked_by_the_plain_predicate(schema: dict[str, Any], good: Any,
                                                                           bad: Any) -> None:
    """Open objects, untyped and annotation-only subschemas get a plain predicate too: it vouches
    for the values they let through by the host's own walk, refusing what is not plain JSON."""
    plain = generate_plain_check(schema, PLAIN_JSON)
    assert plain is not None
    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(good) and is_plain_json(good) and plain(good)
    assert not is_plain_json(bad) and not plain(bad)


@pytest.mark.parametrize("schema, wrap, around", [
    ({}, lambda value: value, 0),
    ({"type": "object", "properties": {"a": {"type": "string"}}}, lambda value: {"a": "x", "b": value}, 1),
    ({"type": "object", "properties": {"a": {"description": "x"}}, "required": ["a"]}, lambda value: {"a": value}, 1),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {}}}, "additionalProperties": False},
     lambda value: {"a": [value]}, 2),
    ({"type": "object", "additionalProperties": {"type": "array"}}, lambda value: {"b": [value]}, 2),
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "array"}, {"type": "string"}]}}},
     lambda value: {"a": [value]}, 2),
    ({"type": "array", "items": {"type": "object"}}, lambda value: [{"a": value}], 2),
])
@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_the_plain_predicate_limits_the_whole_values_depth(schema: dict[str, Any], wrap: Any, around: int,
                                                           levels: int) -> None:
    """Containers nested ``MAX_JSON_DEPTH`` deep in all are plain, one more is not, wherever the
    schema hands the deep part to the plain walk (the ``around`` levels above it counted)."""
    value = wrap(nested(levels - around))
    assert is_plain_json(value) is (levels <= MAX_JSON_DEPTH)
    plain = generate_plain_check(schema, PLAIN_JSON)
    assert plain is not None
    assert plain(value) is (levels <= MAX_JSON_DEPTH)


def test_the_plain_predicates_own_type_tests_keep_the_depth_limit() -> None:
    """Where the schema tests every level by its exact type, the depth limit holds as well (shown
    with a limit of 3, and the host's walk told the same)."""
    shallow = PlainJSON(MAX_INT_BITS, 3, lambda value, depth: is_plain_json(value, depth + MAX_JSON_DEPTH - 3))
    schema: dict[str, Any] = {"type": "array", "items": {"type": "object", "additionalProperties": {
        "type": "array", "items": {"type": "object", "additionalProperties": False}}}}
    plain = generate_plain_check(schema, shallow)
    assert plain is not None
    assert plain([{"a": []}]) and plain([{"a": [], "b": []}])
    assert not plain([{"a": [{}]}])  # the fourth level
    typed_oneof = {"oneOf": [{"type": "array", "items": {"oneOf": [{"type": "array", "items": {"oneOf": [
        {"type": "array", "items": {"type": "array"}}, {"type": "string"}]}}]}}]}
    plain = generate_plain_check(typed_oneof, shallow)
    assert plain is not None
    assert plain([[[]]]) and plain([["x"]]) and not plain([[[[]]]])


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"description": "x"}},
    {"type": "array", "items": {"items": {"title": "t"}}},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"description": "x"}}}},
    {"type": "object", "properties": {"a": {"items": {"format": "date"}}}, "additionalProperties": False},
])
def test_an_annotation_only_item_schema_still_gets_the_generated_predicate(schema: dict[str, Any]) -> None:
    """``items`` that only annotate gave a loop without a body, which did not compile: the schema
    silently got the slower closures (found by review)."""
    validator = jsonschema.Draft202012Validator(schema)
    for generate in (generate_check, lambda s: generate_plain_check(s, PLAIN_JSON)):
        check = generate(schema)
        assert check is not None
        assert check.__code__.co_filename == "<amplifier_tools.schema_fastpath>"
        for value in ([], [1, "x"], [[1]], {"a": [None]}, {"a": 1}, "x"):
            assert check(value) == validator.is_valid(value), value


async def test_every_builtin_input_schema_gets_a_plain_predicate(tmp_path: Path) -> None:
    """The built-in tools' arguments are checked by one generated predicate, never by the
    ``is_plain_json`` and ``is_valid`` pair."""
    async with ToolHost(entry_points=False, discover=False, working_dir=tmp_path) as host:
        schemas = {m.spec.name: m.spec.input_schema for m in host.tools}
    assert {"local::bash", "local::fs.read_file", "local::fs.write_file", "local::fs.edit_file"} <= set(schemas)
    for name, schema in schemas.items():
        compiled = CompiledSchema(schema)
        verdict = compiled.accepts_plain({"path": "x", "command": 1})
        assert verdict is jsonschema.Draft202012Validator(schema).is_valid({"path": "x", "command": 1}), name
        assert compiled.accepts_plain.__code__.co_filename == "<amplifier_tools.schema_fastpath>", name


@pytest.mark.parametrize("kind", ["integer", "number"])
@pytest.mark.parametrize("value", [2 ** MAX_INT_BITS - 1, -(2 ** MAX_INT_BITS - 1), 2 ** MAX_INT_BITS,
                                   -(2 ** MAX_INT_BITS)], ids=["largest", "smallest", "one-over", "one-under"])
def test_the_plain_predicate_takes_integers_up_to_the_bit_limit(kind: str, value: int) -> None:
    """At the host's integer limit exactly: an ``int`` of ``MAX_INT_BITS`` bits is plain, one more
    bit is not, whether the value stands alone or in an object with a bound."""
    within = value.bit_length() <= MAX_INT_BITS
    alone = generate_plain_check({"type": kind}, PLAIN_JSON)
    inside = generate_plain_check({"type": "object", "properties": {"n": {"type": kind, "minimum": -(2 ** 20000)}},
                                   "additionalProperties": False}, PLAIN_JSON)
    unlisted = generate_plain_check({"type": "object", "properties": {"m": {"type": kind}}}, PLAIN_JSON)
    assert alone is not None and inside is not None and unlisted is not None
    assert alone(value) is within and inside({"n": value}) is within and unlisted({"m": 1, "n": value}) is within
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
    plain = generate_plain_check(schema, PLAIN_JSON)
    assert plain is not None
    validator = jsonschema.Draft202012Validator(schema)
    for value in (good, bad, None, 1, "a", [], {}, True):
        assert plain(value) == validator.is_valid(value), value
    assert plain(good) and not plain(bad)


DRAFT_04 = "http://json-schema.org/draft-04/schema#"
DRAFT_03 = "http://json-schema.org/draft-03/schema#"


@pytest.mark.parametrize("dialect", [DRAFT_04, DRAFT_03])
@pytest.mark.parametrize("schema, value", [
    ({"type": "object", "properties": {"a": {"$schema": "{d}", "type": "integer"}}}, {"a": 1.0}),
    ({"type": "object", "additionalProperties": {"$schema": "{d}", "type": "integer"}}, {"b": 2.0}),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"$schema": "{d}", "type": "integer"}}}},
     {"a": [1, 1.0]}),
    ({"type": "object", "properties": {"a": {"oneOf": [{"$schema": "{d}", "type": "integer"}, {"type": "string"}]}}},
     {"a": 3.0}),
])
def test_a_subschema_naming_an_older_draft_is_left_to_jsonschema(dialect: str, schema: dict[str, Any],
                                                                  value: Any) -> None:
    """jsonschema validates a subschema by the draft its own ``$schema`` names, and drafts 3 and 4
    count no float as an integer: such a schema gets no fast path, so ``1.0`` is refused as
    jsonschema refuses it (the fast path once accepted it, and ``accepts_plain`` skipped jsonschema)."""
    schema = json.loads(json.dumps(schema).replace("{d}", dialect))
    assert compile_check(schema) is None and generate_plain_check(schema, PLAIN_JSON) is None
    validator = compile_validator(schema, owner="t", which="input")
    assert not validator.accepts_plain(value)
    assert not validator.is_valid(value)


@pytest.mark.parametrize("dialect", ["http://json-schema.org/draft-07/schema#",
                                     "https://json-schema.org/draft/2020-12/schema", "urn:example:draft-07"])
def test_a_subschema_naming_a_draft_of_the_subset_keeps_the_fast_path(dialect: str) -> None:
    """A nested ``$schema`` of draft 6 or later (or a URI jsonschema does not know, which keeps the
    enclosing draft) changes nothing the fast path tests: the schema is still compiled."""
    schema = {"type": "object", "properties": {"a": {"$schema": dialect, "type": "integer"}}}
    validator = compile_validator(schema, owner="t", which="input")
    assert validator.accepts_plain({"a": 1.0}) and validator.is_valid({"a": 1.0})
    assert not validator.accepts_plain({"a": 1.5})


class SwapsItself(str):
    """A key hashing and comparing as ``"x"`` whose ``__eq__``, once a lookup asks it, puts a plain
    ``"x"`` in its place and a NaN into a part of the value already checked."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        owner, checked = SWAP_TARGETS
        if self in list(owner):
            del owner[self]
            owner["x"] = 1
            checked.append(float("nan"))
        return True


SWAP_TARGETS: list[Any] = []


def test_the_plain_predicate_looks_names_up_only_after_its_walk() -> None:
    """``required`` asks the dict for each name, which runs a stored key's ``__eq__``: a key that
    then swapped itself for a plain one and put a NaN into an array checked before left a value
    that is not JSON data vouched for (found by attack). The walk, which refuses a key that is not
    an exact ``str``, now comes first, so no code of the value's runs."""
    schema = {"type": "object", "properties": {"a": {"type": "array"},
                                               "b": {"type": "object", "required": ["x"]}}}
    checked: list[Any] = []
    owner: dict[Any, Any] = {SwapsItself("x"): 1}
    SWAP_TARGETS[:] = [owner, checked]
    value = {"a": checked, "b": owner}
    validator = compile_validator(schema, owner="t", which="input")
    assert not validator.accepts_plain(value)
    assert checked == [] and [type(key) for key in owner] == [SwapsItself]  # its __eq__ never ran
    assert not is_plain_json(value)
