"""Command rules under generated input: never crash, never miss a denied command, never refuse a plain one.

Commands are built from a small vocabulary of simple commands, wrapped
(``env``, ``timeout``, ``bash -c`` …), joined by every separator bash has and
nested in groups, subshells and substitutions. With a deny rule on ``rm`` any
composition holding ``rm`` is denied; with an allow list naming the
vocabulary, compositions without ``rm`` pass (the reader does not fail closed
on plain commands).
"""

from __future__ import annotations

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools.builtins.bash.rules import CommandRules, parse_command
from amplifier_tools.errors import PolicyError

#: Simple commands (any wrapper can run them) and shell syntax (only a shell can).
SIMPLE = ["ls -la", "echo hi", "cat f.txt", "grep -n x f", "git status", "true", "wc -l f", "echo \"$HOME\"",
          "ls 2>/dev/null", "cat <<< 'x'", "echo $((1 + 2))", "echo 'a; rm b'", "rm -rf /x"]
SYNTAX = ["for i in 1 2; do echo $i; done", "[[ -f x ]]", "x=1", "(( n = 2 * 3 ))"]
WRAPPERS = ["env FOO=1 {}", "timeout 5 {}", "nice -n 5 {}", "nohup {}", "command {}", "sudo -u bob {}",
            "env -S {q}", "time {}"]
SHELLS = ["bash -c {q}", "sh -c -- {q}", "bash -o posix -c {q}"]
SEPARATORS = ["; ", " && ", " || ", " | ", "\n", " & "]
ALLOWED = CommandRules(allow=("ls", "echo", "cat", "grep", "git", "true", "wc", "env", "timeout", "nice", "nohup",
                              "command", "sudo", "bash", "sh", "time"))
DENY_RM = CommandRules(deny=("rm",))


def wrap(command: str, wrapper: str) -> str:
    return wrapper.replace("{q}", shlex.quote(command)).replace("{}", command)


@st.composite
def compositions(draw: st.DrawFn, with_rm: bool) -> str:
    commands = draw(st.lists(st.sampled_from([*SIMPLE[:-1], *SYNTAX]), min_size=1, max_size=4))
    if with_rm:
        commands.insert(draw(st.integers(0, len(commands))), SIMPLE[-1])
    for index, command in enumerate(commands):
        wrappers = WRAPPERS + SHELLS if command in SIMPLE else SHELLS
        for wrapper in draw(st.lists(st.sampled_from(wrappers), max_size=2)):
            command = wrap(command, wrapper)
            wrappers = WRAPPERS + SHELLS  # a wrapped command is a simple command
        commands[index] = command
    text = commands[0]
    for command in commands[1:]:
        text += draw(st.sampled_from(SEPARATORS)) + command
    shape = draw(st.sampled_from(["{}", "( {} )", "{{ {}\n}}", "echo \"$( {} )\"", "if true; then {}\nfi"]))
    return shape.format(text)


@settings(max_examples=150, deadline=None)
@given(compositions(with_rm=True))
def test_a_composition_holding_rm_is_denied(command: str) -> None:
    try:
        DENY_RM.check(command)
    except PolicyError as exc:
        assert exc.details["rule"] in ("deny:rm", "unreadable"), exc.message
    else:
        raise AssertionError(f"not denied: {command!r}")


@settings(max_examples=150, deadline=None)
@given(compositions(with_rm=False))
def test_a_composition_of_allowed_commands_passes(command: str) -> None:
    ALLOWED.check(command)
    DENY_RM.check(command)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab rm$(){}[]<>|&;'\"`\\\n=*!#@-0123456789:")), max_size=60))
def test_any_text_is_read_or_refused_and_never_crashes(command: str) -> None:
    parse_command(command)
    try:
        DENY_RM.check(command)
    except PolicyError as exc:
        assert exc.code == "command_denied"
