"""The audit writer attacked with real processes sharing one log: a writer killed while it rotates the
log leaves no false tampering for the next writer, and the log still verifies against its anchor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from amplifier_tools.builtins.audit.chain import anchor_path, encode_body, read_anchor, verify
from amplifier_tools.builtins.audit.writer import AuditWriter

KEY = b"k" * 32

#: Appends until the log rotates, and dies (``os._exit``: as ``kill -9``, no close, no cleanup) at
#: the step of the rotation named by argv[2]: after the rename, after creating the new live file, or
#: after writing its ``rotated`` record — in each case before the rotation is anchored.
KILLED_ROTATING = textwrap.dedent("""
    import os, sys, time
    from amplifier_tools.builtins.audit import writer as writer_module
    from amplifier_tools.builtins.audit.chain import encode_body
    from amplifier_tools.builtins.audit.writer import AuditWriter

    path, step, keyed = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    real_open, real_write_line = writer_module.open_host_file, AuditWriter._write_line

    def open_host_file(name, flags, **kw):
        if step == "renamed" and flags & os.O_EXCL and name == os.path.basename(path):
            os._exit(9)
        return real_open(name, flags, **kw)

    def write_line(self, fd, body):
        if step == "created" and b'"rotated"' in body:
            os._exit(9)
        real_write_line(self, fd, body)
        if step == "rotated" and b'"rotated"' in body:
            os._exit(9)

    writer_module.open_host_file = open_host_file
    AuditWriter._write_line = write_line
    w = AuditWriter(path, fsync="always", rotate_bytes=600, checkpoint_key=b"k" * 32 if keyed else None,
                    checkpoint_every=3)
    for i in range(100):
        w.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": f"killed.{i}"}))
        print(i, flush=True)
""")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("step", ["renamed", "created", "rotated"])
def test_a_writer_killed_while_rotating_leaves_no_false_tampering(tmp_path: Path, step: str, keyed: bool) -> None:
    # Found by attack (3 processes on a log rotated every 2 KB, kill -9 at random): a writer killed
    # between renaming the live file and anchoring the new one left the anchor naming the rotated
    # file; the next writer to start took the log for replaced (or deleted), set it aside and
    # started a fresh segment, and every writer sharing the log then reported tampering too.
    path = tmp_path / "audit.jsonl"
    killed = subprocess.run([sys.executable, "-c", KILLED_ROTATING, str(path), step, "1" if keyed else "0"],
                            capture_output=True, text=True, env=_env(), timeout=60)
    assert killed.returncode == 9, killed.stderr
    acked = [f"killed.{i}" for i in map(int, killed.stdout.split())]
    assert acked and (tmp_path / "audit.1.jsonl").exists()
    found: list[str] = []
    writer = AuditWriter(path, fsync="always", rotate_bytes=600, checkpoint_key=KEY if keyed else None,
                         checkpoint_every=3, on_tamper=lambda reason, moved: found.append(reason))
    for i in range(5):
        writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": f"next.{i}"}))
    writer.close()
    assert found == [] and writer.tampered is None
    assert not [p.name for p in tmp_path.iterdir() if ".tampered-" in p.name]
    report = verify(path, key=KEY if keyed else None, head=read_anchor(anchor_path(path)))
    assert report.ok, report
    calls = [r["n"] for f in report.files for r in map(json.loads, Path(f).read_text().splitlines())
             if r["kind"] == "call"]
    # (the record whose append the kill interrupted, rotation and all, is there too, never acknowledged)
    assert calls[: len(acked)] == acked and calls[-5:] == [f"next.{i}" for i in range(5)]
    assert len(calls) == len(acked) + 6


@pytest.mark.parametrize("attack", ["forged live file", "closed log rotated by hand", "older rotated file"])
def test_an_anchor_naming_a_rotated_file_is_still_tampering_unless_a_rotation_was_cut_short(
        tmp_path: Path, attack: str) -> None:
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path, rotate_bytes=400 if attack == "older rotated file" else None)
    for i in range(8):
        writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": i}))
    writer.close()
    if attack == "older rotated file":  # an anchor of the first file put back: later files follow it
        first = tmp_path / "audit.1.jsonl"
        data = json.loads(anchor_path(path).read_text())
        last = json.loads(first.read_text().splitlines()[-1])["hash"]
        data.update(inode=first.stat().st_ino, size=first.stat().st_size, hash=last, closed=False)
        assert (tmp_path / "audit.2.jsonl").exists()
        anchor_path(path).write_text(json.dumps(data))
    else:
        path.rename(tmp_path / "audit.1.jsonl")
        path.write_text("" if attack == "closed log rotated by hand" else
                        json.dumps({"v": 1, "kind": "call", "n": "forged"}) + "\n")
    found: list[str] = []
    AuditWriter(path, on_tamper=lambda reason, moved: found.append(reason)).close()
    assert found and "replaced" in found[0]


#: Opens the log, appends three records and closes: another process sharing the log.
OTHER = textwrap.dedent("""
    import sys, time
    from amplifier_tools.builtins.audit.chain import encode_body
    from amplifier_tools.builtins.audit.writer import AuditWriter
    writer = AuditWriter(sys.argv[1])
    for i in range(3):
        writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": f"other.{i}"}))
    writer.close()
