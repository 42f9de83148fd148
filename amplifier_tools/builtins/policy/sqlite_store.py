"""``SharedStore`` in an embedded SQLite file (stdlib ``sqlite3``, WAL): one machine, many processes.

Every decision is one short ``BEGIN IMMEDIATE`` transaction, so processes on
this machine that share the file (the CLI's invocations, several hosts with one
``state_dir``) see one rate limit, one budget, one set of concurrency leases,
one breaker and one set of idempotency records. Times are this machine's wall
clock (``time.time``), the one clock all its processes share. Expired rows are
deleted as keys are touched and in a sweep every few hundred transactions.

The file is host state: its directory is created ``0700`` and the file is
created and checked with ``open_host_file`` (regular, ours, no symlink) before
SQLite opens it, and each decision checks that the path still names that file (else it is
opened anew). Its layout is versioned (``PRAGMA user_version``, ``SCHEMA_VERSION``): a file of
another version, or no SQLite database, is refused as ``StoreIncompatible`` and left as it is.
Limits: the queries run on the event loop's thread (a
transaction is tens of microseconds; a writer waiting on another process's lock
waits at most the store timeout, as SQLite's busy timeout); not for network
file systems, where SQLite's locking is unreliable.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Final

from ...hoststate import HostFileError, ensure_state_dir, open_host_file
from .store import StoreIncompatible, StoreUnavailable, Update, load_record, not_taken

#: The file's tables, in the layout ``SCHEMA_VERSION`` names.
SCHEMA: Final = {
    "counters": "CREATE TABLE counters (key TEXT PRIMARY KEY, value REAL NOT NULL, expires REAL NOT NULL)",
    "leases": "CREATE TABLE leases (key TEXT NOT NULL, holder TEXT NOT NULL, amount REAL NOT NULL, "
              "expires REAL NOT NULL, PRIMARY KEY (key, holder))",
    "records": "CREATE TABLE records (key TEXT PRIMARY KEY, holder TEXT, digest TEXT NOT NULL, value TEXT, "
               "expires REAL NOT NULL)",
    "blobs": "CREATE TABLE blobs (key TEXT PRIMARY KEY, value TEXT NOT NULL, expires REAL NOT NULL)",
}
#: The layout of ``SCHEMA``, kept in the file as ``PRAGMA user_version``. Raise it with any change of
#: ``SCHEMA``, and have ``_check_schema`` read or convert the files of the version before.
SCHEMA_VERSION: Final = 1
SQLITE_NOTADB: Final = 26
log = logging.getLogger("amplifier_tools.policy")

SWEEP_EVERY: Final = 500
SQLITE_BUSY: Final = 5  # result codes (sqlite3 names them only from Python 3.11)
SQLITE_LOCKED: Final = 6
#: The largest integer SQLite binds: a rate limit above it (the contract sets no upper bound) is cut
#: to it, which no window's count reaches (found by attack: a limit of 2**63 failed every call of
#: the tool with ``hook_failed``, ``OverflowError``).
SQLITE_MAX_INTEGER: Final = 2**63 - 1
#: With RETURNING (SQLite 3.35+) a rate-limit decision is one statement, its own transaction.
ONE_STATEMENT: Final = sqlite3.sqlite_version_info >= (3, 35, 0)
TAKE: Final = ("INSERT INTO counters VALUES (?, 1, ?) ON CONFLICT(key) DO UPDATE SET value = value + 1 "
               "WHERE value < ? RETURNING value")


def _busy_ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


def _not_a_database(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's "file is not a database" (``SQLITE_NOTADB``)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; before, only the message tells
    if code is not None:
        return bool(code & 0xFF == SQLITE_NOTADB)
    return "file is not a database" in str(exc)


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]


def _schema_columns() -> dict[str, list[str]]:
    """Each table's columns as ``SCHEMA`` makes them (SQLite's own reading of it)."""
    reference = sqlite3.connect(":memory:")
    try:
        for create in SCHEMA.values():
            reference.execute(create)
        return {table: _columns(reference, table) for table in SCHEMA}
    finally:
        reference.close()


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "locked by another connection" (``SQLITE_BUSY``/``SQLITE_LOCKED``)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; before, only the message tells
    if code is not None:
        return code & 0xFF in (SQLITE_BUSY, SQLITE_LOCKED)
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


class SQLiteStore:
    """Policy state in ``path``; keys are stored under ``prefix``."""

    kind = "sqlite"
    socket: str | None = None  # a file, protected as such by the plugin

    def __init__(self, path: str, prefix: str, timeout: float) -> None:
        self.where = path
        self.prefix = prefix
        self.timeout = timeout
        self._db: sqlite3.Connection | None = None
        self._ops = 0
        self._busy_ms = _busy_ms(timeout)  # the connection's busy timeout (sqlite3.connect sets it)
        self._file = (0, 0)  # the device and inode of the file the connection has open

    def _connect(self, wait: float) -> sqlite3.Connection:
        """A connection, its file checked, set up and waiting at most ``wait`` seconds for another
        process's lock, in its setup too: a call whose deadline is shorter than the store timeout,
        on a store not connected yet (every ``amplifier-tools call``), is not held past its deadline
        (found by attack: a locked file held a 0.2 s call for the whole 2 s ``store_timeout_ms``)."""
        try:
            directory = ensure_state_dir(Path(self.where).parent)
            fd = open_host_file(directory / Path(self.where).name, os.O_RDWR | os.O_CREAT)
            try:
                info = os.fstat(fd)
            finally:
                os.close(fd)
        except HostFileError:
            raise  # not the host's own file (a symlink, FIFO, hard link, another owner): refused, never "local"
        except OSError as exc:
            # The file cannot be opened (a read-only or full file system, no permission): the store
            # is down, as a locked or full database is (found by attack: it failed every call as
            # hook_failed, and store_unavailable = "local" never fell back).
            raise StoreUnavailable(f"SQLite store {self.where}: {exc}") from exc
        db = sqlite3.connect(self.where, timeout=wait, isolation_level=None, check_same_thread=False)
        try:
            self._set_up(db, wait)
        except BaseException:
            db.close()
            raise
        self._busy_ms = _busy_ms(wait)  # while not connected it stays the store timeout's
        self._file = (info.st_dev, info.st_ino)
        return db

    def _connection(self) -> sqlite3.Connection:
        """The connection, opened anew when there is none or the path no longer names the file it
        has open (removed or replaced: a state directory cleaned while a host runs). Kept, the old
        file would count for this process alone while every other one counted in the new file
        (found by attack: a rate limit of 3 admitted 4 calls across two hosts; a symlink put in its
        place, which the next process refuses, went unnoticed). One ``lstat`` a decision."""
        db = self._db
        if db is not None:
            try:
                info = os.lstat(self.where)
                if (info.st_dev, info.st_ino) == self._file:
                    return db
            except OSError:
                pass  # removed: a new file is created, as the other processes will
            self._db = None
            db.close()
        # The bound the next statements have; the store timeout's again until connected.
        wait, self._busy_ms = self._busy_ms / 1000.0, _busy_ms(self.timeout)
        db = self._db = self._connect(wait)
        return db

    def _set_up(self, db: sqlite3.Connection, wait: float) -> None:
        """WAL mode and the tables (``_check_schema``), retried while another process sets up the
        same new file.

        Switching a new file to WAL takes an exclusive lock, and a process that asks while
        another holds it gets ``SQLITE_BUSY`` at once (SQLite's deadlock rule skips the busy
        timeout there), so several processes starting on one new file would fail their first
        calls closed. Retried with a short backoff for at most ``wait``."""
        deadline = time.monotonic() + wait
        pause = 0.001
        while True:
            try:
                self._check_schema(db, create=False)  # a foreign file is refused before anything changes it
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL: a power loss may lose the last decisions, never corrupt
                self._check_schema(db, create=True)
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() + pause > deadline:
                    raise
            except sqlite3.DatabaseError as exc:
                if _not_a_database(exc):
                    raise self._incompatible("is not a SQLite database") from exc
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _check_schema(self, db: sqlite3.Connection, *, create: bool) -> None:
        """Use the file only in the layout of ``SCHEMA_VERSION``: a new file gets the tables and the
        version (``create``), in one transaction (a process opening it at the same moment waits for
        it and then finds them); a file of version 0 whose tables are ours (made before files had a
        version) is adopted; any other is refused (``StoreIncompatible``), never used. Found by
        review: a file of another layout was used as it was."""
        if db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return  # one read on each connection: the common case
        if not create:
            self._missing_tables(db)  # refuses a foreign file
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the lock: another process may have set the file up meanwhile.
            if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                for table in self._missing_tables(db):
                    db.execute(SCHEMA[table])
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _missing_tables(self, db: sqlite3.Connection) -> list[str]:
        """The tables of ``SCHEMA`` a file of version 0 lacks (all, when new); refused
        (``StoreIncompatible``) when it has another version, other tables, or ours of other columns."""
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:  # another process set the file up since the caller's read
            return []
        if version != 0:
            raise self._incompatible(f"has schema version {version}; this release reads version {SCHEMA_VERSION}")
        tables = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")}
        foreign = sorted(tables - SCHEMA.keys())
        if foreign:
            raise self._incompatible(f"has schema version 0 (none) and tables that are not a policy store's "
                                     f"({', '.join(foreign)}); this release reads version {SCHEMA_VERSION}")
        expected = _schema_columns() if tables else {}
        for table in sorted(tables):
            if _columns(db, table) != expected[table]:
                raise self._incompatible(f"has schema version 0 (none) and a table {table!r} of other columns; "
                                         f"this release reads version {SCHEMA_VERSION}")
        return [table for table in SCHEMA if table not in tables]

    def _incompatible(self, found: str) -> StoreIncompatible:
        """A refusal of the file, naming it, what was ``found`` and what to do."""
        return StoreIncompatible(
            f"SQLite store {self.where} {found}",
            hint=("the file holds only policy state that expires (counters, leases, breaker records, idempotency "
                  "results): delete or move it and the host makes a new one, or set state_dir to another "
                  "directory ([plugins.policy] store = \"sqlite\" keeps its file there); hosts of releases that "
                  "read different schema versions cannot share one state_dir"))

    def _unavailable(self, exc: sqlite3.Error) -> StoreUnavailable:
        """``exc`` as the store's failure; timed out when another process's lock outlasted the bound."""
        locked = isinstance(exc, sqlite3.OperationalError) and _busy(exc)
        return StoreUnavailable(f"SQLite store {self.where}: {exc}", timed_out=locked)

    def _run(self, work: Any, *args: Any, read_only: bool = False) -> Any:
        """Run ``work(db, now, *args)`` as one immediate transaction (a deferred one, which takes no
        write lock and so holds up no deciding host, with ``read_only``)."""
        try:
            db = self._connection()
            db.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
            try:
                now = time.time()
                if not read_only:
                    self._ops += 1
                    if self._ops % SWEEP_EVERY == 0:
                        self._sweep(db, now)
                out = work(db, now, *args)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    def limit_wait(self, seconds: float) -> None:
        """Wait at most ``seconds`` for another process's lock in the next statements (SQLite's busy
        timeout, in whole milliseconds). The ``PRAGMA`` runs only when the value changes: a call
        without a deadline shorter than the store timeout costs none; one with such a deadline one."""
        ms = _busy_ms(seconds)
        if ms == self._busy_ms:  # also when not connected yet: connecting sets the store timeout's
            return
        try:
            db = self._db
            if db is None:  # connecting waits ``seconds`` (its setup too) and sets the busy timeout
                self._db = self._connect(seconds)
                return
            db.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_ms = ms
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc

    @staticmethod
    def _sweep(db: sqlite3.Connection, now: float) -> None:
        """Delete every expired row, so the file does not grow without bound."""
        for table in ("counters", "leases", "records", "blobs"):
            db.execute(f"DELETE FROM {table} WHERE expires <= ?", (now,))

    # -- counters ---------------------------------------------------------------------

    @staticmethod
    def _counter(db: sqlite3.Connection, key: str, now: float) -> float:
        row = db.execute("SELECT value FROM counters WHERE key = ? AND expires > ?", (key, now)).fetchone()
        return float(row[0]) if row else 0.0

    @staticmethod
    def _add_live(db: sqlite3.Connection, key: str, amount: float, now: float, expires: float) -> None:
        db.execute("INSERT INTO counters VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                   "value = CASE WHEN counters.expires > ? THEN counters.value ELSE 0 END + excluded.value, "
                   "expires = max(counters.expires, excluded.expires)", (key, amount, expires, now))

    async def take(self, key: str, interval: float, limit: int) -> int:
        return self.take_now(key, interval, limit)

    def take_now(self, key: str, interval: float, limit: int) -> int:
        """``take`` without a coroutine: the plugin decides a lone rate limit inside ``tool_pre``."""
        if ONE_STATEMENT:  # a window's key is never reused after it expires, so no expiry check is needed
            now = time.time()
            window = int(now // interval)
            try:
                db = self._connection()
                # fetchall: the statement must run to its end, else its implicit transaction stays open
                taken = db.execute(TAKE, (f"{self.prefix}{key}@{window}", (window + 2) * interval,
                                          min(limit, SQLITE_MAX_INTEGER))).fetchall()
                self._ops += 1
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc
            if self._ops % SWEEP_EVERY == 0:
                try:
                    self._run(self._sweep)
                except StoreUnavailable as exc:
                    # The unit is taken: the call is decided, and the sweep waits for the next round
                    # (found by attack: another process's write landing between the two failed the
                    # call closed with its unit counted, or had it decided again in memory).
                    log.warning("policy store: sweeping expired rows failed (%s); tried again later", exc)
            return window if taken else not_taken((window + 1) * interval - now)

        def work(db: sqlite3.Connection, now: float) -> int:
            window = int(now // interval)
            full = f"{self.prefix}{key}@{window}"
            if self._counter(db, full, now) >= limit:
                return not_taken((window + 1) * interval - now)
            self._add_live(db, full, 1, now, (window + 2) * interval)
            return window
        result: int = self._run(work)
        return result

    async def untake(self, key: str, interval: float, window: int) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            db.execute("UPDATE counters SET value = value - 1 WHERE key = ? AND expires > ?",
                       (f"{self.prefix}{key}@{window}", now))
        self._run(work)

    # -- leases -----------------------------------------------------------------------

    async def lease(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        def work(db: sqlite3.Connection, now: float) -> bool:
            full = self.prefix + key
            db.execute("DELETE FROM leases WHERE key = ? AND expires <= ?", (full, now))
            (held,) = db.execute("SELECT count(*) FROM leases WHERE key = ?", (full,)).fetchone()
            if held >= limit and db.execute("SELECT 1 FROM leases WHERE key = ? AND holder = ?",
                                            (full, holder)).fetchone() is None:
                return False  # a holder's own live lease is its own, renewed (as in the Redis store)
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, 1, ?)", (full, holder, now + ttl))
            return True
        return bool(self._run(work))

    async def renew(self, key: str, holder: str, ttl: float) -> bool:
        def work(db: sqlite3.Connection, now: float) -> bool:
            return db.execute("UPDATE leases SET expires = ? WHERE key = ? AND holder = ? AND expires > ?",
                              (now + ttl, self.prefix + key, holder, now)).rowcount > 0
        return bool(self._run(work))

    async def release(self, key: str, holder: str) -> None:
        self._run(lambda db, now: db.execute("DELETE FROM leases WHERE key = ? AND holder = ?",
                                             (self.prefix + key, holder)))

    # -- budgets ----------------------------------------------------------------------

    async def reserve(self, key: str, interval: float, max_calls: int | None, max_seconds: float | None,
                      want: float | None, holder: str, ttl: float) -> tuple[str, int, float]:
        def work(db: sqlite3.Connection, now: float) -> tuple[str, int, float]:
            window = int(now // interval)
            base = f"{self.prefix}{key}"
            calls = f"{base}:calls@{window}"
            pool = f"{base}:reserved@{window}"
            if max_seconds is not None:
                # A holder's own live reservation is its answer, its call not counted again: what the
                # Redis store answers a reservation sent again (found by attack: the stores differed).
                db.execute("DELETE FROM leases WHERE key = ? AND expires <= ?", (pool, now))
                mine = db.execute("SELECT amount FROM leases WHERE key = ? AND holder = ?", (pool, holder)).fetchone()
                if mine is not None:
                    return "ok", window, float(mine[0])
            if max_calls is not None and self._counter(db, calls, now) >= max_calls:
                return "calls", window, 0.0
            reserve = 0.0
            if max_seconds is not None:
                (reserved,) = db.execute("SELECT coalesce(sum(amount), 0) FROM leases WHERE key = ?",
                                         (pool,)).fetchone()
                spent = self._counter(db, f"{base}:seconds@{window}", now)
                left = max_seconds - spent - reserved
                if left <= 0:
                    return ("used" if spent >= max_seconds else "reserved"), window, 0.0
                reserve = left if want is None else min(left, want)
                db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?)", (pool, holder, reserve, now + ttl))
            self._add_live(db, calls, 1, now, (window + 2) * interval)
            return "ok", window, reserve
        result: tuple[str, int, float] = self._run(work)
        return result

    async def settle(self, key: str, interval: float, window: int, holder: str, elapsed: float | None) -> None:
        def work(db: sqlite3.Connection, now: float) -> None:
            base = f"{self.prefix}{key}"
            db.execute("DELETE FROM leases WHERE key = ? AND holder = ?", (f"{base}:reserved@{window}", holder))
            if elapsed is None:
                db.execute("UPDATE counters SET value = value - 1 WHERE key = ? AND expires > ?",
                           (f"{base}:calls@{window}", now))
            else:
                self._add_live(db, f"{base}:seconds@{window}", elapsed, now, (window + 2) * interval)
        self._run(work)

    # -- idempotency --------------------------------------------------------------------

    async def claim(self, key: str, digest: str, holder: str, ttl: float) -> tuple[str, str | None, str | None]:
        def work(db: sqlite3.Connection, now: float) -> tuple[str, str | None, str | None]:
            full = self.prefix + key
            row = db.execute("SELECT digest, value FROM records WHERE key = ? AND expires > ?", (full, now)).fetchone()
            if row is not None:
                return ("running", row[0], None) if row[1] is None else ("stored", row[0], row[1])
            db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, NULL, ?)", (full, holder, digest, now + ttl))
            return "claimed", None, None
        result: tuple[str, str | None, str | None] = self._run(work)
        return result

    async def resolve(self, key: str, holder: str, digest: str, value: str | None, ttl: float) -> bool:
        def work(db: sqlite3.Connection, now: float) -> bool:
            full = self.prefix + key
            if value is None:
                db.execute("DELETE FROM records WHERE key = ? AND holder = ? AND value IS NULL", (full, holder))
                return True
            return db.execute("UPDATE records SET value = ?, digest = ?, expires = ? WHERE key = ? AND holder = ?",
                              (value, digest, now + ttl, full, holder)).rowcount > 0
        held: bool = self._run(work)
        return held

    # -- records --------------------------------------------------------------------------

    async def get(self, key: str) -> Any:
        try:  # a read: its own implicit transaction, no write lock
            db = self._connection()
            rows = db.execute("SELECT value FROM blobs WHERE key = ? AND expires > ?",
                              (self.prefix + key, time.time())).fetchall()
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        return load_record(rows[0][0]) if rows else None

    async def update(self, key: str, step: Update, ttl: float) -> Any:
        def work(db: sqlite3.Connection, now: float) -> Any:
            full = self.prefix + key
            row = db.execute("SELECT value FROM blobs WHERE key = ? AND expires > ?", (full, now)).fetchone()
            new, result = step(load_record(row[0]) if row else None, now)
            db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", (full, json.dumps(new), now + ttl))
            return result
        return self._run(work)

    async def status(self) -> list[dict[str, Any]]:
        def work(db: sqlite3.Connection, now: float) -> list[dict[str, Any]]:
            like = self.prefix.replace("%", r"\%").replace("_", r"\_") + "%"
            rows: list[dict[str, Any]] = []
            queries = (("counter", "SELECT key, value, expires FROM counters"),
                       ("lease", "SELECT key || ' ' || holder, amount, expires FROM leases"),
                       ("idempotency", "SELECT key, CASE WHEN value IS NULL THEN 'running' ELSE 'stored' END, "
                                       "expires FROM records"),
                       ("record", "SELECT key, value, expires FROM blobs"))
            for kind, query in queries:
                for key, value, expires in db.execute(f"{query} WHERE key LIKE ? ESCAPE '\\' AND expires > ? "
                                                      "ORDER BY 1", (like, now)):
                    if kind == "record":
                        try:
                            value = json.loads(value)
                        except (TypeError, ValueError):  # not one of ours (a row written by hand): its text
                            value = str(value)[:80]
                    try:
                        expires_in: float | None = round(float(expires) - now, 3)
                    except (TypeError, ValueError):  # a text expiry (never ours): shown without one
                        expires_in = None
                    rows.append({"key": key[len(self.prefix):], "kind": kind, "value": value,
                                 "expires_in": expires_in})
            return rows
        result: list[dict[str, Any]] = self._run(work, read_only=True)
        return result

    async def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
            self._busy_ms = _busy_ms(self.timeout)
