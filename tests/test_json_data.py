"""``check_json_data``: what is refused as not JSON data, and where it is reported.

Valid data is confirmed by a walk that builds no JSON pointers (``is_plain_json``); anything it
does not vouch for is walked again by ``_locate_non_json``, which names the failing value. These
tests hold the two to the same verdicts."""

from __future__ import annotations

import enum
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import ContractError
from amplifier_tools.schema import MAX_INT_BITS, MAX_JSON_DEPTH, _locate_non_json, check_json_data


class Colour(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def _verdict(check: Any, value: Any) -> tuple[str, str] | None:
    try:
        check(value)
    except ContractError as exc:
        return exc.details.get("pointer", ""), exc.message
    return None


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5), st.integers(),
    st.floats(allow_nan=True, allow_infinity=True), st.just(1 << (MAX_INT_BITS + 1)),
    st.just(Colour.RED), st.just(Level.HIGH), st.just(b"bytes"), st.just({1, 2}),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_the_fast_walk_agrees_with_the_full_walk(value: Any) -> None:
    """For any nesting of scalars, enums, bytes, sets, tuples and non-string keys: the same error
    at the same pointer, or none from both."""
    assert _verdict(check_json_data, value) == _verdict(lambda v: _locate_non_json(v, "", 0), value)


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for index in range(levels):
        value = {"k": value} if index % 2 else [value]
    return value


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1])
def test_the_depth_limit_is_the_same_on_both_walks(levels: int) -> None:
    """A value nested exactly ``MAX_JSON_DEPTH`` containers deep passes; one more is refused."""
    value = _nested(levels)
    expected = _verdict(lambda v: _locate_non_json(v, "", 0), value)
    assert _verdict(check_json_data, value) == expected
    assert (expected is None) == (levels <= MAX_JSON_DEPTH)


@pytest.mark.parametrize(("value", "pointer", "fragment"), [
    ({"a": [1, {"b~/c": math.inf}]}, "/a/1/b~0~1c", "inf is not a JSON number"),
    ({"big": [1 << (MAX_INT_BITS + 1)]}, "/big/0", "bit limit"),
    ({"x": ("ok", b"no")}, "/x/1", "a bytes is not JSON data"),
    ({"colour": Colour.RED, "level": Level.HIGH, "when": object()}, "/when", "a object is not JSON data"),
])
def test_a_refusal_names_the_failing_value(value: Any, pointer: str, fragment: str) -> None:
    with pytest.raises(ContractError) as raised:
        check_json_data(value)
    assert raised.value.details["pointer"] == pointer
    assert fragment in raised.value.message


def test_enums_and_tuples_pass_as_json_encodes_them() -> None:
    check_json_data({"colour": Colour.RED, "level": Level.HIGH, "pair": (1, "two")})
