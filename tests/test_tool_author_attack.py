"""An attack on the tool-author trial's changes (function_tool.py, models.py ``output_text``).

Each test here failed before the fix its docstring names.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Literal

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, function_tool, tool
from amplifier_tools.models import ToolResult, output_text

#: Shadowed by a local of the same name in ``test_a_local_type_shadowing_a_global_is_the_local``.
Mode = Literal["global"]


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.01)


# --- the daemon pool ---------------------------------------------------------------------------


async def test_a_call_abandoned_while_queued_never_runs(host_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: with the pool's one worker busy, a call that timed out while its job
    still waited in the queue ran later all the same (``asyncio.to_thread`` cancelled a job that
    had not started): a side effect after the caller was told "timeout", perhaps after a retry.
    Jobs now carry their state; an abandoned one is skipped. One worker, so the queue is FIFO:
    once the call queued after it has returned, the abandoned job would have run."""
    monkeypatch.setattr(function_tool, "_POOL", function_tool._DaemonPool(1))
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []

    @tool(name="local::q.block")
    def block() -> str:
        started.set()
        gate.wait(30)
        return "blocked"

    @tool(name="local::q.charge", policies={"timeout_ms": 200})
    def charge() -> str:
        ran.append("charged")
        return "charged"

    @tool(name="local::q.after")
    def after() -> str:
        return "after"

    host = await host_factory(ToolsPlugin(block, charge, after))
    blocking = asyncio.ensure_future(host.call("q_block", {}))
    await _until(started.is_set)
    timed_out = await host.call("q_charge", {})
    assert timed_out.error["code"] == "timeout"
    gate.set()
    assert (await blocking).output == "blocked"
    assert (await host.call("q_after", {})).output == "after"
    assert ran == []


