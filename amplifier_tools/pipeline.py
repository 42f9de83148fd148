"""The call loop: one place where a call goes through every stage, in order.

    look up tool -> check JSON + input schema -> tool_pre chain -> resolve secrets
    -> execute under the deadline -> normalize -> check output schema
    -> tool_post chain            (success)
    -> tool_error hooks           (any failure; may recover)
    -> tool_complete observers    (always, once, with the final result)

It never raises: every failure, including a bug in a plugin or in the host,
ends as a failed ``ToolResult`` with a typed error. It must never let output
that failed its checks, or a resolved secret value, reach the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .converter import converter
from .dispatch import HookDispatcher, run_with_timeout
from .errors import ContractError, PolicyError, ToolError, ToolSystemError
from .models import ToolCall, ToolContext, ToolResult
from .redaction import redact
from .registry import MountedTool, ToolRegistry
from .results import error_dict, error_from_exception, error_from_result, normalize_result
from .retry import retry_allowed, run_with_retries
from .schema import check_json_data

log = logging.getLogger("amplifier_tools")


class CallPipeline:
    """Runs calls against a tool registry through a hook dispatcher."""

    def __init__(self, tools: ToolRegistry, hooks: HookDispatcher, *, default_timeout: float | None) -> None:
        self.tools = tools
        self.hooks = hooks
        self.default_timeout = default_timeout

    async def run(self, call: ToolCall, context: ToolContext) -> ToolResult:
        """Run ``call`` to its final ``ToolResult``. Never raises (except cancellation)."""
        started = time.perf_counter()
        ctx = context.for_call(call.id)
        mounted = self.tools.resolve(call.name) if isinstance(call.name, str) else None
        secrets: tuple[str, ...] = ()
        kept_output: Any = None
        events = self.hooks.has_event_observers()
        try:
            if mounted is None:
                raise self._unknown_tool(call.name)
            spec = mounted.spec
            if call.name != spec.name:  # hooks and records always see the canonical name
                call = ToolCall(call.id, spec.name, call.arguments)
            _check_arguments(call.arguments, mounted)
            if events:
                await self.hooks.tool_event("tool:pre", {"tool_name": spec.name, "input": call.arguments})
            call = await self.hooks.tool_pre(
                call, spec, ctx, lambda args, plugin: _check_arguments(args, mounted, plugin)
            )
            secrets = tuple(ctx.secret(ref) for ref in spec.security.secret_refs)
            if retry_allowed(spec, ctx):
                try:
                    result = await self._execute_with_retries(mounted, call, ctx)
                except ToolError as failed:
                    kept_output = failed.details.pop("output", None)
                    raise
            else:
                result = await self._execute(mounted, call, ctx)
                if not result.success:
                    kept_output = result.output
                    raise error_from_result(result, spec.name)
            mounted.check_output(result.output)
        except ToolError as error:
            return await self._fail(call, mounted, ctx, error, started, secrets, kept_output, events)
        except Exception as exc:  # a host bug must still end as a typed result
            log.exception("unexpected failure running %r", call.name)
            internal = ToolSystemError(f"internal error: {type(exc).__name__}: {exc}", cause=type(exc).__name__)
            return await self._fail(call, mounted, ctx, internal, started, secrets, kept_output, events)

        result = ToolResult(True, result.output, None, result.metadata, call.id)
        if secrets:
            result = ToolResult(True, redact(result.output, secrets=secrets, patterns=False), None,
                                result.metadata, call.id)

        def revalidate(replacement: ToolResult, plugin: str) -> ToolResult:
            if replacement.success:
                try:
                    mounted.check_output(replacement.output, plugin=plugin)
                except ContractError as exc:
                    return self._failure_result(call, mounted, ctx, exc, secrets)
            return replacement

        result = await self.hooks.tool_post(
            call, spec, result, ctx, revalidate,
            lambda error: self._failure_result(call, mounted, ctx, error, secrets),
        )
        if events:
            await self.hooks.tool_event("tool:post", {"tool_name": spec.name, "result": converter.unstructure(result)})
        return await self._complete(call, mounted, ctx, result, started, secrets)

    async def _execute(self, mounted: MountedTool, call: ToolCall, ctx: ToolContext) -> ToolResult:
        timeout = mounted.spec.policies.timeout_ms
        seconds = timeout / 1000.0 if timeout is not None else self.default_timeout
        remaining = ctx.remaining()
        if remaining is not None:
            if remaining <= 0:
                raise PolicyError(
                    f"deadline passed before tool {mounted.spec.name!r} could run", code="deadline_exceeded"
                )
            seconds = remaining if seconds is None else min(seconds, remaining)
        coro = mounted.execute(call.arguments, ctx) if mounted.takes_context else mounted.execute(call.arguments)
        try:
            raw = await run_with_timeout(coro, seconds)
        except TimeoutError:
            raise PolicyError(
                f"tool {mounted.spec.name!r} timed out after {seconds:.3g} s",
                code="timeout",
                retryable=mounted.spec.effect.retry_safe,
                timeout_s=seconds,
            ) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise error_from_exception(exc, mounted.spec.name) from exc
        return normalize_result(raw, mounted.spec.name)

    async def _execute_with_retries(self, mounted: MountedTool, call: ToolCall, ctx: ToolContext) -> ToolResult:
        """``_execute`` under the spec's retry policy; the result reports ``attempts``.

        The output of a tool-reported failure is kept on the error raised after the last attempt.
        """
        spec = mounted.spec

        async def attempt() -> ToolResult:
            outcome = await self._execute(mounted, call, ctx)
            if not outcome.success:
                error = error_from_result(outcome, spec.name)
                error.details.setdefault("output", outcome.output)
                raise error
            return outcome

        def note(number: int, error: ToolError) -> None:
            ctx.record("host", "execute", "retry", error.message, code=error.code, attempt=number)

        result, attempts = await run_with_retries(attempt, spec, ctx, note)
        return ToolResult(True, result.output, None, {**result.metadata, "attempts": attempts}, call.id)

    def _unknown_tool(self, name: Any) -> ContractError:
        if not isinstance(name, str):
            return ContractError(f"tool name must be a string, got {type(name).__name__}", code="unknown_tool")
        hint = self.tools.suggest(name)
        suffix = f"; did you mean {', '.join(map(repr, hint))}?" if hint else ""
        return ContractError(f"unknown tool {name!r}{suffix}", code="unknown_tool", tool_name=name)

    def _failure_result(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, error: ToolError,
        secrets: tuple[str, ...], output: Any = None,
    ) -> ToolResult:
        tool = mounted.spec.name if mounted is not None else None
        if output is not None and secrets:
            output = redact(output, secrets=secrets, patterns=False)
        return ToolResult(False, output, error_dict(error, tool=tool, context=ctx, secrets=secrets), {}, call.id)

    async def _fail(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, error: ToolError,
        started: float, secrets: tuple[str, ...], output: Any, events: bool,
    ) -> ToolResult:
        spec = mounted.spec if mounted is not None else None
        result = self._failure_result(call, mounted, ctx, error, secrets, output)
        recovery = await self.hooks.tool_error(call, spec, error, ctx)
        if recovery is not None:
            result = ToolResult(recovery.success, recovery.output, recovery.error, dict(recovery.metadata), call.id)
        if events:
            await self.hooks.tool_event("tool:error", {"tool_name": call.name, "error": result.error})
        return await self._complete(call, mounted, ctx, result, started, secrets)

    async def _complete(
        self, call: ToolCall, mounted: MountedTool | None, ctx: ToolContext, result: ToolResult,
        started: float, secrets: tuple[str, ...],
    ) -> ToolResult:
        metadata = dict(result.metadata)
        metadata["trail"] = [converter.unstructure(decision) for decision in ctx.trail]
        metadata["duration_ms"] = (time.perf_counter() - started) * 1000.0
        result = ToolResult(result.success, result.output, result.error, metadata, call.id)
        spec = mounted.spec if mounted is not None else None
        recorded = len(ctx.trail)
        error = await self.hooks.tool_complete(call, spec, result, ctx)
        if error is None and len(ctx.trail) != recorded:  # observers recorded decisions: the caller sees them
            metadata = {**metadata, "trail": [converter.unstructure(decision) for decision in ctx.trail]}
            result = ToolResult(result.success, result.output, result.error, metadata, call.id)
        elif error is not None:  # an observer failed closed: withhold the output
            metadata["trail"] = [converter.unstructure(decision) for decision in ctx.trail]
            # A call that already failed keeps its first error; a success becomes this failure.
            failure = result.error if not result.success else self._failure_result(
                call, mounted, ctx, error, secrets).error
            result = ToolResult(False, None, failure, metadata, call.id)
        return result


def _check_arguments(arguments: Any, mounted: MountedTool, plugin: str | None = None) -> None:
    if not isinstance(arguments, dict):
        who = f"plugin {plugin!r} rewrote " if plugin else ""
        raise ContractError(
            f"{who}arguments for tool {mounted.spec.name!r} must be a JSON object, got {type(arguments).__name__}",
            code="invalid_input",
            pointer="",
            plugin=plugin,
        )
    try:
        check_json_data(arguments)
    except ContractError as exc:
        raise ContractError(
            f"arguments for tool {mounted.spec.name!r} are not JSON data: {exc.message}",
            code="invalid_json",
            pointer=exc.details.get("pointer", ""),
            plugin=plugin,
        ) from None
    mounted.check_input(arguments, plugin=plugin)
