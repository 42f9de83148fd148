"""Attack (fuzz38): a seeded random driver for the exactly-once promise.

DESIGN "Completion, cancellation and close"; docs/design.md "The completion invariant". One host
with the built-in policy (concurrency, rate limit, budget, retry, timeout) and audit plugins, tools
of random behaviour, random hooks (sync/async; raising, Deny/Modify, timing out, swallowing the
cancellation), many concurrent calls under random cancellation (task.cancel, wait_for,
asyncio.timeout, TaskGroup siblings) and a random close(). Checked: one audit record, one
tool_complete, one of post/error per call that reached the host; every caller got a result, or
CancelledError/TimeoutError only if it was cancelled; nothing held by the policy plugin after
close; no task left; no "never retrieved"/"destroyed" loop errors.

The extended runs (``Extension``) add, from a random generator of their own: tight rate limits
(queued or not) beside concurrency caps, small budgets, a circuit breaker, shorter tool timeouts;
the audit log with fsync "always" / "interval"; close(grace_ms=...); an Amplifier hook module
(handlers that deny, modify, ask for approval, raise, time out or swallow their cut; an approval
hook and a tool_complete observer of the same kinds); hook plugins and handlers registered and
unregistered while calls run; calls made with a context (idempotency keys a few calls share) and
through ``execute`` as well as through ``call``'s fast path.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import EVENT_LOOPS, ToolsPlugin, run_on

from amplifier_tools import (
    Deny,
    ExecutionError,
    Modify,
    ToolCall,
    ToolContext,
    ToolHost,
    ToolResult,
    ToolSpec,
    hookimpl,
)

HOOK_TIMEOUT_MS = 80
TRACE: dict[str, list[Any]] = {}

POLICIES: dict[str, Any] = {
    "timeout_ms": 150,
    "concurrency": {"limit": 3, "queue": True},
    "rate_limit": {"limit": 100000, "interval_ms": 3_600_000},
    "budgets": [{"per": "principal", "max_calls": 100000, "max_seconds": 100000, "window_ms": 3_600_000}],
}


def _rng_for(seed: int, *parts: Any) -> random.Random:
    return random.Random(f"{seed}:" + ":".join(map(str, parts)))


class Tool:
    """Behaviour chosen by the call's ``plan`` argument."""

    def __init__(self, name: str, *, retry: bool) -> None:
        self.name = name
        self.description = f"fuzz tool {name}"
        policies = dict(POLICIES)
        if retry:
            policies["retry"] = {"max_attempts": 3, "initial_backoff_ms": 1, "max_backoff_ms": 2, "jitter": False}
        self.policies = policies
        self.spec = ToolSpec(name=name, description=self.description, effect="Pure", policies=policies)
        self.attempts: Counter[str] = Counter()
        self.running = 0
        self.children: list[asyncio.Task[Any]] = []

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        call = input.get("id", "")
        self.attempts[call] += 1
        self.running += 1
        try:
            plan = input.get("plan", "return")
            if plan == "return":
                return ToolResult(True, "ok")
            if plan == "sleep":
                await asyncio.sleep(input.get("s", 0.01))
                return ToolResult(True, "slept")
            if plan == "raise":
                await asyncio.sleep(0)
                raise RuntimeError("tool broke")
            if plan == "flaky":
                await asyncio.sleep(0.001)
                if self.attempts[call] == 1:
                    raise ExecutionError("first fails", code="backend_down", retryable=True)
                return ToolResult(True, "second")
            if plan == "ignore":  # ignores cancellation for a bounded while
                loop = asyncio.get_running_loop()
                end = loop.time() + input.get("s", 0.02)
                cancelled = False
                while loop.time() < end:
                    try:
                        await asyncio.sleep(0.002)
                    except asyncio.CancelledError:
                        cancelled = True
                if cancelled and input.get("reraise"):
                    raise asyncio.CancelledError
                return ToolResult(True, "ignored")
            if plan == "spawn":  # spawns a child, awaits it, cancels it on the way out
                child = asyncio.ensure_future(asyncio.sleep(input.get("s", 0.01)))
                self.children.append(child)
                try:
                    await child
                finally:
                    child.cancel()
                return ToolResult(True, "spawned")
            if plan == "gather":
                await asyncio.gather(asyncio.sleep(0.003), asyncio.sleep(input.get("s", 0.01)))
                return ToolResult(True, "gathered")
            if plan == "long":  # cut by the tool's own timeout_ms
                await asyncio.sleep(5)
                return ToolResult(True, "long")
            raise AssertionError(plan)
        finally:
            self.running -= 1


