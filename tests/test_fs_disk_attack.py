"""Found by attack: the filesystem tools and bash spill files on a full disk, and the owner of a
file the tools rewrite.

- ``fs_write_file``/``fs_edit_file`` meeting ``ENOSPC`` kept the old content and removed the temp
  file, but failed with the generic ``os_error`` (no hint), and a write below missing parents left
  the parents it had made behind; now ``no_space`` with a hint, and nothing is left;
- a host run as root that edited a user's ``0600`` file left it root's (unreadable to its owner);
  the new file keeps the owner and group as far as the host may set them;
- a bash spill file on a full disk raised ``OSError`` out of the pipe callback at every chunk (the
  tail was no longer kept), then failed the call as an untyped ``tool_raised`` after the command
  had run, leaving the other stream's spill file open; now the call returns as usual and
  ``<stream>_file_error`` says the file is incomplete.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from amplifier_tools import ToolHost

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only), unmounted after the test."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def _host(work: Path) -> ToolHost:
    host = ToolHost(builtins=["filesystem"], entry_points=False, working_dir=work, discover=False)
    await host.start()
    return host


def _assert_no_space(result: Any, path: str) -> None:
    assert result.error is not None, result.output
    assert result.error["type"] == "ExecutionError" and result.error["code"] == "no_space", result.error
    assert result.error["path"] == path and "full" in result.error["hint"], result.error


@needs_root
async def test_a_write_on_a_full_disk_is_no_space_and_changes_nothing(full_disk: Path) -> None:
    (full_disk / "f.txt").write_bytes(b"original\n")
    os.chmod(full_disk / "f.txt", 0o640)
    big = "x" * 200_000  # more than the 64 KiB the file system holds
    host = await _host(full_disk)
    try:
        _assert_no_space(await host.call("fs_write_file", {"path": "f.txt", "content": big}), "f.txt")
        _assert_no_space(await host.call("fs_edit_file", {"path": "f.txt", "old_string": "original",
                                                          "new_string": big}), "f.txt")
        _assert_no_space(await host.call("fs_write_file", {"path": "new.txt", "content": big}), "new.txt")
        _assert_no_space(await host.call("fs_write_file", {"path": "a/b/new.txt", "content": big}), "a/b/new.txt")
    finally:
        await host.close()
    assert (full_disk / "f.txt").read_bytes() == b"original\n"
    assert os.stat(full_disk / "f.txt").st_mode & 0o777 == 0o640
    assert sorted(os.listdir(full_disk)) == ["f.txt"]  # no temp file, no new file, no parents made


@needs_root
async def test_a_rewritten_file_keeps_its_owner_and_group(tmp_path: Path) -> None:
    private = tmp_path / "private.txt"
    private.write_text("hello\n")
    os.chmod(private, 0o600)
    os.chown(private, 1000, 1000)
    shared = tmp_path / "shared.txt"
    shared.write_text("hello\n")
    os.chmod(shared, 0o660)
    os.chown(shared, 0, 1000)
    host = await _host(tmp_path)
    try:
        edited = await host.call("fs_edit_file", {"path": "private.txt", "old_string": "hello", "new_string": "bye"})
        written = await host.call("fs_write_file", {"path": "shared.txt", "content": "bye\n"})
        created = await host.call("fs_write_file", {"path": "new.txt", "content": "new\n"})
    finally:
        await host.close()
    assert edited.success and written.success and created.success, (edited.error, written.error, created.error)
    st = os.stat(private)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1000, 1000, 0o600) and private.read_text() == "bye\n"
    st = os.stat(shared)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 1000, 0o660) and shared.read_text() == "bye\n"
    assert os.stat(tmp_path / "new.txt").st_uid == 0  # a new file is the host's


async def test_a_spill_file_on_a_full_disk_stops_spilling_not_the_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    from amplifier_tools.builtins.bash import tool

    opened: list[BinaryIO] = []

    def on_dev_full(directory: str, call_id: str) -> tuple[tuple[str, BinaryIO], tuple[str, BinaryIO]]:
        out = os.fdopen(os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC), "wb")  # every write: ENOSPC
        err = os.fdopen(os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC), "wb")
        opened.extend((out, err))
        return (os.path.join(directory, "out"), out), (os.path.join(directory, "err"), err)

    monkeypatch.setattr(tool, "open_spill_files", on_dev_full)
    config = {"plugins": {"bash": {"spill_dir": "spill", "sandbox": "off", "max_output_bytes": 1000}}}
    async with ToolHost(config=config, builtins=["bash"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        result = await host.call("bash", {"command": "head -c 300000 /dev/zero | tr '\\0' a; echo tail-end; "
                                                     "echo done >&2"})
    assert result.success, result.error
    out = result.output
    assert out["stdout_bytes"] == 300_009 and out["stdout"].endswith("aaatail-end\n")
    assert "full output is in" not in out["stdout"]
    assert "No space left" in out["stdout_file_error"] and out["stdout_file"] in out["stdout_file_error"]
    assert out["stderr"] == "done\n" and "No space left" in out["stderr_file_error"]
    assert all(file.closed for file in opened)
