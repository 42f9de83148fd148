"""Command rules read the parsed command, not substrings; they fail closed, and are advice, not a boundary.

The bypass corpus lists ways around a naive ``"rm -rf" in command`` check.
With a deny rule for ``rm`` every variant whose program can be read is
denied by that rule; the ones the parser cannot read (a program only known at
run time, ``eval``, a shell reading standard input) count as matching every
deny rule; only those that delete with another program pass a deny-only rule
set (documented as advisory). An allow list denies all of them. The sandbox
test (test_bash_sandbox.py) runs the whole corpus and checks nothing outside
the working directory changed. The attacks of issue 14 are in
test_bash_rules_attacks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from bash_helpers import bash_host

from amplifier_tools.builtins.bash.rules import CommandRules, parse_command, parts_of
from amplifier_tools.errors import PolicyError

#: Whether a deny rule on "rm" sees a command: its part ``rm`` ("deny"); it cannot be read and so counts as
#: matching every deny rule ("closed"); or it passes a deny-only rule set ("advisory": another program deletes).
Seen = Literal["deny", "closed", "advisory"]
#: (command with {T} for the target, what a deny rule on "rm" makes of it)
BYPASS_CORPUS: list[tuple[str, Seen]] = [
    ("rm -rf {T}", "deny"),
    ("rm -r -f {T}", "deny"),
    ("rm  -rf   {T}", "deny"),
    ("rm -fr {T}", "deny"),
    ("rm --recursive --force {T}", "deny"),
    ("/bin/rm -rf {T}", "deny"),
    ("\\rm -rf {T}", "deny"),
    ("'rm' -rf {T}", "deny"),
    ('"r"m -rf {T}', "deny"),
    ("r\\m -rf {T}", "deny"),
    ("$'\\x72m' -rf {T}", "deny"),
    ("$'\\162m' -rf {T}", "deny"),
    ("bash -c 'rm -rf {T}'", "deny"),
    ('sh -c "rm -rf {T}"', "deny"),
    ("bash -lc 'rm -rf {T}'", "deny"),
    ("bash -c \"bash -c 'rm -rf {T}'\"", "deny"),
    ("eval 'rm -rf {T}'", "closed"),
    ("env FOO=1 rm -rf {T}", "deny"),
    ("env -i /usr/bin/rm -rf {T}", "deny"),
    ("env -S 'rm -rf {T}'", "deny"),
    ("nice -n 5 rm -rf {T}", "deny"),
    ("timeout -s KILL 10 rm -rf {T}", "deny"),
    ("command rm -rf {T}", "deny"),
    ("exec rm -rf {T}", "deny"),
    ("nohup rm -rf {T}", "deny"),
    ("time rm -rf {T}", "deny"),
    ("sudo -u root rm -rf {T}", "deny"),
    ("busybox rm -rf {T}", "deny"),
    ("FOO=1 rm -rf {T}", "deny"),
    ("2>/dev/null rm -rf {T}", "deny"),
    ("echo x; rm -rf {T}", "deny"),
    ("echo x\nrm -rf {T}", "deny"),
    ("true && rm -rf {T}", "deny"),
    ("false || rm -rf {T}", "deny"),
    ("echo x | rm -rf {T}", "deny"),
    ("rm -rf {T} &", "deny"),
    ("(rm -rf {T})", "deny"),
    ("{ rm -rf {T}; }", "deny"),
    ("echo $(rm -rf {T})", "deny"),
    ("echo `rm -rf {T}`", "deny"),
    ('echo "$(rm -rf {T})"', "deny"),
    ("X=$(rm -rf {T}) true", "deny"),
    ("cat <(rm -rf {T})", "deny"),
    ("echo {T} | xargs rm -rf", "deny"),
    ("find {T} -exec rm -rf {} +", "deny"),
    ("f() { rm -rf {T}; }; f", "deny"),
    ("if true; then rm -rf {T}; fi", "deny"),
    ("for d in {T}; do rm -rf $d; done", "deny"),
    ("while true; do rm -rf {T}; break; done", "deny"),
    ("case x in x) rm -rf {T};; esac", "deny"),
    ("cat <<EOF\n$(rm -rf {T})\nEOF", "closed"),
    ("$(echo rm) -rf {T}", "closed"),
    ("X=rm; $X -rf {T}", "closed"),
    ("/???/r? -rf {T}", "closed"),
    ("{rm,-rf,{T}}", "closed"),
    ("echo 'rm -rf {T}' | sh", "closed"),
    ("bash -c \"$(echo rm) -rf {T}\"", "closed"),
    # Advisory only: another program deletes.
    ("find {T} -delete", "advisory"),
    ("python3 -c 'import shutil; shutil.rmtree(\"{T}\")'", "advisory"),
]
TARGET = "/var/tmp/victim"


def corpus(target: str = TARGET) -> list[tuple[str, bool]]:
    return [(command.replace("{T}", target), visible) for command, visible in BYPASS_CORPUS]


def test_the_bypass_corpus_is_large() -> None:
    assert len(BYPASS_CORPUS) >= 25
    assert sum(seen == "deny" for _, seen in BYPASS_CORPUS) >= 25


@pytest.mark.parametrize(("command", "seen"), corpus())
def test_bypass_variant_against_a_deny_rule(command: str, seen: Seen) -> None:
    rules = CommandRules(deny=("rm",))
    if seen == "advisory":  # documented: a deny list cannot see another program deleting
        rules.check(command)
        return
    with pytest.raises(PolicyError) as info:
        rules.check(command)
    assert info.value.code == "command_denied"
    assert info.value.details["rule"] == "deny:rm" if seen == "deny" else info.value.details["rule"] in (
        "unreadable", "unparsable")


@pytest.mark.parametrize(("command", "seen"), corpus())
def test_every_bypass_variant_is_denied_by_an_allowlist(command: str, seen: Seen) -> None:
    rules = CommandRules(allow=("echo", "true", "false", "cat", "ls"))
    with pytest.raises(PolicyError) as info:
        rules.check(command)
    assert info.value.code == "command_denied"


@pytest.mark.parametrize(("command", "expected"), [
    ("ls -la && git status; echo done", ["ls -la", "git status", "echo done"]),
    ("a | b |& c || d & e", ["a", "b", "c", "d", "e"]),
    # A wrapper is a part, and so is each command it runs (a deny rule on "sudo" must see sudo).
    ("/usr/bin/env -i nice -n5 \\rm -r -f /", ["env -i nice -n5 rm -r -f /", "nice -n5 rm -r -f /", "rm -r -f /"]),
    ("sudo -u bob timeout 5 xargs -I{} cp {} /x", ["sudo -u bob timeout 5 xargs -I{} cp {} /x",
                                                   "timeout 5 xargs -I{} cp {} /x", "xargs -I{} cp {} /x",
                                                   "cp {} /x"]),
    ("cat > out.txt <<'EOF'\n$(not a command)\nEOF\necho ok", ["cat", "echo ok"]),
    ("echo $((1 + (2 * 3))); ls", ["echo $((1 + (2 * 3)))", "ls"]),
    ("[[ -f x ]] && make", ["make"]),
    ("ls 2>&1 >/dev/null | grep -v x", ["ls", "grep -v x"]),
    ("case $x in a) rm x;; b|c) ls;; esac", ["rm x", "ls"]),
    ("echo \"$HOME/a\" 'b c'", ["echo \"$HOME/a\" b c"]),
])
def test_compound_commands_split_into_parts(command: str, expected: list[str]) -> None:
    assert [p.strip() for p in parts_of(command)] == expected


@pytest.mark.parametrize("command", ["echo 'unterminated", 'echo "open', "echo $(ls", "if true; then ls",
                                     "ls &&", "echo )"])
def test_unparsable_command_is_denied_by_any_rule(command: str) -> None:
    assert parse_command(command).error is not None
    with pytest.raises(PolicyError) as info:
        CommandRules(allow=("echo", "cat", "ls")).check(command)
    assert info.value.details["rule"] == "unparsable"
    with pytest.raises(PolicyError) as info:  # fail closed: it counts as matching every deny rule
        CommandRules(deny=("rm",)).check(command)
    assert info.value.details["rule"] == "unparsable"
    assert "[plugins.bash] deny" in info.value.message


def test_without_rules_nothing_is_parsed_or_refused() -> None:
    rules = CommandRules()
    for command in ["echo 'unterminated", "eval x", "x='a[$(rm x)]'; [[ x -eq 0 ]]", "$(echo rm) -rf /"]:
        assert rules.check(command).parts == ()


def test_pattern_with_spaces_matches_the_whole_part() -> None:
    rules = CommandRules(deny=("git push*",))
    rules.check("git status && git commit -m x")
    with pytest.raises(PolicyError) as info:
        rules.check("git status && env GIT_X=1 git push --force origin main")
    assert info.value.details == {"rule": "deny:git push*", "part": "git push --force origin main"}


def test_deny_wins_over_allow() -> None:
    rules = CommandRules(allow=("git",), deny=("git push*",))
    rules.check("git log")
    with pytest.raises(PolicyError):
        rules.check("git push")


def test_parser_never_raises_on_odd_input() -> None:
    for command in ["", ";;;", "((", "))", "$(", "`", "\\", "$'\\", "<<", "a <", "${", "$((1", "f() {", "\x00"]:
        parse_command(command)


async def test_denied_command_is_a_policy_error_naming_rule_and_part_and_never_runs(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, deny=["rm", "curl"])
    try:
        (tmp_path / "keep").write_text("x")
        result = await host.call("bash", {"command": "ls; bash -c 'rm -f keep'"})
        assert not result.success
        assert result.error["type"] == "PolicyError" and result.error["code"] == "command_denied"
        assert result.error["rule"] == "deny:rm" and result.error["part"] == "rm -f keep"
        assert (tmp_path / "keep").exists()
        assert (await host.call("bash", {"command": "echo fine"})).success
    finally:
        await host.close()


async def test_an_unreadable_command_is_refused_by_the_tool_with_the_reason_and_never_runs(tmp_path: Path) -> None:
    host = await bash_host(tmp_path, deny=["rm"])
    try:
        result = await host.call("bash", {"command": "x='a[$(touch marker)]'; [[ x -eq 0 ]]"})
        assert not result.success
        assert result.error["type"] == "PolicyError" and result.error["code"] == "command_denied"
        assert result.error["rule"] == "unreadable"
        assert "variable 'x' in an arithmetic expression" in result.error["reason"]
        assert "[plugins.bash] deny" in result.error["message"]
        assert not (tmp_path / "marker").exists()
    finally:
        await host.close()


async def test_without_rules_the_tool_does_not_refuse_what_the_parser_cannot_read(tmp_path: Path) -> None:
    host = await bash_host(tmp_path)
    try:
        result = await host.call("bash", {"command": "x='$(echo hi)'; echo ${x@P}"})
        assert result.error is None or result.error["code"] != "command_denied"
    finally:
        await host.close()
