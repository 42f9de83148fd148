"""The call loop: one place where a call goes through every stage, in order.

    look up tool -> check JSON + input schema -> tool_pre chain -> resolve secrets
    -> execute under the deadline -> normalize -> check output schema
    -> tool_post chain            (success)
    -> tool_error hooks           (any failure; may recover)
    -> tool_complete observers    (always, once, with the final result)

It never raises: every failure, including a bug in a plugin or in the host,
ends as a failed ``ToolResult`` with a typed error. It must never let output
that failed its checks, or a resolved secret value, reach the caller: every
value in the host-wide ``SecretSet`` (whichever tool or plugin resolved it) is
redacted from the output before ``tool_post``, from every error message, and
once more from the final result (output, error, metadata) before the
``tool_complete`` observers (audit, spans) and the caller see it.

Exactly once, whatever happens: every call ends in one of ``tool_post`` or
``tool_error``, then ``tool_complete`` once (the audit record). A call whose
task is cancelled (``task.cancel()``, ``asyncio.wait_for``) is completed with a
``SystemError`` ``cancelled`` result in a task of its own that a second
cancellation cannot interrupt, and then
``CancelledError`` is re-raised to the caller; a cancellation while the
``tool_post`` chain runs lets that chain run to its end first
(``HookDispatcher.tool_post``). A call cut by ``close()`` after
the grace period ends the same way with ``host_closing``, but returns that
result instead of raising (the caller did not cancel it). On CPython 3.12.3
and later, a cancellation a tool or hook swallowed (caught ``CancelledError``
and returned or raised something else) is honoured the same way: the task's
count of cancellation requests says one arrived during the call.
A ``CancelledError`` the tool raised while nobody cancelled its task, and any
other exception that is no ``Exception`` but ``KeyboardInterrupt``, is the
tool's failure (``_passes``).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import sys
import time
from typing import Any, Final

from .amplifier_hooks import event_data, result_data
from .content import canonical_base64, withhold_redacted
from .copies import copy_of
from .dispatch import (
    HookDispatcher,
    being_cancelled,
    count_beyond,
    finish_despite_cancel,
    requests_before,
    stop_counting,
    thrown_in,
)
from .errors import ContractError, ExecutionError, PolicyError, ToolError, ToolSystemError
from .models import MAX_CALL_ID, Decision, ToolCall, ToolContext, ToolResult, identifier_problem, new_call_id
from .redaction import SecretSet, chain_without_secrets, redact
from .registry import MountedTool, ToolRegistry
from .results import error_dict, error_from_exception, error_from_result, normalize_result
from .retry import retry_allowed, run_with_retries
from .spec import ToolSpec
from .timeouts import TimeLimitExceeded, first_step, run_with_timeout

log = logging.getLogger("amplifier_tools")

_SWALLOWED_NOTE: Final = "the call was cancelled, and the tool or a hook caught the cancellation and went on"

#: Whether a task counts its cancellation requests (``Task.cancelling``): CPython 3.11+.
COUNTS_REQUESTS: Final = sys.version_info >= (3, 11)

#: Whether a swallowed cancellation can be told (``_swallowed``): from CPython 3.12.3. Before, the
#: call sites skip the two ``_swallowed`` calls of a call that ends well (``Task.cancelling()`` is
#: still asked once as every call begins from 3.11: ``COUNTS_REQUESTS``).
COUNTS_CANCELS: Final = sys.version_info >= (3, 12, 3)

if sys.version_info >= (3, 11) and sys.version_info >= (3, 12, 3):  # (3, 11): for mypy

    def _swallowed(ctx: ToolContext, task: asyncio.Task[Any] | None, requests: int) -> bool:
        """Whether the call's task was cancelled and the tool or a hook caught the ``CancelledError``
        and went on (more cancellation requests than ``requests``, those pending when the call
        began); if so, noted in the trail. Found by attack: the call then ended as a success, or as
        the tool's own failure, and the caller's cancellation was lost (its ``asyncio.timeout``
        never fired)."""
        if task is None or task.cancelling() <= requests:
            return False
        ctx.record("host", "execute", "cancel_swallowed", _SWALLOWED_NOTE)
        return True

else:  # pragma: no cover - exercised by the py310 and py311 tox envs

    def _swallowed(ctx: ToolContext, task: asyncio.Task[Any] | None, requests: int) -> bool:
        """Never seen before CPython 3.12.3: a ``TaskGroup`` whose child failed while it waited for
        them cancelled its task and never withdrew it (gh-116720; found by attack: a tool that
        handled its own task group's failure during the call was reported cancelled). A swallowed
        cancellation cannot be told from that leftover, so it is not looked for."""
        return False


def unrecorded_refusal(problem: ToolError, call_id: Any, name: Any, secrets: SecretSet | None) -> ToolResult:
    """The result of a call refused before it reached the pipeline's hooks (the host not started or
    closed, a call from the wrong loop, a malformed call): no hook sees it and no record is made.
    ``secrets``: check ``call_id`` against them (``None``: an id the host made); an id the pipeline
    would refuse is not handed back either."""
    if secrets is not None and call_id is not None and identifier_problem(call_id, secrets) is not None:
        call_id = None
    return ToolResult(False, None, {
        **problem.details, "type": problem.category, "code": problem.code, "message": problem.message,
        "retryable": False, "cause": None, "tool": name if isinstance(name, str) else None, "call_id": call_id},
        {}, call_id)


class CallPipeline:
    """Runs calls against a tool registry through a hook dispatcher."""

    def __init__(self, tools: ToolRegistry, hooks: HookDispatcher, *, default_timeout: float | None,
                 secrets: SecretSet | None = None) -> None:
        self.tools = tools
        #: Every secret value resolved in this run (the host's ``session.secrets``).
        self.secrets = SecretSet() if secrets is None else secrets
        self.hooks = hooks
        self.default_timeout = default_timeout
        #: Set by ``ToolHost.close``: new calls and tools not yet started end in ``host_closing``.
        self.closing = False
        #: Set by ``ToolHost.close`` once the calls in flight are drained, before the plugins' cleanups:
        #: a call arriving now is refused unrecorded (found by attack: one entering while ``close``
        #: woke from its wait was recorded after the audit writer's cleanup, and its record was lost).
        self.sealed = False
        #: Calls in flight: a number per call -> the task running it (``close`` cancels the stragglers).
        self.in_flight: dict[int, asyncio.Task[Any] | None] = {}
        #: Calls ``close`` cut after the grace period (their cancellation becomes ``host_closing``).
        self.cut: set[int] = set()
        self._numbers = itertools.count()
        self._idle: asyncio.Event | None = None

    async def run(self, call_id: str, name: Any, arguments: Any, context: ToolContext, own_id: bool = False,
                  loop: asyncio.AbstractEventLoop | None = None, given: ToolCall | None = None) -> ToolResult:
        """Run the call of tool ``name`` with ``arguments`` under ``call_id`` to its final
        ``ToolResult``. Never raises, except ``CancelledError`` when the caller cancelled it (after
        the call was completed and recorded). ``own_id``: the call's id is one the host made; any
        other is checked first (``models.identifier_problem``) and one refused is replaced by a
        fresh id, the call ending in ``invalid_call_id``. ``loop``: the running loop, when the
        caller has it at hand (its task is then found without asking for it). ``given``: the
        caller's own ``ToolCall`` of these three (``host.execute``), which hooks then see.

        The ``ToolCall`` hooks and observers see is made only once one of them will see it (any
        call hook implemented, or a failure to end): a host with none makes no object nobody reads
        (≈ 0.3 µs, 5 % of a bare call). One coroutine, where a wrapper keeping the call in
        ``in_flight`` around the body cost a coroutine per call."""
        if self.sealed:
            return unrecorded_refusal(ToolSystemError("the host is closed", code="host_closing"), call_id, name,
                                      None if own_id else self.secrets)
        number = next(self._numbers)
        task = self.in_flight[number] = asyncio.current_task(loop)
        counting = None
        try:
            # requests pending when the call began: not this call's (``being_cancelled`` counts beyond them)
            requests = task.cancelling() if COUNTS_REQUESTS and task is not None else 0  # type: ignore[attr-defined]
            if requests:  # one not yet thrown in (the task cancelled itself) is the caller's: not counted
                requests = requests_before(task)
                counting = count_beyond(task, requests) if requests else None
            started = time.perf_counter()
            call = given  # the ToolCall hooks see, once made (``_made``)
            refused = None if own_id else identifier_problem(call_id, self.secrets)
            if refused is not None:  # a call id the host cannot keep: the call runs under one of the host's
                call_id, call = new_call_id(), None
            ctx = context.for_call(call_id)
            mounted = self.tools.resolve(name) if isinstance(name, str) else None
            if mounted is not None and name != mounted.spec.name:
                # hooks and records always see the canonical name: a call refused below (its id, a
                # closing host) too (found by attack: its audit record named the model-facing one)
                name, call = mounted.spec.name, None
            kept_output: Any = None
            scanned: Any = None  # the output object already scrubbed before tool_post
            scanned_with: frozenset[str] = frozenset()  # the secrets it was scrubbed of
            present = self.hooks.present()  # which hooks have implementations (cached; asked again below)
            events = "tool_event" in present
            ending = False  # the tool_post or tool_error chain has begun: the other must never run
            posted = False  # the ``tool:post`` event was sent: a cancellation after it sends no ``tool:error``
            tries: list[int] | None = None  # under a retry policy: how many attempts have begun
            try:
                if self.closing:
                    raise _closing_error("the host is closing; no new calls are admitted")
                if refused is not None:
                    raise _refused_call_id(refused)
                if mounted is None:
                    raise self._unknown_tool(name)
                spec = mounted.spec
                mounted.check_arguments(arguments)
                if events:
                    call = _made(call, call_id, name, arguments)
                    await self.hooks.tool_event("tool:pre", event_data(call, ctx))
                if "tool_pre" in (self.hooks.present() if events else present):  # re-asked after an awaited observer
                    # made before the chain: one it stops (a Deny) ends with the call it saw, not a copy
                    call = _made(call, call_id, name, arguments)
                    call = await self.hooks.tool_pre(call, spec, ctx, mounted.check_arguments)
                    arguments = call.arguments  # a Modify's
                for ref in spec.security.secret_refs:  # resolving registers the value host-wide
                    ctx.secret(ref)
                if self.closing:  # admitted before close, but the tool has not started: do not start it now
                    raise _closing_error(f"the host is closing; tool {spec.name!r} was not started")
                if COUNTS_CANCELS and _swallowed(ctx, task, requests):  # by a tool_pre hook: do not start the tool
                    raise asyncio.CancelledError
                if spec.policies.retry is not None and retry_allowed(spec, ctx):
                    tries = [0]
                    try:
                        result = await self._execute_with_retries(mounted, call_id, arguments, ctx, task, requests,
                                                                  tries)
                    except ToolError as failed:  # the output of a failure the tool reported, as below
                        kept_output = failed.reported.output if isinstance(failed.reported, ToolResult) else None
                        raise
                else:
                    begun = self._begin(mounted, call_id, arguments, ctx)
                    result = begun if isinstance(begun, ToolResult) else await begun.finish()
                    if not result.success:
                        kept_output = result.output
                        raise error_from_result(result, spec.name, self.secrets)
                output = returned = result.output
                if mounted.output_validator is not None:
                    mounted.check_output(output)

                scanned_with = self.secrets.values  # what ``scanned`` is clean of
                if scanned_with:
                    output = redact(output, secrets=self.secrets, patterns=False)
                scanned = output
                has_post = "tool_post" in self.hooks.present()  # asked again: plugins may have come during the tool
                if has_post or events or output is not returned or result.error is not None:
                    # what hooks and observers see; else ``_final`` builds the one result the caller gets
                    result = ToolResult(True, output, None, result.metadata, call_id)

                ending = True
                if has_post:
                    call = _made(call, call_id, name, arguments)
                    result = await self.hooks.tool_post(call, spec, result, ctx, mounted.check_output,
                                                        self._failure_result)
                if events:
                    # Delivered to every observer despite a cancellation, which is honoured after:
                    # one cut short sent ``tool:post`` to the first observers and then ``tool:error``
                    # to all (found by review: an observer saw both end events of the call).
                    posted = True
                    call = _made(call, call_id, name, arguments)
                    _, cut = await finish_despite_cancel(
                        self.hooks.tool_event("tool:post", event_data(call, ctx, tool_result=result_data(result))))
                    if cut:
                        raise asyncio.CancelledError
                if COUNTS_CANCELS and _swallowed(ctx, task, requests):
                    raise asyncio.CancelledError
            except ToolError as error:
                call = _made(call, call_id, name, arguments)
                if _swallowed(ctx, task, requests):
                    return await self._cancelled(call, mounted, ctx, started, number, requests, errors_ran=ending,
                                                 attempts=tries[0] if tries else None, events=events and not posted)
                failure: ToolError | None = error
            except asyncio.CancelledError:
                return await self._cancelled(_made(call, call_id, name, arguments), mounted, ctx, started, number,
                                             requests, errors_ran=ending, attempts=tries[0] if tries else None,
                                             events=events and not posted)
            except Exception as exc:  # a host bug must still end as a typed result
                call = _made(call, call_id, name, arguments)
                log.exception("unexpected failure %s %r", "ending" if ending else "running", name)
                failure = _internal(exc)
                if ending:  # tool_post already ran: tool_error must not run as well
                    result = self._failure_result(call, mounted.spec if mounted is not None else None, ctx, failure)
                    failure = None
            else:
                failure = None
            if failure is not None:
                # Once the tool_error chain has begun it runs to its end, then tool_complete records the
                # call; a cancellation arriving meanwhile (an async tool_error hook, an event observer)
                # waits for that and is honoured afterwards.
                ended, cancelled = await finish_despite_cancel(
                    self._fail(_made(call, call_id, name, arguments), mounted, ctx, failure, started, kept_output,
                               events))
                if cancelled:
                    return self._after_cancel(ended, number, requests)
                ended_result: ToolResult = ended
                return ended_result
            if scanned is not None and self.secrets.values is not scanned_with:
                # A hook registered a secret after the output was scanned (found by attack: a tool_post
                # hook resolving one left it in the output the caller got): scan the output again.
                scanned = None
            result = self._final(call_id, ctx, result, started, scanned)
            if "tool_complete" not in self.hooks.present():  # no observer: no coroutine to build
                return result
            # A cancellation arriving in here is honoured only once every tool_complete observer has run.
            return await self._observed(_made(call, call_id, name, arguments), mounted, ctx, result, number, requests)
        finally:
            if counting is not None:
                stop_counting(counting)
            del self.in_flight[number]
            self.cut.discard(number)
            if self._idle is not None and not self.in_flight:
                self._idle.set()

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no call is in flight, at most ``timeout`` seconds; whether it is idle."""
        if not self.in_flight:
            return True
        if self._idle is None or self._idle.is_set():  # shared by every close() waiting at once
            self._idle = asyncio.Event()                # (found by attack: a second one left the first waiting)
        try:
            await run_with_timeout(self._idle.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            return not self.in_flight
        return True

    def cut_in_flight(self) -> int:
        """Cancel every call still in flight (``close`` after the grace period); how many."""
        tasks: list[asyncio.Task[Any]] = []
        current = asyncio.current_task()
        for number, task in self.in_flight.items():
            if number in self.cut:  # cut by an earlier close(): one cancellation, or the second
                continue            # reads as the caller's own (``_after_cancel``)
            self.cut.add(number)
            if task is not None and task is not current and all(task is not other for other in tasks):
                tasks.append(task)
        for task in tasks:
            task.cancel(msg="amplifier-tools host closing")
        return len(self.cut)

    def _after_cancel(self, result: ToolResult, number: int, requests: int, *, by_caller: bool = False) -> ToolResult:
        """A call ended and was recorded while its task was being cancelled: a cut by ``close()``
        returns the result; the caller's own cancellation is raised — also when ``close`` cut the
        call as well (found by attack: the cut's result was returned to a caller that had
        cancelled; Python 3.11 and later, where a task counts its cancellation requests: the cut's
        one is withdrawn, and one left beyond ``requests`` is the caller's). ``requests``: those
        pending when the call began that are not the call's (``requests_before``: already thrown
        in; one the task made of itself just before the call, not thrown in yet, is the caller's
        cancellation and not among them), 0 on 3.10. ``by_caller``: the call was already being
        ended as the caller's cancellation when ``close`` cut it, which every version can tell
        (found by attack: on 3.10 that caller got a returned result with code ``cancelled``)."""
        if number not in self.cut:
            raise asyncio.CancelledError
        current = asyncio.current_task()
        if current is not None and sys.version_info >= (3, 11) and current.uncancel() > requests:
            raise asyncio.CancelledError
        if by_caller:
            raise asyncio.CancelledError
        return result

    async def _cancelled(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, started: float,
        number: int, requests: int, *, errors_ran: bool, attempts: int | None = None, events: bool = False,
    ) -> ToolResult:
        """End a call whose task was cancelled: ``tool_error`` (unless an ending chain already
        began), ``tool_complete`` and the record, in a task a second cancellation cannot stop.
        ``events``: send ``tool_event`` hooks the ``tool:error`` event, as for any failed call (found
        by attack: an observer of events saw ``tool:pre`` and nothing more of a cancelled call).

        A cut by ``close()`` returns the ``host_closing`` result; a caller's cancellation is
        re-raised once the call is recorded.
        """
        by_close = number in self.cut
        if by_close:
            error: ToolError = _closing_error(
                f"the host closed before {call.name!r} finished (shutdown_grace_ms ran out)")
        else:
            error = ToolSystemError(f"call to {call.name!r} was cancelled", code="cancelled")
        ctx.record("host", "execute", "cut" if by_close else "cancelled", error.message)
        if attempts:  # a retried call cancelled in its second attempt or later, or in a wait between them
            error.attempts = attempts

        async def finish() -> ToolResult:
            if errors_ran:
                failure = self._failure_result(call, mounted.spec if mounted is not None else None, ctx, error)
                if events:
                    await self.hooks.tool_event("tool:error", event_data(call, ctx, error=failure.error))
                return await self._complete(call, mounted, ctx, failure, started)
            return await self._fail(call, mounted, ctx, error, started, None, events, recover=False)

        ended, _ = await finish_despite_cancel(finish())
        return self._after_cancel(ended, number, requests, by_caller=not by_close)

    async def _execute(self, mounted: MountedTool, call_id: str, arguments: Any, ctx: ToolContext) -> ToolResult:
        """One run of the tool under its timeout and the caller's deadline (``_begin``, then
        ``_Started.finish`` if it waited)."""
        begun = self._begin(mounted, call_id, arguments, ctx)
        return begun if isinstance(begun, ToolResult) else await begun.finish()

    def _begin(self, mounted: MountedTool, call_id: str, arguments: Any, ctx: ToolContext) -> ToolResult | _Started:
        """Start one run of the tool with ``arguments`` (the call's, checked) under ``call_id``:
        its result if it finished without waiting (no timer, no coroutine of the host's own), else
        the run as ``_Started``, to be awaited under the limit. Raises the ``ToolError`` the run
        ended with."""
        timeout = mounted.spec.policies.timeout_ms
        seconds = timeout / 1000.0 if timeout is not None else self.default_timeout
        by_deadline = False  # the caller's deadline, not the tool's timeout, bounds this run
        deadline = ctx.deadline
        if deadline is not None:
            remaining = deadline - time.monotonic()  # ``ctx.remaining()``, without the call
            if remaining <= 0:
                raise PolicyError(
                    f"deadline passed before tool {mounted.spec.name!r} could run", code="deadline_exceeded"
                )
            by_deadline = seconds is None or remaining < seconds
            seconds = remaining if seconds is None else min(seconds, remaining)
        # The tool gets a copy (found by attack: a tool that popped or set a key of its ``input``
        # changed the caller's dict, the audit record and a retry's arguments). Shallow: a change
        # inside a nested value is not covered (docs/contract.md).
        arguments = {**arguments, "_tool_call_id": call_id} if mounted.seed else {**arguments}
        execute = mounted.execute  # a field holding a function: read as one, a specialized read, then called
        try:  # the call too: a plain ``def execute`` raises here (found by attack: read as an internal error)
            coro = execute(arguments, ctx) if mounted.takes_context else execute(arguments)
            finished, raw = first_step(coro)
        except BaseException as exc:
            if _passes(exc):
                raise
            raise self._run_error(exc, mounted, seconds, by_deadline) from _cause(exc)
        if not finished:
            return _Started(self, mounted, raw, seconds, by_deadline)
        if type(raw) is ToolResult and raw.success is True and raw.error is None and type(raw.metadata) is dict:
            return raw  # the common result, as ``normalize_result`` returns it, without a call
        return normalize_result(raw, mounted.spec.name)

    def _run_error(self, exc: BaseException, mounted: MountedTool, seconds: float | None,
                   by_deadline: bool) -> ToolError:
        """The ``ToolError`` a run of the tool that raised ``exc`` (not ``_passes``) ends with:
        ``TimeLimitExceeded`` is the timeout (``seconds``; ``by_deadline``: the caller's deadline
        set it); anything else is the tool's own failure (``error_from_exception``), a
        ``CancelledError`` raised while nobody cancelled the call too."""
        if isinstance(exc, asyncio.CancelledError):
            return ExecutionError(
                f"tool {mounted.spec.name!r} raised CancelledError although its call was not cancelled",
                code="tool_raised", cause="CancelledError",
                hint="a task or future the tool awaited was cancelled by someone else; the tool should handle it",
            )
        if isinstance(exc, TimeLimitExceeded):
            timed_out = PolicyError(
                f"tool {mounted.spec.name!r} timed out after {seconds:.3g} s"
                + (" (the caller's deadline)" if by_deadline else ""),
                code="timeout",
                retryable=mounted.spec.effect.retry_safe,
                timeout_s=seconds,
            )
            if by_deadline:  # the policy plugin's breakers do not count it against the tool
                timed_out.details["by_deadline"] = True
            return timed_out
        if not isinstance(exc, ToolError) and log.isEnabledFor(logging.INFO):
            # Where it raised, for the tool's author: shown by ``--verbose`` (INFO), secrets out.
            log.info("traceback of tool %r", mounted.spec.name, exc_info=chain_without_secrets(exc, self.secrets))
        return error_from_exception(exc, mounted.spec.name)

    async def _execute_with_retries(self, mounted: MountedTool, call_id: str, arguments: Any, ctx: ToolContext,
                                    task: asyncio.Task[Any] | None, requests: int, tries: list[int]) -> ToolResult:
        """``_execute`` under the spec's retry policy; the result reports ``attempts``, and ``tries``
        counts the attempts begun, for a call cancelled before the retries end (found by review: it
        was recorded as one attempt after two had run).

        The result of a tool-reported failure is the ``reported`` of the error raised after the last
        attempt (found by review: its output went through the error's details, where a tool's own
        ``output=`` detail of a raised error was taken for it).
        An attempt that swallowed the call's cancellation ends the retries as cancelled.

        Each attempt runs with a deep copy of the arguments as they were checked, taken before the
        first (found by attack: the next attempt ran with the arguments object as it was by then,
        past the policy's rules, which had refused it: changed by a callback a ``tool_pre`` hook had
        scheduled, by the caller while the call ran, or inside a nested value by the first attempt).
        """
        spec = mounted.spec
        checked = copy_of(arguments)

        async def attempt() -> ToolResult:
            tries[0] += 1
            try:
                outcome = await self._execute(mounted, call_id, copy_of(checked), ctx)
            except ToolError:
                if _swallowed(ctx, task, requests):
                    raise asyncio.CancelledError from None
                raise
            if not outcome.success:
                if _swallowed(ctx, task, requests):  # found by attack: a returned failure was retried
                    raise asyncio.CancelledError
                raise error_from_result(outcome, spec.name, self.secrets)  # its ``reported``: the result and all
            return outcome

        def note(number: int, error: ToolError) -> None:
            ctx.record("host", "execute", "retry", error.message, code=error.code, attempt=number)

        result, attempts = await run_with_retries(attempt, spec, ctx, note)
        return ToolResult(True, result.output, None, {**result.metadata, "attempts": attempts}, call_id)

    def _unknown_tool(self, name: Any) -> ContractError:
        if not isinstance(name, str):
            return ContractError(f"tool name must be a string, got {type(name).__name__}", code="unknown_tool")
        hint = self.tools.suggest(name)
        suffix = f"; did you mean {', '.join(map(repr, hint))}?" if hint else ""
        return ContractError(f"unknown tool {name!r}{suffix}", code="unknown_tool", tool_name=name)

    def _failure_result(
        self, call: ToolCall, spec: ToolSpec | None, ctx: ToolContext, error: ToolError, output: Any = None,
    ) -> ToolResult:
        """The failed result ``error`` ends ``call`` with (also the hook chains' ``on_failure``: a
        bound method made once, where a closure per call would capture the call's values)."""
        tool = spec.name if spec is not None else None
        if output is not None and self.secrets:
            output = redact(output, secrets=self.secrets, patterns=False)
        # A failure the tool reported keeps the metadata it reported with it (an imported MCP
        # tool's server, version and definition hash); redacted with the result in ``_complete``.
        reported = error.reported
        metadata = dict(reported.metadata) if isinstance(reported, ToolResult) else {}
        if error.attempts is not None:  # found by attack: a call failing after retries said nothing of them
            metadata["attempts"] = error.attempts
        return ToolResult(False, output, error_dict(error, tool=tool, context=ctx, secrets=self.secrets), metadata,
                          call.id)

    async def _fail(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, error: ToolError,
        started: float, output: Any, events: bool, *, recover: bool = True,
    ) -> ToolResult:
        spec = mounted.spec if mounted is not None else None
        checks = mounted is not None and mounted.output_validator is not None  # a recovery's output is checked
        recovery, denied = await self.hooks.tool_error(call, spec, error, ctx,
                                                       mounted.check_output if checks and mounted else None)
        if denied is not None:  # a plugin withheld the failed call's output: its denial is the error
            error, output = denied, None
            _withhold_retry_reasons(ctx)
        result = self._failure_result(call, spec, ctx, error, output)
        if recovery is not None and not recover:
            ctx.record("host", "tool_error", "recover_ignored", "a cancelled call cannot be recovered")
        elif recovery is not None:
            result = ToolResult(recovery.success, recovery.output, recovery.error, dict(recovery.metadata), call.id)
        if events:
            await self.hooks.tool_event("tool:error", event_data(call, ctx, error=result.error))
        return await self._complete(call, mounted, ctx, result, started)

    async def _complete(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, result: ToolResult, started: float,
    ) -> ToolResult:
        """The final result of a failed or cancelled call (``_final``), after every ``tool_complete``
        observer (``_observed``); inside ``finish_despite_cancel``'s task."""
        result = self._final(call.id, ctx, result, started)
        if "tool_complete" not in self.hooks.present():
            return result
        return await self._observed(call, mounted, ctx, result)

    def _final(self, call_id: str, ctx: ToolContext, result: ToolResult, started: float,
               scanned: Any = None) -> ToolResult:
        """The call's final result (under ``call_id``): trail, scrub (of all but ``scanned``, the
        output object already scrubbed), duration."""
        output, error, metadata = result.output, result.error, dict(result.metadata)  # each read once (``run``)
        trail = metadata["trail"] = _trail(ctx) if ctx.trail else []
        result = ToolResult(result.success, output, error, metadata, call_id)
        if len(metadata) > 1 or trail or error is not None or (output is not None and output is not scanned):
            result = self._scrubbed(result, scanned)  # else nothing left unscanned: no JSON text to build
            metadata = result.metadata
        # Set after the scrub: the host's own measurement is no secret, even when its digits hold one.
        metadata["duration_ms"] = (time.perf_counter() - started) * 1000.0
        return result

    async def _observed(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, result: ToolResult,
        number: int | None = None, requests: int = 0,
    ) -> ToolResult:
        """``result`` after every ``tool_complete`` observer (scrubbed again if they recorded
        decisions or registered secrets). A cancellation of the caller's task while an observer
        was awaited is honoured afterwards: ``number`` given (the call's own task), by
        ``_after_cancel`` (a cut by ``close`` returns the result; found by attack: it raised
        ``CancelledError`` to a caller who never cancelled); else (inside
        ``finish_despite_cancel``'s task) by raising ``CancelledError``."""
        spec = mounted.spec if mounted is not None else None
        recorded = len(ctx.trail)
        known = self.secrets.values
        result, _, cancelled = await self.hooks.tool_complete(call, spec, result, ctx, self._withheld)
        if len(ctx.trail) != recorded or self.secrets.values is not known:
            # observers recorded decisions (the caller sees them) or registered secrets: scrub again
            metadata = {**result.metadata, "trail": _trail(ctx)}
            result = self._scrubbed(ToolResult(result.success, result.output, result.error, metadata, call.id))
        if cancelled:
            if number is None:
                raise asyncio.CancelledError
            return self._after_cancel(result, number, requests)  # cut by close: what was recorded
        return result

    def _withheld(self, call: ToolCall, spec: ToolSpec | None, ctx: ToolContext, current: ToolResult,
                  error: ToolError) -> ToolResult:
        """What the caller gets when a ``tool_complete`` observer failed closed: the output is
        withheld; a failed call keeps its first error."""
        failure = current.error if not current.success else self._failure_result(call, spec, ctx, error).error
        return ToolResult(False, None, failure, {**current.metadata, "trail": _trail(ctx)}, call.id)

    def _scrubbed(self, result: ToolResult, scanned: Any = None) -> ToolResult:
        """``result`` with every registered secret redacted from its output, error and metadata:
        whatever ``tool_post`` hooks, ``tool_error`` recoveries or the tool's metadata added. One
        pre-scan of the three together (of the output only when it is not ``scanned``, the object
        scrubbed before ``tool_post``); untouched (the same object) when nothing matched."""
        if not self.secrets:
            return result
        same = scanned is not None and result.output is scanned
        metadata = result.metadata
        if isinstance(metadata.get("content"), list):  # base64 as the scrub can find a secret in it
            content = canonical_base64(metadata["content"])
            if content is not metadata["content"]:
                metadata = {**metadata, "content": content}
        parts = [None if same else result.output, result.error, metadata]
        clean = redact(parts, secrets=self.secrets, patterns=False)
        if clean is parts:
            return result  # no secret: not even in the canonical base64, so none in the data as it is
        output, error, clean_metadata = clean
        if clean_metadata is metadata:
            metadata = result.metadata  # the secret was elsewhere: the content stays as it came
        else:
            metadata = clean_metadata
            if isinstance(metadata.get("content"), list):
                # base64 with a secret redacted no longer decodes: such a block becomes a text block
                metadata = {**metadata, "content": withhold_redacted(metadata["content"])}
        if same:
            output = result.output
        return ToolResult(result.success, output, error, metadata, result.tool_call_id)


class _Started:
    """A run of a tool that waited at its first step: the rest, awaited under the run's limit."""

    __slots__ = ("by_deadline", "mounted", "pipeline", "rest", "seconds")

    def __init__(self, pipeline: CallPipeline, mounted: MountedTool, rest: Any, seconds: float | None,
                 by_deadline: bool) -> None:
        self.pipeline, self.mounted, self.rest = pipeline, mounted, rest
        self.seconds, self.by_deadline = seconds, by_deadline

    async def finish(self) -> ToolResult:
        """The run's result; raises the ``ToolError`` it ended with (``CallPipeline._run_error``)."""
        try:
            raw = await run_with_timeout(self.rest, self.seconds)
        except BaseException as exc:
            if _passes(exc):
                raise
            if not inspect.isawaitable(self.rest):  # asked only now: a run that waited is awaitable
                raise _not_awaitable(self.mounted.spec.name, self.rest) from None
            raise self.pipeline._run_error(exc, self.mounted, self.seconds, self.by_deadline) from _cause(exc)
        if type(raw) is ToolResult and raw.success is True and raw.error is None and type(raw.metadata) is dict:
            return raw  # as in ``_begin``
        return normalize_result(raw, self.mounted.spec.name)


def _made(call: ToolCall | None, call_id: str, name: Any, arguments: Any) -> ToolCall:
    """``call``, or the ``ToolCall`` of the three when none was made yet (``CallPipeline.run``)."""
    return ToolCall(call_id, name, arguments) if call is None else call


def _not_awaitable(tool: str, returned: Any) -> ContractError:
    """The error of a tool whose ``execute`` returned something that cannot be awaited (a plain
    ``def execute``: found by attack, it read as ``TypeError: object ToolResult can't be used in
    'await' expression``)."""
    if inspect.isasyncgen(returned) or inspect.isgenerator(returned):
        return ContractError(f"tool {tool!r}: execute is a generator (it has 'yield'), so its body never runs",
                             code="invalid_result", hint="return the result from execute instead of yielding it")
    return ContractError(
        f"tool {tool!r}: execute returned {type(returned).__name__}, not an awaitable (execute must be 'async def')",
        code="invalid_result",
        hint="declare execute with 'async def'; a plain function can be mounted with @tool, which runs it in a thread",
    )


def _passes(exc: BaseException) -> bool:
    """Whether what a tool raised leaves the run as it is: a ``KeyboardInterrupt`` (the user's,
    not the tool's), and a ``CancelledError`` while the call's task is being cancelled.

    Anything else is the tool's failure, the exceptions that are no ``Exception`` too: a
    ``GeneratorExit`` or a library's own ``BaseException`` (found by attack: it left ``host.call``
    with no ``tool_complete`` and no record), a ``SystemExit`` (``tool_exited``), and a
    ``CancelledError`` the tool raised while nobody cancelled the call — a task or future it
    awaited was cancelled by someone else (found by attack: it cancelled the caller's own task;
    hooks were treated so already). Before Python 3.11 a task cannot tell, and every
    ``CancelledError`` counts as a cancellation (``being_cancelled``)."""
    if isinstance(exc, asyncio.CancelledError):
        return being_cancelled()
    return isinstance(exc, KeyboardInterrupt) or thrown_in(exc)  # thrown_in: the caller's frame is being closed


def _cause(exc: BaseException) -> BaseException | None:
    """What a run's ``ToolError`` is chained to: the tool's exception, none for a timeout."""
    return None if isinstance(exc, TimeLimitExceeded) else exc


def _withhold_retry_reasons(ctx: ToolContext) -> None:
    """The trail's notes of retried attempts quote each attempt's error, which may quote what the
    tool returned: withheld with the output when a plugin denied it (found by attack: a ``Pure``
    tool's retried failures kept the denied text in the trail and the audit record)."""
    for index, decision in enumerate(ctx.trail):
        if decision.plugin == "host" and decision.action == "retry" and decision.reason is not None:
            ctx.trail[index] = Decision(decision.plugin, decision.hook, decision.action,
                                        "withheld (a plugin denied the failed call's output)", decision.code,
                                        decision.details)


def _refused_call_id(problem: str) -> ContractError:
    """The error of a call whose caller-chosen id the host refuses (``models.identifier_problem``)."""
    return ContractError(f"call_id {problem}", code="invalid_call_id", field="call_id",
                         hint=f"pass a call id of 1 to {MAX_CALL_ID} printable ASCII characters that holds no "
                              "secret (such as a model's tool-call id, 'call_abc123'), or leave call_id unset "
                              "and the host makes one")


def _closing_error(message: str) -> ToolSystemError:
    return ToolSystemError(message, code="host_closing", hint="the host is shutting down (see shutdown_grace_ms)")


def _internal(exc: Exception) -> ToolSystemError:
    return ToolSystemError(f"internal error: {type(exc).__name__}: {exc}", cause=type(exc).__name__)


def _trail(ctx: ToolContext) -> list[Any]:
    """The call's decision trail as JSON data (cattrs is imported by the first call that has a decision,
    not by a host's start; an empty trail, the common case, needs no import statement per call)."""
    if not ctx.trail:
        return []
    from ._converter import converter

    return list(map(converter.unstructure, ctx.trail))  # no comprehension: it would make ``converter`` a cell
