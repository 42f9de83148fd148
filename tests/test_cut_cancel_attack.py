"""Time limits attacked (session 37): a caller's cancellation that reaches the call's task in the
same turn of the loop as the cut of a tool's or hook's own limit is honoured, however the tool or
hook answers the one ``CancelledError`` it is thrown for both; and a call nobody cancelled never
ends in ``CancelledError``.

Same-turn technique: as the tool or hook begins to wait (the step before its 20 ms limit is armed)
it arms the caller's ``task.cancel`` 20 ms ahead (``Cue``); the test then blocks the loop for 80 ms
(``time.sleep``): both timers are due in the loop's next turn, whatever the machine's load.

Found by this attack (each test says so): an answer that is no ``Exception`` (``SystemExit``, a
library's own ``BaseException``) still lost the caller's cancellation on 3.11, and after a
``tool_pre`` hook the tool ran; and on every version a cancellation arriving with the hook timeout
of a future a ``tool_complete`` observer handed back was lost.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import EVENT_LOOPS, ToolsPlugin, run_on
from test_exactly_once import Counting, Sleeps, audit_record, audit_records, held_resources

from amplifier_tools import ToolHost, ToolResult, hookimpl, tool

#: Scenarios written with ``asyncio.timeout`` or ``Task.cancelling`` (CPython 3.11+). The others run
#: on 3.10 too, where the limit cuts a task of the tool's own (``asyncio.wait``), not the caller's.
needs_311 = pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout, Task.cancelling: 3.11+")

LIMIT_MS = 20


class Interrupted(BaseException):
    """A library's own ``BaseException`` (no ``Exception``), as some frameworks raise."""


def _answer(then: str) -> Any:
    """What a tool or hook does with the cut it caught: return, fail, or raise its own TimeoutError."""
    if then == "raise":
        raise ValueError("interrupted")
    if then == "timeout_error":
        raise TimeoutError("upstream read timed out")
    if then == "retryable":
        raise ConnectionError("connection reset")
    if then == "base":
        raise Interrupted("a library's own BaseException")
    if then == "exit":
        raise SystemExit(3)
    if then == "failed":
        return ToolResult(False, None, {"type": "ExecutionError", "code": "reset", "message": "reset"})
    return ToolResult(True, "kept")


class Stubborn:
    """Waits; answers its cancellation as ``input["then"]`` says."""

    name = "stubborn"
    description = "Waits; answers a cancellation as told."
    input_schema = {"type": "object", "properties": {"then": {"type": "string"}}}

    def __init__(self, name: str = "stubborn", effect: str | None = None) -> None:
        self.name = name
        if effect is not None:
            self.effect = effect
        self.waiting = Cue()
        self.attempts = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.attempts += 1
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return _answer(input.get("then", "return"))  # type: ignore[no-any-return]
        return ToolResult(True, "slept")


class StubbornPre:
    """An async ``tool_pre`` hook that answers the cut of its wait as told."""

    name = "stubborn_pre"

    def __init__(self, then: str) -> None:
        self.then = then
        self.waiting = Cue()

    @hookimpl
    async def tool_pre(self, call: Any) -> None:
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            _answer(self.then)


class StubbornEvent:
    """An async ``tool_event`` observer that answers the cut of its wait on ``tool:pre`` as told."""

    name = "stubborn_event"

    def __init__(self, then: str) -> None:
        self.then = then
        self.waiting = Cue()

    @hookimpl
    async def tool_event(self, event: str, data: dict[str, Any]) -> None:
        if event != "tool:pre":
            return
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            _answer(self.then)


class Cue:
    """Set by a tool or hook as it begins to wait (in the step before its limit is armed): arms the
    caller's cancellation of ``target`` (when given) to be due with the limit, and wakes the test.
    Armed there, not by the test once woken: on a loaded machine the limit may already be due when
    the test runs, and the two would then reach the task in different turns."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.target: asyncio.Future[Any] | None = None
        self.then: Any = None

    def set(self) -> None:
        if self.target is not None:
            asyncio.get_running_loop().call_later(LIMIT_MS / 1000, self.target.cancel)
        if self.then is not None:
            self.then()
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


async def _same_turn(task: asyncio.Future[Any], cue: Cue, *, cancel: bool = True) -> None:
    """Let ``task``'s run cancel ``task`` (unless not ``cancel``) due with its 20 ms limit as it
    begins to wait (``Cue``); once it waits, block the loop: both fire in the loop's next turn."""
    if cancel:
        cue.target = task
    await cue.wait()
    time.sleep(4 * LIMIT_MS / 1000)


