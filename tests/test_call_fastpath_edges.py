"""The call path's shortcuts at their edges: ``ToolContext.for_call`` copying a subclass's
context, and ``HookDispatcher.present`` (which hooks a call runs) under plugins that arrive while a
call is in flight or while the answer is being computed."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
from helpers import ToolsPlugin

from amplifier_tools import Deny, ToolResult, hookimpl
from amplifier_tools.models import ToolContext

# -- 1. for_call and a ToolContext subclass that redeclares a field ---------------------------

@attrs.frozen
class ServiceContext(ToolContext):
    """A caller's context type with its own default principal (an attrs subclass: slotted)."""

    principal: str = "svc-bot"


def test_for_call_keeps_a_field_a_subclass_redeclares() -> None:
    ctx = ServiceContext(scopes={"read"}).for_call("c1")
    assert ctx.principal == "svc-bot"  # HEAD: AttributeError, the field lives in the subclass's slot
    assert ctx.scopes == frozenset({"read"}) and ctx.call_id == "c1" and ctx.trail == []


class PrincipalGate:
    name = "gate"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    def tool_pre(self, context: Any) -> Deny | None:
        self.seen.append(context.principal)
        return None if context.principal == "svc-bot" else Deny("unknown principal")


async def test_a_call_with_a_redeclaring_context_subclass_runs(host_factory: Any, echo: Any) -> None:
    gate = PrincipalGate()
    host = await host_factory(ToolsPlugin(echo), gate)
    result = await host.call("echo", {"path": "a"}, context=ServiceContext(session_id="s"))
    assert result.success, result.error  # HEAD: hook_failed (AttributeError: ... 'principal')
    assert gate.seen == ["svc-bot"]


# -- 2. a plugin registered while a call is in flight -----------------------------------------

class SlowEcho:
    name = "slow"
    description = "Echo after a release."
    input_schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.started.set()
        await self.release.wait()
        return ToolResult(success=True, output="secret:" + input["path"])


class LateRedactor:
    """tool_post withholds the output; tool_complete notes that it saw the call."""

    name = "late-redactor"

    def __init__(self) -> None:
        self.ran: list[str] = []

    @hookimpl
    def tool_post(self, result: ToolResult) -> ToolResult:
        self.ran.append("tool_post")
        return ToolResult(True, "[redacted]", None, dict(result.metadata), result.tool_call_id)

    @hookimpl
    def tool_complete(self) -> None:
        self.ran.append("tool_complete")


async def test_a_plugin_registered_while_a_call_runs_sees_its_tool_post(host_factory: Any) -> None:
    slow = SlowEcho()
    host = await host_factory(ToolsPlugin(slow))
    task = asyncio.ensure_future(host.call("slow", {"path": "x"}))
    await slow.started.wait()
    late = LateRedactor()
    host.plugin_manager.register(late, name="late-redactor")  # e.g. an output filter loaded at runtime
    slow.release.set()
    result = await task
    # HEAD: tool_post skipped (present() snapshot at call start) while tool_complete runs: the
    # output the new filter was registered to withhold reaches the caller.
    assert late.ran == ["tool_post", "tool_complete"]
    assert result.output == "[redacted]"


async def test_an_amplifier_tool_post_handler_registered_mid_call_runs(host_factory: Any) -> None:
    slow = SlowEcho()
    host = await host_factory(ToolsPlugin(slow))
    task = asyncio.ensure_future(host.call("slow", {"path": "x"}))
    await slow.started.wait()
    seen: list[str] = []

    def handler(event: str, data: dict[str, Any]) -> dict[str, Any]:
        seen.append(event)
        return {"action": "deny", "reason": "withheld"}

    host.events.register("tool:post", handler, owner="late-module")
    slow.release.set()
    result = await task
    assert seen == ["tool:post"]  # HEAD: []
    assert not result.success


# -- 3. present() cached from two generations ------------------------------------------------

class Guard:
    name = "guard"

    @hookimpl
    def tool_pre(self) -> Deny:
        return Deny("guarded")


async def test_present_is_not_cached_from_a_generation_that_moved_while_it_was_computed(
        host_factory: Any, echo: Any) -> None:
    """A registration landing between two of present()'s impls() calls (another thread: the
    host's loop runs in one, ``plugin_manager.register`` is called from another). Simulated
    deterministically at the extra_impls step of impls("tool_post")."""
    host = await host_factory(ToolsPlugin(echo))
    host.plugin_manager.register(object(), name="bump")  # next call recomputes present()
    inner = host.dispatcher.extra_impls
    fired = False

    def extra(hook: str) -> Any:
        nonlocal fired
        if hook == "tool_post" and not fired:
            fired = True
            host.plugin_manager.register(Guard(), name="guard")  # "the other thread"
        return inner(hook)

    host.dispatcher.extra_impls = extra
    await host.call("echo", {"path": "a"})  # the call during which the guard arrived
    assert fired
    result = await host.call("echo", {"path": "b"})
    assert not result.success and result.error["code"] == "denied"  # HEAD: the guard never runs
    result = await host.call("echo", {"path": "c"})
    assert not result.success


