"""Attacks on the audit log's tamper evidence (audit38, 2026-12-02).

1. A disk full at the moment the writer finds tampering: the fresh segment's ``tamper`` record
   could not be written, the next call's record became the segment's first, nothing was reported
   (no stderr line, no ``audit:tamper`` event) and the live log verified — the tampering visible
   only in the file set aside. Reproduced for real on a 64 KiB tmpfs; here the ENOSPC is injected.
2. An incomplete line appended after the end a writer *closed* the log at: ``verify`` passed it as
   a torn tail ("a writer was killed mid-write") while the next writer calls the same bytes
   tampering — no writer ran to be killed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_audit_trust import TamperEvents, anchor_of, call, cli_verify, lines, log_path, make

from amplifier_tools.builtins.audit import writer as writer_module
from amplifier_tools.builtins.audit.chain import GENESIS, Anchor, encode_anchor, read_anchor, verify


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed"])
async def test_a_full_disk_when_tampering_is_found_never_loses_the_tamper_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    events = TamperEvents()
    host = await make(tmp_path, events=events, mode=mode)
    log = log_path(tmp_path)
    try:
        for i in range(3):
            assert (await call(host, f"t{i}")).success
        with open(log, "ab") as handle:  # a forged line that does not chain
            handle.write(b'{"forged":1}\n')
        real_write = os.write
        full = {"on": True}

        def write(fd: int, data: bytes) -> int:  # the disk is full while the tamper record is written
            if full["on"] and b'"kind":"tamper"' in bytes(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(writer_module.os, "write", write)
        await call(host, "during-full")
        full["on"] = False  # space freed
        for i in range(2):
            await call(host, f"after{i}")
        await asyncio.sleep(0.1)  # the audit:tamper event is emitted from a task
    finally:
        await host.close()
    records = lines(log)
    assert records[0]["kind"] == "tamper", [r.get("kind") for r in records]
    assert "TAMPERING" in capsys.readouterr().err
    assert events.events, "no audit:tamper event"
    assert not verify(log, head=read_anchor(anchor_of(tmp_path))).ok


async def test_an_incomplete_line_after_a_closed_end_fails_verify(tmp_path: Path) -> None:
    host = await make(tmp_path)
    try:
        for i in range(3):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()
    log = log_path(tmp_path)
    with open(log, "ab") as handle:  # appended while no writer ran; no newline, so it reads as "torn"
        handle.write(b'{"forged":"appended after the close"')
    report = verify(log, head=read_anchor(anchor_of(tmp_path)))
    assert not report.ok, report
    assert report.records == 3 and report.bad_line == 4
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cli = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", str(log)],
                         capture_output=True, text=True, env=environ, timeout=120)
    assert cli.returncode != 0, cli.stdout
    # ...and the writer agrees: the next start calls the same bytes tampering.
    host = await make(tmp_path)
    try:
        await call(host, "restart")
        assert host is not None
    finally:
        await host.close()
    assert lines(log)[0]["kind"] == "tamper"


async def test_verify_of_the_current_directory_with_its_live_log_deleted_reports_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3. ``audit verify .`` (the log's directory given as ``.``) with the live log deleted crashed with
    ``ValueError: PosixPath('.') has an empty name`` instead of naming the deleted log."""
    host = await make(tmp_path, rotate_bytes=1500)
    try:
        for i in range(8):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()
    log_path(tmp_path).unlink()
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cli = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", "."], capture_output=True,
                         text=True, env=environ, timeout=120, cwd=log_path(tmp_path).parent)
    assert cli.returncode == 1
    assert "TAMPERED" in cli.stdout and "no log beside the anchor" in cli.stdout, cli.stdout + cli.stderr


async def test_an_event_record_says_what_was_altered_in_its_data(tmp_path: Path) -> None:
    """4. ``audit.event`` escaped a lone surrogate, NaN and a non-string key in ``data`` but dropped the
    notes: the record had no ``altered``, unlike a call's (docs/audit.md, "Every call is recorded")."""
    host = await make(tmp_path)
    try:
        record = host.capabilities.get("audit.event")
        assert record("refused", {"bad": "\udc80x", "n": float("nan"), 1: "int key"})
    finally:
        await host.close()
    event = lines(log_path(tmp_path))[-1]
    assert event["kind"] == "event" and event["data"]["bad"] == "\\udc80x"
    assert any(note.startswith("/data/bad") for note in event.get("altered", ())), event
    assert verify(log_path(tmp_path), head=read_anchor(anchor_of(tmp_path))).ok