class Counting:
    name = "counting"

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self.completed: dict[str, ToolResult] = {}

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: Any) -> None:
        self.seen["tool_pre", call.id] += 1

    @hookimpl(tryfirst=True)
    def tool_post(self, call: Any) -> None:
        self.seen["tool_post", call.id] += 1

    @hookimpl(tryfirst=True)
    def tool_error(self, call: Any) -> None:
        self.seen["tool_error", call.id] += 1

    @hookimpl
    def tool_complete(self, call: Any, result: ToolResult) -> None:
        self.seen["tool_complete", call.id] += 1
        TRACE.setdefault(call.id, []).append(("complete", asyncio.get_running_loop().time()))
        self.completed[call.id] = result


async def _hook_behaviour(rng: random.Random, hook: str, call: Any) -> Any:
    kind = rng.choice(["none", "none", "sleep", "raise", "swallow", "timeout", "special"])
    TRACE.setdefault(call.id, []).append(("async", hook, kind, asyncio.get_running_loop().time()))
    if kind == "none":
        return None
    if kind == "sleep":
        await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
        return None
    if kind == "raise":
        await asyncio.sleep(0)
        raise RuntimeError(f"{hook} broke")
    if kind == "swallow":
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            await asyncio.sleep(0.002)
        return None
    if kind == "timeout":
        await asyncio.sleep(HOOK_TIMEOUT_MS / 1000 * 3)
        return None
    # special
    if hook == "tool_pre":
        return Deny("denied by fuzz") if rng.random() < 0.5 else Modify({**call.arguments, "plan": "return"})
    if hook == "tool_post":
        return ToolResult(True, "replaced")
    if hook == "tool_error":
        return ToolResult(True, "recovered")
    return None


def _sync_behaviour(rng: random.Random, hook: str, call: Any) -> Any:
    kind = rng.choice(["none", "none", "raise", "special"])
    TRACE.setdefault(call.id, []).append(("sync", hook, kind))
    if kind == "raise":
        raise RuntimeError(f"sync {hook} broke")
    if kind == "special":
        if hook == "tool_pre":
            return Deny("denied") if rng.random() < 0.5 else Modify({**call.arguments, "plan": "return"})
        if hook == "tool_post":
            return ToolResult(True, "replaced")
        if hook == "tool_error":
            return ToolResult(True, "recovered")
    return None


class AsyncHooks:
    name = "fuzz_async"

    def __init__(self, seed: int, rate: float) -> None:
        self.seed, self.rate = seed, rate

    def _rng(self, hook: str, call: Any) -> random.Random | None:
        rng = _rng_for(self.seed, "async", hook, call.id)
        return rng if rng.random() < self.rate else None

    @hookimpl
    async def tool_pre(self, call: Any) -> Any:
        rng = self._rng("tool_pre", call)
        return await _hook_behaviour(rng, "tool_pre", call) if rng else None

    @hookimpl
    async def tool_post(self, call: Any) -> Any:
        rng = self._rng("tool_post", call)
        return await _hook_behaviour(rng, "tool_post", call) if rng else None

    @hookimpl
    async def tool_error(self, call: Any) -> Any:
        rng = self._rng("tool_error", call)
        return await _hook_behaviour(rng, "tool_error", call) if rng else None


