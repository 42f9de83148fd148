"""The hash chain: record encoding, linking, HMAC checkpoints and verification.

A line is the canonical JSON of a record (sorted keys, no spaces, UTF-8)
followed, as its last two members, by ``prev`` (the hash of the line before,
or of the last line of the previous file after rotation; 64 zeros at the very
start) and ``hash`` = SHA-256 over the line without its ``hash`` member.
Editing, deleting, inserting or reordering records breaks the chain at the
first affected line. The body is encoded once, off the writer's critical
section; linking only appends ``prev`` and hashes.

Removing whole records from the *end* leaves a valid, shorter chain: that is
detected against the anchor (``<log>.anchor``, written by the writer: the
live file's inode, size, last hash and record count, HMAC-signed when a
checkpoint key is configured), against a last hash kept elsewhere
(``verify --anchor``), or against a checkpoint signed with a key the attacker
does not have: a ``checkpoint`` record carries HMAC-SHA256(key, hash of the
line before it), which commits to everything before it. Verification with the
key reports checkpoints that do not verify, and how many records follow the
last good one. A ``tamper`` record is the writer's own statement that it found
the log not as it left it: verification reports it as a failure.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import hmac
import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..._json import dumps

if TYPE_CHECKING:
    from ...spec import ToolSpec

GENESIS: Final = "0" * 64
#: The ``v`` of every record this version writes.
SCHEMA_VERSION: Final = 1
ROTATED: Final = re.compile(r"^(?P<stem>.+)\.(?P<n>\d+)\.jsonl$")
#: The longest line taken for a record (a record holds its arguments in full, and at most the
#: output's size and digest by default): the writer and every reader refuse a longer one rather
#: than hold it in memory (found by attack: a 3 GiB sparse file made ``verify`` take 6 GiB).
MAX_LINE_BYTES: Final = 256 << 20

#: The contract tags naming the exact definition a tool was built from (imported MCP tools carry
#: both: docs/mcp.md, "The contract of an imported tool").
DEFINITION_TAG: Final = "sha256:"
SERVER_VERSION_TAG: Final = "mcp-server-version:"


def definition_of(spec: ToolSpec | None) -> dict[str, Any] | None:
    """The record's ``definition``: the definition hash a tool's contract declares as a
    ``sha256:<hex>`` tag, with the ``mcp-server-version:`` tag's server version; None for a tool
    that declares no hash. Read from the public contract, so it is there for every call of the
    tool — also one vetoed, timed out or whose server died before it answered."""
    if spec is None:
        return None
    digest = version = None
    for tag in spec.tags:
        if tag.startswith(DEFINITION_TAG):
            digest = tag
        elif tag.startswith(SERVER_VERSION_TAG):
            version = tag[len(SERVER_VERSION_TAG):]
    return None if digest is None else {"sha256": digest, "server_version": version}


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


def anchor_path(log: str | os.PathLike[str]) -> Path:
    """Where the anchor of the live file ``log`` lives: ``<log>.anchor``, beside it."""
    p = Path(log)
    return p.with_name(p.name + ".anchor")


@attrs.frozen
class Anchor:
    """The chain head of a live log file as its writer last left it (``<log>.anchor``).

    ``size`` bytes of the file ``file`` (inode ``inode``) end with the record hashed ``hash``, the
    ``records``-th line of that file. ``hmac`` (with ``key_ref``) signs all of it when the writer
    has a checkpoint key.
    """

    file: str
    inode: int
    size: int
    hash: str
    records: int
    ts: float
    key_ref: str | None = None
    hmac: str | None = None
    #: Written by a writer closing the log: nothing may follow ``size`` until a writer adopts the
    #: log again (a record appended between two runs is tampering, not another writer's).
    closed: bool = False

    def fields(self) -> dict[str, Any]:
        """The signed members (everything but ``hmac``)."""
        out = {"v": 1, "kind": "anchor", "file": self.file, "inode": self.inode, "size": self.size,
               "hash": self.hash, "records": self.records, "ts": self.ts}
        if self.key_ref is not None:
            out["key_ref"] = self.key_ref
        if self.closed:
            out["closed"] = True
        return out

    def signed_by(self, key: bytes) -> bool:
        return self.hmac is not None and hmac.compare_digest(self.hmac, anchor_mac(key, self))


def anchor_mac(key: bytes, anchor: Anchor) -> str:
    """HMAC-SHA256 over the anchor's canonical members."""
    return hmac.new(key, b"amplifier-tools-audit-anchor:1:" + canonical(anchor.fields()), hashlib.sha256).hexdigest()


