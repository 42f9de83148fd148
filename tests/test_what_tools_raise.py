"""What a tool or a hook raises, at the edges: exceptions that are no ``Exception``
(``GeneratorExit``, ``SystemExit``, a library's own ``BaseException``), a ``TimeoutError`` or a
``CancelledError`` of the tool's own, and a class tool whose ``execute`` is a plain ``def``.

Each ends the call with a typed error and exactly one ``tool_complete`` (the audit record); before
these tests, each of them either left ``host.call`` raising with no record of the call, or was
reported as something it was not (an internal error, the host's own 60 s timeout, the caller's
cancellation)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolResult, ToolSpec, hookimpl


class Completions:
    """Counts ``tool_complete`` (what the audit plugin records), in order."""

    name = "completions"

    def __init__(self) -> None:
        self.codes: list[str | None] = []

    @hookimpl(trylast=True)
    def tool_complete(self, result: ToolResult) -> None:
        self.codes.append(result.error["code"] if result.error else None)


class Raises:
    """An async tool that raises ``exc`` at once, or after waiting once (``wait``)."""

    description = "Raises."
    input_schema = {"type": "object"}

    def __init__(self, name: str, exc: BaseException, *, wait: bool = False, effect: str = "ExternalSideEffects",
                 **policies: Any) -> None:
        self.name = name
        self.exc, self.wait, self.calls = exc, wait, 0
        self.spec = ToolSpec(name=name, description="Raises.", effect=effect, policies=policies)

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.calls += 1
        if self.wait:
            await asyncio.sleep(0)
        raise self.exc


#: Before 3.11 a tool under a timeout runs in ``wait_for``'s own task, and asyncio stops the event
#: loop on a ``SystemExit`` or ``KeyboardInterrupt`` raised in a task (documented limit).
_IN_A_TASK_OF_ITS_OWN = pytest.mark.skipif(sys.version_info < (3, 11),
                                           reason="3.10 runs a tool under a timeout in a task of its own")


class LibraryStop(BaseException):
    """A library's own ``BaseException`` (as trio's ``Cancelled`` or pytest's ``Failed``)."""


@pytest.mark.parametrize("wait", [False, True], ids=["at-once", "after-waiting"])
@pytest.mark.parametrize(
    ("exc", "code", "cause"),
    [
        (GeneratorExit("gone"), "tool_raised", "GeneratorExit"),
        (LibraryStop("stop"), "tool_raised", "LibraryStop"),
        pytest.param(SystemExit(3), "tool_exited", "SystemExit", marks=_IN_A_TASK_OF_ITS_OWN),
    ],
    ids=["GeneratorExit", "own-BaseException", "SystemExit"],
)
async def test_an_exception_that_is_no_exception_is_the_tools_failure_and_is_recorded(
    host_factory: Any, exc: BaseException, code: str, cause: str, wait: bool,
) -> None:
    completions = Completions()
    host = await host_factory(ToolsPlugin(Raises("raiser", exc, wait=wait)), completions)
    result = await host.call("raiser", {})  # HEAD: raised GeneratorExit / LibraryStop / SystemExit
    assert not result.success
    assert (result.error["type"], result.error["code"], result.error["cause"]) == ("ExecutionError", code, cause)
    assert completions.codes == [code]  # HEAD: no tool_complete, so no audit record
    assert (await host.call("raiser", {})).error["code"] == code  # the host goes on


@_IN_A_TASK_OF_ITS_OWN
async def test_a_keyboard_interrupt_in_a_tool_is_the_users_and_passes(host_factory: Any) -> None:
    """Documented limit: the process is being interrupted; the call is not recorded."""
    host = await host_factory(ToolsPlugin(Raises("raiser", KeyboardInterrupt())))
    with pytest.raises(KeyboardInterrupt):
        await host.call("raiser", {})


class PlainDef:
    """A class tool whose ``execute`` is a plain ``def`` (the contract says ``async def``)."""

    name = "plain"
    description = "Plain."
    input_schema = {"type": "object", "properties": {"fail": {"type": "boolean"}}}

    def execute(self, input: dict[str, Any]) -> ToolResult:
        if input.get("fail"):
            raise ValueError("boom")
        return ToolResult(True, "done")