class SyncHooks:
    name = "fuzz_sync"

    def __init__(self, seed: int, rate: float) -> None:
        self.seed, self.rate = seed, rate

    def _rng(self, hook: str, call: Any) -> random.Random | None:
        rng = _rng_for(self.seed, "sync", hook, call.id)
        return rng if rng.random() < self.rate else None

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> Any:
        rng = self._rng("tool_pre", call)
        return _sync_behaviour(rng, "tool_pre", call) if rng else None

    @hookimpl(trylast=True)
    def tool_post(self, call: Any) -> Any:
        rng = self._rng("tool_post", call)
        return _sync_behaviour(rng, "tool_post", call) if rng else None

    @hookimpl(trylast=True)
    def tool_error(self, call: Any) -> Any:
        rng = self._rng("tool_error", call)
        return _sync_behaviour(rng, "tool_error", call) if rng else None


PLANS = ["return", "sleep", "raise", "flaky", "ignore", "spawn", "gather", "long"]


def _amp_behaviour(rng: random.Random, event: str, data: dict[str, Any]) -> Any:
    """What one Amplifier handler answers for one call (sync part; ``None`` when it suspends)."""
    kind = rng.choice(["continue", "continue", "none", "deny", "modify", "inject", "ask", "raise",
                       "unreadable", "sleep", "hang", "swallow"])
    TRACE.setdefault(str(data.get("tool_call_id")), []).append(("amp", event, kind))
    if kind == "continue":
        return {"action": "continue"}
    if kind == "deny":
        return {"action": "deny", "reason": "fuzz handler denies"}
    if kind == "modify":
        if event == "tool:pre":
            return {"action": "modify", "data": {"tool_input": {**data.get("tool_input", {}), "plan": "return"}}}
        return {"action": "modify", "data": {"tool_result": {"success": True, "output": "amp"}}}
    if kind == "inject":
        return {"action": "inject_context", "context_injection": "fuzz note"}
    if kind == "ask":
        return {"action": "ask_user", "approval_prompt": "run it?"}
    if kind == "raise":
        raise RuntimeError(f"handler for {event} broke")
    if kind == "unreadable":
        return {"action": "explode"}
    return kind  # "none", or one of the suspending kinds (handled by the async handler)


