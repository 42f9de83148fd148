"""The ``ToolCall`` a hook sees when the call path makes it lazily (only once a hook will see
it): every hook of one call sees one call (its id, canonical name and arguments as a ``Modify``
left them), on every path — a denial, a failure, a timeout, a cancellation, a cut by ``close`` —
whether the hook was there at the start or came while the tool ran."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import EVENT_LOOPS, ToolsPlugin, run_on

from amplifier_tools import Deny, Modify, ToolCall, ToolHost, ToolResult, hookimpl
from amplifier_tools.models import ToolContext


class Demo:
    """``local::demo.slow`` (model-facing ``demo_slow``): waits for ``release``, then does ``how``."""

    name = "local::demo.slow"
    description = "Waits, then echoes, raises, fails or hangs."
    input_schema = {"type": "object", "properties": {"how": {"type": "string"}, "n": {"type": "integer"}},
                    "required": ["how"]}

    def __init__(self, wait: bool = True) -> None:
        self.wait = wait
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.seen: list[dict[str, Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.seen.append(dict(input))
        self.started.set()
        if self.wait:
            await self.release.wait()
        how = input["how"]
        if how == "raise":
            raise RuntimeError("boom")
        if how == "fail":
            return ToolResult(False, "partial", {"type": "ExecutionError", "code": "nope", "message": "nope"})
        if how == "hang":
            await asyncio.sleep(30)
        return ToolResult(True, input)


class Watcher:
    """Notes, per hook, the ``ToolCall`` object it got."""

    name = "watcher"

    def __init__(self) -> None:
        self.calls: list[tuple[str, ToolCall]] = []

    @hookimpl
    def tool_pre(self, call: ToolCall) -> None:
        self.calls.append(("tool_pre", call))

    @hookimpl
    def tool_post(self, call: ToolCall) -> None:
        self.calls.append(("tool_post", call))

    @hookimpl
    def tool_error(self, call: ToolCall) -> None:
        self.calls.append(("tool_error", call))

    @hookimpl
    def tool_complete(self, call: ToolCall, result: ToolResult) -> None:
        self.calls.append(("tool_complete", call))


class Completes:
    """Only ``tool_complete``."""

    name = "completes"

    def __init__(self) -> None:
        self.calls: list[tuple[ToolCall, ToolResult]] = []

    @hookimpl
    def tool_complete(self, call: ToolCall, result: ToolResult) -> None:
        self.calls.append((call, result))


class Modifies:
    """``tool_pre`` rewrites ``n`` to 7."""

    name = "modifies"

    @hookimpl
    def tool_pre(self, call: ToolCall) -> Modify:
        return Modify({**call.arguments, "n": 7}, reason="n is seven")


class DeniesAfter:
    """A second ``tool_pre``: denies (after ``Modifies``)."""

    name = "denies"

    @hookimpl(trylast=True)
    def tool_pre(self) -> Deny:
        return Deny("no")


# -- one call object across the hooks of a call ------------------------------------------------

async def test_a_denied_call_is_the_same_call_in_every_hook(host_factory: Any) -> None:
    """tool_pre denies: tool_error and tool_complete get the ``ToolCall`` tool_pre got (a plugin
    correlating a call's hooks by the object sees one call). Found by attack: on a host without
    ``tool_event`` the lazily made call handed to tool_pre was not kept, and the denied call ended
    with a copy (the parent commit handed all three the one object)."""
    watcher = Watcher()
    host = await host_factory(ToolsPlugin(Demo(wait=False)), watcher, DeniesAfter())
    result = await host.call("demo_slow", {"how": "ok"}, call_id="call_d")
    assert result.error is not None and result.error["code"] == "denied"
    assert [hook for hook, _ in watcher.calls] == ["tool_pre", "tool_error", "tool_complete"]
    first = watcher.calls[0][1]
    assert first == ToolCall("call_d", "local::demo.slow", {"how": "ok"})
    assert all(call is first for _, call in watcher.calls)


@pytest.mark.parametrize("how, code", [("raise", "tool_raised"), ("fail", "nope"), ("hang", "timeout")])
async def test_a_modified_call_that_fails_ends_with_the_modified_call(host_factory: Any, how: str,
                                                                      code: str) -> None:
    tool = Demo(wait=False)
    watcher = Watcher()
    host = await host_factory(ToolsPlugin(tool), Modifies(), watcher,
                              config={"tools": {"local::demo.slow": {"policies": {"timeout_ms": 50}}}})
    result = await host.call("demo_slow", {"how": how, "n": 1}, call_id="call_m")
    assert result.error is not None and result.error["code"] == code and result.tool_call_id == "call_m"
    assert tool.seen == [{"how": how, "n": 7}]
    modified = ToolCall("call_m", "local::demo.slow", {"how": how, "n": 7})
    assert [(hook, call) for hook, call in watcher.calls if hook != "tool_pre"] == [
        ("tool_error", modified), ("tool_complete", modified)]


async def test_a_modified_call_cancelled_by_its_caller_ends_with_the_modified_call(host_factory: Any) -> None:
    tool = Demo()
    watcher = Watcher()
    host = await host_factory(ToolsPlugin(tool), Modifies(), watcher)
    task = asyncio.ensure_future(host.call("demo_slow", {"how": "ok", "n": 1}, call_id="call_c"))
    await tool.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    modified = ToolCall("call_c", "local::demo.slow", {"how": "ok", "n": 7})
    ends = [(hook, call) for hook, call in watcher.calls if hook != "tool_pre"]
    assert ends == [("tool_error", modified), ("tool_complete", modified)]


# -- hosts with only tool_complete, or no hook ---------------------------------------------------

@pytest.mark.parametrize("how, code", [("raise", "tool_raised"), ("fail", "nope"), ("hang", "timeout"),
                                       ("ok", None)])
async def test_tool_complete_alone_sees_the_canonical_call(host_factory: Any, how: str, code: str | None) -> None:
    completes = Completes()
    host = await host_factory(ToolsPlugin(Demo(wait=False)), completes,
                              config={"tools": {"local::demo.slow": {"policies": {"timeout_ms": 50}}}})
    result = await host.call("demo_slow", {"how": how}, call_id="call_t")
    assert result.tool_call_id == "call_t"
    assert (result.error or {}).get("code") == code
    ((call, seen),) = completes.calls
    assert call == ToolCall("call_t", "local::demo.slow", {"how": how})
    assert seen.tool_call_id == "call_t"


@pytest.mark.parametrize("hooks", [False, True])
@pytest.mark.parametrize("bad", ["secret", "long"])
async def test_a_refused_call_id_is_replaced_with_and_without_hooks(host_factory: Any, hooks: bool,
                                                                    bad: str) -> None:
    completes = Completes()
    plugins: list[Any] = [ToolsPlugin(Demo(wait=False))] + ([completes] if hooks else [])
    host = await host_factory(*plugins)
    host.secrets.update(["hunter2-very-secret"])
    given = "call_hunter2-very-secret" if bad == "secret" else "c" * 5000
    result = await host.call("demo_slow", {"how": "ok"}, call_id=given)
    assert result.error is not None and result.error["code"] == "invalid_call_id"
    assert result.tool_call_id and result.tool_call_id != given and "hunter2" not in json.dumps(
        [result.error, result.tool_call_id])
    assert result.error["call_id"] == result.tool_call_id
    if hooks:
        ((call, _),) = completes.calls
        assert call == ToolCall(result.tool_call_id, "local::demo.slow", {"how": "ok"})


# -- execute, ContextCaller, retries -------------------------------------------------------------

class MyCall(ToolCall):
    """A caller's own ``ToolCall`` subclass."""


async def test_execute_with_a_subclass_hands_hooks_that_call_and_canonicalizes_a_model_name(
        host_factory: Any) -> None:
    watcher = Watcher()
    host = await host_factory(ToolsPlugin(Demo(wait=False)), watcher)
    mine = MyCall("call_s", "local::demo.slow", {"how": "raise"})
    result = await host.execute(mine)
    assert result.error is not None and result.tool_call_id == "call_s"
    assert all(call is mine for _, call in watcher.calls) and len(watcher.calls) == 3
    watcher.calls.clear()
    by_model_name = MyCall("call_s2", "demo_slow", {"how": "ok"})
    result = await host.execute(by_model_name)
    assert result.success
    assert [call for _, call in watcher.calls] == [ToolCall("call_s2", "local::demo.slow", {"how": "ok"})] * 3


async def test_a_context_caller_call_seen_by_a_hook_registered_mid_call(host_factory: Any) -> None:
    tool = Demo()
    host = await host_factory(ToolsPlugin(tool))
    caller = host.context_caller(ToolContext(principal="svc", session_id="s1"))
    ids: list[str] = []
    task = asyncio.ensure_future(caller.call("demo_slow", {"how": "raise"}, on_id=ids.append))
    await tool.started.wait()
    watcher = Watcher()
    host.plugin_manager.register(watcher, name="watcher")
    tool.release.set()
    result = await task
    assert result.error is not None and result.error["code"] == "tool_raised" and result.tool_call_id == ids[0]
    call = ToolCall(ids[0], "local::demo.slow", {"how": "raise"})
    assert watcher.calls == [("tool_error", call), ("tool_complete", call)]


class Flaky:
    name = "local::demo.flaky"
    description = "Fails until the third attempt."
    effect = "Pure"
    input_schema = {"type": "object", "properties": {"n": {"type": "integer"}}}

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.seen.append(dict(input))
        if len(self.seen) < 3:
            raise ConnectionError("reset")
        return ToolResult(True, "ok")


@pytest.mark.parametrize("attempts, success", [(3, True), (2, False)])
async def test_a_retried_call_runs_each_attempt_with_the_modified_arguments(
        host_factory: Any, attempts: int, success: bool) -> None:
    tool = Flaky()
    completes = Completes()
    host = await host_factory(ToolsPlugin(tool), Modifies(), completes, config={"tools": {"local::demo.flaky": {
        "policies": {"retry": {"max_attempts": attempts, "initial_backoff_ms": 0, "jitter": False}}}}})
    result = await host.call("demo_flaky", {"n": 1}, call_id="call_r")
    assert result.success is success and result.tool_call_id == "call_r"
    assert result.metadata["attempts"] == attempts
    assert tool.seen == [{"n": 7}] * attempts
    ((call, _),) = completes.calls
    assert call == ToolCall("call_r", "local::demo.flaky", {"n": 7})


# -- hooks arriving and leaving mid-call ---------------------------------------------------------

async def test_a_hook_registered_mid_call_on_a_host_with_none_sees_the_whole_call(host_factory: Any) -> None:
    """A host with no call hook makes no ``ToolCall`` for a call; one registered while the tool
    runs still gets the caller's id, the canonical name (called by the model-facing one) and the
    arguments, in ``tool_post`` and ``tool_complete`` alike."""
    tool = Demo()
    host = await host_factory(ToolsPlugin(tool))
    task = asyncio.ensure_future(host.call("demo_slow", {"how": "ok"}, call_id="call_mine_1"))
    await tool.started.wait()
    watcher = Watcher()
    host.plugin_manager.register(watcher, name="watcher")
    tool.release.set()
    result = await task
    assert result.success and result.tool_call_id == "call_mine_1"
    call = ToolCall("call_mine_1", "local::demo.slow", {"how": "ok"})
    assert watcher.calls == [("tool_post", call), ("tool_complete", call)]


async def test_a_hook_registered_from_another_thread_mid_call_sees_the_call(host_factory: Any) -> None:
    tool = Demo()
    host = await host_factory(ToolsPlugin(tool))
    task = asyncio.ensure_future(host.call("demo_slow", {"how": "fail"}, call_id="call_th"))
    await tool.started.wait()
    watcher = Watcher()
    thread = threading.Thread(target=host.plugin_manager.register, args=(watcher,), kwargs={"name": "watcher"})
    thread.start()
    thread.join()
    tool.release.set()
    result = await task
    assert result.error is not None and result.error["code"] == "nope"
    call = ToolCall("call_th", "local::demo.slow", {"how": "fail"})
    assert watcher.calls == [("tool_error", call), ("tool_complete", call)]


@pytest.mark.parametrize("event", ["tool:post", "tool:error"])
async def test_an_amplifier_handler_registered_mid_call_gets_the_calls_data(host_factory: Any, event: str) -> None:
    tool = Demo()
    host = await host_factory(ToolsPlugin(tool))
    how = "ok" if event == "tool:post" else "raise"
    task = asyncio.ensure_future(host.call("demo_slow", {"how": how}, call_id="call_am"))
    await tool.started.wait()
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(name: str, data: dict[str, Any]) -> None:
        seen.append((name, data))

    for each in ("tool:pre", "tool:post", "tool:error"):
        host.events.register(each, handler, owner="late")
    tool.release.set()
    await task
    assert [name for name, _ in seen] == [event]
    data = seen[0][1]
    assert data["tool_call_id"] == "call_am" and data["tool_canonical_name"] == "local::demo.slow"
    assert data["tool_input"] == {"how": how}


async def test_a_watcher_unregistered_mid_call_is_not_run_and_the_call_ends(host_factory: Any) -> None:
    tool = Demo()
    watcher = Watcher()
    host = await host_factory(ToolsPlugin(tool), watcher)
    task = asyncio.ensure_future(host.call("demo_slow", {"how": "raise"}, call_id="call_un"))
    await tool.started.wait()
    host.plugin_manager.unregister(watcher)
    tool.release.set()
    result = await task
    assert result.error is not None and result.error["code"] == "tool_raised" and result.tool_call_id == "call_un"
    assert [hook for hook, _ in watcher.calls] == ["tool_pre"]


# -- the default host's audit record: one per call -----------------------------------------------

def audit(host: ToolHost) -> list[dict[str, Any]]:
    path = Path(host.capabilities["audit.path"])
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "call"]


