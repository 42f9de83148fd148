"""Bash command rules: parse + check time of typical commands (tree-sitter parse, walk, pattern match).

"first" clears the parse cache before every check (a command the agent has not sent before);
"repeated" is a command seen before (the cache holds the last 512 commands up to 4 KiB);
the reference is the same check with no rules configured, which parses nothing.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from amplifier_tools.builtins.bash import shellparse
from amplifier_tools.builtins.bash.rules import CommandRules

from .harness import Row, isolated_state, row

RULES = CommandRules(allow=("git", "ls", "grep", "echo", "python*", "pytest", "tail"), deny=("rm", "git push*"))
NONE = CommandRules()
COMMANDS = {
    "1 part": "git status",
    "4 parts": "git status && ls -la | grep foo; echo done",
    "loop": 'for f in *.py; do grep -n TODO "$f" || echo "none in $f"; done',
}


def _us(fn: Callable[[], object], n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def run(quick: bool) -> list[Row]:
    n = 200 if quick else 3000
    rows: list[Row] = []
    for label, command in COMMANDS.items():
        def first(command: str = command) -> None:
            shellparse._parse_cached.cache_clear()
            RULES.check(command)

        ours = _us(first, n)
        repeated = _us(lambda command=command: RULES.check(command), n)
        without = _us(lambda command=command: NONE.check(command), n)
        rows.append(row(f"bash rules: parse + check, {label}", ours, without, "µs/call", ratio=ours / without,
                        target="≤ 500 µs", met=ours <= 500,
                        notes=f"repeated command {repeated:.1f} µs; reference = no rules; {command!r}"))
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