""")


@pytest.mark.parametrize("then", ["close", "refresh"])
def test_records_of_another_writer_cut_off_while_one_is_idle_stay_detected_after_it_appends(
        tmp_path: Path, then: str) -> None:
    # Found by attack: writer A idle at its own end, another process appended (and anchored, and
    # closed), its records were cut off back to A's end; A appended again past the anchored end and
    # re-anchored its own head (at its thread's refresh, or as it closed): the log verified.
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path, fsync_interval_ms=10)
    writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": "a.0"}))
    time.sleep(0.1)  # anchored by its thread
    cut = path.stat().st_size
    subprocess.run([sys.executable, "-c", OTHER, str(path)], check=True, env=_env(), timeout=60)
    assert len(path.read_text().splitlines()) == 4
    os.truncate(path, cut)
    for i in range(1, 6):
        writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": f"a.{i}"}))
    if then == "refresh":
        time.sleep(0.2)  # its thread's refreshes
        assert not verify(path, head=read_anchor(anchor_path(path))).ok
    writer.close()
    assert not verify(path, head=read_anchor(anchor_path(path))).ok
    found: list[str] = []
    AuditWriter(path, on_tamper=lambda reason, moved: found.append(reason)).close()
    assert found and "rewritten" in found[0]


@pytest.mark.parametrize("then", ["untouched", "rotated files deleted", "last rotated file cut short"])
def test_an_empty_live_file_adopted_after_a_killed_rotation_keeps_the_chain(tmp_path: Path, then: str) -> None:
    # Found by attack: a writer killed after renaming the live file away; the next writer adopted the
    # log, anchored its empty live file and closed before its first record (a host that made no
    # call). The writer after it chained the live file from genesis (false tampering: the log no
    # longer verified); and verify passed the log with its rotated files cut short, or all deleted.
    path = tmp_path / "audit.jsonl"
    killed = subprocess.run([sys.executable, "-c", KILLED_ROTATING, str(path), "renamed", "0"],
                            capture_output=True, text=True, env=_env(), timeout=60)
    assert killed.returncode == 9, killed.stderr
    found: list[str] = []
    AuditWriter(path, on_tamper=lambda reason, moved: found.append(reason)).close()
    assert found == [] and path.stat().st_size == 0
    rotated = sorted(tmp_path.glob("audit.*.jsonl"), key=lambda p: int(p.name.split(".")[1]))
    if then == "rotated files deleted":
        for file in rotated:
            file.unlink()
    elif then == "last rotated file cut short":
        lines = rotated[-1].read_bytes().splitlines(keepends=True)
        rotated[-1].write_bytes(b"".join(lines[:-1]))
    report = verify(path, head=read_anchor(anchor_path(path)))
    assert report.ok is (then == "untouched"), report
    if then == "untouched":
        writer = AuditWriter(path, on_tamper=lambda reason, moved: found.append(reason))
        writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": "next"}))
        writer.close()
        assert found == []
        report = verify(path, head=read_anchor(anchor_path(path)))
        assert report.ok, report
    else:
        assert "rotated files were cut short, deleted or replaced" in str(report.reason)


def test_a_start_on_a_log_whose_live_file_is_there_lists_no_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by attack: every start listed the log's directory to look for the last rotated file
    # (0.5 s with 200,000 files beside the log), though it is looked for only when the live file
    # is gone (a writer killed while rotating).
    path = tmp_path / "audit.jsonl"
    writer = AuditWriter(path)
    writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "n": 0}))
    writer.close()
    listed: list[object] = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda *args: listed.append(args) or real_listdir(*args))
    AuditWriter(path).close()
    assert listed == []