async def test_hung_functions_do_not_starve_later_calls(host_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: the pool is the process's, and a thread whose function hung past its
    timeout counted against ``max_workers`` for ever: once that many had hung (six on a two-core
    machine), every later sync call on any host waited in the queue until its own timeout. A
    thread whose running job was abandoned is replaced now (and ends when its function returns)."""
    monkeypatch.setattr(function_tool, "_POOL", function_tool._DaemonPool(1))
    gate = threading.Event()

    @tool(name="local::s.hang", policies={"timeout_ms": 200})
    def hang() -> None:
        gate.wait(60)

    @tool(name="local::s.quick", policies={"timeout_ms": 10_000})
    def quick() -> str:
        return "quick"

    host = await host_factory(ToolsPlugin(hang, quick))
    try:
        assert (await host.call("s_hang", {})).error["code"] == "timeout"
        result = await host.call("s_quick", {})
        assert result.output == "quick", result.error
    finally:
        gate.set()


async def test_stop_iteration_from_a_sync_tool_is_its_error_not_a_hang(host_factory: Any) -> None:
    """Found by attack: ``next()`` on an empty iterator in a sync tool raised ``StopIteration``,
    which an asyncio future refuses (``TypeError`` in the loop's callback, logged): the call was
    never settled and waited for its timeout — for ever without one. (``to_thread`` had the same
    hang.) It is the tool's ``tool_raised`` error now."""

    @tool(name="local::s.first", policies={"timeout_ms": 10_000})
    def first(items: list[int]) -> int:
        return next(iter(items))

    host = await host_factory(ToolsPlugin(first))
    assert (await host.call("s_first", {"items": [3]})).output == 3
    result = await host.call("s_first", {"items": []})
    assert (result.error["code"], result.error["cause"]) == ("tool_raised", "StopIteration"), result.error


# --- what a signature may say ------------------------------------------------------------------


def test_a_set_of_unhashable_items_is_refused_at_decoration() -> None:
    """Found by attack: ``set[list[int]]`` (or of dicts, of sets, of tuples holding lists) was
    accepted, and every call with a non-empty set failed in the conversion, before the function
    ran, as ``tool_raised`` ``TypeError: unhashable type`` — blamed on nobody who could fix it."""
    for annotation in (set[list[int]], set[dict[str, int]], frozenset[set[int]],
                       set[tuple[int, list[int]]], set[tuple[int, ...] | list[int]]):
        def f(items: Any) -> int:
            return len(items)

        f.__annotations__["items"] = annotation
        with pytest.raises(TypeError, match=r"f\(items\).*cannot be a set's item"):
            tool(f, name="local::s.bad")

    @tool(name="local::s.pairs")
    def pairs(items: set[tuple[int, str]], groups: frozenset[frozenset[int]] = frozenset()) -> int:
        return len(items) + len(groups)

    assert pairs.input_schema["properties"]["items"]["items"]["prefixItems"] == [{"type": "integer"},
                                                                                 {"type": "string"}]


async def test_a_set_of_anything_takes_only_json_scalars(host_factory: Any) -> None:
    """Found by attack: a bare ``set`` (``set[Any]``) took arrays and objects, which cannot be a
    set's items: ``tool_raised`` ``TypeError: unhashable type: 'dict'`` at every such call. Its
    items are JSON scalars now; an array or object is the caller's ``invalid_input``."""

    @tool(name="local::s.count")
    def count(items: set) -> int:  # type: ignore[type-arg]
        return len(items)

    host = await host_factory(ToolsPlugin(count))
    assert (await host.call("s_count", {"items": ["a", 1, None]})).output == 3
    wrong = await host.call("s_count", {"items": [{"a": 1}]})
    assert (wrong.error["type"], wrong.error["code"]) == ("ContractError", "invalid_input"), wrong.error


async def test_a_staticmethod_keeps_its_parameter_types(host_factory: Any) -> None:
    """Found by attack: ``@tool`` over ``@staticmethod`` (and ``tool(staticmethod(f))``) was
    taken for a callable object whose hints are ``staticmethod.__call__``'s: every parameter
    became "any JSON value" in the schema, silently. The wrapped function is what counts."""

    class Units:
        @tool(name="local::u.scale")
        @staticmethod
        def scale(x: int, unit: str = "m") -> str:
            return f"{x * 2}{unit}"

    def plain(x: int, unit: str = "m") -> str:
        return f"{x}{unit}"

    for made in (Units.scale, Units().scale, tool(staticmethod(plain), name="local::u.plain")):
        assert made.input_schema["properties"] == {"x": {"type": "integer"},
                                                   "unit": {"type": "string", "default": "m"}}
    host = await host_factory(ToolsPlugin(Units.scale))
    assert (await host.call("u_scale", {"x": 2})).output == "4m"
    assert (await host.call("u_scale", {"x": "2"})).error["code"] == "invalid_input"


def test_a_local_type_shadowing_a_global_is_the_local() -> None:
    """Found by attack: under ``from __future__ import annotations`` (this module's), the
    decorating frame's locals were tried only after the module's globals failed, so a local
    ``Mode`` shadowing the module's ``Mode`` gave the global's schema (``["global"]``), silently;
    Python resolves the local. The scopes the function's ``__qualname__`` names are read first."""
    Mode = Literal["local", "other"]  # noqa: F841 - read by the annotation's string

    @tool(name="local::m.mode")
    def mode(m: Mode) -> str:
        return m

    assert mode.input_schema["properties"]["m"] == {"enum": ["local", "other"]}


def test_a_local_type_resolves_when_decorated_in_a_comprehension() -> None:
    """Found by attack: ``[tool(f, name=...) for ...]``: on Python 3.10 and 3.11 a comprehension
    is a frame of its own, so the "decorating frame" held only the loop variable and a local type
    of the function defining ``f`` was not found (``TypeError: cannot resolve``)."""
    Unit = Literal["m", "s"]  # read by the annotation's string

    def convert(unit: Unit) -> str:
        return unit

    made = [tool(convert, name=f"local::c.unit{index}") for index in range(2)]
    assert [each.input_schema["properties"]["unit"] for each in made] == [{"enum": ["m", "s"]}] * 2


def test_a_docstring_line_of_many_spaces_is_parsed_in_linear_time() -> None:
    """Found by attack: the ``Args:`` item pattern had two ``\\s*`` around an optional group and
    tried every split of a run of spaces between them: 16,000 spaces took about a second, 60,000
    about ten (quadratic). The bound here is generous: the fixed parser takes milliseconds."""
    doc = "Do it.\n\nArgs:\n    x" + " " * 60_000 + "y\n    z: the z\n"
    start = time.perf_counter()
    found = function_tool._parameter_docs(doc)
    assert time.perf_counter() - start < 4
    assert found == {"z": "the z"}
    assert function_tool._parameter_docs("Args:\n    x (int): the x\n    y : why\n") == {"x": "the x", "y": "why"}


# --- output as text ------------------------------------------------------------------------------


class _HostileStr:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def test_output_text_survives_an_object_whose_str_raises(host_factory: Any) -> None:
    """Found by attack: ``output_text``'s fallback caught only ``ValueError``/``RecursionError``;
    an output object whose ``__str__`` raises (``default=str`` calls it) made
    ``get_serialized_output`` raise after the call had succeeded — in the framework adapters,
    ``serve-mcp`` and ``amplifier-tools call``. It is written as ``<TypeName>`` now."""
    assert output_text(_HostileStr()) == '"<_HostileStr>"'
    assert output_text({"a": [_HostileStr()]}) == '{"a": ["<_HostileStr>"]}'

    @tool(name="local::o.odd")
    def odd() -> Any:
        return [_HostileStr(), 1]

    host = await host_factory(ToolsPlugin(odd))
    result = await host.call("o_odd", {})
    assert isinstance(result, ToolResult) and result.success, result.error
    assert result.get_serialized_output() == '["<_HostileStr>", 1]'


async def test_a_classmethod_is_bound_to_its_class_and_cls_is_not_an_argument(host_factory: Any) -> None:
    """Found by review: ``@tool`` over ``@classmethod`` raised ``TypeError: <classmethod ...> is
    not a callable object`` from ``inspect`` (no name, no hint), and ``@classmethod`` over
    ``@tool`` made ``cls`` a required argument for the model to send."""

    class Units:
        unit = "m"

        @tool(name="local::u.show")
        @classmethod
        def show(cls, value: int) -> str:
            """Show a value in the class's unit."""
            return f"{value}{cls.unit}"

    class Feet(Units):
        unit = "ft"

    assert Units.show.spec.input_schema["properties"] == {"value": {"type": "integer"}}
    assert Units.show(2) == "2m" and Units().show(3) == "3m"
    host = await host_factory(ToolsPlugin(Units.show))
    assert (await host.call("u_show", {"value": 4})).output == "4m"
    assert (await Feet.show.execute({"value": 5})).output == "5ft"  # reached through a subclass: bound to it
    unbound = tool(classmethod(lambda cls, value: value), name="local::u.loose")  # in no class: nothing to bind
    with pytest.raises(ExecutionError, match="mount it from its class or an instance") as raised:
        await unbound.execute({"value": 1})
    assert raised.value.code == "unbound_method"


async def test_classmethod_over_tool_is_refused_with_the_order_to_use() -> None:
    with pytest.raises(TypeError, match=r"Units.show: a classmethod under @tool: put @tool above @classmethod"):
        class Units:
            @classmethod
            @tool
            def show(cls, value: int) -> str:
                return str(value)