async def test_a_tamper_record_the_full_disk_kept_out_until_close_is_not_forgotten_at_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1b. As 1, the disk still full when the host closes: the empty fresh segment must not be
    anchored (as "closed" at 0 bytes), or the next start takes it for a new log and the tampering
    is in no chain at all."""
    host = await make(tmp_path, mode="fail_closed")
    log = log_path(tmp_path)
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if b'"kind":"tamper"' in bytes(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    try:
        for i in range(2):
            assert (await call(host, f"t{i}")).success
        await asyncio.sleep(0.3)  # anchored at two records
        with open(log, "ab") as handle:
            handle.write(b'{"forged":1}\n')
        monkeypatch.setattr(writer_module.os, "write", write)
        assert not (await call(host, "during-full")).success
        await asyncio.sleep(0.3)  # the fsync thread's anchor refreshes
    finally:
        await host.close()
    monkeypatch.setattr(writer_module.os, "write", real_write)
    host = await make(tmp_path, mode="fail_open")
    try:
        await call(host, "restart")
    finally:
        await host.close()
    assert lines(log)[0]["kind"] == "tamper", lines(log)


def _refuse_tamper_records(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """The writer's ``tamper`` record fails with ENOSPC while ``full["on"]`` (as in 1 and 1b)."""
    full = {"on": True}
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if full["on"] and b'"kind":"tamper"' in bytes(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(writer_module.os, "write", write)
    return full


@pytest.mark.parametrize("change", ["appended", "deleted"])
async def test_a_tamper_record_written_by_close_checks_the_fresh_segment_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """1c (session 40). As 1b, the fresh segment changed before close (a line appended to it, or it
    was deleted) and the disk freed: close() wrote the pending tamper record without checking the
    file, after the appended line or into the deleted file, and anchored it there; ``audit verify``
    then failed on the appended line (the tamper record's reason unread) or on a missing log, and
    the next start set the log aside as "rewritten" (the anchor not the file's end)."""
    host = await make(tmp_path, mode="fail_closed")
    log = log_path(tmp_path)
    try:
        for i in range(2):
            assert (await call(host, f"t{i}")).success
        with open(log, "ab") as handle:
            handle.write(b'{"forged":1}\n')
        full = _refuse_tamper_records(monkeypatch)
        assert not (await call(host, "during-full")).success
        assert log.read_bytes() == b""  # the fresh segment, its tamper record pending
        if change == "appended":
            with open(log, "ab") as handle:
                handle.write(b'{"forged":2}\n')
        else:
            log.unlink()
        full["on"] = False  # space freed before the host closes
    finally:
        await host.close()
    cli = cli_verify(str(log))
    assert cli.returncode == 1 and f"{log}:1: the writer found the log tampered with" in cli.stdout, cli.stdout
    assert read_anchor(anchor_of(tmp_path)).closed  # anchored at the live file's end
    host = await make(tmp_path)
    try:
        assert (await call(host, "restart")).success  # adopted: no tampering since the close
    finally:
        await host.close()
    assert [r["kind"] for r in lines(log)] == ["tamper", "call"], lines(log)


async def test_a_fresh_segment_left_empty_beside_the_anchor_of_the_logs_start_is_tampering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1d (session 40). As 1b, the tampering found before the fsync thread's first anchor refresh
    (the anchor still says 0 records of the first file): the next start took the empty fresh
    segment for a new log, and the tampering was in no chain."""
    host = await make(tmp_path)
    log = log_path(tmp_path)
    try:
        for i in range(2):
            assert (await call(host, f"t{i}")).success
        with open(log, "ab") as handle:
            handle.write(b'{"forged":1}\n')
        _refuse_tamper_records(monkeypatch)
        anchor_of(tmp_path).write_bytes(encode_anchor(Anchor(file=log.name, inode=log.stat().st_ino, size=0,
                                                             hash=GENESIS, records=0, ts=time.time())))
        await call(host, "during-full")
    finally:
        await host.close()  # the disk still full
    monkeypatch.undo()
    host = await make(tmp_path)
    try:
        await call(host, "restart")
    finally:
        await host.close()
    records = lines(log)
    assert records[0]["kind"] == "tamper" and "replaced" in records[0]["reason"], records


def _refuse_once(monkeypatch: pytest.MonkeyPatch, what: str) -> dict[str, bool]:
    """The writer's ``what`` (``"create"``: the fresh segment's ``O_EXCL`` create; ``"rename"``: the
    untrusted file's rename aside) fails with ENOSPC while ``full["on"]``."""
    full = {"on": True}
    real_open, real_rename = writer_module.open_host_file, os.rename

    def open_host_file(name: str, flags: int, **kwargs: object) -> int:
        if what == "create" and full["on"] and flags & os.O_EXCL and ".tmp" not in name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(name, flags, **kwargs)  # type: ignore[arg-type]

    def rename(src: str, dst: str, **kwargs: object) -> None:
        if what == "rename" and full["on"] and ".tampered-" in str(dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_rename(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writer_module, "open_host_file", open_host_file)
    monkeypatch.setattr(writer_module.os, "rename", rename)
    return full


@pytest.mark.parametrize("settled", [False, True], ids=["anchor-at-start", "anchor-refreshed"])
async def test_a_fresh_segment_the_full_disk_kept_from_being_created_is_reported_and_made_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], settled: bool) -> None:
    """5 (found by review of 1). The untrusted file renamed aside, the fresh segment's create refused
    (ENOSPC, EDQUOT): nothing was reported, and the next record went to a log opened anew — "deleted",
    with neither the reason nor the file set aside, or, the anchor still at the log's start, a new log
    with no tamper record at all that verified."""
    events = TamperEvents()
    host = await make(tmp_path, events=events)
    log = log_path(tmp_path)
    try:
        for i in range(3):
            assert (await call(host, f"t{i}")).success
        await asyncio.sleep(0.3)  # the fsync thread anchors the three records
        if not settled:  # the anchor as the log's first record left it, before the thread's refresh
            anchor_of(tmp_path).write_bytes(encode_anchor(Anchor(file=log.name, inode=log.stat().st_ino, size=0,
                                                                 hash=GENESIS, records=0, ts=time.time())))
        with open(log, "r+b") as handle:  # cut short by one record's tail
            handle.truncate(log.stat().st_size - 10)
        full = _refuse_once(monkeypatch, "create")
        await call(host, "during-full")
        await asyncio.sleep(0.1)  # the audit:tamper event is emitted from a task
        assert "TAMPERING" in capsys.readouterr().err and events.events, "not reported while the disk was full"
        full["on"] = False
        for i in range(2):
            await call(host, f"after{i}")
    finally:
        await host.close()
    records = lines(log)
    assert records[0]["kind"] == "tamper" and "cut short" in records[0]["reason"], records[0]
    assert records[0]["moved_to"] and (log.parent / records[0]["moved_to"]).exists()
    assert [r.get("arguments", {}).get("text") for r in records[1:]] == ["after0", "after1"]
    assert len(events.events) == 1  # reported once, not again when the segment is made
    assert not verify(log, head=read_anchor(anchor_of(tmp_path))).ok


