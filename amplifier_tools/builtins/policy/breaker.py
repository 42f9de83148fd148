"""Circuit breakers: closed -> open after failures -> half-open probe -> closed (or open again).

Only the probe decides half-open: each probe gets a fresh token, and an outcome
that does not carry the current probe's token (a slow call admitted while the
breaker was still closed) never moves the breaker out of half-open.

A probe has a bound (``probe_until``: when its call has surely ended and its outcome
come in, or None when the call has no bound). A call refused while the probe runs is
told to retry when that bound ends or a cooldown has passed, whichever comes first
(found by review: it was told ``retry_after = 0.0``, and a caller honouring it retried
at once, for as long as the probe ran). A probe still held past its bound is taken as
lost (its host killed, its outcome's reply lost: on a shared store each refused call
wrote the record back, so it never expired, and the breaker refused every call for
as long as they kept coming); the next call becomes the probe.

A breaker's record is bounded whatever the traffic. It keeps the times of the latest
``failure_threshold`` failures within the window (all the threshold needs, exactly) while the
threshold is at most ``EXACT_FAILURES``; with a ``failure_rate`` or a larger threshold, counts of
calls and failures per ``1/BUCKETS`` of the window. Found by test: the record held every outcome of
its window, and a shared store rewrote it whole at each one, so a call cost more the more calls the
window held (16.6 ms a call on SQLite at 3,000 outcomes).

Limits: what is counted in buckets (the rate, and a threshold above ``EXACT_FAILURES``) is over the
buckets that began within the window, so it may leave out outcomes up to ``window_ms / BUCKETS``
younger than ``window_ms`` (it never counts an older one).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Final

from ...spec import CircuitBreakerPolicy

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"
STATES: Final = (CLOSED, OPEN, HALF_OPEN)


#: The largest magnitude of a number in a breaker record: what every JSON reader keeps exactly.
LARGEST: Final = 2**53


def _number(value: Any) -> bool:
    """A finite number within ``LARGEST``. Found by attack: an integer past a float's range made
    ``math.isfinite`` raise ``OverflowError`` (in the check meant to keep foreign records from
    failing calls), and a ``tokens`` of 4,300 digits passed, then one more probe token could not
    be written back (``json.dumps``: past the interpreter's digit limit); both failed every call
    of the tool with ``hook_failed``."""
    if value.__class__ is int:
        return -LARGEST <= value <= LARGEST
    return value.__class__ is float and math.isfinite(value) and -LARGEST <= value <= LARGEST


def _integer(value: Any) -> bool:
    return value.__class__ is int and -LARGEST <= value <= LARGEST


#: Buckets a window is counted in (a rate, a large threshold): their precision is ``window_ms / BUCKETS``.
BUCKETS: Final = 50
#: The largest ``failure_threshold`` counted from exact failure times; a larger one is counted in buckets.
EXACT_FAILURES: Final = 100


def _times(value: Any) -> bool:
    return isinstance(value, list) and all(_number(at) for at in value)


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(
        type(bucket) is list and len(bucket) == 3 and _number(bucket[0]) and _integer(bucket[1])
        and _integer(bucket[2]) for bucket in value)


def _old_outcomes(value: Any) -> bool:
    """The record of releases before the bounded one: every outcome as ``[time, failed]``."""
    return isinstance(value, list) and all(
        type(outcome) is list and len(outcome) == 2 and _number(outcome[0])
        and (outcome[1].__class__ is bool or _integer(outcome[1])) for outcome in value)


def is_record(data: Any) -> bool:
    """Whether ``data`` is a ``snapshot`` (as a shared store gives it back), or the unbounded record
    of earlier releases (``outcomes``), which ``restore`` converts. A store's key may hold
    anything — another deployment or version sharing the prefix, a person — and ``restore`` of
    anything else raised, failing every call of the tool until the key expired (if ever; found by
    attack)."""
    if not isinstance(data, dict) or data.get("state") not in STATES:
        return False
    probe, tokens, until = data.get("probe"), data.get("tokens"), data.get("probe_until")
    if not (_number(data.get("opened_at")) and _integer(tokens) and (probe is None or _integer(probe))
            and (until is None or _number(until))):  # absent from the records of earlier releases
        return False
    if "outcomes" in data:
        return _old_outcomes(data["outcomes"])
    return _times(data.get("failures")) and _counts(data.get("counts"))


class CircuitBreaker:
    """One tool's breaker. ``admit`` decides each call; ``record`` counts an outcome, ``abandon``
    gives back a probe whose call ended without an outcome (denied later, cancelled, host closing).
    Its size is bounded by ``failure_threshold`` and ``BUCKETS`` (module docstring)."""

    def __init__(self, policy: CircuitBreakerPolicy) -> None:
        self.policy = policy
        self.state = CLOSED
        self.opened_at = 0.0
        self.probe: int | None = None  # the token of the probe in flight, if any
        self.probe_until: float | None = None  # when that probe is taken as lost (None: never)
        self._tokens = 0
        #: Times of the latest failures within the window, oldest first: at most ``failure_threshold``.
        self._failures: deque[float] = deque()
        #: With a ``failure_rate``: ``[bucket start, calls, failures]``, oldest first, at most ``BUCKETS``
        #: (more only for a moment after the window changed).
        self._counts: deque[list[Any]] = deque()

    def snapshot(self) -> dict[str, Any]:
        """The breaker as JSON data, for a shared store (``restore`` reads it back)."""
        return {"state": self.state, "opened_at": self.opened_at, "probe": self.probe, "tokens": self._tokens,
                "probe_until": self.probe_until, "failures": list(self._failures), "counts": list(self._counts)}

    @classmethod
    def restore(cls, policy: CircuitBreakerPolicy, data: dict[str, Any] | None) -> CircuitBreaker:
        """A breaker from ``snapshot`` data (None: a new, closed breaker; check other data with
        ``is_record`` first). An earlier release's record (every outcome) is counted into this one."""
        breaker = cls(policy)
        if data:
            breaker.state, breaker.opened_at, breaker.probe = data["state"], data["opened_at"], data["probe"]
            breaker._tokens = data["tokens"]
            breaker.probe_until = data.get("probe_until")
            if "outcomes" in data:
                # In time order: the clock may have stepped back between outcomes, and the latest
                # failures are the ones a threshold keeps.
                for at, failed in sorted(data["outcomes"], key=lambda outcome: outcome[0]):
                    breaker._count(at, bool(failed))
            else:
                # No more than a record of this release holds (a record in a shared store may be
                # anyone's): a longer one was kept as it was and written back whole at every call.
                breaker._failures = deque(data["failures"][-EXACT_FAILURES:])
                breaker._counts = deque(list(bucket) for bucket in data["counts"][-2 * BUCKETS:])
        return breaker

    def admit(self, now: float, bound: float | None = None, *,
              expires: bool = True) -> tuple[bool, str | None, int | None]:
        """(allowed, new state if it changed, probe token if this call is the probe).
        While open, after the cooldown one probe is let through; a probe abandoned without an
        outcome, or held past its bound, lets the next call be the probe. ``bound``: the seconds
        after which this call, if it becomes the probe, is taken as lost (None: never).
        ``expires=False``: the bound is only the refused calls' hint (``retry_after``), the probe
        is never taken as lost — an in-process breaker, whose probe every end of its call releases
        (found by review: a probe held up by a later plugin's ``tool_pre`` hook, which its bound
        does not cover, let a second probe through while it still ran)."""
        state = self.state
        if state == CLOSED:
            return True, None, None
        changed = None
        if state == OPEN:
            if now - self.opened_at < self.policy.cooldown_ms / 1000.0:
                return False, None, None
            self.state = changed = HALF_OPEN
        elif self.probe is not None and (not expires or self.probe_until is None or now < self.probe_until):
            return False, None, None
        self._tokens += 1
        self.probe = self._tokens
        until = None if bound is None else now + bound
        # A bound past what a record keeps exactly (a huge timeout) would make the record foreign.
        self.probe_until = until if until is not None and -LARGEST <= until <= LARGEST else None
        return True, changed, self.probe

    def retry_after(self, now: float) -> float:
        """Seconds until a refused call may be admitted: the rest of the cooldown while open; while
        a probe runs, until its bound ends or one cooldown, whichever is sooner (it may end sooner:
        a success closes the breaker, a failure opens it for a cooldown)."""
        cooldown = self.policy.cooldown_ms / 1000.0
        if self.state == HALF_OPEN and self.probe is not None:
            # Past its bound and still held (an in-process probe, ``expires=False``): one cooldown.
            left = cooldown if self.probe_until is None else self.probe_until - now
            return cooldown if left <= 0 else min(left, cooldown)
        return max(0.0, self.opened_at + cooldown - now)

    def abandon(self, probe: int | None) -> None:
        """The call holding ``probe`` ended without an outcome: the next call may probe."""
        if probe is not None and probe == self.probe:
            self.probe = self.probe_until = None

    def record(self, now: float, failed: bool, probe: int | None) -> str | None:
        """Count one outcome of a call admitted with ``probe`` (None: not a probe); the new state if
        it changed."""
        if self.state == HALF_OPEN:
            if probe is None or probe != self.probe:
                return None  # admitted before the breaker opened: only the probe decides half-open
            self.probe = self.probe_until = None
            if failed:
                self.state, self.opened_at = OPEN, now
                return OPEN
            self.state = CLOSED
            self._failures.clear()
            self._counts.clear()
            return CLOSED
        self._count(now, failed)
        if not failed or self.state != CLOSED:
            return None
        policy = self.policy
        if policy.failure_threshold <= EXACT_FAILURES and policy.failure_rate is None:
            tripped = len(self._failures) >= policy.failure_threshold
        else:
            calls = failures = 0
            for _, in_bucket, failed_in_bucket in self._counts:
                calls += in_bucket
                failures += failed_in_bucket
            exact = policy.failure_threshold <= EXACT_FAILURES
            failures_in_window = len(self._failures) if exact else failures
            tripped = failures_in_window >= policy.failure_threshold or (
                policy.failure_rate is not None and calls >= policy.min_calls
                and failures / calls >= policy.failure_rate)
        if tripped:
            self.state, self.opened_at = OPEN, now
            return OPEN
        return None

    def _count(self, now: float, failed: bool) -> None:
        """Add one outcome at ``now`` and forget what the window no longer holds."""
        policy = self.policy
        window = policy.window_ms / 1000.0
        cutoff = now - window
        failures, counts = self._failures, self._counts
        exact = policy.failure_threshold <= EXACT_FAILURES
        if not exact:
            # Counted in buckets. A reload that raised the threshold past EXACT_FAILURES: the
            # failures kept by time are counted into buckets unless buckets count already (a rate),
            # and not with a rate, which needs the calls that succeeded too.
            if failures and not counts and policy.failure_rate is None:
                for at in failures:
                    self._bucket(at, True, window)
            failures.clear()
        else:
            if not failures and counts:
                # A reload that lowered the threshold to EXACT_FAILURES or below: the failures counted
                # in buckets, each at its bucket's start (never older than it is). Found by attack:
                # they were forgotten, and 150 failures in the window did not open a breaker whose
                # threshold was lowered from 200 to 50.
                for start, _, failed_in_bucket in counts:
                    failures.extend([start] * max(0, min(failed_in_bucket, policy.failure_threshold)))
            if failed:
                failures.append(now)
            while len(failures) > policy.failure_threshold:  # also after a reload lowered it
                failures.popleft()
            while failures and failures[0] < cutoff:
                failures.popleft()
        if policy.failure_rate is None and exact:
            counts.clear()  # nothing is counted in buckets (also when a reload changed the policy)
            return
        self._bucket(now, failed, window)
        # Began at or before the window's start: it may hold older outcomes. The latest bucket, which
        # holds this outcome, stays: with a window shorter than the clock's resolution its start is
        # not after the cutoff (found by attack: the loop then emptied the deque and raised
        # IndexError at every outcome, failing every call of the tool with hook_failed).
        while len(counts) > 1 and counts[0][0] <= cutoff:
            counts.popleft()

    def _bucket(self, at: float, failed: bool, window: float) -> None:
        """Count one outcome at ``at`` into its bucket (the latest one if the clock stepped back)."""
        counts = self._counts
        width = window / BUCKETS
        # ``at - at % width``, not ``(at // width) * width``: a width that underflows to 0 raised
        # ZeroDivisionError, and one so small that ``at // width`` overflows gave an infinite start
        # (found by attack: window_ms = 1e-320 failed every call of the tool with hook_failed).
        start = at - at % width if width > 0 else at
        if counts and counts[-1][0] >= start:  # this bucket (or a later one: the clock stepped back)
            counts[-1][1] += 1
            counts[-1][2] += failed
        else:
            counts.append([start, 1, int(failed)])
