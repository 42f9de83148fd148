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
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Final, Literal

import attrs

from ...errors import ContractError, did_you_mean
from ...plugin_settings import Expect, settings_class
from ...spec import ToolSpec
from ..filesystem.arguments import PathArgument, path_arguments
from ..filesystem.paths import PathRules
from ..filesystem.patterns import PathPattern

PATHS_HINT: Final = 'e.g. paths = ["/etc/*", ".env*"]; see docs/policy.md (Path rules)'
#: Globs on a call's tool name, principal, role or environment.
Globs = Annotated[tuple[str, ...], Expect("a list of glob strings")]
Pointers = Annotated[Mapping[str, str], Expect("a table mapping JSON pointers ('/path') to glob strings",
                                              lambda table: all(key.startswith("/") for key in table))]
PathGlobs = Annotated[tuple[str, ...], Expect("a non-empty list of path globs",
                                              lambda globs: bool(globs) and "" not in globs, hint=PATHS_HINT)]


def _argument_patterns(rule: Rule) -> tuple[tuple[str, str, PathPattern], ...]:
    return tuple((pointer, glob, PathPattern(glob)) for pointer, glob in rule.arguments.items())


def _path_patterns(rule: Rule) -> tuple[PathPattern, ...] | None:
    return tuple(PathPattern(glob) for glob in rule.paths) if rule.paths is not None else None


@settings_class
@attrs.frozen
class Rule:
    """One ``[[plugins.policy.rules]]`` table, with its globs on paths compiled once."""

    action: Literal["allow", "deny"]
    name: str = ""  # "": named by its place in the list ("rule 3"), see ``PolicySettings``
    reason: str = ""
    tools: Globs = ("*",)
    principals: Globs | None = None
    roles: Globs | None = None
    environments: Globs | None = None
    arguments: Pointers = attrs.field(factory=dict)  # JSON pointer -> glob on the value
    paths: PathGlobs | None = None
    argument_patterns: tuple[tuple[str, str, PathPattern], ...] = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_argument_patterns, takes_self=True))
    path_patterns: tuple[PathPattern, ...] | None = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_path_patterns, takes_self=True))


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


#: What a glob on tool names may hold: what a tool name may (``spec.NAME_PATTERN``) and glob syntax.
_TOOL_GLOB_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:*?[]!")


def misnamed_tools(rules: Sequence[Rule], names: Sequence[str], model_names: Sequence[str]) \
        -> Iterator[tuple[Rule, str, str, bool]]:
    """Each glob of a rule's ``tools`` that matches none of ``names`` (the mounted tools) and looks
    like a mistaken spelling of one, as ``(rule, glob, why, certain)``. ``certain``: no tool could
    ever match it (a character no tool name holds: a Cyrillic letter, a trailing or zero-width
    space), or it differs from a mounted name only in case, or it is a mounted tool's model-facing
    name (``fs_write_file``: rules match canonical names). Not certain: it is close to a mounted
    name (a near miss), which may still be a tool mounted later (an MCP server that is not up,
    ``required = false``). A glob matching nothing and close to nothing is not reported. Found by
    attack: a deny rule on ``local::fs.write_file`` spelled with a Cyrillic ``i`` read as denying
    writes to whoever reviewed the file, matched no tool, and every write ran."""
    folded = [name.casefold() for name in names]
    for rule in rules:
        for glob in rule.tools:
            if any(fnmatch.fnmatchcase(name, glob) for name in names):
                continue
            odd = sorted({char for char in glob if char not in _TOOL_GLOB_CHARS})
            if odd:
                shown = ", ".join(f"{char!r} (U+{ord(char):04X})" for char in odd)
                yield rule, glob, f"holds {shown}, which no tool name can: it matches no tool", True
                continue
            low_glob = glob.casefold()
            case = next((name for name, low in zip(names, folded, strict=True) if fnmatch.fnmatchcase(low, low_glob)),
                        None)
            if case is not None:
                yield rule, glob, f"matches no tool (names are matched case-sensitively; did you mean {case!r}?)", True
                continue
            model = next((name for name, model_name in zip(names, model_names, strict=True)
                          if fnmatch.fnmatchcase(model_name, glob)), None)
            if model is not None:
                yield rule, glob, f"is a model-facing name; rules match the canonical name ({model!r})", True
                continue
            close = did_you_mean(glob, names)
            if close is not None:
                yield rule, glob, f"matches no mounted tool; {close}", False


def matches(rule: Rule, spec: ToolSpec, arguments: Any, principal: str, role: str | None, environment: str | None,
            paths: CallPaths | None) -> bool:
    """Whether ``rule`` applies to this call of ``spec`` (``paths``: the call's paths, None without an engine)."""
    if not (_any(rule.tools, spec.name) and _any(rule.principals, principal) and _any(rule.roles, role)
            and _any(rule.environments, environment)):
        return False
    deny = rule.action == "deny"
    found = paths.found if paths is not None and (rule.path_patterns is not None or rule.arguments) else []
    if rule.path_patterns is not None and (paths is None or not _paths_match(deny, rule.path_patterns, found, paths)):
        return False
    for pointer, pattern, path_pattern in rule.argument_patterns:
        at = [a for a in found if a.pointer == pointer or a.pointer.startswith(pointer + "/")]
        if at and paths is not None:
            if not _paths_match(deny, (path_pattern,), at, paths):
                return False
            continue
        present, value = _pointer(arguments, pointer)
        if not present or not fnmatch.fnmatchcase(str(value), pattern):
            return False
    return True
