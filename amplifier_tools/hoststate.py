"""The host's own state, out of the tools' reach: the state directory, protected paths, safe opens.

Tools act for a model that may be hostile. Everything the host writes for itself
(the audit log and its anchor, locks, bash spill files, the policy store) lives
under ``state_dir``, outside the working directory by default, and is opened
here so that a symlink, FIFO, device or foreign-owned file swapped in by a tool
is refused instead of followed:

- ``default_state_dir(working_dir)``: ``$XDG_STATE_HOME/amplifier-tools/workspaces/<16 hex>``
  (``~/.local/state`` when ``XDG_STATE_HOME`` is unset), one per working directory.
- ``ensure_state_dir(path)``: creates it ``0700``; refuses a symlink, a non-directory
  or a directory owned by someone else.
- ``open_host_file(path, flags)``: ``O_NOFOLLOW`` relative to a directory fd that was
  itself opened without following the last component; the result must be a regular
  file owned by this user with no other hard link. Anything else raises ``HostFileError`` naming the path and
  what was found there.
- ``ProtectedPaths``: the paths tools must never read or write, published to plugins as
  the ``session.protected_paths`` capability.

Limits: an intermediate directory of a configured path (above ``state_dir``) is
resolved by the kernel as usual; the protection is for the last components, the
ones a tool could swap. Files are checked when opened: a file renamed away after
the open is written through the open descriptor (the writer checks it still sits
at its path where that matters, e.g. the audit anchor).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import attrs

STATE_DIR_MODE = 0o700


class HostFileError(OSError):
    """A host file or directory is not what the host created: a symlink, FIFO, device, directory,
    or owned by another user. The message names the path and what was found."""


def default_state_dir(working_dir: str | os.PathLike[str]) -> Path:
    """``$XDG_STATE_HOME/amplifier-tools/workspaces/<first 16 hex of sha256(working_dir)>``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    digest = hashlib.sha256(os.fspath(working_dir).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return Path(base) / "amplifier-tools" / "workspaces" / digest


def _describe(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def ensure_state_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 and check it; the absolute path.

    Raises ``HostFileError`` if the last component is a symlink or not a directory, or if it
    belongs to another user; ``OSError`` if it cannot be created.
    """
    target = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    target.parent.mkdir(parents=True, exist_ok=True, mode=STATE_DIR_MODE)
    created = True
    try:
        os.mkdir(target, STATE_DIR_MODE)
    except FileExistsError:
        created = False
    info = os.lstat(target)
    if not stat.S_ISDIR(info.st_mode):
        raise HostFileError(errno.ENOTDIR, f"state directory {target} is {_describe(info.st_mode)}, "
                                           "not a directory the host created", str(target))
    if info.st_uid != os.geteuid():
        raise HostFileError(errno.EPERM, f"state directory {target} belongs to uid {info.st_uid}, "
                                         f"not to this user ({os.geteuid()})", str(target))
    if created and stat.S_IMODE(info.st_mode) & 0o077:  # a umask cannot widen 0700, but be exact
        os.chmod(target, STATE_DIR_MODE)
    elif not created and stat.S_IMODE(info.st_mode) & 0o022:
        # Never chmod a directory we did not create (state_dir = "/etc" must not make /etc private);
        # one that others may write is no place for host state.
        raise HostFileError(errno.EPERM, f"state directory {target} is writable by group or others "
                                         f"(mode {stat.S_IMODE(info.st_mode):o}); use a directory only this "
                                         "user can write (chmod go-w)", str(target))
    return target


def open_host_dir(path: str | os.PathLike[str]) -> int:
    """A directory fd for ``path``, the last component not followed; owned by this user."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            found = _describe(os.lstat(name).st_mode)
            raise HostFileError(exc.errno, f"host directory {name} is {found}, not a directory", name) from None
        raise
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        os.close(fd)
        raise HostFileError(errno.EPERM, f"host directory {name} belongs to uid {info.st_uid}, not to this user",
                            name)
    return fd


def open_host_file(path: str | os.PathLike[str], flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
    """Open a file the host keeps for itself; refuse anything it did not create.

    ``flags`` are ``os.open`` flags (``O_NOFOLLOW``, ``O_CLOEXEC`` and ``O_NONBLOCK`` for the open
    itself are added: a FIFO never blocks the open). Without ``dir_fd`` the parent directory is
    opened with ``open_host_dir`` first. The file must be a regular file owned by this user.
    """
    name = os.fspath(path)
    own_dir = dir_fd is None
    parent_fd = open_host_dir(os.path.dirname(name) or ".") if dir_fd is None else dir_fd
    leaf = os.path.basename(name) if own_dir else name
    try:
        try:
            fd = os.open(leaf, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):
                try:
                    found = _describe(os.lstat(leaf, dir_fd=parent_fd).st_mode)
                except OSError:
                    found = "not a regular file"
                raise HostFileError(exc.errno, f"host file {name} is {found}; the host opens only regular "
                                               "files it created (was it replaced?)", name) from None
            raise
        info = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(info.st_mode):
            problem = f"is {_describe(info.st_mode)}"
        elif info.st_uid != os.geteuid():
            problem = f"belongs to uid {info.st_uid}, not to this user ({os.geteuid()})"
        elif info.st_nlink > 1:  # another name may lie anywhere (a shell profile): never write through it
            problem = f"has {info.st_nlink} hard links"
        if problem is not None:
            os.close(fd)
            raise HostFileError(errno.EPERM, f"host file {name} {problem}; the host opens only regular files "
                                             "it created (was it replaced?)", name)
        if not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
        return fd
    finally:
        if own_dir:
            os.close(parent_fd)


@attrs.frozen
class ProtectedPath:
    """One path tools must not touch, and why (the config key or role that names it)."""

    path: str
    reason: str
    key: str | None = None
    #: The name a path was given by, through a symlink (the entry before it holds the resolved path);
    #: a mount cannot be placed on a symlink, so sandboxes mask the resolved entry only.
    alias: bool = False


class ProtectedPaths:
    """The host's protected paths: a file or directory and everything below it.

    ``protects(path)`` answers for an absolute, already resolved path (the filesystem plugin's
    path engine resolves before it asks). Each path is stored resolved as far as it exists and,
    when that differs, also as given (a config named through a symlink protects both names).
    """

    def __init__(self) -> None:
        self._entries: list[ProtectedPath] = []
        #: Every entry's path: a path that starts with none of them is covered by none (one C call).
        self._starts: tuple[str, ...] = ()

    def add(self, path: str | os.PathLike[str], reason: str, *, key: str | None = None) -> None:
        """Protect ``path`` (resolved through existing symlinks in its parents) and what lies below it."""
        given = os.path.abspath(os.fspath(path))
        resolved = os.path.realpath(given)
        # The resolved path, and the name it was given by when that goes through a symlink.
        for candidate, alias in ((resolved, False), (given, True)) if given != resolved else ((resolved, False),):
            if not any(entry.path == candidate for entry in self._entries):
                self._entries.append(ProtectedPath(candidate, reason, key, alias))
        self._starts = tuple(entry.path for entry in self._entries)

    def protects(self, path: str | os.PathLike[str]) -> ProtectedPath | None:
        """The entry that covers ``path`` (equal to it or an ancestor of it), or None."""
        candidate = os.fspath(path)
        if not candidate.startswith(self._starts):  # the common answer, without a loop
            return None
        for entry in self._entries:
            if candidate == entry.path or candidate.startswith(entry.path.rstrip(os.sep) + os.sep):
                return entry
        return None

    def inside(self, root: str | os.PathLike[str]) -> list[ProtectedPath]:
        """Entries that lie within ``root`` (or are ``root`` itself)."""
        base = os.path.realpath(os.fspath(root)).rstrip(os.sep) + os.sep
        return [entry for entry in self._entries if (entry.path + os.sep).startswith(base)]

    def __iter__(self) -> Iterator[ProtectedPath]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
