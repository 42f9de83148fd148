"""The anchor never names records that are not on the disk yet (unless ``fsync = "never"``).

A crash or power loss loses what was written but not fsynced. The anchor is a separate file
replaced by a rename, which the filesystem may make durable before the log's tail. An anchor
naming a tail that was then lost reads as a log "cut short": after every power loss, a false
tampering alarm, and the next start sets the log aside. So, before an anchor is written, the log
is fsynced up to the head the anchor names. These tests watch the order of the system calls,
since a power loss cannot be staged in a test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools.builtins.audit import writer as writer_module
from amplifier_tools.builtins.audit.chain import encode_body, parse_anchor


class Disk:
    """Records, for the log's inode, the largest size an fsync covered, and checks every anchor
    renamed into place against it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
        self.log = log
        self.synced: dict[int, int] = {}
        self.anchors: list[tuple[int, int, int]] = []  # (inode, size anchored, size fsynced by then)
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd: Any) -> None:
            real_fsync(fd)
            st = os.fstat(fd)
            self.synced[st.st_ino] = max(self.synced.get(st.st_ino, 0), st.st_size)

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if os.fspath(dst) == log.name + ".anchor" and "src_dir_fd" in kwargs:
                fd = os.open(src, os.O_RDONLY, dir_fd=kwargs["src_dir_fd"])
                try:
                    anchor = parse_anchor(os.read(fd, 1 << 16))
                finally:
                    os.close(fd)
                self.anchors.append((anchor.inode, anchor.size, self.synced.get(anchor.inode, 0)))
            real_rename(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)

    def unsynced_anchors(self) -> list[tuple[int, int, int]]:
        return [a for a in self.anchors if a[1] > a[2]]


def body(i: int) -> bytes:
    return encode_body({"v": 1, "kind": "event", "i": i})


@pytest.mark.parametrize("fsync", ["interval", "always"])
def test_a_checkpoint_anchor_names_only_fsynced_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        fsync: str) -> None:
    """Found by review: a signed checkpoint anchored the head at once, before the fsync thread's
    next cycle had made the records durable (under ``"interval"``, up to ``fsync_interval_ms``
    later)."""
    log = tmp_path / "audit.jsonl"
    disk = Disk(monkeypatch, log)
    writer = writer_module.AuditWriter(log, fsync=fsync, fsync_interval_ms=60_000, checkpoint_key=b"k" * 32,
                                       checkpoint_key_ref="KEY", checkpoint_every=2)
    try:
        for i in range(6):
            writer.append(body(i))
    finally:
        writer.close()
    assert len(disk.anchors) >= 4  # the new log, three checkpoints, the close
    assert disk.unsynced_anchors() == []


def test_an_anchor_after_another_writers_records_names_only_fsynced_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that finds another process's records anchors them with its next record at once."""
    log = tmp_path / "audit.jsonl"
    disk = Disk(monkeypatch, log)
    first = writer_module.AuditWriter(log, fsync="interval", fsync_interval_ms=60_000)
    second = writer_module.AuditWriter(log, fsync="interval", fsync_interval_ms=60_000)
    try:
        first.append(body(0))
        first._release()  # as the loop does after its turn: other writers may append
        second.append(body(1))
        second._release()
        first.append(body(2))
    finally:
        first.close()
        second.close()
    assert disk.unsynced_anchors() == []


def test_under_never_the_anchor_does_not_wait_for_the_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fsync = "never"`` leaves durability to the OS, the anchor too: no fsync is added."""
    log = tmp_path / "audit.jsonl"
    disk = Disk(monkeypatch, log)
    writer = writer_module.AuditWriter(log, fsync="never", checkpoint_key=b"k" * 32, checkpoint_key_ref="KEY",
                                       checkpoint_every=1)
    try:
        for i in range(3):
            writer.append(body(i))
    finally:
        writer.close()
    assert disk.synced == {}
    assert len(disk.anchors) >= 3
