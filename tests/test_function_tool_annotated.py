"""``@tool`` reads ``Annotated`` metadata: a description string, ``annotated_types`` constraints and
``pydantic.Field(...)``; it refuses what it cannot express. Found by trial: ``Annotated[int,
Field(ge=0)]`` was read as a plain ``int`` (``get_type_hints`` drops the metadata unless asked),
so the host ran the function with -5, which its author had ruled out."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import tool

at = pytest.importorskip("annotated_types")
pydantic = pytest.importorskip("pydantic")
Field = pydantic.Field


async def test_field_bounds_are_the_hosts_to_enforce(host_factory: Any) -> None:
    runs: list[int] = []

    @tool(name="local::shop.order")
    def order(count: Annotated[int, Field(ge=1, le=10, description="how many")]) -> str:
        """Order items."""
        runs.append(count)
        return "ok"

    assert order.spec.input_schema["properties"]["count"] == {
        "type": "integer", "minimum": 1, "maximum": 10, "description": "how many"}
    host = await host_factory(ToolsPlugin(order))
    for wrong in (-5, 0, 11):
        result = await host.call("shop_order", {"count": wrong})
        assert result.error["type"] == "ContractError" and "/count" in result.error["message"], result.error
    assert (await host.call("shop_order", {"count": 3})).output == "ok"
    assert runs == [3]  # before: [-5, 0, 11, 3]


def test_strings_lengths_patterns_and_items_are_constrained() -> None:
    @tool
    def label(name: Annotated[str, "the label's text", at.MinLen(2), at.MaxLen(8)],
              tags: Annotated[list[Annotated[str, Field(pattern="^[a-z]+$")]], at.Len(1, 3)],
              weight: Annotated[float | None, at.Interval(gt=0, le=1.5)] = None) -> str:
        """Label.

        Args:
            name: the docstring's words, which the Annotated string overrides
            tags: lower-case words
        """
        return name

    properties = label.spec.input_schema["properties"]
    assert properties["name"] == {"type": "string", "description": "the label's text", "minLength": 2,
                                  "maxLength": 8}
    assert properties["tags"] == {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"},
                                  "minItems": 1, "maxItems": 3, "description": "lower-case words"}
    assert properties["weight"] == {"anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1.5},
                                              {"type": "null"}], "default": None}


def test_a_pep_727_doc_is_the_description() -> None:
    typing_extensions = pytest.importorskip("typing_extensions")
    if not hasattr(typing_extensions, "Doc"):
        pytest.skip("typing_extensions without Doc")
    doc = typing_extensions.Doc

    @tool
    def greet(who: Annotated[str, doc("whom to greet")]) -> str:
        """Greet."""
        return who

    assert greet.spec.input_schema["properties"]["who"]["description"] == "whom to greet"


WHAT_CANNOT_BE_SAID = {
    "a number's bound on a string": ("Annotated[str, at.Ge(1)]", "does not apply to a parameter of JSON type string"),
    "a length on a number": ("Annotated[int, at.MinLen(1)]", "does not apply"),
    "a default inside Field": ("Annotated[int, Field(default=3)]", "give the default in the signature"),
    "an alias": ("Annotated[int, Field(alias='n')]", r"Field\(alias=...\)"),
    "a predicate": ("Annotated[int, at.Predicate(lambda n: n % 2 == 0)]", "Predicate"),
    "a marker of another library": ("Annotated[int, object()]", "has no JSON Schema mapping"),
    "a bound that is not a JSON number": ("Annotated[int, at.Ge(True)]", "has no JSON Schema mapping"),
    "a bad pattern": ("Annotated[str, Field(pattern='(')]", "missing"),
}


@pytest.mark.parametrize(("annotation", "message"), WHAT_CANNOT_BE_SAID.values(), ids=WHAT_CANNOT_BE_SAID.keys())
def test_metadata_with_no_schema_is_refused_at_decoration_naming_the_parameter(annotation: str,
                                                                               message: str) -> None:
    namespace: dict[str, Any] = {"Annotated": Annotated, "at": at, "Field": Field, "tool": tool}
    exec(f"def probe(value: {annotation}) -> int:\n    return 1", namespace)
    with pytest.raises(Exception, match=message) as raised:
        tool(namespace["probe"])
    assert "probe(value)" in str(raised.value)
