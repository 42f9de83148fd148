"""A best-effort guard for tools that have no path engine of their own.

The built-in filesystem tools resolve every path through ``PathRules`` and the bash sandbox hides
protected paths; a third-party tool (an Amplifier module's ``write_file``, an MCP server) has
neither, and would rewrite the host's config or audit log when asked. Before such a tool runs,
``ArgumentGuard.protected_argument`` looks through its arguments for a protected path: a value under a path-like
key (``path``, ``file_path``, ``dir``, ``cwd``, ``target`` ...) resolved against the working
directory, or a protected path (or the name of a protected file in the working directory) written
anywhere inside a string such as a shell command.

What it does not cover: it reads arguments, not what a tool does with them — a path built inside
the tool, an encoded or split path, a glob, or a command that computes one is not seen. It is
defense in depth in front of the real protections (state outside the working directory, the audit
writer's tamper detection); a third-party tool runs with the host's privileges.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any, Final

from ...hoststate import ProtectedPath, ProtectedPaths

PATH_KEYS: Final = re.compile(r"(path|file|dir|folder|cwd|target|dest|source|src|root|location)", re.I)
MAX_DEPTH: Final = 16


def _strings(value: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, str]]:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, str(k), depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v, key, depth + 1)


class ArgumentGuard:
    """Finds a protected path named in a call's arguments (``protected_argument``).

    What it compares with — the protected paths, and the names of protected files that lie
    directly in the working directory, as one pattern — is rebuilt only when the set of protected
    paths grows (plugins add theirs at mount), never per call.
    """

    def __init__(self, protected: ProtectedPaths, working_dir: str) -> None:
        self._protected = protected
        self._working_dir = working_dir
        self._seen = -1
        self._paths: tuple[str, ...] = ()
        self._names: re.Pattern[str] | None = None

    def _refresh(self) -> None:
        entries = list(self._protected)
        self._seen = len(entries)
        self._paths = tuple(entry.path for entry in entries)
        names = sorted({os.path.basename(e.path) for e in entries
                        if os.path.dirname(e.path) == self._working_dir and not os.path.isdir(e.path)})
        self._names = re.compile(rf"(^|[\s/'\"=<>|;&])({'|'.join(map(re.escape, names))})($|[\s'\";&|)])") \
            if names else None

    def protected_argument(self, arguments: Any) -> ProtectedPath | None:
        """The protected path the first offending argument value names; None when none does."""
        if self._seen != len(self._protected):
            self._refresh()
        protected, working_dir = self._protected, self._working_dir
        for key, text in _strings(arguments):
            if PATH_KEYS.search(key) and text and "\x00" not in text:
                entry = protected.protects(os.path.realpath(os.path.join(working_dir, os.path.expanduser(text))))
                if entry is not None:
                    return entry
            for path in self._paths:
                if path in text:
                    return protected.protects(path)
            found = self._names.search(text) if self._names is not None else None
            if found is not None:
                return protected.protects(os.path.join(working_dir, found.group(2)))
        return None
