"""The one JSON encoder for records and digests: orjson when installed, the stdlib otherwise."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest

from amplifier_tools import _json

VALUES: list[Any] = [
    {"b": 1, "a": [1, 2.5, None, True], "é": "ü\n\"q\"", "nested": {"z": 0, "y": "x"}},
    {"big": 2**70},  # beyond orjson's 64-bit integers: falls back
    {1: "non-string key"},  # orjson refuses without an option: falls back
    {"obj": object.__name__, "path": __import__("pathlib").Path("/tmp")},  # unknown objects become str()
]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("stdlib", [True, False])
def test_compact_sorted_utf8_round_trip(value: Any, stdlib: bool) -> None:
    if not stdlib and _json.orjson is None:
        pytest.skip("the fast extra (orjson) is not installed")
    with mock.patch.object(_json, "orjson", None if stdlib else _json.orjson):
        data = _json.dumps(value)
    text = data.decode("utf-8")
    assert ": " not in text and ", " not in text
    expected = json.loads(json.dumps(value, sort_keys=True, default=str))
    assert json.loads(text) == expected
    assert text == json.dumps(expected, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_circular_values_are_refused_not_looped() -> None:
    value: dict[str, Any] = {}
    value["self"] = value
    with pytest.raises(ValueError):
        _json.dumps(value)
