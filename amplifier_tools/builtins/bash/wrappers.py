"""Wrapper programs: the command a wrapper (``env``, ``timeout``, ``sudo``, ``bash -c`` …) will run.

``unwrap`` takes the words of one simple command and returns every argv that
will run (the wrapper itself and the command inside it), the shell strings
that will run (``bash -c STRING``, ``env -S STRING``), or why the inner
command cannot be read (an unknown option, a program only known at run time,
a shell reading a script file or standard input). The option tables follow
GNU coreutils, util-linux, findutils, sudo and bash.

Limits: only the wrappers listed here are unwrapped; any other program that
runs a command it is given (``ssh``, ``watch``, ``parallel``, ``make``,
``python -c``) is a plain part whose arguments are not read as a command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import Final

import attrs

MAX_WRAPPERS: Final = 16
SHELLS: Final = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "rbash"})
#: Variables that change what a later command runs: the search path and what it skips, the
#: dynamic loader, the startup files, prompts and options bash expands or obeys, exported
#: functions (``BASH_FUNC_name%%``, which bash imports as a function that shadows a command), and
#: the command hash table and aliases (``BASH_CMDS[ls]=/usr/bin/rm`` is ``hash -p``, found by
#: attack; ``BASH_ALIASES`` is ``alias``).
_RUN_CHANGING_VARIABLE: Final = re.compile(
    r"^(PATH|EXECIGNORE|BASH_ENV|ENV|PS[0-4]|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|BASH_LOADABLES_PATH|LD_[A-Z_]*"
    r"|GCONV_PATH|BASH_FUNC_.*|BASH_CMDS|BASH_ALIASES)$")


def changes_what_runs(variable: str) -> bool:
    """Whether setting ``variable`` (in the shell or through ``env``) changes what later commands run."""
    return _RUN_CHANGING_VARIABLE.match(variable) is not None


@attrs.frozen
class Word:
    """One shell word after quote removal; ``dynamic`` when bash would expand it at run time
    (then ``text`` is its source text)."""

    text: str
    dynamic: bool = False


@attrs.frozen
class WrapperSpec:
    """How a wrapper's own arguments end and its command begins.

    ``with_arg``: options taking a separate argument (``-n 5``; ``-n5``/``--x=5`` are handled);
    ``flags``: options without one (any other option makes the command unreadable);
    ``operands``: words before the command (``timeout DURATION``);
    ``no_command``: options after which no command runs (``command -v``);
    ``string``: options whose argument is a shell command string (``su -c``).
    """

    with_arg: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    operands: int = 0
    no_command: frozenset[str] = frozenset()
    string: frozenset[str] = frozenset()
    assignments: bool = False


def _spec(with_arg: str = "", flags: str = "", operands: int = 0, no_command: str = "", string: str = "",
          assignments: bool = False) -> WrapperSpec:
    return WrapperSpec(frozenset(with_arg.split()), frozenset(flags.split()), operands, frozenset(no_command.split()),
                       frozenset(string.split()), assignments)


WRAPPERS: Final[dict[str, WrapperSpec]] = {
    "env": _spec("-u --unset -C --chdir -S --split-string", "-i --ignore-environment -0 --null -v --debug "
                 "--block-signal --default-signal --ignore-signal --list-signal-handling -",
                 string="-S --split-string", assignments=True),
    "nice": _spec("-n --adjustment"),
    "timeout": _spec("-s --signal -k --kill-after", "--preserve-status --foreground -v --verbose", operands=1),
    "nohup": _spec(),
    "command": _spec(flags="-p", no_command="-v -V"),
    "builtin": _spec(),
    "exec": _spec("-a", "-c -l"),
    "time": _spec("-f --format -o --output", "-p -a --append -v --verbose -q --quiet --portability"),
    "setsid": _spec(flags="-c --ctty -f --fork -w --wait"),
    "stdbuf": _spec("-i --input -o --output -e --error"),
    "ionice": _spec("-c --class -n --classdata", "-t --ignore", no_command="-p --pid -P --pgid -u --uid"),
    "taskset": _spec(flags="-a --all-tasks -c --cpu-list", operands=1, no_command="-p --pid"),
    "chrt": _spec("-T --sched-runtime -P --sched-period -D --sched-deadline",
                  "-a --all-tasks -b --batch -d --deadline -f --fifo -i --idle -o --other -r --rr -R "
                  "--reset-on-fork -v --verbose", operands=1, no_command="-p --pid -m --max"),
    "sudo": _spec("-u --user -g --group -C --close-from -D --chdir -h --host -p --prompt -r --role -t --type "
                  "-U --other-user -T --command-timeout",
                  "-A --askpass -b --background -E --preserve-env -H --set-home -k --reset-timestamp -n "
                  "--non-interactive -P --preserve-groups -S --stdin -B --bell -N --no-update",
                  no_command="-l --list -v --validate -K --remove-timestamp -V --version -e --edit",
                  assignments=True),
    "doas": _spec("-u -C", "-n -s"),
    "su": _spec("-g --group -G --supp-group -s --shell -w --whitelist-environment",
                "- -l --login -m -p --preserve-environment -P --pty -f", string="-c --command --session-command"),
    "flock": _spec("-w --wait --timeout -E --conflict-exit-code",
                   "-s --shared -x --exclusive -e -u --unlock -n --nb --nonblock -o --close -F --no-fork "
                   "--verbose", operands=1, string="-c --command"),
    "xargs": _spec("-a --arg-file -d --delimiter -E -I -L -n --max-args -P --max-procs -s --max-chars "
                   "--process-slot-var", "-0 --null -o --open-tty -p --interactive -r --no-run-if-empty -t "
                   "--verbose -x --exit -e --eof -i --replace -l --max-lines"),
    "busybox": _spec(),
    "unbuffer": _spec(flags="-p"),
    "nsenter": _spec("-t --target -S --setuid -G --setgid -w --wd -r --root",
                     "-a --all -m --mount -u --uts -i --ipc -n --net -p --pid -U --user -C --cgroup -T --time -F "
                     "--no-fork --preserve-credentials"),
    "unshare": _spec("--propagation --setgroups -S --setuid -G --setgid -R --root -w --wd",
                     "-m --mount -u --uts -i --ipc -n --net -p --pid -U --user -C --cgroup -T --time -f --fork "
                     "-r --map-root-user -c --map-current-user --kill-child --mount-proc"),
    "chroot": _spec("--userspec --groups", "--skip-chdir", operands=1),
    "strace": _spec("-e -o -p -s -u -a -b -E -I -O -P -S -X", "-f -ff -c -C -d -D -i -k -q -qq -r -t -tt -ttt "
                    "-T -v -V -w -x -xx -y -yy -z -Z"),
}
#: Wrappers whose operands are not a command (``su USER`` starts a login shell reading its input).
NO_OPERAND_COMMAND: Final = frozenset({"su"})


@attrs.frozen
class Unwrapped:
    """What one simple command runs: argvs (wrapper first), shell strings, or why it cannot be read."""

    commands: tuple[tuple[Word, ...], ...] = ()
    strings: tuple[Word, ...] = ()
    reason: str | None = None


def unwrap(words: Sequence[Word]) -> Unwrapped:
    """Every argv one simple command runs (wrappers first), its shell strings, or why it cannot be read."""
    commands: list[tuple[Word, ...]] = []
    strings: list[Word] = []
    current = tuple(words)
    for _ in range(MAX_WRAPPERS):
        if not current:
            return Unwrapped(tuple(commands), tuple(strings))
        commands.append(current)
        program = current[0]
        if program.dynamic:
            return Unwrapped(tuple(commands), tuple(strings))
        name = program.text.rstrip("/").rsplit("/", 1)[-1]
        if name in SHELLS:
            string, reason = _shell(name, current[1:])
            return Unwrapped(tuple(commands), (*strings, *([string] if string is not None else [])), reason)
        if name in ("find", "fd", "fdfind"):
            inner = _find_exec(name, current[1:])
            return Unwrapped((*commands, *inner.commands), (*strings, *inner.strings), inner.reason)
        if name == "watch":
            return _watch(current[1:], commands, strings)
        spec = WRAPPERS.get(name)
        if spec is None:
            return Unwrapped(tuple(commands), tuple(strings))
        if name == "busybox" and len(current) > 1:
            current = current[1:]
            continue
        rest, string, reason = _options(name, spec, current[1:])
        if reason is not None:
            return Unwrapped(tuple(commands), tuple(strings), reason)
        if string is not None:
            if rest:  # env -S STRING ARGS: the string's words, then the arguments
                string = Word(" ".join([string.text, *(shlex.quote(w.text) for w in rest)]),
                                      string.dynamic or any(w.dynamic for w in rest))
            return Unwrapped(tuple(commands), (*strings, string))
        if name in NO_OPERAND_COMMAND:
            return Unwrapped(tuple(commands), tuple(strings),
                             f"{name} without -c starts a shell reading its input, which the rules cannot read")
        if not rest:  # nothing inside (``env``, ``exec 3>f``, ``command -v x``, ``xargs`` runs echo)
            return Unwrapped(tuple(commands), tuple(strings))
        if name == "xargs" and _replaced(current[1:], rest[0]):
            return Unwrapped(tuple(commands), tuple(strings), "xargs runs a program read from its input")
        current = rest
    return Unwrapped(tuple(commands), tuple(strings), "too many nested wrappers")


def _replaced(options: Sequence[Word], program: Word) -> bool:
    """Whether ``xargs -I REPL`` (or ``-i``/``--replace``) puts its input into the program name."""
    replacement = ""
    for index, word in enumerate(options):
        if word is program:
            break
        text = word.text
        if text in ("-I",) and index + 1 < len(options):
            replacement = options[index + 1].text
        elif text.startswith("-I"):
            replacement = text[2:]
        elif text.startswith(("-i", "--replace")):
            replacement = text.partition("=")[2] or (text[2:] if text.startswith("-i") else "") or "{}"
    return bool(replacement) and replacement in program.text


def _options(name: str, spec: WrapperSpec, args: Sequence[Word]) -> tuple[tuple[Word, ...] | None, Word | None,
                                                                          str | None]:
    """(the command words, a shell string, why unreadable); command words are None when nothing runs."""
    index, operands = 0, spec.operands
    string: Word | None = None
    while index < len(args):
        word = args[index]
        text = word.text
        if word.dynamic:
            return None, None, f"an argument of {name} before its command is only known at run time"
        if text == "--":
            index += 1
            break
        if text.startswith("--"):
            option, eq, value = text.partition("=")
            if option in spec.no_command:
                return None, None, None
            if option in spec.string:
                if eq:
                    string = Word(value, word.dynamic)
                elif index + 1 < len(args):
                    string = args[index + 1]
                    index += 1
                index += 1
                if name != "env":
                    return None, string, None
                continue
            if option in spec.with_arg:
                index += 1 if eq else 2
                continue
            if option in spec.flags:
                index += 1
                continue
            return None, None, f"{name} option {option!r} is not known to the command rules"
        if text == "-" and "-" in spec.flags:
            index += 1
            continue
        if name == "nice" and text[:1] == "-" and text[1:].isdigit():
            index += 1
            continue
        if text.startswith("-") and len(text) > 1:
            if text in spec.no_command:
                return None, None, None
            if text in spec.flags:
                index += 1
                continue
            taken = 1
            for position, letter in enumerate(text[1:], start=1):
                option = "-" + letter
                if option in spec.no_command:
                    return None, None, None
                if option in spec.string:
                    value = text[position + 1:]
                    if value:
                        string = Word(value, word.dynamic)
                    elif index + 1 < len(args):
                        string, taken = args[index + 1], 2
                    break
                if option in spec.with_arg:
                    if position + 1 == len(text) and index + 1 < len(args):
                        taken = 2
                    break
                if option not in spec.flags:
                    return None, None, f"{name} option {option!r} is not known to the command rules"
            index += taken
            if string is not None and name != "env":
                return None, string, None
            continue
        if spec.assignments and "=" in text:  # env: every word with "=" before the command is a NAME=VALUE
            variable = text.split("=", 1)[0]
            if changes_what_runs(variable):
                return None, None, f"{name} sets {variable}, which changes what runs"
            index += 1
            continue
        if operands:
            operands -= 1
            index += 1
            continue
        break
    if string is not None:
        return tuple(args[index:]), string, None
    return tuple(args[index:]), None, None


def _shell(name: str, args: Sequence[Word]) -> tuple[Word | None, str | None]:
    """The string ``bash -c`` runs (options in any order, ``-o opt``, ``--``), or why none can be read."""
    command_mode = False
    index = 0
    while index < len(args):
        word = args[index]
        text = word.text
        if word.dynamic and not command_mode:
            return None, f"an argument of {name} before its command string is only known at run time"
        if text == "--" or text == "-":
            index += 1
            break
        if text in ("--rcfile", "--init-file"):
            index += 2
            continue
        if text.startswith("--"):
            index += 1
            continue
        if text[:1] in ("-", "+") and len(text) > 1:
            letters = text[1:]
            index += 1
            if "c" in letters and text[0] == "-":
                command_mode = True
            for letter in letters:
                if letter in "oO":
                    index += 1  # -o posix, +O extglob: the option name follows
            continue
        break
    operands = args[index:]
    if not command_mode:
        if operands:
            return None, f"{name} runs a script file the rules cannot read"
        return None, f"{name} reads commands from its standard input, which the rules cannot read"
    if not operands:
        return None, None
    return operands[0], None


def _find_exec(name: str, args: Sequence[Word]) -> Unwrapped:
    """The commands ``find -exec … ;`` (or ``fd -x …``) runs; ``{}`` as the program is unreadable."""
    commands: list[tuple[Word, ...]] = []
    strings: list[Word] = []
    index = 0
    starts = ("-exec", "-execdir", "-ok", "-okdir") if name == "find" else ("-x", "--exec", "-X", "--exec-batch")
    while index < len(args):
        if args[index].text in starts:
            end = index + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            words = tuple(args[index + 1:end])
            if not words or "{}" in words[0].text or words[0].dynamic:
                return Unwrapped(tuple(commands), tuple(strings),
                                 f"{name} {args[index].text} runs a program the rules cannot read")
            nested = unwrap(words)
            commands.extend(nested.commands)
            strings.extend(nested.strings)
            if nested.reason is not None:
                return Unwrapped(tuple(commands), tuple(strings), nested.reason)
            index = end
        index += 1
    return Unwrapped(tuple(commands), tuple(strings))


_WATCH: Final = _spec("-n --interval -q --equexit", "-d --differences -t --no-title -b --beep -e --errexit -g "
                      "--chgexit -c --color -C --no-color -p --precise -w --no-wrap -x --exec -r --no-rerun")


def _watch(args: Sequence[Word], commands: list[tuple[Word, ...]], strings: list[Word]) -> Unwrapped:
    """``watch CMD…`` runs ``sh -c "CMD…"``; ``watch -x CMD…`` runs the argv."""
    rest, _, reason = _options("watch", _WATCH, args)
    if reason is not None or not rest:
        return Unwrapped(tuple(commands), tuple(strings), reason)
    if any(w.text in ("-x", "--exec") for w in args[:len(args) - len(rest)]):
        nested = unwrap(rest)
        return Unwrapped((*commands, *nested.commands), (*strings, *nested.strings), nested.reason)
    string = Word(" ".join(w.text for w in rest), any(w.dynamic for w in rest))
    return Unwrapped(tuple(commands), (*strings, string))
