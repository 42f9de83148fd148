"""Read a bash command line into its simple commands with tree-sitter's bash grammar.

``parse_command`` returns every simple command ("part") bash would run, wrappers
unwrapped (see ``wrappers.py``), and every construct that could run a command
the reader cannot see ("unreadable"). Command rules (``rules.py``) fail closed
on the latter. The tree-sitter parser is created once per thread.

Unreadable, because bash would evaluate text the reader cannot follow:
- command or process substitutions inside arithmetic, array subscripts,
  here-documents or ``${…}`` parameter expansions (in a ``${…}`` its text is
  checked: the grammar keeps most operands as plain text);
- a variable read in an arithmetic context (``(( ))``, ``$(( ))``, ``$[ ]``,
  ``[[ a -eq b ]]``, ``let``, subscripts, substring offsets) unless the command
  line only ever gives it integers: bash evaluates a variable's *value* as an
  expression, and a value like ``a[$(rm x)]`` runs ``rm``; the keys of a
  compound array assignment (``a=([key]=v)``) are read as arithmetic;
- a variable name with a subscript passed to a builtin (``printf -v 'a[$(…)]'``,
  ``read``, ``unset``, ``declare``, ``[[ -v ]]``), ``${!x}``, ``${x@P}`` and the
  other ``@`` transformations, ``declare -i``/``-n``;
- ``eval``, ``source``/``.``, ``trap``, ``coproc``, ``alias``, ``enable``,
  ``hash -p``, assignments to ``PATH``, ``BASH_ENV``, ``ENV``, ``PS4``,
  ``PROMPT_COMMAND``, ``SHELLOPTS``, ``BASHOPTS``, ``LD_*`` (``changes_what_runs``)
  however made: ``NAME=``, a quoted ``declare 'NAME=…'``, a builtin assigning by
  name (``read``, ``printf -v``, ``mapfile``, ``getopts``, ``wait -p``), a loop
  variable, ``${NAME:=…}``, arithmetic (``let``, ``(( ))``);
- a program name only known at run time (``$X``, ``$(echo rm)``, globs, braces);
- anything tree-sitter reports as an error or a missing token.

Limits: this reads text, it does not run it. What a program does with its own
arguments (``python -c``, ``make``, ``awk 'BEGIN{system(…)}'``, git aliases and
hooks, a script file) is not seen. Must never execute anything, and never raise
on any input.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import re
import threading
from collections.abc import Iterator
from typing import Final

import attrs
import tree_sitter
import tree_sitter_bash

from .wrappers import Unwrapped, Word, changes_what_runs, unwrap

MAX_DEPTH: Final = 8
CACHE_SIZE: Final = 512
CACHE_MAX_CHARS: Final = 4096
#: Bounds on the work one check does on the event loop: characters parsed, syntax nodes walked (a
#: typical command has under 100 nodes; 5,000 take a few tenths of a second on a loaded machine).
#: A larger command is refused unread when rules exist.
MAX_CHARS: Final = 64 * 1024
MAX_NODES: Final = 5_000
#: Node types that expand at run time; a word containing one is dynamic.
_EXPANSIONS: Final = frozenset({"simple_expansion", "expansion", "command_substitution", "process_substitution",
                                "arithmetic_expansion"})
_ARITH_TEST_OPERATORS: Final = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})
#: Builtins whose arguments name variables (a subscript in such a name is evaluated, commands included).
_NAME_BUILTINS: Final = frozenset({"read", "mapfile", "readarray", "printf", "getopts", "wait", "declare", "typeset",
                                   "local", "export", "readonly", "unset", "test", "[", "[[", "let"})
#: Builtins that store text in the variables they name.
_TEXT_WRITERS: Final = frozenset({"read", "mapfile", "readarray", "printf", "getopts", "wait"})
#: Builtins that assign a value to a variable named by ``NAME=value`` in an argument (a quoted one is a word).
_DECLARERS: Final = frozenset({"declare", "typeset", "local", "export", "readonly"})
_ASSIGNING_WRAPPERS: Final = frozenset({"env", "sudo"})
_NEVER_READ: Final = {
    "eval": "eval runs a string the rules cannot read",
    "source": "source runs a file the rules cannot read",
    ".": ". (source) runs a file the rules cannot read",
    "trap": "trap runs a string the rules cannot read",
    "coproc": "coproc is not read by the parser",
    "alias": "an alias changes what a later command name runs",
    "enable": "enable loads or hides builtins",
    "compgen": "compgen -C/-F runs a string the rules cannot read",
    "fc": "fc runs commands from the history",
}
#: Variables bash itself sets to text (so an integer assignment in the command line does not make them safe).
_BASH_TEXT_VARS: Final = re.compile(
    r"^(_|REPLY|OPTARG|MAPFILE|COPROC.*|PWD|OLDPWD|FUNCNAME|DIRSTACK|HOSTNAME|GROUPS|BASH.*|COMP.*|READLINE.*)$")
_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SAFE_SUBSCRIPT: Final = re.compile(r"^([0-9]+|[@*])$")
_INTEGER: Final = re.compile(r"^[+-]?[0-9][0-9A-Za-z#]*$")
_OPERATOR: Final = re.compile(r"[-+*/%<>=!&|^~?:,]+")
_INTEGER_SPECIALS: Final = frozenset({"#", "?", "$", "!"})
_FD_VARIABLE: Final = re.compile(r"(?:(?<=^)|(?<=[\s;&|(]))\{[A-Za-z_][A-Za-z0-9_]*\}(?=[<>])")
#: Text that starts a command, process or arithmetic substitution (escaped or quoted ones included: a
#: ``${…}`` holding one fails closed whatever the grammar made of it).
_SUBSTITUTION_OPENER: Final = re.compile(r"`|\$\(|\$\[|[<>]\(")
#: ``[key]=`` / ``[key]+=`` at the start of an element of a compound array assignment.
_ARRAY_KEY: Final = re.compile(r"^\[(.*?)\]\+?=", re.S)
#: ``$name`` and ``${name}`` in an arithmetic text, and the text arithmetic is read from once they are names.
_SIMPLE_REFERENCE: Final = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_ARITHMETIC_TEXT: Final = re.compile(r"[\sA-Za-z0-9_#+\-*/%()<>=!&|^~?:,]*")
_GLOB: Final = re.compile(r"[*?]|\[.*\]|\{[^{}\s]*(,|\.\.)[^{}\s]*\}")

_WORD_NODES: Final = frozenset({"command_name", "word", "string", "raw_string", "ansi_c_string", "concatenation",
                                "number", "simple_expansion", "expansion", "command_substitution",
                                "process_substitution", "arithmetic_expansion", "translated_string",
                                "extglob_pattern", "regex"})
_CONDITIONS: Final = frozenset({"binary_expression", "unary_expression", "parenthesized_expression",
                                "negated_expression"})
_BASH: Final = tree_sitter.Language(tree_sitter_bash.language())
_PARSERS = threading.local()  # a tree-sitter parser is not safe to share between threads; one per thread


def _parser() -> tree_sitter.Parser:
    parser: tree_sitter.Parser | None = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = tree_sitter.Parser(_BASH)
    return parser


@attrs.frozen
class Part:
    """One simple command: the program's basename and its arguments (wrappers stripped).

    ``path`` is the program as written (``./ls``, ``/usr/bin/git``) when it differs from ``program``.
    """

    program: str
    args: tuple[str, ...] = ()
    path: str = ""

    def __str__(self) -> str:
        return " ".join((self.program, *self.args))


@attrs.frozen
class Unreadable:
    """A construct that could run a command the reader cannot see: ``reason`` says which, ``text`` where."""

    reason: str
    text: str


@attrs.frozen
class Parsed:
    """Every part of a command line and everything in it that could not be read.

    ``error`` is set when the text is not valid bash to the parser (then ``parts`` may be incomplete).
    """

    parts: tuple[Part, ...]
    unreadable: tuple[Unreadable, ...] = ()
    error: str | None = None


def parse_command(command: str) -> Parsed:
    """The parts of ``command`` and what in it could not be read; never raises.

    Results for short commands are cached (an agent repeats its commands; ``Parsed`` is immutable).
    """
    if len(command) <= CACHE_MAX_CHARS:
        return _parse_cached(command)
    return _parse(command)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _parse_cached(command: str) -> Parsed:
    return _parse(command)


def _parse(command: str) -> Parsed:
    if len(command) > MAX_CHARS:
        return Parsed((), (Unreadable(f"the command is longer than {MAX_CHARS} characters", command[:80]),))
    reader = _Reader()
    try:
        reader.read_string(command, 0)
    except RecursionError:  # pathological nesting: the tree is deeper than Python's stack
        reader.unreadable.append(Unreadable("the command is nested too deeply", command[:80]))
    except _TooLarge:
        reader.unreadable.append(Unreadable(f"the command has more than {MAX_NODES} syntax nodes",
                                            command[:80]))
    reader.finish()
    return Parsed(tuple(reader.parts), tuple(reader.unreadable), reader.error)


def _first_error(node: tree_sitter.Node) -> tree_sitter.Node | None:
    if node.is_error or node.is_missing:
        return node
    for child in node.children:
        if child.has_error or child.is_missing or child.is_error:
            found = _first_error(child)
            if found is not None:
                return found
    return None


class _TooLarge(Exception):
    """The command line has more syntax nodes than ``MAX_NODES``."""


class _Reader:
    """Walks syntax trees; collects parts, unreadable constructs and variable use for arithmetic."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.unreadable: list[Unreadable] = []
        self.error: str | None = None
        self.tainted: dict[str, str] = {}  # variable -> where it was given text
        self.integers: set[str] = set()  # variables given integers
        self.arith_names: dict[str, str] = {}  # variable read in arithmetic -> where
        self.budget = MAX_NODES
        self.source = b""  # the text the nodes being walked come from

    def text(self, node: tree_sitter.Node) -> str:
        # Sliced here: Node.text copies the whole source on every call.
        return self.source[node.start_byte:node.end_byte].decode("utf-8", "surrogateescape")

    def unquoted(self, node: tree_sitter.Node) -> str:
        return "".join(self.text(c) for c in node.children if c.type in ("word", "number"))

    def closed(self, reason: str, node: tree_sitter.Node | str) -> None:
        text = node if isinstance(node, str) else self.text(node)
        self.unreadable.append(Unreadable(reason, text[:80]))

    def finish(self) -> None:
        for name, where in self.arith_names.items():
            if name in self.tainted or _BASH_TEXT_VARS.match(name) or (
                    name.upper() == name and name not in self.integers):
                what = f"positional parameter ${name}" if name.isdigit() else f"variable {name!r}"
                self.closed(f"{what} in an arithmetic expression may hold text that bash evaluates "
                            "(an array subscript in it runs commands)", where)

    # -- command strings ----------------------------------------------------------------------------------

    def read_string(self, command: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.closed("commands nested too deeply", command)
            return
        if "\\\n" in command:
            # bash removes backslash-newline before it splits words ("r\<newline>m" is rm); tree-sitter
            # does not always. Read the joined text as well (more parts can only deny more).
            self.read_tree(command.replace("\\\n", ""), depth)
        self.read_tree(command, depth)

    def read_tree(self, command: str, depth: int) -> None:
        source = command.encode("utf-8", "surrogateescape")
        tree = _parser().parse(source)
        if tree.root_node.has_error:
            # tree-sitter cannot read bash's "{fd}>file" at the start of a command: the same text with a
            # plain descriptor (same length, so offsets hold) has the same commands.
            rewritten = _FD_VARIABLE.sub(lambda m: " " * (len(m.group()) - 1) + "9", command)
            if rewritten != command:
                retry = _parser().parse(rewritten.encode("utf-8", "surrogateescape"))
                if not retry.root_node.has_error:
                    tree, source = retry, rewritten.encode("utf-8", "surrogateescape")
        bad = _first_error(tree.root_node) if tree.root_node.has_error else None
        if bad is not None:
            kind = f"missing {bad.type!r}" if bad.is_missing else "a syntax error"
            message = f"{kind} at offset {bad.start_byte}"
            if self.error is None:
                self.error = message
            return
        outer, self.source = self.source, source  # a shell string is read while its caller's tree is open
        try:
            translated = _translated_string(tree.root_node) if b'$"' in source else None
            if translated is not None:
                self.closed("a $\"…\" string, which bash translates at run time (a translation may run commands)",
                            translated.parent or translated)
            self.walk(tree.root_node, depth)
        finally:
            self.source = outer

    # -- statements -----------------------------------------------------------------------------------------

    def walk(self, node: tree_sitter.Node, depth: int) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise _TooLarge
        kind = node.type
        if kind == "command":
            self.command(node, depth)
        elif kind == "redirected_statement":
            self.redirected(node, depth)
        elif kind == "declaration_command" or kind == "unset_command":
            self.declaration(node, depth)
        elif kind == "variable_assignment":
            self.assignment(node, depth)
        elif kind == "compound_statement" and node.child_count and node.children[0].type == "((":
            self.arithmetic(node, depth)
        elif kind == "c_style_for_statement":
            for child in node.children:
                if child.type == "do_group" or child.type == "compound_statement":
                    self.walk(child, depth)
                else:
                    self.arithmetic(child, depth)
        elif kind in ("for_statement", "select_statement"):
            variable = node.child_by_field_name("variable")
            if variable is not None:
                if changes_what_runs(self.text(variable)):
                    self.closed(f"a loop assigns {self.text(variable)}, which changes what later commands run",
                                variable)
                self.taint(self.text(variable), node)
            for child in node.children:
                if child != variable:
                    self.walk(child, depth)
        elif kind == "test_command":
            self.condition(node, depth, arithmetic=node.child_count > 0 and node.children[0].type == "[[")
        elif kind == "heredoc_body":  # an unquoted body expands; its substitutions are not read
            siblings = node.parent.children if node.parent is not None else []
            start = next((self.text(c) for c in siblings if c.type == "heredoc_start"), "")
            if any(quote in start for quote in "'\"\\"):
                return  # <<'EOF': a literal body
            if any(opener in self.text(node) for opener in ("`", "$(", "$[")):  # the grammar misses backticks here
                self.closed("a command substitution inside a here-document", node)
                return
            for sub in _descendants(node):
                if sub.type in ("command_substitution", "process_substitution"):
                    self.closed("a command substitution inside a here-document", node)
                    break
                if sub.type in ("expansion", "simple_expansion", "arithmetic_expansion") and (
                        sub.parent is None or sub.parent.type == "heredoc_body"):
                    self.walk(sub, depth)
        elif kind == "command_substitution" and node.child_count and node.children[0].type == "`":
            # Inside backticks bash removes the backslash before ` \ $ and parses the text again
            # (nested `echo \`rm x\``); the grammar keeps the escaped backticks as words.
            inner = self.text(node)[1:-1]
            self.read_string(re.sub(r"\\([`\\$])", r"\1", inner), depth + 1)
        elif kind in ("command_substitution", "process_substitution"):
            for child in node.children:
                self.walk(child, depth)
        elif kind in ("expansion", "simple_expansion"):
            self.expansion(node, depth)
        elif kind == "arithmetic_expansion":
            self.arithmetic(node, depth)
        elif kind == "subscript":
            self.subscript(node, depth)
        else:
            for child in node.children:
                self.walk(child, depth)

    def command(self, node: tree_sitter.Node, depth: int, redirects: tuple[tree_sitter.Node, ...] = ()) -> None:
        """One ``command`` node (and the redirections tree-sitter hung beside it) -> its words."""
        words: list[Word] = []
        for child in (*node.children, *redirects):
            if child.type == "variable_assignment":
                self.assignment(child, depth)
            elif child.type in _WORD_NODES:
                target = child.children[0] if child.type == "command_name" and child.child_count else child
                words.append(self.word(target, depth))
            elif child.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
                # tree-sitter hangs the words after a redirection on it ("exec 3>&1 rm x", "cat <<EOF rm");
                # to bash they are words of the command.
                extra = _redirect_words(child)
                for sub in child.children:
                    if sub not in extra:
                        self.walk(sub, depth)
                words.extend(self.word(sub, depth) for sub in extra)
            else:
                self.walk(child, depth)
        if words:
            self.simple(words, self.text(node), depth)

    def redirected(self, node: tree_sitter.Node, depth: int) -> None:
        body = node.child_by_field_name("body")
        redirects = tuple(c for c in node.children if c != body)
        if body is not None and body.type == "command":
            self.command(body, depth, redirects)
            return
        if any(_redirect_words(r) for r in redirects):
            self.closed("words after the redirection of a compound command", node)
        for child in node.children:
            self.walk(child, depth)

    def simple(self, words: list[Word], where: str, depth: int) -> None:
        """One simple command's words -> parts (wrappers unwrapped) and unreadable constructs."""
        result: Unwrapped = unwrap(words)
        if result.reason is not None:
            self.closed(result.reason, where)
        for argv in result.commands:
            self.argv(argv, where)
        for string in result.strings:
            if string.dynamic:
                self.closed("a command string is only known at run time", where)
            else:
                self.read_string(string.text, depth + 1)

    def argv(self, argv: tuple[Word, ...], where: str) -> None:
        while argv and not argv[0].dynamic and argv[0].text in ("{", "!"):
            argv = argv[1:]  # "time { rm x; }": tree-sitter reads the reserved words after time as words
        if not argv or (not argv[0].dynamic and argv[0].text == "}"):
            return
        program = argv[0]
        if program.dynamic:
            self.closed("the program name is only known at run time", where)
            return
        name = program.text.rstrip("/").rsplit("/", 1)[-1] or program.text
        args = argv[1:]
        if name in _NEVER_READ:
            self.closed(_NEVER_READ[name], where)
        elif name == "hash" and any(a.text.startswith("-") and "p" in a.text for a in args):
            self.closed("hash -p changes what a later command name runs", where)
        elif name == "jobs" and any(a.text == "-x" for a in args):
            self.closed("jobs -x runs a command the rules do not read", where)
        elif name in _ASSIGNING_WRAPPERS:
            for arg in args:  # env NAME=VALUE …: the value reaches the commands inside
                assigned = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", arg.text, re.S)
                if assigned and (arg.dynamic or not _INTEGER.match(assigned.group(2))):
                    self.tainted.setdefault(assigned.group(1), where)
        if name in _NAME_BUILTINS:
            self.name_arguments(name, args, where)
        self.parts.append(Part(name, tuple(a.text for a in args), program.text if program.text != name else ""))

    def name_arguments(self, name: str, args: tuple[Word, ...], where: str) -> None:
        """Variable names given to builtins: a subscript in one is evaluated; text writers taint it."""
        if name == "let":
            for arg in args:
                self.let(arg, where)
            return
        if name in ("mapfile", "readarray") and any(a.text.startswith("-C") for a in args):
            self.closed(f"{name} -C runs a callback string the rules cannot read", where)
        for arg in _names_given(name, args):
            text = arg.text
            if arg.dynamic:
                self.closed(f"a variable name given to {name} is only known at run time", where)
                continue
            base, bracket, rest = text.partition("[")
            base = base.split("=", 1)[0]
            if changes_what_runs(base) and (name in _TEXT_WRITERS or (name in _DECLARERS and "=" in text)):
                self.closed(f"{name} assigns {base}, which changes what later commands run", where)
            if bracket and "]" in rest:
                subscript = rest[:rest.index("]")] if "=" in rest else rest[:rest.rindex("]")]
                if not (_SAFE_SUBSCRIPT.match(subscript) or _NAME.match(subscript)):
                    self.closed(f"an array subscript in a variable name given to {name} (bash evaluates it)",
                                where)
                elif _NAME.match(subscript):
                    self.arith_names.setdefault(subscript, where)
            if name in _TEXT_WRITERS and _NAME.match(base):
                self.tainted.setdefault(base, where)

    def let(self, arg: Word, where: str) -> None:
        if arg.dynamic or re.search(r"[$`\[\]'\"\\]", arg.text):
            self.closed("an expansion or subscript in a let expression", where)
            return
        for match in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", arg.text):
            if changes_what_runs(match.group()):
                self.closed(f"let uses {match.group()}, which changes what later commands run", where)
            self.arith_names.setdefault(match.group(), where)
        assigned = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*[-+*/%&|^<>]*=", arg.text)
        if assigned:
            self.integers.add(assigned.group(1))

    def declaration(self, node: tree_sitter.Node, depth: int) -> None:
        keyword = self.text(node.children[0]) if node.child_count else ""
        for before, after in itertools.pairwise(node.children[1:]):
            if after.start_byte == before.end_byte:  # found by attack: ``declare P''S4=…`` came as "P", "''S4=…"
                self.closed(f"a word of {keyword} the parser split in two (bash reads one: a quoted variable name)",
                            node)
        for child in node.children[1:]:
            if child.type == "variable_assignment":
                self.assignment(child, depth)
                continue
            word = self.word(child, depth)
            if word.text.startswith("-") and keyword in ("declare", "typeset", "local") and (
                    "i" in word.text or "n" in word.text):
                self.closed(f"{keyword} {word.text} makes bash evaluate the variable's value later", node)
            self.name_arguments(keyword, (word,), self.text(node))
        self.parts.append(Part(keyword, tuple(self.text(c) for c in node.children[1:])))

    def assignment(self, node: tree_sitter.Node, depth: int) -> None:
        name_node = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        name = self.text(name_node) if name_node is not None else ""
        if name_node is not None and name_node.type == "subscript":
            self.subscript(name_node, depth)
            base = name_node.child_by_field_name("name")
            name = self.text(base) if base is not None else name
        if changes_what_runs(name):
            self.closed(f"an assignment to {name} changes what later commands run", node)
        if value is None or _INTEGER.match(self.text(value)):
            self.integers.add(name)
        else:
            self.taint(name, node)
            if value.type == "array":
                self.array_keys(value)
            self.walk(value, depth)

    def array_keys(self, array: tree_sitter.Node) -> None:
        """``a=([key]=value …)``: bash evaluates each key of an indexed array as arithmetic, like ``a[key]=``.

        The grammar keeps a key as plain words, so its text is read: numbers, names (checked as in any
        arithmetic), ``$name`` and operators; anything else fails closed.
        """
        for element in array.children:
            text = self.text(element)
            found = _ARRAY_KEY.match(text)
            if found is None:
                continue
            key = found.group(1)
            if _SAFE_SUBSCRIPT.match(key):
                continue
            plain = _SIMPLE_REFERENCE.sub(lambda m: f" {m.group(1) or m.group(2)} ", key)
            if not _ARITHMETIC_TEXT.fullmatch(plain):
                self.closed("an array subscript in a compound assignment (bash evaluates it)", element)
                continue
            for match in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", plain):
                if changes_what_runs(match.group()):
                    self.closed(f"{match.group()} inside an array subscript (an assignment to it changes what "
                                "later commands run)", element)
                self.arith_names.setdefault(match.group(), text)

    def taint(self, name: str, node: tree_sitter.Node) -> None:
        self.tainted.setdefault(name, self.text(node)[:80])

    def condition(self, node: tree_sitter.Node, depth: int, arithmetic: bool) -> None:
        """``[[ … ]]``: ``-eq``/``-lt``/… compare arithmetic expressions; ``-v`` names a variable.

        ``[ … ]`` (``arithmetic`` false) compares integers without evaluating them.
        """
        if node.type == "binary_expression":
            operator = node.child_by_field_name("operator")
            if arithmetic and operator is not None and self.text(operator) in _ARITH_TEST_OPERATORS:
                for side in ("left", "right"):
                    operand = node.child_by_field_name(side)
                    if operand is not None:
                        self.arithmetic(operand, depth)
                return
        elif node.type == "unary_expression" and node.child_count > 1 and self.text(node.children[0]) == "-v":
            self.name_arguments("[[", (Word("-v"), self.word(node.children[1], depth)), self.text(node))
        for child in node.children:
            if child.type in _CONDITIONS:
                self.condition(child, depth, arithmetic)
            else:
                self.walk(child, depth)

    # -- expansions ----------------------------------------------------------------------------------------

    def expansion(self, node: tree_sitter.Node, depth: int) -> None:
        """``$x`` / ``${…}`` outside arithmetic: transformations and hidden substitutions are unreadable.

        The grammar keeps most operands of ``${…}`` (after ``#``, ``%``, ``^``, ``,``, and backticks or
        ``<(…)`` after ``:-``, ``=``, ``?``) as plain text, so the text is checked, not just the nodes:
        any substitution opener anywhere in a ``${…}``, nested ones included, fails closed.
        """
        if node.type == "expansion" and _SUBSTITUTION_OPENER.search(self.text(node)):
            self.closed("a command substitution inside a parameter expansion", node)
            return
        for sub in (node, *_descendants(node)):
            if sub.type == "expansion":
                self.parameter(sub, depth)
            elif sub.type in ("command_substitution", "process_substitution", "arithmetic_expansion"):
                self.closed("a command substitution inside a parameter expansion", node)
                return
            elif sub.type == "subscript":
                self.subscript(sub, depth)

    def parameter(self, node: tree_sitter.Node, depth: int) -> None:
        """One ``${…}``: its operators (``!``, ``@``, ``:=``, ``:offset:length``)."""
        children = node.children
        operators = [self.text(c) for c in children if c.type not in ("variable_name", "subscript", "${", "}", "$")]
        if len(children) > 1 and self.text(children[1]) == "!":
            self.closed("an indirect expansion ${!…} (bash evaluates the name it holds)", node)
        if "@" in operators:
            self.closed("a ${…@…} transformation (bash evaluates its result)", node)
        if any(op in ("=", ":=") for op in operators):
            name = next((c for c in children if c.type == "variable_name"), None)
            if name is not None:
                if changes_what_runs(self.text(name)):
                    self.closed(f"an assignment to {self.text(name)} changes what later commands run", node)
                self.taint(self.text(name), node)
        if ":" in operators:  # ${x:offset:length}: both are arithmetic
            after = children[[self.text(c) for c in children].index(":"):]
            for child in after:
                if child.type in ("variable_name", "word", "simple_expansion", "expansion", "binary_expression",
                                  "number", "unary_expression", "parenthesized_expression"):
                    self.arithmetic(child, depth)

    def subscript(self, node: tree_sitter.Node, depth: int) -> None:
        index = node.child_by_field_name("index")
        if index is not None and not _SAFE_SUBSCRIPT.match(self.text(index)):
            self.arithmetic(index, depth, where="an array subscript")

    def arithmetic(self, node: tree_sitter.Node, depth: int, where: str = "an arithmetic expression") -> None:
        """Everything in an arithmetic context: numbers and integer-only variables are readable, no more."""
        self.budget -= 1
        if self.budget < 0:
            raise _TooLarge
        kind = node.type
        if kind in ("command_substitution", "process_substitution", "heredoc_body"):
            self.closed(f"a command substitution inside {where}", node)
        elif kind in ("number", "((", "))", "$((", "$[", "]", "(", ")", ";", "for", "test_operator"):
            pass
        elif kind in ("variable_name", "word"):
            text = self.text(node)
            if _NAME.match(text):
                if changes_what_runs(text):  # (( PATH = 0 )) assigns it
                    self.closed(f"{text} inside {where} (an assignment to it changes what later commands run)",
                                node.parent or node)
                self.arith_names.setdefault(text, self.text(node.parent) if node.parent is not None else text)
            elif not _INTEGER.match(text) and not _OPERATOR.fullmatch(text):
                self.closed(f"the text {text!r} inside {where}", node)
        elif kind in ("simple_expansion", "expansion"):
            names = [c for c in node.children if c.type in ("variable_name", "special_variable_name")]
            others = [c for c in node.children if c.type not in ("variable_name", "special_variable_name", "$",
                                                                  "${", "}")]
            if len(names) == 1 and not others and names[0].type == "variable_name":
                self.arith_names.setdefault(self.text(names[0]), self.text(node))
            elif len(names) == 1 and not others and self.text(names[0]) in _INTEGER_SPECIALS:
                pass
            else:
                self.closed(f"the expansion {self.text(node)!r} inside {where}", node)
        elif kind == "string" and [c.type for c in node.children] in (['"', "simple_expansion", '"'],
                                                                      ['"', "expansion", '"']):
            self.arithmetic(node.children[1], depth, where)  # "$n" -gt 0
        elif kind in ("string", "raw_string", "ansi_c_string", "concatenation", "translated_string"):
            self.closed(f"a quoted string inside {where}", node)
        elif kind == "variable_assignment":
            name = node.child_by_field_name("name")
            if name is not None and name.type == "variable_name":
                self.integers.add(self.text(name))
            for child in node.children:
                if child != name:
                    self.arithmetic(child, depth, where)
        elif kind == "subscript":
            base = node.child_by_field_name("name")
            if base is not None:
                self.arith_names.setdefault(self.text(base), self.text(node))
            index = node.child_by_field_name("index")
            if index is not None:
                self.arithmetic(index, depth, "an array subscript")
        else:  # operators and the expressions they join
            if node.child_count == 0 and not _OPERATOR.fullmatch(self.text(node)):
                self.closed(f"the text {self.text(node)!r} inside {where}", node)
            for child in node.children:
                self.arithmetic(child, depth, where)
            if kind in ("binary_expression", "postfix_expression", "unary_expression"):
                target = node.child_by_field_name("left") or (node.children[0] if node.child_count else None)
                operator = node.child_by_field_name("operator")
                if target is not None and operator is not None and "=" in self.text(operator) and self.text(
                        operator) not in ("==", "!=", "<=", ">="):
                    self.integers.add(self.text(target))
                if kind == "postfix_expression" and target is not None:
                    self.integers.add(self.text(target))

    # -- words -----------------------------------------------------------------------------------------------

    def word(self, node: tree_sitter.Node, depth: int) -> Word:
        """The text of one word after quote removal; substitutions in it are read as commands."""
        if node.type == "word" or node.type == "number":  # the common case: one plain word
            text = self.text(node)
            if "\\" not in text and not _GLOB.search(text):
                return Word(text)
        dynamic = False
        pieces: list[str] = []
        for piece in _pieces(node):
            kind = piece.type
            if kind in _EXPANSIONS:
                dynamic = True
                self.walk(piece, depth)
            elif kind == "raw_string":
                pieces.append(self.text(piece)[1:-1])
            elif kind == "ansi_c_string":
                body = self.text(piece)[2:-1]
                try:
                    pieces.append(codecs.decode(body.encode("latin-1", "backslashreplace"), "unicode_escape"))
                except (UnicodeDecodeError, ValueError):
                    pieces.append(body)
                    dynamic = True
            elif kind == "string_content":
                pieces.append(re.sub(r"\\([$`\"\\\n])", r"\1", self.text(piece)))
            elif kind in ('"', "$\""):
                pass
            else:
                text = self.text(piece)
                if _GLOB.search(text) or text.startswith("~"):
                    dynamic = dynamic or bool(_GLOB.search(text))
                pieces.append(re.sub(r"\\(.)", r"\1", text.replace("\\\n", "")))
        if not dynamic and node.type == "concatenation" and _GLOB.search(self.unquoted(node)):
            dynamic = True
        # A dynamic word is never a program name; its source text is what a pattern can match.
        return Word(self.text(node) if dynamic else "".join(pieces), dynamic)


def _redirect_words(redirect: tree_sitter.Node) -> list[tree_sitter.Node]:
    """Words tree-sitter attached to a redirection that bash gives to the command instead."""
    if redirect.type == "file_redirect":
        return [c for i, c in enumerate(redirect.children)
                if redirect.field_name_for_child(i) == "destination"][1:]
    if redirect.type == "heredoc_redirect":
        return [c for i, c in enumerate(redirect.children) if redirect.field_name_for_child(i) == "argument"]
    return []


def _translated_string(root: tree_sitter.Node) -> tree_sitter.Node | None:
    """The first ``$"…"`` string in the tree, or None: bash replaces it by its translation from the
    message catalog that ``TEXTDOMAIN``/``TEXTDOMAINDIR``/the locale pick, and expands ``$(…)`` in
    that translation (found by attack: a catalog the command wrote ran ``touch`` past a deny rule).
    The grammar reads one as a ``$`` followed by a string, or as a ``translated_string``."""
    for sub in _descendants(root):
        if sub.type == "translated_string":
            return sub
        after = sub.next_sibling if sub.type == "$" else None
        if after is not None and after.type == "string" and after.start_byte == sub.end_byte:
            return sub
    return None


def _pieces(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """The leaves of a word: quoted strings opened, expansions kept whole."""
    if node.type in ("concatenation", "string", "translated_string"):
        for child in node.children:
            if not (node.type == "translated_string" and child.type == "$"):
                yield from _pieces(child)
    else:
        yield node


def _descendants(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    for child in node.children:
        yield child
        yield from _descendants(child)


#: Options of ``read``/``mapfile``/``readarray`` that take a value which is not a variable name.
_VALUE_OPTIONS: Final = {"read": "dinNptu", "mapfile": "dnOsuCc", "readarray": "dnOsuCc"}


def _names_given(name: str, args: tuple[Word, ...]) -> list[Word]:
    """The arguments of builtin ``name`` that are variable names (``printf -v NAME``, ``read A B``, …)."""
    if name in ("printf", "wait", "test", "[", "[["):
        flag = "-v" if name in ("printf", "test", "[", "[[") else "-p"
        flagged = [args[i + 1] for i, a in enumerate(args[:-1]) if a.text == flag]
        if name == "printf":
            flagged += [Word(a.text[2:], a.dynamic) for a in args if a.text.startswith("-v") and len(a.text) > 2]
        return flagged
    if name == "getopts":
        operands = [a for a in args if not a.text.startswith("-")]
        return operands[1:2]
    names: list[Word] = []
    takes = _VALUE_OPTIONS.get(name, "")
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg.text.startswith("-") and not arg.dynamic and len(arg.text) > 1:
            letters = arg.text[1:]
            for position, letter in enumerate(letters):
                if letter in takes:
                    skip = position == len(letters) - 1
                    break
            continue
        names.append(arg)
    if name in ("mapfile", "readarray"):
        return names[-1:]
    return names
