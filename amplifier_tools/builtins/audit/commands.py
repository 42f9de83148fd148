"""``amplifier-tools audit verify|tail|stats``: check, show and summarize an audit log.

PATH is optional: by default the host's own log, found the way the host finds it
(``--config`` or the discovered config file, its ``state_dir`` and
``[plugins.audit] path``). ``verify`` checks the chain and, unless
``--no-anchor``, the live file against its anchor (``<log>.anchor``).

Exit statuses: 0 the log verifies (or the command succeeded), 1 tampering or
damage found, 2 usage error or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import statistics
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from pathlib import Path

from ...cli import UsageParser, printable
from .chain import (
    GENESIS,
    ROTATED,
    Anchor,
    UnreadableLog,
    anchor_path,
    chain_files,
    log_location,
    read_anchor,
    read_records,
    verify,
)


def _parser() -> argparse.ArgumentParser:
    # The command line's own parser class: a usage error reads as every other command's (found by a
    # new-user trial: 'audit verfy' printed argparse's usage block, 'policy stat' the error and hint).
    parser = UsageParser(prog="amplifier-tools audit", description="Audit log tools.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    default = "default: the host's log (<state_dir>/audit.jsonl or [plugins.audit] path)"
    p = sub.add_parser("verify", help="check the hash chain of a log file or directory, and its anchor")
    p.add_argument("path", nargs="?", help=default)
    p.add_argument("--anchor", help="the last hash recorded elsewhere; detects records cut from the end")
    p.add_argument("--no-anchor", action="store_true",
                   help="check the chain only (a copy without its <log>.anchor); cannot detect truncation")
    p.add_argument("--key-env", metavar="VAR",
                   help="environment variable holding the checkpoint HMAC key; checks every checkpoint and the "
                        "anchor's signature, and fails a log without a verified checkpoint")
    p.add_argument("--allow-unsigned", action="store_true",
                   help="with --key-env: accept a log with no signed checkpoint and an unsigned anchor")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("tail", help="the last records")
    p.add_argument("path", nargs="?", help=default)
    p.add_argument("-n", type=_count, default=10, help="how many (default 10)")
    p.add_argument("--json", action="store_true", help="the records themselves, one JSON object per line")
    p = sub.add_parser("stats", help="calls, error rates by category and tool, latency percentiles")
    p.add_argument("path", nargs="?", help=default)
    p.add_argument("--json", action="store_true")
    return parser


def _count(text: str) -> int:
    """``-n``: a whole number, 0 or more (found by attack: ``-n -1`` ended in a ValueError, and
    ``-n 99999999999999999999`` in an OverflowError reported as an internal error)."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of records (0 or more)")
    if int(text) > sys.maxsize:
        raise argparse.ArgumentTypeError(f"{text}: more records than a log can hold (at most {sys.maxsize})")
    return int(text)


def _key(value: object) -> str | None:
    """A member of a record as a key to count by: a string as it is, anything else as its JSON."""
    return value if value is None or isinstance(value, str) else json.dumps(value, sort_keys=True)


def _duration(record: dict[str, object]) -> float:
    value = record.get("duration_ms", 0)
    return float(value) if type(value) in (int, float) and math.isfinite(value) else 0.0  # type: ignore[arg-type]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def stats(path: str) -> dict[str, object]:
    """Counts, error rates and latency percentiles of the call records of a log."""
    calls = [r for r in read_records(path) if r.get("kind") == "call"]
    durations = sorted(_duration(r) for r in calls)
    # A record's members are taken as they are found (found by attack: a call record without a
    # ``tool``, or with a list for one, or a string for ``error``, crashed stats).
    by_category = Counter(_key(error.get("type")) if isinstance(error := r.get("error"), dict) else None
                          for r in calls if r.get("status") == "error")
    per_tool: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    for r in calls:
        per_tool[_key(r.get("tool"))][0] += 1
        per_tool[_key(r.get("tool"))][1] += r.get("status") == "error"
    return {
        "calls": len(calls),
        "errors": sum(by_category.values()),
        "error_rate": (sum(by_category.values()) / len(calls)) if calls else 0.0,
        "errors_by_category": dict(by_category),
        "by_tool": {tool: {"calls": n, "errors": e, "error_rate": e / n}
                    for tool, (n, e) in sorted(per_tool.items(), key=lambda item: str(item[0]))},
        "latency_ms": {"p50": _percentile(durations, 50), "p95": _percentile(durations, 95),
                       "p99": _percentile(durations, 99)},
    }


