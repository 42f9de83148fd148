"""Command rules: allow and deny patterns matched on the *parsed* command.

A command line is split into its simple commands ("parts") the way bash would
run them: on ``;``, ``&&``, ``||``, ``|``, ``&``, newlines, subshells and
groups, command substitutions (``$( )``, backticks, ``<( )``) and the strings
given to ``bash -c``/``sh -c``/``eval``/``env -S``/``find -exec``. Wrappers
(``env VAR=x``, ``nice``, ``timeout``, ``command``, ``exec``, ``nohup``,
``sudo``, ``xargs``, ``time`` ...) are stripped and the program is reduced to
its basename, so ``/usr/bin/env -i nice -n5 \\rm -r -f /`` is the part
``rm -r -f /``.

This is advice, never a boundary: a program name that is only known at run
time (``$(echo rm)``, ``$X``, globs, brace expansion), a script file, an
interpreter (``python -c``), an alias or a function defined at run time can
always do what a deny rule names. Such commands are reported as *dynamic*;
they are denied when any allow rule exists (an allowlist can only be honoured
for commands it can read), and pass a deny-only rule set. The sandbox is the
boundary.

Must never execute anything, and never raise on any input: an unreadable
command is a ``Parsed`` with ``error`` set.
"""

from __future__ import annotations

import codecs
import fnmatch
import os
import re
from collections.abc import Sequence
from typing import Final

import attrs

from ...errors import PolicyError

MAX_DEPTH: Final = 8
SHELLS: Final = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "busybox-sh"})
#: Reserved words that open or continue a compound command; the next word starts a command.
OPENERS: Final = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "fi", "done",
                            "esac"})
#: Wrapper programs: name -> options that take a separate argument.
WRAPPERS: Final[dict[str, frozenset[str]]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "nohup": frozenset(),
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "--user", "--group"}),
    "doas": frozenset({"-u", "-C"}),
    "xargs": frozenset({"-I", "-n", "-P", "-d", "-E", "-L", "-s", "-a", "--max-args", "--max-procs",
                        "--delimiter", "--arg-file", "--replace"}),
    "time": frozenset({"-f", "-o", "--format", "--output"}),
    "setsid": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "ionice": frozenset({"-c", "-n", "-p", "--class", "--classdata"}),
    "chrt": frozenset(),
    "taskset": frozenset(),
    "busybox": frozenset(),
    "unbuffer": frozenset(),
}
#: Wrappers whose first operand is not the program (timeout DURATION, chrt PRIO, taskset MASK).
WRAPPER_OPERANDS: Final = {"timeout": 1, "chrt": 1, "taskset": 1}
_ASSIGNMENT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_FD_REDIRECT: Final = re.compile(r"\d+(?=[<>])")
_SUBSTITUTION: Final = re.compile(r"\$\(([^()]*)\)|`([^`]*)`")
_BRACKET: Final = re.compile(r"\[!?\]?[^\s\]]*\]")
_BRACE_EXPANSION: Final = re.compile(r"\{[^\s{}]*(,|\.\.)[^\s{}]*\}")


@attrs.frozen
class Word:
    """One shell word after quote removal; ``dynamic`` when bash would expand it at run time."""

    text: str
    dynamic: bool = False


@attrs.frozen
class Part:
    """One simple command: the program's basename and its arguments (wrappers stripped)."""

    program: str
    args: tuple[str, ...] = ()
    dynamic: bool = False  # the program name is only known at run time

    def __str__(self) -> str:
        return " ".join((self.program, *self.args))


@attrs.frozen
class Parsed:
    """Every part of a command line, or the reason it could not be read."""

    parts: tuple[Part, ...]
    error: str | None = None


class _Unreadable(Exception):
    pass


