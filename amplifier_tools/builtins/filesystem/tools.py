"""The six filesystem tools. Each resolves every path through the plugin's ``PathRules``."""

from __future__ import annotations

import abc
import asyncio
import bisect
import codecs
import os
import re
import stat
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, Final

from ...errors import ContractError, ExecutionError
from ...models import ToolResult
from ...redaction import SecretSet, redact_cut
from ...spec import ToolSpec
from .paths import PathRules, names_a_directory, not_a_directory, os_error
from .settings import FilesystemSettings
from .textio import (
    ABANDONED,
    SNIFF_BYTES,
    atomic_replace,
    check_abandoned,
    looks_binary,
    page_lines,
    permission_bits,
)

VERSION = "1.0.0"
IGNORED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox", ".venv"})
#: Directories below this many levels under a walk's start are not entered (``glob`` and ``grep``
#: count them as ``too_deep``). A walk holds one descriptor per level, and each level's relative
#: path is a string as long as the path: found by scale test, a chain of 10,000 nested directories
#: made one ``glob`` hold 10,000 descriptors (under the common limit of 1,024 it failed with
#: ``Too many open files``, and so would any other call of the host meanwhile) and 110 MB of
#: prefixes (memory growing with the square of the depth).
MAX_WALK_DEPTH = 128


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


