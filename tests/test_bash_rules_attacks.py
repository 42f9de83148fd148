"""Issue 14, finding 5: command-rule bypasses that ran a command the old reader never saw.

Each attack is checked twice: real bash runs it and the hidden ``touch`` happens
(so the construct is a real way to run a command, on this bash), and the rules
deny it — an allow list because the hidden command is not allowed or cannot be
read, a deny list because the hidden command is denied or, unreadable, counts
as matching every deny rule.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bash_helpers import runs_hidden_command

from amplifier_tools.builtins.bash.rules import CommandRules, parse_command
from amplifier_tools.errors import PolicyError

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
#: What a restrictive allow list would hold; every attack hides a ``touch`` from it.
ALLOW = CommandRules(allow=("ls", "echo", "cat", "true", "printf", "env", "bash", "git"))
DENY = CommandRules(deny=("touch",))

#: Attacks that ran a command while the allow list saw only allowed ones ({M}: the marker file).
ALLOW_BYPASSES = [
    "((ls<<2))\ntouch {M}",
    "echo $[1<<2]\ntouch {M}",
    "x='a[$(touch {M})]'; [[ x -eq 0 ]]",
    "((ls[$(touch {M})]))",
    "x='$(touch {M})'; echo ${x@P}",
    "cat <<EOF\n$(touch {M})\nEOF",
    "read x <<< 'a[$(touch {M})]'; echo $((x))",
    "echo 'a[$(touch {M})]'; ((_))",
    "declare -i x; x='a[$(touch {M})]'",
    "declare -n r='a[$(touch {M})]'; echo $r",
    "x='a[$(touch {M})]'; echo ${!x}",
    "[[ -v 'a[$(touch {M})]' ]]",
]
#: Attacks that ran a denied command past a deny rule.
DENY_MISSES = [
    "{fd}>/dev/null touch {M}",
    "env --split-string='touch {M}'",
    "env -vS 'touch {M}'",
    "bash -o posix -c 'touch {M}'",
    "bash -c -- 'touch {M}'",
    "bash -c -o posix -- 'touch {M}'",
    "bash -c \"trap 'touch {M}' EXIT\"",
    "bash -c 'coproc touch {M}; wait'",
    "printf -v 'a[$(touch {M})]' 1",
    "x='a[$(touch {M})]'; [[ x -eq 0 ]]",
]
#: Found while building the parser: more ways to run a command the old reader did not see.
REVIEW_FINDINGS = [
    "mapfile -C 'touch {M} #' -c 1 a <<< x",
    "compgen -C 'touch {M}' w",
    "jobs -x touch {M}",
    "tou\\\nch {M}",
    "env foo='a[$(touch {M})]' bash -c '((foo))'",
    "$\"touch\" {M}",
    "a=(); echo ${a['$(touch {M})']}",
]
#: Found by the review of the merged parser: env assignments that are not shell names, or that bash obeys.
ENV_FINDINGS = [
    "env X-Y=1 touch {M}",
    "env 'BASH_FUNC_ls%%=() { touch {M}; }' bash -c ls",
]
#: Where tree-sitter's grammar reads bash differently (the old reader got these right; they must stay right).
GRAMMAR_GAPS = [
    "time { touch {M}; }",
    "exec 3>&1 touch {M}",
    "true 2>/dev/null; ls >/dev/null 2>&1 && exec 2>&1 touch {M}",
    "cat <<EOF touch {M}\nx\nEOF\nexec 2>/dev/null touch {M}",
]


@needs_bash
@pytest.mark.parametrize("template", ALLOW_BYPASSES + DENY_MISSES + REVIEW_FINDINGS + ENV_FINDINGS + GRAMMAR_GAPS)
def test_the_attack_runs_a_hidden_command_in_real_bash(template: str, tmp_path: Path) -> None:
    assert runs_hidden_command(template, tmp_path)


@pytest.mark.parametrize("template", ALLOW_BYPASSES + DENY_MISSES + REVIEW_FINDINGS + ENV_FINDINGS + GRAMMAR_GAPS)
def test_an_allow_list_denies_the_attack(template: str) -> None:
    with pytest.raises(PolicyError) as info:
        ALLOW.check(template.replace("{M}", "/tmp/m"))
    assert info.value.code == "command_denied"
    assert "[plugins.bash] allow" in info.value.message


@pytest.mark.parametrize("template", ALLOW_BYPASSES + DENY_MISSES + REVIEW_FINDINGS + ENV_FINDINGS + GRAMMAR_GAPS)
def test_a_deny_rule_denies_the_attack(template: str) -> None:
    with pytest.raises(PolicyError) as info:
        DENY.check(template.replace("{M}", "/tmp/m"))
    assert info.value.code == "command_denied"
    assert info.value.details["rule"] in ("deny:touch", "unreadable")


@pytest.mark.parametrize(("command", "what"), [
    ("x='a[$(touch m)]'; [[ x -eq 0 ]]", "variable 'x' in an arithmetic expression"),
    ("((ls[$(touch m)]))", "command substitution inside an array subscript"),
    ("echo $(( $(touch m) + 1 ))", "command substitution inside an arithmetic expression"),
    ("x='$(touch m)'; echo ${x@P}", "transformation"),
    ("cat <<EOF\n$(touch m)\nEOF", "command substitution inside a here-document"),
    ("echo ${x:-$(touch m)}", "command substitution inside a parameter expansion"),
    ("printf -v 'a[$(touch m)]' 1", "array subscript in a variable name given to printf"),
    ("trap 'touch m' EXIT", "trap"),
    ("coproc touch m", "coproc"),
    ("eval 'touch m'", "eval"),
    ("source ./x.sh", "source"),
    ("PATH=.:$PATH ls", "assignment to PATH"),
    ("env LD_AUDIT=/tmp/x.so ls", "env sets LD_AUDIT"),
    ("env BASH_FUNC_ls%%='() { :; }' bash -c ls", "env sets BASH_FUNC_ls%%"),
    # bash runs PS4 under xtrace; it reads PS4 from the environment only when not running as root
    ("env PS4='$(touch m)' SHELLOPTS=xtrace bash -c true", "env sets PS4"),
    ("$(echo touch) m", "program name is only known at run time"),
    ("bash -c \"$cmd\"", "command string is only known at run time"),
    ("bash script.sh", "script file"),
    ("echo 'touch m' | sh", "standard input"),
    ("env -S \"$cmd\"", "only known at run time"),
    ("xargs -I{} {} m", "xargs runs a program read from its input"),
    ("find . -exec {} \\;", "find -exec runs a program"),
    ("timeout --frobnicate 5 touch m", "timeout option '--frobnicate' is not known"),
])
def test_a_fail_closed_denial_says_what_could_not_be_read(command: str, what: str) -> None:
    with pytest.raises(PolicyError) as info:
        CommandRules(deny=("rm",)).check(command)
    assert info.value.details["rule"] == "unreadable"
    assert what in info.value.message and what in info.value.details["reason"]
    assert "treated as matching every deny rule" in info.value.message
    assert "[plugins.bash] deny" in info.value.message


@pytest.mark.parametrize("command", [
    "{fd}>/dev/null touch m",
    "env FOO=1 touch m",
    "env -i -u HOME touch m",
    "timeout 5 touch m",
    "timeout -k 1 --signal=KILL 5 touch m",
    "nice -n 5 touch m",
    "nice -5 touch m",
    "nohup touch m",
    "command touch m",
    "builtin command touch m",
    "sudo -E -u root touch m",
    "xargs -0 -n1 touch",
    "find . -name x -exec touch {} \\;",
    "bash -c 'touch m'",
    "bash -xec 'bash -c \"touch m\"'",
    "sh -c -- 'echo ok; touch m'",
    "su -c 'touch m' root",
    "flock /tmp/lock -c 'touch m'",
    "exec 3>/dev/null; touch m",
    "env -S 'nice -n 1 touch' m",
    "watch -n 1 touch m",
    "watch -x touch m",
])
def test_a_readable_wrapper_has_its_inner_command_checked(command: str) -> None:
    with pytest.raises(PolicyError) as info:
        DENY.check(command)
    assert info.value.details["rule"] == "deny:touch"


@pytest.mark.parametrize("command", [
    "git -C . push",
    "git --no-pager push origin main",
    "git -c k=v push",
    "git -c user.name=x -C /repo --no-pager push --force",
    "git --git-dir=.git --work-tree=. push",
    "git --git-dir .git push",
    "git -P push",
    "cd repo && git -C sub push",
])
def test_a_deny_rule_on_a_git_subcommand_sees_past_global_options(command: str) -> None:
    with pytest.raises(PolicyError) as info:
        CommandRules(deny=("git push*",)).check(command)
    assert info.value.details["rule"] == "deny:git push*"
    assert "command word 'git'" in info.value.message


@pytest.mark.parametrize("command", ["git status", "git -C push status", "git -c push=1 log", "git log --grep push"])
def test_a_git_option_value_is_not_a_subcommand(command: str) -> None:
    CommandRules(deny=("git push*",)).check(command)


def test_an_allowed_git_subcommand_with_a_config_option_matches_only_as_written() -> None:
    rules = CommandRules(allow=("git status*",))
    rules.check("git -C repo --no-pager status")
    with pytest.raises(PolicyError) as info:  # -c can make git run any program (alias.x=!cmd, core.pager)
        rules.check("git -c core.pager='touch m' status")
    assert info.value.details["rule"] == "not_allowed"


def test_a_wrapper_is_checked_as_well_as_what_it_runs() -> None:
    with pytest.raises(PolicyError) as info:
        CommandRules(deny=("sudo",)).check("sudo -u root ls")
    assert info.value.details == {"rule": "deny:sudo", "part": "sudo -u root ls"}
    with pytest.raises(PolicyError) as info:
        CommandRules(allow=("ls",)).check("sudo ls")
    assert info.value.details["part"] == "sudo ls"
    CommandRules(allow=("ls", "timeout")).check("timeout 5 ls -la")


def test_an_allow_rule_names_the_program_in_the_system_directories_only() -> None:
    rules = CommandRules(allow=("ls", "./build.sh"))
    rules.check("/usr/bin/ls -la && ls && ./build.sh")
    for command in ("./ls", "/tmp/ls", "~/bin/ls", "bin/ls"):
        with pytest.raises(PolicyError) as info:
            rules.check(command)
        assert info.value.details["rule"] == "not_allowed"
        assert "program" in info.value.message and "[plugins.bash] allow" in info.value.message


@pytest.mark.parametrize("command", [
    "for ((i=0; i<3; i++)); do echo $i; done",
    "n=3; echo $((n * 2)) $[n + 1]",
    "((count += 2)); echo $count",
    "let x=1+2; echo $((x))",
    "echo $(( $# + $? ))",
    "a=(1 2 3); echo ${a[1]} ${a[@]} ${#a[@]}",
    "[[ 3 -eq 3 ]] && echo ok",
    "x=5; [[ $x -gt 2 ]] && echo ok",
    "echo ${HOME:-/root} ${x:1:2}",
])
def test_integer_only_arithmetic_stays_readable(command: str) -> None:
    parsed = parse_command(command)
    assert parsed.error is None and parsed.unreadable == (), parsed.unreadable
    CommandRules(allow=("echo", "let")).check(command)


def test_a_denial_names_the_rule_and_the_command_word() -> None:
    with pytest.raises(PolicyError) as info:
        CommandRules(deny=("rm",)).check("ls; timeout 5 /bin/rm -rf x")
    message = info.value.message
    assert "deny rule 'rm'" in message and "command word 'rm'" in message and "[plugins.bash] deny" in message
    with pytest.raises(PolicyError) as info:
        CommandRules(allow=("ls",)).check("ls; curl x")
    assert info.value.details == {"rule": "not_allowed", "part": "curl x"}
    assert "command word 'curl'" in info.value.message and "[plugins.bash] allow" in info.value.message


@pytest.mark.parametrize("command", [
    'n=$(wc -l < f); [ "$n" -gt 5 ] && echo big',
    "n=$(wc -l < f); test $n -gt 5 && echo big",
    "cat > f <<EOF\n$HOME ${USER}\nEOF",
    "cat > f.py <<'EOF'\nprint($(x))\nEOF",
    "for f in $(ls); do echo $f; done",
    "find . -name '*.py' | xargs grep -n foo",
    "git commit -m \"fix: x (y)\" && git log --oneline -n 5 | cat",
    "printf '[%s]\\n' a && read -p 'ok [y/n] ' a",
])
def test_common_commands_are_not_refused_by_a_deny_list(command: str) -> None:
    parsed = CommandRules(deny=("rm",)).check(command)
    assert parsed.unreadable == () and parsed.error is None


@pytest.mark.parametrize("command", ["echo x; " * 8000, "((" + "1+" * 30000 + "1))", "x" * (64 * 1024 + 1)])
def test_a_huge_command_is_refused_unread_in_bounded_time(command: str) -> None:
    with pytest.raises(PolicyError) as info:
        CommandRules(deny=("rm",)).check(command)
    assert info.value.details["rule"] == "unreadable"
    assert any(w in info.value.details["reason"] for w in ("syntax nodes", "nested too deeply", "longer than"))