async def test_a_fresh_segment_still_uncreated_at_close_is_made_by_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await make(tmp_path)
    log = log_path(tmp_path)
    try:
        for i in range(2):
            assert (await call(host, f"t{i}")).success
        with open(log, "ab") as handle:
            handle.write(b'{"forged":1}\n')
        full = _refuse_once(monkeypatch, "create")
        await call(host, "during-full")
        full["on"] = False  # space freed before the host closes
    finally:
        await host.close()
    assert lines(log)[0]["kind"] == "tamper"


async def test_a_rename_the_full_disk_refused_never_joins_the_untrusted_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry of 5 joins a fresh segment another writer made only once the untrusted file was set
    aside: a live log that itself began with a ``tamper`` record, cut short, and whose rename aside
    failed, must not be adopted as such a segment (its lost records accepted)."""
    host = await make(tmp_path)
    log = log_path(tmp_path)
    try:
        assert (await call(host, "t0")).success
        with open(log, "ab") as handle:  # a first tampering: the live log begins with a tamper record
            handle.write(b'{"forged":1}\n')
        for i in range(3):
            await call(host, f"s{i}")
        assert lines(log)[0]["kind"] == "tamper"
        await asyncio.sleep(0.3)
        with open(log, "r+b") as handle:  # a second: cut to its complete first two records
            handle.truncate(sum(len(line) for line in log.read_bytes().split(b"\n")[:2]) + 2)
        full = _refuse_once(monkeypatch, "rename")
        await call(host, "during-full")
        full["on"] = False
        await call(host, "after")
    finally:
        await host.close()
    records = lines(log)
    assert records[0]["kind"] == "tamper" and "cut short" in records[0]["reason"], records[0]
