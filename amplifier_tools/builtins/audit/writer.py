"""Appending chained records to a JSON Lines file: one writer thread, file lock, fsync policy,
rotation, signed checkpoints.

``AuditWriter.append(body, ack=True)`` takes a record already encoded by
``chain.encode_body`` and returns a future resolved once it is written (and
fsynced under ``fsync="always"``); with ``ack=False`` nothing waits and a
failure is reported through ``on_error`` and ``healthy``. Records are written
by a single thread per host, in batches, each batch under an exclusive
``flock`` on ``<file>.lock`` so that several processes appending to one log
keep one chain: under the lock the writer reads the last hash from the file
itself. Without ``fsync="always"`` the thread lingers ``LINGER_S`` after the
first record of a batch, so a busy host pays the lock and stat calls once per
batch rather than once per record.

Crash safety: every record is one ``write()`` of a whole line to an
``O_APPEND`` descriptor; a line torn anyway (power loss) is cut off under the
lock before the next append, and a ``recovered`` record says so in the chain.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import errno
import fcntl
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from .chain import GENESIS, ROTATED, checkpoint_body, encode_body, link

TAIL_BYTES: Final = 1 << 16
LINGER_S: Final = 0.002
MAX_BATCH: Final = 1024


class AuditWriteError(OSError):
    """The log could not be written."""


def last_hash(fd: int) -> tuple[str, int]:
    """(hash of the last complete record, offset where a torn tail starts or the file size)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return GENESIS, 0
    start = max(0, size - TAIL_BYTES)
    data = os.pread(fd, size - start, start)
    end = len(data)
    if not data.endswith(b"\n"):
        cut = data.rfind(b"\n")
        end = cut + 1 if cut >= 0 else 0
    lines = data[:end].splitlines()
    for raw in reversed(lines):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("hash"), str):
            return record["hash"], start + end
    return GENESIS, start + end


def first_timestamp(fd: int) -> float | None:
    """When the first record of a log file was written (its ``ts``), or None for an empty file."""
    head = os.pread(fd, TAIL_BYTES, 0)
    if not head:
        return None
    try:
        ts = json.loads(head.split(b"\n", 1)[0]).get("ts")
        if isinstance(ts, (int, float)):
            return float(ts)
        return dt.datetime.fromisoformat(ts).timestamp()
    except (ValueError, TypeError, AttributeError):
        return os.fstat(fd).st_mtime  # unreadable first line: the last change is the best bound