async def test_a_plain_def_execute_that_raises_is_the_tools_failure(host_factory: Any) -> None:
    completions = Completions()
    host = await host_factory(ToolsPlugin(PlainDef()), completions)
    result = await host.call("plain", {"fail": True})
    # HEAD: SystemError "internal error: ValueError: boom", as if the host had a bug
    assert (result.error["type"], result.error["code"]) == ("ExecutionError", "tool_raised")
    assert result.error["message"] == "tool 'plain' raised ValueError: boom"
    assert completions.codes == ["tool_raised"]


async def test_a_plain_def_execute_that_returns_says_execute_must_be_async(host_factory: Any) -> None:
    host = await host_factory(ToolsPlugin(PlainDef()))
    result = await host.call("plain", {})
    # HEAD: "tool 'plain' raised TypeError: object ToolResult can't be used in 'await' expression"
    assert (result.error["type"], result.error["code"]) == ("ContractError", "invalid_result")
    assert "execute returned ToolResult, not an awaitable" in result.error["message"]
    assert "async def" in result.error["hint"] and "@tool" in result.error["hint"]


async def test_an_execute_that_yields_says_its_body_never_runs(host_factory: Any) -> None:
    ran: list[str] = []

    class Yields:
        name = "yields"
        description = "Yields."
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> Any:
            ran.append("body")
            yield ToolResult(True, "never")

    result = await (await host_factory(ToolsPlugin(Yields()))).call("yields", {})
    # before: "execute returned async_generator, not an awaitable (execute must be 'async def')"
    assert result.error["code"] == "invalid_result" and ran == []
    assert "execute is a generator (it has 'yield')" in result.error["message"]
    assert "instead of yielding" in result.error["hint"]


@pytest.mark.parametrize("wait", [False, True], ids=["at-once", "after-waiting"])
async def test_a_tools_own_timeout_error_is_its_failure_not_the_hosts_timeout(host_factory: Any, wait: bool) -> None:
    completions = Completions()
    host = await host_factory(ToolsPlugin(Raises("fetch", TimeoutError("upstream read timed out"), wait=wait)),
                              completions)
    result = await host.call("fetch", {})
    # HEAD: PolicyError "timeout", "tool 'fetch' timed out after 60 s", as if the host's limit ran out
    assert (result.error["type"], result.error["code"]) == ("ExecutionError", "tool_raised")
    assert result.error["message"] == "tool 'fetch' raised TimeoutError: upstream read timed out"
    assert result.error["retryable"] is True  # as a ConnectionError: worth a retry where one is safe
    assert completions.codes == ["tool_raised"]


async def test_a_pure_tools_own_timeout_error_is_retried_as_its_failure(host_factory: Any) -> None:
    tool = Raises("lookup", TimeoutError("slow upstream"), wait=True, effect="Pure",
                  retry={"max_attempts": 3, "initial_backoff_ms": 1, "jitter": False})
    host = await host_factory(ToolsPlugin(tool))
    result = await host.call("lookup", {})
    assert tool.calls == 3
    assert result.error["code"] == "tool_raised" and "slow upstream" in result.error["message"]
    retries = [d for d in result.metadata["trail"] if d["action"] == "retry"]
    assert [d["code"] for d in retries] == ["tool_raised", "tool_raised"]  # HEAD: "timeout" twice


class AnswersTheTimeout:
    """Catches the host's cancellation at its timeout and raises ``answer`` instead."""

    name = "stubborn"
    description = "Stubborn."
    input_schema = {"type": "object"}
    spec = ToolSpec(name="stubborn", description="Stubborn.", policies={"timeout_ms": 20})

    def __init__(self, answer: Exception) -> None:
        self.answer = answer

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise self.answer from None
        return ToolResult(True, "late")


@pytest.mark.parametrize("answer", [TimeoutError("gave up"), ValueError("interrupted mid-read")],
                         ids=["its-own-timeout", "another-error"])
