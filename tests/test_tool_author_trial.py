"""A tool author's trial of ``@tool`` (function_tool.py), the conformance kit and the pytest plugin.

Each test here failed before the fix its docstring names; the ones marked "held up" pin
behaviour the trial checked and found as documented.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Literal

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ConfigError, ToolContext, ToolResult, hookimpl, tool
from amplifier_tools.conformance import check_target_async
from amplifier_tools.pytest_plugin import assert_conforms

REPO = Path(__file__).resolve().parent.parent


# --- the schema derived from a signature ---------------------------------------------------


async def test_a_fixed_tuple_is_checked_position_by_position_and_arrives_as_a_tuple(host_factory: Any) -> None:
    """Found by trial: ``tuple[int, str]`` became ``{"items": {"type": "integer"}}`` — the right
    argument ``[1, "a"]`` was refused, a wrong one ``[1, 2]`` accepted — and the function got a
    list. Now ``prefixItems`` with the length fixed, and a tuple for the function."""

    @tool(name="local::geo.label")
    def label(point: tuple[int, str], more: tuple[float, ...] = ()) -> str:
        """Label a point."""
        assert isinstance(point, tuple) and isinstance(more, tuple)
        return f"{point[1]}@{point[0]}+{len(more)}"

    assert label.spec.input_schema["properties"]["point"] == {
        "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False,
        "minItems": 2, "maxItems": 2}
    host = await host_factory(ToolsPlugin(label))
    assert (await host.call("geo_label", {"point": [1, "a"], "more": [1.5]})).output == "a@1+1"
    for wrong in ([1, 2], [1], [1, "a", 3]):
        result = await host.call("geo_label", {"point": wrong})
        assert result.error["type"] == "ContractError", wrong


async def test_a_set_refuses_duplicates_and_arrives_as_a_set(host_factory: Any) -> None:
    """Found by trial: ``set[int]`` reached the function as a list (``s | {0}`` raised
    TypeError) and ``[1, 1]`` passed. Now ``uniqueItems`` and a set (frozenset) for the function;
    nested containers are converted too."""

    @tool(name="local::sets.union")
    def union(s: set[int], f: frozenset[str] | None = None, nested: list[tuple[int, int]] | None = None) -> list[int]:
        """Union with zero."""
        assert f is None or isinstance(f, frozenset)
        assert nested is None or all(isinstance(pair, tuple) for pair in nested)
        return sorted(s | {0})

    host = await host_factory(ToolsPlugin(union))
    ok = await host.call("sets_union", {"s": [2, 1], "f": ["a"], "nested": [[1, 2]]})
    assert ok.output == [0, 1, 2], ok.error
    assert (await host.call("sets_union", {"s": [1, 1]})).error["type"] == "ContractError"


def test_a_dict_keyed_by_anything_but_str_is_refused_at_decoration() -> None:
    """Found by trial: ``dict[int, str]`` was accepted and the function got string keys
    (``d[1]`` never found): JSON object keys are strings."""
    with pytest.raises(TypeError, match=r"lookup\(d\).*JSON object keys are strings"):
        @tool
        def lookup(d: dict[int, str]) -> str:
            """Nope."""
            return d[1]


def test_a_positional_only_parameter_is_refused_at_decoration() -> None:
    """Found by trial: ``def f(a, /)`` was accepted and every call failed with TypeError (the
    host passes arguments by name)."""
    with pytest.raises(TypeError, match=r"add\(a\): a positional-only parameter"):
        @tool
        def add(a: int, /, b: int) -> int:
            """Nope."""
            return a + b


async def test_a_default_that_is_not_json_stays_out_of_the_schema(host_factory: Any) -> None:
    """Found by trial: ``b: float = math.inf`` put ``Infinity`` into the schema, so
    ``tool_definitions()`` gave the model a schema that is not JSON. Such a default is the
    function's own; a tuple default is written as the JSON array it is."""

    sentinel = object()

    @tool(name="local::t.defaults")
    def defaults(a: tuple[int, int] = (1, 2), b: float = math.inf, c: Any = sentinel) -> str:
        """Defaults."""
        return f"{a} {b} {c is sentinel}"

    properties = defaults.spec.input_schema["properties"]
    assert properties["a"]["default"] == [1, 2] and "default" not in properties["b"]
    assert "default" not in properties["c"]
    host = await host_factory(ToolsPlugin(defaults))
    for style in ("openai", "anthropic", "mcp"):
        json.dumps(host.tool_definitions(style), allow_nan=False)  # strict JSON
    assert (await host.call("t_defaults", {})).output == "(1, 2) inf True"


