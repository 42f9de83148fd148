"""Command rules: allow and deny patterns matched on the *parsed* command, failing closed.

The command line is read by tree-sitter's bash grammar (``shellparse.py``) into
simple commands ("parts"); wrappers are checked and unwrapped
(``wrappers.py``). A pattern without a space is a glob on the program's
basename (``rm``, ``python*``); a pattern with a space is a glob on the part,
program and arguments joined by single spaces (``git push*``), matched both as
written and with the global options of known multi-command tools removed
(``git -C dir --no-pager push`` is also read as ``git push``; see
``GLOBAL_OPTIONS``). Deny wins; with an allow list every part must match one.

Fail closed: when any rule exists, a command the parser cannot reduce to plain
commands with literal words (see ``shellparse``) is denied — under an allow
list because it cannot be checked, under a deny list because it is treated as
matching every deny rule. With no rules nothing is parsed, and the parser (with
tree-sitter and its grammar) is imported at the first check, not with this module.

This is advice, never a boundary: a program that is allowed, or not named by a
deny rule, can do what a denied one does (``find -delete``, ``python -c``, a
script file, git aliases). The sandbox is the boundary.
"""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any, Final

import attrs

from ...errors import PolicyError

if TYPE_CHECKING:
    from .shellparse import Parsed, Part, parse_command

__all__ = ["GLOBAL_OPTIONS", "CommandRules", "Parsed", "Part", "parse_command", "parts_of"]

#: Directories whose programs an allow rule names by basename; ``./ls`` or ``/tmp/ls`` is not ``ls``.
SYSTEM_DIRS: Final = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin", "/usr/local/sbin"})


@attrs.frozen
class GlobalOptions:
    """Options a multi-command tool takes before its subcommand.

    ``with_arg``: options whose value is the next word (``-C dir``); ``--x=v`` and other options
    are skipped as one word. ``config``: options that change what the tool runs (``git -c
    alias.x=!cmd``); a part using one matches allow rules only as written.
    """

    with_arg: frozenset[str]
    config: frozenset[str] = frozenset()


GLOBAL_OPTIONS: Final[dict[str, GlobalOptions]] = {
    "git": GlobalOptions(frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env",
                                    "--super-prefix", "--exec-path"}),
                         frozenset({"-c", "--config-env", "--exec-path"})),
    "docker": GlobalOptions(frozenset({"--config", "-c", "--context", "-H", "--host", "-l", "--log-level",
                                       "--tlscacert", "--tlscert", "--tlskey"}), frozenset({"--config"})),
    "podman": GlobalOptions(frozenset({"--connection", "-c", "--url", "--root", "--runroot", "--log-level",
                                       "--storage-driver", "--cgroup-manager", "--identity", "--module"}),
                            frozenset({"--module"})),
}
_HINT_DENY: Final = "[plugins.bash] deny"
_HINT_ALLOW: Final = "[plugins.bash] allow"


def canonical(part: Part) -> tuple[Part, bool]:
    """``part`` with the global options of a known tool removed, and whether one of them changes config."""
    spec = GLOBAL_OPTIONS.get(part.program)
    if spec is None:
        return part, False
    args = part.args
    index, config = 0, False
    while index < len(args) and args[index].startswith("-"):
        option = args[index].split("=", 1)[0]
        config = config or option in spec.config or any(
            args[index].startswith(c) and len(c) == 2 and len(args[index]) > 2 for c in spec.config)
        if args[index] == "--":
            index += 1
            break
        index += 2 if option == args[index] and option in spec.with_arg else 1
    if index == 0:
        return part, False
    return type(part)(part.program, args[index:], part.path), config


@attrs.frozen
class Pattern:
    """One allow or deny pattern, compiled once.

    ``whole``: the pattern has a space and is matched on program and arguments; ``by_path``: its
    program word has a ``/`` and is matched on the program as written, not its basename.
    """

    text: str
    regex: re.Pattern[str]
    whole: bool
    by_path: bool

    @classmethod
    def compile(cls, text: str) -> Pattern:
        text = text.strip()
        return cls(text, re.compile(fnmatch.translate(text)), " " in text, "/" in text.split(" ", 1)[0])

    def matches(self, part: Part, *, allow: bool) -> bool:
        path = part.path or part.program
        # Under an allow list a program named by a path outside the system directories is that path
        # (``./ls`` is a script, not ls); a deny rule on ``ls`` catches every ``…/ls``.
        qualified = allow and "/" in part.path and path.rsplit("/", 1)[0] not in SYSTEM_DIRS
        program = path if qualified or self.by_path else part.program
        if not self.whole:
            return self.regex.match(program) is not None
        if self.regex.match(" ".join((program, *part.args))) is not None:
            return True
        canon, config = canonical(part)
        return canon is not part and not (allow and config) and self.regex.match(
            " ".join((program, *canon.args))) is not None


@attrs.frozen
class CommandRules:
    """``allow`` and ``deny`` patterns; ``check`` raises ``PolicyError`` (``command_denied``) for a denied command."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    _allow: tuple[Pattern, ...] = attrs.field(init=False, repr=False, eq=False)
    _deny: tuple[Pattern, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_allow", tuple(Pattern.compile(p) for p in self.allow))
        object.__setattr__(self, "_deny", tuple(Pattern.compile(p) for p in self.deny))

    @property
    def active(self) -> bool:
        return bool(self.allow or self.deny)

    def check(self, command: str) -> Parsed:
        """The parsed command when every part passes; ``PolicyError`` naming the rule and part otherwise."""
        from .shellparse import Parsed, parse_command

        if not self.active:
            return Parsed(())
        parsed = parse_command(command)
        for part in parsed.parts:
            for pattern in self._deny:
                if pattern.matches(part, allow=False):
                    raise PolicyError(
                        f"command denied by deny rule {pattern.text!r}: {str(part)!r} (command word "
                        f"{part.program!r}); hint: the rule is in {_HINT_DENY}", code="command_denied",
                        rule=f"deny:{pattern.text}", part=str(part))
        if parsed.error is not None:
            raise self._closed("unparsable", f"the command is not valid bash to the parser ({parsed.error})",
                               command)
        for unreadable in parsed.unreadable:
            raise self._closed("unreadable", unreadable.reason, unreadable.text)
        if self.allow:
            for part in parsed.parts:
                if not any(pattern.matches(part, allow=True) for pattern in self._allow):
                    where = f"program {part.path!r}" if part.path else f"command word {part.program!r}"
                    raise PolicyError(f"command denied: {str(part)!r} ({where}) matches no allow rule; hint: add a "
                                      f"pattern to {_HINT_ALLOW}", code="command_denied", rule="not_allowed",
                                      part=str(part))
        return parsed

    def _closed(self, rule: str, reason: str, text: str) -> PolicyError:
        if self.allow:
            why = f"an allow list is configured ({_HINT_ALLOW}) and this cannot be checked against it"
        else:
            why = (f"what cannot be read is treated as matching every deny rule ({_HINT_DENY} = "
                   f"{list(self.deny)!r})")
        return PolicyError(f"command denied: {reason}, in {text!r}; {why}. Hint: rewrite the command with "
                           "literal program names, or change the rules", code="command_denied", rule=rule,
                           part=text, reason=reason)


def parts_of(command: str) -> list[str]:
    """The parts of ``command`` as strings (for docs and tests)."""
    from .shellparse import parse_command

    return [str(p) for p in parse_command(command).parts]


def __getattr__(name: str) -> Any:
    """The parser's names, re-exported, imported on first use."""
    if name in ("Parsed", "Part", "parse_command"):
        from . import shellparse

        return getattr(shellparse, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