async def test_the_hosts_timeout_stays_the_timeout_whatever_the_tool_answers_it_with(
        host_factory: Any, answer: Exception) -> None:
    """Found by attack: a ``ValueError`` answer read as ``tool_raised`` (older than the exception
    change); a ``TimeoutError`` answer must not read as the tool's own timeout."""
    host = await host_factory(ToolsPlugin(AnswersTheTimeout(answer)))
    result = await host.call("stubborn", {})
    assert (result.error["type"], result.error["code"]) == ("PolicyError", "timeout")
    assert result.error["message"] == "tool 'stubborn' timed out after 0.02 s"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="before 3.11 a task cannot tell whether it is being cancelled")
@pytest.mark.parametrize("wait", [False, True], ids=["at-once", "after-waiting"])
async def test_a_tools_own_cancelled_error_does_not_cancel_the_caller(host_factory: Any, wait: bool) -> None:
    """A task or future the tool awaited was cancelled by someone else; nobody cancelled the call."""

    class AwaitsACancelledTask:
        name = "awaits"
        description = "Awaits a task that someone else cancels."
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            inner = asyncio.ensure_future(asyncio.sleep(10))
            if wait:
                await asyncio.sleep(0)
            inner.cancel()
            await inner  # raises CancelledError into the tool
            return ToolResult(True, "unreachable")

    completions = Completions()
    host = await host_factory(ToolsPlugin(AwaitsACancelledTask()), completions)
    result = await host.call("awaits", {})  # HEAD: raised CancelledError; the caller's task ended cancelled
    assert (result.error["type"], result.error["code"], result.error["cause"]) == (
        "ExecutionError", "tool_raised", "CancelledError")
    assert "although its call was not cancelled" in result.error["message"]
    assert completions.codes == ["tool_raised"]
    task = asyncio.current_task()
    if sys.version_info >= (3, 11):  # for mypy: the test is skipped before
        assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0)  # the caller's task goes on


async def test_a_callers_cancellation_still_cancels_a_tool_that_raises_its_own_on_it(host_factory: Any) -> None:
    """The other side: a cancellation the caller requested stays a cancellation, on every version."""
    started = asyncio.Event()

    class Rethrows:
        name = "rethrows"
        description = "Raises a fresh CancelledError when cancelled."
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            started.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise asyncio.CancelledError("mine") from None
            return ToolResult(True, "late")

    completions = Completions()
    host = await host_factory(ToolsPlugin(Rethrows()), completions)
    call = asyncio.ensure_future(host.call("rethrows", {}))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert completions.codes == ["cancelled"]


def _raising_plugin(hook: str, exc: type[BaseException], is_async: bool) -> Any:
    class Plugin:
        name = f"raises-in-{hook}"

    if is_async:
        async def implementation(self: Any) -> None:
            raise exc()
    else:
        def implementation(self: Any) -> None:  # type: ignore[misc]
            raise exc()
    implementation.__name__ = hook
    setattr(Plugin, hook, hookimpl(implementation))
    return Plugin()


