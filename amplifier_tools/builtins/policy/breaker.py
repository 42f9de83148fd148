"""Circuit breakers: closed -> open after failures -> half-open probe -> closed (or open again)."""

from __future__ import annotations

from collections import deque
from typing import Final

from ...spec import CircuitBreakerPolicy

CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"


class CircuitBreaker:
    """One tool's breaker. Outcomes are recorded with ``record``; ``admit`` decides each call."""

    def __init__(self, policy: CircuitBreakerPolicy) -> None:
        self.policy = policy
        self.state = CLOSED
        self.opened_at = 0.0
        self.probe_in_flight = False
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._failures = 0  # failures among _outcomes, kept in step so recording is O(1)

    def admit(self, now: float) -> tuple[bool, str | None]:
        """(allowed, new state if it changed). While open, after the cooldown one probe is let through."""
        if self.state == OPEN and now - self.opened_at >= self.policy.cooldown_ms / 1000.0:
            self.state = HALF_OPEN
            self.probe_in_flight = True
            return True, HALF_OPEN
        if self.state == OPEN or (self.state == HALF_OPEN and self.probe_in_flight):
            return False, None
        if self.state == HALF_OPEN:
            self.probe_in_flight = True
        return True, None

    def retry_after(self, now: float) -> float:
        return max(0.0, self.opened_at + self.policy.cooldown_ms / 1000.0 - now)

    def record(self, now: float, failed: bool) -> str | None:
        """Count one outcome; the new state if it changed."""
        if self.state == HALF_OPEN:
            self.probe_in_flight = False
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