class AmplifierModule:
    """A seed-style hook module: Amplifier handlers on ``coordinator.hooks`` (registered at mount,
    and more of them while calls run), an approval hook behind ``ask_user``, and an async
    ``tool_complete`` observer that suspends or raises."""

    name = "fuzz_amp"

    def __init__(self, seed: int, rate: float) -> None:
        self.seed, self.rate = seed, rate
        self.coordinator: Any = None
        self.handlers = 0

    @hookimpl
    def mount(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        for event in ("tool:pre", "tool:post", "tool:error"):
            self.add(event)

    def add(self, event: str) -> Callable[[], None]:
        self.handlers += 1
        name = f"h{self.handlers}"
        if self.handlers % 2:
            def handler(event: str, data: dict[str, Any]) -> Any:
                rng = _rng_for(self.seed, "amp", name, data.get("tool_call_id"))
                if rng.random() >= self.rate:
                    return None
                out = _amp_behaviour(rng, event, data)
                return None if isinstance(out, str) else out
        else:
            async def handler(event: str, data: dict[str, Any]) -> Any:  # type: ignore[misc]
                rng = _rng_for(self.seed, "amp", name, data.get("tool_call_id"))
                if rng.random() >= self.rate:
                    return None
                out = _amp_behaviour(rng, event, data)
                if out == "sleep":
                    await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
                elif out == "hang":
                    await asyncio.sleep(HOOK_TIMEOUT_MS / 1000 * 3)
                elif out == "swallow":
                    try:
                        await asyncio.sleep(0.01)
                    except asyncio.CancelledError:
                        await asyncio.sleep(0.002)
                return None if isinstance(out, str) else out
        unregister: Callable[[], None] = self.coordinator.hooks.register(event, handler, priority=self.handlers % 3,
                                                                         name=name)
        return unregister

    @hookimpl
    async def tool_approval(self, call: Any) -> bool:
        rng = _rng_for(self.seed, "approval", call.id)
        kind = rng.choice(["yes", "yes", "no", "raise", "sleep", "hang"])
        TRACE.setdefault(call.id, []).append(("approval", kind))
        if kind == "raise":
            raise RuntimeError("approval broke")
        if kind == "sleep":
            await asyncio.sleep(0.005)
        if kind == "hang":
            await asyncio.sleep(HOOK_TIMEOUT_MS / 1000 * 3)
        return kind != "no"

    @hookimpl
    async def tool_complete(self, call: Any) -> None:
        rng = _rng_for(self.seed, "complete", call.id)
        kind = rng.choice(["none", "none", "sleep", "raise"])
        if kind == "sleep":
            await asyncio.sleep(rng.choice([0, 0.002]))
        elif kind == "raise":
            raise RuntimeError("observer broke")


class Extension:
    """The extended run's dimensions (test_fuzz_exactly_once_extended): tight rate limits with
    queueing beside concurrency caps (queued or not), small budgets, a circuit breaker, shorter
    tool timeouts; the audit log in every fsync mode (``always``: the shared fsync awaited by the
    call); ``close(grace_ms=...)``; an Amplifier hook module (``AmplifierModule``); and hook
    plugins and Amplifier handlers registered and unregistered while calls run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = rng = _rng_for(seed, "ext")
        self.audit = {"fsync": rng.choice(["never", "interval", "always", "always"]),
                      "fsync_interval_ms": rng.choice([1, 20, 100])}
        self.close_grace_ms: float | None = rng.choice([None, None, 0, 5, 50])
        self.amp = AmplifierModule(seed, rng.choice([0.0, 0.2, 0.5])) if rng.random() < 0.8 else None
        self.late_rate = rng.choice([0.0, 0.1, 0.3])
        self.idempotent_rate = rng.choice([0.0, 0.3, 0.7])
        self.handles: list[asyncio.TimerHandle] = []
        self.late: list[tuple[str, Any]] = []
        self.chosen: list[dict[str, Any]] = []

    def policies(self, base: dict[str, Any]) -> dict[str, Any]:
        rng = self.rng
        policies = {**base, "timeout_ms": rng.choice([50, 150, 400]),
                    "concurrency": {"limit": rng.choice([1, 2, 3]), "queue": rng.random() < 0.7}}
        if rng.random() < 0.6:
            policies["rate_limit"] = {"limit": rng.choice([2, 5, 20]), "interval_ms": rng.choice([20, 100, 500]),
                                      "queue": rng.random() < 0.6}
        if rng.random() < 0.3:
            policies["budgets"] = [{"per": "principal", "max_calls": rng.choice([10, 30, 1000]),
                                    "max_seconds": rng.choice([0.2, 1, 100]), "window_ms": rng.choice([100, 1000])}]
        if rng.random() < 0.3:
            policies["circuit_breaker"] = {"failure_threshold": rng.choice([2, 5]), "window_ms": 1000,
                                           "cooldown_ms": rng.choice([5, 50])}
        self.chosen.append(policies)
        return policies

    def plugins(self) -> list[Any]:
        return [self.amp] if self.amp is not None else []

    async def call(self, host: ToolHost, name: str, args: dict[str, Any], cid: str) -> ToolResult:
        """The call by one of the host's ways in: ``call`` (its fast path), ``call`` with a
        context, or ``execute``; with a context, maybe an idempotency key a few calls share."""
        rng = _rng_for(self.seed, "entry", cid)
        entry = rng.choice(["call", "call", "context", "execute"])
        if entry == "call":
            return await host.call(name, args, call_id=cid)
        key = f"key{rng.randrange(4)}" if rng.random() < self.idempotent_rate else None
        context = ToolContext(idempotency_key=key)
        if entry == "context":
            return await host.call(name, args, call_id=cid, context=context)
        return await host.execute(ToolCall(cid, name, args), context)

    def meanwhile(self, host: ToolHost, cid: str) -> None:
        """Maybe register (or unregister) a hook plugin or an Amplifier handler a little later."""
        rng = _rng_for(self.seed, "late", cid)
        if rng.random() >= self.late_rate:
            return
        what = rng.choice(["plugin", "plugin", "handler", "unregister"])

        def act() -> None:
            if what == "plugin":
                late = AsyncHooks(self.seed + 7919, 0.5)
                late.name = f"late_{cid}"  # type: ignore[misc]
                host.plugin_manager.register(late, name=late.name)
                self.late.append(("plugin", late))
            elif what == "handler" and self.amp is not None and self.amp.coordinator is not None:
                self.late.append(("handler", self.amp.add(rng.choice(["tool:pre", "tool:post", "tool:error"]))))
            elif what == "unregister" and self.late:
                kind, item = self.late.pop(rng.randrange(len(self.late)))
                if kind == "plugin":
                    host.plugin_manager.unregister(item)
                else:
                    item()

        self.handles.append(asyncio.get_running_loop().call_later(rng.choice([0, 0.001, 0.005, 0.02]), act))

    async def settle(self) -> None:
        for handle in self.handles:
            handle.cancel()
        await asyncio.sleep(0)

    def describe(self) -> dict[str, Any]:
        return {"audit": self.audit, "close_grace_ms": self.close_grace_ms, "amp": self.amp and self.amp.rate,
                "late_rate": self.late_rate, "idempotent_rate": self.idempotent_rate, "policies": self.chosen}


class Outcome:
    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.reached = False  # the call's coroutine began
        self.cancelled = False  # the caller (or its scope) cancelled it
        self.value: ToolResult | BaseException | None = None


async def scenario(seed: int, tmp_path: Path, n_calls: int = 40, extended: bool = False) -> dict[str, Any]:
    """One seeded run; ``extended`` adds the dimensions of ``Extension`` (drawn from a random
    generator of their own, so a seed's base run is the same either way)."""
    rng = random.Random(seed)
    TRACE.clear()
    ext = Extension(seed) if extended else None
    tools = [Tool("fz_plain", retry=False), Tool("fz_retry", retry=True)]
    if ext is not None:
        for tool in tools:
            tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                                 policies=ext.policies(tool.policies))
    counting = Counting()
    plugins: list[Any] = [ToolsPlugin(*tools), counting,
                          AsyncHooks(seed, rng.choice([0.0, 0.2, 0.5])), SyncHooks(seed, rng.choice([0.0, 0.1, 0.3]))]
    grace = rng.choice([0, 5, 30, 200])
    config: dict[str, Any] = {"shutdown_grace_ms": grace, "hook_timeout_ms": HOOK_TIMEOUT_MS,
                              "plugins": {"audit": {"fsync": "never"}}}
    if ext is not None:
        plugins += ext.plugins()
        config["plugins"]["audit"] = ext.audit
    host = ToolHost(config=config, plugins=plugins, builtins=["policy", "audit"], entry_points=False,
                    working_dir=tmp_path, discover=False)
    await host.start()
    policy = host.plugin_manager.get_plugin("policy")
    loop = asyncio.get_running_loop()
    loop_errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: loop_errors.append(context))
    close_started = asyncio.Event()
    outcomes: list[Outcome] = []

    async def one_call(out: Outcome, tool: Tool, args: dict[str, Any]) -> ToolResult:
        out.reached = True
        if ext is not None:
            return await ext.call(host, tool.name, args, out.call_id)
        return await host.call(tool.name, args, call_id=out.call_id)

    def args_for(cid: str) -> dict[str, Any]:
        plan = rng.choice(PLANS)
        args: dict[str, Any] = {"id": cid, "plan": plan, "s": rng.choice([0.001, 0.01, 0.03])}
        if plan == "ignore":
            args["reraise"] = rng.random() < 0.3
        return args

    async def driver(i: int) -> None:
        await asyncio.sleep(rng.random() * 0.05)
        cid = f"s{seed}-c{i}"
        out = Outcome(cid)
        outcomes.append(out)
        tool = rng.choice(tools)
        args = args_for(cid)
        out.args = args  # type: ignore[attr-defined]
        mode = rng.choice(["plain", "cancel", "cancel2", "wait_for", "timeout", "taskgroup"])
        if mode in ("timeout", "taskgroup") and sys.version_info < (3, 11):
            mode = "wait_for"
        delay = rng.choice([0, 0, 0.001, 0.005, 0.02, 0.05])
        if ext is not None:
            ext.meanwhile(host, cid)
        try:
            if mode == "plain":
                out.value = await one_call(out, tool, args)
            elif mode in ("cancel", "cancel2"):
                task = asyncio.ensure_future(one_call(out, tool, args))
                k = rng.randrange(0, 6)
                for _ in range(k):
                    await asyncio.sleep(0)
                if delay:
                    await asyncio.sleep(delay)
                if not task.done():
                    out.cancelled = True
                    task.cancel()
                    if mode == "cancel2":
                        await asyncio.sleep(0)
                        task.cancel()
                try:
                    out.value = await task
                except asyncio.CancelledError as exc:
                    out.value = exc
            elif mode == "wait_for":
                try:
                    out.value = await asyncio.wait_for(one_call(out, tool, args), delay)
                except asyncio.TimeoutError as exc:
                    out.cancelled = True
                    out.value = exc
            elif mode == "timeout":
                try:
                    async with asyncio.timeout(delay):  # type: ignore[attr-defined]
                        out.value = await one_call(out, tool, args)
                except TimeoutError as exc:
                    out.cancelled = True
                    out.value = exc
            elif mode == "taskgroup":
                async def sibling() -> None:
                    await asyncio.sleep(delay)
                    out.cancelled = True  # may fail after the call ended: then it was not cancelled
                    raise ValueError("sibling")

                async def guarded() -> None:
                    try:
                        out.value = await one_call(out, tool, args)
                        out.cancelled = False if not out.cancelled else out.cancelled
                    except asyncio.CancelledError as exc:
                        out.value = exc
                        raise

                try:
                    async with asyncio.TaskGroup() as tg:  # type: ignore[attr-defined]
                        tg.create_task(guarded())
                        tg.create_task(sibling())
                except BaseException as exc:  # ExceptionGroup of the sibling's ValueError
                    if not isinstance(exc, Exception):
                        raise
        except Exception as exc:
            out.value = exc
        out.mode = mode  # type: ignore[attr-defined]
        out.t = asyncio.get_running_loop().time()  # type: ignore[attr-defined]

    drivers = [asyncio.ensure_future(driver(i)) for i in range(n_calls)]
    close_at = rng.choice([0.005, 0.02, 0.05, 0.1, None])
    if close_at is not None:
        await asyncio.sleep(close_at)
    else:
        await asyncio.gather(*drivers)
    close_started.set()
    TRACE.setdefault("close", []).append(("close start", loop.time()))
    close_task = asyncio.ensure_future(host.close() if ext is None or ext.close_grace_ms is None
                                       else host.close(grace_ms=ext.close_grace_ms))
    close_cancelled = False
    if rng.random() < 0.2:
        await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
        close_cancelled = close_task.cancel()
    try:
        await close_task
    except asyncio.CancelledError:
        pass
    if close_cancelled:  # a cancelled close() finishes its work before raising; close again to be sure
        await host.close()
    TRACE.setdefault("close", []).append(("close end", loop.time()))
    await asyncio.wait_for(asyncio.gather(*drivers), 10)
    if ext is not None:
        await ext.settle()
    for tool in tools:
        for child in tool.children:
            if not child.done():
                await asyncio.sleep(0)

    # -- checks -----------------------------------------------------------------
    records: Counter[str] = Counter()
    path = Path(host.capabilities["audit.path"])
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "call":
                records[record["call_id"]] += 1
    problems: list[str] = []
    for out in outcomes:
        cid, value = out.call_id, out.value
        closing_refusal = isinstance(value, ToolResult) and not value.success and \
            (value.error or {}).get("code") == "host_closing"
        if not out.reached:
            if records[cid]:
                problems.append(f"{cid}: never reached but recorded")
            continue
        if records[cid] != 1 and not (closing_refusal and records[cid] == 0):
            detail = (f"args={out.args} seen={[(k, v) for k, v in counting.seen.items() if k[1] == cid]} "  # type: ignore[attr-defined]
                      f"trace={TRACE.get(cid)} close={TRACE.get('close')} t={out.t}")  # type: ignore[attr-defined]
            problems.append(f"{cid} ({out.mode}): {records[cid]} audit records; value={value!r} {detail}")  # type: ignore[attr-defined]
        if records[cid] == 1:
            post_err = counting.seen["tool_post", cid] + counting.seen["tool_error", cid]
            if post_err != 1 or counting.seen["tool_complete", cid] != 1:
                problems.append(f"{cid}: post+error={post_err} complete={counting.seen['tool_complete', cid]}")
        if value is None:
            problems.append(f"{cid} ({out.mode}): caller got nothing")  # type: ignore[attr-defined]
        elif isinstance(value, (asyncio.CancelledError, asyncio.TimeoutError)) and not out.cancelled:
            problems.append(f"{cid} ({out.mode}): {type(value).__name__} but not cancelled")  # type: ignore[attr-defined]
        elif isinstance(value, BaseException) and not isinstance(value, (asyncio.CancelledError, asyncio.TimeoutError)):
            problems.append(f"{cid} ({out.mode}): raised {value!r}")  # type: ignore[attr-defined]
        elif isinstance(value, ToolResult) and (value.error or {}).get("code") == "cancelled":
            problems.append(f"{cid} ({out.mode}): a result with code cancelled")  # type: ignore[attr-defined]
    held = policy.held_resources()
    if any(held.values()):
        problems.append(f"held after close: {held}")
    for tool in tools:
        if tool.running:
            problems.append(f"{tool.name}: {tool.running} executions still running")
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    if pending:
        await asyncio.sleep(0.3)  # give stragglers (a tool ignoring cancellation) a moment
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
        if pending:
            problems.append(f"pending tasks after close: {pending!r}")
    gc.collect()
    await asyncio.sleep(0)
    for context in loop_errors:
        problems.append(f"loop error: {context.get('message')} {context.get('exception')!r}")
    return {"problems": problems, "grace": grace, "close_at": close_at, "close_cancelled": close_cancelled,
            "extension": ext.describe() if ext is not None else None}