class Echo:
    name = "echo"
    description = "Echo."
    input_schema = {"type": "object"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(True, "ok")


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("exc", [GeneratorExit, LibraryStop, pytest.param(SystemExit, marks=_IN_A_TASK_OF_ITS_OWN)])
@pytest.mark.parametrize("hook", ["tool_pre", "tool_post", "tool_complete"])
async def test_a_hook_raising_an_exception_that_is_no_exception_fails_closed_and_is_recorded(
    host_factory: Any, hook: str, exc: type[BaseException], is_async: bool,
) -> None:
    completions = Completions()
    host = await host_factory(ToolsPlugin(Echo()), completions, _raising_plugin(hook, exc, is_async))
    result = await host.call("echo", {})  # HEAD: raised it, with no tool_complete
    assert not result.success
    assert (result.error["code"], result.error["plugin"]) == ("hook_failed", f"raises-in-{hook}")
    assert f"failed in {hook}: raised {exc.__name__}" in result.error["message"]
    assert len(completions.codes) == 1


async def test_a_hooks_own_timeout_error_is_its_failure_not_its_timeout(host_factory: Any) -> None:
    class Slow:
        name = "own-timeout"

        @hookimpl
        async def tool_pre(self) -> None:
            await asyncio.sleep(0)
            raise TimeoutError("backend slow")

    host = await host_factory(ToolsPlugin(Echo()), Slow())
    result = await host.call("echo", {})
    # HEAD: "plugin 'own-timeout' failed in tool_pre: timed out"
    assert result.error["message"] == "plugin 'own-timeout' failed in tool_pre: raised TimeoutError: backend slow"


class _Waits:
    name = "waits"
    description = "Waits."
    input_schema = {"type": "object"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(10)
        return ToolResult(True, "late")


async def test_closing_a_suspended_call_is_no_tool_failure_and_close_succeeds(host_factory: Any) -> None:
    """``coroutine.close()`` (what collecting a pending task does) throws ``GeneratorExit`` into the
    tool's await: it must pass, not be read as the tool's own (found by attack: close() raised
    "coroutine ignored GeneratorExit" and a tool_raised record was written)."""
    completions = Completions()
    host = await host_factory(ToolsPlugin(_Waits()), completions)
    coro = host.call("waits", {})
    coro.send(None)  # suspended inside the tool
    coro.close()  # HEAD: RuntimeError: coroutine ignored GeneratorExit
    await asyncio.sleep(0.01)
    assert completions.codes == []
    assert not host._pipeline.in_flight


async def test_a_tools_own_asyncio_timeout_error_is_retryable_on_every_version(host_factory: Any) -> None:
    """Before 3.11 ``asyncio.TimeoutError`` (an inner ``wait_for``) is no builtin ``TimeoutError``."""

    class Inner(_Waits):
        async def execute(self, input: dict[str, Any]) -> ToolResult:
            await asyncio.wait_for(asyncio.sleep(10), 0.01)
            return ToolResult(True, "late")

    host = await host_factory(ToolsPlugin(Inner()))
    result = await host.call("waits", {})
    assert (result.error["code"], result.error["retryable"]) == ("tool_raised", True)  # HEAD, 3.10: False


@pytest.mark.parametrize("hook", ["tool_error", "tool_complete"])
async def test_an_async_ending_hook_raising_cancelled_error_is_its_failure_on_every_version(
    host_factory: Any, hook: str,
) -> None:
    """``tool_error`` hooks and async ``tool_complete`` observers run in a task nobody else can
    cancel, so a ``CancelledError`` there is the hook's own, on 3.10 too (found by attack: on
    3.10 ``host.call`` raised it, and the call was never recorded)."""

    class CancelsItself:
        name = "cancels-itself"

    async def implementation(self: Any) -> None:
        await asyncio.sleep(0)
        raise asyncio.CancelledError()

    implementation.__name__ = hook
    setattr(CancelsItself, hook, hookimpl(implementation))
    completions = Completions()
    host = await host_factory(ToolsPlugin(Raises("raiser", ValueError("boom"))), completions, CancelsItself())
    result = await host.call("raiser", {})  # 3.10 before: raised CancelledError, no tool_complete
    assert not result.success
    assert len(completions.codes) == 1
    if hook == "tool_error":  # a failure inside tool_error is logged; the call's own error stands
        assert result.error["code"] == "tool_raised" and completions.codes == ["tool_raised"]
    await asyncio.sleep(0)  # the caller's task was not cancelled


async def test_a_call_an_ending_hook_starts_and_cancels_is_still_cancelled(host_factory: Any) -> None:
    """The other side of the test above: only the ending hooks' own task is one nobody else can
    cancel, not a task they start (``wait_for`` runs its awaitable in one on 3.10): a nested
    call that ``wait_for`` cancels ends cancelled, and ``wait_for`` raises its timeout."""
    outcomes: list[str] = []

    class Retries:
        name = "retries-elsewhere"

        @hookimpl
        async def tool_error(self, call: Any) -> None:
            if call.name != "raiser":
                return
            try:
                await asyncio.wait_for(host.call("sleeper", {}), 0.05)
            except asyncio.TimeoutError:
                outcomes.append("timed out")
            else:
                outcomes.append("returned")

    class Sleeper:
        name = "sleeper"
        description = "Sleeps."
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            await asyncio.sleep(10)
            return ToolResult(True, "late")

    completions = Completions()
    host = await host_factory(ToolsPlugin(Raises("raiser", ValueError("boom")), Sleeper()), completions, Retries())
    result = await host.call("raiser", {})
    assert result.error["code"] == "tool_raised"
    assert outcomes == ["timed out"]
    assert sorted(code or "" for code in completions.codes) == ["cancelled", "tool_raised"]
