"""Attacks on ``amplifier-tools audit verify|tail|stats`` and on config trust, from a hostile
workspace and with hostile audit files: each found by attack, each a typed error naming the file
(or output a terminal can show as it is), never a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli, cli_environ

from amplifier_tools import ConfigError, ToolHost
from amplifier_tools.builtins.audit import chain
from amplifier_tools.builtins.audit.chain import GENESIS, Anchor, encode_anchor, encode_body, link, verify
from amplifier_tools.builtins.audit.commands import main as audit_main

#: A tool name a model may choose: retitles the terminal, clears it, and hides the line.
HOSTILE = "evil\x1b]2;owned\x07\x1b[2J\r\x1b[K\u202e"


def write_log(path: Path, records: list[dict[str, object]], extra: bytes = b"") -> str:
    """A chained log of ``records`` (then ``extra`` as it is); the last hash."""
    prev, out = GENESIS, b""
    for record in records:
        line, prev = link(encode_body(record), prev)
        out += line
    path.write_bytes(out + extra)
    return prev


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line with a short timeout: a hang fails the test instead of stalling the run."""
    return subprocess.run([sys.executable, "-m", "amplifier_tools", *args], cwd=cwd, env=cli_environ(cwd),
                          capture_output=True, text=True, timeout=30)


async def test_tail_stats_and_verify_escape_control_characters_a_record_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(working_dir=work, config={"state_dir": str(tmp_path / "state")}) as host:
        result = await host.call(HOSTILE, {})
    assert result.error is not None and result.error["code"] == "unknown_tool"
    log = tmp_path / "state" / "audit.jsonl"
    for command in ("tail", "stats"):
        assert audit_main([command, str(log)]) == 0
        out = capsys.readouterr().out
        assert "evil" in out and "\\x1b]2;owned\\x07" in out and "\\u202e" in out, out
        assert not any(c in out for c in "\x1b\x07\r\u202e"), repr(out)
    forged = tmp_path / "forged.jsonl"  # a tamper record's reason is printed by verify
    write_log(forged, [{"v": 1, "kind": "tamper", "ts": 0, "reason": "x\x1b[2Jy", "moved_to": "z"}])
    assert audit_main(["verify", "--no-anchor", str(forged)]) == 1
    out = capsys.readouterr().out
    assert "TAMPERED" in out and "x\\x1b[2Jy" in out and "\x1b" not in out


def test_tail_and_stats_pass_over_lines_and_members_they_do_not_understand(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, [
        {"v": 1, "kind": "call", "ts": "t1", "status": "ok"},  # no tool
        {"v": 1, "kind": "call", "ts": "t2", "tool": ["a"], "duration_ms": "fast", "status": {"x": 1}},
        {"v": 1, "kind": "call", "ts": "t3", "tool": "b", "duration_ms": 2, "status": "error", "error": "boom"},
        {"v": 1, "kind": "call", "ts": "t4", "tool": "b", "duration_ms": 4, "status": "error",
         "error": {"type": {"nested": True}, "code": "c", "message": "m"}},
    ], extra=b'[1, 2]\n"text"\n\x00\xff\n')
    assert audit_main(["tail", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 4 and "t4" in out
    assert audit_main(["stats", "--json", str(log)]) == 0
    out = capsys.readouterr().out
    assert '"calls": 4' in out and '"errors": 2' in out
    assert audit_main(["stats", str(log)]) == 0
    assert "b: 2 calls" in capsys.readouterr().out


@pytest.mark.parametrize("planted", ["fifo", "dev-zero"])
def test_tail_and_stats_refuse_a_fifo_or_device_among_the_log_files_never_hang(tmp_path: Path, planted: str) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, [{"v": 1, "kind": "call", "ts": "t", "tool": "a", "status": "ok"}])
    rotated = tmp_path / "audit.1.jsonl"
    if planted == "fifo":
        os.mkfifo(rotated)
    else:
        rotated.symlink_to("/dev/zero")
    for command in ("tail", "stats"):
        out = run(tmp_path, "audit", command, str(log))
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert f"error: {rotated}: not a regular file" in out.stderr and "hint:" in out.stderr
        assert "Traceback" not in out.stderr
    assert run(tmp_path, "audit", "verify", str(log)).returncode == 1


def test_verify_fails_a_line_longer_than_any_record_without_reading_it_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(chain, "MAX_LINE_BYTES", 1 << 16, raising=False)
    log = tmp_path / "audit.jsonl"
    record = {"v": 1, "kind": "call", "ts": "t", "tool": "a", "status": "ok"}
    write_log(log, [record], extra=b"\0" * (3 << 16))  # a live file's "torn tail" no writer can leave
    report = verify(log)
    assert not report.ok and report.bad_line == 2 and "no record is that long" in (report.reason or "")
    read: list[int] = []
    real = chain.os.fdopen

    def recording(fd: int, mode: str) -> object:
        handle = real(fd, mode)
        readline = handle.readline
        handle.readline = lambda limit=-1: read.append(len(line := readline(limit))) or line  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(chain.os, "fdopen", recording)
    (tmp_path / "audit.1.jsonl").write_bytes(b"\0" * (3 << 16) + b"\n")  # a long line in a rotated file
    write_log(log, [record])
    assert audit_main(["tail", str(log)]) == 0  # tail passes over it, a piece at a time
    assert capsys.readouterr().out.count("\n") == 1
    assert max(read) <= (1 << 16) + 1


def test_tail_with_a_negative_count_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, [{"v": 1, "kind": "call", "ts": "t", "tool": "a", "status": "ok"}])
    with pytest.raises(SystemExit) as exc:
        audit_main(["tail", "-n", "-1", str(log)])
    assert exc.value.code == 2
    assert "'-1' is not a number of records" in capsys.readouterr().err