def encode_anchor(anchor: Anchor, key: bytes | None = None) -> bytes:
    """The anchor file's bytes: one JSON object, signed with ``key`` when given."""
    record = anchor.fields()
    if key is not None:
        record["hmac"] = anchor_mac(key, anchor)
    return canonical(record) + b"\n"


def parse_anchor(data: bytes) -> Anchor:
    """An ``Anchor`` from the anchor file's bytes; ``ValueError`` if it is not one."""
    try:
        record = json.loads(data)
    except RecursionError:  # found by attack: an anchor of 60000 '[' crashed verify
        raise ValueError("not an audit anchor (nested deeper than any anchor)") from None
    if not isinstance(record, dict) or record.get("kind") != "anchor" or record.get("v") != 1:
        raise ValueError("not an audit anchor")
    try:
        anchor = Anchor(file=record["file"], inode=record["inode"], size=record["size"], hash=record["hash"],
                        records=record["records"], ts=record["ts"], key_ref=record.get("key_ref"),
                        hmac=record.get("hmac"), closed=record.get("closed") is True)
    except KeyError as exc:
        raise ValueError(f"the anchor has no {exc.args[0]!r}") from None
    if not (isinstance(anchor.file, str) and type(anchor.inode) is int and type(anchor.size) is int
            and anchor.size >= 0 and isinstance(anchor.hash, str) and len(anchor.hash) == 64
            and type(anchor.records) is int and (anchor.hmac is None or isinstance(anchor.hmac, str))):
        raise ValueError("malformed audit anchor")
    return anchor


