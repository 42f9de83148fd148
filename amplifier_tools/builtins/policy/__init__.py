"""The policy plugin: scopes, rules, idempotency, circuit breakers, budgets, rate limits, concurrency.

Uses only the public hooks. ``tool_pre`` decides in this order — scopes,
declarative rules, idempotency, circuit breaker, budgets, rate limit,
concurrency (the only step that may wait) — and records each decision in the
trail; ``tool_complete`` releases what the call held and counts its outcome;
``tool_error`` turns an idempotent replay into the stored result. Timeouts and
retries are enforced by the host's execution step from the same contract.

The policy values come from each tool's ``spec.policies`` and
``spec.security`` (overridable per tool in ``[tools."<name>"]``); the plugin's
own section holds ``rules``, ``default_action`` and ``idempotency_window_ms``.
State is per host process (see ``state.py`` for what a shared store needs).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ..._markers import hookimpl
from ...errors import ConfigError
from ...models import Deny, ToolCall, ToolContext, ToolResult
from ...spec import IdempotencyKeyRequirement, ToolSpec
from .breaker import CircuitBreaker
from .rules import Rule, matches, parse_rules
from .state import MemoryState, PolicyState, monotonic

PLUGIN: Final = "policy"
KEYS: Final = frozenset({"rules", "default_action", "idempotency_window_ms"})
COUNTED_FAILURES: Final = frozenset({"ExecutionError", "SystemError"})


class Slots:
    """A concurrency cap with a synchronous fast path (asyncio.Semaphore always needs an await)."""

    __slots__ = ("in_use", "limit", "waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        if self.in_use < self.limit and not self.waiters:
            self.in_use += 1
            return True
        return False

    async def acquire(self, timeout: float | None) -> bool:
        if self.try_acquire():
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            if waiter.done() and not waiter.cancelled():  # the slot arrived as the wait ended: give it back
                self.release()
            else:
                waiter.cancel()
                self.waiters.remove(waiter)
            return False
        return True

    def release(self) -> None:
        while self.waiters:  # hand the slot straight to the next waiter
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_use -= 1


class _Held:
    """What an admitted call holds until ``tool_complete``."""

    __slots__ = ("breaker", "budgets", "idempotency", "semaphore", "started")

    def __init__(self, started: float) -> None:
        self.semaphore: Slots | None = None
        self.breaker: CircuitBreaker | None = None
        self.budgets: list[tuple[str, int]] = []
        self.idempotency: tuple[str, str, asyncio.Future[ToolResult | None]] | None = None
        self.started = started


class PolicyPlugin:
    """Enforces every policy of the tool contract; one instance per host."""

    name = PLUGIN

    def __init__(self, *, clock: Callable[[], float] = monotonic,
                 sleep: Callable[[float], Any] = asyncio.sleep, state: PolicyState | None = None) -> None:
        self.clock = clock
        self.sleep = sleep
        self.state: PolicyState = state if state is not None else MemoryState()
        self.rules: list[Rule] = []
        self._deny_rules: list[Rule] = []
        self._allow_rules: list[Rule] = []
        self.default_action = "allow"
        self.idempotency_window = 24 * 3600.0
        self._slots: dict[str, Slots] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._held: dict[str, _Held] = {}
        self._in_flight: dict[str, asyncio.Future[ToolResult | None]] = {}
        self._replays: dict[str, ToolResult] = {}
        self._coordinator: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rate_keys: dict[str, str] = {}

    # -- lifecycle -------------------------------------------------------------

    @hookimpl
    def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        for key in config:
            if key not in KEYS:
                raise ConfigError(f"unknown key (expected one of {sorted(KEYS)})", key=f"plugins.{PLUGIN}.{key}")
        self.rules = parse_rules(config.get("rules", []), f"plugins.{PLUGIN}.rules")
        self._deny_rules = [rule for rule in self.rules if rule.action == "deny"]
        self._allow_rules = [rule for rule in self.rules if rule.action == "allow"]
        self.default_action = config.get("default_action", "allow")
        if self.default_action not in ("allow", "deny"):
            raise ConfigError("must be 'allow' or 'deny'", key=f"plugins.{PLUGIN}.default_action")
        window = config.get("idempotency_window_ms", 24 * 3600 * 1000)
        if not isinstance(window, (int, float)) or isinstance(window, bool) or window <= 0:
            raise ConfigError("must be a positive number", key=f"plugins.{PLUGIN}.idempotency_window_ms")
        self.idempotency_window = window / 1000.0
        self._coordinator = coordinator

    def _emit_soon(self, event: str, data: dict[str, Any]) -> None:
        """Deliver a state-change event without making the deciding hook wait for observers."""
        if self._coordinator is not None:
            task = asyncio.get_running_loop().create_task(self._coordinator.hooks.emit(event, data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- decisions ---------------------------------------------------------------

    @hookimpl
    def tool_pre(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """Decide synchronously when nothing has to wait; otherwise return a coroutine the host awaits."""
        missing = sorted(set(spec.security.required_scopes) - context.scopes) if spec.security.required_scopes \
            else None
        if missing:
            return Deny(f"missing scope {', '.join(map(repr, missing))} for {spec.name!r}", code="missing_scope",
                        details={"missing_scopes": missing}, category="AuthError")
        if self.rules or self.default_action != "allow":
            denied = self._check_rules(call, spec, context)
            if denied is not None:
                return denied
        policies = spec.policies
        if context.idempotency_key is not None or spec.idempotency_key is IdempotencyKeyRequirement.required:
            return self._pre_waiting(call, spec, context, _Held(self.clock()), idempotency=True)
        if policies.circuit_breaker is None and not policies.budgets and policies.rate_limit is None \
                and policies.concurrency is None:
            return None
        held = _Held(self.clock())
        verdict = self._breaker(call, spec, context, held) if policies.circuit_breaker is not None else None
        if verdict is None and policies.budgets:
            verdict = self._budgets(call, spec, context, held)
        if verdict is not None:
            self._release(held, failed=None)
            return verdict
        verdict = self._rate_limit_now(spec, context)
        if verdict is not None:
            if not self._may_queue(spec, context, verdict):
                self._release(held, failed=None)
                return verdict
            return self._pre_waiting(call, spec, context, held, idempotency=False, from_rate_limit=True)
        if policies.concurrency is not None:
            slots = self._slots.get(spec.name)
            if slots is None:
                slots = self._slots[spec.name] = Slots(policies.concurrency.limit)
            if not slots.try_acquire():
                return self._pre_waiting(call, spec, context, held, idempotency=False, from_concurrency=True)
            held.semaphore = slots
        self._held[call.id] = held
        return None

    async def _pre_waiting(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held, *,
                           idempotency: bool, from_rate_limit: bool = False, from_concurrency: bool = False,
                           ) -> Deny | None:
        """The slow path: idempotency waits, queued rate limits, queued concurrency slots."""
        if idempotency:
            verdict = await self._idempotency(call, spec, context, held)
            if verdict is not None:
                return verdict
            for check in (self._breaker, self._budgets):
                verdict = check(call, spec, context, held)
                if verdict is not None:
                    self._release(held, failed=None)
                    return verdict
        if idempotency or from_rate_limit:
            verdict = await self._rate_limit(spec, context)
            if verdict is not None:
                self._release(held, failed=None)
                return verdict
        if spec.policies.concurrency is not None:
            verdict = await self._concurrency(spec, context, held)
            if verdict is not None:
                self._release(held, failed=None)
                return verdict
        self._held[call.id] = held
        return None

    def _check_rules(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Deny | None:
        """Any matching deny rule denies, whatever its position: the first matching deny (in config order)
        is the one reported. Allow rules never cancel a deny; they only matter under
        ``default_action = "deny"``, where a call that no allow rule matches is denied."""
        if not self.rules and self.default_action == "allow":
            return None
        path_rules = self._coordinator.get_capability("fs.path_rules") if self._coordinator else None
        principal, role, environment = context.principal, context.role, context.environment
        for rule in self._deny_rules:
            if matches(rule, spec.name, call.arguments, principal, role, environment, path_rules):
                return Deny(f"denied by rule {rule.name!r}: {rule.reason}", code="rule_denied",
                            details={"rule": rule.name})
        for rule in self._allow_rules:
            if matches(rule, spec.name, call.arguments, principal, role, environment, path_rules):
                context.record(PLUGIN, "tool_pre", "allow", f"allowed by rule {rule.name!r}", rule=rule.name)
                return None
        if self.default_action == "deny":
            return Deny("no rule allows this call (default_action = 'deny')", code="rule_denied",
                        details={"rule": "default"})
        return None

    async def _idempotency(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        key = context.idempotency_key
        if key is None:
            if spec.idempotency_key is IdempotencyKeyRequirement.required:
                return Deny(f"{spec.name!r} requires an idempotency key", code="idempotency_key_required",
                            category="ContractError")
            return None
        digest = hashlib.sha256(json.dumps(call.arguments, sort_keys=True, default=str).encode()).hexdigest()
        slot = f"idem:{spec.name}:{key}"
        while True:
            stored = self.state.recall(slot, self.clock())
            if stored is not None:
                stored_digest, result = stored
                if stored_digest != digest:
                    return Deny(f"idempotency key {key!r} was used with different arguments",
                                code="idempotency_conflict", category="ContractError")
                self._replays[call.id] = result
                return Deny(f"replayed the result stored for idempotency key {key!r}", code="idempotent_replay")
            running = self._in_flight.get(slot)
            if running is None:
                break
            await asyncio.shield(running)  # a duplicate waits for the first call to finish, then replays
        future: asyncio.Future[ToolResult | None] = asyncio.get_running_loop().create_future()
        self._in_flight[slot] = future
        held.idempotency = (slot, digest, future)
        return None

    def _breaker(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        policy = spec.policies.circuit_breaker
        if policy is None:
            return None
        breaker = self._breakers.get(spec.name)
        if breaker is None:
            breaker = self._breakers[spec.name] = CircuitBreaker(policy)
        now = self.clock()
        allowed, changed = breaker.admit(now)
        if changed is not None:
            context.record(PLUGIN, "tool_pre", "circuit", f"circuit {changed}: probe call", state=changed)
            self._emit_soon(f"circuit:{changed}", {"tool": spec.name})
        if not allowed:
            return Deny(f"circuit for {spec.name!r} is open", code="circuit_open",
                        details={"retry_after": round(breaker.retry_after(now), 3)})
        held.breaker = breaker
        return None

    def _budget_keys(self, spec: ToolSpec, context: ToolContext) -> list[tuple[Any, str]]:
        subjects = {"principal": context.principal, "role": context.role, "environment": context.environment}
        return [(budget, f"budget:{budget.per}:{subjects[budget.per]}") for budget in spec.policies.budgets
                if subjects[budget.per] is not None]

    def _budgets(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        if not spec.policies.budgets:
            return None
        now = self.clock()
        keys = self._budget_keys(spec, context)
        for budget, key in keys:
            window = int(now // (budget.window_ms / 1000.0))
            if budget.max_calls is not None and self.state.get(f"{key}:calls", window) >= budget.max_calls:
                return Deny(f"call budget of {budget.per} {key.split(':', 2)[2]!r} is used up "
                            f"({budget.max_calls} calls per {budget.window_ms:g} ms)", code="budget_exceeded",
                            details={"budget": f"{budget.per}:calls"})
            if budget.max_seconds is not None and self.state.get(f"{key}:seconds", window) >= budget.max_seconds:
                return Deny(f"time budget of {budget.per} {key.split(':', 2)[2]!r} is used up "
                            f"({budget.max_seconds:g} s per {budget.window_ms:g} ms)", code="budget_exceeded",
                            details={"budget": f"{budget.per}:seconds"})
        for budget, key in keys:
            window = int(now // (budget.window_ms / 1000.0))
            self.state.add(f"{key}:calls", window, 1)
            held.budgets.append((f"{key}:seconds", window))
        return None

    def _rate_limit_now(self, spec: ToolSpec, context: ToolContext) -> Deny | None:
        """Take a token from the current window, or say when the next window opens."""
        limit = spec.policies.rate_limit
        if limit is None:
            return None
        interval = limit.interval_ms / 1000.0
        key = f"rate:{spec.name}:{context.principal}" if limit.per == "principal" else self._rate_keys.get(spec.name)
        if key is None:
            key = self._rate_keys[spec.name] = f"rate:{spec.name}"
        now = self.clock()
        window = int(now // interval)
        if self.state.add(key, window, 1) <= limit.limit:
            return None
        self.state.add(key, window, -1)
        retry_after = (window + 1) * interval - now
        return Deny(f"rate limit of {limit.limit} calls per {limit.interval_ms:g} ms reached for {spec.name!r}",
                    code="rate_limited", details={"retry_after": round(retry_after, 3)})

    @staticmethod
    def _may_queue(spec: ToolSpec, context: ToolContext, verdict: Deny) -> bool:
        limit = spec.policies.rate_limit
        remaining = context.remaining()
        return bool(limit is not None and limit.queue
                    and (remaining is None or remaining >= verdict.details["retry_after"]))

    async def _rate_limit(self, spec: ToolSpec, context: ToolContext) -> Deny | None:
        waited = 0.0
        while True:
            verdict = self._rate_limit_now(spec, context)
            if verdict is None:
                if waited:
                    context.record(PLUGIN, "tool_pre", "waited", f"rate limit: waited {waited:.3f} s")
                return None
            if not self._may_queue(spec, context, verdict):
                return verdict
            await self.sleep(verdict.details["retry_after"])
            waited += verdict.details["retry_after"]

    async def _concurrency(self, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        policy = spec.policies.concurrency
        assert policy is not None
        slots = self._slots.get(spec.name)
        if slots is None:
            slots = self._slots[spec.name] = Slots(policy.limit)
        if not policy.queue:
            if not slots.try_acquire():
                return Deny(f"{policy.limit} calls of {spec.name!r} are already running", code="concurrency_limited")
        else:
            remaining = context.remaining()
            if not await slots.acquire(None if remaining is None else max(remaining, 0.0)):
                return Deny(f"no free slot for {spec.name!r} before the deadline", code="concurrency_limited")
        held.semaphore = slots
        return None

    # -- outcomes -------------------------------------------------------------------

    def _release(self, held: _Held, *, failed: bool | None, result: ToolResult | None = None) -> str | None:
        if held.semaphore is not None:
            held.semaphore.release()
            held.semaphore = None
        changed = None
        if held.breaker is not None and failed is not None:
            changed = held.breaker.record(self.clock(), failed)
        elif held.breaker is not None:
            held.breaker.probe_in_flight = False
        if held.budgets and failed is not None:
            elapsed = self.clock() - held.started
            for key, window in held.budgets:
                self.state.add(key, window, elapsed)
        if held.idempotency is not None:
            slot, digest, future = held.idempotency
            self._in_flight.pop(slot, None)
            if result is not None and result.success:
                self.state.remember(slot, (digest, result), self.clock() + self.idempotency_window)
            if not future.done():
                future.set_result(result)
        return changed

    @hookimpl
    def tool_error(self, call: ToolCall, error: Any) -> ToolResult | None:
        if getattr(error, "plugin", None) == PLUGIN and error.code == "idempotent_replay":
            stored = self._replays.pop(call.id, None)
            if stored is not None:
                return ToolResult(True, stored.output, None, {**stored.metadata, "replayed": True}, call.id)
        return None

    @hookimpl
    def tool_complete(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult) -> None:
        if self._replays:
            self._replays.pop(call.id, None)
        held = self._held.pop(call.id, None)
        if held is None:
            return
        error = result.error
        failed = error is not None and (error.get("type") in COUNTED_FAILURES or error.get("code") == "timeout")
        changed = self._release(held, failed=failed, result=result)
        if changed is not None and spec is not None:
            self._emit_soon(f"circuit:{changed}", {"tool": spec.name})