def default_log(config: str | None) -> Path:
    """The host's log, found as the host finds it: config file, ``state_dir``, ``[plugins.audit] path``,
    from a configuration the host would start from (found by attack: a file planted in the working
    directory naming another ``state_dir`` had ``verify`` pass a forged log and anchor there, and
    leave the host's own log unchecked). ``ConfigError`` naming the file otherwise."""
    from ...cli import trusted_host

    host = trusted_host(config)
    section = host.config.get("plugins", {}).get("audit") or {}
    return log_location(section.get("path") if isinstance(section, dict) else None, host.state_dir)


def _live_file(path: Path) -> Path | None:
    files = chain_files(path)
    return files[-1] if files else None


def _anchor_without_log(path: Path) -> str | None:
    """What is wrong when ``path`` holds no live log file but an anchor says there was one (found by
    attack: the log replaced by an empty directory, or deleted and its directory verified, passed
    as "0 records"; with rotated files beside it, the last of them was taken for the live file and
    its missing anchor reported instead of the deleted log)."""
    path = Path(os.path.abspath(path))  # ``.`` has no name to put ``.anchor`` after (found by attack: ValueError)
    if path.is_dir() and anchor_path(path).is_file():
        return f"the log {path} is a directory, not the file its anchor ({anchor_path(path)}) was written for"
    orphans = sorted(anchor for anchor in path.glob("*.jsonl.anchor")
                     if not os.path.lexists(anchor.with_name(anchor.name[: -len(".anchor")]))) if path.is_dir() else []
    if orphans:
        return f"no log beside the anchor {orphans[0]}: the log it anchors was deleted or moved"
    return None


def _verify(args: argparse.Namespace, path: Path) -> int:
    key = None
    if args.key_env is not None:
        value = os.environ.get(args.key_env)
        if not value:  # found by attack: no hint line, and stdout empty with --json
            return _failed(args, f"--key-env {args.key_env!r}: the variable is not set (or empty)",
                           "set it to the checkpoint HMAC key, or leave --key-env out to check the chain only")
        key = value.encode()
    head: Anchor | None = None
    problem = None
    live = _live_file(path)
    where = anchor_path(live) if live is not None else None
    if (live is None or ROTATED.match(live.name)) and not args.no_anchor:
        problem = _anchor_without_log(path)  # no live file among the log's files
    if not args.no_anchor and where is not None and problem is None:
        try:
            head = read_anchor(where)
        except ValueError as exc:
            problem = str(exc)
        else:
            if head is None:
                problem = (f"no anchor ({where}) beside the log: records cut from the end, or an emptied or "
                           "replaced log, would go unnoticed (--no-anchor checks the chain only)")
    report = verify(path, anchor=args.anchor, key=key, head=head, require_signed=not args.allow_unsigned)
    ok = report.ok and problem is None
    reason = report.reason if not report.ok else problem
    if args.json:
        print(json.dumps({"ok": ok, "records": report.records, "files": list(report.files),
                          "last_hash": report.last_hash, "bad_file": report.bad_file,
                          "bad_line": report.bad_line, "reason": reason,
                          "anchor": None if where is None or args.no_anchor else str(where),
                          "after_anchor": report.after_anchor,
                          "checkpoints": report.checkpoints if key else None,
                          "unsigned": report.unsigned if key else None, "torn_tail": report.torn_tail}))
    elif ok:
        print(f"OK: {report.records} records in {len(report.files)} file(s); last hash {report.last_hash}")
        if report.torn_tail:
            print("note: the last line is incomplete (a writer was killed mid-write); it was not verified "
                  "and the next append removes it")
        if head is not None and report.after_anchor:
            print(f"anchor: the log holds everything its anchor records; {report.after_anchor} record(s) were "
                  "written after the anchor's last update (a writer still running, or killed before updating it)")
        elif head is not None:
            print("anchor: the log holds everything its anchor records")
        if key is not None:
            print(f"{report.checkpoints} signed checkpoint(s) verified; {report.unsigned} record(s) after "
                  "the last one are covered by the hash chain only")
    else:
        at = f"{report.bad_file}:{report.bad_line}" if report.bad_line else str(report.bad_file or path)
        print(f"TAMPERED: {printable(at)}: {printable(reason)} ({report.records} records verified before it)")
    return 0 if ok else 1


