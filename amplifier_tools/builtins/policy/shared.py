"""The policy plugin's decisions against a shared store (SQLite, Redis) instead of process memory.

``SharedPolicy.admit`` decides a call in the plugin's order — idempotency,
circuit breaker, budgets, rate limit, concurrency — each step one atomic store
operation, and records what the call took in a ``SharedHeld``; ``complete``
releases and settles it, ``give_back`` undoes it for a call that was not
admitted. Concurrency slots are leases renewed while the call runs, so a host
that dies loses its slots only until the lease expires.

Every store operation is bounded by the store timeout and by the call's own
wait bound. When the store does not answer, the call fails closed with
``policy_store_unavailable`` (retryable; plugin-attributed, so no breaker counts
it) or, with ``store_unavailable = "local"``, is decided by the per-process
memory path instead (recorded in the trail). Releases that fail are logged and
left to the keys' expiry: they never fail a call that already ran.

Limits: slot waiters poll (no fleet-wide first-come-first-served order); two
budgets of one call are reserved one after the other, not in one transaction.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from ...models import Deny, ToolCall, ToolContext, ToolResult
from ...redaction import redact
from ...spec import CircuitBreakerPolicy, IdempotencyKeyRequirement, ToolSpec
from .breaker import CLOSED, CircuitBreaker, is_record
from .state import idempotency_slot, interval_of, rate_key, retry_hint
from .store import UNKNOWN_WINDOW, SharedStore, StoreIncompatible, StoreUnavailable, next_window, unavailable_hint

if TYPE_CHECKING:
    from . import PolicyPlugin, _Held
    from .sqlite_store import SQLiteStore

PLUGIN: Final = "policy"
LEASE_GRACE: Final = 2.0  # seconds a lease outlives the longest attempt, for renewal and clock jitter
LEASE_DEFAULT: Final = 30.0  # a lease's base when the tool has no timeout (renewed while it runs)
POLL_FIRST, POLL_MAX = 0.005, 0.1
RESOLVE_PAUSE: Final = 0.05  # seconds before an idempotency result is sent again (doubling, within a store timeout)
QUEUE: Final = object()  # rate_limit_now: the call may wait for the next window
log = logging.getLogger("amplifier_tools.policy")
T = TypeVar("T")


def _process_prefix() -> str:
    """This process's part of a holder id: host name and process id (for people reading
    ``policy status``) and 64 random bits (for uniqueness: containers under one host name are
    all process 1, and a forked child starts with its parent's counter)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(8).hex()}"


_holders = itertools.count(1)
_HOST = _process_prefix()
_PID = os.getpid()


def new_holder() -> str:
    """A holder id unique in the fleet: this process's prefix (made anew in a forked child, found
    by its process id: ``os.register_at_fork`` misses a fork made through ``ctypes``) and a
    counter. Two processes with one holder id would share leases (a concurrency cap admits
    twice) and idempotency claims (a resent claim is its holder's, so both would run)."""
    global _holders, _HOST, _PID
    if os.getpid() != _PID:
        _holders, _HOST, _PID = itertools.count(1), _process_prefix(), os.getpid()
    return f"{_HOST}:{next(_holders)}"


def _readable(key: str, data: Any) -> Any:
    """A breaker record read from the store, or None (a new, closed breaker, which the breaker's
    next write puts in its place) for one that is not a breaker record: logged, never raised
    (found by attack: a foreign value at the key failed every call of the tool with
    ``hook_failed``, and as nothing wrote over it, for as long as it stayed)."""
    if data is None or is_record(data):
        return data
    log.warning("policy store: %s holds %.80r, not a breaker record (another deployment or version sharing "
                "store_prefix?); read as a closed breaker, replaced at its next change", key, data)
    return None


class _Releases:
    """The releases of one call under way: whether the store failed to answer one within its bound."""

    __slots__ = ("hung",)

    def __init__(self) -> None:
        self.hung = False


class SharedHeld:
    """What one call took from the shared store."""

    __slots__ = ("breaker", "budgets", "claim", "lease", "rate", "renewer")

    def __init__(self) -> None:
        self.rate: tuple[str, float, int] | None = None  # (key, interval, window)
        self.budgets: list[tuple[str, float, int, str]] = []  # (key, interval, window, holder)
        self.lease: tuple[str, str, float] | None = None  # (key, holder, ttl)
        self.claim: tuple[str, str, str] | None = None  # (slot, holder, digest)
        self.breaker: tuple[str, Any, int | None, bool] | None = None  # (key, policy, probe, closed at admission)
        self.renewer: asyncio.Task[None] | None = None


class SharedPolicy:
    """The decision path of one ``PolicyPlugin`` against one ``SharedStore``."""

    def __init__(self, plugin: PolicyPlugin, store: SharedStore, unavailable: str, timeout: float) -> None:
        self.plugin = plugin
        self.store = store
        self.unavailable = unavailable
        self.timeout = timeout
        #: Its operations never suspend (SQLite), so a lone rate limit is decided in ``tool_pre``.
        self.synchronous = store.kind == "sqlite"  # not isinstance: list and describe never import sqlite3

    def _op(self, work: Awaitable[T], spec: ToolSpec, context: ToolContext, started: float) -> Awaitable[T]:
        """One store operation (``work``, a store method's coroutine, not started yet), bounded by
        the store timeout and the call's wait bound; await the result at once. The store bounds
        its own operations (SQLite: its busy timeout, set only when the bound changes; Redis: a
        deadline per command on one shared timer) and is told the bound here, right before
        ``work`` starts and reads it. A plain function, not a coroutine: one frame less between
        a decision and the store's socket."""
        left = self.plugin._time_left(spec, context, started)
        try:
            self.store.limit_wait(self.timeout if left is None or left >= self.timeout else max(left, 0.001))
        except BaseException:  # SQLite connects here: a refused file raises before ``work`` is awaited
            if inspect.iscoroutine(work):
                work.close()
            raise
        return work

    async def _run_releases(self, claim: tuple[str, str, str] | None, value: str | None, ttl: float,
                            works: list[Callable[[], Awaitable[Any]]]) -> None:
        """A call's releases, one after another: its idempotency claim resolved (``value`` stored,
        or the key freed), then ``works`` (each makes one store operation), most important first.
        Once one waited its whole store timeout (``_Releases.hung``), the call's result waits no
        longer: the rest go on in the background, each with its own bound, so a store that comes
        back still gets them (found by attack: skipped, a lease held every host's slot for its TTL
        and a probe's outcome left the breaker half-open, refusing every call, until its record
        expired). SQLite's waits for a lock hold the event loop, so there the rest are left to
        their keys' expiry (found by attack: "in the background" they held it all the same)."""
        releases = _Releases()
        if claim is not None:
            await self._store_result(releases, claim, value, ttl)
        for index, work in enumerate(works):
            if releases.hung:
                rest = works[index:]
                if self.synchronous:
                    log.warning("policy store: the store stayed locked past store_timeout_ms; the call's other "
                                "%d release(s) are left to their keys' expiry", len(rest))
                    return
                log.warning("policy store: the store did not answer within store_timeout_ms; the call's other "
                            "%d release(s) go on in the background", len(rest))
                self._background(self._late_releases(rest))
                return
            await self._release(releases, work)

    async def _late_releases(self, works: list[Callable[[], Awaitable[Any]]]) -> None:
        for work in works:
            await self._release(_Releases(), work)

    async def _release(self, releases: _Releases, work: Callable[[], Awaitable[Any]]) -> None:
        """One release (``work`` makes its operation), bounded by the store timeout; on failure
        logged and left to the key's expiry (a breaker outcome is lost). A timeout marks
        ``releases.hung`` (see ``_run_releases``: a call's result waits for one store timeout, not
        one per policy; found by attack). Each release has its own bound, so a slow store that
        answers gets every one (found by attack: with one shared bound, a breaker's outcome,
        recorded last, was lost on a store 40 ms away); a breaker outcome takes 2 round trips
        (plus the handshake on a new connection), so ``store_timeout_ms`` must cover that many."""
        self.store.limit_wait(self.timeout)
        try:
            await work()
        except (StoreUnavailable, OSError) as exc:
            releases.hung = releases.hung or getattr(exc, "timed_out", False)
            log.warning("policy store: a release failed (%s); the key's expiry reclaims it", exc)
        except Exception:  # a release never fails a call that already ran
            log.exception("policy store: a release failed unexpectedly; the key's expiry reclaims it")

    async def _store_result(self, releases: _Releases, claim: tuple[str, str, str], value: str | None,
                            ttl: float) -> None:
        """Resolve an idempotency claim: store the result, or free the key (``value`` None). A
        failure that came at once (a dropped connection) is tried again after a pause, doubling,
        within one store timeout (a resolve is its holder's: run twice, it is run once); a lost
        result leaves the key "running" until the claim expires, and a call with the key after
        that runs the tool again, so that is logged as an error, as is a claim that had expired."""
        slot, holder, digest = claim
        clock = self.plugin.clock
        deadline = clock() + self.timeout
        failure: BaseException | None = None
        pause = RESOLVE_PAUSE
        while True:
            # The store timeout for the first try (SQLite's busy timeout is then unchanged), what is left after.
            self.store.limit_wait(self.timeout if failure is None else max(deadline - clock(), 0.001))
            try:
                held = await self.store.resolve(slot, holder, digest, value, ttl)
            except Exception as exc:
                if not isinstance(exc, (StoreUnavailable, OSError)):  # a release never fails a call that ran
                    log.exception("policy store: storing an idempotency result failed unexpectedly")
                    return
                failure = exc
                releases.hung = getattr(exc, "timed_out", False)
                if releases.hung or deadline - clock() <= pause:
                    break
                await asyncio.sleep(pause)
                pause *= 2
                continue
            if not held and value is not None:
                log.error("policy store: the result for an idempotency key came after its claim was gone (expired, "
                          "or lost: a store restarted without persistence, or a key evicted), and was not stored: "
                          "a call with the same key runs the tool again")
            return
        late = getattr(failure, "timed_out", False)  # the store may still run the request it did not answer
        if value is None:
            log.warning("policy store: an idempotency key was %s freed (%s); it frees itself when its claim "
                        "expires", "perhaps not" if late else "not", failure)
        elif late:
            log.error("policy store: the result for an idempotency key may not have been stored (%s); if it was "
                      "not, a call with the same key is refused as still running until the claim expires, and "
                      "runs the tool again after that", failure)
        else:
            log.error("policy store: the result for an idempotency key could not be stored (%s): a call with the "
                      "same key is refused as still running until the claim expires, and runs the tool again "
                      "after that", failure)

    # -- admission -----------------------------------------------------------------------

    async def admit(self, call: ToolCall, spec: ToolSpec, context: ToolContext, held: _Held) -> Any:
        plugin = self.plugin
        started = plugin.clock()
        shared = held.shared
        assert shared is not None
        try:
            verdict = await self._decide(call, spec, context, shared, started)
        except StoreUnavailable as exc:
            plugin._forget(context, held)
            self._background(self.give_back(shared))
            out = self._unavailable(exc, call, spec, context)
            return await out if inspect.isawaitable(out) else out
        except BaseException:
            plugin._forget(context, held)
            self._background(self.give_back(shared))
            raise
        if verdict is not None:
            plugin._forget(context, held)
            # In a task of its own, tracked like the releases (found by attack: cancelled during a
            # round trip, the rest of what the refused call took — a budget reservation, an
            # idempotency claim — stayed in the store until its keys expired). Waited for, so the
            # refusal returns with everything given back; a cancellation of the caller leaves it
            # running, and its own end (``close`` cutting it) is not the caller's cancellation.
            giving_back = asyncio.ensure_future(self.give_back(shared))
            self._background(giving_back)
            await asyncio.wait((giving_back,))
            if not giving_back.cancelled() and (failure := giving_back.exception()) is not None:
                log.error("policy store: giving back what a refused call took failed (%s); its keys' "
                          "expiry reclaims it", failure)
            return verdict
        held.admitted = True
        held.started = plugin.clock()
        if shared.lease is not None:
            shared.renewer = asyncio.get_running_loop().create_task(self._renew(*shared.lease))
        return None

    def _unavailable(self, exc: StoreUnavailable, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """The verdict when the store did not answer: fail closed, or decide in this process."""
        if self.unavailable == "local":
            log.warning("policy store unavailable (%s): deciding %s in this process", exc, spec.name)
            context.record(PLUGIN, "tool_pre", "store_unavailable",
                           f"policy store unavailable ({exc}): decided by this process's memory",
                           store=self.store.kind)
            return self.plugin._local_pre(call, spec, context)
        return Deny(f"policy store unavailable: {exc}", code="policy_store_unavailable",
                    details={"retryable": not isinstance(exc, StoreIncompatible), "store": self.store.kind,
                             "hint": exc.hint or unavailable_hint(self.store.kind)})

    def rate_limit_now(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Any:
        """A tool whose only stateful policy is a rate limit, on a store that never suspends
        (SQLite): decided inside ``tool_pre``, without a coroutine for the host to await. None
        (admitted: a spent token holds nothing to release), a verdict, or ``QUEUE`` when the call
        may wait for the next window (the coroutine path, ``admit``, then decides it)."""
        limit = spec.policies.rate_limit
        assert limit is not None and self.synchronous
        store = cast("SQLiteStore", self.store)
        interval = interval_of(limit.interval_ms)
        key = rate_key(spec.name, context.principal if limit.per == "principal" else None)
        left = self.plugin._time_left(spec, context, self.plugin.clock())
        try:
            store.limit_wait(self.timeout if left is None or left >= self.timeout else max(left, 0.001))
            out = store.take_now(key, interval, limit.limit)
        except StoreUnavailable as exc:
            return self._unavailable(exc, call, spec, context)
        if out >= 0:
            return None
        retry_after = next_window(out)
        verdict = Deny(f"rate limit of {limit.limit} calls per {limit.interval_ms:g} ms reached for "
                       f"{spec.name!r}", code="rate_limited",
                       details={"retry_after": retry_hint(retry_after, least=0.001)})
        return QUEUE if self.plugin._may_queue(spec, verdict, left) else verdict

    async def close(self) -> None:
        """Let what still runs in the background (releases, event deliveries) finish for at most one
        store timeout more, tasks started meanwhile included; cancel what is left, and only then
        close the store: nothing uses it after (found by attack: a late release opened a new
        connection after close)."""
        await self.plugin.finish_background(self.timeout + 1.0)
        await self.store.close()

    def _background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.plugin._tasks.add(task)
        task.add_done_callback(self.plugin._tasks.discard)

    async def _decide(self, call: ToolCall, spec: ToolSpec, context: ToolContext, shared: SharedHeld,
                      started: float) -> Deny | None:
        policies = spec.policies
        if context.idempotency_key is not None or spec.idempotency_key is IdempotencyKeyRequirement.required:
            verdict = await self._idempotency(call, spec, context, shared, started)
            if verdict is not None:
                return verdict
        if policies.circuit_breaker is not None:
            verdict = await self._breaker(spec, context, shared, started)
            if verdict is not None:
                return verdict
        if policies.budgets:
            verdict = await self._budgets(spec, context, shared, started)
            if verdict is not None:
                return verdict
        if policies.rate_limit is not None:
            limited: Deny | None = await self.rate_limit(call, spec, context, shared, started)
            if limited is not None:
                return limited
        if policies.concurrency is not None:
            return await self._concurrency(spec, context, shared, started)
        return None

    async def _idempotency(self, call: ToolCall, spec: ToolSpec, context: ToolContext, shared: SharedHeld,
                           started: float) -> Deny | None:
        key = context.idempotency_key
        if key is None:
            return Deny(f"{spec.name!r} requires an idempotency key", code="idempotency_key_required",
                        category="ContractError")
        slot, digest = idempotency_slot(context.principal, spec.name, key, call.arguments)
        holder = new_holder()
        ttl = self._held_for(spec, context, started, self.plugin.idempotency_window)
        delay = POLL_FIRST
        polled = False
        still_running = Deny(f"a call with idempotency key {key!r} is still running", code="idempotency_in_progress")
        while True:
            # Kept before the round trip: a claim the store made but whose reply never came (the
            # command timed out, or the call was cancelled during it) is this holder's, and is
            # freed by ``give_back`` (found by attack: it answered "still running" to every call
            # with the key until the claim expired). Freeing a claim that is not ours does nothing.
            shared.claim = (slot, holder, digest)
            try:
                state, stored_digest, value = await self._op(self.store.claim(slot, digest, holder, ttl),
                                                             spec, context, started)
            except StoreUnavailable:
                # A poll cut by the call's own bound (the store answered the earlier ones): the wait
                # ran out, which is the policy's answer, not a store outage (found by attack: it
                # read as a retryable policy_store_unavailable).
                left = self.plugin._time_left(spec, context, started)
                if polled and left is not None and left <= 0:
                    return still_running
                raise
            polled = True
            if state == "claimed":
                return None
            shared.claim = None
            if state == "stored":
                if stored_digest != digest:
                    return Deny(f"idempotency key {key!r} was used with different arguments",
                                code="idempotency_conflict", category="ContractError")
                stored = json.loads(value or "{}")
                self.plugin._replays[id(context)] = ToolResult(True, stored.get("output"), None,
                                                               stored.get("metadata") or {}, call.id)
                return Deny(f"replayed the result stored for idempotency key {key!r}", code="idempotent_replay")
            left = self.plugin._time_left(spec, context, started)
            if left is not None and left <= 0:
                return still_running
            await asyncio.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, POLL_MAX)

    async def _breaker(self, spec: ToolSpec, context: ToolContext, shared: SharedHeld, started: float) -> Deny | None:
        policy = spec.policies.circuit_breaker
        assert policy is not None
        key = f"breaker:{spec.name}"
        data = _readable(key, await self._op(self.store.get(key), spec, context, started))
        if data is None or data["state"] == CLOSED:  # a closed breaker admits without a write
            shared.breaker = (key, policy, None, True)
            return None

        # If this call becomes the probe: taken as lost once it has surely ended and its outcome
        # had its releases' bound to arrive (its host may have been killed, or the reply lost).
        run = self.plugin._run_bound(spec, context, started)
        bound = None if run is None else run + LEASE_GRACE + self.timeout

        def step(data: Any, now: float) -> tuple[Any, Any]:
            breaker = CircuitBreaker.restore(policy, _readable(key, data))
            held = breaker.probe is not None and breaker.probe_until is not None and now >= breaker.probe_until
            allowed, changed, probe = breaker.admit(now, bound)
            return breaker.snapshot(), (allowed, changed, probe, breaker.retry_after(now), held and allowed)

        allowed, changed, probe, retry_after, replaced = await self._op(
            self.store.update(key, step, self._breaker_ttl(policy)), spec, context, started)
        if changed is not None:
            context.record(PLUGIN, "tool_pre", "circuit", f"circuit {changed}: probe call", state=changed)
            self.plugin._emit_soon(f"circuit:{changed}", {"tool": spec.name})
        elif replaced:
            # The probe before it was held past its bound (its host killed, its outcome's reply lost,
            # or held up by a slow hook): said where an operator looks, as the breaker's other turns are.
            log.warning("policy: the circuit breaker probe of %r was held past its bound and is taken as lost; "
                        "this call probes instead (a killed host, a lost store reply, or a slow tool_pre hook; "
                        "the bound is the call's timeout plus [plugins.policy] store_timeout_ms)", spec.name)
            context.record(PLUGIN, "tool_pre", "circuit", "circuit half_open: the last probe was taken as lost "
                           "(held past its bound); probe call", state="half_open", lost_probe=True)
        if not allowed:
            return Deny(f"circuit for {spec.name!r} is open", code="circuit_open",
                        details={"retry_after": retry_hint(retry_after, least=0.001)})
        shared.breaker = (key, policy, probe, False)
        return None

    def _held_for(self, spec: ToolSpec, context: ToolContext, started: float, unbounded: float) -> float:
        """How long a claim or reservation taken now must last: the admission waits still ahead of
        the call (rate limit, concurrency: up to ``_time_left``), then its longest run, plus grace,
        plus one store timeout for its releases — without the waits a claim could expire while its
        call still queued, without the last before its result is stored (found by attack), and a
        duplicate on another host would run the tool again. ``unbounded`` when the call has no bound."""
        run = self.plugin._run_bound(spec, context, started)
        # + a store timeout: the call's releases (its result stored first) may take that long after it ends.
        return (unbounded if run is None else run) + LEASE_GRACE + self.timeout

    @staticmethod
    def _breaker_ttl(policy: CircuitBreakerPolicy) -> float:
        return 2 * (policy.window_ms + policy.cooldown_ms) / 1000.0 + 60.0

    async def _budgets(self, spec: ToolSpec, context: ToolContext, shared: SharedHeld, started: float) -> Deny | None:
        subjects = {"principal": context.principal, "role": context.role, "environment": context.environment}
        longest = self.plugin._longest_run(spec, context)
        for budget in self.plugin._plan_of(spec).budgets:
            subject = subjects[budget.per]
            if not budget.applies(subject):
                continue
            key = budget.key(subject)
            interval = interval_of(budget.window_ms)
            holder = new_holder()
            ttl = self._held_for(spec, context, started, interval)
            # Kept before the round trip, its window not known yet: a reservation the store made but
            # whose reply never came (timed out, or the call cancelled during it) is given back by
            # ``give_back`` (found by attack: it held the seconds, and counted a call that never ran,
            # until the reservation expired — all of a time budget for its window when the call had no
            # bound). Replaced by the reservation's own window once the store answers. Not for SQLite:
            # its operations are never cut part-way (one that failed made nothing), and a give-back
            # would wait for the lock that failed it, holding the event loop.
            kept = not self.synchronous
            if kept:
                shared.budgets.append((key, interval, UNKNOWN_WINDOW, holder))
            outcome, window, _ = await self._op(
                self.store.reserve(key, interval, budget.max_calls, budget.max_seconds,
                                   longest if budget.max_seconds is not None else None, holder, ttl),
                spec, context, started)
            if kept:
                shared.budgets.pop()  # nothing to give back when refused; kept with its window when taken
            if outcome == "calls":
                return Deny(f"call budget of {budget.per} {subject!r} is used up "
                            f"({budget.max_calls} calls per {budget.window_ms:g} ms)", code="budget_exceeded",
                            details={"budget": f"{budget.per}:calls"})
            if outcome != "ok":
                held_by = "used up" if outcome == "used" else "reserved by calls in flight"
                return Deny(f"time budget of {budget.per} {subject!r} is {held_by} "
                            f"({budget.max_seconds:g} s per {budget.window_ms:g} ms)", code="budget_exceeded",
                            details={"budget": f"{budget.per}:seconds"})
            shared.budgets.append((key, interval, window, holder))
        return None

    async def rate_limit(self, call: ToolCall, spec: ToolSpec, context: ToolContext, shared: SharedHeld | None,
                         started: float) -> Any:
        """Take a token, waiting for the next window if the limit queues; kept in ``shared`` (to
        give back if a later step denies the call).

        ``shared`` None: the rate limit is the call's only stateful policy and it has no
        idempotency key, and ``tool_pre`` returns this coroutine itself — ``admit`` without its
        registration and its frames: a spent token holds nothing to release, and a call cancelled
        before its token came back holds none it knows of (as in ``admit``). A store that does not
        answer is then decided here (``_unavailable``); with ``shared`` it goes to ``admit``."""
        limit = spec.policies.rate_limit
        assert limit is not None
        interval = interval_of(limit.interval_ms)
        key = rate_key(spec.name, context.principal if limit.per == "principal" else None)
        waited = 0.0
        try:
            while True:
                out = await self._op(self.store.take(key, interval, limit.limit), spec, context, started)
                if out >= 0:  # taken, in window ``out``
                    if shared is not None:
                        shared.rate = (key, interval, out)
                    if waited:
                        context.record(PLUGIN, "tool_pre", "waited", f"rate limit: waited {waited:.3f} s")
                    return None
                retry_after = next_window(out)
                verdict = Deny(f"rate limit of {limit.limit} calls per {limit.interval_ms:g} ms reached for "
                               f"{spec.name!r}", code="rate_limited",
                               details={"retry_after": retry_hint(retry_after, least=0.001)})
                if not self.plugin._may_queue(spec, verdict, self.plugin._time_left(spec, context, started)):
                    return verdict
                await self.plugin.sleep(retry_after)
                waited += retry_after
        except StoreUnavailable as exc:
            if shared is not None:
                raise
            out = self._unavailable(exc, call, spec, context)
            return await out if inspect.isawaitable(out) else out

    def lease_ttl(self, spec: ToolSpec) -> float:
        """A slot lease lasts one attempt's timeout plus a grace, and is renewed every third of it."""
        timeout_ms = spec.policies.timeout_ms
        base = timeout_ms / 1000.0 if timeout_ms is not None else self.plugin.default_timeout
        return (LEASE_DEFAULT if base is None else base) + LEASE_GRACE

    async def _concurrency(self, spec: ToolSpec, context: ToolContext, shared: SharedHeld,
                           started: float) -> Deny | None:
        policy = spec.policies.concurrency
        assert policy is not None
        key, holder, ttl = f"slots:{spec.name}", new_holder(), self.lease_ttl(spec)
        delay = POLL_FIRST
        while True:
            # Kept before the round trip: a lease the store granted but whose reply never came (the
            # command timed out, or the call was cancelled during it) is released by ``give_back``
            # (found by attack: it held a slot fleet-wide for its whole TTL). Releasing a lease that
            # was not granted does nothing.
            shared.lease = (key, holder, ttl)
            if await self._op(self.store.lease(key, policy.limit, holder, ttl), spec, context, started):
                return None
            shared.lease = None
            if not policy.queue:
                return self.plugin._no_slot(spec, None)
            left = self.plugin._time_left(spec, context, started)
            if left is not None and left <= 0:
                return self.plugin._no_slot(spec, self.plugin.clock() - started)
            await asyncio.sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, POLL_MAX)

    async def _renew(self, key: str, holder: str, ttl: float) -> None:
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                self.store.limit_wait(self.timeout)
                if not await self.store.renew(key, holder, ttl):
                    log.warning("policy store: the lease %s of %s had expired before renewal", holder, key)
                    return
            except (StoreUnavailable, OSError) as exc:
                log.warning("policy store: renewing a lease of %s failed (%s)", key, exc)

    # -- release -------------------------------------------------------------------------------

    async def give_back(self, shared: SharedHeld) -> None:
        """Undo what a call that was not admitted took: it counts against nothing."""
        if shared.renewer is not None:
            shared.renewer.cancel()
        store = self.store
        works: list[Callable[[], Awaitable[Any]]] = []
        if shared.lease is not None:
            works.append(functools.partial(store.release, *shared.lease[:2]))
        if shared.breaker is not None and shared.breaker[2] is not None:
            works.append(functools.partial(self._abandon, shared.breaker))
        for key, interval, window, holder in shared.budgets:
            works.append(functools.partial(store.settle, key, interval, window, holder, None))
        if shared.rate is not None:
            works.append(functools.partial(store.untake, *shared.rate))
        # The claim first: a duplicate waiting for the key runs as soon as it is free.
        await self._run_releases(shared.claim, None, 0, works)
        shared.lease = shared.breaker = shared.rate = shared.claim = None
        shared.budgets = []

    async def _abandon(self, breaker: tuple[str, Any, int | None, bool]) -> None:
        key, policy, probe, _ = breaker

        def step(data: Any, now: float) -> tuple[Any, Any]:
            state = CircuitBreaker.restore(policy, _readable(key, data))
            state.abandon(probe)
            return state.snapshot(), None

        await self.store.update(key, step, self._breaker_ttl(policy))

    async def complete(self, held: _Held, failed: bool | None, result: ToolResult, spec: ToolSpec | None) -> None:
        """Release an admitted call's lease, settle its budgets, count its outcome, store its result."""
        shared = held.shared
        assert shared is not None
        if shared.renewer is not None:
            shared.renewer.cancel()
            shared.renewer = None
        elapsed = self.plugin.clock() - held.started
        value = None
        if shared.claim is not None and failed is False and result.success:
            rules = spec.security.redaction_rules if spec is not None else ()
            metadata = {k: v for k, v in result.metadata.items() if k != "trail"}
            value = json.dumps(redact({"output": result.output, "metadata": metadata},
                                      paths=[r for r in rules if r.startswith("output")]), default=str)
        store = self.store
        works: list[Callable[[], Awaitable[Any]]] = []
        if shared.lease is not None:  # the slot first, which every host's next call may be waiting for
            works.append(functools.partial(store.release, *shared.lease[:2]))
        if shared.breaker is not None:  # then the outcome, which decides whether the next calls run
            works.append(functools.partial(self._record, shared.breaker, failed, spec))
        for key, interval, window, holder in shared.budgets:
            works.append(functools.partial(store.settle, key, interval, window, holder, elapsed))
        # The stored result first of all: it is what the next call with the key gets.
        await self._run_releases(shared.claim, value, self.plugin.idempotency_window, works)
        shared.lease = shared.breaker = shared.rate = shared.claim = None
        shared.budgets = []

    async def _record(self, breaker: tuple[str, Any, int | None, bool], failed: bool | None,
                      spec: ToolSpec | None) -> None:
        key, policy, probe, closed = breaker
        if failed is None:
            if probe is not None:
                await self._abandon(breaker)
            return
        if closed and not failed and policy.failure_rate is None:
            return  # only failures can trip a closed breaker without a failure rate

        def step(data: Any, now: float) -> tuple[Any, Any]:
            state = CircuitBreaker.restore(policy, _readable(key, data))
            changed = state.record(now, failed, probe)
            return state.snapshot(), changed

        changed = await self.store.update(key, step, self._breaker_ttl(policy))
        if changed is not None and spec is not None:
            self.plugin._emit_soon(f"circuit:{changed}", {"tool": spec.name})
