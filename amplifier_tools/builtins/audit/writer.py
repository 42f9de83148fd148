"""Appending chained records to the audit log, and keeping the log's anchor.

It must never: write through a symlink or into anything but the regular file
it created; continue, or sign, a chain it did not verify; acknowledge a record
that was not completely written.

``AuditWriter.append(body)`` chains a record (already encoded by
``chain.encode_body``) and writes it on the caller's side, synchronously, under
a process lock and an exclusive ``flock`` on the log file's own descriptor — a
lock a tool cannot swap: replacing the log is itself detected. Called on an
event loop, the writer keeps that ``flock`` across the records appended in the
same turn of the loop (a burst of calls that do not suspend, concurrent calls
completing together) and releases it when the loop next runs its callbacks, or
at the fsync thread's next cycle (``fsync_interval_ms``) if the loop is kept
busy: a record then costs an ``lstat`` and a ``write`` instead of four system
calls. Another process sharing the log waits for the lock at most that long.
Called with no running loop, it releases the lock after each record. When it returns,
the line is in the file (one completed ``write(2)``, its return value checked;
a short write is cut off and raised). A background thread only fsyncs (for
``fsync="always"`` it serves every waiter with one fsync: group commit, asked for
once per turn of each waiting loop, when the calls completing in that turn have all
written their records; for
``"interval"`` every ``fsync_interval_ms``; ``"never"`` leaves it to the OS) and
refreshes the anchor. There is no queue: memory does not grow with load.

The writer trusts itself, not the file. It keeps the chain head (inode, size,
last hash, record count) in memory and in ``<log>.anchor`` (replaced atomically,
HMAC-signed with the checkpoint key). Before each append it checks that the file
still ends where it left it, or that what another process appended chains from
its head (several processes may share one log). Anything else — a shorter or
emptied file, a replaced, deleted, symlinked or FIFO log, an anchor that does
not match or is not signed by our key — is tampering: the untrusted file is
renamed aside (``<log>.tampered-<time>``), never appended to or signed, and a
fresh segment starts with a ``tamper`` record saying what was found;
``on_tamper`` reports it (the plugin logs it, emits ``audit:tamper`` and, in
``fail_closed`` mode, refuses further calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import stat
import threading
import time
import weakref
from asyncio import _get_running_loop as asyncio_running_loop  # None, not an exception, without a loop
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs

from ...hoststate import HostFileError, open_host_dir, open_host_file
from .chain import (
    GENESIS,
    MAX_LINE_BYTES,
    ROTATED,
    Anchor,
    anchor_path,
    check_line,
    checkpoint_body,
    checkpoint_mac,
    encode_anchor,
    encode_body,
    ends_with_hash,
    link,
    parse_anchor,
)

log = logging.getLogger("amplifier_tools.audit")

READ_CHUNK: Final = 1 << 20
LOG_FLAGS: Final = os.O_RDWR | os.O_APPEND
#: Opens of the log's path before giving up when the file there keeps being moved away meanwhile.
OPEN_ATTEMPTS: Final = 16
#: How often a loop that has work pending for the fsync thread checks that the thread gets to do
#: it (``AuditWriter._watch``), and how long, at most, it steps aside when it does not.
WATCH_EVERY: Final = 0.05
STEP_ASIDE: Final = 0.002

#: When each loop last stepped aside for a writer's thread (``AuditWriter._watch``): one step
#: releases the GIL to every starved thread, so a loop serving many writers steps once per period.
_stepped_aside: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = weakref.WeakKeyDictionary()


class AuditWriteError(OSError):
    """The record could not be written (or fsynced): it is not acknowledged."""


class _Tampered(Exception):
    """The log is not as this writer left it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@attrs.define(slots=True)
class _Head:
    """Where the live file ends, as far as this writer verified it."""

    inode: int
    size: int
    hash: str
    records: int


#: The most digits of a rotated file's number that sets the next rotation's (10**18 rotations: a
#: rotation a nanosecond for 30 years). A file numbered higher was not rotated there by a writer.
MAX_ROTATED_DIGITS: Final = 18


def _settle_all(futures: list[asyncio.Future[None]], error: AuditWriteError | None,
                judge: Callable[[AuditWriteError], BaseException | None]) -> None:
    """Resolve the waiters of one loop whose records one fsync covered (run on that loop); a
    failed fsync is what ``judge`` makes of it (an exception to raise, or None: resolved)."""
    verdict = None if error is None else judge(error)
    for future in futures:
        # The waiter may have been cancelled meanwhile: its record is written either way.
        if not future.done():
            if verdict is None:
                future.set_result(None)
            else:
                future.set_exception(verdict)