def _run(loop_kind: str, seed: int, tmp_path: Path, caplog: pytest.LogCaptureFixture, n_calls: int = 40,
         extended: bool = False) -> None:
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        report = run_on(loop_kind, scenario(seed, tmp_path, n_calls, extended))
    bad = [r.getMessage() for r in caplog.records
           if "never retrieved" in r.getMessage() or "was destroyed" in r.getMessage()]
    problems = report["problems"] + bad
    assert not problems, (seed, loop_kind, report["grace"], report["close_at"], report["close_cancelled"],
                          report["extension"], problems)


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("seed", range(8))
def test_fuzz_exactly_once(tmp_path: Path, caplog: pytest.LogCaptureFixture, loop_kind: str, seed: int) -> None:
    _run(loop_kind, seed, tmp_path, caplog)


@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("seed", range(8))
def test_fuzz_exactly_once_extended(tmp_path: Path, caplog: pytest.LogCaptureFixture, loop_kind: str,
                                    seed: int) -> None:
    _run(loop_kind, seed, tmp_path, caplog, extended=True)


@pytest.mark.slow
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("seed", range(8, 200))
def test_fuzz_exactly_once_long(tmp_path: Path, caplog: pytest.LogCaptureFixture, loop_kind: str, seed: int) -> None:
    _run(loop_kind, seed, tmp_path, caplog, n_calls=60)


