"""``PathRules``: the one path-rule engine behind every filesystem tool.

A path is allowed when, resolved, it lies inside an allowed root for the
operation (read or write) and matches no denied pattern; deny wins.

How resolution defeats escapes:

- the path is normalized lexically (``~`` expanded, relative to the working
  directory, ``.``/``..`` collapsed) and must lie under a root — ``..``
  traversal, absolute paths elsewhere and sibling-prefix roots
  (``/work/app`` vs ``/work/app-evil``, compared by components) are refused;
- the file is then opened *component by component* from a directory file
  descriptor of the root, every component with ``O_NOFOLLOW``: a symlink
  swapped in between check and open makes the open fail, it is never followed;
  the root is opened the same way from ``/`` (it was resolved at start, so a
  symlink on its path now was swapped in since, and is refused);
- a symlink met on the way is resolved and the whole walk starts again on the
  resolved path, which must itself lie inside a root (so in-root links work and
  links out of the roots are refused);
- only regular files and directories are used: FIFOs, sockets and devices are
  refused after an ``O_NONBLOCK`` open and ``fstat``, so nothing blocks;
- writes refuse files with more than one hard link (unless configured), since
  the other name may lie outside the roots;
- NUL bytes, over-long paths and names the filesystem cannot hold (``ENAMETOOLONG``)
  are contract errors;
- the host's protected paths (``session.protected_paths``: its config file, ``state_dir``,
  the audit log...) are refused for reads and writes alike (``path_protected``). Each pass
  of the walk checks the path it is about to open, and the last pass opens exactly that
  path without following anything, so the path checked is the path used: ``..``, symlinks
  and symlinked parents are resolved before the check, never after.

What it does not guarantee: it does not stop a process outside this host from
changing files inside the roots; bind mounts inside a root that lead elsewhere
look like ordinary directories; hard links are only detected for writes
(reading a hard-linked file reads that content); time-of-check races on
*directory removal* can make an operation fail, never escape.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Final

import attrs

from ...errors import AuthError, ContractError, ExecutionError, ToolError
from ...hoststate import ProtectedPath, ProtectedPaths
from .patterns import PathPattern, components_below

MAX_PATH_BYTES: Final = 4096
MAX_SYMLINK_HOPS: Final = 40
#: How many missing parent directories one write may make. Each is held open (a descriptor of its
#: parent) until the write ends, to remove it again without following a symlink if the write fails
#: (found by attack: ``write_file`` of a 3,000-byte path ``d/d/.../f`` — 1,500 new directories —
#: failed with ``os_error`` "Too many open files" under the common limit of 1,024 descriptors, and
#: any other call of the host meanwhile could fail the same way). ``glob`` and ``grep`` do not
#: look deeper than 128 levels either (``tools.MAX_WALK_DEPTH``).
MAX_MADE_DIRS: Final = 128
DEFAULT_WRITE_DENIED: Final = (".git", ".env*")


@attrs.frozen
class Resolved:
    """A path inside a root: the root, the components below it, and the absolute path."""

    root: str
    parts: tuple[str, ...]

    @property
    def path(self) -> str:
        return os.path.join(self.root, *self.parts) if self.parts else self.root

    @property
    def relative(self) -> str:
        return "/".join(self.parts) or "."


def _deny(message: str, rule: str, path: str) -> AuthError:
    return AuthError(message, code="path_denied", rule=rule, path=path)


def _protected(original: str, resolved: str, protected: ProtectedPath) -> AuthError:
    what = repr(original) if os.path.normpath(original) == resolved else f"{original!r} (resolved: {resolved})"
    return AuthError(f"{what} is protected: {protected.path} is {protected.reason}; tools may neither read "
                     "nor write it", code="path_protected", path=original, protected=protected.path,
                     reason=protected.reason,
                     hint="the host keeps its own configuration and state out of the tools' reach; work on "
                          "other files")


def _identity(directory: str) -> tuple[int, int] | None:
    """``(device, inode)`` of what ``directory`` leads to now (symlinks followed); None if nothing."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


#: How many symbolic links ``configured_path`` follows before it gives up (the kernel's limit).
MAX_LINK_HOPS: Final = 40


