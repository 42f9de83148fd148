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
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..._json import canonical, dumps


class PolicyState(Protocol):
    """The counters and records policies share."""

    def add(self, key: str, window: int, amount: float) -> float:
        """Add ``amount`` to the counter of ``key`` in ``window``; the new total."""

    def get(self, key: str, window: int) -> float:
        """The counter of ``key`` in ``window`` (0 when unset)."""

    def remember(self, key: str, value: Any, expires_at: float) -> None:
        """Store an idempotency record until ``expires_at``."""

    def recall(self, key: str, now: float) -> Any | None:
        """A stored, unexpired idempotency record, or None."""


class MemoryState:
    """``PolicyState`` in this process's memory; old windows are dropped as time moves on."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, int], float] = {}
        self._records: dict[str, tuple[Any, float]] = {}
        self._latest: dict[str, int] = {}

    def add(self, key: str, window: int, amount: float) -> float:
        latest = self._latest.get(key)
        if latest is None or latest < window:
            if latest is not None:  # a new window: forget older ones of this key
                self._counters = {k: v for k, v in self._counters.items() if k[0] != key or k[1] >= window}
            self._latest[key] = window
        total = self._counters.get((key, window), 0.0) + amount
        self._counters[(key, window)] = total
        return total

    def get(self, key: str, window: int) -> float:
        return self._counters.get((key, window), 0.0)

    def remember(self, key: str, value: Any, expires_at: float) -> None:
        self._records[key] = (value, expires_at)

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