class AuditWriter:
    """The writer thread of one host."""

    def __init__(self, path: Path, *, fsync: str = "always", fsync_every: int = 100,
                 fsync_interval_ms: float = 1000, rotate_bytes: int | None = None,
                 rotate_seconds: float | None = None, checkpoint_key: bytes | None = None,
                 checkpoint_key_ref: str = "", checkpoint_every: int = 1000,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.path = path
        self.fsync = fsync
        self.fsync_every = fsync_every
        self.fsync_interval = fsync_interval_ms / 1000.0
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self._file_started: float | None = None  # when the live file's first record was written
        self.checkpoint_key = checkpoint_key
        self.checkpoint_key_ref = checkpoint_key_ref
        self.checkpoint_every = checkpoint_every
        self.on_error = on_error
        self._since_checkpoint = 0
        self._linger = 0.0 if fsync == "always" else LINGER_S
        self._queue: queue.SimpleQueue[tuple[bytes, concurrent.futures.Future[str] | None] | None] = \
            queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"audit-writer:{path.name}", daemon=True)
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self.error: BaseException | None = None
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._known: tuple[int, int, str] | None = None
        self._check_writable()
        self._thread.start()

    def _check_writable(self) -> None:
        """``OSError`` now if the log could not be written; creates nothing (the first write does)."""
        if self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
            return
        ancestor = self.path.parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(ancestor))
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(ancestor))

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def append(self, body: bytes, *, ack: bool = True) -> concurrent.futures.Future[str] | None:
        """Queue one encoded record; with ``ack``, a future resolved with its hash once written."""
        future: concurrent.futures.Future[str] | None = concurrent.futures.Future() if ack else None
        self._queue.put((body, future))
        return future

    def close(self) -> None:
        """Write what is queued (and a final checkpoint when signing), then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self._fd is not None and self.fsync == "interval" and self._unsynced:
            os.fsync(self._fd)
        self._close_fds()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if self._linger and item is not None:
                time.sleep(self._linger)
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            work = [b for b in batch if b is not None]
            if work or (stop and self._since_checkpoint):
                try:
                    hashes = self._write(work, final=stop)
                except BaseException as exc:  # disk full, permission denied: fail every waiter
                    self.error = exc
                    failure = AuditWriteError(f"audit log {self.path} cannot be written: {exc}")
                    for _, future in work:
                        if future is not None:
                            future.set_exception(failure)
                    if self.on_error is not None and any(future is None for _, future in work):
                        self.on_error(failure)  # nobody waits on these records: report it here
                else:
                    self.error = None
                    for (_, future), digest in zip(work, hashes, strict=True):
                        if future is not None:
                            future.set_result(digest)
            if stop:
                return

    def _open(self) -> None:
        """(Re)open the live file and the lock file; kept open between batches."""
        self._close_fds()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._known = None  # (inode, size, last hash) after our own write
        self._file_started = first_timestamp(self._fd)

    def _close_fds(self) -> None:
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def _write(self, batch: list[tuple[bytes, concurrent.futures.Future[str] | None]], *,
               final: bool = False) -> list[str]:
        if self._fd is None or self._lock_fd is None:
            self._open()
        assert self._fd is not None and self._lock_fd is not None
        lock_fd = self._lock_fd
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            try:
                on_disk = os.stat(self.path)
            except FileNotFoundError:
                on_disk = None
            if on_disk is None or on_disk.st_ino != os.fstat(self._fd).st_ino:  # rotated by another process
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                self._open()
                assert self._fd is not None and self._lock_fd is not None
                lock_fd = self._lock_fd
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
            fd = self._fd
            st = os.fstat(fd)
            known = self._known
            lines = []
            if known is not None and known[0] == st.st_ino and known[1] == st.st_size:
                prev = known[2]  # nobody appended since our last batch: no need to read the tail
            else:
                prev, good_end = last_hash(fd)
                if good_end != st.st_size:  # a torn tail from a crash: cut it, say so
                    os.ftruncate(fd, good_end)
                    line, prev = link(encode_body({"v": 1, "kind": "recovered", "ts": time.time(),
                                                   "note": "a torn final line was removed before appending"}),
                                      prev)
                    lines.append(line)
            hashes = []
            for body, _ in batch:
                line, prev = link(body, prev)
                hashes.append(prev)
                lines.append(line)
            self._since_checkpoint += len(batch)
            if self.checkpoint_key is not None and self._since_checkpoint and (
                final or self._since_checkpoint >= self.checkpoint_every
            ):
                line, prev = link(checkpoint_body(self.checkpoint_key, self.checkpoint_key_ref, prev,
                                                  self._since_checkpoint, time.time()), prev)
                lines.append(line)
                self._since_checkpoint = 0
            for line in lines:  # one write per line: a kill never splits a record across writes
                os.write(fd, line)
            self._sync(fd, len(lines))
            size = os.fstat(fd).st_size
            self._known = (st.st_ino, size, prev)
            if self._file_started is None:
                self._file_started = time.time()
            if (self.rotate_bytes is not None and size >= self.rotate_bytes) or (
                self.rotate_seconds is not None and time.time() - self._file_started >= self.rotate_seconds
            ):
                self._rotate()  # under the lock: the lock file is separate from the renamed log
                os.close(fd)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                self._known = None
                self._file_started = time.time()
        except BaseException:
            self._known = None
            raise
        finally:
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        return hashes

    def _sync(self, fd: int, count: int) -> None:
        self._unsynced += count
        now = time.monotonic()
        if self.fsync == "always" or (
            self.fsync == "interval"
            and (self._unsynced >= self.fsync_every or now - self._last_sync >= self.fsync_interval)
        ):
            os.fsync(fd)
            self._unsynced = 0
            self._last_sync = now

    def _rotate(self) -> None:
        """Rename the live file to ``<stem>.<n>.jsonl``; the next record links to its last hash."""
        stem = self.path.name[: -len(".jsonl")] if self.path.name.endswith(".jsonl") else self.path.name
        numbers = [int(m.group("n")) for q in self.path.parent.iterdir()
                   if (m := ROTATED.match(q.name)) and m.group("stem") == stem]
        target = self.path.with_name(f"{stem}.{max(numbers, default=0) + 1}.jsonl")
        os.rename(self.path, target)
        # The new live file starts empty; its first record must link to the rotated file's last hash.
        with open(self.path, "ab"):
            pass
        last = _last_hash_of(target)
        marker, _ = link(encode_body({"v": 1, "kind": "rotated", "ts": time.time(), "from": target.name}), last)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            os.write(fd, marker)
            os.fsync(fd)
        finally:
            os.close(fd)


def _last_hash_of(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return last_hash(fd)[0]
    finally:
        os.close(fd)
