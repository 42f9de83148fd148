"""The hash chain: record encoding, linking, HMAC checkpoints and verification.

A line is the canonical JSON of a record (sorted keys, no spaces, UTF-8)
followed, as its last two members, by ``prev`` (the hash of the line before,
or of the last line of the previous file after rotation; 64 zeros at the very
start) and ``hash`` = SHA-256 over the line without its ``hash`` member.
Editing, deleting, inserting or reordering records breaks the chain at the
first affected line. The body is encoded once, off the writer's critical
section; linking only appends ``prev`` and hashes.

Removing whole records from the *end* leaves a valid, shorter chain: that is
only detectable against an anchor kept elsewhere (``verify --anchor``), or
against a checkpoint signed with a key the attacker does not have: a
``checkpoint`` record carries HMAC-SHA256(key, hash of the line before it),
which commits to everything before it. Verification with the key reports
checkpoints that do not verify, and how many records follow the last good one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import attrs

from ..._json import dumps

GENESIS: Final = "0" * 64
ROTATED: Final = re.compile(r"^(?P<stem>.+)\.(?P<n>\d+)\.jsonl$")


def canonical(record: dict[str, Any]) -> bytes:
    """The canonical bytes of a record (sorted keys, no spaces, UTF-8)."""
    return dumps(record)


def encode_body(record: dict[str, Any]) -> bytes:
    """The canonical bytes of a record without ``prev``/``hash``: what ``link`` chains."""
    if "prev" in record or "hash" in record:
        record = {k: v for k, v in record.items() if k not in ("prev", "hash")}
    return canonical(record)


def link(body: bytes, prev: str) -> tuple[bytes, str]:
    """The line (with newline) for an encoded ``body`` after the record hashed ``prev``, and its hash."""
    hashed = b'%s,"prev":"%s"}' % (body[:-1], prev.encode())  # a record body is never empty
    digest = hashlib.sha256(hashed).hexdigest()
    return b'%s,"hash":"%s"}\n' % (hashed[:-1], digest.encode()), digest


def checkpoint_mac(key: bytes, prev: str) -> str:
    """The HMAC-SHA256 a checkpoint carries: over the hash of the line before it."""
    return hmac.new(key, b"amplifier-tools-audit-checkpoint:1:" + prev.encode(), hashlib.sha256).hexdigest()


def checkpoint_body(key: bytes, key_ref: str, prev: str, records: int, ts: float) -> bytes:
    """The encoded checkpoint record signing the chain up to ``prev``."""
    return encode_body({"v": 1, "kind": "checkpoint", "ts": ts, "key_ref": key_ref, "records": records,
                        "signs": prev, "hmac": checkpoint_mac(key, prev)})


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
    checkpoints: int = 0  # checkpoints whose HMAC verified (only counted when a key is given)
    unsigned: int = 0  # with a key: records after the last verified checkpoint
    torn_tail: bool = False  # the live file ends in an incomplete line: a crash mid-write, not verified


def chain_files(path: str | Path) -> list[Path]:
    """The files of a log in chain order: rotated ``<stem>.<n>.jsonl`` by n, then the live file."""
    p = Path(path)
    if p.is_dir():
        live = sorted(q for q in p.glob("*.jsonl") if not ROTATED.match(q.name))
        rotated = sorted((q for q in p.glob("*.jsonl") if ROTATED.match(q.name)),
                         key=lambda q: int(ROTATED.match(q.name).group("n")))  # type: ignore[union-attr]
        return rotated + live
    return [p]


def verify(path: str | Path, *, anchor: str | None = None, key: bytes | None = None) -> VerifyReport:
    """Check every record's hash and link, across rotated files; report the first bad line.

    With ``key``, every checkpoint's HMAC is checked too, and the report says
    how many checkpoints verified and how many records follow the last one.
    An incomplete final line of the live file (a writer killed mid-write) is
    reported as ``torn_tail``, not counted, and does not fail verification: it
    proves nothing either way, like records cut from the end (see ``anchor``).
    """
    files = chain_files(path)
    prev = GENESIS
    count = signed = checkpoints = 0
    torn = False
    names = tuple(str(f) for f in files)
    for file in files:
        try:
            handle = file.open("rb")
        except OSError as exc:
            return VerifyReport(False, count, names, prev, str(file), None, f"cannot read: {exc.strerror}")
        with handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.endswith(b"\n") and file is files[-1]:
                    # The kernel may cut a write short when the writer is killed mid-way; the
                    # writer removes such a tail before its next append. Not a verified record.
                    torn = True
                    break
                problem = _check_line(raw, prev)
                if isinstance(problem, str):
                    return VerifyReport(False, count, names, prev, str(file), number, problem,
                                        checkpoints, count - signed)
                if key is not None and problem.get("kind") == "checkpoint":
                    mac = problem.get("hmac")
                    if not isinstance(mac, str) or not hmac.compare_digest(mac, checkpoint_mac(key, prev)):
                        return VerifyReport(False, count, names, prev, str(file), number,
                                            "checkpoint signature does not verify: the log was rewritten, "
                                            "or signed with another key", checkpoints, count - signed)
                    checkpoints += 1
                    signed = count + 1
                prev = problem["hash"]
                count += 1
    unsigned = count - signed if key is not None else 0
    if anchor is not None and anchor != prev:
        return VerifyReport(False, count, names, prev, names[-1] if names else None, None,
                            f"last hash {prev[:16]}… is not the anchor {anchor[:16]}…: records were removed "
                            "from the end or the log was replaced", checkpoints, unsigned, torn)
    return VerifyReport(True, count, names, prev, checkpoints=checkpoints, unsigned=unsigned, torn_tail=torn)


_HASH_SUFFIX: Final = re.compile(rb',"hash":"([0-9a-f]{64})"\}\n\Z')


def _check_line(raw: bytes, prev: str) -> dict[str, Any] | str:
    if not raw.endswith(b"\n"):
        return "incomplete last line (torn write or truncation)"
    suffix = _HASH_SUFFIX.search(raw)
    if suffix is None:
        return "not an audit record (no hash as its last member)"
    hashed = raw[: suffix.start()] + b"}"
    if hashlib.sha256(hashed).hexdigest().encode() != suffix.group(1):
        return "hash mismatch: the record was edited"
    try:
        record = json.loads(raw)
    except ValueError:
        return "not valid JSON"
    if not isinstance(record, dict):
        return "not an audit record"
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
