"""Shared policy stores: the interface and the factory.

A ``SharedStore`` holds the policy state that must outlive one process or span
several hosts: fixed-window counters (rate limits), budgets (calls counted,
execution seconds reserved before a call and settled after), leases
(concurrency slots that expire unless renewed), idempotency claims and records,
and circuit-breaker records. Every method is one atomic decision in the store
(one transaction, one script), and every key it writes carries an expiry.

Windows and lease expiries are computed on the *store's* clock (SQLite: this
machine's wall clock; Redis: the server's ``TIME``), so hosts with skewed clocks
still agree on window edges. ``MemoryState`` (``state.py``) stays the per-process
default; the plugin keeps its synchronous fast path for it.

Limits: a store raises ``StoreUnavailable`` for anything that keeps it from
answering (connection refused, timeout, locked database); the plugin turns that
into ``policy_store_unavailable`` or a per-process fallback. Stores never see
secrets in clear: idempotent results are redacted by the plugin first.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from ...errors import ConfigError

PLUGIN: Final = "policy"
SQLITE_FILE: Final = "policy.sqlite3"

#: ``settle``'s window for a reservation whose reply never came (the command timed out, or the
#: call was cancelled during it): the store may or may not have made it, in a window it chose.
UNKNOWN_WINDOW: Final = -1

Update = Callable[[Any, float], tuple[Any, Any]]
"""A read-modify-write step: (stored value or None, the store's now) -> (value to store, result)."""


class StoreUnavailable(Exception):
    """The store did not answer (down, unreachable, locked, timed out); the message says which.
    ``timed_out``: it waited its whole bound (a hung or locked store, where a next operation would
    wait as long), not a failure that came at once (refused, reset). ``hint``: what to do, where
    more is known than ``unavailable_hint`` says."""

    def __init__(self, message: str, *, timed_out: bool = False, hint: str | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.hint = hint


class StoreIncompatible(StoreUnavailable):
    """The store answered, but holds what this release cannot use (a SQLite file of another schema
    version, or no SQLite database at all; in Redis a key of another type) or refuses it (a Redis
    password or ACL permission): retrying does not help, and ``hint`` says what does."""


def unavailable_hint(kind: str) -> str:
    """What to do about a call failed as ``policy_store_unavailable`` on a ``kind`` store, naming the
    settings that govern it (the error's ``hint``, which the command line prints; found by attack:
    a Python caller's error named no setting, and for SQLite the command line sent people to a server)."""
    if kind == "sqlite":
        where = ("check the SQLite file in state_dir ([plugins.policy] store = \"sqlite\"): another process "
                 "may hold it locked past the wait, or it is not a policy store the host made")
    else:
        where = "check the server named by [plugins.policy] store"
    return (f"{where}; store_timeout_ms bounds each wait (cut to the call's deadline); for a long-lived host, "
            "store_unavailable = \"local\" decides in its memory instead of failing (for the command line "
            "that means no limits at all)")


class SharedStore(Protocol):
    """Policy state shared by processes. Keys are given without the deployment prefix."""

    kind: str
    where: str
    #: The real path of a unix socket the store connects through, else None: whoever can replace
    #: it answers every decision, so the host protects it.
    socket: str | None

    def take(self, key: str, interval: float, limit: int) -> Awaitable[int]:
        """Take one unit of ``key``'s current window if fewer than ``limit`` are taken. One integer
        (``taken``): the window (≥ 0, what ``untake`` needs) when a unit was taken, else -1 - the
        milliseconds until the next window (``next_window`` reads it). A plain method returning an
        awaitable, so a store may hand back its command's own coroutine: no frame of its own
        between a decision and the store, on the way out and on the way back."""

    async def untake(self, key: str, interval: float, window: int) -> None:
        """Give back one unit of ``key`` in ``window`` (a call that was not admitted after all)."""

    async def lease(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        """Take a lease on one of ``limit`` slots of ``key`` for ``ttl`` seconds; expired leases are free."""

    async def renew(self, key: str, holder: str, ttl: float) -> bool:
        """Extend ``holder``'s lease; False when it had already expired (and may have been taken)."""

    async def release(self, key: str, holder: str) -> None:
        """Give back ``holder``'s lease."""

    async def reserve(self, key: str, interval: float, max_calls: int | None, max_seconds: float | None,
                      want: float | None, holder: str, ttl: float) -> tuple[str, int, float]:
        """Count a call against budget ``key`` and reserve execution seconds for it (at most ``want``,
        at most what is left): (``ok`` | ``calls`` | ``used`` | ``reserved``, window, seconds reserved)."""

    async def settle(self, key: str, interval: float, window: int, holder: str, elapsed: float | None) -> None:
        """End ``holder``'s reservation: add ``elapsed`` execution seconds, or (None) give back the call.
        ``window`` ``UNKNOWN_WINDOW`` (``elapsed`` None): the reservation's reply never came; the store
        gives back what it finds of ``holder``'s, if anything (never sent to SQLite, whose operations
        are not cut part-way: one that failed made nothing)."""

    async def claim(self, key: str, digest: str, holder: str, ttl: float) -> tuple[str, str | None, str | None]:
        """Claim an idempotency slot: (``claimed``, ..) | (``running``, digest, None) | (``stored``, digest, value)."""

    async def resolve(self, key: str, holder: str, digest: str, value: str | None, ttl: float) -> bool:
        """End ``holder``'s claim: store ``value`` for ``ttl`` seconds, or (None) drop the claim.
        False when the claim was no longer ``holder``'s (it expired): nothing was stored."""

    async def get(self, key: str) -> Any:
        """The record ``update`` last wrote for ``key`` (None when absent or expired)."""

    async def update(self, key: str, step: Update, ttl: float) -> Any:
        """Atomically read, transform and write one record (breakers); ``step``'s result."""

    def limit_wait(self, seconds: float) -> None:
        """Bound the store's own waits from the next operation on by ``seconds``: SQLite's busy
        timeout (kept until changed again), a Redis command's deadline (the next command only;
        it is read as that command starts, so call this right before it, with no await between).
        Every operation is bounded by the store timeout unless told less."""

    async def status(self) -> list[dict[str, Any]]:
        """Every live key under the prefix, with its value: ``{"key", "kind", "value", "expires_in"}``."""

    async def close(self) -> None: ...


def load_record(raw: str | bytes) -> Any:
    """A record ``update`` wrote, read back. What is not JSON was not written by ``update`` (another
    deployment or version sharing the prefix, a person): it comes back as its text (the first 80
    characters), which no caller takes for a record, rather than as an error that failed every
    call of the tool (found by attack)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # ValueError: not JSON, or not UTF-8; RecursionError: nested too deep
        return (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)[:80]


def next_window(out: int) -> float:
    """Seconds until the next window, from ``take``'s answer when nothing was taken (< 0)."""
    return (-1 - out) / 1000.0


def not_taken(seconds: float) -> int:
    """``take``'s answer when nothing was taken and the next window opens in ``seconds``: whole
    milliseconds, rounded up (a caller that sleeps that long is past the window's edge)."""
    return -1 - max(math.ceil(seconds * 1000.0), 0)  # never ≥ 0 ("taken"), whatever the clock said


def open_store(store: str, prefix: str, timeout: float, state_dir: str | os.PathLike[str] | None) -> SharedStore:
    """The shared store ``store`` names (not ``memory``); Redis is imported only when configured."""
    if store == "sqlite":
        if state_dir is None:
            raise ConfigError("'sqlite' needs the host's state_dir, and this host has none",
                              key=f"plugins.{PLUGIN}.store", hint="use a ToolHost (it has a state_dir) or 'memory'")
        from .sqlite_store import SQLiteStore

        return SQLiteStore(os.path.join(os.fspath(state_dir), SQLITE_FILE), prefix, timeout)
    try:
        from .redis_store import RedisStore
    except ImportError:
        # The extra in the message too: a host started from Python gets the message, not the hint
        # (found by a new-user trial of the core install).
        raise ConfigError("a Redis store needs the 'redis' extra, which is not installed "
                          "(pip install 'amplifier-tools[redis]')", key=f"plugins.{PLUGIN}.store",
                          hint="pip install 'amplifier-tools[redis]'") from None
    return RedisStore(store, prefix, timeout)