async def test_the_audit_record_of_cancelled_and_cut_calls(tmp_path: Path) -> None:
    tool = Demo()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}, "policy": {}},
                            "shutdown_grace_ms": 50},
                    plugins=[ToolsPlugin(tool), Modifies()], entry_points=False, working_dir=tmp_path,
                    discover=False)
    await host.start()
    cancelled = asyncio.ensure_future(host.call("demo_slow", {"how": "ok", "n": 1}, call_id="call_x1"))
    await tool.started.wait()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    cut = asyncio.ensure_future(host.call("demo_slow", {"how": "hang"}, call_id="call_x2"))
    await asyncio.sleep(0.05)
    tool.release.set()
    await host.close()
    result = await cut
    assert result.error is not None and result.error["code"] == "host_closing"
    late = await host.call("demo_slow", {"how": "ok"})
    assert late.error is not None and late.error["code"] == "host_closing"
    records = {r["call_id"]: r for r in audit(host)}
    assert sorted(records) == ["call_x1", "call_x2"] and len(audit(host)) == 2
    for call_id, args in (("call_x1", {"how": "ok", "n": 7}), ("call_x2", {"how": "hang", "n": 7})):
        assert records[call_id]["tool"] == "local::demo.slow"
        assert records[call_id]["arguments"] == args


