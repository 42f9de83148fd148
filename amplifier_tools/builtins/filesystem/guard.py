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
from typing import Any, Final

from ...errors import ContractError
from ...hoststate import ProtectedPath
from .arguments import path_arguments
from .paths import PathRules

MAX_DEPTH: Final = 16


def _strings(value: Any, found: list[str], depth: int) -> list[str]:
    """Every string in ``value`` (to ``MAX_DEPTH``), appended to ``found``. A string or a number
    inside a container is taken in the container's loop, without a call of its own."""
    if isinstance(value, str):
        found.append(value)
    elif depth < MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        for item in value.values() if isinstance(value, dict) else value:
            if isinstance(item, str):
                found.append(item)
            elif isinstance(item, (dict, list, tuple)):
                _strings(item, found, depth + 1)
    return found


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
        self._pattern: re.Pattern[str] | None = None

    def _refresh(self) -> None:
        entries = list(self._protected)
        self._seen = len(entries)
        names = sorted({os.path.basename(e.path) for e in entries
                        if os.path.dirname(e.path) == self._working_dir and not os.path.isdir(e.path)})
        # One pattern, one search per string: a protected path anywhere in it (group "path"), or the
        # name of a protected file in the working directory as a word of its own (group "name").
        paths = "|".join(map(re.escape, sorted({e.path for e in entries}, key=len, reverse=True)))
        alternatives = [f"(?P<path>{paths})"] if paths else []
        if names:
            alternatives.append(rf"(?:^|[\s/'\"=<>|;&])(?P<name>{'|'.join(map(re.escape, names))})(?:$|[\s'\";&|)])")
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

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
        pattern = self._pattern
        if pattern is None:
            return None
        for text in _strings(arguments, [], 0):
            found = pattern.search(text)
            if found is not None:
                path = found.group("path") if found.group("path") is not None else \
                    os.path.join(working_dir, found.group("name"))
                return protected.protects(path)
        return None
