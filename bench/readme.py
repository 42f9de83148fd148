"""``python -m bench.readme [RESULTS]``: put one full run's results into the README.

Reads the results a ``python -m bench`` run wrote (default ``bench/results/latest.json``),
refuses a ``--quick`` run (its figures are smoke, not measurements), copies the file to
``bench/published.json`` (kept in the repository: the run the README shows, with every row's
notes and the environment) and rewrites the README's table between the markers
``<!-- bench-table:start -->`` and ``<!-- bench-table:end -->``: the run's environment, then one
line per row — case, ours, reference, unit, ratio, target, met. Rows keep the run's order
(grouped by bench module). Nothing else of the README changes. Not a ``bench_*`` module:
``python -m bench`` does not run it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
README = HERE.parent / "README.md"
PUBLISHED = HERE / "published.json"
START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
#: Packages named in the environment line (the rest are in bench/published.json).
NAMED = ("pluggy", "jsonschema", "orjson", "mcp", "pydantic", "openai-agents", "pydantic-ai-slim", "langgraph",
         "amplifier-core")


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(results: dict[str, Any]) -> str:
    """The README block for ``results`` (a ``python -m bench`` results file's content)."""
    env = results["environment"]
    packages = ", ".join(f"{name} {env['packages'][name]}" for name in NAMED if env["packages"].get(name))
    lines = [
        f"Full run of {env['time']} (`python -m bench`; {env['implementation']} {env['python']}, "
        f"{env['cpu']}, {env['cores']} cores, {env['platform']}; {packages}). Every row's notes and "
        "the whole environment: `bench/published.json`.",
        "",
        "| case | ours | reference | unit | ratio | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        met = {True: "yes", False: "**no**", None: "—"}[row.get("met")]
        case = row["case"].replace("|", "\\|")
        target = (row.get("target") or "—").replace("|", "\\|")
        lines.append(f"| {case} | {_number(row['ours'])} | {_number(row['reference'])} | {row['unit']} | "
                     f"{_number(row['ratio'])} | {target} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    source = Path(args[0]) if args else HERE / "results" / "latest.json"
    results = json.loads(source.read_text())
    if results.get("quick"):
        print(f"{source} is a --quick run: its figures are a smoke test; run `python -m bench` in full",
              file=sys.stderr)
        return 2
    text = README.read_text()
    if START not in text or END not in text:
        print(f"{README} has no {START} … {END} block", file=sys.stderr)
        return 2
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{table(results)}\n{END}{tail}")
    if source.resolve() != PUBLISHED.resolve():
        shutil.copyfile(source, PUBLISHED)
    print(f"README table: {len(results['rows'])} rows from {source}; copied to {PUBLISHED}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
