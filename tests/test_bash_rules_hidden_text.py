"""Command-rule bypasses through text the grammar does not parse, and variables assigned by name.

tree-sitter's bash grammar keeps most operands of a ``${…}`` parameter expansion
(after ``#``, ``%``, ``^``, ``,``; backticks and ``<(…)`` after ``:-``, ``=``,
``?``) as plain text, and the keys of a compound array assignment as plain
words; builtins (``read``, ``printf -v``, ``mapfile``, quoted ``declare``
arguments, ``for``) assign variables by name without a ``NAME=`` node. Each attack
is checked as in ``test_bash_rules_attacks``: real bash runs the hidden ``touch``,
and both an allow list of harmless programs and a deny rule on ``touch`` refuse it
as unreadable. Plain expansions stay readable.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bash_helpers import runs_hidden_command

from amplifier_tools.builtins.bash.rules import CommandRules
from amplifier_tools.errors import PolicyError

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
#: The docs' hardened allow list and the harmless builtins the attacks use; none of them is touch.
ALLOW = CommandRules(allow=("ls", "cat", "grep", "git", "python*", "pytest", "make", "echo", "true", "set", "read",
                            "printf", "mapfile", "readarray", "export", "declare", "bash", ":", "getopts", "wait",
                            "let", "cp", "shopt", "command"))
DENY = CommandRules(deny=("touch",))

#: A substitution inside ``${…}`` that the grammar keeps as text ({M}: the marker file).
PARAMETER_EXPANSIONS = [
    *(f"ls ${{x{op}`touch {{M}}`}}" for op in (":-", ":=", "-", "=", "?", ":?")),
    *(f"x=a; ls ${{x{op}`touch {{M}}`}}" for op in ("#", "%%", "^", ",,")),
    "x=a; ls ${x/a/`touch {M}`}",
    "x=a; ls ${x:+`touch {M}`}",
    "ls \"${x:-`touch {M}`}\"",
    "ls ${x:-`touch {M}` }",
    "ls > ${x:-`touch {M}`}",
    *(f"x=a; ls ${{x{op}$(touch {{M}})}}" for op in ("#", "##", "%", "%%", "^^", ",")),
    "x=a; ls \"${x#$(touch {M})}\"",
    "x=a; ls \"${x%%$(touch {M})}\"",
    "ls ${x:-<(touch {M})}",
    "ls ${x:->(touch {M})}",
    "x=a; ls ${x#<(touch {M})}",
    "ls ${x:-${y:-`touch {M}`}}",
    "y=a; ls ${x:-${y#$(touch {M})}}",
    "ls `echo ${x:-\\`touch {M}\\`}`",
]
#: A variable that changes what runs (PS4, BASH_ENV, ...) assigned by a builtin or loop, not by ``NAME=``.
BY_NAME_ASSIGNMENTS = [
    "read PS4 <<< '$(touch {M})'; set -x; true",
    "IFS= read -r PS4 <<< '$(touch {M})'; set -x; true",
    "printf -v PS4 '$(touch {M})'; set -x; true",
    "printf -vPS4 '$(touch {M})'; set -x; true",
    "mapfile -t PS4 <<< '$(touch {M})'; set -x; true",
    "readarray -t PS4 <<< '$(touch {M})'; set -x; true",
    "declare 'PS4=$(touch {M})'; set -x; true",
    "export 'PS4=$(touch {M})'; set -x; true",
    "for PS4 in '$(touch {M})'; do set -x; true; done",
    "echo 'touch {M}' > ev; read BASH_ENV <<< ./ev; export BASH_ENV; bash -c true",
    "echo 'touch {M}' > ev; printf -v BASH_ENV ./ev; export BASH_ENV; bash -c true",
    "echo 'touch {M}' > ev; : ${BASH_ENV:=./ev}; export BASH_ENV; bash -c true",
    # Found by a second attack: a name quoted in part is one word to bash, two to the grammar;
    # and the command hash table and aliases are variables too.
    "declare P''S4='$(touch {M})'; set -x; true",
    "declare PS\"4\"='$(touch {M})'; set -x; true",
    "echo 'touch {M}' > ev; export B\"ASH_ENV\"=./ev; bash -c true",
    "BASH_CMDS[ls]=$(command -v touch); ls {M}",
    "BASH_CMDS+=([cat]=$(command -v touch)); cat {M}",
    "shopt -s expand_aliases; BASH_ALIASES[ls]='touch {M}'\nls",
]
#: An indexed array's ``[key]=`` is arithmetic: a variable holding ``a[$(…)]`` runs the command.
ARRAY_KEYS = [
    "y='a[$(touch {M})]'; a=([y]=1)",
    "y='a[$(touch {M})]'; a+=([y]=1)",
    "y='a[$(touch {M})]'; a=([y]+=1)",
    "y='a[$(touch {M})]'; a=([1]=2 [y]=1)",
    "y='a[$(touch {M})]'; declare -a a=([y]=1)",
    "y='a[$(touch {M})]'; a=(['y']=1)",
    "y='a[$(touch {M})]'; a=([\"y\"]=1)",
    "y='a[$(touch {M})]'; a=([$y]=1)",
    "y='a[$(touch {M})]'; a=([${y}]=1)",
    "y='a[$(touch {M})]'; ls; a=([y]=1)",
    "read y <<< 'a[$(touch {M})]'; a=([y]=1)",
]
ATTACKS = PARAMETER_EXPANSIONS + BY_NAME_ASSIGNMENTS + ARRAY_KEYS
#: Assignments by name to a variable that changes what runs, whose effect needs more setup to show.
RUN_CHANGING_BY_NAME = [
    "read PATH <<< /tmp; ls",
    "printf -v PATH /tmp; ls",
    "read -a PS4 <<< x; set -x; true",
    "read -r -d '' PS4 <<< x",
    "getopts ab: PS4 -b x",
    "wait -p PS4",
    "read PROMPT_COMMAND <<< 'touch m'",
    "read ENV <<< ./ev; export ENV",
    "read LD_PRELOAD <<< ./x.so; export LD_PRELOAD; ls",
    "read 'PS4[0]' <<< x",
    "export 'BASH_ENV=./ev'; bash -c true",
    "typeset 'PATH=.'; ls",
    "select PS4 in x; do break; done",
    "let PATH=0; ls",
    "let x=1,PATH=0; ls",
    "(( PATH = 0 )); ls",
    ": $(( BASH_ENV = 1 ))",
    ": ${PATH:=.}; ls",
    "read \"$n\" <<< x",
]


@needs_bash
@pytest.mark.parametrize("template", ATTACKS)
def test_the_attack_runs_a_hidden_command_in_real_bash(template: str, tmp_path: Path) -> None:
    assert runs_hidden_command(template, tmp_path)


@pytest.mark.parametrize("template", ATTACKS)
def test_an_allow_list_refuses_the_attack_as_unreadable(template: str) -> None:
    with pytest.raises(PolicyError) as info:
        ALLOW.check(template.replace("{M}", "/tmp/m"))
    assert info.value.code == "command_denied"
    assert info.value.details["rule"] == "unreadable"
    assert "[plugins.bash] allow" in info.value.message


@pytest.mark.parametrize("template", ATTACKS)
def test_a_deny_rule_refuses_the_attack_as_unreadable(template: str) -> None:
    with pytest.raises(PolicyError) as info:
        DENY.check(template.replace("{M}", "/tmp/m"))
    assert info.value.code == "command_denied"
    assert info.value.details["rule"] == "unreadable"


@pytest.mark.parametrize("command", RUN_CHANGING_BY_NAME)
def test_a_variable_that_changes_what_runs_assigned_by_name_is_unreadable(command: str) -> None:
    for rules in (ALLOW, DENY):
        with pytest.raises(PolicyError) as info:
            rules.check(command)
        assert info.value.details["rule"] == "unreadable"


@pytest.mark.parametrize(("command", "what"), [
    ("ls ${x:-`touch m`}", "command substitution inside a parameter expansion"),
    ("x=a; ls ${x#$(touch m)}", "command substitution inside a parameter expansion"),
    ("ls ${x:-<(touch m)}", "command substitution inside a parameter expansion"),
    ("read PS4 <<< x", "read assigns PS4"),
    ("printf -v BASH_ENV ./ev", "printf assigns BASH_ENV"),
    ("mapfile -t PS4 < f", "mapfile assigns PS4"),
    ("declare 'PS4=x'", "declare assigns PS4"),
    ("for PS4 in x; do :; done", "a loop assigns PS4"),
    (": ${BASH_ENV:=./ev}", "assignment to BASH_ENV"),
    ("let PATH=0", "let uses PATH"),
    ("(( PATH = 0 ))", "PATH inside an arithmetic expression"),
    ("y='a[$(touch m)]'; a=([y]=1)", "variable 'y' in an arithmetic expression"),
    ("a=(['y']=1)", "array subscript in a compound assignment"),
])
def test_the_denial_says_what_could_not_be_read(command: str, what: str) -> None:
    with pytest.raises(PolicyError) as info:
        DENY.check(command)
    assert info.value.details["rule"] == "unreadable"
    assert what in info.value.details["reason"]


@pytest.mark.parametrize("command", [
    "echo ${HOME:-/tmp}",
    "ls ${dir}/x",
    "ls \"${dir:-.}\"/x",
    "git log --format=%H",
    "cp ${src%.c}.o out/",
    "echo ${x#*/} ${x##*/} ${x%/*} ${x%%.*} ${x/a/b} ${x//a/$y} ${x^^} ${x,} ${#x} ${x:0:3}",
    "echo ${x:-\"default value\"} ${x:=5} ${x:+set} ${x-$HOME}",
    "echo ${x:-${y:-z}}",
    "read -r line < f; echo \"$line\"",
    "printf -v out %s x; echo \"$out\"",
    "mapfile -t lines < f",
    "export FOO=bar; export PATH; declare -a arr=(1 2)",
    "for f in a b; do cat \"$f\"; done",
    "a=(1 2 3); a=([0]=x [1]=y); echo ${a[@]}",
    "i=0; a=([i]=x [i+1]=y [10#1]=z)",
])
def test_plain_expansions_and_assignments_stay_readable(command: str) -> None:
    ALLOW.check(command)
    DENY.check(command)


@pytest.mark.parametrize("command", ['echo $"hello"', 'TEXTDOMAINDIR=./loc; TEXTDOMAIN=t; echo $"hello"',
                                     'x=$"hi"; echo "$x"', 'echo x$"y"z', 'ls "$(echo $"a")"'])
def test_a_translated_string_is_unreadable(command: str) -> None:
    """Found by attack: bash replaces ``$"…"`` by its translation from a message catalog the command
    may have written (``TEXTDOMAINDIR``), and expands ``$(…)`` in it: ``touch`` ran past a deny rule."""
    for rules in (ALLOW, DENY):
        with pytest.raises(PolicyError) as info:
            rules.check(command)
        assert info.value.details["rule"] == "unreadable" and "translates at run time" in info.value.message


@pytest.mark.parametrize("command", ['echo "$"', "echo '$\"x'", 'echo "price: $"', 'echo "$HOME"'])
def test_a_dollar_next_to_a_quote_that_is_no_translation_stays_readable(command: str) -> None:
    DENY.check(command)
