"""Deadlines for many short awaits with one timer: what bounds each Redis store operation.

``asyncio.timeout`` arms and cancels a timer per operation (≈ 9 µs of CPU per operation on the
shared 2-core machine, a third of the Redis store's budget per decision). A ``Watchdog`` keeps the
deadline of every task inside a bounded operation in a dict and one timer for the earliest of
them; an operation costs a dict insert and delete. When the timer fires, every task past its
deadline is cancelled — exactly what ``asyncio.timeout`` does — and ``expired`` tells the task
that the cancellation was the watchdog's, so it can turn it into its own error.

Limits: a task is in at most one bounded operation at a time (nesting is refused); the timer is
re-armed only when a new deadline is earlier than the armed one, so after the earliest operation
ends the timer may fire once for nothing (it then re-arms for the earliest live deadline).
"""

from __future__ import annotations

import asyncio
import math
import sys

if sys.version_info >= (3, 11):

    def _requests(task: asyncio.Task[object]) -> int:
        """The cancellation requests standing on ``task``."""
        return task.cancelling()

else:  # pragma: no cover - exercised by the py310 tox env

    def _requests(task: asyncio.Task[object]) -> int:
        """Not counted before CPython 3.11."""
        return 0


class Watchdog:
    """Cancels each registered task that is still registered at its deadline (loop time)."""

    __slots__ = ("_at", "_due", "_expired", "_handle")

    def __init__(self) -> None:
        #: Task -> (its deadline, its cancellation requests standing when it entered).
        self._due: dict[asyncio.Task[object], tuple[float, int]] = {}
        #: Tasks the watchdog cancelled -> their requests standing when they entered.
        self._expired: dict[asyncio.Task[object], int] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def enter(self, task: asyncio.Task[object], deadline: float) -> None:
        """Bound ``task``'s next awaits by ``deadline`` (``loop.time()`` clock) until ``leave``."""
        if task in self._due:
            raise RuntimeError("a task is in one bounded operation at a time")
        self._due[task] = (deadline, _requests(task))
        if deadline < self._at:
            self._arm(deadline)

    def leave(self, task: asyncio.Task[object]) -> bool:
        """End ``task``'s bounded operation; True when the watchdog cancelled it (its deadline
        passed) and nobody else did: the caller then raises its own error instead of the
        ``CancelledError``. On 3.11+ the watchdog's cancellation is withdrawn from the task's
        count, as ``asyncio.timeout`` does; a cancellation from elsewhere still propagates."""
        self._due.pop(task, None)
        before = self._expired.pop(task, None)
        if before is None:
            return False
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        # Compared with the requests standing when the operation began, as ``asyncio.timeout`` does:
        # one left over from earlier (a cancellation caught and never withdrawn, a task group's on
        # CPython before 3.12.3) is no cancellation of this operation (found by review: compared
        # with zero, such a task's expiry was raised as a cancellation, not the store's error).
        return uncancel is None or uncancel() <= before

    def _arm(self, deadline: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = deadline
        self._handle = asyncio.get_running_loop().call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        now = asyncio.get_running_loop().time()
        earliest = math.inf
        for task, (deadline, before) in list(self._due.items()):
            if deadline <= now:
                del self._due[task]
                if not task.done():
                    self._expired[task] = before
                    task.cancel()
            elif deadline < earliest:
                earliest = deadline
        if earliest < math.inf:
            self._arm(earliest)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = None, math.inf
        self._due.clear()
        self._expired.clear()
