"""Declarative allow/deny rules from config.

Any matching ``deny`` rule denies the call, wherever it stands in the list
(the first matching deny is the one reported); ``allow`` rules never cancel a
deny — they only matter under ``default_action = "deny"``, where a call no
allow rule matches is refused.

A rule matches a call when every given selector matches: ``tools``,
``principals``, ``roles``, ``environments`` (lists of globs), ``arguments``
(JSON pointer -> glob on the value) and ``paths`` (globs on every path argument).

Path arguments are decided by the filesystem plugin's path engine, the same one
behind its tools' ``denied_paths``: which arguments are paths is
``filesystem.arguments.path_arguments`` (known for the filesystem tools, read
from the schema and the argument names for imported tools), each is resolved
with ``PathRules.resolve_real`` (``..``, symlinks, ``/proc/self/root``...) and
matched with ``PathPattern`` against the working directory. A path argument
that lists or searches below it (a *walk*) is denied by a rule that may match
anything below it. An unusable path (NUL byte, a magic link to a pipe) matches
every deny rule on paths and no allow rule. docs/policy.md states the semantics.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any, Final

import attrs

from ...errors import ConfigError, ContractError
from ...spec import ToolSpec
from ..filesystem.arguments import PathArgument, path_arguments
from ..filesystem.paths import PathRules
from ..filesystem.patterns import PathPattern

SELECTORS: Final = ("tools", "principals", "roles", "environments")
RULE_KEYS: Final = frozenset({"name", "action", "reason", "arguments", "paths", *SELECTORS})


@attrs.frozen
class Rule:
    name: str
    action: str
    reason: str
    tools: tuple[str, ...] = ("*",)
    principals: tuple[str, ...] | None = None
    roles: tuple[str, ...] | None = None
    environments: tuple[str, ...] | None = None
    arguments: tuple[tuple[str, str, PathPattern], ...] = ()  # pointer, glob, the glob as a path pattern
    paths: tuple[PathPattern, ...] | None = None


def parse_rules(raw: Any, key: str) -> list[Rule]:
    """Rules from config; ``ConfigError`` naming ``key[index].field``."""
    if not isinstance(raw, list):
        raise ConfigError("must be a list of rule tables", key=key)
    rules = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(item, dict):
            raise ConfigError("must be a table", key=where)
        unknown = set(item) - RULE_KEYS
        if unknown:
            raise ConfigError(f"unknown key {sorted(unknown)[0]!r} (expected {sorted(RULE_KEYS)})",
                              key=f"{where}.{sorted(unknown)[0]}", expected=RULE_KEYS)
        if item.get("action") not in ("allow", "deny"):
            raise ConfigError("action must be 'allow' or 'deny'", key=f"{where}.action")
        fields: dict[str, Any] = {}
        for selector in SELECTORS:
            if selector in item:
                value = item[selector]
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ConfigError("must be a list of glob strings", key=f"{where}.{selector}")
                fields[selector] = tuple(value)
        arguments = item.get("arguments", {})
        if not isinstance(arguments, dict) or not all(
                isinstance(k, str) and k.startswith("/") and isinstance(v, str) for k, v in arguments.items()):
            raise ConfigError("must map JSON pointers ('/path') to glob strings", key=f"{where}.arguments")
        paths = item.get("paths")
        if paths is not None and (not isinstance(paths, list) or not paths
                                  or not all(isinstance(v, str) and v for v in paths)):
            raise ConfigError("must be a non-empty list of path globs", key=f"{where}.paths",
                              hint='e.g. paths = ["/etc/*", ".env*"]; see docs/policy.md (Path rules)')
        name = str(item.get("name", f"rule {index + 1}"))
        rules.append(Rule(name=name, action=item["action"], reason=str(item.get("reason", "")),
                          arguments=tuple((k, v, PathPattern(v)) for k, v in arguments.items()),
                          paths=tuple(PathPattern(p) for p in paths) if paths is not None else None, **fields))
    return rules


def _any(patterns: tuple[str, ...] | None, value: str | None) -> bool:
    if patterns is None:
        return True
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _pointer(data: Any, pointer: str) -> tuple[bool, Any]:
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return False, None
    return True, data


def path_engine(coordinator: Any, fallback: dict[str, PathRules]) -> PathRules | None:
    """The path engine path rules resolve with: the filesystem plugin's (capability ``fs.path_rules``),
    else one for the host's working directory, kept in ``fallback`` (the policy plugin's own) —
    resolution only: no roots or denied rules apply. Looked up per call: the filesystem plugin may
    mount after the policy plugin."""
    if coordinator is None:
        return None
    engine = coordinator.get_capability("fs.path_rules")
    if isinstance(engine, PathRules):
        return engine
    working_dir = coordinator.get_capability("session.working_dir")
    if not isinstance(working_dir, str):
        return None
    if working_dir not in fallback:
        fallback[working_dir] = PathRules(working_dir, read_roots=[working_dir], write_roots=[working_dir])
    return fallback[working_dir]


class CallPaths:
    """The path arguments of one call and where they lead, found and resolved once and shared by
    every rule checked against the call (a policy with several path rules resolves each path once)."""

    def __init__(self, engine: PathRules, spec: ToolSpec, arguments: Any) -> None:
        self.engine = engine
        self._spec = spec
        self._arguments = arguments
        self._found: list[PathArgument] | None = None
        self._resolved: dict[str, tuple[str, ...] | None] = {}

    @property
    def found(self) -> list[PathArgument]:
        if self._found is None:
            self._found = path_arguments(self._spec.name, self._spec.input_schema, self._arguments)
        return self._found

    def resolve(self, value: Any) -> tuple[str, ...] | None:
        """The paths ``value`` may lead to (``PathRules.resolve_real``); None when it is unusable."""
        if not isinstance(value, str):
            return None
        if value not in self._resolved:
            try:
                self._resolved[value] = self.engine.resolve_real(value)
            except ContractError:
                self._resolved[value] = None
        return self._resolved[value]


def _paths_match(deny: bool, patterns: Sequence[PathPattern], found: list[PathArgument], paths: CallPaths) -> bool:
    """A deny rule matches when any spelling of any path matches (for a walk: or may match below it)
    or a path is unusable; an allow rule when every spelling of every path is usable and matched."""
    if not found:
        return False
    base = paths.engine.working_dir
    for argument in found:
        spellings = paths.resolve(argument.value)
        if spellings is None:
            return deny  # fail closed: an unusable path is caught by a deny rule and never earns an allow
        for resolved in spellings:
            hit = any(p.matches(resolved, base) or (deny and argument.walk and p.may_match_below(resolved, base))
                      for p in patterns)
            if hit == deny:
                return deny
    return not deny


def matches(rule: Rule, spec: ToolSpec, arguments: Any, principal: str, role: str | None, environment: str | None,
            paths: CallPaths | None) -> bool:
    """Whether ``rule`` applies to this call of ``spec`` (``paths``: the call's paths, None without an engine)."""
    if not (_any(rule.tools, spec.name) and _any(rule.principals, principal) and _any(rule.roles, role)
            and _any(rule.environments, environment)):
        return False
    deny = rule.action == "deny"
    found = paths.found if paths is not None and (rule.paths is not None or rule.arguments) else []
    if rule.paths is not None and (paths is None or not _paths_match(deny, rule.paths, found, paths)):
        return False
    for pointer, pattern, path_pattern in rule.arguments:
        at = [a for a in found if a.pointer == pointer or a.pointer.startswith(pointer + "/")]
        if at and paths is not None:
            if not _paths_match(deny, (path_pattern,), at, paths):
                return False
            continue
        present, value = _pointer(arguments, pointer)
        if not present or not fnmatch.fnmatchcase(str(value), pattern):
            return False
    return True