def read_anchor(path: str | os.PathLike[str]) -> Anchor | None:
    """The anchor at ``path``; None when there is none. ``ValueError`` naming the path when it is not a
    regular file (never opened: a FIFO cannot hang the reader) or not an anchor."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise ValueError(f"the anchor {name} is not a regular file (a symlink or special file)") from None
        raise ValueError(f"the anchor {name} cannot be read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"the anchor {name} is not a regular file")
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    try:
        return parse_anchor(data)
    except ValueError as exc:
        raise ValueError(f"the anchor {name} is unreadable: {exc}") from None


def ends_with_hash(data: bytes, digest: str) -> bool:
    """Whether ``data`` (the bytes just before an offset) ends with the complete line hashed ``digest``."""
    return data.endswith(b',"hash":"%s"}\n' % digest.encode())


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
    after_anchor: int | None = None  # records after the anchored end (None: not checked against an anchor)


def log_location(configured: str | None, state_dir: str | os.PathLike[str]) -> Path:
    """Where a host's audit log lives: ``[plugins.audit] path`` when configured, else
    ``<state_dir>/audit.jsonl`` (the plugin writes there, ``audit verify`` reads there)."""
    return Path(os.path.abspath(os.path.expanduser(configured if configured else Path(state_dir) / "audit.jsonl")))


def chain_files(path: str | Path) -> list[Path]:
    """The files of a log in chain order: rotated ``<stem>.<n>.jsonl`` by n, then the live file.

    For a live file (``audit.jsonl``), its rotated predecessors beside it come first: after a
    rotation the live file starts with a record that links to the last rotated one, so it can only
    be verified together with them. A rotated file given on its own is read on its own."""
    p = Path(path)
    if p.is_dir():
        live = sorted(q for q in p.glob("*.jsonl") if not ROTATED.match(q.name))
        rotated = sorted((q for q in p.glob("*.jsonl") if ROTATED.match(q.name)),
                         key=lambda q: int(ROTATED.match(q.name).group("n")))  # type: ignore[union-attr]
        return rotated + live
    if p.name.endswith(".jsonl") and not ROTATED.match(p.name):
        stem = p.name[: -len(".jsonl")]
        siblings = [(int(m.group("n")), q) for q in p.parent.glob(f"{glob.escape(stem)}.*.jsonl")
                    if (m := ROTATED.match(q.name)) and m.group("stem") == stem]
        return [q for _, q in sorted(siblings)] + [p]
    return [p]


def verify(path: str | Path, *, anchor: str | None = None, key: bytes | None = None,
           head: Anchor | None = None, require_signed: bool = False) -> VerifyReport:
    """Check every record's hash and link, across rotated files; report the first bad line.

    With ``key``, every checkpoint's HMAC is checked too, and the report says
    how many checkpoints verified and how many records follow the last one;
    ``require_signed`` fails a log with no verified checkpoint (and an unsigned
    ``head``). With ``head`` (the writer's anchor of the live file), the live
    file must still hold the anchored record at the anchored size: records cut
    from the end, an emptied or replaced file fail; with ``key`` the anchor's
    signature is checked, and an anchor older than the last verified checkpoint
    (rolled back) fails. ``anchor`` is a last hash kept elsewhere.
    A ``tamper`` record (the writer found the log not as it left it) fails.
    An incomplete final line of the live file (a writer killed mid-write) is
    reported as ``torn_tail``, not counted, and does not fail verification.
    """
    files = chain_files(path)
    prev = GENESIS
    count = signed = checkpoints = 0
    torn = False
    names = tuple(str(f) for f in files)
    anchored_at: int | None = None  # records verified when the live file reached head.size
    anchored_line = 0  # the line of the live file that ends at head.size
    unanchored_checkpoint_end: int | None = None  # in the live file: the first verified checkpoint past the anchor
    live_start = offset = 0
    live_prev = GENESIS  # the hash the live file chains from: the end of the files before it

    def failed(file: Path | None, number: int | None, reason: str) -> VerifyReport:
        return VerifyReport(False, count, names, prev, str(file) if file else (names[-1] if names else None),
                            number, reason, checkpoints, count - signed if key is not None else 0, torn)

    if head is not None and key is not None and not head.signed_by(key) and (
            head.hmac is not None or require_signed):
        return failed(None, None, "the anchor's signature does not verify: it was rewritten, or signed "
                                      "with another key" if head.hmac else "the anchor is not signed")
    for file in files:
        live = file is files[-1]
        if live:
            live_start, live_prev = count, prev
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return failed(file, None, "the log is a symlink, not the file the writer created")
            return failed(file, None, f"cannot read: {exc.strerror}")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return failed(file, None, "the log is not a regular file (a FIFO or device was put in its place)")
        offset = 0
        with os.fdopen(fd, "rb") as handle:
            for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
                if len(raw) > MAX_LINE_BYTES:  # never a torn record: no record is that long
                    return failed(file, number, f"a line of more than {MAX_LINE_BYTES} bytes: no record is that long")
                if not raw.endswith(b"\n") and live:
                    # The kernel may cut a write short when the writer is killed mid-way; the
                    # writer removes such a tail before its next append. Not a verified record.
                    torn = True
                    break
                problem = check_line(raw, prev)
                if isinstance(problem, str):
                    return failed(file, number, problem)
                kind = problem.get("kind")
                if kind == "tamper":
                    return failed(file, number, f"the writer found the log tampered with: {problem.get('reason')}"
                                                f" (the untrusted file was kept as {problem.get('moved_to')})")
                if key is not None and kind == "checkpoint":
                    mac = problem.get("hmac")
                    if not isinstance(mac, str) or not hmac.compare_digest(mac, checkpoint_mac(key, prev)):
                        return failed(file, number, "checkpoint signature does not verify: the log was rewritten, "
                                                    "or signed with another key")
                    checkpoints += 1
                    signed = count + 1
                    if live and head is not None and unanchored_checkpoint_end is None \
                            and offset + len(raw) > head.size:
                        unanchored_checkpoint_end = offset + len(raw)
                prev = problem["hash"]
                count += 1
                offset += len(raw)
                if live and head is not None and offset == head.size:
                    anchored_at = count
                    anchored_line = number
                    if prev != head.hash:
                        return failed(file, number, "the record at the anchored end is not the anchored one: "
                                                    "the log was rewritten or replaced")
    unsigned = count - signed if key is not None else 0
    after: int | None = None
    if head is not None:
        if head.size == 0:
            # An empty anchored end is where the files before the live one end (found by attack: a
            # writer that adopted the log of a writer killed while rotating anchored its empty live
            # file; the rotated files cut short, or all deleted, then verified).
            anchored_at = live_start
            if live_prev != head.hash:
                count, prev = live_start, live_prev
                return failed(None, None, f"the files before the live one end in {live_prev[:16]}…, the anchor "
                                          f"says {head.hash[:16]}…: rotated files were cut short, deleted or "
                                          "replaced")
        if anchored_at is None:
            have = offset
            what = "emptied" if have == 0 else "cut short or rewritten"
            return failed(None, None, f"the log was {what}: the anchor says {head.records} record(s) in "
                                      f"{head.size} bytes ending in {head.hash[:16]}…, the file has {have} bytes")
        after = count - anchored_at
        if head.closed and torn and not after:
            # No writer ran after the close to be killed mid-write: the bytes were appended since (the
            # writer's next start calls them tampering; found by attack: verify passed them as torn).
            count, prev = anchored_at, head.hash
            return failed(files[-1], anchored_line + 1, "an incomplete line follows the end its last writer "
                                                        "closed the log at: appended while no writer ran")
        if head.closed and after:  # the first of them named (found by attack: no line was)
            count, prev = anchored_at, head.hash  # what verified: the chain up to the closed end
            return failed(files[-1], anchored_line + 1, f"{after} record(s) follow the end its last writer "
                                                        "closed the log at: appended while no writer ran")
        # A checkpoint past the anchor that ends the file is what a writer killed between writing it
        # and anchoring it leaves; with records after it, the anchor was rolled back (the writer
        # judges a log it adopts the same way).
        if key is not None and head.signed_by(key) and unanchored_checkpoint_end is not None \
                and unanchored_checkpoint_end < offset:
            return failed(None, None, "the anchor is older than a signed checkpoint that records follow: "
                                      "the anchor was rolled back")
    if require_signed and key is not None and checkpoints == 0:
        return failed(None, None, "no signed checkpoint verifies: the checkpoints were removed, or the log "
                                  "was never signed (--allow-unsigned accepts that)")
    if anchor is not None and anchor != prev:
        return VerifyReport(False, count, names, prev, names[-1] if names else None, None,
                            f"last hash {prev[:16]}… is not the anchor {anchor[:16]}…: records were removed "
                            "from the end or the log was replaced", checkpoints, unsigned, torn)
    return VerifyReport(True, count, names, prev, checkpoints=checkpoints, unsigned=unsigned, torn_tail=torn,
                        after_anchor=after)


_HASH_SUFFIX: Final = re.compile(rb',"hash":"([0-9a-f]{64})"\}\n\Z')


def check_line(raw: bytes, prev: str) -> dict[str, Any] | str:
    """The record of one line (with its newline) that chains from ``prev``, or what is wrong with it."""
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
    except (ValueError, RecursionError):  # found by attack: nesting past the parser's limit crashed verify
        return "not valid JSON (or nested deeper than any record)"
    if not isinstance(record, dict):
        return "not an audit record"
    if record.get("prev") != prev:
        return "chain broken: a record before this one was deleted, inserted or reordered"
    return record


class UnreadableLog(ValueError):
    """A file of a log that ``read_records`` will not read (it names the file)."""


def read_records(path: str | Path) -> Iterable[dict[str, Any]]:
    """Every parseable record of a log (file or directory), in chain order; lines that are no
    record (not a JSON object, or longer than ``MAX_LINE_BYTES``: skipped a piece at a time) are
    passed over. ``UnreadableLog`` naming a file of the log that is not a regular file (never read:
    found by attack, a FIFO or ``/dev/zero`` among the rotated files hung ``tail`` and ``stats``)."""
    for file in chain_files(path):
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise UnreadableLog(f"{file}: cannot read: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnreadableLog(f"{file}: not a regular file (a FIFO, device or directory is in its place)")
        with os.fdopen(fd, "rb") as handle:
            while raw := handle.readline(MAX_LINE_BYTES + 1):
                if len(raw) > MAX_LINE_BYTES:
                    while raw and not raw.endswith(b"\n"):
                        raw = handle.readline(MAX_LINE_BYTES + 1)
                    continue
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict):  # found by attack: a line ``[1]`` crashed tail and stats
                    yield record
