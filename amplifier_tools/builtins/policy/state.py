"""Per-process policy state (``store = "memory"``, the library default).

``PolicyState`` holds fixed-window counters (rate limits, budgets) and the
idempotency results; ``MemoryState`` keeps them in this process, read and
written synchronously on the plugin's fast path. Concurrency slots and breakers
live in the plugin itself. State shared by processes (SQLite, Redis) is a
different, asynchronous interface: ``SharedStore`` in ``store.py``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import attrs

from ..._json import canonical, dumps
from ...spec import Budget


class PolicyState(Protocol):
    """The counters and records policies share."""

    def add(self, key: str, window: int, amount: float, interval: float) -> float:
        """Add ``amount`` to the counter of ``key`` in ``window`` (``int(now // interval)``); the
        new total."""

    def get(self, key: str, window: int) -> float:
        """The counter of ``key`` in ``window`` (0 when unset)."""

    def remember(self, key: str, value: Any, expires_at: float, now: float) -> None:
        """Store an idempotency record until ``expires_at``."""

    def recall(self, key: str, now: float) -> Any | None:
        """A stored, unexpired idempotency record, or None."""


#: Entries kept before the first sweep of ended windows or expired records; after it, a sweep runs
#: each time the table has doubled since the last (amortized O(1) per write).
SWEEP_FROM: Final = 1024


class MemoryState:
    """``PolicyState`` in this process's memory: each key's current window only (a newer window
    replaces it), ended windows and expired records swept out as the tables grow.

    Found by attack: each key entering a new window rebuilt the whole table (4 s of the event loop
    for one window of 8,000 principals, quadratic), and neither the counters of principals gone
    quiet nor the idempotency records of keys never asked again were ever dropped."""

    def __init__(self) -> None:
        self._counters: dict[str, tuple[int, float, float]] = {}  # key -> (window, total, window end)
        self._records: dict[str, tuple[Any, float]] = {}  # key -> (record, expires at)
        self._now = float("-inf")  # the latest window start written: time is at least this
        self._counters_swept = self._records_swept = 0  # the table sizes after their last sweep

    def add(self, key: str, window: int, amount: float, interval: float) -> float:
        entry = self._counters.get(key)
        if entry is not None and entry[0] == window:
            total = entry[1] + amount
            self._counters[key] = (window, total, entry[2])
            return total
        if entry is not None and entry[0] > window:
            return amount  # a window already over for this key (a late settlement): nothing reads it
        start = window * interval
        if start > self._now:
            self._now = start
        self._counters[key] = (window, amount, start + interval)
        if len(self._counters) > 2 * max(self._counters_swept, SWEEP_FROM // 2):
            now = self._now
            self._counters = {k: v for k, v in self._counters.items() if v[2] > now}
            self._counters_swept = len(self._counters)
        return amount

    def get(self, key: str, window: int) -> float:
        entry = self._counters.get(key)
        return entry[1] if entry is not None and entry[0] == window else 0.0

    def remember(self, key: str, value: Any, expires_at: float, now: float) -> None:
        self._records[key] = (value, expires_at)
        if len(self._records) > 2 * max(self._records_swept, SWEEP_FROM // 2):
            self._records = {k: v for k, v in self._records.items() if v[1] > now}
            self._records_swept = len(self._records)

    def recall(self, key: str, now: float) -> Any | None:
        entry = self._records.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._records[key]
            return None
        return entry[0]


#: The plugin's default clock: ``time.monotonic`` itself, not a function calling it (the decision
#: path reads it once or twice per call, and a Python frame around it costs more than the read).
monotonic: Callable[[], float] = time.monotonic


@attrs.frozen(slots=True)
class BudgetPool:
    """The budgets of one subject kind (``per``) and one window length, as one counter with the
    tightest of their limits. Found by attack: two budgets of one principal shared a key whatever
    their windows, so a one-minute budget's new window wiped the hourly one (30 calls of an hourly
    5 admitted in 10 minutes), and two budgets of one window counted each call twice."""

    per: str
    window_ms: float
    max_calls: int | None
    max_seconds: float | None

    def key(self, subject: Any) -> str:
        """The counter's key for ``subject`` (the same in every store: every host shares it). A
        subject that is not a string (a caller's ``principal=None``, ``1``) is named with its type:
        it never shares a counter with the string that reads the same."""
        window = int(self.window_ms) if float(self.window_ms).is_integer() else self.window_ms
        name = subject if subject.__class__ is str else f"{type(subject).__name__}:{subject!r}"
        return f"budget:{self.per}:{window}ms:{name}"

    def applies(self, subject: Any) -> bool:
        """Whether a call whose subject is ``subject`` counts: every call for a per-principal
        budget (found by attack: ``principal=None`` escaped it); a call with a role or environment
        for the others."""
        return subject is not None or self.per == "principal"


def _tighter(first: float | None, second: float | None) -> Any:
    return second if first is None else first if second is None else min(first, second)


def budget_pools(budgets: tuple[Budget, ...]) -> tuple[BudgetPool, ...]:
    """``budgets`` merged by subject kind and window length, in the order first declared."""
    pools: dict[tuple[str, float], BudgetPool] = {}
    for budget in budgets:
        found = pools.get((budget.per, budget.window_ms))
        pools[(budget.per, budget.window_ms)] = BudgetPool(budget.per, budget.window_ms, budget.max_calls,
                                                           budget.max_seconds) if found is None else \
            BudgetPool(budget.per, budget.window_ms, _tighter(found.max_calls, budget.max_calls),
                       _tighter(found.max_seconds, budget.max_seconds))
    return tuple(pools.values())


#: The shortest window a counter keeps, in seconds: a clock reading tells no shorter one apart.
SHORTEST_WINDOW: Final = 1e-9


def interval_of(window_ms: float) -> float:
    """A rate limit's or budget's window in seconds, at least ``SHORTEST_WINDOW``: windows are
    numbered ``int(now // interval)``, and an interval so short that the quotient is infinite
    raised ``OverflowError`` (found by attack: ``interval_ms = 1e-310``, which the spec accepts as
    positive and finite, failed every call of the tool with ``hook_failed``)."""
    return max(window_ms / 1000.0, SHORTEST_WINDOW)


def rate_key(tool: str, principal: str | None) -> str:
    """The counter key of a rate limit of ``tool``, per tool (``principal`` None) or per principal,
    the same in every store. A tool name has single ``:`` nowhere (``spec.NAME_PATTERN``: segments
    joined by ``::``), so the first single ``:`` after the name ends it, as long as the principal
    does not begin with ``:``; a principal that begins with ``:`` or ``"`` is written as a JSON
    string, every other as it is (the keys of earlier releases stay the same). Found by attack:
    principal ``":b"`` of tool ``a`` and tool ``a::b`` were both counted on ``rate:a::b``, and
    principal ``"::b:x"`` of tool ``a`` on principal ``x``'s counter of tool ``a::b``."""
    if principal is None:
        return f"rate:{tool}"
    if principal[:1] in (":", '"'):
        principal = json.dumps(principal)
    return f"rate:{tool}:{principal}"


def retry_hint(seconds: float, *, least: float = 0.0) -> float:
    """``seconds`` until a refused call may succeed, as a ``retry_after`` in whole milliseconds,
    rounded up (never earlier than the moment it names) and at least ``least``. Found by attack:
    rounded to the nearest, a rate limit of 100 ms answered ``retry_after = 0.0`` (the next window
    was 1e-13 s away), a caller retrying then was refused again, and a queued call on a clock that
    moves only when slept on (``tests/helpers.FakeClock``) slept 0 s for ever."""
    milliseconds = seconds * 1000.0
    return max(math.ceil(milliseconds) / 1000.0 if math.isfinite(milliseconds) else seconds, least)


def idempotency_slot(principal: str, tool: str, key: str, arguments: Any) -> tuple[str, str]:
    """``(slot, digest)`` of an idempotency key, the same in every store and on every host.

    The slot is keyed by principal too: another principal's call with the same key is another call
    — it must neither replay this one's result (which may hold its secrets) nor wait for it. JSON
    keeps the parts apart whatever they contain (a principal may hold ':'). The digest is of the
    arguments' canonical JSON (``_json.canonical``: the same bytes whatever encoder a host has);
    arguments that JSON cannot hold as they are fall back to the host's encoder.
    """
    slot = "idem:" + json.dumps([principal, tool, key])
    try:
        encoded = canonical(arguments)
    except (TypeError, ValueError):
        encoded = dumps(arguments)
    return slot, hashlib.sha256(encoded).hexdigest()
