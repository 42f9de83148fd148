"""``@tool``'s ``Annotated`` metadata and ``@staticmethod``, under attack: what was found.

- ``Ge(nan)`` went into the schema as NaN, which bounds nothing (the function ran with -1e9) and
  is no JSON; ``Gt(inf)``/``Le(-inf)`` are no JSON either; ``MultipleOf(0)`` (or negative) and
  ``Field(title=5)`` were accepted at decoration and failed the mount; ``Field(examples=[object()])``
  made a schema that is no JSON. All are refused at decoration now.
- ``@tool`` over ``@staticmethod`` in a class body with a first parameter named ``cls`` was
  refused as "a classmethod under @tool"; one named ``self`` was left out of the schema.
"""

from __future__ import annotations

from typing import Annotated, Any

import pytest

from amplifier_tools import tool

at = pytest.importorskip("annotated_types")
pydantic = pytest.importorskip("pydantic")
Field = pydantic.Field


@pytest.mark.parametrize("constraint", [at.Ge(float("nan")), at.Gt(float("inf")), at.Le(float("-inf")),
                                        at.MultipleOf(0), at.MultipleOf(-2), Field(lt=float("nan"))],
                         ids=["ge-nan", "gt-inf", "le-minus-inf", "multiple-of-0", "multiple-of-negative", "field-nan"])
def test_bounds_that_are_no_json_schema_are_refused_at_decoration(constraint: Any) -> None:
    def f(x: Any) -> str:
        return repr(x)

    f.__annotations__ = {"x": Annotated[float, constraint], "return": str}
    with pytest.raises(TypeError, match="x"):
        tool(name="local::t.f")(f)


def test_a_huge_integer_bound_is_kept() -> None:
    @tool(name="local::t.g")
    def g(x: Annotated[int, at.Ge(10**400)]) -> str:
        return repr(x)

    assert g.spec.input_schema["properties"]["x"]["minimum"] == 10**400


@pytest.mark.parametrize("field", [Field(title=5), Field(examples=[object()]), Field(examples="one")],
                         ids=["title-int", "examples-object", "examples-str"])
def test_field_annotations_that_are_no_json_schema_are_refused_at_decoration(field: Any) -> None:
    def f(x: Any) -> str:
        return repr(x)

    f.__annotations__ = {"x": Annotated[int, field], "return": str}
    with pytest.raises(TypeError, match="Field"):
        tool(name="local::t.f")(f)


async def test_a_staticmethods_first_parameter_is_the_models_whatever_its_name() -> None:
    class Labels:
        @tool(name="local::labels.by_class")
        @staticmethod
        def by_class(cls: str) -> str:
            return f"class {cls}"

        @tool(name="local::labels.by_self")
        @staticmethod
        def by_self(self: str) -> str:
            return f"self {self}"

    assert list(Labels.by_class.spec.input_schema["properties"]) == ["cls"]  # before: TypeError
    assert list(Labels.by_self.spec.input_schema["properties"]) == ["self"]  # before: {}
    assert (await Labels.by_class.execute({"cls": "a"})).output == "class a"
    assert (await Labels().by_self.execute({"self": "b"})).output == "self b"


async def test_set_items_json_tells_apart_and_python_counts_as_one_are_refused(host_factory: Any) -> None:
    """Found by attack: ``[1, true]`` passed ``uniqueItems`` (JSON tells them apart) and reached
    the function as ``{1}``: an item dropped silently, and ``MinLen(2)`` broken."""
    seen: list[Any] = []

    @tool(name="local::t.pick")
    async def pick(items: Annotated[set, at.MinLen(2)], pairs: frozenset[tuple[int | bool, ...]] = frozenset()) -> str:
        seen.append((items, pairs))
        return "ran"

    host = await host_factory(pick)
    for items, pairs, pointer, named in (
        ([1, True], [], "/items", "1 and true"),
        ([0, "a", False], [], "/items", "0 and false"),
        ([0, 1], [[1, 2], [True, 2]], "/pairs", "[1, 2] and [true, 2]"),
    ):
        result = await host.call("local::t.pick", {"items": items, "pairs": pairs})
        assert (result.error["type"], result.error["code"], result.error["pointer"]) == (
            "ContractError", "invalid_input", pointer), result.error
        assert f"{pointer}: {named} are one item in a Python set" in result.error["message"]
        assert "JSON tells 1 from true" in result.error["hint"]
    assert seen == []  # the function never ran
    ok = await host.call("local::t.pick", {"items": [1, "1", None], "pairs": [[1], [2]]})
    assert ok.output == "ran" and seen == [({1, "1", None}, frozenset({(1,), (2,)}))]
