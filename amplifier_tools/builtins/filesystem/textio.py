"""Bounded reading: line paging, binary detection, atomic replacement.

Everything here works on file descriptors handed out by ``PathRules``; nothing
opens a path by name.
"""

from __future__ import annotations

import contextvars
import os
import stat
import sys
import threading
from collections.abc import Callable, Collection
from typing import Any, Final

from ...redaction import SecretSet, redact_cut

SNIFF_BYTES: Final = 8192
CHUNK: Final = 1 << 16


def looks_binary(head: bytes) -> bool:
    """A NUL byte in the first bytes means binary (as git and grep decide)."""
    return b"\x00" in head


#: Set when the call running in this worker thread was abandoned (its timeout passed, or it was
#: cancelled): walks stop at the next entry, reads at the next line or chunk. Found by scale test:
#: a ``grep`` over 200,000 files timed out after 0.5 s but its thread walked on for seconds; six
#: such calls held every worker of the event loop's default executor, and every later filesystem
#: call (a ``list_dir`` of 100 entries) timed out waiting for a thread.
ABANDONED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("fs_abandoned", default=None)


class Abandoned(Exception):
    """The call was abandoned while its thread ran; nobody reads this."""


def check_abandoned() -> None:
    """Raise ``Abandoned`` in a worker thread whose call was abandoned."""
    event = ABANDONED.get()
    if event is not None and event.is_set():
        raise Abandoned


def page_lines(fd: int, *, offset: int, limit: int, max_line_chars: int, encoding: str,
               secrets: Collection[str] | SecretSet = ()) -> dict[str, Any]:
    """Lines ``offset .. offset+limit-1`` (1-based), reading no further than needed.

    Memory is bounded by ``limit * max_line_chars``: a long line is cut while it
    is read, and the rest of it skipped in chunks. ``total_lines`` is known only
    when the end of the file was reached within the page. A secret (of ``secrets``, the host's)
    a line's cut goes through is redacted (``redact_cut``): the host's redaction of the result
    finds whole secrets only (found by attack: the cut line showed all but the end of one).
    """
    with os.fdopen(os.dup(fd), "rb", buffering=CHUNK) as stream:
        # bytes: up to 4 per character in UTF-8; never past what readline takes (found by attack: a
        # max_line_chars above 2**61 failed every read with OverflowError)
        cap = min(max_line_chars * 4 + 4, sys.maxsize)
        lines: list[str] = []
        number = 0
        truncated_lines = 0
        eof = False
        while True:
            check_abandoned()
            raw = stream.readline(cap)
            if not raw:
                eof = True
                break
            long_line = not raw.endswith(b"\n") and len(raw) >= cap
            if long_line:  # skip the rest of an over-long line without keeping it
                while True:
                    check_abandoned()
                    more = stream.readline(CHUNK)
                    if not more or more.endswith(b"\n"):
                        break
            number += 1
            if number < offset:
                continue
            if len(lines) >= limit:
                break
            text = raw.decode(encoding, errors="replace").rstrip("\r\n")
            if long_line or len(text) > max_line_chars:
                truncated_lines += 1
                text = redact_cut(text[:max_line_chars], secrets, cut_after=True) + " … [line truncated]"
            lines.append(text)
        total = number if eof else None
    return {"lines": lines, "total_lines": total, "truncated_lines": truncated_lines, "eof": eof}


def permission_bits(mode: int) -> int:
    """The ``rwx`` bits of ``mode``: a rewritten file never keeps setuid, setgid or sticky, since its
    content is the model's (and its owner may become the host's user)."""
    return stat.S_IMODE(mode) & 0o777


def _keep_owner(fd: int, uid: int, gid: int) -> None:
    """Give the file ``fd`` the owner and group of the file it replaces, as far as the host may: both
    as root, the group alone when the host's user is in it, else neither (found by attack: a host
    run as root that edited a user's ``0600`` file left it root's, unreadable to its owner; one that
    rewrote a group-shared ``0660`` file took it from the group)."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) == (uid, gid):
        return
    try:
        os.fchown(fd, uid, gid)
    except OSError:
        try:
            os.fchown(fd, -1, gid)
        except OSError:
            pass


def atomic_replace(dir_fd: int, name: str, data: bytes, mode: int, owner: tuple[int, int] | None = None,
                   before_rename: Callable[[], None] | None = None) -> os.stat_result:
    """Write ``data`` to a temp file in the same directory, fsync, then rename over ``name``; the
    written file's ``fstat`` (what ``name`` holds now, unless another writer came after).

    A crash leaves the old content or the new one, never a torn file; the temp
    file is removed when anything fails. ``mode`` is applied with ``fchmod`` (not
    subject to the umask) and must be permission bits only (``permission_bits``).
    ``owner`` (the replaced file's ``(uid, gid)``) is given to the new file as far as
    the host may (``_keep_owner``). ``before_rename`` runs last before the rename; what it
    raises stops the replacement (``edit_file`` checks there that the file is still the one it
    read).
    """
    # secrets.token_hex(6), without importing random at start; the name cut to 200 bytes, so that the
    # temp name fits where ``name`` does (found by attack: a 250-byte name, which the filesystem holds,
    # could not be written: the temp name was over 255 bytes)
    tmp = f".{os.fsdecode(os.fsencode(name)[:200])}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if owner is not None:
                _keep_owner(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
            replacement = os.fstat(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return replacement