class ReadLog:
    """Which files this host has read, by (device, inode) with the size and mtime seen.

    Backs ``require_read_before_write``: a write to an existing file is refused
    unless it was read here and has not changed on disk since.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], tuple[int, int]] = {}

    def saw(self, st: os.stat_result) -> None:
        self._seen[(st.st_dev, st.st_ino)] = (st.st_size, st.st_mtime_ns)

    def check(self, st: os.stat_result, path: str) -> None:
        seen = self._seen.get((st.st_dev, st.st_ino))
        if seen is None:
            raise ContractError(f"{path!r} must be read with read_file before it is changed",
                                code="read_before_write", path=path)
        if seen != (st.st_size, st.st_mtime_ns):
            raise ContractError(f"{path!r} changed on disk since it was read; read it again", code="stale_read",
                                path=path)


class FilesystemTool(abc.ABC):
    """Shared shape: a spec, the rules, and a sync implementation run in a worker thread."""

    spec: ToolSpec

    def __init__(self, rules: PathRules, settings: FilesystemSettings, read_log: ReadLog, *,
                 secrets: Collection[str] | SecretSet = ()) -> None:
        self.rules = rules
        self.settings = settings
        self.read_log = read_log
        #: The host's secrets (``session.secrets``): redacted where a tool cuts a text short, before
        #: the host redacts the whole result (a secret cut in two is no longer found then).
        self.secrets = secrets
        self.name = self.spec.name
        self.description = self.spec.description

    @abc.abstractmethod
    def run(self, input: dict[str, Any]) -> Any:
        """Do the work synchronously (called in a worker thread)."""

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        abandoned = threading.Event()
        token = ABANDONED.set(abandoned)  # copied into the worker thread's context by to_thread
        try:
            return ToolResult(output=await asyncio.to_thread(self._run, input))
        except BaseException:
            abandoned.set()  # a cancellation (timeout) leaves the thread running: stop its walk
            raise
        finally:
            ABANDONED.reset(token)

    def _run(self, input: dict[str, Any]) -> Any:
        """``run``, with any ``OSError`` that escaped it turned into a typed error naming the path."""
        try:
            return self.run(input)
        except OSError as exc:
            raise os_error(exc, str(input.get("path", "."))) from None


class ReadFile(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.read_file", version=VERSION, title="Read file",
        description="Read a text file as numbered lines (cat -n style), a page at a time: offset is the first "
                    "line (1-based), limit the number of lines. Refuses binary files, directories, devices and "
                    "paths outside the allowed read roots. Does not follow symlinks out of the roots.",
        tags=("fs", "read"), effect="Pure",
        input_schema={"type": "object", "properties": {
            "path": _string("File path, relative to the working directory or absolute"),
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100000, "description": "Lines to return"},
            "encoding": _string("Text encoding", default="utf-8"),
        }, "required": ["path"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "content": {"type": "string"}, "path": {"type": "string"}, "offset": {"type": "integer"},
            "lines_returned": {"type": "integer"}, "total_lines": {"type": ["integer", "null"]},
            "partial": {"type": "boolean"}, "truncated_lines": {"type": "integer"}, "notice": {"type": "string"},
        }, "required": ["content", "path", "lines_returned", "partial"]},
        examples=[{"input": {"path": "README.md", "limit": 20}, "description": "first 20 lines",
                   "files": {"README.md": "# A project\n\nWhat it does.\n"}},
                  {"input": {"path": "/etc/shadow"}, "error_code": "path_denied"}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        path = input["path"]
        encoding = text_encoding(input.get("encoding", "utf-8"))
        offset = input.get("offset", 1)
        paging = "limit" in input or "offset" in input
        limit = input.get("limit", self.settings.default_limit)
        fd, st, resolved = self.rules.open_file(path)
        try:
            if not paging and st.st_size > self.settings.max_size:
                raise ExecutionError(
                    f"{path!r} is {st.st_size} bytes, more than max_size ({self.settings.max_size}); "
                    "read it in pages with offset and limit (e.g. offset=1, limit=2000)",
                    code="file_too_large", size=st.st_size)
            head = os.pread(fd, SNIFF_BYTES, 0)
            if looks_binary(head):
                raise ExecutionError(f"{path!r} looks like a binary file ({st.st_size} bytes); not shown",
                                     code="binary_file", size=st.st_size)
            page = page_lines(fd, offset=offset, limit=limit, max_line_chars=self.settings.max_line_chars,
                              encoding=encoding, secrets=self.secrets)
        finally:
            os.close(fd)
        self.read_log.saw(st)
        lines = page["lines"]
        content = "\n".join(f"{offset + i:>6}\t{line}" for i, line in enumerate(lines))
        partial = not page["eof"] or offset > 1
        out: dict[str, Any] = {"content": content, "path": resolved.path, "offset": offset,
                               "lines_returned": len(lines), "total_lines": page["total_lines"],
                               "partial": partial, "truncated_lines": page["truncated_lines"]}
        if st.st_size == 0:
            out["notice"] = "the file is empty"
        elif not lines and page["eof"]:
            out["notice"] = f"offset {offset} is past the end of the file ({page['total_lines']} lines)"
        elif not page["eof"]:
            out["notice"] = f"more lines follow; continue with offset={offset + len(lines)}"
        return out


class WriteFile(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.write_file", version=VERSION, title="Write file",
        description="Create or replace a text file atomically (temp file, fsync, rename), creating parent "
                    "directories inside an allowed write root; keeps the permission bits of a replaced file (never "
                    "setuid, setgid or sticky). Does not "
                    "write through symlinks, hard links or special files.",
        tags=("fs", "write"), effect="IdempotentWrite", idempotency_key="optional",
        input_schema={"type": "object", "properties": {
            "path": _string("File path"), "content": _string("The whole new content"),
            "encoding": _string("Text encoding", default="utf-8"),
        }, "required": ["path", "content"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "path": {"type": "string"}, "bytes_written": {"type": "integer"}, "created": {"type": "boolean"},
        }, "required": ["path", "bytes_written", "created"]},
        examples=[{"input": {"path": "notes/todo.txt", "content": "buy milk\n"}}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        path = input["path"]
        encoding = text_encoding(input.get("encoding", "utf-8"))
        try:
            data = input["content"].encode(encoding)
        except UnicodeError as exc:  # a lone surrogate (JSON "\ud800"), or text the encoding cannot say
            where = f" at character {exc.start}" if isinstance(exc, UnicodeEncodeError) else ""
            raise ContractError(f"the content cannot be encoded as {encoding}{where}", code="invalid_input",
                                pointer="/content") from None
        if names_a_directory(path):
            raise not_a_directory(path)
        with self.rules.open_parent(path, write=True, create=True) as (dir_fd, name, resolved):
            if not name:
                raise ExecutionError(f"{path!r} is a directory", code="is_a_directory")
            with file_lock(dir_fd, name):
                existing = self.rules.check_replace(dir_fd, name, path)
                checked = existing is not None and self.settings.require_read_before_write
                if existing is not None and checked:
                    self.read_log.check(existing, path)
                mode = (permission_bits(existing.st_mode) if existing is not None
                        else self.settings.new_file_mode if self.settings.new_file_mode is not None
                        else 0o644 & ~UMASK)
                self.read_log.saw(atomic_replace(
                    dir_fd, name, data, mode, None if existing is None else (existing.st_uid, existing.st_gid),
                    _unchanged(dir_fd, name, existing, path) if existing is not None and checked else None))
        return {"path": resolved.path, "bytes_written": len(data), "created": existing is None}


class EditFile(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.edit_file", version=VERSION, title="Edit file",
        description="Replace an exact string in a text file, atomically. Fails when old_string is absent, "
                    "occurs more than once (unless replace_all) or equals new_string. Reports how many "
                    "replacements were made. Not idempotent: when new_string contains old_string, running "
                    "the same edit again changes the file again.",
        # NonIdempotentWrite, not IdempotentWrite: repeating an edit whose new_string contains its
        # old_string (e.g. replace_all 'a' -> 'aa') applies it again, so the host must never retry it.
        tags=("fs", "write"), effect="NonIdempotentWrite", idempotency_key="optional",
        input_schema={"type": "object", "properties": {
            "path": _string("File path"), "old_string": {"type": "string", "minLength": 1},
            "new_string": {"type": "string"}, "replace_all": {"type": "boolean", "default": False},
        }, "required": ["path", "old_string", "new_string"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "path": {"type": "string"}, "replacements": {"type": "integer"}},
            "required": ["path", "replacements"]},
        examples=[{"input": {"path": "app.py", "old_string": "DEBUG = True", "new_string": "DEBUG = False"}}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        path, old, new = input["path"], input["old_string"], input["new_string"]
        if old == new:
            raise ContractError("old_string and new_string are the same; nothing to do", code="no_change",
                                pointer="/new_string")
        try:  # checked before anything is opened, as write_file checks its content
            new.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as exc:  # a lone surrogate (JSON "\ud800") that no byte stands for
            raise ContractError(f"new_string cannot be encoded as utf-8 at character {exc.start}",
                                code="invalid_input", pointer="/new_string") from None
        if names_a_directory(path):
            raise not_a_directory(path)
        with self.rules.open_parent(path, write=True) as (dir_fd, name, resolved), file_lock(dir_fd, name):
            existing = self.rules.check_replace(dir_fd, name, path)
            if existing is None:
                raise ExecutionError(f"{path!r} does not exist", code="not_found")
            if existing.st_size > self.settings.max_size:
                raise ExecutionError(f"{path!r} is larger than max_size", code="file_too_large")
            if self.settings.require_read_before_write:
                self.read_log.check(existing, path)
            raw = _read_checked(dir_fd, name, existing, path)
            if looks_binary(raw[:SNIFF_BYTES]):
                raise ExecutionError(f"{path!r} looks like a binary file", code="binary_file")
            text = raw.decode("utf-8", errors="surrogateescape")
            count = text.count(old)
            if count == 0:
                raise ExecutionError(f"old_string was not found in {path!r}", code="not_found_in_file")
            if count > 1 and not input.get("replace_all", False):
                raise ExecutionError(f"old_string occurs {count} times in {path!r}; make it unique or set "
                                     "replace_all", code="not_unique", occurrences=count)
            updated = text.replace(old, new) if input.get("replace_all") else text.replace(old, new, 1)
            self.read_log.saw(atomic_replace(dir_fd, name, updated.encode("utf-8", errors="surrogateescape"),
                                             permission_bits(existing.st_mode), (existing.st_uid, existing.st_gid),
                                             _unchanged(dir_fd, name, existing, path)))
        return {"path": resolved.path, "replacements": count if input.get("replace_all") else 1}


#: Striped locks that serialize ``write_file`` and ``edit_file`` of one file (a directory and a
#: name in it) across the calls of every host in the process; bounded, whatever the number of files.
_FILE_LOCKS: tuple[threading.Lock, ...] = tuple(threading.Lock() for _ in range(64))


#: How often a write waiting for its file's lock checks whether its call was abandoned (seconds).
LOCK_POLL: Final = 0.05


@contextmanager
def file_lock(dir_fd: int, name: str) -> Iterator[None]:
    """Hold the lock of ``name`` in the directory ``dir_fd`` while a write or edit of it runs.

    Found by attack: two ``edit_file`` calls of one file run at once (a model's parallel tool calls)
    both read the old content, and the second rename dropped the first edit, both reporting
    success. An edit now reads what the one before it wrote. A call abandoned (timed out)
    while it waits stops waiting (checked every ``LOCK_POLL`` s), and one abandoned by the time it
    gets the lock stops here, instead of changing the file after its error was reported (found by
    review: a write hung on a stalled disk held its stripe, and writes of unrelated files sharing
    it, in any host, waited for good, each holding a worker thread after its call timed out)."""
    st = os.fstat(dir_fd)
    lock = _FILE_LOCKS[hash((st.st_dev, st.st_ino, name)) % len(_FILE_LOCKS)]
    while not lock.acquire(timeout=LOCK_POLL):
        check_abandoned()
    try:
        check_abandoned()
        yield
    finally:
        lock.release()


def _changed(path: str) -> ExecutionError:
    return ExecutionError(f"{path!r} was replaced or changed by another writer during this call; read it again",
                          code="file_changed", path=path)


def _same(now: os.stat_result, checked: os.stat_result) -> bool:
    return ((now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns)
            == (checked.st_dev, checked.st_ino, checked.st_size, checked.st_mtime_ns))


def _unchanged(dir_fd: int, name: str, checked: os.stat_result, path: str) -> Callable[[], None]:
    """A check for ``atomic_replace``'s ``before_rename``: ``file_changed`` unless ``name`` is still
    the file ``checked`` was taken of, with the same size and mtime. Another process can still
    write between this check and the rename (no lock binds it): the window is the few microseconds
    between two system calls, not the whole call."""
    def check() -> None:
        try:
            now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise _changed(path) from None
        if not _same(now, checked):
            raise _changed(path)
    return check


def _read_checked(dir_fd: int, name: str, checked: os.stat_result, path: str) -> bytes:
    """The bytes of ``name``, opened without blocking and only if it is still the regular file
    ``checked`` was taken of, unchanged (found by attack: a FIFO swapped in after the check blocked
    the open for good, and the host could not exit; a file that another process appended to after
    the check was read only to its old size plus one byte, and the edit wrote it back cut there);
    a swap or a change is the typed ``file_changed``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        raise _changed(path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _changed(path)
        data = os.read(fd, checked.st_size + 1)
        if len(data) != checked.st_size or not _same(os.fstat(fd), checked):
            raise _changed(path)
        return data
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


class ListDir(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.list_dir", version=VERSION, title="List directory",
        description="List a directory's entries (name, type, size), sorted by name, capped. Symlinks are "
                    "listed as symlinks, not followed.",
        tags=("fs", "read"), effect="Pure",
        input_schema={"type": "object", "properties": {"path": _string("Directory path", default=".")},
                      "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "path": {"type": "string"}, "entries": {"type": "array"}, "omitted": {"type": "integer"}},
            "required": ["path", "entries", "omitted"]},
        examples=[{"input": {"path": "."}}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        with self.rules.open_dir(input.get("path", ".")) as (fd, resolved):
            names = sorted(name for name in os.listdir(fd) if not self.rules.hidden(resolved, name))
            cap = self.settings.max_results
            entries = []
            for name in names[:cap]:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                entries.append({"name": name, "type": _kind(st.st_mode), "size": st.st_size})
        # The counts first: a model reads the output cut at 50,000 characters
        # (get_serialized_output), and 1,000 entries can pass that, which cut the count off its end.
        return {"path": resolved.path, "omitted": max(0, len(names) - cap), "entries": entries}


def _walk(rules: PathRules, start: str, too_deep: list[int] | None = None) -> Iterator[tuple[str, int, str]]:
    """(relative path, dir fd, name) of every regular file under ``start``; never follows symlinks,
    never enters or yields a protected or denied path (``PathRules.hidden``).

    Depth first, each subdirectory opened only when it is entered: one descriptor per level
    (found by attack: opening every subdirectory of a level at once, 21,000 of them, ran the
    process out of descriptors, and the directories that failed to open were skipped unsaid).
    Directories ``MAX_WALK_DEPTH`` levels down are not entered; ``too_deep[0]`` counts them."""
    with rules.open_dir(start) as (top_fd, top):
        # (directory fd, its relative prefix, the names of its subdirectories still to enter, or
        # None before it is listed)
        stack: list[tuple[int, str, list[str] | None]] = [(os.dup(top_fd), "", None)]
        try:
            while stack:
                check_abandoned()
                fd, prefix, pending = stack[-1]
                if pending is None:
                    with os.scandir(fd) as it:
                        entries = sorted(it, key=lambda e: e.name, reverse=True)
                    pending = []
                    for entry in entries:
                        rel = f"{prefix}{entry.name}"
                        if entry.is_symlink() or rules.hidden(top, rel):
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            if entry.name not in IGNORED_DIRS:
                                pending.append(entry.name)  # last name first: popped in name order
                        elif entry.is_file(follow_symlinks=False):
                            check_abandoned()
                            yield rel, fd, entry.name
                    stack[-1] = (fd, prefix, pending)
                if not pending:
                    stack.pop()
                    os.close(fd)
                    continue
                name = pending.pop()
                if len(stack) >= MAX_WALK_DEPTH:
                    if too_deep is not None:
                        too_deep[0] += 1
                    continue
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue  # gone, swapped for a symlink or unreadable since it was listed
                stack.append((sub, f"{prefix}{name}/", None))
        finally:
            for fd, _, _ in stack:
                os.close(fd)


def text_encoding(encoding: str) -> str:
    """``encoding`` when it is a text encoding that can replace what it cannot decode, else
    ``ContractError`` ``invalid_encoding`` naming ``/encoding`` (found by attack: ``idna``, which
    cannot, failed the call as an untyped ``UnicodeError``)."""
    try:
        codecs.lookup(encoding)
        b"\xff\xfe".decode(encoding, errors="replace")
    except (LookupError, UnicodeError):
        raise ContractError(f"{encoding!r} is not a text encoding this tool can use (e.g. utf-8, latin-1)",
                            code="invalid_encoding", pointer="/encoding") from None
    return encoding


def glob_regex(pattern: str, pointer: str = "/pattern") -> GlobMatcher:
    """A regex for a glob with ``**`` (any number of directories), ``*``, ``?`` and ``[...]``;
    ``ContractError`` ``invalid_pattern`` naming ``pointer`` for a class ``re`` refuses (``[z-a]``)."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape("["))
                i += 1
            else:
                # ``[`` escaped too: RE2 reads ``[:alpha:]`` (``[.`` ``[=``) in a class as a POSIX class
                # where ``re`` read the characters (found by review: ``[[:alpha:]*`` matched other
                # names once the match moved to RE2, and ``[[:alpha:]]`` was refused as no glob)
                body = pattern[i + 1:end].replace("\\", "\\\\").replace("[", "\\[")
                out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    try:
        # DOTALL: a name may hold a newline, and ``**`` must match it like any other character (found
        # by attack: ``**`` silently left out every file with a newline in its path)
        re.compile("".join(out) + r"\Z", re.DOTALL)  # the checks (and messages) of ``re``
    except re.error as exc:
        raise ContractError(f"invalid glob {pattern!r}: {exc.msg}", code="invalid_pattern", pointer=pointer) from None
    return GlobMatcher("".join(out), pattern, pointer)


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8 for RE2, a lone surrogate (a byte of a non-UTF-8 name, as ``os.fsdecode``
    gives it) as U+FFFD: one character, as ``?`` and ``*`` took it on ``re``."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text).encode("utf-8")


class GlobMatcher:
    """A glob's regex run by RE2: linear in the path (found by attack: on ``re``, ``fs_glob`` of
    ``*a*a*a*a*a*a*a*b`` in a directory holding one file named with 60 ``a``s held the GIL for
    7.6 s, freezing the host past its 1 s timeout; each more ``*a`` multiplies it, and the same
    went for ``fs_grep``'s ``glob``)."""

    def __init__(self, regex: str, pattern: str, pointer: str) -> None:
        import re2

        options = re2.Options()
        options.log_errors = False
        try:
            self._regex = re2.compile(b"(?s)" + _utf8(regex) + rb"\z", options)
        except re2.error:
            raise ContractError(f"invalid glob {pattern!r}: RE2 cannot run it", code="invalid_pattern",
                                pointer=pointer) from None

    def match(self, rel: str) -> bool:
        return self._regex.match(_utf8(rel)) is not None


class Glob(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.glob", version=VERSION, title="Find files",
        description="Find files whose path (relative to 'path') matches a glob; '**' spans directories. "
                    "Sorted, capped, with the count left out. Skips .git and similar directories; does not "
                    "follow symlinks.",
        tags=("fs", "read", "search"), effect="Pure",
        input_schema={"type": "object", "properties": {
            "pattern": _string("Glob, e.g. '**/*.py'", minLength=1),
            "path": _string("Directory to search", default=".")},
            "required": ["pattern"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "matches": {"type": "array", "items": {"type": "string"}}, "omitted": {"type": "integer"},
            "too_deep": {"type": "integer"}},
            "required": ["matches", "omitted"]},
        examples=[{"input": {"pattern": "**/*.md"}, "files": {"docs/index.md": "# Docs\n"}}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        regex = glob_regex(input["pattern"])
        too_deep = [0]
        found = sorted(rel for rel, _, _ in _walk(self.rules, input.get("path", "."), too_deep) if regex.match(rel))
        cap = self.settings.max_results
        out: dict[str, Any] = {"omitted": max(0, len(found) - cap)}  # the counts first: they survive a cut
        if too_deep[0]:
            out["too_deep"] = too_deep[0]
        out["matches"] = found[:cap]
        return out


class Grep(FilesystemTool):
    spec = ToolSpec(
        name="local::fs.grep", version=VERSION, title="Search file contents",
        description="Search files under 'path' for a regular expression (RE2 syntax, as ripgrep: no lookaround "
                    "or backreferences), optionally only files "
                    "matching a glob; prints 'file:line:text' with optional context lines. Skips binary files, "
                    ".git and similar directories, and symlinks; capped.",
        tags=("fs", "read", "search"), effect="Pure",
        input_schema={"type": "object", "properties": {
            "pattern": _string("Regular expression", minLength=1),
            "path": _string("Directory or file to search", default="."),
            "glob": _string("Only files whose relative path matches this glob"),
            "ignore_case": {"type": "boolean", "default": False},
            "context": {"type": "integer", "minimum": 0, "maximum": 20, "default": 0},
            "max_matches": {"type": "integer", "minimum": 1, "maximum": 10000}},
            "required": ["pattern"], "additionalProperties": False},
        output_schema={"type": "object", "properties": {
            "matches": {"type": "array"}, "files_searched": {"type": "integer"},
            "truncated": {"type": "boolean"}, "too_deep": {"type": "integer"}},
            "required": ["matches", "files_searched", "truncated"]},
        examples=[{"input": {"pattern": "TODO", "glob": "**/*.py"},
                   "files": {"app/main.py": "def main():\n    pass  # TODO: parse arguments\n"}}],
    )

    def run(self, input: dict[str, Any]) -> dict[str, Any]:
        regex = search_regex(input["pattern"], bool(input.get("ignore_case")))
        only = glob_regex(input["glob"], "/glob") if "glob" in input else None
        context = input.get("context", 0)
        cap = input.get("max_matches", self.settings.max_matches)
        max_file = self.settings.max_size
        matches: list[dict[str, Any]] = []
        searched = 0
        shown = [0]  # characters of text in ``matches``: bounded by ``MAX_GREP_TEXT``
        start = input.get("path", ".")
        try:
            fd, st, resolved = self.rules.open_file(start)
        except ExecutionError as exc:
            if exc.code != "is_a_directory":
                raise
        else:  # a single file
            try:
                if st.st_size > max_file:  # refused as read_file refuses it, not "searched" with no match
                    raise ExecutionError(
                        f"{start!r} is {st.st_size} bytes, more than max_size ({max_file}); grep does not search "
                        "it: read it in pages with fs_read_file (offset and limit)",
                        code="file_too_large", size=st.st_size)
                self._search_fd(fd, st.st_size, os.path.basename(resolved.path), regex, context, cap, matches,
                                max_file, self.secrets, shown)
            finally:
                os.close(fd)
            return {"truncated": len(matches) >= cap or shown[0] >= MAX_GREP_TEXT, "files_searched": 1,
                    "matches": matches}
        too_deep = [0]
        for rel, dir_fd, name in _walk(self.rules, start, too_deep):
            if only is not None and not only.match(rel):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > max_file:  # skipped, and not counted
                    continue
                searched += 1
                self._search_fd(fd, st.st_size, rel, regex, context, cap, matches, max_file, self.secrets, shown)
            finally:
                os.close(fd)
            if len(matches) >= cap or shown[0] >= MAX_GREP_TEXT:
                break
        # the counts first, so a cut of the text (200 matches of 500 characters) keeps them
        out: dict[str, Any] = {"truncated": len(matches) >= cap or shown[0] >= MAX_GREP_TEXT,
                               "files_searched": searched}
        if too_deep[0]:
            out["too_deep"] = too_deep[0]
        out["matches"] = matches
        return out

    @staticmethod
    def _search_fd(fd: int, size: int, rel: str, regex: Any, context: int, cap: int,
                   matches: list[dict[str, Any]], max_file: int,
                   secrets: Collection[str] | SecretSet = (), shown: list[int] | None = None) -> None:
        if size > max_file or (shown is not None and shown[0] >= MAX_GREP_TEXT):
            return
        data = os.read(fd, size + 1) if size else b""
        if not data or looks_binary(data[:SNIFF_BYTES]) or regex.search(data) is None:
            return  # the common case stays in C: one search over the whole file
        lines = data.split(b"\n")
        # A final newline ends the last line; no empty line follows it (an empty match there is not
        # on any line).
        past_end = len(data) if data.endswith(b"\n") else len(data) + 1
        if past_end == len(data):
            lines.pop()
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        # One search per matching line, the next one from the start of the line after it (found by
        # attack: ``finditer`` went through every match, and ``x*`` matches at each byte: one line of
        # 2 MB took 2.5 s of the worker thread, a 10 MB one 12 s past the call's timeout, since the
        # loop never looked whether the call was abandoned)
        pos = 0
        while pos < past_end:
            check_abandoned()
            match = regex.search(data, pos)
            if match is None or match.start() >= past_end:
                break
            index = bisect.bisect_right(starts, match.start()) - 1
            pos = starts[index + 1] if index + 1 < len(starts) else past_end
            entry: dict[str, Any] = {"file": rel, "line": index + 1, "text": _shown(lines[index], secrets)}
            if context:
                entry["before"] = [_shown(lines[j], secrets) for j in range(max(0, index - context), index)]
                entry["after"] = [_shown(lines[j], secrets)
                                  for j in range(index + 1, min(len(lines), index + 1 + context))]
            matches.append(entry)
            if shown is not None:
                shown[0] += len(entry["text"]) + sum(map(len, entry.get("before", ()))) \
                    + sum(map(len, entry.get("after", ())))
                if shown[0] >= MAX_GREP_TEXT:
                    return
            if len(matches) >= cap:
                return


#: ``fs_grep`` shows at most this many characters of a matching line (and of a context line).
MATCH_LINE_CHARS = 500
#: ``fs_grep`` stops (``truncated``) once its matches hold this many characters of text, lines and
#: context lines together (found by attack: ``context`` 20 and ``max_matches`` 10,000 over a 6 MB
#: file of 600-character lines gave one result of 207 million characters, the process 681 MB,
#: each line repeated in the context of 40 matches; a model is shown 50,000 characters of it).
MAX_GREP_TEXT = 2_000_000


def _shown(line: bytes, secrets: Collection[str] | SecretSet) -> str:
    """A line as ``fs_grep`` shows it: its first ``MATCH_LINE_CHARS`` characters, a secret (of
    ``secrets``, the host's) the cut goes through redacted (``redact_cut``): the host's redaction of
    the result finds whole secrets only (found by review: the cut line showed all but the end of one)."""
    text = line.decode("utf-8", "replace")
    return text if len(text) <= MATCH_LINE_CHARS else redact_cut(text[:MATCH_LINE_CHARS], secrets, cut_after=True)


def search_regex(pattern: str, ignore_case: bool) -> Any:
    """``pattern`` compiled by RE2 for bytes, ``^``/``$`` at every line (``ContractError``
    ``invalid_pattern`` naming ``/pattern`` when RE2 cannot run it).

    RE2, not ``re``: it matches in time linear in the text, with bounded memory (found by attack:
    on ``re``, ``(a|a)*b`` against 25 ``a``s held the GIL for 6 s, freezing every call and timer
    of the host past the call's own timeout; each more ``a`` doubles it). The cost: no lookaround
    and no backreferences, as in ripgrep's default engine."""
    import re2  # a dependency of the core; imported by the first grep, not at start

    options = re2.Options()
    options.log_errors = False  # the refusal is the caller's typed error, not a line on stderr
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(b"(?m)" + pattern.encode("utf-8"), options)
    except UnicodeEncodeError as exc:
        raise ContractError(f"the pattern is not valid text: {exc.reason} at character {exc.start}",
                            code="invalid_pattern", pointer="/pattern") from None
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ContractError(f"invalid regular expression for RE2: {detail} (lookaround and backreferences "
                            "are not supported)", code="invalid_pattern", pointer="/pattern") from None


def _read_umask() -> int:
    current = os.umask(0o022)  # read once at import, before any worker thread creates files
    os.umask(current)
    return current


UMASK = _read_umask()


TOOL_CLASSES: tuple[Callable[..., FilesystemTool], ...] = (ReadFile, WriteFile, EditFile, ListDir, Glob, Grep)