def configured_path(working_dir: str, path: str, writable: Iterable[str], key: str | None = None) -> str:
    """A path from the configuration (a root, a sandbox path, the working directory) resolved: ``~``
    expanded, relative to ``working_dir``, ``..`` collapsed first, then every symbolic link
    followed one hop at a time — resolved once, at start.

    ``ConfigError`` (naming ``key``) when a link it follows lies inside one of ``writable`` (the
    paths tools may write, resolved): tools could have put it there, so what the path names would
    be theirs to choose (found by attack: a sandboxed command replaced ``sandbox_write_paths =
    ["build"]`` by ``build -> /root/.ssh``, and the next start bound the host's ``/root/.ssh``
    read-write; then a link outside pointing at one inside). Name the target itself instead. Also
    for a loop of links."""
    from ...errors import ConfigError

    excluded = tuple(writable)
    pending = [name for name in os.path.normpath(os.path.join(working_dir, os.path.expanduser(path))).split("/")
               if name]
    pending.reverse()
    current, hops = "/", 0
    while pending:
        name = pending.pop()
        if name == "..":
            current = os.path.dirname(current)
            continue
        if name == ".":
            continue
        candidate = os.path.join(current, name)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or missing: taken as written
            current = candidate
            continue
        holder = next((root for root in excluded if components_below(candidate, root) is not None), None)
        if holder is not None:
            raise ConfigError(f"{path!r} leads through the symbolic link {candidate}, inside {holder}, which tools "
                              f"may write, to {os.path.realpath(candidate)}: name that path itself if it is meant",
                              key=key)
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise ConfigError(f"{path!r} leads through more than {MAX_LINK_HOPS} symbolic links (a loop?)", key=key)
        pending.extend(reversed([part for part in target.split("/") if part]))
        if target.startswith("/"):
            current = "/"
    return current


