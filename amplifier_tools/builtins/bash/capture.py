"""Bounded output capture: the head and the tail of a stream, its byte count, an optional spill file.

Memory held per stream is at most ``limit`` bytes however much the command
prints: the first half of the budget keeps the head, a ring of the second half
keeps the tail, and everything in between is only counted (and, with a spill
file, written to disk as it arrives). Must never accumulate a whole stream.

Spill files are host state: ``open_spill_files`` creates them with ``O_EXCL`` and
``O_NOFOLLOW`` relative to a descriptor of the spill directory (``hoststate``), so a
spill directory swapped for a symlink, or a name planted in advance as a symlink or
FIFO, fails the call before anything runs instead of making the host write elsewhere.

A spill file that cannot be written once the command runs (the disk holding ``spill_dir`` full:
``ENOSPC``) stops spilling, not capturing: the call returns its head and tail as usual, the file
stays (incomplete) and ``<stream>_file_error`` says why and after how many bytes (found by attack:
the ``OSError`` escaped the pipe callback at every chunk, the capture stopped keeping the tail,
and closing the file failed the call as an untyped ``tool_raised`` after the command had run,
leaving the other stream's file open).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any, BinaryIO

from ...errors import ToolSystemError
from ...hoststate import ensure_state_dir, open_host_dir, open_host_file
from ...redaction import SecretSet, redact_cut


class StreamCapture:
    """Head + tail of one stream, bounded by ``limit`` bytes; counts the total."""

    __slots__ = ("head", "head_limit", "limit", "spill", "spill_error", "spill_path", "tail", "tail_limit", "total")

    def __init__(self, limit: int, spill: tuple[str, BinaryIO] | None = None) -> None:
        self.limit = limit
        self.head_limit = limit - limit // 2
        self.tail_limit = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.spill_path: str | None = spill[0] if spill is not None else None
        self.spill: BinaryIO | None = spill[1] if spill is not None else None
        self.spill_error: str | None = None

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.spill is not None:
            try:
                self.spill.write(chunk)
            except OSError as exc:
                self._spill_failed(exc)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            if len(chunk) >= self.tail_limit:
                self.tail[:] = chunk[-self.tail_limit:]
            else:
                self.tail += chunk
                excess = len(self.tail) - self.tail_limit
                if excess > 0:
                    del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self, secrets: Collection[str] | SecretSet = ()) -> str:
        """The kept bytes as text; a marker says how many bytes were left out in the middle. With
        ``secrets`` (the host's), a secret the cut goes through is redacted on both sides of it
        (``redaction.redact_cut``): the host's redaction of the result finds whole secrets only."""
        head = self.head.decode("utf-8", "replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", "replace")
        omitted = self.total - len(self.head) - len(self.tail)
        where = f"; the full output is in {self.spill_path}" if self.spill_path and not self.spill_error else ""
        return (f"{redact_cut(head, secrets, cut_after=True)}\n[... {omitted} bytes omitted{where} ...]\n"
                + redact_cut(self.tail.decode("utf-8", "replace"), secrets, cut_before=True))

    def _spill_failed(self, exc: OSError) -> None:
        """Stop spilling: note why and how much the file holds, keep it, close it (never raises)."""
        spill, self.spill = self.spill, None
        if spill is None:
            return
        try:
            held = f"{os.fstat(spill.fileno()).st_size} of the {self.total} bytes so far"
        except OSError:
            held = "an unknown part"
        self.spill_error = f"{exc.strerror or exc}; it holds {held}"
        try:
            spill.close()  # the buffered rest cannot be written either; the descriptor is closed anyway
        except OSError:
            pass

    def close(self) -> None:
        if self.spill is not None:
            try:
                self.spill.flush()  # the buffered rest: may meet the full disk too
            except OSError as exc:
                self._spill_failed(exc)
                return
            self.spill.close()
            self.spill = None

    def summary(self, name: str, secrets: Collection[str] | SecretSet = ()) -> dict[str, Any]:
        out: dict[str, Any] = {name: self.text(secrets), f"{name}_bytes": self.total,
                               f"{name}_truncated": self.truncated}
        if self.spill_path:
            out[f"{name}_file"] = self.spill_path
            if self.spill_error is not None:
                out[f"{name}_file_error"] = f"the spill file {self.spill_path} is incomplete: {self.spill_error}"
        return out


def open_spill_files(directory: str, call_id: str) -> tuple[tuple[str, BinaryIO], tuple[str, BinaryIO]]:
    """New files for a call's stdout and stderr inside ``directory``: ``(path, file)`` each.

    The directory is created (0700) if missing; an existing one must be this user's.
    ``ToolSystemError`` (code ``spill_failed``) naming the path when it is not a directory
    of this user (e.g. a symlink) or a name already exists, whatever it is.
    """
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in call_id)[:80] or "call"
    opened: list[tuple[str, BinaryIO]] = []
    path = directory
    try:
        if not os.path.lexists(directory):  # never chmod a directory the operator made
            ensure_state_dir(directory)
        dir_fd = open_host_dir(directory)
        try:
            for stream in ("stdout", "stderr"):
                name = f"bash-{safe}-{os.getpid()}.{stream}"
                path = os.path.join(directory, name)
                fd = open_host_file(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600, dir_fd=dir_fd)
                opened.append((path, os.fdopen(fd, "wb")))
        except OSError:
            for made, file in opened:  # ours (O_EXCL): nothing of a failed call is left behind
                file.close()
                os.unlink(os.path.basename(made), dir_fd=dir_fd)
            raise
        finally:
            os.close(dir_fd)
    except OSError as exc:
        found = "it already exists (planted?)" if isinstance(exc, FileExistsError) else exc.strerror
        # The setting is named (found by a newcomer's trial: a spill_dir that cannot be created
        # failed every call with only the path and the command line's generic hint).
        raise ToolSystemError(f"cannot create the spill file {path}: {found}; the command was not run",
                              code="spill_failed", path=path, setting="plugins.bash.spill_dir",
                              hint="[plugins.bash] spill_dir (relative to state_dir) must name a directory "
                                   "this user owns or can create") from None
    return opened[0], opened[1]
