"""``python -m bench [--quick] [--only NAME ...] [--json PATH]``: run every benchmark case.

Prints a table and writes machine-readable results with the environment
(CPU, Python, package versions) to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from .harness import isolated_state

HERE = Path(__file__).parent


def _environment() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("amplifier-tools", "pluggy", "attrs", "cattrs", "jsonschema", "amplifier-core", "tenacity",
                 "orjson", "mcp", "pydantic", "openai-agents", "pydantic-ai-slim", "langgraph", "langgraph-prebuilt",
                 "langchain-core"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "packages": versions,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smoke mode: every case once, CI-sized")
    parser.add_argument("--only", action="append", default=[], help="run only bench_NAME (repeatable)")
    parser.add_argument("--json", default=str(HERE / "results" / "latest.json"), help="where to write results")
    args = parser.parse_args(argv)
    with isolated_state():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.removeprefix("bench_") in args.only or m in args.only]
    rows: list[dict[str, Any]] = []
    failures = 0
    for name in modules:
        module = importlib.import_module(f"bench.{name}")
        started = time.perf_counter()
        try:
            got = module.run(quick=args.quick)
        except Exception as exc:  # one broken case must not hide the others
            failures += 1
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for r in got:
            r["module"] = name
        rows.extend(got)
        print(f"# {name}: {len(got)} rows in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print("| case | ours | reference | unit | ratio | target | met | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
        print(f"| {r['case']} | {_fmt(r['ours'])} | {_fmt(r['reference'])} | {r['unit']} | "
              f"{_fmt(r['ratio'])} | {r['target']} | {met} | {r.get('notes', '')} |")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": _environment(), "quick": args.quick, "rows": rows}, indent=2))
    print(f"\nresults written to {out}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
