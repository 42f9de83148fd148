"""Circuit breakers: closed -> open after failures -> half-open probe -> closed (or open again).

Only the probe decides half-open: each probe gets a fresh token, and an outcome
that does not carry the current probe's token (a slow call admitted while the
breaker was still closed) never moves the breaker out of half-open.
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


def is_record(data: Any) -> bool:
    """Whether ``data`` is a ``snapshot`` (as a shared store gives it back). A store's key may hold
    anything — another deployment or version sharing the prefix, a person — and ``restore`` of
    anything else raised, failing every call of the tool until the key expired (if ever; found by
    attack)."""
    if not isinstance(data, dict) or data.get("state") not in STATES:
        return False
    probe, tokens, outcomes = data.get("probe"), data.get("tokens"), data.get("outcomes")
    return (_number(data.get("opened_at")) and _integer(tokens) and (probe is None or _integer(probe))
            and isinstance(outcomes, list)
            and all(type(outcome) is list and len(outcome) == 2 and _number(outcome[0])
                    and (outcome[1].__class__ is bool or _integer(outcome[1])) for outcome in outcomes))


class CircuitBreaker:
    """One tool's breaker. ``admit`` decides each call; ``record`` counts an outcome, ``abandon``
    gives back a probe whose call ended without an outcome (denied later, cancelled, host closing)."""

    def __init__(self, policy: CircuitBreakerPolicy) -> None:
        self.policy = policy
        self.state = CLOSED
        self.opened_at = 0.0
        self.probe: int | None = None  # the token of the probe in flight, if any
        self._tokens = 0
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._failures = 0  # failures among _outcomes, kept in step so recording is O(1)

    def snapshot(self) -> dict[str, Any]:
        """The breaker as JSON data, for a shared store (``restore`` reads it back)."""
        return {"state": self.state, "opened_at": self.opened_at, "probe": self.probe, "tokens": self._tokens,
                "outcomes": [[at, failed] for at, failed in self._outcomes]}

    @classmethod
    def restore(cls, policy: CircuitBreakerPolicy, data: dict[str, Any] | None) -> CircuitBreaker:
        """A breaker from ``snapshot`` data (None: a new, closed breaker; check other data with
        ``is_record`` first)."""
        breaker = cls(policy)
        if data:
            breaker.state, breaker.opened_at, breaker.probe = data["state"], data["opened_at"], data["probe"]
            breaker._tokens = data["tokens"]
            breaker._outcomes = deque((at, bool(failed)) for at, failed in data["outcomes"])
            breaker._failures = sum(failed for _, failed in breaker._outcomes)
        return breaker

    def admit(self, now: float) -> tuple[bool, str | None, int | None]:
        """(allowed, new state if it changed, probe token if this call is the probe).
        While open, after the cooldown one probe is let through; a probe abandoned without an
        outcome lets the next call be the probe."""
        state = self.state
        if state == CLOSED:
            return True, None, None
        changed = None
        if state == OPEN:
            if now - self.opened_at < self.policy.cooldown_ms / 1000.0:
                return False, None, None
            self.state = changed = HALF_OPEN
        elif self.probe is not None:
            return False, None, None
        self._tokens += 1
        self.probe = self._tokens
        return True, changed, self.probe

    def retry_after(self, now: float) -> float:
        return max(0.0, self.opened_at + self.policy.cooldown_ms / 1000.0 - now)

    def abandon(self, probe: int | None) -> None:
        """The call holding ``probe`` ended without an outcome: the next call may probe."""
        if probe is not None and probe == self.probe:
            self.probe = None

    def record(self, now: float, failed: bool, probe: int | None) -> str | None:
        """Count one outcome of a call admitted with ``probe`` (None: not a probe); the new state if
        it changed."""
        if self.state == HALF_OPEN:
            if probe is None or probe != self.probe:
                return None  # admitted before the breaker opened: only the probe decides half-open
            self.probe = None
            if failed:
                self.state, self.opened_at = OPEN, now
                return OPEN
            self.state = CLOSED
            self._outcomes.clear()
            self._failures = 0
            return CLOSED
        outcomes = self._outcomes
        outcomes.append((now, failed))
        self._failures += failed
        cutoff = now - self.policy.window_ms / 1000.0
        while outcomes[0][0] < cutoff:
            self._failures -= outcomes.popleft()[1]
        if not failed or self.state != CLOSED:
            return None
        failures = self._failures
        calls = len(self._outcomes)
        tripped = failures >= self.policy.failure_threshold or (
            self.policy.failure_rate is not None and calls >= self.policy.min_calls
            and failures / calls >= self.policy.failure_rate)
        if tripped:
            self.state, self.opened_at = OPEN, now
            return OPEN
        return None