# -- the caller cancelling at each await point ---------------------------------------------------

class Pauses:
    """An async hook at ``where`` that pauses 50 ms (``entered`` set first): a point where the
    caller's cancellation can land."""

    name = "pauses"

    def __init__(self, where: str) -> None:
        self.where = where
        self.entered = asyncio.Event()

    async def _pause(self, hook: str) -> None:
        if hook == self.where:
            self.entered.set()
            await asyncio.sleep(0.05)

    @hookimpl
    async def tool_pre(self) -> None:
        await self._pause("tool_pre")

    @hookimpl
    async def tool_post(self) -> None:
        await self._pause("tool_post")

    @hookimpl
    async def tool_error(self) -> None:
        await self._pause("tool_error")

    @hookimpl
    async def tool_complete(self) -> None:
        await self._pause("tool_complete")


@pytest.mark.parametrize("where, how, code", [
    ("tool_pre", "ok", "cancelled"), ("tool", "ok", "cancelled"), ("tool_post", "ok", "cancelled"),
    ("tool_error", "raise", "tool_raised"), ("tool_complete", "ok", None),
    ("tool:pre", "ok", "cancelled"), ("tool:post", "ok", "cancelled"), ("tool:error", "raise", "tool_raised")])
@pytest.mark.parametrize("late", [False, True])
async def test_a_call_cancelled_at_each_await_point_is_completed_once_with_its_call(
        host_factory: Any, where: str, how: str, code: str | None, late: bool) -> None:
    """``late``: the hooks come while the tool runs (the host had none when the call began);
    the points before the tool are then not reached, and the cancellation lands in the tool."""
    tool = Demo()
    completes = Completes()
    pauses = Pauses(where)
    entered = pauses.entered
    host = await host_factory(ToolsPlugin(tool), *(() if late else (pauses, completes)))

    async def handler(event: str, data: dict[str, Any]) -> None:
        if event == where:
            entered.set()
            await asyncio.sleep(0.05)

    if not late:
        for event in ("tool:pre", "tool:post", "tool:error"):
            host.events.register(event, handler, owner="pausing")
    task = asyncio.ensure_future(host.call("demo_slow", {"how": how}, call_id="call_k"))
    await tool.started.wait()
    if late:
        host.plugin_manager.register(pauses, name="pauses")
        host.plugin_manager.register(completes, name="completes")
        for event in ("tool:pre", "tool:post", "tool:error"):
            host.events.register(event, handler, owner="pausing")
    expected: str | None = "cancelled"
    if where == "tool" or (late and where in ("tool_pre", "tool:pre")):
        task.cancel()
    else:
        tool.release.set()
        await entered.wait()
        task.cancel()
        expected = code
    tool.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    ((call, result),) = completes.calls
    assert call == ToolCall("call_k", "local::demo.slow", {"how": how})
    assert result.tool_call_id == "call_k" and (result.error or {}).get("code") == expected


