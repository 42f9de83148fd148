"""A best-effort guard for tools that have no path engine of their own.

The built-in filesystem tools resolve every path through ``PathRules`` and the bash sandbox hides
protected paths; a third-party tool (an Amplifier module's ``write_file``, an MCP server) has
neither, and would rewrite the host's config or audit log when asked. Before such a tool runs,
``protected_argument`` looks through its arguments for a protected path: a value under a path-like
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


def protected_argument(arguments: Any, protected: ProtectedPaths, working_dir: str) -> ProtectedPath | None:
    """The protected path the first offending argument value names; None when none does."""
    entries = list(protected)
    names = {os.path.basename(e.path) for e in entries
             if os.path.dirname(e.path) == working_dir and not os.path.isdir(e.path)}
    for key, text in _strings(arguments):
        if PATH_KEYS.search(key) and text and "\x00" not in text:
            candidate = os.path.realpath(os.path.join(working_dir, os.path.expanduser(text)))
            entry = protected.protects(candidate)
            if entry is not None:
                return entry
        for entry in entries:
            if entry.path in text:
                return entry
        for name in names:
            if re.search(rf"(^|[\s/'\"=<>|;&]){re.escape(name)}($|[\s'\";&|)])", text):
                entry_path = os.path.join(working_dir, name)
                found = protected.protects(entry_path)
                if found is not None:
                    return found
    return None