class AuditWriter:
    """The audit log of one host: appends, verifies, rotates, anchors; one fsync thread."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: str = "interval", fsync_interval_ms: float = 100,
                 fsync_every: int = 1000,
                 rotate_bytes: int | None = None, rotate_seconds: float | None = None,
                 checkpoint_key: bytes | None = None, checkpoint_key_ref: str = "", checkpoint_every: int = 1000,
                 on_tamper: Callable[[str, str | None], None] | None = None) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.anchor_path = anchor_path(self.path)
        self.fsync = fsync
        # at most the longest wait a thread can make (found by attack: fsync_interval_ms = 1e300 made
        # the fsync thread fail and log every 10 ms for ever); beyond it no interval is different
        self.fsync_interval = min(fsync_interval_ms / 1000.0, threading.TIMEOUT_MAX)
        self.fsync_every = fsync_every
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.checkpoint_key = checkpoint_key
        self.checkpoint_key_ref = checkpoint_key_ref
        self.checkpoint_every = checkpoint_every
        self.on_tamper = on_tamper
        #: The last write failure (cleared by the next record written), and the tampering found, if any.
        self.error: BaseException | None = None
        #: The last fsync failure; cleared only by a successful fsync (a later write does not prove
        #: the earlier records reached the disk).
        self.sync_error: BaseException | None = None
        self.tampered: str | None = None
        self._leaf = self.path.name
        self._anchor_leaf = self.anchor_path.name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._dir_fd: int | None = None
        self._fd: int | None = None
        self._head: _Head | None = None
        self._file_started: float | None = None
        self._since_checkpoint = 0
        self._written = 0  # records this writer wrote (the sequence fsync waiters wait for)
        self._synced = 0
        self._anchored: tuple[int, int] = (-1, -1)
        #: (inode, size) of the live file up to which an fsync is known to have covered it.
        self._durable: tuple[int, int] = (-1, -1)
        #: A failed fsync of ``_make_durable``'s, for the fsync thread to report as its own: the kernel
        #: reports a lost write once per open file, so the thread's next fsync of it may succeed.
        self._lost: OSError | None = None
        self._last_anchor = 0.0
        self._recheck = False
        #: (inode, size) where our own last record ended. A head elsewhere was reached by reading (the
        #: log adopted at start, another process's records, a rotation or segment joined): another
        #: writer may have ended the log there, and may mark the anchor "closed" there as it closes.
        #: So that end is anchored (open) before our next record, in the same hold of the lock (an
        #: fsync only for another writer's records not yet covered), and our close marks "closed"
        #: only an end that is ours (or the closed end we adopted: ``_closed_at``). Found by a stress
        #: test: a writer that adopted the log at the end another then closed it at appended without
        #: anchoring, and a writer starting before its thread's refresh took its records for ones
        #: appended while no writer ran: false tampering, then every other writer took the log for
        #: replaced.
        self._wrote_to: tuple[int, int] = (-1, -1)
        #: (inode, size) of the closed anchor adopted at start, if any: marking that end closed again
        #: is safe (the writer of its last record has closed; every other writer there read it).
        self._closed_at: tuple[int, int] | None = None
        #: Whether we hold the ``flock`` on ``self._fd`` between appends (``append``), and whether
        #: its release is scheduled on the appending loop.
        self._flocked = False
        self._release_scheduled = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: The loops whose waiters the fsync thread will be told of at their next turn (``_commit``).
        self._commit_scheduled: set[asyncio.AbstractEventLoop] = set()
        #: Set by ``_commit``: waiters whose loop has finished its turn want their fsync now.
        self._sync_requested = False
        #: When the fsync thread last ended a cycle, an event it sets then, and the loops with a
        #: ``_watch`` armed: how a loop tells that its own busyness keeps the thread from the GIL.
        self._heartbeat = time.monotonic()
        self._cycled = threading.Event()
        #: (each armed loop's token: a timer whose token is no longer its loop's is stale).
        self._watched: dict[asyncio.AbstractEventLoop, object] = {}
        #: What a waiter of a failed fsync raises: the error as it is, unless the owner says
        #: otherwise (the audit plugin's fail_closed / fail_open), or None to resolve it.
        self.judge_failure: Callable[[AuditWriteError], BaseException | None] = lambda error: error
        self._retired: list[int] = []
        #: The encoded ``tamper`` record of a fresh segment, until it is written (``_fresh_segment``).
        self._pending_tamper: bytes | None = None
        #: ``(reason, moved)`` of tampering found, reported, whose fresh segment could not be made (the
        #: untrusted file set aside, the new one not created): the next append (or ``close``) makes it.
        self._unstarted: tuple[str, str | None] | None = None
        self._stop = False
        with self._lock:
            try:
                self._start()
            except BaseException:
                for fd in [*self._retired, self._fd, self._dir_fd]:
                    if fd is not None:
                        os.close(fd)
                raise
        self._thread = threading.Thread(target=self._run, name=f"audit-fsync:{self.path.name}", daemon=True)
        self._thread.start()

    # -- public ------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        return self.error is None and self.sync_error is None and self._thread.is_alive()

    def append(self, body: bytes) -> int:
        """Chain and write one record; its sequence number (for ``wait_synced``).

        ``AuditWriteError`` if it could not be completely written; tampering found on the
        way starts a fresh segment (``tampered`` is set) and the record goes there.
        """
        with self._lock:
            if self._stop:
                raise AuditWriteError(errno.EBADF, f"the audit log {self.path} is closed")
            try:
                self._append_locked(body)
            except OSError as exc:
                self.error = exc
                if isinstance(exc, AuditWriteError):
                    raise
                raise AuditWriteError(exc.errno, f"audit log {self.path} cannot be written: "
                                                 f"{exc.strerror or exc}") from exc
            self.error = None
            self._written += 1
            if self.fsync == "interval" and self._written - self._synced == self.fsync_every:
                self._wake.notify()  # enough unsynced records: do not wait for the interval
            loop = asyncio_running_loop()
            if loop is not None and loop not in self._watched and self.fsync != "never":
                token = self._watched[loop] = object()
                loop.call_later(WATCH_EVERY, self._watch, loop, token)
            if self._flocked and not self._release_scheduled:
                if loop is None:
                    self._unlock()
                else:  # keep the lock for the rest of this turn of the loop
                    self._release_scheduled = True
                    loop.call_soon(self._release)
            return self._written

    def _release(self) -> None:
        """Release the ``flock`` kept since the first append of a turn of the loop."""
        with self._lock:
            self._release_scheduled = False
            if self._flocked:
                self._unlock()

    def _watch(self, loop: asyncio.AbstractEventLoop, token: object) -> None:
        """Run on ``loop`` every ``WATCH_EVERY`` while it has work pending for the fsync thread
        (its calls waiting for an fsync, or records not yet fsynced under ``"interval"``): if the
        thread has not ended a cycle for longer than that work allows, step aside — wait, the GIL
        released, until it ends one, at most ``STEP_ASIDE``, and at most once per ``WATCH_EVERY``
        on a loop however many writers it serves (``_stepped_aside``).

        Why: a loop whose turns are shorter than the interpreter's switch interval (5 ms) — tasks
        that compute for a millisecond and yield — releases the GIL only for an instant at each
        turn's poll, and takes it back before the woken thread runs; the thread's wait for the GIL
        then never times out, so it never asks for it, and it starves (found by an attack: no
        fsync in 20 s, every ``"always"`` call ended with the hook timeout; under ``"interval"`` a
        record stayed unsynced for seconds). Stepping aside hands it the GIL. Also taken when the
        thread is merely slow (a stalled disk): then it costs the loop at most ``STEP_ASIDE`` per
        ``WATCH_EVERY``. The writer's lock is waited for at most ``STEP_ASIDE`` (that wait releases
        the GIL too, so a starved thread holding the lock gets to finish): the thread may hold it
        for long (an anchor waiting for another process's ``flock``). Not covered: a
        loop that never yields at all (one turn of seconds) runs no callback either, this one
        included."""
        if self._watched.get(loop) is not token:  # dropped (``_cycle``) or re-armed since: stale
            return
        late = False
        if self._lock.acquire(timeout=STEP_ASIDE):
            try:
                mine = any(waiter[1] is loop for waiter in self._waiters)
                if self._stop or not (mine or (self.fsync == "interval" and self._written > self._synced)):
                    self._watched.pop(loop, None)
                    return
                allowed = WATCH_EVERY if mine else self.fsync_interval + WATCH_EVERY
                now = time.monotonic()
                late = now - self._heartbeat > allowed and now - _stepped_aside.get(loop, 0.0) >= WATCH_EVERY
                if late:
                    _stepped_aside[loop] = now
                    self._cycled.clear()
                    if mine:  # its _commit may not have run yet: ask now, the thread is let in below
                        self._request_sync()
            finally:
                self._lock.release()
        if late:
            self._cycled.wait(STEP_ASIDE)
        loop.call_later(WATCH_EVERY, self._watch, loop, token)

    def wait_synced(self, seq: int) -> asyncio.Future[None] | None:
        """A future resolved once record ``seq`` is fsynced (None if it already is)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._synced >= seq:
                return None
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((seq, loop, future))
            if loop not in self._commit_scheduled:
                self._commit_scheduled.add(loop)
                loop.call_soon(self._commit, loop)
        return future

    def _commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the fsync thread for the waiters of ``loop`` (run on that loop, one turn after the
        first of them): the calls completing in the same turn — a gathered burst — have written
        their records by then, and one fsync covers them all. Woken at the first waiter, the thread
        contended for the GIL with the rest of the burst and fsynced it in many small pieces (1,000
        gathered calls cost 2.5 times their cost under ``"interval"``)."""
        with self._lock:
            self._commit_scheduled.discard(loop)
            if self._waiters:
                self._request_sync()

    def _request_sync(self) -> None:
        """Ask the fsync thread for a cycle now (the caller holds the writer's lock): the one place
        that sets the request the thread's wait checks, so no request is set without a wake-up."""
        self._sync_requested = True
        self._wake.notify()

    def close(self) -> None:
        """A final signed checkpoint (with a key), fsync, anchor; then stop the thread and close the files.

        The final checkpoint is written even when the last record is a checkpoint: an anchor saved
        before it (by whoever could read the log's directory) is then older than a signed
        checkpoint, and a writer adopting the log with that anchor put back finds it rolled back."""
        with self._lock:
            if self._stop:
                return
            if self._unstarted is not None and self._fd is None:
                try:
                    self._fresh_segment(*self._unstarted)
                    self._unlock()
                except (OSError, _Tampered) as exc:
                    log.error("audit log %s: the fresh segment and its tamper record are still not written: %s",
                              self.path, exc)
            if self._pending_tamper is not None and self._fd is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                    try:
                        # Checked first, as an append does (found by attack: bytes appended to the
                        # empty fresh segment before close, or its deletion, were not seen: the tamper
                        # record went after them, or into the deleted file, and was anchored there;
                        # verify then blamed the tamper record itself, and the next start set the log
                        # aside as "rewritten").
                        self._catch_up_or_set_aside()
                        if self._pending_tamper is not None:
                            self._write_pending_tamper()
                    finally:
                        self._unlock()
                except (OSError, _Tampered) as exc:
                    log.error("audit log %s: the tamper record is still not written: %s", self.path, exc)
            if self.checkpoint_key is not None and self._fd is not None:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                    try:
                        self._catch_up()
                        self._write_checkpoint()
                    finally:
                        self._unlock()
                except (OSError, _Tampered) as exc:
                    log.error("audit log %s: no final checkpoint: %s", self.path, exc)
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=30)
        with self._lock:
            self._anchor_closed()
            for fd in [*self._retired, self._fd, self._dir_fd]:
                if fd is not None:
                    os.close(fd)
            self._retired, self._fd, self._dir_fd = [], None, None

    # -- opening and verifying ------------------------------------------------------

    def _start(self) -> None:
        """Open and verify an existing log now (so a swapped file fails at start); a missing log is
        created by the first record, so a host that makes no call leaves nothing behind."""
        parent = self.path.parent
        if parent.is_dir() or parent.is_symlink():
            self._dir_fd = open_host_dir(parent)
            present = [name for name in (self._leaf, self._anchor_leaf) if self._exists(name)]
            if present:
                self._open_log()
                assert self._fd is not None
                self._unlock()
            return
        ancestor = parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(ancestor))
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(ancestor))

    def _exists(self, name: str) -> bool:
        try:
            os.lstat(name, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return False
        return True

    def _open_log(self) -> None:
        """Open (or create) the live file, lock it, and adopt its chain if it verifies against the
        anchor; a fresh segment if not. Leaves ``self._fd`` locked."""
        if self._dir_fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._dir_fd = open_host_dir(self.path.parent)
        try:
            anchor = self._anchor()
            missing = None
            # (The directory is listed only when the live file is gone: found by attack, every start
            # listed it, 0.5 s with 200,000 files beside the log.)
            if anchor is not None and anchor.size and not self._exists(self._leaf) \
                    and self._last_rotated(anchor) is None:
                missing = f"the log {self.path} was deleted (its anchor says {anchor.records} record(s))"
            self._fd = fd = self._open_locked(missing=missing)
            # Read again under the lock: another writer may have started the log (and anchored it)
            # since the first read; deciding on the stale read chained a second log from genesis.
            anchor = self._anchor()
            st = os.fstat(fd)
            if anchor is None and st.st_size:
                raise _Tampered(f"the log {self.path} has records but no anchor ({self.anchor_path}): its history "
                                "cannot be verified (the anchor was deleted, or the log predates anchors)")
            self._file_started = None
            self._closed_at = (anchor.inode, anchor.size) if anchor is not None and anchor.closed else None
            # An empty anchor names this very file (found by attack: tampering found before the
            # first anchor refresh, the disk full until close, left an empty fresh segment beside
            # the anchor of the log's start; taken for a new log, the tampering was in no chain).
            # An empty live file continues the chain from the hash its anchor names: after a rotation
            # that is the last rotated file's end (found by attack: a writer that adopted the log of a
            # writer killed while rotating, and closed before its first record, left the live file
            # empty; the next one chained it from genesis, and the log no longer verified).
            if anchor is None or (anchor.size == 0 and st.st_size == 0 and anchor.inode == st.st_ino):  # a new log
                self._head = _Head(st.st_ino, 0, GENESIS if anchor is None else anchor.hash, 0)
                self._write_anchor()
            else:
                self._adopt(fd, st, anchor)
        except _Tampered as tampered:
            self._fresh_segment(tampered.reason)

    def _open_locked(self, *, missing: str | None = None) -> int:
        """Open (or create) the file at the log's path and lock it; if, by the time the lock is held,
        another writer has moved that file away (set it aside as tampered, rotated it), open the one
        now at the path instead: a writer never adopts, judges or appends to a file that is no
        longer the log. With ``missing``, the log is not created: its absence is that tampering.

        Opened under the directory's shared lock (``_path_lock``): a writer replacing the file at
        the path (rotating it, setting it aside) holds it exclusively until the new file is there
        and locked, so the file opened is never one not yet locked by its creator, and the path
        is never found empty in between."""
        for _ in range(OPEN_ATTEMPTS):
            try:
                with self._path_lock(fcntl.LOCK_SH):
                    fd = open_host_file(self._leaf, LOG_FLAGS | (0 if missing else os.O_CREAT), dir_fd=self._dir_fd)
            except HostFileError as exc:
                raise _Tampered(self._not_ours(self.path, exc)) from None
            except FileNotFoundError:
                if missing is None:
                    raise
                raise _Tampered(missing) from None
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.lstat(self._leaf, dir_fd=self._dir_fd).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                return fd
            os.close(fd)  # releases the lock on the file that was moved away
        raise AuditWriteError(errno.EAGAIN, f"audit log {self.path} keeps being replaced while it is opened "
                                            f"({OPEN_ATTEMPTS} attempts)")

    def _anchor(self) -> Anchor | None:
        """The anchor as it is now (``_Tampered`` when it is not a file this writer may trust)."""
        try:
            return self._read_anchor()
        except HostFileError as exc:
            raise _Tampered(self._not_ours(self.anchor_path, exc)) from None

    @staticmethod
    def _not_ours(path: Path, exc: OSError) -> str:
        return f"{path} is not the file this writer created: {exc.strerror or exc}"

    def _read_anchor(self) -> Anchor | None:
        try:
            fd = open_host_file(self._anchor_leaf, os.O_RDONLY, dir_fd=self._dir_fd)
        except FileNotFoundError:
            return None
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        try:
            anchor = parse_anchor(data)
        except ValueError as exc:
            raise _Tampered(f"the anchor {self.anchor_path} is unreadable ({exc})") from None
        if self.checkpoint_key is not None and not anchor.signed_by(self.checkpoint_key):
            raise _Tampered(f"the anchor {self.anchor_path} is not signed with the checkpoint key")
        return anchor

    def _adopt(self, fd: int, st: os.stat_result, anchor: Anchor) -> None:
        """Continue the chain of an existing file only if it still holds what the anchor says."""
        replaced = f"the log {self.path} was replaced (inode {st.st_ino}, the anchor says {anchor.inode})"
        if anchor.file != self._leaf:
            raise _Tampered(replaced)
        if anchor.inode != st.st_ino:
            self._adopt_rotated(fd, st, anchor, replaced)
            self._write_anchor()
            return
        if st.st_size < anchor.size:
            what = "emptied" if st.st_size == 0 else f"cut short to {st.st_size} bytes"
            raise _Tampered(f"the log {self.path} was {what}: the anchor says {anchor.records} record(s) "
                            f"in {anchor.size} bytes")
        if anchor.size and not ends_with_hash(os.pread(fd, 100, max(0, anchor.size - 100)), anchor.hash):
            raise _Tampered(f"the log {self.path} was rewritten: the record at the anchored end "
                            f"({anchor.size} bytes) is not the anchored one")
        if anchor.closed and st.st_size > anchor.size:
            raise _Tampered(f"the log {self.path} has {st.st_size - anchor.size} byte(s) after the end its last "
                            "writer closed it at: appended while no writer ran")
        self._head = _Head(st.st_ino, anchor.size, anchor.hash, anchor.records)
        self._file_started = first_timestamp(fd)
        self._extend(fd, st.st_size, live=True, adopting=True)
        self._write_anchor()

    def _last_rotated(self, anchor: Anchor) -> str | None:
        """The name of the highest numbered rotated file if it is the file ``anchor`` names, else None."""
        assert self._dir_fd is not None
        if anchor.file != self._leaf:
            return None
        stem = self._stem()
        numbered = [(int(m.group("n")), name) for name in os.listdir(self._dir_fd)
                    if (m := ROTATED.match(name)) and m.group("stem") == stem
                    and len(m.group("n")) <= MAX_ROTATED_DIGITS]
        if not numbered:
            return None
        name = max(numbered)[1]
        try:
            return name if os.lstat(name, dir_fd=self._dir_fd).st_ino == anchor.inode else None
        except FileNotFoundError:
            return None

    def _adopt_rotated(self, fd: int, st: os.stat_result, anchor: Anchor, replaced: str) -> None:
        """At start, the anchor naming the last rotated file rather than the live one: what a writer
        killed while rotating leaves (between renaming the live file away and anchoring the new one,
        which is then empty, holds only its ``rotated`` record, or is missing and was created by
        ``_open_locked``). Adopted only as that: the anchor open, the file it names the highest
        numbered rotated file and still holding the anchored record at the anchored size, with a
        checkpoint key no checkpoint past it (each is anchored at once, and a rotation follows it
        only once it is), and the live file empty or chained on from that file's end. Anything
        else is ``replaced`` (found by attack: 3 processes sharing a log rotated every 2 KB, one
        killed with ``kill -9`` mid-rotation; the next writer to start set the log aside as
        replaced or deleted, and every writer sharing it then reported tampering)."""
        name = None if anchor.closed else self._last_rotated(anchor)
        if name is None:
            raise _Tampered(replaced)
        try:
            old = open_host_file(name, os.O_RDONLY, dir_fd=self._dir_fd)
        except (HostFileError, FileNotFoundError):
            raise _Tampered(replaced) from None
        try:
            size = os.fstat(old).st_size
            if os.fstat(old).st_ino != anchor.inode or size < anchor.size or (anchor.size and not ends_with_hash(
                    os.pread(old, 100, max(0, anchor.size - 100)), anchor.hash)):
                raise _Tampered(replaced)
            self._head = _Head(anchor.inode, anchor.size, anchor.hash, anchor.records)
            if self._extend(old, size, live=False, adopting=True) == "checkpoint" and self.checkpoint_key is not None:
                raise _Tampered(f"the anchor {self.anchor_path} is older than a signed checkpoint of the log "
                                f"(in {name}) that records follow: the anchor was rolled back")
        finally:
            os.close(old)
        if st.st_size and not self._continues(fd, self._head.hash):
            raise _Tampered(replaced)
        self._head = _Head(st.st_ino, 0, self._head.hash, 0)
        self._file_started = first_timestamp(fd)
        self._extend(fd, st.st_size, live=True, adopting=True)

    def _extend(self, fd: int, end: int, *, live: bool, adopting: bool = False) -> str | None:
        """Accept what was appended after our head (by another process sharing the log) if it chains
        from it; a torn final line (a writer killed mid-write) is cut off and marked. Returns the
        kind of the last record accepted (None: none).

        ``adopting`` (at start, from the anchor's end), with a checkpoint key: a checkpoint past the
        anchored end with any record after it means the anchor was rolled back, since every
        checkpoint is anchored at once (found by attack: an anchor saved mid-run and put back after
        the host closed made the next writer adopt, and sign, records forged after the close). A
        checkpoint that ends the file is what a writer killed between writing it and anchoring it
        leaves, and is taken (found by review: that crash read as tampering)."""
        head = self._head
        assert head is not None
        pending = bytearray()  # the line being read, up to the chunk read last
        offset = head.size
        watch = adopting and self.checkpoint_key is not None
        checkpoint_at: int | None = None  # adopting: the record a checkpoint past the anchor followed
        kind: str | None = None
        while offset < end:
            chunk = os.pread(fd, min(READ_CHUNK, end - offset), offset)
            if not chunk:
                break
            offset += len(chunk)
            begin = 0
            newline = chunk.find(b"\n")
            while newline >= 0:  # each byte looked at once (found by attack: a split of all that was
                pending += chunk[begin:newline + 1]  # pending per chunk took 38 s for one 256 MiB line)
                if checkpoint_at is not None:
                    raise _Tampered(f"the anchor {self.anchor_path} is older than a signed checkpoint of the log "
                                    f"(after record {checkpoint_at}) that records follow: the anchor was rolled back")
                kind = self._accept(bytes(pending)).get("kind")
                if kind == "checkpoint" and watch:
                    checkpoint_at = head.records - 1
                pending.clear()
                begin = newline + 1
                newline = chunk.find(b"\n", begin)
            pending += chunk[begin:]
            if len(pending) > MAX_LINE_BYTES:
                raise _Tampered(f"the log {self.path} holds a line of more than {MAX_LINE_BYTES} bytes after record "
                                f"{head.records}: no record is that long")
        if pending:
            if not live:
                raise _Tampered(f"the log {self.path} ends in an incomplete line")
            os.ftruncate(fd, head.size)
            # What was removed is named by size and digest (found by attack: 64 MiB appended with no
            # newline were cut off with no trace of how much): a writer killed mid-write tears at
            # most one record.
            self._write_line(fd, encode_body({"v": 1, "kind": "recovered", "ts": time.time(),
                                              "note": "a torn final line was removed before appending",
                                              "removed_bytes": len(pending),
                                              "removed_sha256": hashlib.sha256(pending).hexdigest()}))
            self._wrote_to = (-1, -1)  # an end read up to, as without the cut: anchored with our next record
            kind = "recovered"
        return kind

    def _accept(self, raw: bytes) -> dict[str, Any]:
        """Take the complete line ``raw`` as our next record (``_extend``): its record, or ``_Tampered``."""
        head = self._head
        assert head is not None
        record = check_line(raw, head.hash)
        if isinstance(record, str):
            raise _Tampered(f"the log {self.path} does not continue from record {head.records} "
                            f"as this writer left it: {record}")
        head.size += len(raw)
        head.hash = record["hash"]
        head.records += 1
        return record

    def _catch_up(self) -> None:
        """Before appending (``self._fd`` locked): the file at the path is still ours and ends at our head,
        or what was appended chains from it; follows another process's rotation."""
        head = self._head
        assert head is not None
        try:
            on_path = os.lstat(self._leaf, dir_fd=self._dir_fd)
        except FileNotFoundError:  # or another process is rotating the log (our file is an old one): ask again
            try:
                with self._path_lock(fcntl.LOCK_SH):
                    on_path = os.lstat(self._leaf, dir_fd=self._dir_fd)
            except FileNotFoundError:
                raise _Tampered(f"the log {self.path} was deleted") from None
        if on_path.st_ino == head.inode and on_path.st_size == head.size and not self._recheck:
            return  # the common case: one stat, the file is ours and ends where we left it
        if on_path.st_ino != head.inode:
            # Leaves the head at the end of the live file, locked; our old file's end checked on the way.
            self._follow_rotation(on_path)
            self._recheck = False
            return
        fd = self._fd
        assert fd is not None
        size = os.fstat(fd).st_size
        if size != head.size or self._recheck:
            if size < head.size:
                what = "emptied" if size == 0 else f"cut short from {head.size} to {size} bytes"
                raise _Tampered(f"the log {self.path} was {what}")
            if head.size and not ends_with_hash(os.pread(fd, 100, max(0, head.size - 100)), head.hash):
                raise _Tampered(f"the log {self.path} was rewritten: its record {head.records} is not the one "
                                "this writer wrote")
            self._recheck = False
            # Another process appended: its end is anchored before our record, in the same hold of
            # the lock (``_wrote_to``). Its anchor may say "closed" (it closed, we did not); left so until our
            # thread's next refresh, a writer starting meanwhile took our records for ones appended
            # while no writer ran (found by review: 5 processes sharing a log, false tampering).
            self._extend(fd, size, live=True)

    def _catch_up_or_set_aside(self) -> None:
        """``_catch_up`` under the lock; tampering found sets the log aside for a fresh segment
        (``_fresh_segment``), whose tamper record is then pending. Raises ``OSError``."""
        try:
            self._catch_up()
        except _Tampered as tampered:
            self._fresh_segment(tampered.reason)

    def _follow_rotation(self, on_path: os.stat_result) -> None:
        """The path holds another file: another process rotated the log (once or more), or it was replaced.

        Our file is finished (what others wrote before rotating it), then the file at the path is
        opened and locked with ``_open_locked``: the file locked is the one at the path once the lock
        is held. Opened, then locked without that check, it could be rotated away by the writer
        holding it while we waited; we appended to the file rotated away, and rotated the live file
        of that writer as ours (found by a stress test: 5 processes, rotation every 20 KB, false
        tampering and a broken chain). The files rotated between ours and the live one, if any,
        must chain on from ours (``_chain_rotated``)."""
        if not stat.S_ISREG(on_path.st_mode):
            raise _Tampered(f"the log {self.path} was replaced by a symlink or special file")
        old = self._fd
        assert old is not None
        tampered = None
        try:
            head, size = self._head, os.fstat(old).st_size
            assert head is not None
            if size < head.size or (head.size and not ends_with_hash(
                    os.pread(old, 100, max(0, head.size - 100)), head.hash)):
                raise _Tampered(f"the log {self.path} was cut short or rewritten, then replaced")
            self._extend(old, size, live=False)  # what others wrote before rotating
        except _Tampered as found:
            tampered = found  # unless another writer already started a fresh segment over it (below)
        new = self._open_locked(missing=f"the log {self.path} was deleted")
        self._fd = new
        self._retire(old)
        if tampered is not None:
            # Another process sharing the log found the tampering first and started a fresh segment:
            # join it (it starts a new chain with a ``tamper`` record) rather than setting it aside too.
            if not self._join(tampered.reason, new):
                raise tampered
            return
        self._chain_rotated(old, new)

    def _chain_rotated(self, old: int, new: int) -> None:
        """Take the files rotated after ``old`` (whose end is our head), then ``new``, the live file,
        each chained on from the one before: a writer that did not append while others rotated the
        log more than once finds its file's successor rotated away too. Its successors are the
        rotated files numbered after it (the numbering ``verify`` reads the log in)."""
        head = self._head
        assert head is not None and self._dir_fd is not None
        following: list[str] = []
        if not self._continues(new, head.hash):
            stem = self._stem()
            numbered = sorted(((int(m.group("n")), name) for name in os.listdir(self._dir_fd)
                               if (m := ROTATED.match(name)) and m.group("stem") == stem), reverse=True)
            inode = os.fstat(old).st_ino
            for number, name in numbered:
                try:
                    found = os.lstat(name, dir_fd=self._dir_fd).st_ino == inode
                except FileNotFoundError:
                    found = False
                if found:
                    following = [later for n, later in reversed(numbered) if n > number]
                    break
            else:
                raise _Tampered(f"the log {self.path} was replaced: the file at its path does not continue "
                                f"from record {head.records}, and the file this writer left is not among the "
                                f"rotated files ({self._whereabouts(old, numbered)})")
        for name in following:
            try:
                fd = open_host_file(name, os.O_RDONLY, dir_fd=self._dir_fd)
            except (HostFileError, FileNotFoundError) as exc:
                raise _Tampered(self._not_ours(self.path.with_name(name), exc)) from None
            try:
                self._head = _Head(os.fstat(fd).st_ino, 0, head.hash, 0)
                self._extend(fd, os.fstat(fd).st_size, live=False)
                head = self._head
            finally:
                os.close(fd)
        self._head = _Head(os.fstat(new).st_ino, 0, head.hash, 0)  # the live file chains from the last one's end
        self._file_started = None
        self._extend(new, os.fstat(new).st_size, live=True)

    def _whereabouts(self, old: int, numbered: list[tuple[int, str]]) -> str:
        """Where the file ``old`` went, for the report of ``_chain_rotated`` not finding it: its
        names left in the log's directory (none: it was deleted, or a rename replaced it), and the
        rotated files seen."""
        assert self._dir_fd is not None
        st = os.fstat(old)
        names = []
        for name in os.listdir(self._dir_fd):
            with contextlib.suppress(OSError):
                if os.lstat(name, dir_fd=self._dir_fd).st_ino == st.st_ino:
                    names.append(name)
        seen = ", ".join(name for _, name in sorted(numbered)[-3:]) or "none"
        return (f"inode {st.st_ino}, {st.st_nlink} link(s), named {', '.join(names) or 'nothing here'}; "
                f"{len(numbered)} rotated, the last {seen}")

    @staticmethod
    def _continues(fd: int, digest: str) -> bool:
        """Whether the first record of ``fd`` chains from ``digest``."""
        first = os.pread(fd, 1 << 16, 0).split(b"\n", 1)[0]
        return not isinstance(check_line(first + b"\n", digest), str)

    def _fresh_segment(self, reason: str, moved_before: str | None = None) -> None:
        """Keep the untrusted file aside, start a new chain whose first record says what was found.
        ``moved_before``: an earlier attempt (``_unstarted``) set the untrusted file aside already.

        The untrusted file stays locked until the fresh segment is in place, so another writer
        sharing the log, waiting for that lock, then finds the fresh segment at the path and joins
        it (``_catch_up``, ``_open_locked``) instead of judging the old file again; one that found
        the tampering at the same moment joins it here."""
        self.tampered = reason
        reported, self._unstarted = self._unstarted is not None, None
        trusted = self._head
        old, self._fd = self._fd, None
        assert self._dir_fd is not None
        try:
            on_path = self._inode_on_path()
            # Another writer moved the file we locked aside first (or, once we had set it aside, made the
            # fresh segment we could not): join it.
            if on_path is not None and (on_path != os.fstat(old).st_ino if old is not None else moved_before) \
                    and self._joined_other_segment(reason):
                return
            moved = moved_before
            try:
                with self._path_lock(fcntl.LOCK_EX):
                    if on_path is not None:
                        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
                        aside = f"{self._leaf}.tampered-{stamp}-{os.getpid()}"
                        os.rename(self._leaf, aside, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
                        moved = moved or aside
                    fd = open_host_file(self._leaf, LOG_FLAGS | os.O_CREAT | os.O_EXCL, dir_fd=self._dir_fd)
                    fcntl.flock(fd, fcntl.LOCK_EX)
            except FileExistsError:
                # Another writer started the fresh segment between our rename and our create (one
                # that does not take the directory's lock: an earlier version): join it.
                if self._joined_other_segment(reason):
                    return
                raise
            except OSError:
                # Kept, and reported now (found by review: with the create refused (ENOSPC, EDQUOT) after
                # the rename, nothing was reported, and the next record, with an anchor not yet past
                # the log's start, began a new log that verified: the tampering was in no chain).
                self._unstarted = (reason, moved)
                if not reported:
                    self._report_tamper(reason, moved)
                raise
            self._fd = fd
            self._head = _Head(os.fstat(fd).st_ino, 0, GENESIS, 0)
            self._file_started = None
            record: dict[str, Any] = {"v": 1, "kind": "tamper", "ts": time.time(), "reason": reason,
                                      "moved_to": moved}
            if trusted is not None:
                record["trusted"] = {"hash": trusted.hash, "records": trusted.records, "size": trusted.size}
            # Kept until written: a fresh segment never starts with anything but its ``tamper`` record
            # (found by attack: with the disk full when the tampering was found, the tamper record's
            # write failed, the next call's record became the segment's first, and nothing was
            # reported: the live log verified, the tampering visible only in the file set aside).
            self._pending_tamper = encode_body(record)
            try:
                self._write_pending_tamper()
            except OSError:  # reported all the same: the record is written before the next one
                if not reported:
                    self._report_tamper(reason, moved)
                raise
        finally:
            if old is not None:
                self._retire(old)
        if not reported:
            self._report_tamper(reason, moved)

    def _report_tamper(self, reason: str, moved: str | None) -> None:
        log.error("audit log tampering: %s; a fresh segment was started%s", reason,
                  f", the untrusted file was kept as {moved}" if moved else "")
        if self.on_tamper is not None:
            self.on_tamper(reason, moved)

    def _write_pending_tamper(self) -> None:
        """Write the fresh segment's ``tamper`` record (``_fresh_segment``), signed (with a key) or
        anchored; until it is written, every append tries it first."""
        assert self._fd is not None and self._pending_tamper is not None
        self._write_line(self._fd, self._pending_tamper)
        self._pending_tamper = None
        if self.checkpoint_key is not None:  # signed at once: only a writer with the key starts a
            self._write_checkpoint()           # segment that others join (``_join``); anchors it too
        else:
            self._write_anchor()

    def _inode_on_path(self) -> int | None:
        try:
            return os.lstat(self._leaf, dir_fd=self._dir_fd).st_ino
        except FileNotFoundError:
            return None

    def _joined_other_segment(self, reason: str) -> bool:
        """Open and lock the file at the path; keep it (``self._fd``) if it is a fresh segment another
        writer started, else close it again."""
        try:
            fd = self._open_locked()
        except (_Tampered, AuditWriteError):
            return False
        if self._join(reason, fd):
            self._fd = fd
            return True
        os.close(fd)
        return False

    def _join(self, reason: str, fd: int) -> bool:
        """Adopt ``fd`` (locked, the file at the path) if it is a fresh segment another writer started
        on finding the tampering too: its first record a ``tamper`` record chained from genesis and,
        with a checkpoint key, its second a checkpoint signing it (found by attack: a file planted
        at the path with a forged ``tamper`` record was joined, and the forged records after it
        signed). False (nothing changed) if it is not one."""
        st = os.fstat(fd)
        first, second, _ = [*os.pread(fd, 1 << 17, 0).split(b"\n", 2), b"", b""][:3]
        record = check_line(first + b"\n", GENESIS)
        if isinstance(record, str) or record.get("kind") != "tamper":
            return False
        if self.checkpoint_key is not None:
            signed = check_line(second + b"\n", record["hash"])
            if isinstance(signed, str) or signed.get("kind") != "checkpoint" or not hmac.compare_digest(
                    str(signed.get("hmac")), checkpoint_mac(self.checkpoint_key, record["hash"])):
                return False
        self.tampered = reason
        self._head = _Head(st.st_ino, 0, GENESIS, 0)
        self._file_started = None
        self._extend(fd, st.st_size, live=True)
        log.error("audit log tampering: %s; joined the fresh segment another writer started", reason)
        if self.on_tamper is not None:
            self.on_tamper(reason, None)
        return True

    # -- writing -------------------------------------------------------------------------

    def _append_locked(self, body: bytes) -> None:
        """Append with the ``flock`` held, and keep holding it (``self._flocked``; ``append`` decides
        when it is released). Whatever fails, it is released: other processes sharing the log go on.
        The file is checked before every record (``_catch_up``: one ``lstat`` when it is unchanged),
        also while the lock is kept: a process that ignores the lock (a tool replacing or truncating
        the log) is noticed before the next record is written."""
        try:
            if self._fd is None and self._unstarted is not None:
                self._fresh_segment(*self._unstarted)  # leaves the fd locked
            elif self._fd is None:
                self._open_log()  # leaves the fd locked
            else:
                if not self._flocked:
                    fcntl.flock(self._fd, fcntl.LOCK_EX)
                self._flocked = False  # until the record is written: a failure below releases it
                self._catch_up_or_set_aside()
            if self._pending_tamper is not None:
                self._write_pending_tamper()
            fd, head = self._fd, self._head
            assert fd is not None and head is not None
            if (head.inode, head.size) != self._wrote_to:  # an end we read: anchored open first (``_wrote_to``);
                self._write_anchor()  # fsyncs only what another writer appended, as anchoring after did
            self._write_line(fd, body)
            self._since_checkpoint += 1
            if self.checkpoint_key is not None and self._since_checkpoint >= self.checkpoint_every:
                try:
                    self._write_checkpoint()
                except OSError as exc:  # the record is written; the next record retries the checkpoint
                    log.warning("audit log %s: checkpoint not written (%s)", self.path, exc)
            if self.rotate_bytes is not None or self.rotate_seconds is not None:
                self._maybe_rotate()
            self._flocked = True
        finally:
            if not self._flocked:
                self._unlock()

    def _write_line(self, fd: int, body: bytes) -> None:
        """Chain and write ``body`` as one ``write(2)``; a short write is cut off and raised."""
        head = self._head
        assert head is not None
        line, digest = link(body, head.hash)
        try:
            written = os.write(fd, line)
        except OSError:
            self._cut(fd, head.size)
            raise
        if written != len(line):
            self._cut(fd, head.size)
            raise AuditWriteError(errno.ENOSPC, f"audit log {self.path} cannot be written: short write "
                                                f"({written} of {len(line)} bytes; the disk is full?)")
        head.size += written
        head.hash = digest
        head.records += 1
        self._wrote_to = (head.inode, head.size)
        if self._file_started is None:
            self._file_started = time.time()

    @staticmethod
    def _cut(fd: int, size: int) -> None:
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError as exc:  # the line stays torn: the next append (or a restart) cuts it and says so
            log.error("audit log: could not remove a partly written line: %s", exc)

    def _write_checkpoint(self) -> None:
        """A signed checkpoint, anchored at once: no anchor is ever older than a checkpoint the
        writer left (what ``_extend`` and ``verify`` take for an anchor rolled back)."""
        assert self.checkpoint_key is not None and self._fd is not None and self._head is not None
        self._write_line(self._fd, checkpoint_body(self.checkpoint_key, self.checkpoint_key_ref, self._head.hash,
                                                   self._since_checkpoint, time.time()))
        self._since_checkpoint = 0
        self._write_anchor()

    def _maybe_rotate(self) -> None:
        head, fd = self._head, self._fd
        assert head is not None and fd is not None and self._dir_fd is not None
        due = (self.rotate_bytes is not None and head.size >= self.rotate_bytes) or (
            self.rotate_seconds is not None and self._age() >= self.rotate_seconds)
        if not due:
            return
        if self.fsync != "never":
            try:
                os.fsync(fd)  # records in the old file are durable before it is renamed away
            except OSError as exc:  # the kernel's one report of a lost write: the thread's too (``_lost``)
                self._lost = exc
                raise
        with self._path_lock(fcntl.LOCK_EX):  # nobody opens the path until the new file there is locked
            try:
                target = self._rotation_target()
                os.rename(self._leaf, target, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except OSError as exc:
                # Nothing changed, and the record is written: a rotation that could not happen is not
                # its loss (found by attack: a planted name made every rotation fail, and every append
                # raised ``AuditWriteError`` for a record it had written). The live file grows; the
                # next record tries again. (An fsync failure above, or a failure after the rename,
                # still fails the append: the first is the record's durability, the second leaves
                # the path empty.)
                log.warning("audit log %s: not rotated (%s); the live file grows, the next record tries again",
                            self.path, exc)
                return
            new = open_host_file(self._leaf, LOG_FLAGS | os.O_CREAT | os.O_EXCL, dir_fd=self._dir_fd)
            fcntl.flock(new, fcntl.LOCK_EX)  # before the old lock goes: waiters then find the new file complete
        self._fd = new
        self._retire(fd)
        self._head = _Head(os.fstat(new).st_ino, 0, head.hash, 0)
        self._file_started = None
        self._write_line(new, encode_body({"v": 1, "kind": "rotated", "ts": time.time(), "from": target}))
        self._write_anchor()

    def _rotation_target(self) -> str:
        """The name the live file is rotated to: ``<stem>.<n>.jsonl``, ``n`` one past the highest
        rotated file (of at most ``MAX_ROTATED_DIGITS`` digits: a higher number was put there by
        hand, and ``verify`` reads it as part of the log and reports it; found by attack: one past
        a planted 243-digit number is a name too long for the file system, and no rotation could
        happen again), and never a name that exists (``os.rename`` replaces its target silently: a
        rotated file, and the records in it, would be lost, and a writer whose file it was would
        find it among no rotated file and take the log for replaced). Chosen under the directory's
        exclusive lock (``_path_lock``), as every rotation is, so two rotations never pick one
        number; it was listed before taking that lock."""
        assert self._dir_fd is not None
        stem = self._stem()
        number = max((int(m.group("n")) for name in os.listdir(self._dir_fd)
                      if (m := ROTATED.match(name)) and m.group("stem") == stem
                      and len(m.group("n")) <= MAX_ROTATED_DIGITS), default=0) + 1
        while self._exists(f"{stem}.{number}.jsonl"):  # listed since: not by a writer of this log
            number += 1
        return f"{stem}.{number}.jsonl"

    def _stem(self) -> str:
        return self._leaf[: -len(".jsonl")] if self._leaf.endswith(".jsonl") else self._leaf

    def _age(self) -> float:
        """Seconds since the live file's first record was written."""
        return 0.0 if self._file_started is None else time.time() - self._file_started

    @contextlib.contextmanager
    def _path_lock(self, operation: int) -> Iterator[None]:
        """The ``flock`` on the log's directory: held exclusively while the file at the log's path is
        replaced (renamed away, a new one created and locked: ``_maybe_rotate``, ``_fresh_segment``),
        shared while it is opened (``_open_locked``). Between the rename and the create the path
        is empty, and between the create and the lock the new file is there unlocked: a writer
        opening the log then took it for deleted, or locked the new file first and took it for a
        replaced log (found by a stress test of several processes sharing a rotating log, the
        windows widened). Held for a few system calls, never while waiting for another lock (the
        new file locked under it was just created, and is opened by others only under it). A
        file system that cannot lock a directory goes without (with a warning)."""
        assert self._dir_fd is not None
        try:
            fcntl.flock(self._dir_fd, operation)
        except OSError as exc:
            log.warning("audit log %s: cannot lock its directory (%s); several processes sharing a "
                        "rotating log may report false tampering", self.path, exc)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(self._dir_fd, fcntl.LOCK_UN)

    def _unlock(self) -> None:
        self._flocked = False
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _retire(self, fd: int) -> None:
        """Stop using ``fd``; the fsync thread closes it (it may be fsyncing it right now)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        self._retired.append(fd)

    def _write_anchor(self, *, closed: bool = False) -> None:
        """Replace ``<log>.anchor`` with our head (temp file + rename in the log's directory), once
        the log is fsynced up to it (``_make_durable``)."""
        head = self._head
        assert head is not None and self._dir_fd is not None
        self._make_durable(head)
        anchor = Anchor(self._leaf, head.inode, head.size, head.hash, head.records, time.time(),
                        self.checkpoint_key_ref if self.checkpoint_key is not None else None, closed=closed)
        data = encode_anchor(anchor, self.checkpoint_key)
        temp = f"{self._anchor_leaf}.tmp-{os.getpid()}-{os.urandom(6).hex()}"  # unguessable: nothing to plant
        fd = open_host_file(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, dir_fd=self._dir_fd)
        try:
            if os.write(fd, data) != len(data):
                raise AuditWriteError(errno.ENOSPC, f"short write to {temp}")
            try:
                os.rename(temp, self._anchor_leaf, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except IsADirectoryError:
                self._set_anchor_aside()
                os.rename(temp, self._anchor_leaf, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except BaseException:
            os.unlink(temp, dir_fd=self._dir_fd)
            raise
        finally:
            os.close(fd)
        self._anchored = (head.inode, head.size)
        self._last_anchor = time.monotonic()

    def _make_durable(self, head: _Head) -> None:
        """fsync the live file (which ``head`` describes) unless an fsync already covered it up to
        ``head``, or ``fsync = "never"``. The anchor is replaced by a rename, which the filesystem
        may make durable before the log's tail: an anchor naming records a crash then lost reads as
        a log cut short (found by review: after a power loss, a false tampering alarm, and the
        next start set the log aside; a signed checkpoint anchored records the fsync thread had
        not reached yet). Costs one fsync only when the head moved since the thread's last one:
        at a checkpoint, a rotation, records of another writer, or records appended during the
        thread's fsync (at most once every ``fsync_interval_ms``, holding the writer's lock).
        Not covered: the anchor file's own bytes are not fsynced before the rename (a filesystem
        that can leave a renamed file empty after a crash, such as XFS, can still leave an
        unreadable anchor; ext4 and btrfs flush it with the rename)."""
        if self.fsync == "never" or not head.size or self._durable == (head.inode, head.size):
            return
        assert self._fd is not None
        try:
            os.fsync(self._fd)
        except OSError as exc:
            # Found by review: this fsync took the kernel's one report of a lost write; the thread's
            # next fsync succeeded and acknowledged the records waiting for it as durable.
            self._lost = exc
            raise
        self._durable = (head.inode, head.size)

    def _set_anchor_aside(self) -> None:
        """Move a directory found at the anchor's name aside (``<log>.anchor.tampered-<time>-<pid>``,
        kept as evidence), so the anchor can be written again: a rename replaces a file, a symlink
        or a FIFO at its target, but not a directory (found by attack: a directory made at the
        anchor's name stopped a ``fail_closed`` host from starting, with an error naming the log,
        and set another fresh segment aside at each try; a ``fail_open`` host recorded nothing; a
        running writer never anchored again, and its log no longer verified). At start such an
        anchor is tampering, reported by the fresh segment's ``tamper`` record; while the writer
        runs it is repaired like any other swap of the anchor."""
        assert self._dir_fd is not None
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        moved = f"{self._anchor_leaf}.tampered-{stamp}-{os.getpid()}"
        try:
            if not stat.S_ISDIR(os.lstat(self._anchor_leaf, dir_fd=self._dir_fd).st_mode):
                return  # another writer sharing the log moved it first, and anchored
            os.rename(self._anchor_leaf, moved, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except FileNotFoundError:  # another writer sharing the log moved it first
            return
        log.error("audit log %s: a directory was in place of its anchor; kept as %s, the anchor written anew",
                  self.path, moved)

    def _anchor_closed(self) -> None:
        """At close: anchor our head marked ``closed`` if the file still ends there, so records
        appended before the next writer adopts the log read as tampering (and are never signed).

        Only an end our own record made, or the closed end we adopted (``_wrote_to``, ``_closed_at``):
        another writer still running may be at an end we merely read, and append there without
        anchoring. Not covered: a writer that appended nothing, on a log whose last writer did not
        close it (killed, or still running), leaves the anchor open; with a checkpoint key the
        close's own checkpoint is such a record."""
        head, fd = self._head, self._fd
        if head is None or fd is None or self._dir_fd is None or self._pending_tamper is not None:
            return  # (a fresh segment whose tamper record is unwritten keeps the old anchor: tampering still)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                # (Not at the path: another process rotated the log, and anchors it.)
                end = (head.inode, head.size)
                if end in (self._wrote_to, self._closed_at) and self._inode_on_path() == head.inode \
                        and os.fstat(fd).st_size == head.size and not self._anchored_past(head):
                    self._write_anchor(closed=True)
            finally:
                self._unlock()
        except OSError as exc:
            log.error("audit log %s: could not mark the anchor closed: %s", self.path, exc)

    def _anchored_past(self, head: _Head) -> bool:
        """Whether the anchor names a later end of the file ``head`` is in than ``head``'s, which the
        file ends at: records another writer appended and anchored were cut off since. The anchor is
        then left as it is, and the next start finds the log cut short. Found by attack: a writer
        idle at its own end (or the closed end it adopted) re-anchored there, at its thread's refresh
        or as it closed, after the records past it were cut off, and the cut went undetected.

        Also when the anchor names an end of this file that no longer holds the anchored record: such
        a writer appended again after the cut (the common append reads no anchor), over the end the
        other writer anchored. Found by attack: it then re-anchored (at its refresh or as it closed)
        once its own records passed that end, and the cut went undetected. Not covered: that writer
        itself reports nothing; the anchor left names the cut records, and the next start (or
        ``verify``) finds the log rewritten."""
        fd = self._fd
        try:
            anchor = self._read_anchor()
        except (_Tampered, OSError):
            return False  # an anchor that cannot be read or trusted is replaced as before
        if anchor is None or anchor.inode != head.inode or fd is None:
            return False
        if anchor.size > head.size:
            return True
        return bool(anchor.size) and not ends_with_hash(os.pread(fd, 100, max(0, anchor.size - 100)), anchor.hash)

    def _anchor_if_current(self) -> None:
        """From the thread (under the lock): anchor our head if the file still ends there."""
        head, fd = self._head, self._fd
        if head is None or fd is None or self._anchored == (head.inode, head.size) or self._pending_tamper is not None:
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if self._inode_on_path() != head.inode or size != head.size or self._anchored_past(head):
                return  # another process appended (it anchors its own), or tampering: the next append decides
            if head.size and not ends_with_hash(os.pread(fd, 100, max(0, head.size - 100)), head.hash):
                self._recheck = True  # same size, other bytes: the next append treats it as tampering
                return
            self._write_anchor()
        finally:
            self._unlock()

    # -- the fsync thread --------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                if self._cycle():
                    return
            except Exception:  # never die: every later call would stall
                log.exception("audit fsync thread: unexpected failure; continuing")
                with self._lock:  # the failed cycle may have taken the waiters' request: ask again
                    if self._waiters:
                        self._request_sync()
                time.sleep(0.01)

    def _cycle(self) -> bool:
        with self._wake:
            if not self._stop and not self._sync_requested and not (
                    self.fsync == "interval" and self._written - self._synced >= self.fsync_every):
                self._wake.wait(self.fsync_interval)
            self._sync_requested = False
            stopping = self._stop
            fd, target = self._fd, self._written
            head = self._head  # what ``fd`` holds now: the fsync below covers it
            retired, self._retired = self._retired, []
            lost, self._lost = self._lost, None  # an fsync failure ``_make_durable`` met since the last cycle
        error: OSError | None = lost
        covered: tuple[int, int] | None = None
        if fd is not None and self.fsync != "never" and target > self._synced and error is None:
            try:
                os.fsync(fd)
                covered = None if head is None else (head.inode, head.size)
            except OSError as exc:
                error = exc
        for old in retired:  # a file set aside or rotated away may still hold unsynced records
            try:
                if self.fsync != "never" and error is None:
                    os.fsync(old)
            except OSError as exc:
                error = exc
            try:  # each closed whatever the others do (a close that raised left the rest open, unsynced)
                os.close(old)
            except OSError as exc:  # close(2) reporting EIO (NFS) reports lost writes: a failed fsync
                if error is None and self.fsync != "never":
                    error = exc
        with self._lock:
            if self._flocked:  # the appending loop has been busy (or closed) since: let other processes in
                self._unlock()
            self._release_scheduled = False  # a loop closed before its release ran must not stop the next one's
            if error is None:
                self.sync_error = None
                self._synced = max(self._synced, target)
                if covered is not None and (covered[0] != self._durable[0] or covered[1] > self._durable[1]):
                    self._durable = covered
                ready = [w for w in self._waiters if w[0] <= self._synced]
                self._waiters = [w for w in self._waiters if w[0] > self._synced]
                failure: AuditWriteError | None = None
            else:
                log.error("audit log %s: fsync failed: %s", self.path, error)
                ready, self._waiters = self._waiters, []
                failure = AuditWriteError(error.errno, f"audit log {self.path} cannot be fsynced: {error.strerror}")
                self.sync_error = failure  # unhealthy: fail_closed refuses calls until an fsync succeeds
            # A loop closed, or left (not running), before its ``_commit`` or ``_watch`` ran: do not
            # keep it (nor its descriptors) alive; run again, it is armed again by its next record.
            if self._commit_scheduled:
                self._commit_scheduled = {loop for loop in self._commit_scheduled if loop.is_running()}
            if self._watched:
                self._watched = {loop: token for loop, token in self._watched.items() if loop.is_running()}
            self._heartbeat = time.monotonic()
            if stopping or time.monotonic() - self._last_anchor >= self.fsync_interval:
                try:
                    self._anchor_if_current()
                except OSError as exc:
                    log.error("audit log %s: anchor not updated: %s", self.path, exc)
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        for _, loop, future in ready:
            by_loop.setdefault(loop, []).append(future)
        for loop, futures in by_loop.items():  # one wake-up of each loop for its whole batch
            try:
                loop.call_soon_threadsafe(_settle_all, futures, failure, self.judge_failure)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
                pass
        if not self._cycled.is_set():  # a loop stepping aside for this cycle (``_watch``) goes on
            self._cycled.set()
        return stopping


def first_timestamp(fd: int) -> float | None:
    """When the first record of a log file was written (its ``ts``), or None for an empty file."""
    head = os.pread(fd, 1 << 16, 0)
    if not head:
        return None
    try:
        ts = json.loads(head.split(b"\n", 1)[0]).get("ts")
        if isinstance(ts, (int, float)):
            return float(ts)
        return dt.datetime.fromisoformat(ts).timestamp()
    except (ValueError, TypeError, AttributeError, RecursionError):
        return os.fstat(fd).st_mtime  # unreadable first line: the last change is the best bound