def _timeout(ms: int = LIMIT_MS, **more: Any) -> dict[str, Any]:
    return {"policies": {"timeout_ms": ms, "concurrency": {"limit": 1, "queue": True}, **more}}


def _assert_cancelled_once(host: ToolHost, counting: Counting, call_id: str) -> None:
    assert counting.assert_once(call_id).error["code"] == "cancelled"
    assert audit_records(host) == Counter({call_id: 1})
    assert audit_record(host, call_id)["error"]["code"] == "cancelled"
    assert not any(held_resources(host).values()), held_resources(host)


# --- a caller's cancellation arriving with the cut: honoured wherever the limit cuts -------------


#: 3.10 runs the tool in a task of its own, where asyncio stops the loop on a ``SystemExit``.
_EXIT = pytest.param("exit", marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="stops 3.10's loop"))


@pytest.mark.parametrize("then", ["return", "raise", "timeout_error", "base", _EXIT])
async def test_tool_timeout_cut_with_a_cancellation(tmp_path: Path, then: str) -> None:
    """The tool answers its cut (and the caller's cancellation with it) by returning or failing: the
    caller gets ``CancelledError``, the call is recorded once as cancelled, its slot given back.
    Found by attack on 3.11: ``return`` (557766c: the cancelled call returned the tool's value), and
    after it ``base``, ``exit``: an answer that is no ``Exception`` passed ``run_with_timeout`` as it
    was, and the cancelled call ended as the tool's failure (``tool_raised``, ``tool_exited``)."""
    counting, stubborn = Counting(), Stubborn()
    async with ToolHost(config={"plugins": {}, "tools": {"stubborn": _timeout()}},
                        plugins=[ToolsPlugin(stubborn), counting], builtins=["policy", "audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("stubborn", {"then": then}, call_id="t1"))
        await _same_turn(task, stubborn.waiting)
        with pytest.raises(asyncio.CancelledError):
            await task
        _assert_cancelled_once(host, counting, "t1")


@pytest.mark.parametrize(("where", "then"), [("tool_pre", "return"), ("tool_pre", "timeout_error"),
                                             ("tool_pre", "base"), ("tool_event", "raise")])
async def test_hook_timeout_cut_with_a_cancellation_never_starts_the_tool(tmp_path: Path, then: str,
                                                                          where: str) -> None:
    """Found by attack on 3.11: a ``tool_pre`` hook returning when cut (557766c), and after it one
    answering its cut with a library's own ``BaseException`` (a plugin failure; fail-open, the
    cancelled call ran its tool)."""
    counting, sleeps = Counting(), Sleeps()
    hook: Any = StubbornPre(then) if where == "tool_pre" else StubbornEvent(then)
    config = {"plugins": {hook.name: {"hook_timeout_ms": LIMIT_MS}}, "tools": {}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(sleeps), counting, hook], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="h1"))
        await _same_turn(task, hook.waiting)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sleeps.started == 0
        _assert_cancelled_once(host, counting, "h1")


@pytest.mark.parametrize("bound", ["context deadline", "default_timeout_ms"])
async def test_the_callers_deadline_cut_with_a_cancellation(tmp_path: Path, bound: str) -> None:
    counting, stubborn = Counting(), Stubborn()
    config: dict[str, Any] = {"plugins": {}, "tools": {}}
    if bound == "default_timeout_ms":
        config["default_timeout_ms"] = LIMIT_MS
    async with ToolHost(config=config, plugins=[ToolsPlugin(stubborn), counting], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        context = host.default_context.with_timeout(LIMIT_MS / 1000) if bound == "context deadline" else None
        task = asyncio.ensure_future(host.call("stubborn", {"then": "return"}, context=context, call_id="d1"))
        await _same_turn(task, stubborn.waiting)
        with pytest.raises(asyncio.CancelledError):
            await task
        _assert_cancelled_once(host, counting, "d1")


async def test_a_retry_safe_tool_cut_with_a_cancellation_is_not_tried_again(tmp_path: Path) -> None:
    counting, stubborn = Counting(), Stubborn(effect="Pure")
    config = {"plugins": {}, "tools": {"stubborn": _timeout(retry={"max_attempts": 3, "initial_backoff_ms": 1})}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(stubborn), counting], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("stubborn", {"then": "retryable"}, call_id="r1"))
        await _same_turn(task, stubborn.waiting)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stubborn.attempts == 1
        _assert_cancelled_once(host, counting, "r1")