class Swallowing:
    name = "local::demo.swallows"
    description = "Sleeps; when cancelled, carries on."

    def __init__(self) -> None:
        self.running = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.running.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if input.get("then") == "raise":
                raise RuntimeError("interrupted") from None
        return ToolResult(True, "done anyway")


@pytest.mark.skipif(sys.version_info < (3, 12, 3), reason="a swallowed cancellation is told from CPython 3.12.3")
@pytest.mark.parametrize("hooks", [False, True])
@pytest.mark.parametrize("then", ["return", "raise"])
async def test_a_swallowed_cancellation_on_a_host_with_no_call_hook_reaches_the_caller(
        host_factory: Any, hooks: bool, then: str) -> None:
    completes = Completes()
    host = await host_factory(ToolsPlugin(Swallowing()), *([completes] if hooks else []))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await host.call("demo_swallows", {"then": then}, call_id="call_w")
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    if hooks:
        ((call, result),) = completes.calls
        assert call == ToolCall("call_w", "local::demo.swallows", {"then": then})
        assert result.error is not None and result.error["code"] == "cancelled"


@pytest.mark.parametrize("hooks", [False, True])
async def test_a_retried_call_cancelled_between_attempts_reports_them(host_factory: Any, hooks: bool) -> None:
    tool = Flaky()
    completes = Completes()
    host = await host_factory(ToolsPlugin(tool), *([completes] if hooks else []), config={
        "tools": {"local::demo.flaky": {"policies": {"retry": {
            "max_attempts": 3, "initial_backoff_ms": 5000, "max_backoff_ms": 5000, "jitter": False}}}}})
    task = asyncio.ensure_future(host.call("demo_flaky", {"n": 1}, call_id="call_rc"))
    while not tool.seen:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)  # in the wait before the second attempt
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tool.seen == [{"n": 1}]
    if hooks:
        ((call, result),) = completes.calls
        assert call == ToolCall("call_rc", "local::demo.flaky", {"n": 1})
        assert result.error is not None and result.error["code"] == "cancelled"
        assert result.metadata["attempts"] == 1


