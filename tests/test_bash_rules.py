"""Command rules read the parsed command, not substrings; and they are advice, not a boundary.

The bypass corpus lists ways around a naive ``"rm -rf" in command`` check.
With a deny rule for ``rm`` every variant whose program can be read is
denied; the ones whose program is only known at run time (or that delete
with another program) pass a deny-only rule set — documented as advisory —
and are all denied by an allowlist. The sandbox test (test_bash_sandbox.py)
runs the whole corpus and checks nothing outside the working directory
changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bash_helpers import bash_host

from amplifier_tools.builtins.bash.rules import CommandRules, parse_command, parts_of
from amplifier_tools.errors import PolicyError

#: (command with {T} for the target, whether a deny rule on "rm" can see it)
BYPASS_CORPUS: list[tuple[str, bool]] = [
    ("rm -rf {T}", True),
    ("rm -r -f {T}", True),
    ("rm  -rf   {T}", True),
    ("rm -fr {T}", True),
    ("rm --recursive --force {T}", True),
    ("/bin/rm -rf {T}", True),
    ("\\rm -rf {T}", True),
    ("'rm' -rf {T}", True),
    ('"r"m -rf {T}', True),
    ("r\\m -rf {T}", True),
    ("$'\\x72m' -rf {T}", True),
    ("$'\\162m' -rf {T}", True),
    ("bash -c 'rm -rf {T}'", True),
    ('sh -c "rm -rf {T}"', True),
    ("bash -lc 'rm -rf {T}'", True),
    ("bash -c \"bash -c 'rm -rf {T}'\"", True),
    ("eval 'rm -rf {T}'", True),
    ("env FOO=1 rm -rf {T}", True),
    ("env -i /usr/bin/rm -rf {T}", True),
    ("env -S 'rm -rf {T}'", True),
    ("nice -n 5 rm -rf {T}", True),
    ("timeout -s KILL 10 rm -rf {T}", True),
    ("command rm -rf {T}", True),
    ("exec rm -rf {T}", True),
    ("nohup rm -rf {T}", True),
    ("time rm -rf {T}", True),
    ("sudo -u root rm -rf {T}", True),
    ("busybox rm -rf {T}", True),
    ("FOO=1 rm -rf {T}", True),
    ("2>/dev/null rm -rf {T}", True),
    ("echo x; rm -rf {T}", True),
    ("echo x\nrm -rf {T}", True),
    ("true && rm -rf {T}", True),
    ("false || rm -rf {T}", True),
    ("echo x | rm -rf {T}", True),
    ("rm -rf {T} &", True),
    ("(rm -rf {T})", True),
    ("{ rm -rf {T}; }", True),
    ("echo $(rm -rf {T})", True),
    ("echo `rm -rf {T}`", True),
    ('echo "$(rm -rf {T})"', True),
    ("X=$(rm -rf {T}) true", True),
    ("cat <(rm -rf {T})", True),
    ("echo {T} | xargs rm -rf", True),
    ("find {T} -exec rm -rf {} +", True),
    ("f() { rm -rf {T}; }; f", True),
    ("if true; then rm -rf {T}; fi", True),
    ("for d in {T}; do rm -rf $d; done", True),
    ("while true; do rm -rf {T}; break; done", True),
    ("cat <<EOF\n$(rm -rf {T})\nEOF", True),
    # Advisory only: the program is decided at run time, or another program deletes.
    ("$(echo rm) -rf {T}", False),
    ("X=rm; $X -rf {T}", False),
    ("/???/r? -rf {T}", False),
    ("{rm,-rf,{T}}", False),
    ("echo 'rm -rf {T}' | sh", False),
    ("bash -c \"$(echo rm) -rf {T}\"", False),
    ("find {T} -delete", False),
    ("python3 -c 'import shutil; shutil.rmtree(\"{T}\")'", False),
]
TARGET = "/var/tmp/victim"


def corpus(target: str = TARGET) -> list[tuple[str, bool]]:
    return [(command.replace("{T}", target), visible) for command, visible in BYPASS_CORPUS]


def test_the_bypass_corpus_is_large() -> None:
    assert len(BYPASS_CORPUS) >= 25
    assert sum(visible for _, visible in BYPASS_CORPUS) >= 25


@pytest.mark.parametrize(("command", "visible"), corpus())
def test_bypass_variant_against_a_deny_rule(command: str, visible: bool) -> None:
    rules = CommandRules(deny=("rm",))
    if visible:
        with pytest.raises(PolicyError) as info:
            rules.check(command)
        assert info.value.code == "command_denied" and info.value.details["rule"] == "deny:rm"
    else:  # documented as advisory: a deny-only rule set cannot see these
        rules.check(command)


@pytest.mark.parametrize(("command", "visible"), corpus())
def test_every_bypass_variant_is_denied_by_an_allowlist(command: str, visible: bool) -> None:
    rules = CommandRules(allow=("echo", "true", "false", "cat", "ls"))
    with pytest.raises(PolicyError) as info:
        rules.check(command)
    assert info.value.code == "command_denied"


@pytest.mark.parametrize(("command", "expected"), [
    ("ls -la && git status; echo done", ["ls -la", "git status", "echo done"]),
    ("a | b |& c || d & e", ["a", "b", "c", "d", "e"]),
    ("/usr/bin/env -i nice -n5 \\rm -r -f /", ["rm -r -f /"]),
    ("sudo -u bob timeout 5 xargs -I{} cp {} /x", ["cp {} /x"]),
    ("cat > out.txt <<'EOF'\n$(not a command)\nEOF\necho ok", ["cat", "echo ok"]),
    ("echo $((1 + (2 * 3))); ls", ["echo", "ls"]),
    ("[[ -f x ]] && make", ["make"]),
    ("ls 2>&1 >/dev/null | grep -v x", ["ls", "grep -v x"]),
])
def test_compound_commands_split_into_parts(command: str, expected: list[str]) -> None:
    assert [p.strip() for p in parts_of(command)] == expected


@pytest.mark.parametrize("command", ["echo 'unterminated", 'echo "open', "echo $(ls", "case x in a) rm x;; esac",
                                     "cat <<EOF\nno end"])
def test_unparsable_command_is_denied_when_an_allow_rule_exists(command: str) -> None:
    assert parse_command(command).error is not None
    with pytest.raises(PolicyError) as info:
        CommandRules(allow=("echo", "cat")).check(command)
    assert info.value.details["rule"] == "unparsable"
    CommandRules(deny=("rm",)).check(command)  # deny-only: advisory, passes to bash (which may reject it)


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