def tail_line(record: dict[str, object]) -> str:
    """One record as a line for people: time, status, tool, duration, principal, and the error."""
    if record.get("kind") != "call":  # tamper, recovered, rotated: their fields as they are
        rest = {k: v for k, v in record.items() if k not in ("v", "kind", "ts", "prev", "hash")}
        kind = printable(record.get("kind", "?"))
        return f"{printable(record.get('ts', '-'))}  {kind}  {json.dumps(rest, sort_keys=True)}"
    line = (f"{printable(record.get('ts', '-'))}  {printable(record.get('status', '?')):<5}  "
            f"{printable(record.get('tool', '?'))}  {printable(record.get('duration_ms', 0))} ms  "
            f"{printable(record.get('principal', '-'))}")
    error = record.get("error")
    if isinstance(error, dict):
        line += f"  {printable(error.get('type'))}[{printable(error.get('code'))}]: {printable(error.get('message'))}"
    return line


def _failed(args: argparse.Namespace, message: str, hint: str) -> int:
    print(f"error: {message}\nhint: {hint}", file=sys.stderr)
    if args.json:  # stdout stays JSON for a script, as every command's --json failure
        print(json.dumps({"error": {"type": "CommandError", "message": message, "hint": hint, "exit_status": 2}},
                         ensure_ascii=False))
    return 2


def main(argv: Sequence[str] | None = None, *, config: str | None = None) -> int:
    args = _parser().parse_args(argv)
    path = Path(args.path) if args.path else default_log(config)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if args.path:
            message, hint = f"{args.path}: no such file or directory", "give the path of an audit log"
        else:
            message = f"no call has been recorded for this working directory yet (its log would be {path})"
            hint = "make a call first (amplifier-tools call ...), or give the path of a log"
        return _failed(args, message, hint)
    except OSError as exc:  # found by attack: a file named as a directory, a name too long, no search
        # permission ended as an internal error (exit 1, the "this is a bug" hint, nothing on stdout
        # with --json)
        return _failed(args, f"{printable(path)}: cannot read: {exc.strerror or exc}",
                       "give the path of an audit log file, or of the directory that holds it")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        if args.command == "verify":
            reason = "the log is not a regular file (a FIFO or device was put in its place)"
            if args.json:  # stdout stays JSON (found by attack: a FIFO at the path printed the text line)
                print(json.dumps({"ok": False, "records": 0, "files": [str(path)], "last_hash": GENESIS,
                                  "bad_file": str(path), "bad_line": None, "reason": reason,
                                  "anchor": None if args.no_anchor else str(anchor_path(path)),
                                  "after_anchor": None, "checkpoints": None, "unsigned": None,
                                  "torn_tail": False}))
            else:
                print(f"TAMPERED: {printable(path)}: {reason}")
            return 1
        return _failed(args, f"{printable(path)}: not a regular file or directory",
                       "give the path of an audit log file, or of the directory that holds it")
    if args.command == "verify":
        return _verify(args, path)
    args.path = str(path)
    try:
        if args.command == "tail":
            for record in deque(read_records(args.path), maxlen=args.n):
                print(json.dumps(record, sort_keys=True) if args.json else tail_line(record))
            return 0
        data = stats(args.path)
    except UnreadableLog as exc:
        return _failed(args, str(exc), "give the path of an audit log; move what is not one out of its directory")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        latency = data["latency_ms"]
        print(f"calls {data['calls']}, errors {data['errors']} ({data['error_rate']:.1%}); "
              f"latency p50 {latency['p50']:.2f} ms, p95 {latency['p95']:.2f} ms, p99 {latency['p99']:.2f} ms")  # type: ignore[index]
        for category, count in sorted(data["errors_by_category"].items(), key=str):  # type: ignore[attr-defined]
            print(f"  {printable(category)}: {count}")
        for tool, row in data["by_tool"].items():  # type: ignore[attr-defined]
            print(f"  {printable(tool)}: {row['calls']} calls, {row['error_rate']:.1%} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