async def test_an_async_function_tool_cut_with_a_cancellation(tmp_path: Path) -> None:
    waiting = Cue()

    @tool
    async def answers(then: str = "return") -> str:
        """Waits; answers a cancellation with a value."""
        waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "kept"
        return "slept"

    counting = Counting()
    async with ToolHost(config={"plugins": {}, "tools": {"answers": _timeout()}},
                        plugins=[ToolsPlugin(answers), counting], builtins=["policy", "audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("answers", {}, call_id="f1"))
        await _same_turn(task, waiting)
        with pytest.raises(asyncio.CancelledError):
            await task
        _assert_cancelled_once(host, counting, "f1")


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
def test_on_every_event_loop(tmp_path: Path, loop_kind: str) -> None:
    async def scenario() -> None:
        await test_tool_timeout_cut_with_a_cancellation(tmp_path, "raise")

    run_on(loop_kind, scenario())


# --- nobody cancelled: never CancelledError ------------------------------------------------------


@pytest.mark.parametrize(("then", "expected"), [("return", "kept"), ("raise", "timeout"),
                                                ("timeout_error", "timeout")])
async def test_a_swallowed_cut_nobody_cancelled_ends_as_before(tmp_path: Path, then: str, expected: str) -> None:
    counting, stubborn = Counting(), Stubborn()
    async with ToolHost(config={"plugins": {}, "tools": {"stubborn": _timeout()}},
                        plugins=[ToolsPlugin(stubborn), counting], builtins=["policy", "audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("stubborn", {"then": then}, call_id="n1"))
        await _same_turn(task, stubborn.waiting, cancel=False)
        result = await task
        if expected == "kept":
            assert result.success and result.output == "kept", result.error
        else:
            assert result.error is not None and result.error["code"] == "timeout", result.error
        counting.assert_once("n1")


class FutureObserver:
    """Hands back a future that never settles from ``tool_complete`` (as the audit's fsync wait)."""

    name = "futures"

    def __init__(self) -> None:
        self.handed = Cue()

    @hookimpl
    def tool_complete(self, call: Any) -> asyncio.Future[None]:
        self.handed.set()
        return asyncio.get_running_loop().create_future()


async def test_a_tool_complete_futures_timeout_with_a_cancellation(tmp_path: Path) -> None:
    """An observer's future outlives its hook timeout, and the caller cancels in the same turn.
    Found by attack, on 3.10, 3.11 and 3.13: the timer cancelled the wait, the one
    ``CancelledError`` was taken for the timeout's, and the cancelled caller got the result."""
    counting, futures, sleeps = Counting(), FutureObserver(), Sleeps()
    config = {"plugins": {"futures": {"hook_timeout_ms": LIMIT_MS}, "audit": {"fsync": "never"}}, "tools": {}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(sleeps), counting, futures], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call("sleeps", {"seconds": 0}, call_id="o1"))
        await _same_turn(task, futures.handed)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert audit_records(host) == Counter({"o1": 1})


def _limited_host(tmp_path: Path, *tools: Any, ms: int = LIMIT_MS) -> tuple[ToolHost, Counting]:
    counting = Counting()
    config = {"plugins": {"audit": {"fsync": "never"}}, "tools": {t.name: _timeout(ms) for t in tools}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(*tools), counting], builtins=["policy", "audit"],
                    entry_points=False, working_dir=tmp_path, discover=False)
    return host, counting


@needs_311
@pytest.mark.parametrize("catches", ["TimeoutError", "TimeoutError and CancelledError"])
async def test_a_tools_own_timeout_expiring_with_its_limit_is_no_cancellation(tmp_path: Path, catches: str) -> None:
    """The tool bounds its own wait with ``asyncio.timeout``, due in the same turn as its limit:
    two requests, one ``CancelledError``; each timeout withdraws its own. Nobody cancelled the call."""

    class OwnTimeout:
        name = "own_timeout"
        description = "Bounds its wait itself."

        def __init__(self) -> None:
            self.waiting = Cue()

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            self.waiting.set()
            caught: tuple[type[BaseException], ...] = (TimeoutError,) if catches == "TimeoutError" else \
                (TimeoutError, asyncio.CancelledError)
            try:
                async with asyncio.timeout(LIMIT_MS / 1000):
                    await asyncio.sleep(30)
            except caught:
                return ToolResult(True, "fallback")
            return ToolResult(True, "slept")

    tool_ = OwnTimeout()
    host, counting = _limited_host(tmp_path, tool_)
    async with host:
        task = asyncio.ensure_future(host.call("own_timeout", {}, call_id="o1"))
        await _same_turn(task, tool_.waiting, cancel=False)
        result = await task
        if catches == "TimeoutError":  # its timeout is not the one that fired for it: the limit's cut stands
            assert result.error is not None and result.error["code"] == "timeout", result.error
        else:
            assert result.success and result.output == "fallback", result.error
        counting.assert_once("o1")
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0


async def test_a_tool_cancelling_another_task_as_it_is_cut_is_no_cancellation(tmp_path: Path) -> None:
    class Cleans:
        name = "cleans"
        description = "Cancels its helper task when cut, and reports."

        def __init__(self) -> None:
            self.waiting = Cue()

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            helper = asyncio.ensure_future(asyncio.sleep(30))
            self.waiting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                helper.cancel()
                try:
                    await helper
                except asyncio.CancelledError:
                    pass
                return ToolResult(True, "cleaned up")
            return ToolResult(True, "slept")

    tool_ = Cleans()
    host, counting = _limited_host(tmp_path, tool_)
    async with host:
        task = asyncio.ensure_future(host.call("cleans", {}, call_id="c1"))
        await _same_turn(task, tool_.waiting, cancel=False)
        result = await task
        assert result.success and result.output == "cleaned up", result.error
        counting.assert_once("c1")


async def test_a_nested_call_cut_with_its_callers_limit_ends_the_outer_call_as_a_timeout(tmp_path: Path) -> None:
    """A tool calls ``host.call`` itself; the inner tool's limit and the outer tool's are due in
    the same turn, and the inner tool answers with a value. The outer limit cut the inner call (it
    is recorded as cancelled); the outer call, which nobody cancelled, ends as its timeout, and its
    caller gets no ``CancelledError``."""
    holder: dict[str, Any] = {}
    inner = Stubborn("inner")

    class Outer:
        name = "outer"
        description = "Calls the inner tool."

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            result = await holder["host"].call("inner", {"then": "return"}, call_id="in1")
            return ToolResult(True, result.output)

    host, counting = _limited_host(tmp_path, Outer(), inner)
    holder["host"] = host
    async with host:
        task = asyncio.ensure_future(host.call("outer", {}, call_id="out1"))
        await _same_turn(task, inner.waiting, cancel=False)
        result = await task
        assert result.error is not None and result.error["code"] == "timeout", result.error
        counting.assert_once("out1")
        assert counting.assert_once("in1").error["code"] == "cancelled"
        assert audit_records(host) == Counter({"out1": 1, "in1": 1})


@needs_311
async def test_the_callers_own_timeout_due_with_the_tools_limit_is_its_timeout_error(tmp_path: Path) -> None:
    """The caller bounds the call itself, due in the same turn as the tool's limit; the tool answers
    with a value. The caller's bound fired: it gets ``TimeoutError``, and its task holds no request."""
    stubborn = Stubborn()
    host, counting = _limited_host(tmp_path, stubborn)
    async with host:
        async def bounded() -> None:
            async with asyncio.timeout(None) as bound:
                # due with the tool's limit, armed as the tool begins to wait
                stubborn.waiting.then = lambda: bound.reschedule(asyncio.get_running_loop().time() + LIMIT_MS / 1000)
                await host.call("stubborn", {"then": "return"}, call_id="b1")

        async def block() -> None:
            await stubborn.waiting.wait()
            time.sleep(4 * LIMIT_MS / 1000)

        blocker = asyncio.ensure_future(block())
        with pytest.raises(TimeoutError):
            await bounded()
        await blocker
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        assert counting.assert_once("b1").error["code"] == "cancelled"
        assert audit_records(host) == Counter({"b1": 1})


@needs_311
@pytest.mark.parametrize("cancel", [False, True])
async def test_a_request_standing_before_the_call_is_not_the_calls(tmp_path: Path, cancel: bool) -> None:
    """The caller caught an earlier cancellation without withdrawing it (``cancelling() == 1``)
    and calls a tool that answers its cut with a value: nobody cancelled this call, so the value;
    cancelled with the cut, ``CancelledError``."""
    stubborn = Stubborn()
    host, counting = _limited_host(tmp_path, stubborn)
    outcome: dict[str, Any] = {}

    async def caller() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # caught, not withdrawn: the request stands
        outcome["before"] = asyncio.current_task().cancelling()  # type: ignore[union-attr]
        outcome["result"] = await host.call("stubborn", {"then": "return"}, call_id="p1")

    async with host:
        task = asyncio.ensure_future(caller())
        await asyncio.sleep(0)
        task.cancel()
        await _same_turn(task, stubborn.waiting, cancel=cancel)
        if cancel:
            with pytest.raises(asyncio.CancelledError):
                await task
            assert counting.assert_once("p1").error["code"] == "cancelled"
        else:
            await task
            assert outcome["result"].success and outcome["result"].output == "kept", outcome["result"].error
            counting.assert_once("p1")
        assert outcome["before"] == 1