async def test_optional_tool_context_is_the_calls_context(host_factory: Any) -> None:
    """Found by trial: ``context: ToolContext | None = None`` (the usual spelling for a function
    also called directly) was refused: 'ToolContext has no JSON Schema mapping'."""

    @tool(name="local::who.am_i")
    def whoami(greeting: str = "hi", context: ToolContext | None = None) -> str:
        """Say who calls."""
        return f"{greeting} {context.principal if context else 'nobody'}"

    assert set(whoami.spec.input_schema["properties"]) == {"greeting"}
    assert whoami() == "hi nobody"
    host = await host_factory(ToolsPlugin(whoami))
    assert (await host.call("who_am_i", {}, context=ToolContext(principal="ann"))).output == "hi ann"


async def test_a_partial_and_a_callable_object_become_tools(host_factory: Any) -> None:
    """Found by trial: ``tool(functools.partial(f, ...), name=...)`` and a callable object raised
    'is not a module, class, method, or function' from ``typing.get_type_hints``."""

    def scale(value: float, factor: int) -> float:
        """Scale."""
        return value * factor

    class Doubler:
        def __call__(self, value: int) -> int:
            """Double."""
            return value * 2

    triple = tool(functools.partial(scale, factor=3), name="local::math.triple")
    double = tool(Doubler(), name="local::math.double")
    assert triple.spec.input_schema["required"] == ["value"]
    host = await host_factory(ToolsPlugin(triple, double))
    assert (await host.call("math_triple", {"value": 2})).output == 6
    assert (await host.call("math_double", {"value": 2})).output == 4


# --- running the function ------------------------------------------------------------------


def test_a_generator_function_is_refused_at_decoration() -> None:
    """Found by trial: a generator function "succeeded" with a generator object as its output,
    its body never run (side effects included)."""
    with pytest.raises(TypeError, match="generator function cannot be a tool"):
        @tool
        def numbers(n: int) -> Any:
            """Numbers."""
            yield from range(n)

    with pytest.raises(TypeError, match="generator function cannot be a tool"):
        @tool
        async def anumbers(n: int) -> Any:
            """Numbers."""
            for i in range(n):
                yield i


async def test_a_sync_wrapper_around_an_async_function_is_awaited(host_factory: Any) -> None:
    """Found by trial: a sync decorator (``functools.wraps``) around an ``async def`` made the
    output a coroutine object, "success", the body never run. The awaitable is awaited now; a
    generator returned at run time is an ``invalid_result``."""
    ran: list[int] = []

    def logged(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)
        return wrapper

    @tool(name="local::t.wrapped")
    @logged
    async def wrapped(x: int) -> int:
        """Wrapped."""
        ran.append(x)
        return x + 1

    @tool(name="local::t.gen")
    @logged
    def gen(x: int) -> Any:
        """Returns a generator by way of a wrapper."""
        return (i for i in range(x))

    host = await host_factory(ToolsPlugin(wrapped, gen))
    assert (await host.call("t_wrapped", {"x": 1})).output == 2 and ran == [1]
    failed = await host.call("t_gen", {"x": 2})
    assert failed.error["code"] == "invalid_result" and "generator" in failed.error["message"]


async def test_sys_exit_in_a_tool_is_a_typed_error_not_the_end_of_the_process(host_factory: Any) -> None:
    """Found by trial: a function calling ``sys.exit`` (argparse's ``parse_args`` on bad input
    does) raised ``SystemExit`` out of ``host.call`` and ended the host's process — the docs
    promise every failure is a ``ToolResult``. Sync and async both; the message is redacted."""
    import argparse

    @tool(name="local::cli.run")
    def run(argv: list[str]) -> str:
        """Run a small command line."""
        parser = argparse.ArgumentParser(prog="x")
        parser.add_argument("--n", type=int, required=True)
        return str(parser.parse_args(argv).n)

    @tool(name="local::cli.arun", security={"secret_refs": ["TOKEN"]})
    async def arun(context: ToolContext) -> str:
        """Exit with a secret in the code."""
        sys.exit("failed with " + context.secret("TOKEN"))

    host = await host_factory(ToolsPlugin(run, arun))
    result = await host.call("cli_run", {"argv": []})  # --n is required: argparse exits (2)
    assert result.error["type"] == "ExecutionError" and result.error["code"] == "tool_exited"
    assert (await host.call("cli_run", {"argv": ["--n", "4"]})).output == "4"  # the host lives on
    context = ToolContext(secrets={"TOKEN": "tok-9f8e7d6c5b"})
    secret = await host.call("cli_arun", {}, context=context)
    assert secret.error["code"] == "tool_exited" and "tok-9f8e7d6c5b" not in json.dumps(secret.error)


