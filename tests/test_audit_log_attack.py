"""Attacks on the audit log on disk, as a host restarts over it and as ``amplifier-tools audit``
reads it (2026-11-30 review): what was left at the anchor's name, a FIFO at the log's path under
``verify --json``, and a record appended after a writer closed the log.

Each test states what a user sees: the host starts and records, ``verify`` names the file and
line, ``--json`` output stays JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_audit_trust import log_path, make, one_run

from amplifier_tools.builtins.audit.chain import anchor_path, encode_body, link, verify
from amplifier_tools.builtins.audit.commands import main as audit_main


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def run_audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = audit_main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
async def test_a_directory_at_the_anchors_name_is_tampering_and_the_host_still_records(
        tmp_path: Path, mode: str) -> None:
    """Found by attack: a directory made at ``<log>.anchor`` between two runs (the doc's "an anchor
    that is ... not a regular file" is tampering: a fresh segment). The writer set the log aside,
    started the fresh segment, then could not rename its anchor over a directory: a ``fail_closed``
    host did not start at all ("cannot open the audit log <log>: Is a directory", naming the log,
    not the anchor) and set another fresh segment aside at every try; a ``fail_open`` host ran every
    call unrecorded. Now the directory is set aside too, and the fresh segment says what was found."""
    await one_run(tmp_path, 2)
    path = log_path(tmp_path)
    anchor_path(path).unlink()
    anchor_path(path).mkdir()
    host = await make(tmp_path, mode=mode)  # starts
    try:
        result = await host.call("test_echo", {"text": "after"})
        if mode == "fail_closed":
            assert not result.success and result.error["code"] == "audit_tampered"
        else:
            assert result.success
    finally:
        await host.close()
    written = records(path)
    assert written[0]["kind"] == "tamper" and "audit.jsonl.anchor" in written[0]["reason"]
    assert "is a directory" in written[0]["reason"]
    assert [r["arguments"] for r in written if r["kind"] == "call"] == [{"text": "after"}]  # recorded
    assert anchor_path(path).is_file()
    kept = sorted(p.name for p in path.parent.iterdir())
    assert sum(name.startswith("audit.jsonl.anchor.tampered-") for name in kept) == 1, kept  # the evidence
    assert sum(name.startswith("audit.jsonl.tampered-") for name in kept) == 1, kept  # one, not one per start
    # A second start takes the fresh segment as it is (nothing more is set aside).
    await one_run(tmp_path, 1)
    assert sorted(p.name for p in path.parent.iterdir()) == kept


async def test_a_directory_made_at_the_anchors_name_while_the_host_runs_is_repaired(tmp_path: Path) -> None:
    """Found by attack: the doc says a swap of the anchor while a writer runs is repaired, "rename
    replaces whatever is at the name" — not a directory: the writer logged "anchor not updated" at
    every cycle, never anchored again, and the log, untouched, no longer verified after the host
    closed."""
    path = log_path(tmp_path)
    host = await make(tmp_path, fsync_interval_ms=10)
    try:
        assert (await host.call("test_echo", {"text": "before"})).success
        anchor_path(path).unlink()
        anchor_path(path).mkdir()
        for i in range(3):
            assert (await host.call("test_echo", {"text": f"during {i}"})).success
    finally:
        await host.close()
    report = verify(path, head=None)
    assert report.ok and report.records == 4
    assert anchor_path(path).is_file()
    from amplifier_tools.builtins.audit.chain import read_anchor

    anchor = read_anchor(anchor_path(path))
    assert anchor is not None and anchor.closed and anchor.records == 4
    assert verify(path, head=anchor).ok
    assert any(p.name.startswith("audit.jsonl.anchor.tampered-") and p.is_dir() for p in path.parent.iterdir())


def test_verify_json_on_a_fifo_at_the_logs_path_prints_json(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Found by attack: ``audit verify --json`` printed the text line ``TAMPERED: ...`` when a FIFO
    (or a device) was at the log's path; every other outcome of ``--json`` is one JSON object."""
    path = tmp_path / "audit.jsonl"
    os.mkfifo(path)
    status, out, _ = run_audit(capsys, "verify", "--json", str(path))
    report = json.loads(out)
    assert status == 1 and report["ok"] is False and report["bad_file"] == str(path)
    assert "not a regular file" in report["reason"]
    status, out, _ = run_audit(capsys, "verify", str(path))
    assert status == 1 and out.startswith(f"TAMPERED: {path}: ")


async def test_verify_names_the_first_record_appended_after_the_log_was_closed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by attack: a record chained onto a closed log was reported ("appended while no writer
    ran") with no line, and as counted among the verified records; verify names the first bad line
    of every other tampering. Now: the first appended line, and the records before it."""
    await one_run(tmp_path, 3)
    path = log_path(tmp_path)
    head = records(path)[-1]["hash"]
    forged, digest = link(encode_body({"v": 1, "kind": "call", "call_id": "forged", "tool": "test_echo"}), head)
    more, _ = link(encode_body({"v": 1, "kind": "call", "call_id": "forged-2", "tool": "test_echo"}), digest)
    with path.open("ab") as file:
        file.write(forged + more)
    status, out, _ = run_audit(capsys, "verify", "--json", str(path))
    report = json.loads(out)
    assert status == 1 and report["bad_file"] == str(path) and report["bad_line"] == 4
    assert report["records"] == 3 and report["last_hash"] == head
    assert "2 record(s) follow the end" in report["reason"]
    status, out, _ = run_audit(capsys, "verify", str(path))
    assert status == 1 and out.startswith(f"TAMPERED: {path}:4: 2 record(s) follow")
    assert "(3 records verified before it)" in out


@pytest.mark.parametrize("command", ["verify", "tail", "stats"])
def test_a_path_that_cannot_be_looked_up_is_unreadable_input_not_an_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Found by attack: ``audit verify FILE/x`` (a file named as a directory) or a name too long for
    the file system raised out of the command: "internal error", exit 1 (which ``verify`` uses for
    tampering), the "this is a bug" hint, and nothing on stdout with ``--json``. Now exit 2,
    unreadable input, naming the path."""
    plain = tmp_path / "file"
    plain.write_text("")
    for path in (str(plain / "audit.jsonl"), str(tmp_path / ("a" * 300))):
        status, out, err = run_audit(capsys, command, "--json", path)
        failure = json.loads(out)["error"]
        assert status == 2 and failure["exit_status"] == 2 and failure["message"].startswith(f"{path}: cannot read")
        status, out, err = run_audit(capsys, command, path)
        assert status == 2 and err.startswith(f"error: {path}: cannot read: ") and out == ""


async def test_verify_of_a_rotated_log_whose_live_file_was_deleted_names_the_deleted_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by attack: with rotated files beside it, a live file deleted next to its anchor was
    reported as "no anchor (<log>.2.jsonl.anchor) beside the log" — the last rotated file taken
    for the live log, and its (never written) anchor for the missing one; the anchor that is there
    was not named. Now the deleted log is what verify reports, as it is without rotated files."""
    host = await make(tmp_path, rotate_bytes=1500)
    try:
        for i in range(6):
            assert (await host.call("test_echo", {"text": f"call {i}"})).success
    finally:
        await host.close()
    path = log_path(tmp_path)
    assert any(p.name == "audit.2.jsonl" for p in path.parent.iterdir())
    path.unlink()
    status, out, _ = run_audit(capsys, "verify", "--json", str(path.parent))
    report = json.loads(out)
    assert status == 1 and report["ok"] is False
    assert report["reason"] == (f"no log beside the anchor {anchor_path(path)}: the log it anchors was deleted "
                                "or moved")
    # A directory of rotated files kept elsewhere, with no anchor, still fails for want of one.
    anchor_path(path).unlink()
    status, out, _ = run_audit(capsys, "verify", str(path.parent))
    assert status == 1 and "no anchor" in out