async def test_an_impls_list_built_across_an_invalidate_is_not_kept(host_factory: Any, echo: Any) -> None:
    """An Amplifier handler registered from another thread while the host's loop builds a hook's
    implementation list: ``invalidate()`` lands between the list's build and its store. Before,
    the stale list was stored into the cache ``invalidate`` had just cleared, and the handler
    never ran until something else invalidated again. Simulated deterministically at the
    ``extra_impls`` step of ``impls("tool_pre")`` (which asks for the bridge's handlers)."""
    host = await host_factory(ToolsPlugin(echo))
    await host.call("echo", {"path": "warm"})  # every list cached
    host.dispatcher.invalidate()  # the next call rebuilds tool_pre's list, and is interrupted
    inner = host.dispatcher.extra_impls
    guard: list[Any] = []
    fired = False

    def extra(hook: str) -> Any:
        nonlocal fired
        # Read before the other thread's change: the list being built is stale.
        answer = [*inner(hook), *(guard if hook == "tool_pre" else [])]
        if hook == "tool_pre" and not fired:
            fired = True
            guard.append(("guard", _deny, ("call",)))
            host.dispatcher.invalidate()  # "the other thread", after its registration
        return answer

    host.dispatcher.extra_impls = extra
    first = await host.call("echo", {"path": "a"})  # the call during which the handler arrived
    assert fired and first.success
    result = await host.call("echo", {"path": "b"})
    assert not result.success and result.error["code"] == "denied"  # before: the guard never ran
    assert not (await host.call("echo", {"path": "c"})).success


async def _deny(call: Any) -> Deny:
    return Deny("guarded")


# -- 4. a tool's first step taken by the host, and the rest awaited under the limit ----------

class Outcome(ToolResult):
    """A tool author's own result type."""


class Shapes:
    """A tool that ends in the way its input names, before or after it first waits."""

    name = "shapes"
    description = "Ends as asked."
    input_schema = {"type": "object", "properties": {"how": {"type": "string"}, "wait": {"type": "boolean"}},
                    "required": ["how"]}

    async def execute(self, input: dict[str, Any]) -> Any:
        if input.get("wait"):
            await asyncio.sleep(0)
        how = input["how"]
        if how == "subclass":
            return Outcome(output="mine")
        if how == "dict":
            return {"success": True, "output": "a dict"}
        if how == "timeout":
            raise TimeoutError("the tool's own")
        if how == "raise":
            raise ValueError("broken")
        if how == "hang":
            await asyncio.sleep(30)
        return ToolResult(output="plain")


async def test_every_ending_reads_the_same_whether_the_tool_waited_or_not(host_factory: Any) -> None:
    """The host runs a tool's first step itself (no timer for a tool that never waits) and awaits
    the rest under the limit: a result subclass, a result dict, a raised ``TimeoutError`` or
    another exception end the same either way."""
    host = await host_factory(ToolsPlugin(Shapes()))
    for wait in (False, True):
        mine = await host.call("shapes", {"how": "subclass", "wait": wait})
        assert mine.success and mine.output == "mine", (wait, mine.error)
        as_dict = await host.call("shapes", {"how": "dict", "wait": wait})
        assert as_dict.success and as_dict.output == "a dict"
        timed = await host.call("shapes", {"how": "timeout", "wait": wait})
        assert timed.error is not None and timed.error["code"] == "tool_raised", (wait, timed.error)  # not the host's
        broken = await host.call("shapes", {"how": "raise", "wait": wait})
        assert broken.error is not None and broken.error["type"] == "ExecutionError", (wait, broken.error)
        assert "broken" in broken.error["message"]


async def test_the_rest_of_a_waiting_tool_is_bounded_by_the_callers_deadline(host_factory: Any) -> None:
    host = await host_factory(ToolsPlugin(Shapes()))
    context = host.default_context.with_timeout(0.05)
    result = await host.call("shapes", {"how": "hang", "wait": True}, context=context)
    assert result.error is not None and result.error["code"] == "timeout"
    assert "the caller's deadline" in result.error["message"]


# -- 5. failures on a host that makes no ToolCall until a hook will see it ------------------

async def test_a_failed_call_on_a_host_with_no_hook_is_recorded_under_its_id(host_factory: Any) -> None:
    """Failures end through the error path, which makes the ``ToolCall`` there: a tool that
    raises, a refused argument and an unknown tool each end under the id the caller gave."""
    host = await host_factory(ToolsPlugin(Shapes()))
    broken = await host.call("shapes", {"how": "raise", "wait": False}, call_id="call_b")
    refused = await host.call("shapes", {"how": 3}, call_id="call_r")
    unknown = await host.call("nope", {}, call_id="call_u")
    for result, call_id, code in ((broken, "call_b", "tool_raised"), (refused, "call_r", "invalid_input"),
                                  (unknown, "call_u", "unknown_tool")):
        assert not result.success and result.tool_call_id == call_id
        assert result.error is not None and result.error["call_id"] == call_id and result.error["code"] == code