async def test_a_sync_function_runs_off_the_loop_with_the_callers_context_variables(host_factory: Any) -> None:
    """Held up (and kept by the fix below): a sync function runs in a worker thread — one that
    waits for the event loop to act cannot deadlock it — and sees the caller's context variables."""
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    released = threading.Event()

    @tool(name="local::t.wait")
    def wait() -> str:
        """Waits for the loop."""
        assert released.wait(30)
        return marker.get()

    host = await host_factory(ToolsPlugin(wait))
    marker.set("from-caller")
    call = asyncio.ensure_future(host.call("t_wait", {}))
    await asyncio.sleep(0.05)
    released.set()
    assert (await call).output == "from-caller"


def test_a_hung_sync_tool_does_not_hang_the_conformance_check_or_the_process(tmp_path: Path) -> None:
    """Found by trial: a sync ``Pure`` function that never returns, with ``timeout_ms = 1000``:
    the call timed out, but ``check_target`` (and ``amplifier-tools validate``, any
    ``asyncio.run``) never returned — the loop's shutdown joined the default executor's thread
    that the timeout had abandoned. Sync functions now run in daemon threads of the module's own
    pool. In a subprocess, so the unfixed code's hang is a timeout here."""
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import threading
        from amplifier_tools import tool
        from amplifier_tools.conformance import check_target

        @tool(name="local::t.hang", effect="Pure", version="1.0.0", policies={"timeout_ms": 500},
              examples=[{"input": {}}])
        def hang() -> int:
            "Hangs."
            threading.Event().wait()

        print(check_target(hang).render(), flush=True)
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "timed out after 0.5 s" in done.stdout and "FAILED" in done.stdout


# --- the conformance kit and the pytest helpers ----------------------------------------------


class _WorkdirTools:
    """A plugin whose tools work in the host's working directory, as the built-in ones do."""

    name = "workdir-tools"

    def __init__(self, *makers: Any) -> None:
        self.makers = makers

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        root = Path(coordinator.get_capability("session.working_dir"))
        for make in self.makers:
            await coordinator.mount("tools", make(root))


def _notes_tool(root: Path) -> Any:
    @tool(name="local::notes.add", effect="Pure", version="1.0.0", examples=[{"input": {"text": "hi"}}])
    def add(text: str) -> str:
        """Claims to be Pure; appends to a file."""
        with open(root / "notes.txt", "a", encoding="utf-8") as handle:
            handle.write(text)
        return "added"

    return add


def _reader_tool(root: Path) -> Any:
    @tool(name="local::notes.read", effect="Pure", version="1.0.0", output_schema={"type": "string"},
          examples=[{"input": {"path": "a.txt"}, "output": "hello", "files": {"a.txt": "hello"}},
                    {"input": {"path": "a.txt"}}])
    def read(path: str) -> str:
        """Read a file of the working directory."""
        return (root / path).read_text(encoding="utf-8")

    return read


async def test_conformance_fails_a_pure_tool_that_writes_and_passes_one_that_reads() -> None:
    """Found by trial: a tool declaring ``Pure`` that wrote a file at every call passed every
    check (the host may retry a Pure tool). The kit now compares the example's working directory
    before and after; a correct reading tool, with the example's ``files``, still passes clean."""
    liar = await check_target_async(_WorkdirTools(_notes_tool))
    verdict = {check.name: check for check in liar.checks}
    assert not liar.ok
    assert "created notes.txt" in verdict["local::notes.add: example 1: Pure"].message
    honest = await assert_conforms(_WorkdirTools(_reader_tool))
    assert not [check for check in honest.checks if not check.passed]  # no warning either


