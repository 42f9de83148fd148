"""``ToolResult`` and ``ToolCall`` built by the host's own ``__init__`` on CPython 3.11 and 3.12
(``models._FAST_FIELDS``: each object gets an instance dict of its own, whose fields those versions
read at full speed) behave exactly as attrs' generated ``__init__`` would, on every version."""

from __future__ import annotations

import copy
import inspect
import pickle
import sys
from typing import Any

import attrs
import pytest

from amplifier_tools import ToolCall, ToolResult
from amplifier_tools._converter import converter
from amplifier_tools.models import _FAST_FIELDS, _call_fields, _result_fields


def test_the_own_init_is_used_exactly_on_the_versions_that_need_it() -> None:
    assert _FAST_FIELDS is ((3, 11) <= sys.version_info < (3, 13))
    assert (ToolResult.__init__ is _result_fields) is _FAST_FIELDS
    assert (ToolCall.__init__ is _call_fields) is _FAST_FIELDS


@pytest.mark.parametrize("cls", [ToolResult, ToolCall])
def test_the_signature_names_every_field_with_its_default(cls: Any) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    fields = attrs.fields(cls)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        if field.default is attrs.NOTHING:
            assert parameter.default is inspect.Parameter.empty, field.name
        elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            made = [cls(*(["x"] * (len(fields) - 1))) if cls is ToolCall else cls() for _ in range(2)]
            values = [getattr(each, field.name) for each in made]
            assert values[0] == field.default.factory() and values[0] is not values[1], field.name  # fresh each
        else:
            assert parameter.default == field.default, field.name


def test_a_result_holds_what_it_was_given_and_nothing_else() -> None:
    given = ToolResult(False, {"a": 1}, {"code": "x"}, {"k": 1}, "c1")
    assert (given.success, given.output, given.error, given.metadata, given.tool_call_id) == (
        False, {"a": 1}, {"code": "x"}, {"k": 1}, "c1")
    assert vars(given) == {"success": False, "output": {"a": 1}, "error": {"code": "x"}, "metadata": {"k": 1},
                           "tool_call_id": "c1"}
    assert ToolResult(metadata=None).metadata is None  # as attrs keeps an explicit None
    assert ToolResult(output="x") == ToolResult(True, "x", None, {}, None)
    assert ToolCall("c", "t").arguments == {} and ToolCall("c", "t", arguments=None).arguments is None
    with pytest.raises(TypeError):
        ToolCall("only-an-id")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ToolResult(nope=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("made", [ToolResult(True, "out", None, {"m": [1]}, "c1"), ToolCall("c1", "echo", {"a": 1})])
def test_frozen_equal_hashable_copyable_picklable_and_convertible(made: Any) -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.tool_call_id = "other" if isinstance(made, ToolResult) else None
    twin = type(made)(**{f.name: getattr(made, f.name) for f in attrs.fields(type(made))})
    assert twin == made and repr(twin) == repr(made)
    assert pickle.loads(pickle.dumps(made)) == made and copy.deepcopy(made) == made
    assert attrs.evolve(made) == made and converter.structure(converter.unstructure(made), type(made)) == made
    if isinstance(made, ToolCall):
        assert hash(ToolCall("c1", "echo", ())) == hash(ToolCall("c1", "echo", ()))
        assert attrs.evolve(made, name="other").name == "other"


def test_a_subclass_keeps_the_fields_and_adds_its_own() -> None:
    class Outcome(ToolResult):
        """A tool author's result type, no attrs."""

    @attrs.frozen
    class Tagged(ToolResult):
        tag: str = "t"

    assert Outcome(output="x").output == "x" and isinstance(Outcome(), ToolResult)
    tagged = Tagged(True, "x", None, {}, "c", "mine")
    assert (tagged.output, tagged.tag, tagged.metadata) == ("x", "mine", {})
