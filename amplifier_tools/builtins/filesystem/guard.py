"""A best-effort guard for tools that have no path engine of their own.

The built-in filesystem tools resolve every path through ``PathRules`` and the bash sandbox hides
protected paths; a third-party tool (an Amplifier module's ``write_file``, an MCP server) has
neither, and would rewrite the host's config or audit log when asked. Before such a tool runs,
``ArgumentGuard.protected_argument`` looks through its arguments for a protected path: every path
argument the policy's path rules would see (``arguments.path_arguments``: by schema ``format`` and
by name — ``path``, ``file_path``, ``dir``, ``cwd``, ``target`` ...), resolved by the path engine
(``PathRules.resolve_real``: ``..``, symlinks, ``/proc`` magic links), or a protected path (or the
name of a protected file in the working directory) written anywhere inside a string such as a
shell command.

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

from ...errors import ContractError
from ...hoststate import ProtectedPath
from .arguments import path_arguments
from .paths import PathRules

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

    def __init__(self, rules: PathRules) -> None:
        self._rules = rules
        self._protected = rules.protected
        self._working_dir = rules.working_dir
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

    def protected_argument(self, tool: str, schema: Any, arguments: Any) -> ProtectedPath | None:
        """The protected path the first offending argument value names; None when none does."""
        if self._seen != len(self._protected):
            self._refresh()
        protected, working_dir = self._protected, self._working_dir
        for argument in path_arguments(tool, schema, arguments):
            try:
                spellings = self._rules.resolve_real(argument.value)
            except ContractError:
                continue  # not a path at all (NUL byte, a pipe): the text scan below still runs
            for resolved in spellings:
                entry = protected.protects(resolved)
                if entry is not None:
                    return entry
        for _, text in _strings(arguments):
            for path in self._paths:
                if path in text:
                    return protected.protects(path)
            found = self._names.search(text) if self._names is not None else None
            if found is not None:
                return protected.protects(os.path.join(working_dir, found.group(2)))
        return None