async def test_conformance_warns_when_a_pure_tool_returns_different_outputs() -> None:
    """Found by trial: a ``Pure`` tool returning a random number passed silently when its
    example gives no output. The kit runs such an example twice; different outputs are a
    warning (a Pure tool may legitimately read a clock-free but changing world; it does not fail)."""
    import itertools

    counter = itertools.count()

    @tool(name="local::t.tick", effect="Pure", version="1.0.0", examples=[{"input": {}}])
    def tick() -> int:
        """Not deterministic."""
        return next(counter)

    report = await assert_conforms(tick)
    warned = [check for check in report.checks if check.warning]
    assert report.ok and [check.name for check in warned] == ["local::t.tick: example 1: Pure"]
    assert "different outputs (0, then 1)" in warned[0].message


class _NeedsSetting:
    """A plugin that refuses to mount without its ``greeting`` setting."""

    name = "needs-setting"

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        if "greeting" not in config:
            raise ConfigError("missing", key="plugins.needs-setting.greeting")
        greeting = config["greeting"]

        @tool(name="local::greet.say", effect="Pure", version="1.0.0",
              examples=[{"input": {"who": "ann"}, "output": f"{greeting} ann"}])
        def say(who: str) -> str:
            """Greet."""
            return f"{greeting} {who}"

        await coordinator.mount("tools", say)


async def test_assert_conforms_takes_the_plugins_config() -> None:
    """Found by trial: ``assert_conforms`` had no ``config``, so a plugin needing a setting could
    never pass it (``validate --config`` can). The report names the target readably (it was
    ``<...object at 0x...>``)."""
    with pytest.raises(pytest.fail.Exception, match=r"(?s)conformance of plugin 'needs-setting'.*greeting"):
        await assert_conforms(_NeedsSetting())
    report = await assert_conforms(_NeedsSetting(), config={"plugins": {"needs-setting": {"greeting": "hi"}}})
    assert any(check.name == "local::greet.say: example 1" and check.passed for check in report.checks)

    @tool(name="local::t.bad", effect="Pure", version="1.0.0", output_schema={"type": "integer"},
          examples=[{"input": {}}])
    def bad() -> Any:
        """Breaks its output schema."""
        return "nope"

    with pytest.raises(pytest.fail.Exception, match=r"conformance of tool 'local::t.bad'(?s:.*)violates its output"):
        await assert_conforms(bad)


async def test_an_output_json_cannot_hold_still_reads_as_text(host_factory: Any) -> None:
    """Found by trial: a function returning ``math.factorial(2000)`` (past Python's 4,300-digit
    limit for ``str(int)``) succeeded, then ``get_serialized_output()`` raised ``ValueError`` (so
    did a list holding itself); with a secret configured the call itself ended in an ``internal``
    error, ``str()`` raising inside the redaction. Both are summarized as the audit summarizes them."""

    @tool(name="local::math.factorial")
    def factorial(n: int) -> int:
        """n!"""
        return math.factorial(n)

    host = await host_factory(ToolsPlugin(factorial))
    plain = await host.call("math_factorial", {"n": 2000})
    assert plain.success and "integer of" in plain.get_serialized_output()
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert ToolResult(output=cyclic).get_serialized_output().startswith("[[")
    context = ToolContext(secrets={"TOKEN": "tok-1234567890"})
    secret_host = await host_factory(ToolsPlugin(factorial), config={"secrets": {}})
    with_secret = await secret_host.call("math_factorial", {"n": 2000}, context=context)
    assert with_secret.success, with_secret.error


def test_a_literal_of_enum_members_is_refused_at_decoration() -> None:
    """Found by trial: ``Literal[Color.RED]`` put the Enum member itself into the schema's
    ``enum`` (not JSON: ``tool_definitions`` could not be written), while a plain ``Enum``
    annotation is refused; a Literal of such values is refused the same way now."""
    import enum

    class Color(enum.Enum):
        RED = "red"

    with pytest.raises(TypeError, match=r"paint\(color\): Literal value <Color.RED: 'red'>"):
        @tool
        def paint(color: Literal[Color.RED]) -> str:
            """Nope."""
            return str(color)


async def test_a_type_local_to_the_decorating_function_resolves_under_future_annotations(
        host_factory: Any) -> None:
    """Found by trial: this module has ``from __future__ import annotations``; a ``Literal``
    alias defined in a test's body made ``@tool`` fail with 'cannot resolve an annotation (name
    'Mode' is not defined)'. The decorating frame's locals are tried now."""
    Mode = Literal["fast", "slow"]

    @tool(name="local::t.mode")
    def pick(mode: Mode = "fast") -> str:
        """Pick a mode."""
        return mode

    assert pick.spec.input_schema["properties"]["mode"] == {"enum": ["fast", "slow"], "default": "fast"}
    host = await host_factory(ToolsPlugin(pick))
    assert (await host.call("t_mode", {"mode": "slow"})).output == "slow"
    assert (await host.call("t_mode", {"mode": "other"})).error["type"] == "ContractError"