class PathRules:
    """Allowed read/write roots and denied patterns, applied to every path."""

    def __init__(self, working_dir: str, *, read_roots: Iterable[str], write_roots: Iterable[str],
                 denied: Iterable[str] = (), write_denied: Iterable[str] = DEFAULT_WRITE_DENIED,
                 allow_hardlinks: bool = False, protected: ProtectedPaths | None = None,
                 keys: tuple[str | None, str | None] = (None, None)) -> None:
        self.working_dir = os.path.realpath(working_dir)
        self._prefix = self.working_dir if self.working_dir.endswith("/") else self.working_dir + "/"
        self._working_dir_id = _identity(self.working_dir)
        # Held by reference: plugins that mount later (audit) add their files to the same object.
        self.protected = protected if protected is not None else ProtectedPaths()
        # ``keys``: the settings the read and the write roots come from, named in a ``ConfigError``.
        writable = [self.working_dir]
        for root in write_roots:  # each checked against the working directory and the roots before it
            writable.append(configured_path(self.working_dir, root, writable, keys[1]))
        self.write_roots = tuple(writable[1:])
        self.read_roots = tuple(configured_path(self.working_dir, r, writable, keys[0]) for r in read_roots)
        self.denied = tuple(denied)
        self.write_denied = tuple(write_denied)
        self._denied = tuple(PathPattern(p) for p in self.denied)
        self._write_denied = tuple(PathPattern(p) for p in self.write_denied)
        self.allow_hardlinks = allow_hardlinks

    # -- lexical checks --------------------------------------------------------

    def normalize(self, path: str) -> str:
        """The absolute, lexically normalized form of ``path`` (``~``, relative, ``..``); checks NUL and length."""
        return os.path.normpath(self._joined(path))

    def _joined(self, path: str) -> str:
        """``path`` made absolute (``~``, relative to the working directory), not normalized; checks NUL
        and length."""
        if not isinstance(path, str) or path == "":
            raise ContractError("path must be a non-empty string", code="invalid_path", pointer="/path")
        if "\x00" in path:
            raise ContractError("path contains a NUL byte", code="invalid_path", pointer="/path")
        # A character is at most 4 bytes in UTF-8: a short ASCII path needs no encoding to be measured.
        if len(path) * 4 > MAX_PATH_BYTES or not path.isascii():
            try:
                size = len(os.fsencode(path))
            except UnicodeEncodeError as exc:  # found by attack: every tool failed as tool_raised
                raise ContractError(f"path {path!r} holds a character no file name can (a lone surrogate, "
                                    f"at character {exc.start})", code="invalid_path", pointer="/path",
                                    path=path) from None
            if size > MAX_PATH_BYTES:
                raise ContractError(f"path is longer than {MAX_PATH_BYTES} bytes", code="invalid_path",
                                    pointer="/path")
        if path[0] == "~":
            path = os.path.expanduser(path)
        # ``os.path.join(self.working_dir, path)``, spelled out: the working directory is absolute.
        return path if path[0] == "/" else self._prefix + path

    _inside = staticmethod(components_below)

    def _locate(self, absolute: str, roots: tuple[str, ...], original: str, write: bool) -> Resolved:
        best: Resolved | None = None
        for root in roots:
            parts = self._inside(absolute, root)
            if parts is not None and (best is None or len(root) > len(best.root)):
                best = Resolved(root, parts)
        if best is None:
            kind = "write" if write else "read"
            raise _deny(f"{original!r} is outside the allowed {kind} roots ({', '.join(roots) or 'none'})",
                        f"outside_{kind}_roots", original)
        pattern = self._denied_by(best.path, best.root, write)
        if pattern is not None:
            raise _deny(f"{original!r} matches the denied path rule {pattern.text!r}", f"denied:{pattern.text}",
                        original)
        return best

    def _denied_by(self, path: str, root: str, write: bool) -> PathPattern | None:
        for pattern in self._denied + (self._write_denied if write else ()):
            if pattern.matches(path, root):
                return pattern
        return None

    def hidden(self, directory: Resolved, relative: str) -> bool:
        """Whether a directory walk (``list_dir``, ``glob``, ``grep``) of ``directory`` must skip the entry
        ``relative`` (a path below it, ``/``-separated): it is protected or matches a denied read rule.
        Skipped entries are never named, entered or searched. Call it for each entry before entering
        it: it relies on the entry's parent directories having passed it."""
        path = f"{directory.path}/{relative}" if directory.path != "/" else f"/{relative}"
        if self.protects(path) is not None:
            return True
        # The walk entered only directories that passed this check, below a start that passed
        # ``_locate``: an ancestor cannot match, so a name pattern needs only the entry's name.
        name = relative.rpartition("/")[2]
        return any(p.matches_entry(path, name, directory.root) for p in self._denied)

    def protects(self, path: str) -> ProtectedPath | None:
        """The protected entry covering the absolute, resolved ``path``, or None."""
        return self.protected.protects(path)

    def resolve_real(self, path: str) -> tuple[str, ...]:
        """The paths ``path`` may lead to, for path rules: absolute, every symlink followed (its target
        read with ``readlink``), missing components taken as written. Roots and denied rules are not
        applied. Two spellings, deduplicated, because two kinds of tool open a path two ways:

        - as the filesystem tools' walk does: ``..`` collapsed first, then symlinks followed;
        - as the kernel does (a third-party tool, an MCP server): components in order, so a ``..``
          after a symlink leaves the symlink's *target* (``link/../passwd`` with ``link -> /etc/ssl``
          is ``/etc/passwd``).

        A deny rule matches when either does; an allow rule needs both. ``/proc`` magic links resolve
        like symlinks (``/proc/self/root`` -> ``/``, ``/proc/self/cwd``, ``/dev/fd/N`` -> the open
        file's path); one that leads to no path (a pipe, socket, anonymous inode or deleted file) is
        refused: ``ContractError`` ``unresolvable_path``, as are loops. Reads only metadata
        (``lstat``, ``readlink``), never contents.
        """
        joined = self._joined(path)
        if self._working_dir_id is not None and self._one_name(path) \
                and _identity(self.working_dir) == self._working_dir_id:
            try:
                entry = os.lstat(joined)
            except FileNotFoundError:  # a missing name in the working directory: taken as written
                return (joined,)
            except OSError:
                pass
            else:  # a deleted file still reachable (a bind mount of it) is the walk's to refuse
                if not stat.S_ISLNK(entry.st_mode) and entry.st_nlink > 0:
                    return (joined,)
        normalized = os.path.normpath(joined)
        lexical = self._followed(normalized, path)
        if joined == normalized:  # no ".", ".." or "//": one spelling
            return (lexical,)
        physical = self._followed(joined, path)
        return (lexical,) if physical == lexical else (lexical, physical)

    def _one_name(self, path: str) -> bool:
        """Whether ``path`` is one name directly in the working directory. Then, while the working
        directory's path still leads to the directory it led to when the rules were made (a ``stat``:
        same device and inode; an ancestor swapped for a symlink to elsewhere fails it),
        ``resolve_real`` takes one ``lstat`` of the name (anything but a symlink or a deleted file is
        itself; a missing name is taken as written) instead of the kernel walk's open, ``readlink`` and close — a
        tool's path argument is most often such a name. Two system calls instead of three; the
        answer is the walk's (``test_one_name_in_the_working_directory_resolves_as_the_kernel_walk_does``)."""
        return ("/" not in path and path not in (".", "..") and not path.startswith("~")
                and self.working_dir != "/")

    def _followed(self, current: str, original: str) -> str:
        """``current`` (absolute) resolved by the kernel itself: an ``O_PATH`` open (which never opens
        a FIFO or device for I/O) and a ``readlink`` of its ``/proc/self/fd`` entry, whatever the
        depth. A missing last component below an existing directory is taken as written; every other
        case (a deeper missing part, a dangling symlink, no ``/proc``) goes through ``_readlinks``,
        which gives the same answer component by component."""
        try:
            fd = os.open(current, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            parent, name = os.path.split(current)
            if name in ("", ".", ".."):
                return self._readlinks(current, original)
            try:
                fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return self._readlinks(current, original)
            try:
                resolved = self._fd_path(fd, original)
                os.lstat(name, dir_fd=fd)  # a name that exists here is a dangling symlink: follow it
            except FileNotFoundError:
                return os.path.join(resolved, name)
            except OSError:
                pass
            finally:
                os.close(fd)
            return self._readlinks(current, original)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ContractError(f"{original!r}: too many symbolic links", code="unresolvable_path",
                                    pointer="/path", path=original) from None
            return self._readlinks(current, original)
        try:
            return self._fd_path(fd, original)
        except OSError:  # no /proc here
            return self._readlinks(current, original)
        finally:
            os.close(fd)

    @staticmethod
    def _fd_path(fd: int, original: str) -> str:
        """The path the kernel reports for ``fd``; ``ContractError`` when it is not one (a pipe,
        socket or anonymous inode reached through a ``/proc`` magic link, or a deleted file)."""
        found = os.readlink(f"/proc/self/fd/{fd}")
        if not found.startswith("/") or (found.endswith(" (deleted)") and os.fstat(fd).st_nlink == 0):
            raise ContractError(f"{original!r} leads to {found!r}, which is not a path", code="unresolvable_path",
                                pointer="/path", path=original)
        return found

    def _readlinks(self, current: str, original: str) -> str:
        """``current`` (absolute) with each component taken in order: ``.`` skipped, ``..`` leaving
        the path resolved so far, a symlink replaced by its target and the walk started again."""
        for _ in range(MAX_SYMLINK_HOPS):
            done = "/"
            parts = current.split("/")[1:]
            restart: str | None = None
            for index, part in enumerate(parts):
                if part in ("", "."):
                    continue
                if part == "..":
                    done = os.path.dirname(done)
                    continue
                candidate = os.path.join(done, part)
                try:
                    if not stat.S_ISLNK(os.lstat(candidate).st_mode):
                        done = candidate
                        continue
                    target = os.readlink(candidate)
                except OSError:  # missing or unreachable: the rest is taken as written
                    return os.path.normpath(os.path.join(candidate, *parts[index + 1:]))
                if (done == "/proc" or done.startswith("/proc/")) and (":" in target
                                                                        or target.endswith(" (deleted)")):
                    raise ContractError(f"{original!r} leads through {candidate} to {target!r}, which is not a "
                                        "path", code="unresolvable_path", pointer="/path", path=original)
                restart = os.path.join(done, target, *parts[index + 1:])
                break
            if restart is None:
                return done
            current = restart
        raise ContractError(f"{original!r}: too many symbolic links", code="unresolvable_path", pointer="/path",
                            path=original)

    # -- safe opening ------------------------------------------------------------

    @contextmanager
    def open_dir(self, path: str, *, write: bool = False, create: bool = False) -> Iterator[tuple[int, Resolved]]:
        """A directory fd for ``path`` opened without following symlinks out of the roots."""
        fd, resolved, _ = self._walk(path, write=write, create_parents=create, final_dir=True)
        try:
            yield fd, resolved
        finally:
            os.close(fd)

    @contextmanager
    def open_parent(self, path: str, *, write: bool, create: bool = False) -> Iterator[tuple[int, str, Resolved]]:
        """The fd of ``path``'s parent directory, and the final name (not opened). With ``create``, missing
        parents are made; when the call then fails (the walk or the body: a full disk), the ones it made
        are removed again if still empty (found by attack: a ``write_file`` of ``a/b/f`` that failed
        with ``ENOSPC`` left ``a/b`` behind)."""
        made: list[tuple[int, str]] = []
        try:
            fd, resolved, name = self._walk(path, write=write, create_parents=create, final_dir=False, made=made)
            try:
                yield fd, name, resolved
            finally:
                os.close(fd)
        except BaseException:
            for parent, part in reversed(made):
                try:
                    os.rmdir(part, dir_fd=parent)  # never follows a symlink; refuses a non-empty directory
                except OSError:
                    pass
            raise
        finally:
            for parent, _ in made:
                os.close(parent)

    def open_file(self, path: str) -> tuple[int, os.stat_result, Resolved]:
        """Open a regular file for reading; refuses symlinks out of the roots and special files."""
        original = path
        for _ in range(MAX_SYMLINK_HOPS):
            with self.open_parent(path, write=False) as (dir_fd, name, resolved):
                if not name:
                    raise ExecutionError(f"{path!r} is a directory", code="is_a_directory", path=path)
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # the final component is a symlink
                        path = self._follow(dir_fd, name, resolved, write=False, original=original)
                        continue
                    if exc.errno == errno.ENXIO:  # a socket (or a FIFO-like node) that cannot be opened
                        raise _deny(f"{path!r} is not a regular file (FIFO, socket or device)", "special_file",
                                    path) from None
                    raise os_error(exc, path) from None
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    os.close(fd)
                    if stat.S_ISDIR(st.st_mode):
                        raise ExecutionError(f"{path!r} is a directory", code="is_a_directory", path=path)
                    raise _deny(f"{path!r} is not a regular file (FIFO, socket or device)", "special_file", path)
                if names_a_directory(original):
                    os.close(fd)
                    raise not_a_directory(original)
                return fd, st, resolved
        raise _deny(f"{path!r}: too many symbolic links", "symlink_loop", path)

    def _follow(self, dir_fd: int, name: str, resolved: Resolved, *, write: bool, rest: tuple[str, ...] = (),
                original: str) -> str:
        """Resolve a symlink met during a walk of ``original`` (``rest``: the components after it); the
        target must be inside a root, and the path it leads to must not be protected."""
        target = _readlink_now(dir_fd, name, original)
        base = os.path.dirname(resolved.path) if resolved.parts else resolved.root
        absolute = os.path.normpath(os.path.join(base, target))
        leads_to = os.path.join(absolute, *rest)
        entry = self.protects(leads_to)
        if entry is not None:
            raise _protected(original, leads_to, entry)
        roots = self.write_roots if write else self.read_roots
        if not any(self._inside(absolute, r) is not None for r in roots):
            raise _deny(f"{resolved.path!r} is a symbolic link to {absolute!r}, outside the allowed roots",
                        "symlink_escape", resolved.path)
        return absolute

    def _walk(self, path: str, *, write: bool, create_parents: bool, final_dir: bool,
              made: list[tuple[int, str]] | None = None) -> tuple[int, Resolved, str]:
        """Open the directories of ``path`` one by one with O_NOFOLLOW; restart on in-root symlinks.
        Each directory made (``create_parents``) is appended to ``made`` as (a descriptor of its parent,
        its name); the caller closes those descriptors."""
        current = path
        for _ in range(MAX_SYMLINK_HOPS):
            absolute = self.normalize(current)
            # Checked before the roots and before anything is opened or created; the pass that
            # returns walked exactly this path with O_NOFOLLOW, so it is the resolved path in use.
            entry = self.protects(absolute)
            if entry is not None:
                raise _protected(path, absolute, entry)
            resolved = self._locate(absolute, self.write_roots if write else self.read_roots, current, write)
            parts = resolved.parts if final_dir else resolved.parts[:-1]
            fd = self._open_root(resolved.root, path)
            restart: str | None = None
            try:
                for index, part in enumerate(parts):
                    try:
                        next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=fd)
                    except FileNotFoundError:
                        if not create_parents:
                            raise
                        if made is not None and len(made) >= MAX_MADE_DIRS:
                            raise ContractError(f"{path!r} would need more than {MAX_MADE_DIRS} new directories; "
                                                "make fewer levels at once", code="invalid_path", pointer="/path",
                                                path=path, rule="too_many_new_directories") from None
                        os.mkdir(part, 0o777, dir_fd=fd)
                        if made is not None:
                            made.append((os.dup(fd), part))
                        next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=fd)
                    except OSError as exc:
                        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(fd, part):
                            partial = Resolved(resolved.root, resolved.parts[: index + 1])
                            rest = resolved.parts[index + 1:]
                            target = self._follow(fd, part, partial, write=write, rest=rest, original=path)
                            restart = os.path.join(target, *rest) if rest else target
                            break
                        raise
                    os.close(fd)
                    fd = next_fd
            except OSError as exc:
                os.close(fd)
                raise os_error(exc, path) from None
            except BaseException:
                os.close(fd)
                raise
            if restart is None:
                name = "" if final_dir or not resolved.parts else resolved.parts[-1]
                return fd, resolved, name
            os.close(fd)
            current = restart
        raise _deny(f"{path!r}: too many symbolic links", "symlink_loop", path)

    @staticmethod
    def _open_root(root: str, original: str) -> int:
        """A directory fd of ``root``, opened component by component from ``/`` with ``O_NOFOLLOW``.

        Roots are resolved at start, so their paths hold no symbolic link; one found now was put
        there since, and is refused (``symlink_escape``) instead of followed (found by attack: with
        ``allowed_write_paths = ["build"]``, a command that replaced ``build`` by ``build ->
        /root/.ssh`` while the host ran made ``write_file("build/authorized_keys")`` write there,
        and ``read_file`` read there, protected files included)."""
        parts = [part for part in root.split("/") if part]
        # Ancestors opened ``O_PATH`` (search permission is enough, as for a walk by path); the root itself
        # ``O_RDONLY``, to be listed and used as the walk's first directory.
        fd = os.open("/", (os.O_PATH if parts else os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
        done = "/"
        try:
            for index, part in enumerate(parts):
                flags = os.O_PATH if index < len(parts) - 1 else os.O_RDONLY
                done = os.path.join(done, part)
                try:
                    next_fd = os.open(part, flags | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(fd, part):
                        raise _deny(f"the allowed root {root!r} now leads through a symbolic link ({done} was "
                                    "replaced by one since the host started); refused", "symlink_escape",
                                    original) from None
                    raise
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_replace(self, dir_fd: int, name: str, path: str) -> os.stat_result | None:
        """Stat of an existing write target (None if absent); refuses links, specials, hard links."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_error(exc, path) from None
        if stat.S_ISLNK(st.st_mode):
            # Refused whatever the target; when the target is protected, say so (trying the target won't help).
            target = os.path.realpath(os.path.join(os.path.dirname(self.normalize(path)),
                                                    _readlink_now(dir_fd, name, path)))
            entry = self.protects(target)
            if entry is not None:
                raise _protected(path, target, entry)
            raise _deny(f"{path!r} is a symbolic link; write to its target path instead", "symlink_write", path)
        if stat.S_ISDIR(st.st_mode):  # not a "special file" refused by the rules (found by attack)
            raise ExecutionError(f"{path!r} is a directory", code="is_a_directory", path=path)
        if not stat.S_ISREG(st.st_mode):
            raise _deny(f"{path!r} is not a regular file", "special_file", path)
        if st.st_nlink > 1 and not self.allow_hardlinks:
            raise _deny(f"{path!r} has {st.st_nlink} hard links; refusing to write through a shared inode",
                        "hardlink", path)
        _check_writable(dir_fd, name, path, st)
        return st


def _check_writable(dir_fd: int, name: str, path: str, st: os.stat_result) -> None:
    """Refuse to replace a file the host's user may not write (``permission_denied``).

    A replacing rename needs only the directory's permission: a file its owner made read-only
    (``chmod a-w``) was replaced all the same, where a shell's ``>`` or an editor is refused (found
    by attack). Judged by opening it for writing, without truncating or writing, as the kernel
    judges the host's user (root may write; capabilities count): not ``os.access``, whose
    ``faccessat2`` older container seccomp profiles answer EPERM, which would refuse every replace
    (found by review). A running program (``ETXTBSY``) may still be replaced, as before."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except PermissionError:
        raise ExecutionError(f"{path!r}: the file is not writable (its permission bits: "
                             f"{stat.S_IMODE(st.st_mode):04o}); nothing was changed", code="permission_denied",
                             path=path, hint="make it writable first if it is meant to change (chmod u+w)") from None
    except OSError as exc:
        if exc.errno == errno.ETXTBSY:
            return
        raise os_error(exc, path) from None
    os.close(fd)


def names_a_directory(path: str) -> bool:
    """Whether ``path`` ends with ``/`` (or ``/.``), which only a directory may: the lexical
    normalization drops it, so a file tool must look at the path as given."""
    return isinstance(path, str) and path.endswith(("/", "/."))


def not_a_directory(path: str) -> ExecutionError:
    """The error for a file named with a trailing slash, as the kernel's ``ENOTDIR`` (found by attack:
    the slash was dropped, so ``read_file``/``edit_file`` of ``f.txt/`` used ``f.txt``, and
    ``write_file`` of ``new/`` created a regular file named ``new``)."""
    return ExecutionError(f"{path!r} ends with a slash, which names a directory; a file's path has none",
                          code="not_a_directory", path=path)


def _readlink_now(dir_fd: int, name: str, path: str) -> str:
    """The target of the symbolic link ``name`` just found in ``dir_fd``; ``ExecutionError``
    ``file_changed`` naming ``path`` when it is no longer a link (found by attack: a workspace
    that flipped a name between a file and a symlink failed about one call in 300 with
    ``os_error`` "Invalid argument", ``readlink``'s answer for a file, naming no rule)."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOENT):
            raise
        raise ExecutionError(f"{path!r} was replaced by another process while it was opened (a symbolic link "
                             "became a file, or went away); try again", code="file_changed", path=path) from None


def _is_symlink(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def os_error(exc: OSError, path: str) -> ToolError:
    """The typed error for an ``OSError`` met while resolving or using ``path``.

    A name the filesystem cannot hold (``ENAMETOOLONG``, e.g. a 300-byte component) is the caller's
    mistake: a ``ContractError``, like NUL bytes and over-long paths. ``ELOOP`` from an ``O_NOFOLLOW``
    open means a symlink appeared where none may be followed: refused like any symlink loop.
    A full disk or quota (``ENOSPC``, ``EDQUOT``) is ``no_space`` with a hint (found by attack: it was
    the generic ``os_error``); the write it stopped changed nothing.
    """
    if exc.errno == errno.ENAMETOOLONG:
        return ContractError(f"{path!r}: a path component is too long for the filesystem "
                             f"(ENAMETOOLONG: {exc.strerror})", code="invalid_path", pointer="/path", path=path)
    if exc.errno == errno.ELOOP:
        return _deny(f"{path!r}: too many symbolic links, or a symbolic link where none may be followed",
                     "symlink_loop", path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ExecutionError(f"{path!r}: {exc.strerror}; nothing was changed", code="no_space", path=path,
                              hint="the file system holding this path is full (or its quota is reached): free "
                                   "space there, then try again")
    code = {errno.ENOENT: "not_found", errno.ENOTDIR: "not_a_directory", errno.EACCES: "permission_denied",
            errno.EISDIR: "is_a_directory"}.get(exc.errno or 0, "os_error")
    return ExecutionError(f"{path!r}: {exc.strerror}", code=code, path=path)