async def test_the_audit_record_of_a_call_refused_its_id_names_the_tool_canonically(tmp_path: Path) -> None:
    """Found by attack: a call by the model-facing name whose id the host refused was recorded
    (and seen by every hook) under that name, not the canonical one all other records carry."""
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}}, plugins=[ToolsPlugin(Demo(wait=False))],
                    entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    try:
        host.secrets.update(["hunter2-very-secret"])
        refused = await host.call("demo_slow", {"how": "ok"}, call_id="call_hunter2-very-secret")
        assert refused.error is not None and refused.error["code"] == "invalid_call_id"
        ran = await host.call("demo_slow", {"how": "ok"}, call_id="call_fine")
        assert ran.success
    finally:
        await host.close()
    records = {r["call_id"]: r for r in audit(host)}
    assert len(records) == 2 and records["call_fine"]["tool"] == "local::demo.slow"
    assert records[refused.tool_call_id]["tool"] == "local::demo.slow"  # parent: 'demo_slow'
    assert records[refused.tool_call_id]["arguments"] == {"how": "ok"}


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("via", ["call", "execute", "context_caller"])
def test_close_cuts_a_hanging_call_on_a_host_with_no_hook(tmp_path: Path, loop_kind: str, via: str) -> None:
    """The call's task is the one ``close`` cuts (found from the loop the caller checked), on
    asyncio's loop and on uvloop, whichever way the call was made."""

    async def scenario() -> ToolResult:
        tool = Demo()
        host = ToolHost(config={"shutdown_grace_ms": 50}, plugins=[ToolsPlugin(tool)], builtins=False,
                        entry_points=False, working_dir=tmp_path, discover=False)
        await host.start()
        if via == "call":
            call = host.call("demo_slow", {"how": "hang"}, call_id="call_z")
        elif via == "execute":
            call = host.execute(ToolCall("call_z", "demo_slow", {"how": "hang"}))
        else:
            call = host.context_caller(ToolContext(principal="svc")).call("demo_slow", {"how": "hang"})
        task = asyncio.ensure_future(call)
        await tool.started.wait()
        tool.release.set()
        await asyncio.wait_for(host.close(), 5)
        return await asyncio.wait_for(task, 5)

    result = run_on(loop_kind, scenario())
    assert result.error is not None and result.error["code"] == "host_closing"