async def test_tool_host_entry_points_by_name_loads_only_those(tool_host: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by trial: docs/plugins.md says ``tool_host(entry_points=["my-policy"], ...)`` loads
    that installed entry point; the list reached ``ToolHost`` as a true value and every installed
    plugin (and Amplifier module) was loaded beside it."""
    site = tmp_path / "site"
    info = site / "trial_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trial-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[amplifier_tools]\ntrial-a = trial_plugin_a\ntrial-b = trial_plugin_b\n")
    for letter in "ab":
        (site / f"trial_plugin_{letter}.py").write_text(
            f"from amplifier_tools import hookimpl\nname = 'trial-{letter}'\n\n"
            "@hookimpl\ndef tool_pre(call):\n    return None\n")
    monkeypatch.syspath_prepend(str(site))
    async with tool_host(entry_points=["trial-a"]) as host:
        assert {info.name for info in host.plugins} == {"trial-a"}
    async with tool_host(entry_points=True) as host:
        assert {"trial-a", "trial-b"} <= {info.name for info in host.plugins}


class _Calculator:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    @tool(name="local::calc.add")
    def add(self, a: int, b: int) -> int:
        """Add, with the instance's offset."""
        return a + b + self.offset


async def test_a_decorated_method_is_bound_to_its_instance(host_factory: Any) -> None:
    """Found by trial: ``@tool`` on a method put ``self`` into the schema as a required
    argument of any JSON value — the model had to send it, and what it sent became ``self``.
    Now ``self`` is left out and ``obj.method`` is the tool bound to ``obj``; the method taken
    from the class fails its calls with a typed error saying so."""
    calc = _Calculator(100)
    assert calc.add.spec.input_schema["required"] == ["a", "b"]
    assert "self" not in calc.add.spec.input_schema["properties"]
    assert calc.add(1, 2) == 103  # still a method when called directly
    host = await host_factory(ToolsPlugin(calc.add))
    assert (await host.call("calc_add", {"a": 1, "b": 2})).output == 103
    assert (await host.call("calc_add", {"self": None, "a": 1, "b": 2})).error["type"] == "ContractError"
    unbound_host = await host_factory(ToolsPlugin(_Calculator.add))
    unbound = await unbound_host.call("calc_add", {"a": 1, "b": 2})
    assert unbound.error["code"] == "unbound_method"


def test_docstring_parameter_descriptions_reach_the_schema() -> None:
    """Found by trial: ``Args:`` (Google) and ``:param:`` (Sphinx) descriptions were dropped; the
    model saw bare types. They go into each property's ``description`` now; the tool's own
    description is still the first paragraph."""

    @tool(name="local::fs.head")
    def head(path: str, limit: int = 10) -> str:
        """Read the first lines of a file.

        Args:
            path (str): The file to read,
                relative to the working directory.
            limit: How many lines.

        Returns:
            The lines.
        """
        return path

    @tool(name="local::fs.tail")
    def tail(path: str) -> str:
        """Read the last lines.

        :param path: The file to read.
        :returns: the lines.
        """
        return path

    properties = head.spec.input_schema["properties"]
    assert properties["path"] == {"type": "string",
                                  "description": "The file to read, relative to the working directory."}
    assert properties["limit"] == {"type": "integer", "default": 10, "description": "How many lines."}
    assert head.spec.description == "Read the first lines of a file."
    assert tail.spec.input_schema["properties"]["path"]["description"] == "The file to read."


async def test_validating_a_module_of_tools_names_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by trial: ``amplifier-tools validate mytools`` on a module of ``@tool`` functions
    failed with only 'module has neither hook implementations nor a mount function'; the message
    now names the tools and how to check each."""
    (tmp_path / "trial_tools_module.py").write_text(textwrap.dedent('''
        from amplifier_tools import tool

        @tool(name="local::math.add", effect="Pure", version="1.0.0")
        def add(a: int, b: int) -> int:
            """Add."""
            return a + b
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    report = await check_target_async("trial_tools_module")
    assert not report.ok
    assert "validate each (trial_tools_module:add)" in report.render()
    assert (await check_target_async("trial_tools_module:add")).ok