@pytest.mark.slow
@pytest.mark.parametrize("loop_kind", EVENT_LOOPS)
@pytest.mark.parametrize("seed", range(8, 200))
def test_fuzz_exactly_once_extended_long(tmp_path: Path, caplog: pytest.LogCaptureFixture, loop_kind: str,
                                         seed: int) -> None:
    _run(loop_kind, seed, tmp_path, caplog, n_calls=60, extended=True)


class _SlowTool:
    name = "slow"
    description = "sleeps"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(5)
        return ToolResult(True, "done")


class _SlowErrorHook:
    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    async def tool_error(self, call: Any) -> None:
        await asyncio.sleep(1)  # cut by its own hook timeout: a failure, the call goes on


async def test_close_waits_for_a_cut_call_whose_tool_error_hooks_use_their_timeouts(tmp_path: Path) -> None:
    """Found by fuzz38: close() waited one hook timeout for the cut calls to record themselves; two
    tool_error hooks each within its own hook timeout outlasted it, the audit writer was closed
    first and the call left no record (3.10, 3.11, 3.13)."""
    host = ToolHost(config={"hook_timeout_ms": 50, "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(_SlowTool()), _SlowErrorHook("e1"), _SlowErrorHook("e2")],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    path = Path(host.capabilities["audit.path"])
    task = asyncio.ensure_future(host.call("slow", {}, call_id="c1"))
    await asyncio.sleep(0.01)
    await host.close(grace_ms=0)
    result = await task
    assert result.error is not None and result.error["code"] == "host_closing"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    assert [r["call_id"] for r in records if r.get("kind") == "call"] == ["c1"]


@pytest.mark.slow  # ~10 s: calls arrive at every loop iteration until one lands in the window
async def test_a_call_arriving_while_close_wakes_from_its_wait_is_not_recorded_after_the_audit_closed(
        tmp_path: Path) -> None:
    """Found by fuzz38: a call that entered the pipeline in the loop iterations between close()'s
    wait for idle ending and the cleanups (refused as closing) ran tool_error and tool_complete
    after the audit writer's cleanup: "the audit log ... is closed", no record (3.10, 3.11, 3.13)."""
    counting = Counting()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(_SlowTool()), counting], builtins=["policy", "audit"],
                    entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    path = Path(host.capabilities["audit.path"])
    first = asyncio.ensure_future(host.call("slow", {}, call_id="first"))
    await asyncio.sleep(0.01)
    close = asyncio.ensure_future(host.close(grace_ms=0))
    late = []
    while not close.done():
        late.append(asyncio.ensure_future(host.call("slow", {}, call_id=f"late{len(late)}")))
        await asyncio.sleep(0)
    results = await asyncio.gather(first, *late)
    assert all(r.error is not None and r.error["code"] == "host_closing" for r in results)
    records = {json.loads(line)["call_id"] for line in path.read_text().splitlines()
               if json.loads(line).get("kind") == "call"}
    completed = {cid for (hook, cid), n in counting.seen.items() if hook == "tool_complete" and n}
    assert completed <= records, sorted(completed - records)
    assert all(counting.seen["tool_complete", cid] == 1 for cid in records)
