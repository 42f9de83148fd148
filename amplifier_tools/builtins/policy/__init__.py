"""The policy plugin: scopes, rules, idempotency, circuit breakers, budgets, rate limits, concurrency.

Uses only the public hooks. ``tool_pre`` decides in this order — scopes,
declarative rules, idempotency, circuit breaker, budgets, rate limit,
concurrency — and records each decision in the trail; ``tool_complete``
releases what the call held and counts its outcome; ``tool_error`` turns an
idempotent replay into the stored result. Timeouts and retries are enforced by
the host's execution step from the same contract.

Every resource a call takes (slot, queue place, idempotency claim, breaker
probe, budget reservation, rate-limit token) is given back whatever happens:
a call that does not get through ``tool_pre`` (denied by a later check, out of
time while waiting, cancelled at any await) gives back everything it took
there; an admitted call releases at ``tool_complete``, which the host calls
for every call whose ``tool_pre`` chain ran this plugin, cancelled or not.
Waiting is policy, not hook time: the plugin declares ``hook_timeout_ms =
None`` and bounds every wait itself by the call's deadline, else the tool's
timeout. ``held_resources()`` counts what is held, for tests.

The policy values come from each tool's ``spec.policies`` and
``spec.security`` (overridable per tool in ``[tools."<name>"]``); the plugin's
own section (``settings.PolicySettings``) holds ``rules``, ``default_action`` and
``idempotency_window_ms``.
State is per host process by default (``store = "memory"``); ``store =
"sqlite"`` or a Redis URL moves it into a shared store (``store.py``), decided
by ``shared.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final

from ..._markers import hookimpl
from ...models import Deny, ToolCall, ToolContext, ToolResult
from ...plugin_settings import structure_settings
from ...retry import retry_allowed
from ...spec import IdempotencyKeyRequirement, RetryPolicy, ToolSpec
from ..filesystem.paths import PathRules
from .breaker import CircuitBreaker
from .rules import CallPaths, Rule, matches, path_engine
from .settings import PolicySettings
from .shared import QUEUE, SharedHeld, SharedPolicy
from .state import (
    MemoryState,
    PolicyState,
    budget_pools,
    idempotency_slot,
    interval_of,
    monotonic,
    rate_key,
    retry_hint,
)
from .store import open_store

PLUGIN: Final = "policy"
log = logging.getLogger("amplifier_tools.policy")
COUNTED_FAILURES: Final = frozenset({"ExecutionError", "SystemError"})
#: Outcomes that are neither success nor failure: the call was cut off, not answered by the tool
#: (so are errors attributed to a plugin).
NEUTRAL_CODES: Final = frozenset({"cancelled", "host_closing"})
#: Errors the host ends an admitted call with before its tool starts (the caller's deadline passed
#: while later ``tool_pre`` hooks ran; a secret could not be resolved): neither success nor
#: failure. Found by attack: a half-open breaker's probe that ended so was read as a success and
#: closed the breaker, though the tool never ran. Each with its type: a tool's own ``ExecutionError``
#: using one of these codes is its failure (found by review).
NOT_RUN_CODES: Final = frozenset({("PolicyError", "deadline_exceeded"), ("AuthError", "missing_secret")})
#: Errors of other types that are the tool's own failure: it ran out of its time, or answered with
#: an output its own schema refuses (found by attack: that counted as a success, so a tool always
#: answering so never opened its breaker; a plugin's replacement is attributed to the plugin).
TOOL_FAULT_CODES: Final = frozenset({"timeout", "invalid_output"})
DEFAULT_TIMEOUT: Final = 60.0  # the host's default tool timeout when none is published


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
        """Wait in line for a slot for at most ``timeout`` seconds; False when the time ran out.
        A cancelled waiter leaves the line, and passes on a slot handed to it as it was cancelled.
        (``asyncio.wait``, not ``wait_for``: before 3.12 ``wait_for`` swallows a cancellation that
        arrives as the awaited future completes.)"""
        if self.try_acquire():
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=timeout)
        except BaseException:
            self._leave(waiter)
            raise
        if waiter.done():
            return True
        self._leave(waiter)
        return False

    def _leave(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self.release()  # the slot arrived as the wait ended: pass it on
        else:
            waiter.cancel()
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def release(self) -> None:
        if self.in_use <= self.limit:  # (more in use than the limit only after ``resize`` cut it)
            while self.waiters:  # hand the slot straight to the next waiter
                waiter = self.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self.in_use -= 1

    def resize(self, limit: int) -> None:
        """Take the cap of a tool mounted again with another spec: waiters get the slots a larger
        cap frees at once; with a smaller one, slots in use are not handed on until under it."""
        self.limit = limit
        while self.in_use < limit and self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.in_use += 1
                waiter.set_result(None)


class _Held:
    """What one call took in ``tool_pre``: given back if it is not admitted, released at ``tool_complete``."""

    __slots__ = ("admitted", "breaker", "budgets", "idempotency", "probe", "rate", "shared", "slots", "started")

    def __init__(self) -> None:
        self.admitted = False
        self.slots: Slots | None = None
        self.breaker: CircuitBreaker | None = None
        self.probe: int | None = None
        self.budgets: list[tuple[str, int, float, float]] = []  # (budget key, window, interval, seconds reserved)
        self.rate: tuple[str, int, float] | None = None  # the rate-limit token: (key, window, interval)
        self.idempotency: tuple[str, str, asyncio.Future[ToolResult | None]] | None = None
        self.started = 0.0
        self.shared: SharedHeld | None = None  # what it took from a shared store


class _Plan:
    """What ``tool_pre`` reads of one tool's spec, worked out at the tool's first call rather than at
    every call (specs are frozen; a tool mounted again with another spec gets a new plan): the
    scopes it requires, whether any policy of it keeps state, and whether a rate limit is its only
    one (then a call without an idempotency key takes a token and holds nothing to release), and
    its budgets merged into the counters they keep (``budget_pools``)."""

    __slots__ = ("budgets", "rate_only", "scopes", "spec", "stateful")

    def __init__(self, spec: ToolSpec) -> None:
        policies = spec.policies
        others = (spec.idempotency_key is IdempotencyKeyRequirement.required or policies.circuit_breaker is not None
                  or bool(policies.budgets) or policies.concurrency is not None)
        self.spec = spec
        self.scopes = frozenset(spec.security.required_scopes) or None
        self.stateful = others or policies.rate_limit is not None
        self.rate_only = policies.rate_limit is not None and not others
        self.budgets = budget_pools(policies.budgets)


class PolicyPlugin:
    """Enforces every policy of the tool contract; one instance per host."""

    name = PLUGIN
    #: Policy waits are bounded by the call's deadline (else the tool's timeout) and end in the
    #: policy's own errors, so the host's hook timeout does not apply (``[plugins.policy]
    #: hook_timeout_ms`` in config still sets one).
    hook_timeout_ms: ClassVar[float | None] = None

    def __init__(self, *, clock: Callable[[], float] = monotonic,
                 sleep: Callable[[float], Any] = asyncio.sleep, state: PolicyState | None = None) -> None:
        self.clock = clock
        self.sleep = sleep
        self.state: PolicyState = state if state is not None else MemoryState()
        self._configure(PolicySettings())
        #: The path engine of path rules when the filesystem plugin publishes none (by working dir).
        self._path_engines: dict[str, PathRules] = {}
        self.default_timeout: float | None = DEFAULT_TIMEOUT
        self._slots: dict[str, Slots] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._held: dict[int, _Held] = {}  # by id() of the call's context
        self._in_flight: dict[str, asyncio.Future[ToolResult | None]] = {}
        self._replays: dict[int, ToolResult] = {}
        self._reserved: dict[tuple[str, int], tuple[int, float]] = {}  # budget seconds held by calls in flight
        self._coordinator: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rate_keys: dict[str, str] = {}
        self._plans: dict[str, _Plan] = {}  # by tool name; replaced when the tool's spec is another
        #: The shared store's decision path (None: ``store = "memory"``, all state in this process).
        self.shared: SharedPolicy | None = None

    # -- lifecycle -------------------------------------------------------------

    @hookimpl
    def mount(self, coordinator: Any, config: dict[str, Any]) -> Any:
        settings = structure_settings(config, PolicySettings, f"plugins.{PLUGIN}")
        self._configure(settings)
        default_ms = coordinator.get_capability("session.default_timeout_ms")
        if isinstance(default_ms, (int, float)) and not isinstance(default_ms, bool):
            self.default_timeout = default_ms / 1000.0
        self._coordinator = coordinator
        store, timeout = settings.store, settings.store_timeout_ms / 1000.0
        if "store" not in config:
            # The command line asks for a store that outlives its one-call processes.
            store = coordinator.get_capability("policy.default_store") or store
        if store == "memory":
            # found by attack: nothing waited for a ``circuit:*`` event still being delivered, and
            # close() returned with it pending (a shared store's close always waited)
            return functools.partial(self.finish_background, timeout + 1.0)
        state_dir = coordinator.get_capability("session.state_dir")
        shared = open_store(store, settings.store_prefix, timeout, state_dir)
        protected = coordinator.get_capability("session.protected_paths")
        if store == "sqlite" and protected is not None:
            for suffix in ("", "-wal", "-shm"):
                protected.add(f"{shared.where}{suffix}", "the policy store")
        elif shared.socket is not None and protected is not None:
            # Whoever can replace the socket answers every decision (found by attack: a fake server
            # answering ":1" admitted every call). Keyed: inside a writable root the start is refused.
            protected.add(shared.socket, "the policy store's Redis socket", key=f"plugins.{PLUGIN}.store")
        self.shared = SharedPolicy(self, shared, settings.store_unavailable, timeout)
        return self.shared.close

    def _configure(self, settings: PolicySettings) -> None:
        """Keep what the decisions read, as plain attributes."""
        self.rules: tuple[Rule, ...] = settings.rules
        self._deny_rules = [rule for rule in self.rules if rule.action == "deny"]
        self._allow_rules = [rule for rule in self.rules if rule.action == "allow"]
        self.default_action: str = settings.default_action
        self._ruled = bool(self.rules) or self.default_action != "allow"
        self.idempotency_window = settings.idempotency_window_ms / 1000.0  # seconds

    @property
    def store(self) -> str:
        """Where the policy state lives: ``memory``, or the shared store's kind and place."""
        return "memory" if self.shared is None else f"{self.shared.store.kind}:{self.shared.store.where}"

    def held_resources(self) -> dict[str, int]:
        """What calls hold right now (read-only; all zero when no call is in flight): ``calls`` with
        resources, concurrency ``slots`` in use, ``slot_waiters`` queued, ``idempotency_claims`` in
        flight, breaker ``probes`` in flight, ``budget_reservations`` of execution seconds."""
        return {
            "calls": len(self._held),
            "slots": sum(slots.in_use for slots in self._slots.values()),
            "slot_waiters": sum(len(slots.waiters) for slots in self._slots.values()),
            "idempotency_claims": len(self._in_flight),
            "probes": sum(breaker.probe is not None for breaker in self._breakers.values()),
            "budget_reservations": sum(count for count, _ in self._reserved.values()),
        }

    async def finish_background(self, seconds: float) -> None:
        """At close: let what still runs in the background (event deliveries; a shared store's
        releases) finish within ``seconds``, tasks started meanwhile included; cancel what is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while pending := [task for task in self._tasks if not task.done()]:
            left = deadline - loop.time()
            if left <= 0:
                log.warning("policy: closing; %d event delivery(ies) or store release(s) still running are cut "
                            "off (a release's keys expire and reclaim it)", len(pending))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
            await asyncio.wait(pending, timeout=left)

    def _emit_soon(self, event: str, data: dict[str, Any]) -> None:
        """Deliver a state-change event without making the deciding hook wait for observers."""
        if self._coordinator is not None:
            task = asyncio.get_running_loop().create_task(self._coordinator.hooks.emit(event, data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- decisions ---------------------------------------------------------------

    def _plan_of(self, spec: ToolSpec) -> _Plan:
        """The tool's plan (``_Plan``), made anew when the tool is mounted again with another spec;
        then its concurrency slots and breaker, kept by name, take that spec's cap and policy
        (found by attack: 1 → 4 still ran one call at a time, 4 → 1 ran four). With a smaller cap,
        calls already running finish over it."""
        plan = self._plans.get(spec.name)
        if plan is None or plan.spec is not spec:
            plan = self._plans[spec.name] = _Plan(spec)
            self._rate_keys.pop(spec.name, None)  # its key names the interval, which may be another
            slots, concurrency = self._slots.get(spec.name), spec.policies.concurrency
            if slots is not None and concurrency is not None:
                slots.resize(concurrency.limit)
            breaker, policy = self._breakers.get(spec.name), spec.policies.circuit_breaker
            if breaker is not None and policy is not None:
                breaker.policy = policy
        return plan

    @hookimpl
    def tool_pre(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """Decide synchronously when nothing has to wait; otherwise return a coroutine the host awaits."""
        plan = self._plans.get(spec.name)
        if plan is None or plan.spec is not spec:
            plan = self._plan_of(spec)
        if plan.scopes is not None and not plan.scopes <= context.scopes:
            missing = sorted(plan.scopes - context.scopes)
            return Deny(f"missing scope {', '.join(map(repr, missing))} for {spec.name!r}", code="missing_scope",
                        details={"missing_scopes": missing}, category="AuthError")
        if self._ruled:
            denied = self._check_rules(call, spec, context)
            if denied is not None:
                return denied
        shared = self.shared
        if context.idempotency_key is None:
            if not plan.stateful:
                return None
            if plan.rate_only:
                if shared is None:
                    return self._rate_only(call, spec, context)
                if shared.synchronous:
                    verdict = shared.rate_limit_now(call, spec, context)
                    if verdict is not QUEUE:
                        return verdict
                return shared.rate_limit(call, spec, context, None, self.clock())
        if shared is not None:
            held = _Held()
            held.shared = SharedHeld()
            self._held[id(context)] = held  # registered first: tool_complete gives back what it took
            return shared.admit(call, spec, context, held)
        return self._local_pre(call, spec, context)

    @hookimpl
    def tool_rewritten(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Deny | None:
        """The rules again, on the arguments a ``tool_pre`` hook after this one rewrote: the ones the
        tool runs with. Found by attack: a ``trylast`` normaliser's ``Modify`` (``~/x`` to
        ``/root/x``) reached the tool past a deny rule the arguments this plugin saw did not match.
        Scopes and the stateful policies do not read the arguments; idempotency keeps the digest
        of the arguments the caller sent."""
        return self._check_rules(call, spec, context, "tool_rewritten") if self._ruled else None

    def _rate_only(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """A tool whose only stateful policy is a rate limit, in this process's memory: decided
        here, and the call is not registered (a spent token holds nothing to release, at
        ``tool_complete`` or before). A call that may queue for the next window waits in the
        coroutine path, registered as any waiting call."""
        verdict = self._rate_limit_now(spec, context, None)
        if verdict is None or not self._may_queue(spec, verdict, self._time_left(spec, context, self.clock())):
            return verdict
        return self._pre_waiting(call, spec, context, _Held(), idempotency=False)

    def _local_pre(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """The decisions in this process's memory (``store = "memory"``, or a shared store's fallback)."""
        policies = spec.policies
        if context.idempotency_key is not None or spec.idempotency_key is IdempotencyKeyRequirement.required:
            return self._pre_waiting(call, spec, context, _Held(), idempotency=True)
        if policies.circuit_breaker is None and not policies.budgets and policies.rate_limit is None \
                and policies.concurrency is None:
            return None
        held = _Held()
        verdict = self._breaker(spec, context, held) if policies.circuit_breaker is not None else None
        if verdict is None and policies.budgets:
            verdict = self._budgets(spec, context, held)
        if verdict is None and policies.rate_limit is not None:
            verdict = self._rate_limit_now(spec, context, held)
            if verdict is not None and self._may_queue(spec, verdict, self._time_left(spec, context, self.clock())):
                return self._pre_waiting(call, spec, context, held, idempotency=False)
        if verdict is None and policies.concurrency is not None:
            slots = self._slots_of(spec)
            if slots.try_acquire():
                held.slots = slots
            elif policies.concurrency.queue:
                return self._pre_waiting(call, spec, context, held, idempotency=False)
            else:
                verdict = self._no_slot(spec, None)
        if verdict is not None:
            self._give_back(held)
            return verdict
        self._admit(context, held)
        return None

    def _pre_waiting(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held, *,
                     idempotency: bool) -> Any:
        """The slow path, as a coroutine for the host to await. The call is registered first, so
        ``tool_complete`` gives back what it took even if the coroutine never runs."""
        self._held[id(context)] = held
        return self._wait_then_admit(call, spec, context, held, idempotency=idempotency)

    async def _wait_then_admit(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held, *,
                               idempotency: bool) -> Deny | None:
        """Idempotency waits, queued rate limits, queued concurrency slots. Whatever ends this before
        admission — a denial, running out of time, cancellation at any await — gives back everything
        the call took in ``tool_pre``."""
        try:
            verdict = await self._decide_waiting(call, spec, context, held, idempotency=idempotency)
        except BaseException:
            self._abandon(context, held)
            raise
        if verdict is not None:
            self._abandon(context, held)
            return verdict
        self._admit(context, held)
        return None

    async def _decide_waiting(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held, *,
                              idempotency: bool) -> Deny | None:
        policies = spec.policies
        started = self.clock()
        verdict = None
        if idempotency:
            verdict = await self._idempotency(call, spec, context, held, started)
            if verdict is None and policies.circuit_breaker is not None:
                verdict = self._breaker(spec, context, held)
            if verdict is None and policies.budgets:
                verdict = self._budgets(spec, context, held)
        if verdict is None and policies.rate_limit is not None and held.rate is None:
            verdict = await self._rate_limit(spec, context, held, started)
        if verdict is None and policies.concurrency is not None:
            verdict = await self._concurrency(spec, context, held, started)
        return verdict

    def _admit(self, context: ToolContext, held: _Held) -> None:
        held.admitted = True
        held.started = self.clock()
        self._held[id(context)] = held

    def _forget(self, context: ToolContext, held: _Held) -> None:
        """Stop tracking a call that was not admitted (its resources are given back by the caller)."""
        if self._held.get(id(context)) is held:
            del self._held[id(context)]

    def _abandon(self, context: ToolContext, held: _Held) -> None:
        if self._held.get(id(context)) is held:
            del self._held[id(context)]
        self._give_back(held)

    def _time_left(self, spec: ToolSpec, context: ToolContext, started: float) -> float | None:
        """How much longer this call may wait: until its deadline, or, without one, for as long as
        the tool may run (its timeout, else the host's default), counted from ``started``."""
        if context.deadline is not None:
            return max(context.deadline - monotonic(), 0.0)  # context.remaining(), one call less
        timeout_ms = spec.policies.timeout_ms
        bound = timeout_ms / 1000.0 if timeout_ms is not None else self.default_timeout
        return None if bound is None else max(bound - (self.clock() - started), 0.0)

    def _check_rules(self, call: ToolCall, spec: ToolSpec, context: ToolContext,
                     hook: str = "tool_pre") -> Deny | None:
        """Any matching deny rule denies, whatever its position: the first matching deny (in config order)
        is the one reported. Allow rules never cancel a deny; they only matter under
        ``default_action = "deny"``, where a call that no allow rule matches is denied. A matching
        allow is recorded in ``hook``; from ``tool_rewritten`` only when ``tool_pre`` recorded
        another rule (or none)."""
        if not self.rules and self.default_action == "allow":
            return None
        engine = path_engine(self._coordinator, self._path_engines)
        paths = CallPaths(engine, spec, call.arguments) if engine is not None else None
        principal, role, environment = context.principal, context.role, context.environment
        for rule in self._deny_rules:
            if matches(rule, spec, call.arguments, principal, role, environment, paths):
                return Deny(f"denied by rule {rule.name!r}" + (f": {rule.reason}" if rule.reason else ""),
                            code="rule_denied",
                            details={"rule": rule.name})
        for rule in self._allow_rules:
            if matches(rule, spec, call.arguments, principal, role, environment, paths):
                if hook == "tool_pre" or not any(entry.plugin == PLUGIN and entry.action == "allow"
                                                 and entry.details.get("rule") == rule.name for entry in context.trail):
                    context.record(PLUGIN, hook, "allow", f"allowed by rule {rule.name!r}", rule=rule.name)
                return None
        if self.default_action == "deny":
            return Deny("no rule allows this call (default_action = 'deny')", code="rule_denied",
                        details={"rule": "default"})
        return None

    async def _idempotency(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held,
                           started: float) -> Deny | None:
        key = context.idempotency_key
        if key is None:
            if spec.idempotency_key is IdempotencyKeyRequirement.required:
                return Deny(f"{spec.name!r} requires an idempotency key", code="idempotency_key_required",
                            category="ContractError")
            return None
        slot, digest = idempotency_slot(context.principal, spec.name, key, call.arguments)
        while True:
            stored = self.state.recall(slot, self.clock())
            if stored is not None:
                stored_digest, result = stored
                if stored_digest != digest:
                    return Deny(f"idempotency key {key!r} was used with different arguments",
                                code="idempotency_conflict", category="ContractError")
                self._replays[id(context)] = result
                return Deny(f"replayed the result stored for idempotency key {key!r}", code="idempotent_replay")
            running = self._in_flight.get(slot)
            if running is None:
                break
            # A duplicate waits for the first call to finish, then replays (or runs, if that one failed).
            await asyncio.wait((running,), timeout=self._time_left(spec, context, started))
            if not running.done():
                return Deny(f"a call with idempotency key {key!r} is still running", code="idempotency_in_progress")
        future: asyncio.Future[ToolResult | None] = asyncio.get_running_loop().create_future()
        self._in_flight[slot] = future
        held.idempotency = (slot, digest, future)
        return None

    def _breaker(self, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        policy = spec.policies.circuit_breaker
        if policy is None:
            return None
        breaker = self._breakers.get(spec.name)
        if breaker is None:
            breaker = self._breakers[spec.name] = CircuitBreaker(policy)
        now = self.clock()
        allowed, changed, probe = breaker.admit(now, self._run_bound(spec, context, now), expires=False)
        if changed is not None:
            context.record(PLUGIN, "tool_pre", "circuit", f"circuit {changed}: probe call", state=changed)
            self._emit_soon(f"circuit:{changed}", {"tool": spec.name})
        if not allowed:
            return Deny(f"circuit for {spec.name!r} is open", code="circuit_open",
                        details={"retry_after": retry_hint(breaker.retry_after(now), least=0.001)})
        held.breaker, held.probe = breaker, probe
        return None

    def _budgets(self, spec: ToolSpec, context: ToolContext, held: _Held) -> Deny | None:
        """Count the call against each budget and reserve execution seconds for it: at most its
        longest possible run, at most what is left. Admitted only while spent + reserved < max."""
        subjects = {"principal": context.principal, "role": context.role, "environment": context.environment}
        now = self.clock()
        checked: list[tuple[str, int, float, float]] = []
        longest: float | None = None
        longest_known = False
        for budget in self._plan_of(spec).budgets:
            subject = subjects[budget.per]
            if not budget.applies(subject):
                continue
            key = budget.key(subject)
            interval = interval_of(budget.window_ms)
            window = int(now // interval)
            if budget.max_calls is not None and self.state.get(f"{key}:calls", window) >= budget.max_calls:
                return Deny(f"call budget of {budget.per} {subject!r} is used up "
                            f"({budget.max_calls} calls per {budget.window_ms:g} ms)", code="budget_exceeded",
                            details={"budget": f"{budget.per}:calls"})
            reserve = 0.0
            if budget.max_seconds is not None:
                spent = self.state.get(f"{key}:seconds", window)
                left = budget.max_seconds - spent - self._reserved.get((key, window), (0, 0.0))[1]
                if left <= 0:
                    held_by = "used up" if spent >= budget.max_seconds else "reserved by calls in flight"
                    return Deny(f"time budget of {budget.per} {subject!r} is {held_by} "
                                f"({budget.max_seconds:g} s per {budget.window_ms:g} ms)", code="budget_exceeded",
                                details={"budget": f"{budget.per}:seconds"})
                if not longest_known:
                    longest, longest_known = self._longest_run(spec, context), True
                reserve = left if longest is None else min(left, longest)
            checked.append((key, window, interval, reserve))
        for key, window, interval, reserve in checked:
            self.state.add(f"{key}:calls", window, 1, interval)
            if reserve:
                count, total = self._reserved.get((key, window), (0, 0.0))
                self._reserved[(key, window)] = (count + 1, total + reserve)
            held.budgets.append((key, window, interval, reserve))
        return None

    def _run_bound(self, spec: ToolSpec, context: ToolContext, started: float) -> float | None:
        """How long, from now, until this call has surely ended: the admission waits still ahead of
        it (rate limit, concurrency: up to ``_time_left`` from ``started``), then its longest run.
        None when it has no bound."""
        longest = self._longest_run(spec, context)
        if longest is None:
            return None
        return (self._time_left(spec, context, started) or 0.0) + longest

    def _longest_run(self, spec: ToolSpec, context: ToolContext) -> float | None:
        """The longest this call may execute: its timeout times its attempts, plus the longest
        waits between them (found by attack: a call was charged its backoff sleeps it had not
        reserved, 8 s spent of a 1 s budget), cut by its deadline. A call the host will not
        retry (an ``IdempotentWrite`` without a key) has one attempt (found by attack: it
        reserved all of them, and refused concurrent calls the budget had room for)."""
        timeout_ms = spec.policies.timeout_ms
        longest = timeout_ms / 1000.0 if timeout_ms is not None else self.default_timeout
        retry = spec.policies.retry
        if longest is not None and retry is not None and retry_allowed(spec, context):
            longest = longest * retry.max_attempts + _longest_waits(retry)
        remaining = context.remaining()
        if remaining is not None:
            longest = max(remaining, 0.0) if longest is None else min(longest, max(remaining, 0.0))
        return longest

    def _rate_limit_now(self, spec: ToolSpec, context: ToolContext, held: _Held | None) -> Deny | None:
        """Take a token from the current window (kept in ``held``, to give back if the call is not
        admitted after all; None: nothing can stop it now), or say when the next window opens.

        The counter's key names the interval too: windows are numbered by ``now // interval``, and
        a counter of a longer interval's window number, read after a remount made the interval
        longer, was taken for a window already over (found by attack: 60 s → 3600 s at a
        monotonic clock of 100,000 s admitted every call for the next 69 days)."""
        limit = spec.policies.rate_limit
        if limit is None:
            return None
        interval = interval_of(limit.interval_ms)
        key: str | None
        if limit.per == "principal":
            key = f"{rate_key(spec.name, context.principal)}@{_ms(limit.interval_ms)}"
        else:
            key = self._rate_keys.get(spec.name)
            if key is None:
                key = self._rate_keys[spec.name] = f"{rate_key(spec.name, None)}@{_ms(limit.interval_ms)}"
        now = self.clock()
        window = int(now // interval)
        if self.state.add(key, window, 1, interval) <= limit.limit:
            if held is not None:
                held.rate = (key, window, interval)
            return None
        self.state.add(key, window, -1, interval)
        retry_after = retry_hint((window + 1) * interval - now, least=0.001)
        return Deny(f"rate limit of {limit.limit} calls per {limit.interval_ms:g} ms reached for {spec.name!r}",
                    code="rate_limited", details={"retry_after": retry_after})

    @staticmethod
    def _may_queue(spec: ToolSpec, verdict: Deny, time_left: float | None) -> bool:
        limit = spec.policies.rate_limit
        return bool(limit is not None and limit.queue and verdict.code == "rate_limited"
                    and (time_left is None or time_left >= verdict.details["retry_after"]))

    async def _rate_limit(self, spec: ToolSpec, context: ToolContext, held: _Held, started: float) -> Deny | None:
        waited = 0.0
        while True:
            verdict = self._rate_limit_now(spec, context, held)
            if verdict is None:
                if waited:
                    context.record(PLUGIN, "tool_pre", "waited", f"rate limit: waited {waited:.3f} s")
                return None
            if not self._may_queue(spec, verdict, self._time_left(spec, context, started)):
                return verdict
            await self.sleep(verdict.details["retry_after"])
            waited += verdict.details["retry_after"]

    def _slots_of(self, spec: ToolSpec) -> Slots:
        slots = self._slots.get(spec.name)
        if slots is None:
            assert spec.policies.concurrency is not None
            slots = self._slots[spec.name] = Slots(spec.policies.concurrency.limit)
        return slots

    @staticmethod
    def _no_slot(spec: ToolSpec, waited: float | None) -> Deny:
        limit = spec.policies.concurrency.limit if spec.policies.concurrency is not None else 0
        if waited is None:
            return Deny(f"{limit} calls of {spec.name!r} are already running", code="concurrency_limited")
        return Deny(f"no free slot for {spec.name!r} within {waited:.3g} s (the call's deadline, else the "
                    f"tool's timeout)", code="concurrency_limited")

    async def _concurrency(self, spec: ToolSpec, context: ToolContext, held: _Held, started: float) -> Deny | None:
        policy = spec.policies.concurrency
        assert policy is not None
        slots = self._slots_of(spec)
        if not policy.queue:
            if not slots.try_acquire():
                return self._no_slot(spec, None)
        else:
            time_left = self._time_left(spec, context, started)
            if not await slots.acquire(time_left):
                return self._no_slot(spec, time_left)
        held.slots = slots
        return None

    # -- outcomes -------------------------------------------------------------------

    def _unreserve(self, key: str, window: int, reserve: float) -> None:
        if reserve:
            count, total = self._reserved.pop((key, window))
            if count > 1:
                self._reserved[(key, window)] = (count - 1, total - reserve)

    def _resolve_claim(self, held: _Held, result: ToolResult | None) -> None:
        """End the call's idempotency claim; waiting duplicates then replay ``result`` if it was
        stored, or one of them runs the tool itself."""
        assert held.idempotency is not None
        slot, digest, future = held.idempotency
        held.idempotency = None
        if self._in_flight.get(slot) is future:
            del self._in_flight[slot]
        if result is not None and result.success:
            now = self.clock()
            self.state.remember(slot, (digest, result), now + self.idempotency_window, now)
        if not future.done():
            future.set_result(result)

    def _give_back(self, held: _Held) -> None:
        """Undo everything a call took in ``tool_pre``: it was not admitted, so it used nothing."""
        if held.slots is not None:
            held.slots.release()
            held.slots = None
        if held.breaker is not None:
            held.breaker.abandon(held.probe)
            held.breaker = None
        for key, window, interval, reserve in held.budgets:
            self.state.add(f"{key}:calls", window, -1, interval)
            self._unreserve(key, window, reserve)
        held.budgets = []
        if held.rate is not None:
            key, window, interval = held.rate
            self.state.add(key, window, -1, interval)
            held.rate = None
        if held.idempotency is not None:
            self._resolve_claim(held, None)

    def _settle(self, held: _Held, *, failed: bool | None, result: ToolResult) -> str | None:
        """Release what an admitted call held and count its outcome (``failed=None``: neither)."""
        if held.slots is not None:
            held.slots.release()
            held.slots = None
        changed = None
        if held.breaker is not None:
            if failed is None:
                held.breaker.abandon(held.probe)
            else:
                changed = held.breaker.record(self.clock(), failed, held.probe)
            held.breaker = None
        if held.budgets:
            elapsed = self.clock() - held.started
            for key, window, interval, reserve in held.budgets:
                self.state.add(f"{key}:seconds", window, elapsed, interval)
                self._unreserve(key, window, reserve)
            held.budgets = []
        if held.idempotency is not None:
            self._resolve_claim(held, result if failed is not None else None)
        return changed

    @hookimpl
    def tool_error(self, call: ToolCall, error: Any, context: ToolContext) -> ToolResult | None:
        if getattr(error, "plugin", None) == PLUGIN and error.code == "idempotent_replay":
            stored = self._replays.pop(id(context), None)
            if stored is not None:
                return ToolResult(True, stored.output, None, {**stored.metadata, "replayed": True}, call.id)
        return None

    @hookimpl
    def tool_complete(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult,
                      context: ToolContext) -> Any:
        # Keyed by the call's own context object, not by its id: two calls may share a caller-given
        # call id, and one must never release (or replay) what the other holds.
        if self._replays:
            self._replays.pop(id(context), None)
        held = self._held.pop(id(context), None)
        if held is None:
            return None
        if not held.admitted:  # its tool_pre never finished (the coroutine was dropped): it used nothing
            if held.shared is not None and self.shared is not None:
                return self.shared.give_back(held.shared)
            self._give_back(held)
            return None
        error = result.error
        if error is None:
            failed: bool | None = False
        elif error.get("plugin") is not None or (error.get("code") in NEUTRAL_CODES
                                                 and error.get("type") == "SystemError") or error.get("by_deadline") \
                or (error.get("type"), error.get("code")) in NOT_RUN_CODES:
            # cut off, decided by a plugin (a later veto, a hook failure), out of the caller's own
            # time (found by attack: a caller's 10 ms deadlines opened a healthy tool's breaker for
            # everyone), or ended before the tool started: says nothing of the tool
            failed = None
        else:
            failed = error.get("type") in COUNTED_FAILURES or error.get("code") in TOOL_FAULT_CODES
        if held.shared is not None and self.shared is not None:
            shared = held.shared
            if shared.lease is None and shared.breaker is None and shared.claim is None and not shared.budgets:
                return None  # a rate-limit token is spent once admitted: nothing to release
            return self.shared.complete(held, failed, result, spec)
        changed = self._settle(held, failed=failed, result=result)
        if changed is not None and spec is not None:
            self._emit_soon(f"circuit:{changed}", {"tool": spec.name})
        return None


def _ms(value: float) -> str:
    """A length in milliseconds as a key names it: ``60000``, ``1.5`` (exactly; no rounding)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


#: Waits between attempts summed one by one for a time budget's reservation; past these, each
#: further wait is counted as the largest it may be (an upper bound, never a loop per attempt).
_WAITS_SUMMED: Final = 1024


@functools.lru_cache(maxsize=256)
def _longest_waits(retry: RetryPolicy) -> float:
    """The longest the waits between a call's attempts may add up to, in seconds: wait n is at
    most min(``max_backoff_ms``, ``initial_backoff_ms`` * ``multiplier``ⁿ), as the host's retry
    loop sleeps them. Found by attack: the sum raised ``OverflowError`` at about 1,000 attempts
    (every call of the tool failed ``hook_failed``), and looped once per attempt (minutes for
    ``max_attempts = 10**9``); the first ``_WAITS_SUMMED`` waits are summed exactly, each later
    one counted at the cap (or, when the waits do not grow, at the last wait summed). Kept per
    policy (policies are frozen): a call of a tool with a time budget does not sum them again."""
    waits = retry.max_attempts - 1
    total, raw, cap = 0.0, retry.initial_backoff_ms, retry.max_backoff_ms
    for _ in range(min(waits, _WAITS_SUMMED)):
        total += min(cap, raw)
        raw *= retry.multiplier  # a float product: grows to inf, never raises
    if waits > _WAITS_SUMMED:
        total += (waits - _WAITS_SUMMED) * (cap if retry.multiplier > 1 else min(cap, raw))
    return total / 1000.0
