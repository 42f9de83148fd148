"""``amplifier-tools audit verify|tail|stats``: check, show and summarize an audit log.

Exit statuses: 0 the log verifies (or the command succeeded), 1 tampering or
damage found, 2 usage error or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from pathlib import Path

from .chain import read_records, verify


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amplifier-tools audit", description="Audit log tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("verify", help="check the hash chain of a log file or directory")
    p.add_argument("path")
    p.add_argument("--anchor", help="the last hash recorded elsewhere; detects records cut from the end")
    p.add_argument("--key-env", metavar="VAR",
                   help="environment variable holding the checkpoint HMAC key; checks every checkpoint")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("tail", help="the last records")
    p.add_argument("path")
    p.add_argument("-n", type=int, default=10)
    p = sub.add_parser("stats", help="calls, error rates by category and tool, latency percentiles")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    return parser


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def stats(path: str) -> dict[str, object]:
    """Counts, error rates and latency percentiles of the call records of a log."""
    calls = [r for r in read_records(path) if r.get("kind") == "call"]
    durations = sorted(float(r.get("duration_ms", 0)) for r in calls)
    by_category = Counter((r.get("error") or {}).get("type") for r in calls if r.get("status") == "error")
    per_tool: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in calls:
        per_tool[r["tool"]][0] += 1
        per_tool[r["tool"]][1] += r.get("status") == "error"
    return {
        "calls": len(calls),
        "errors": sum(by_category.values()),
        "error_rate": (sum(by_category.values()) / len(calls)) if calls else 0.0,
        "errors_by_category": dict(by_category),
        "by_tool": {tool: {"calls": n, "errors": e, "error_rate": e / n} for tool, (n, e) in sorted(per_tool.items())},
        "latency_ms": {"p50": _percentile(durations, 50), "p95": _percentile(durations, 95),
                       "p99": _percentile(durations, 99)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not Path(args.path).exists():
        print(f"error: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    if args.command == "verify":
        key = None
        if args.key_env is not None:
            value = os.environ.get(args.key_env)
            if not value:
                print(f"error: --key-env {args.key_env}: the variable is not set", file=sys.stderr)
                return 2
            key = value.encode()
        report = verify(args.path, anchor=args.anchor, key=key)
        if args.json:
            print(json.dumps({"ok": report.ok, "records": report.records, "files": list(report.files),
                              "last_hash": report.last_hash, "bad_file": report.bad_file,
                              "bad_line": report.bad_line, "reason": report.reason,
                              "checkpoints": report.checkpoints if key else None,
                              "unsigned": report.unsigned if key else None, "torn_tail": report.torn_tail}))
        elif report.ok:
            print(f"OK: {report.records} records in {len(report.files)} file(s); last hash {report.last_hash}")
            if report.torn_tail:
                print("note: the last line is incomplete (a writer was killed mid-write); it was not verified "
                      "and the next append removes it")
            if key is not None:
                print(f"{report.checkpoints} signed checkpoint(s) verified; {report.unsigned} record(s) after "
                      "the last one are covered by the hash chain only")
        else:
            where = f"{report.bad_file}:{report.bad_line}" if report.bad_line else str(report.bad_file)
            print(f"TAMPERED: {where}: {report.reason} ({report.records} records verified before it)")
        return 0 if report.ok else 1
    if args.command == "tail":
        for record in deque(read_records(args.path), maxlen=args.n):
            print(json.dumps(record, sort_keys=True))
        return 0
    data = stats(args.path)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        latency = data["latency_ms"]
        print(f"calls {data['calls']}, errors {data['errors']} ({data['error_rate']:.1%}); "
              f"latency p50 {latency['p50']:.2f} ms, p95 {latency['p95']:.2f} ms, p99 {latency['p99']:.2f} ms")  # type: ignore[index]
        for category, count in sorted(data["errors_by_category"].items()):  # type: ignore[attr-defined]
            print(f"  {category}: {count}")
        for tool, row in data["by_tool"].items():  # type: ignore[attr-defined]
            print(f"  {tool}: {row['calls']} calls, {row['error_rate']:.1%} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
