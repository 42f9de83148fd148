"""``ToolContext`` checks its fields (found by attack): a wrong kind of value was taken as it was and
did something else than asked — ``scopes="fs:read"`` became the scopes ``f``, ``s``, ``:``, ...;
``deadline="soon"`` failed every call as the host's internal error; ``deadline=nan`` ran calls
with no deadline; ``principal=5`` or ``attributes=5`` were passed on to every plugin."""

from __future__ import annotations

import math
import time
from typing import Any

import attrs
import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolContext, ToolResult


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"scopes": "fs:read"}, TypeError, "ToolContext.scopes must be a collection of scope names, not one str: "
                                       "write scopes={'fs:read'}"),
    ({"scopes": b"fs:read"}, TypeError, "ToolContext.scopes must be a collection of scope names, not one bytes"),
    ({"scopes": ["fs:read", 3]}, TypeError, "ToolContext.scopes must hold strings, got int 3"),
    ({"principal": None}, TypeError, "ToolContext.principal must be a str, got NoneType"),
    ({"principal": 5}, TypeError, "ToolContext.principal must be a str, got int"),
    ({"role": 3}, TypeError, "ToolContext.role must be a str or None, got int"),
    ({"idempotency_key": 7}, TypeError, "ToolContext.idempotency_key must be a str or None, got int"),
    ({"trace_id": ["t"]}, TypeError, "ToolContext.trace_id must be a str or None, got list"),
    ({"deadline": "soon"}, TypeError, "ToolContext.deadline must be a time.monotonic() reading (a float) or None, "
                                      "got str; ToolContext.with_timeout(seconds) sets one"),
    ({"deadline": True}, TypeError, "ToolContext.deadline must be a time.monotonic() reading"),
    ({"deadline": math.nan}, ValueError, "ToolContext.deadline must not be NaN"),
    ({"attributes": 5}, TypeError, "ToolContext.attributes must be a mapping, got int"),
    ({"secrets": 5}, TypeError, "ToolContext.secrets must be a mapping or a callable"),
])
def test_a_field_of_the_wrong_kind_is_refused_naming_it(fields: dict[str, Any], error: type[Exception],
                                                         message: str) -> None:
    with pytest.raises(error) as refused:
        ToolContext(**fields)
    assert str(refused.value).startswith(message)


def test_attrs_evolve_checks_the_new_value_too() -> None:
    with pytest.raises(TypeError, match="ToolContext.principal"):
        attrs.evolve(ToolContext(), principal=1)


@pytest.mark.parametrize("fields", [
    {}, {"principal": "p", "role": "r", "environment": "e", "scopes": {"a", "b"}, "idempotency_key": "k",
         "deadline": 12.5, "trace_id": "t", "session_id": "s", "attributes": {"x": 1}},
    {"deadline": 10}, {"deadline": math.inf}, {"secrets": {"K": "v"}}, {"secrets": lambda name: None},
    {"scopes": frozenset()}, {"scopes": ()}, {"attributes": {}},
])
def test_the_values_a_caller_writes_are_taken(fields: dict[str, Any]) -> None:
    context = ToolContext(**fields)
    assert all(getattr(context, name) == (frozenset(value) if name == "scopes" else value)
               for name, value in fields.items())


class Echo:
    name = "echo"
    description = "Says who called."
    input_schema = {"type": "object"}

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.runs += 1
        return ToolResult(True, "ran")


@pytest.mark.parametrize(("field", "value"), [("principal", 5), ("deadline", "soon"), ("scopes", frozenset({1}))])
async def test_a_context_changed_around_its_constructor_is_refused_by_the_host(
        host_factory: Any, field: str, value: Any) -> None:
    """``deadline="soon"`` set with ``object.__setattr__`` failed the call as the host's
    ``internal`` error; now every such context is ``invalid_context`` naming the field."""
    tool = Echo()
    host = await host_factory(ToolsPlugin(tool))
    for session_id in (None, "s"):  # a context the host copies, and one it takes as it is
        context = ToolContext(session_id=session_id)
        object.__setattr__(context, field, value)
        result = await host.call("echo", {}, context=context)
        assert (result.error["type"], result.error["code"]) == ("ContractError", "invalid_context")
        assert result.error["message"].startswith(f"context: ToolContext.{field} must")
    assert tool.runs == 0
    good = await host.call("echo", {}, context=ToolContext(principal="p").with_timeout(5))
    assert good.success and tool.runs == 1
    assert ToolContext(deadline=time.monotonic() + 5).remaining() is not None


@pytest.mark.parametrize("scopes", [5, None, ["fs:read"]])
async def test_scopes_changed_around_the_constructor_to_no_set_is_invalid_context_not_raised(
        host_factory: Any, scopes: Any) -> None:
    """Found by review: the host's own check of a context changed with ``object.__setattr__`` iterated ``scopes``:
    ``scopes=5`` made ``host.call`` raise ``TypeError`` (it must never raise); ``None`` and a list
    went on to the policies, whose ``required <= context.scopes`` fails on them."""
    tool = Echo()
    host = await host_factory(ToolsPlugin(tool))
    for session_id in (None, "s"):
        context = ToolContext(session_id=session_id)
        object.__setattr__(context, "scopes", scopes)
        result = await host.call("echo", {}, context=context)
        assert (result.error or {}).get("code") == "invalid_context", result
        assert result.error["message"].startswith("context: ToolContext.scopes must be a set")
    assert tool.runs == 0