class _Lexer:
    """Tokens of one command string: words (as ``Word``) and operators (as ``str``)."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.inner: list[str] = []  # command strings found in substitutions, parsed later
        self.heredocs: list[tuple[str, bool]] = []

    def error(self, message: str) -> _Unreadable:
        return _Unreadable(f"{message} at offset {self.i}")

    def tokens(self) -> list[Word | str]:
        out: list[Word | str] = []
        expect_heredoc = False
        while True:
            start = self.i
            tok = self.next()
            if tok is None:
                return out
            if expect_heredoc and isinstance(tok, Word):
                quoted = any(c in self.s[start:self.i] for c in "'\"\\")  # <<'EOF': a literal body
                self.heredocs.append((tok.text, quoted))
                expect_heredoc = False
            if tok in ("<<", "<<-"):
                expect_heredoc = True
            if tok == "\n" and self.heredocs:
                self.skip_heredocs()
            out.append(tok)

    def skip_heredocs(self) -> None:
        for delimiter, literal in self.heredocs:
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                line = self.s[self.i:] if end == -1 else self.s[self.i:end]
                self.i = len(self.s) if end == -1 else end + 1
                if line.lstrip("\t") == delimiter:
                    break
                if not literal:  # an unquoted body expands $( ) and backticks: read them as commands
                    for match in _SUBSTITUTION.finditer(line):
                        self.inner.append(match.group(1) or match.group(2) or "")
            else:
                raise self.error(f"here-document delimited by {delimiter!r} is not closed")
        self.heredocs = []

    def next(self) -> Word | str | None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "#":
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
            else:
                break
        if self.i >= len(s):
            return None
        for op in ("&&", "||", ";;", "|&", ";&", "<<-", "<<<", "<<", ">>", "&>>", "&>", ">&", "<&", ">|", "<>",
                   "<(", ">("):
            if s.startswith(op, self.i):
                self.i += len(op)
                if op in ("<(", ">("):
                    self.inner.append(self.balanced(")"))
                    return Word("", dynamic=True)
                return op
        fd = _FD_REDIRECT.match(s, self.i)
        if fd:  # "2>" or "10<": the fd number belongs to the redirection, not to the words
            self.i = fd.end()
            return self.next()
        c = s[self.i]
        if c in ";&|()<>\n":
            self.i += 1
            return c
        return self.word()

    def word(self) -> Word:
        s = self.s
        text: list[str] = []
        dynamic = False
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n;&|()<>":
                break
            if c == "\\":
                if self.i + 1 < len(s):
                    if s[self.i + 1] != "\n":
                        text.append(s[self.i + 1])
                    self.i += 2
                else:
                    self.i += 1
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end == -1:
                    raise self.error("unterminated single quote")
                text.append(s[self.i + 1:end])
                self.i = end + 1
            elif c == '"':
                self.i += 1
                piece, dyn = self.double_quoted()
                text.append(piece)
                dynamic = dynamic or dyn
            elif c == "`":
                self.backtick()
                dynamic = True
            elif c == "$":
                piece, dyn = self.dollar()
                text.append(piece)
                dynamic = dynamic or dyn
            else:
                if c in "*?" or (c == "[" and _BRACKET.match(s, self.i)) or (
                        c == "{" and _BRACE_EXPANSION.match(s, self.i)):
                    dynamic = True  # pathname or brace expansion decides the real word
                text.append(c)
                self.i += 1
        return Word("".join(text), dynamic)

    def backtick(self) -> None:
        """A `` `command` `` substitution at ``self.i``: its text is parsed and checked as a command too."""
        end = self.s.find("`", self.i + 1)
        if end == -1:
            raise self.error("unterminated backtick")
        self.inner.append(self.s[self.i + 1:end])
        self.i = end + 1

    def double_quoted(self) -> tuple[str, bool]:
        s = self.s
        out: list[str] = []
        dynamic = False
        while self.i < len(s):
            c = s[self.i]
            if c == '"':
                self.i += 1
                return "".join(out), dynamic
            if c == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                out.append(s[self.i + 1])
                self.i += 2
            elif c == "`":
                self.backtick()
                dynamic = True
            elif c == "$":
                piece, dyn = self.dollar()
                out.append(piece)
                dynamic = dynamic or dyn
            else:
                out.append(c)
                self.i += 1
        raise self.error("unterminated double quote")

    def dollar(self) -> tuple[str, bool]:
        """``$...`` at ``self.i``: ANSI-C quotes are decoded; expansions make the word dynamic."""
        s = self.s
        nxt = s[self.i + 1] if self.i + 1 < len(s) else ""
        if nxt == "'":
            end = self.i + 2
            while end < len(s) and s[end] != "'":
                end += 2 if s[end] == "\\" else 1
            if end >= len(s):
                raise self.error("unterminated $'...' quote")
            body = s[self.i + 2:end]
            self.i = end + 1
            try:
                return codecs.decode(body.encode("latin-1", "backslashreplace"), "unicode_escape"), False
            except (UnicodeDecodeError, ValueError):
                return body, True
        if s.startswith("$((", self.i):
            self.i += 2
            self.balanced(")")  # arithmetic: parentheses balance; nothing in it runs a program
            return "", True
        if nxt == "(":
            self.i += 2
            self.inner.append(self.balanced(")"))
            return "", True
        if nxt == "{":
            self.i += 2
            body = self.balanced("}", opener="{")
            for match in _SUBSTITUTION.finditer(body):  # ${x:-$(cmd)}
                self.inner.append(match.group(1) or match.group(2) or "")
            return "", True
        if nxt and (nxt.isalnum() or nxt in "_@*#?$!-"):
            self.i += 2
            while nxt.isalpha() or nxt == "_":
                if self.i < len(s) and (s[self.i].isalnum() or s[self.i] == "_"):
                    self.i += 1
                else:
                    break
            return "", True
        self.i += 1
        return "$", False

    def balanced(self, closer: str, opener: str = "(") -> str:
        """The text up to the matching ``closer`` (quotes respected); ``self.i`` moves past it."""
        s = self.s
        start = self.i
        depth = 1
        while self.i < len(s):
            c = s[self.i]
            if c == closer:
                depth -= 1
                self.i += 1
                if depth == 0:
                    return s[start:self.i - 1]
            elif c == opener:
                depth += 1
                self.i += 1
            elif c == "\\":
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end == -1:
                    raise self.error("unterminated single quote")
                self.i = end + 1
            elif c == '"':
                self.i += 1
                self.double_quoted()
            elif c == "`":
                end = s.find("`", self.i + 1)
                if end == -1:
                    raise self.error("unterminated backtick")
                self.i = end + 1
            else:
                self.i += 1
        raise self.error(f"missing {closer!r}")


_SEPARATORS: Final = frozenset({";", "&&", "||", "|", "|&", "&", "\n", "(", ")", ";;", ";&"})
_REDIRECTIONS: Final = frozenset({"<", ">", ">>", "&>", "&>>", ">&", "<&", ">|", "<>", "<<", "<<-", "<<<"})


def parse_command(command: str, *, _depth: int = 0) -> Parsed:
    """The parts of ``command``; ``Parsed.error`` says why it could not be read."""
    try:
        return Parsed(tuple(_parts(command, _depth)))
    except _Unreadable as exc:
        return Parsed((), str(exc))


def _parts(command: str, depth: int) -> list[Part]:
    if depth > MAX_DEPTH:
        raise _Unreadable("commands nested too deeply")
    lexer = _Lexer(command)
    tokens = lexer.tokens()
    if lexer.heredocs:
        raise _Unreadable("here-document without a body")
    parts: list[Part] = []
    words: list[Word] = []
    skip_next = False
    for token in [*tokens, "\n"]:
        if isinstance(token, Word):
            if skip_next:  # the target of a redirection
                skip_next = False
            else:
                words.append(token)
            continue
        if token in _REDIRECTIONS:
            skip_next = True
            continue
        if token in _SEPARATORS:
            if token == "(" and words:  # name() { ...; }: a function definition, the body follows
                words = []
                continue
            if token in (";;", ";&"):
                raise _Unreadable("case statements are not read")
            parts.extend(_simple(words, depth))
            words = []
            continue
        raise _Unreadable(f"unexpected token {token!r}")
    for inner in lexer.inner:
        parts.extend(_parts(inner, depth + 1))
    return parts


def _simple(words: list[Word], depth: int) -> list[Part]:
    """The parts of one simple command (usually one; more for ``bash -c``, ``find -exec`` ...)."""
    while words and not words[0].dynamic and words[0].text in OPENERS:
        words = words[1:]
    while words and _ASSIGNMENT.match(words[0].text):
        words = words[1:]
    if not words:
        return []
    first = words[0].text
    if not words[0].dynamic and first in ("for", "select", "case", "[[", "function"):
        if first == "case":
            raise _Unreadable("case statements are not read")
        if first == "function":
            return _simple(words[2:], depth)
        return []  # a loop header or a test: no program runs (substitutions were parsed already)
    if not words[0].dynamic and first == "((":
        return []
    words = _strip_wrappers(words)
    if not words:
        return []
    program = words[0]
    name = os.path.basename(program.text.rstrip("/")) or program.text
    args = tuple(w.text for w in words[1:])
    if program.dynamic:
        return [Part(program.text or "?", args, dynamic=True)]
    inner = _inner_command(name, words[1:])
    if inner is not None:
        text, dynamic = inner
        if dynamic:
            return [Part(name, args, dynamic=True)]
        return _parts(text, depth + 1)
    parts = [Part(name, args)]
    if name in ("find", "fd"):
        parts.extend(_find_exec(words[1:], depth))
    return parts


def _strip_wrappers(words: list[Word]) -> list[Word]:
    for _ in range(32):
        if not words or words[0].dynamic:
            return words
        name = os.path.basename(words[0].text)
        if name not in WRAPPERS:
            return words
        if name == "env" and any(w.text in ("-S", "--split-string") or w.text.startswith("-S") for w in words[1:]):
            return words  # env -S STRING: handled as an inner command
        with_arg = WRAPPERS[name]
        operands = WRAPPER_OPERANDS.get(name, 0)
        rest = words[1:]
        while rest:
            text = rest[0].text
            if text == "--":
                rest = rest[1:]
                break
            if text.startswith("-") and len(text) > 1 and not rest[0].dynamic:
                takes = text in with_arg or (text.split("=", 1)[0] in with_arg and "=" not in text)
                rest = rest[2:] if takes and "=" not in text else rest[1:]
                continue
            if name == "env" and _ASSIGNMENT.match(text):
                rest = rest[1:]
                continue
            if operands:
                operands -= 1
                rest = rest[1:]
                continue
            break
        if not rest:
            return [words[0]] if name in ("xargs", "time", "env", "nice", "nohup") else []
        words = rest
    return words


def _inner_command(name: str, args: Sequence[Word]) -> tuple[str, bool] | None:
    """The command string a shell (``-c``), ``eval`` or ``env -S`` will run, if any."""
    if name == "eval":
        return " ".join(w.text for w in args), any(w.dynamic for w in args)
    if name == "env":
        for index, word in enumerate(args):
            if word.text in ("-S", "--split-string") and index + 1 < len(args):
                rest = args[index + 1:]
                return " ".join(w.text for w in rest), any(w.dynamic for w in rest)
            if word.text.startswith("-S") and len(word.text) > 2:
                rest = args[index + 1:]
                return " ".join([word.text[2:], *(w.text for w in rest)]), word.dynamic
        return None
    if name not in SHELLS:
        return None
    for index, word in enumerate(args):
        text = word.text
        if text == "--" or not text.startswith(("-", "+")):
            return None  # a script file or stdin: the shell itself is the part
        if text.startswith("-") and not text.startswith("--") and "c" in text[1:]:
            if index + 1 >= len(args):
                return None
            return args[index + 1].text, args[index + 1].dynamic
        if text in ("-o", "+o", "-O", "+O"):
            continue
    return None


def _find_exec(args: Sequence[Word], depth: int) -> list[Part]:
    parts: list[Part] = []
    index = 0
    while index < len(args):
        if args[index].text in ("-exec", "-execdir", "-ok", "-okdir", "-x", "--exec", "-X", "--exec-batch"):
            end = index + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            words = [w for w in args[index + 1:end] if w.text != "{}"]
            parts.extend(_simple(words, depth + 1))
            index = end
        index += 1
    return parts


@attrs.frozen
class CommandRules:
    """``allow`` and ``deny`` patterns; ``check`` raises ``PolicyError`` for the first denied part.

    A pattern without spaces is a glob on the program's basename (``rm``,
    ``python*``); a pattern with spaces is a glob on the whole part, program
    and arguments joined by single spaces (``git push*``). Deny wins.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.allow or self.deny)

    @staticmethod
    def _match(pattern: str, part: Part) -> bool:
        if " " in pattern.strip():
            return fnmatch.fnmatchcase(str(part), pattern.strip())
        return fnmatch.fnmatchcase(part.program, pattern)

    def check(self, command: str) -> Parsed:
        """The parsed command when every part passes; ``PolicyError`` naming the rule and part otherwise."""
        parsed = parse_command(command)
        if not self.active:
            return parsed
        if parsed.error is not None:
            if self.allow:
                raise PolicyError(f"command denied: it could not be parsed ({parsed.error}) and an allow "
                                  "list is configured", code="command_denied", rule="unparsable", part=command)
            return parsed
        for part in parsed.parts:
            for pattern in self.deny:
                if self._match(pattern, part):
                    raise PolicyError(f"command denied by deny rule {pattern!r}: {str(part)!r}",
                                      code="command_denied", rule=f"deny:{pattern}", part=str(part))
            if not self.allow:
                continue
            if part.dynamic:
                raise PolicyError(f"command denied: the program of {str(part)!r} is only known at run time and "
                                  "an allow list is configured", code="command_denied", rule="dynamic",
                                  part=str(part))
            if not any(self._match(pattern, part) for pattern in self.allow):
                raise PolicyError(f"command denied: {str(part)!r} matches no allow rule",
                                  code="command_denied", rule="not_allowed", part=str(part))
        return parsed


def parts_of(command: str) -> list[str]:
    """The parts of ``command`` as strings (for docs and tests)."""
    return [str(p) for p in parse_command(command).parts]

