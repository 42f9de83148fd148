"""The hash chain: canonical serialization, record hashing, and verification.

Each record carries ``prev`` (the hash of the record before it, or of the last
record of the previous file after rotation; 64 zeros at the very start) and
``hash`` = SHA-256 over the canonical JSON of the record without ``hash``.
Editing, deleting, inserting or reordering records breaks the chain at the
first affected line. Removing whole records from the *end* leaves a valid,
shorter chain: that is only detectable against an anchor kept elsewhere (the
last hash, e.g. ``verify --anchor``), which is what a periodic external
checkpoint is for.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs

GENESIS: Final = "0" * 64
ROTATED: Final = re.compile(r"^(?P<stem>.+)\.(?P<n>\d+)\.jsonl$")


def canonical(record: dict[str, Any]) -> bytes:
    """The canonical bytes of a record (sorted keys, no spaces, UTF-8)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def seal(record: dict[str, Any], prev: str) -> dict[str, Any]:
    """``record`` with ``prev`` and ``hash`` set."""
    body = {k: v for k, v in record.items() if k != "hash"}
    body["prev"] = prev
    body["hash"] = hashlib.sha256(canonical(body)).hexdigest()
    return body


@attrs.frozen
class VerifyReport:
    """The outcome of ``verify``: ``ok``, how many records, and where the chain first broke."""

    ok: bool
    records: int
    files: tuple[str, ...]
    last_hash: str
    bad_file: str | None = None
    bad_line: int | None = None
    reason: str | None = None


def chain_files(path: str | Path) -> list[Path]:
    """The files of a log in chain order: rotated ``<stem>.<n>.jsonl`` by n, then the live file."""
    p = Path(path)
    if p.is_dir():
        live = sorted(q for q in p.glob("*.jsonl") if not ROTATED.match(q.name))
        rotated = sorted((q for q in p.glob("*.jsonl") if ROTATED.match(q.name)),
                         key=lambda q: int(ROTATED.match(q.name).group("n")))  # type: ignore[union-attr]
        return rotated + live
    return [p]


def verify(path: str | Path, *, anchor: str | None = None) -> VerifyReport:
    """Check every record's hash and link, across rotated files; report the first bad line."""
    files = chain_files(path)
    prev = GENESIS
    count = 0
    names = tuple(str(f) for f in files)
    for file in files:
        try:
            handle = file.open("rb")
        except OSError as exc:
            return VerifyReport(False, count, names, prev, str(file), None, f"cannot read: {exc.strerror}")
        with handle:
            for number, raw in enumerate(handle, start=1):
                problem = _check_line(raw, prev)
                if isinstance(problem, str):
                    return VerifyReport(False, count, names, prev, str(file), number, problem)
                prev = problem["hash"]
                count += 1
    if anchor is not None and anchor != prev:
        return VerifyReport(False, count, names, prev, names[-1] if names else None, None,
                            f"last hash {prev[:16]}… is not the anchor {anchor[:16]}…: records were removed "
                            "from the end or the log was replaced")
    return VerifyReport(True, count, names, prev)


def _check_line(raw: bytes, prev: str) -> dict[str, Any] | str:
    if not raw.endswith(b"\n"):
        return "incomplete last line (torn write or truncation)"
    try:
        record = json.loads(raw)
    except ValueError:
        return "not valid JSON"
    if not isinstance(record, dict) or not isinstance(record.get("hash"), str):
        return "not an audit record"
    # Records are written in canonical form, so the hashed bytes are the line without its
    # hash field; a line that is not canonical cannot match and counts as edited.
    digest = record["hash"]
    body = raw[:-1].replace(b',"hash":"' + digest.encode() + b'"', b"", 1)
    if body == raw[:-1]:
        body = raw[:-1].replace(b'"hash":"' + digest.encode() + b'",', b"", 1)
    if hashlib.sha256(body).hexdigest() != digest:
        return "hash mismatch: the record was edited"
    if record.get("prev") != prev:
        return "chain broken: a record before this one was deleted, inserted or reordered"
    return record


def read_records(path: str | Path) -> Iterable[dict[str, Any]]:
    """Every parseable record of a log (file or directory), in chain order."""
    for file in chain_files(path):
        with file.open("rb") as handle:
            for raw in handle:
                try:
                    yield json.loads(raw)
                except ValueError:
                    continue