async def test_a_config_swapped_after_the_host_loaded_it_is_judged_as_loaded(tmp_path: Path) -> None:
    config = tmp_path / "amplifier-tools.toml"
    trusted = b"[plugins.audit]\nenabled = true\n"
    config.write_bytes(trusted)
    async with ToolHost(working_dir=tmp_path):  # the first start trusts it
        pass
    config.write_bytes(b"[plugins.audit]\nenabled = false\n[plugins.policy]\nenabled = false\n")
    host = ToolHost(working_dir=tmp_path)  # loads the edited file ...
    config.write_bytes(trusted)  # ... which is put back before the trust check
    with pytest.raises(ConfigError, match="changed since the host last started") as exc:
        await host.start()
    assert exc.value.file == str(config)


def test_a_fifo_named_as_the_configuration_is_refused_never_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "cfg.toml")
    out = run(tmp_path, "--config", "cfg.toml", "list")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "error: cfg.toml: not a regular file" in out.stderr and "hint:" in out.stderr


def test_audit_commands_find_the_log_only_through_a_trusted_configuration(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    assert cli(project, "list").returncode == 0  # the first start: no configuration, trusted as such
    fake = tmp_path / "fake"  # a log and an anchor forged where a planted config points
    fake.mkdir()
    log = fake / "audit.jsonl"
    last = write_log(log, [{"v": 1, "kind": "call", "ts": "t", "tool": "a", "status": "ok"}])
    info = log.stat()
    (fake / "audit.jsonl.anchor").write_bytes(encode_anchor(Anchor(
        file="audit.jsonl", inode=info.st_ino, size=info.st_size, hash=last, records=1, ts=0.0)))
    planted = project / "amplifier-tools.toml"
    planted.write_text(f'state_dir = "{fake}"\n')
    for command in ("verify", "tail", "stats"):
        out = cli(project, "audit", command)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert "OK" not in out.stdout and str(planted) in out.stderr and "amplifier-tools trust" in out.stderr
        assert "a configuration file appeared" in out.stderr


def test_policy_status_reads_the_store_only_through_a_trusted_configuration(tmp_path: Path) -> None:
    """As the audit commands: a planted file would name the store to read (and a Redis server to
    ask); ``policy status`` built its host without the trust check."""
    project = tmp_path / "project"
    project.mkdir()
    assert cli(project, "list").returncode == 0
    planted = project / "amplifier-tools.toml"
    planted.write_text(f'state_dir = "{tmp_path / "elsewhere"}"\n')
    out = cli(project, "policy", "status")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert str(planted) in out.stderr and "amplifier-tools trust" in out.stderr
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("damage", [b"{garbage", b"[1]", b"", b"{}"])
async def test_a_damaged_trust_record_fails_closed_naming_it_until_trust_is_run(tmp_path: Path, damage: bytes) -> None:
    async with ToolHost(working_dir=tmp_path) as host:  # the first start records "no configuration"
        record = host.trust_dir / "trusted-config.json"
    assert record.is_file()
    record.write_bytes(damage)
    (tmp_path / "amplifier-tools.toml").write_text("[plugins.audit]\nenabled = false\n")  # never taken on trust
    with pytest.raises(ConfigError, match="damaged") as exc:
        await ToolHost(working_dir=tmp_path).start()
    assert exc.value.file == str(record) and "amplifier-tools trust" in (exc.value.hint or "")
    out = cli(tmp_path, "trust")
    assert out.returncode == 0, out.stderr
    async with ToolHost(working_dir=tmp_path):
        pass


def test_verify_of_an_anchor_nested_past_the_parsers_limit_names_the_anchor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write_log(log, [{"v": 1, "kind": "call", "ts": "t", "tool": "a", "status": "ok"}])
    anchor = tmp_path / "audit.jsonl.anchor"
    anchor.write_bytes(b"[" * 60000)
    assert audit_main(["verify", str(log)]) == 1
    assert f"TAMPERED: {log}: the anchor {anchor} is unreadable" in capsys.readouterr().out
