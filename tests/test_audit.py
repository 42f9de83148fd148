"""The audit log: every call recorded, redacted, tamper-evident, crash-safe, shared by processes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import ToolsPlugin

from amplifier_tools import Deny, PluginLoadError, ToolContext, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.builtins.audit.chain import encode_body, link, verify
from amplifier_tools.builtins.audit.commands import stats
from amplifier_tools.builtins.audit.writer import AuditWriter

CANARY = "canary-6b1e2f-do-not-leak"


class Echo:
    spec = ToolSpec(name="local::test.echo", version="1.0.0", description="echo", effect="Pure",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"},
                                                                   "password": {"type": "string"}},
                                  "required": ["text"]},
                    security={"secret_refs": ["API_KEY"], "redaction_rules": ["arguments/password"]})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        if input["text"] == "fail":
            raise RuntimeError(f"backend refused key {context.secret('API_KEY')}")
        return ToolResult(output={"echo": input["text"], "key_used": context.secret("API_KEY")})


class Veto:
    name = "veto"

    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        return Deny("vetoed", code="vetoed") if call.arguments.get("text") == "veto" else None


def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "log.jsonl"


def workdir(tmp_path: Path) -> Path:
    """The session's working directory: beside the log, never above it (host state stays out of reach)."""
    path = tmp_path / "work"
    path.mkdir(exist_ok=True)
    return path


async def make(tmp_path: Path, **audit: Any) -> ToolHost:
    config = {"plugins": {"audit": {"path": str(log_path(tmp_path)), **audit}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(Echo()), Veto()], builtins=["audit"],
                    entry_points=False, working_dir=workdir(tmp_path), discover=False)
    await host.start()
    return host


def records(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path(tmp_path).read_text().splitlines()]


CTX = ToolContext(principal="agent-9", role="dev", scopes=frozenset({"read"}), secrets={"API_KEY": CANARY})


async def test_every_outcome_is_recorded_once_with_its_status(tmp_path: Path) -> None:
    host = await make(tmp_path)
    try:
        await host.call("test_echo", {"text": "hi"}, context=CTX)
        await host.call("test_echo", {"text": "veto"}, context=CTX)
        await host.call("test_echo", {"text": 5}, context=CTX)
        await host.call("test_echo", {"text": "fail"}, context=CTX)
        await host.call("nope", {}, context=CTX)
    finally:
        await host.close()
    rows = records(tmp_path)
    assert [(r["status"], (r["error"] or {}).get("code")) for r in rows] == [
        ("ok", None), ("error", "vetoed"), ("error", "invalid_input"), ("error", "tool_raised"),
        ("error", "unknown_tool")]
    first = rows[0]
    assert first["principal"] == "agent-9" and first["role"] == "dev" and first["scopes"] == ["read"]
    assert first["tool"] == "local::test.echo" and first["tool_version"] == "1.0.0" and first["v"] == 1
    assert first["output_bytes"] > 0 and len(first["output_sha256"]) == 64
    assert rows[1]["trail"][0]["plugin"] == "veto"
    assert verify(log_path(tmp_path)).ok


async def test_canary_secrets_never_reach_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANARY_ENV", CANARY)
    host = await make(tmp_path, record_output=True)
    try:
        await host.call("test_echo", {"text": f"arg {CANARY}", "password": "hunter2-password"}, context=CTX)
        await host.call("test_echo", {"text": "fail"}, context=CTX)
        await host.call("test_echo", {"text": "Authorization: Bearer abcdefghijklmnop123"}, context=CTX)
        await host.call("test_echo", {"text": "postgres://admin:s3cretpass@db/x"}, context=CTX)
    finally:
        await host.close()
    # The same secret resolved by the host from its environment (config [secrets]), not from the caller.
    config = {"secrets": {"API_KEY": "CANARY_ENV"},
              "plugins": {"audit": {"path": str(log_path(tmp_path)), "record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Echo())], builtins=["audit"], entry_points=False,
                        working_dir=workdir(tmp_path), discover=False) as env_host:
        echoed = await env_host.call("test_echo", {"text": "key sk-abcdefghijklmnopqrstuv and\n"
                                                            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpA\n"
                                                            "-----END RSA PRIVATE KEY-----"})
        assert echoed.success and echoed.output["key_used"] == "[REDACTED]"  # the caller never sees it either
        failed = await env_host.call("test_echo", {"text": "fail"})
        assert CANARY not in json.dumps(failed.error)
    text = log_path(tmp_path).read_text()
    for leaked in (CANARY, "hunter2-password", "abcdefghijklmnop123", "s3cretpass", "sk-abcdefghijklmnopqrstuv",
                   "MIIEpA"):
        assert leaked not in text
    assert "[REDACTED]" in text
    assert verify(log_path(tmp_path)).ok


@pytest.mark.parametrize("attack", ["edit", "delete", "swap", "truncate_mid_line", "insert_forged"])
async def test_tampering_is_detected_at_the_right_line(tmp_path: Path, attack: str) -> None:
    host = await make(tmp_path)
    try:
        for i in range(6):
            await host.call("test_echo", {"text": f"t{i}"}, context=CTX)
    finally:
        await host.close()
    path = log_path(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    expected_line = 3
    if attack == "edit":
        lines[2] = lines[2].replace('"t2"', '"T2"')
    elif attack == "delete":
        del lines[2]
    elif attack == "swap":
        lines[2], lines[3] = lines[3], lines[2]
    elif attack == "truncate_mid_line":  # mid-line in an earlier file of the chain: damage
        lines = [*lines[:5], lines[5][:40]]
        expected_line = 6
        rotated = path.with_name("log.1.jsonl")
        rotated.write_text("".join(lines))
        path.write_text(link(encode_body({"v": 1, "kind": "rotated", "ts": 0, "from": rotated.name}),
                             json.loads(lines[4])["hash"])[0].decode())
        path = path.parent
        lines = None
    else:  # a forged record with a correct-looking hash of its own
        forged = json.loads(lines[1])
        forged["arguments"] = {"text": "forged"}
        lines.insert(2, link(encode_body(forged), forged["hash"])[0].decode())
        expected_line = 4
    if lines is not None:
        path.write_text("".join(lines))
    report = verify(path)
    assert not report.ok and report.bad_line == expected_line, report
    cli = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", str(path)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert cli.returncode == 1 and f":{expected_line}:" in cli.stdout


async def test_a_line_torn_by_a_crash_is_reported_then_cut_and_marked(tmp_path: Path) -> None:
    host = await make(tmp_path)
    try:
        for i in range(3):
            await host.call("test_echo", {"text": f"t{i}"}, context=CTX)
    finally:
        await host.close()
    path = log_path(tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:70])  # a write cut short by SIGKILL
    # A SIGKILL leaves no clean close behind: the anchor is the running writer's, not marked closed.
    from amplifier_tools.builtins.audit.chain import anchor_path, encode_anchor, parse_anchor

    anchor_file = anchor_path(path)
    anchor_file.write_bytes(encode_anchor(attrs.evolve(parse_anchor(anchor_file.read_bytes()), closed=False)))
    torn = verify(path)
    assert torn.ok and torn.torn_tail and torn.records == 3, torn
    cli = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", str(path)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert cli.returncode == 0 and "incomplete" in cli.stdout
    host = await make(tmp_path)
    try:
        await host.call("test_echo", {"text": "after the crash"}, context=CTX)
    finally:
        await host.close()
    kinds = [r["kind"] for r in records(tmp_path)]
    assert kinds == ["call"] * 3 + ["recovered", "call"]
    recovered = records(tmp_path)[3]
    assert recovered["removed_bytes"] == 70  # what was cut off is named (found by attack: it left no trace)
    healed = verify(path)
    assert healed.ok and not healed.torn_tail and healed.records == 5


async def test_a_line_longer_than_any_record_appended_mid_run_is_tampering(tmp_path: Path) -> None:
    """Found by attack: each 1 MiB chunk of a line with no newline was appended to what was pending
    and split again (quadratic: 256 MiB held the event loop 38 s, 543 MiB resident), then cut off
    as a torn write, leaving no trace of how much. The line is read once now, and one longer than
    any record (``MAX_LINE_BYTES``) is tampering: the file is set aside, a fresh segment begun."""
    from amplifier_tools.builtins.audit.writer import MAX_LINE_BYTES

    host = await make(tmp_path)
    try:
        assert (await host.call("test_echo", {"text": "t0"}, context=CTX)).success
        path = log_path(tmp_path)
        with open(path, "ab") as file:
            file.truncate(path.stat().st_size + MAX_LINE_BYTES + (1 << 20))  # NULs (sparse), no newline
        assert (await host.call("test_echo", {"text": "t1"}, context=CTX)).success
    finally:
        await host.close()
    kinds = [r["kind"] for r in records(tmp_path)]
    assert kinds[0] == "tamper" and "no record is that long" in records(tmp_path)[0]["reason"], kinds
    assert kinds[1:] == ["call"]


async def test_json_nested_past_the_parsers_limit_is_a_bad_line_not_a_crash(tmp_path: Path) -> None:
    """Found by attack: a line with a valid hash and 100,000 nested brackets raised RecursionError
    out of verify, tail and stats (exit 1, "this is a bug") and out of the host's start."""
    from amplifier_tools.builtins.audit.chain import GENESIS, read_records

    path = log_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = b'{"v":1,"kind":"call","x":' + b"[" * 100_000 + b"]" * 100_000 + b',"prev":"' + GENESIS.encode() + b'"}'
    import hashlib

    path.write_bytes(body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}\n')
    report = verify(path, anchor=None)
    assert not report.ok and report.bad_line == 1 and "not valid JSON" in (report.reason or "")
    assert list(read_records(path)) == []


async def test_records_cut_from_the_end_are_caught_by_an_anchor(tmp_path: Path) -> None:
    host = await make(tmp_path)
    try:
        for i in range(3):
            await host.call("test_echo", {"text": f"t{i}"}, context=CTX)
    finally:
        await host.close()
    path = log_path(tmp_path)
    anchor = verify(path).last_hash
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    assert verify(path).ok  # a shorter chain is still a chain...
    assert not verify(path, anchor=anchor).ok  # ...which the anchor exposes


HMAC_KEY = "checkpoint-key-0f3a9c"


async def _signed_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: int) -> Path:
    monkeypatch.setenv("AUDIT_HMAC_KEY", HMAC_KEY)
    config = {"secrets": {"audit_hmac": "AUDIT_HMAC_KEY"},
              "plugins": {"audit": {"path": str(log_path(tmp_path)), "checkpoint_key_ref": "audit_hmac",
                                    "checkpoint_every": 3}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Echo())], builtins=["audit"], entry_points=False,
                        working_dir=workdir(tmp_path), discover=False) as host:
        for i in range(calls):
            assert (await host.call("test_echo", {"text": f"t{i}"}, context=CTX)).success
    return log_path(tmp_path)


async def test_signed_checkpoints_cover_every_record_and_verify_with_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = await _signed_log(tmp_path, monkeypatch, 7)
    kinds = [r["kind"] for r in map(json.loads, path.read_text().splitlines())]
    assert kinds == ["call"] * 3 + ["checkpoint"] + ["call"] * 3 + ["checkpoint", "call", "checkpoint"]
    assert HMAC_KEY not in path.read_text()
    report = verify(path, key=HMAC_KEY.encode())
    assert report.ok and report.checkpoints == 3 and report.unsigned == 0, report
    wrong = verify(path, key=b"another key")
    assert not wrong.ok and wrong.bad_line == 4 and "signature" in (wrong.reason or "")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "K": HMAC_KEY}
    cli = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", str(path), "--key-env", "K"],
                         capture_output=True, text=True, env=env)
    assert cli.returncode == 0 and "3 signed checkpoint(s) verified" in cli.stdout, cli.stdout + cli.stderr
    unset = subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", str(path),
                            "--key-env", "NOT_SET_ANYWHERE"], capture_output=True, text=True, env=env)
    assert unset.returncode == 2 and "NOT_SET_ANYWHERE" in unset.stderr


async def test_a_rewritten_chain_passes_the_hash_check_but_not_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from amplifier_tools.builtins.audit.chain import GENESIS, encode_body, link

    path = await _signed_log(tmp_path, monkeypatch, 6)
    rewritten, prev, stripped, sprev = [], GENESIS, [], GENESIS
    for record in map(json.loads, path.read_text().splitlines()):
        if record["kind"] == "call":
            record["arguments"] = {"text": "history rewritten"}
            line, sprev = link(encode_body(record), sprev)
            stripped.append(line)
        line, prev = link(encode_body(record), prev)
        rewritten.append(line)
    path.write_bytes(b"".join(rewritten))
    assert verify(path).ok  # without the key, a whole new chain is indistinguishable...
    forged = verify(path, key=HMAC_KEY.encode())
    assert not forged.ok and forged.bad_line == 4  # ...the first checkpoint no longer signs what precedes it
    path.write_bytes(b"".join(stripped))  # dropping the checkpoints instead leaves nothing signed
    bare = verify(path, key=HMAC_KEY.encode())
    assert bare.ok and bare.checkpoints == 0 and bare.unsigned == 6


async def test_checkpoint_key_that_cannot_be_resolved_fails_start_naming_the_key(tmp_path: Path) -> None:
    config = {"plugins": {"audit": {"path": str(log_path(tmp_path)), "checkpoint_key_ref": "audit_hmac"}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(Echo())], builtins=["audit"], entry_points=False,
                    working_dir=workdir(tmp_path), discover=False)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    assert "plugins.audit.checkpoint_key_ref" in str(info.value) and "audit_hmac" in str(info.value)


async def test_rotation_continues_the_chain_and_verify_takes_a_directory(tmp_path: Path) -> None:
    host = await make(tmp_path, rotate_bytes=2000)
    try:
        for i in range(20):
            await host.call("test_echo", {"text": f"rotate {i}"}, context=CTX)
    finally:
        await host.close()
    files = sorted(p.name for p in log_path(tmp_path).parent.glob("*.jsonl"))
    assert len(files) > 2 and "log.1.jsonl" in files
    report = verify(log_path(tmp_path).parent)
    assert report.ok and report.records >= 20
    assert stats(str(log_path(tmp_path).parent))["calls"] == 20
    # The live file (what `audit verify` checks by default) is verified with its rotated predecessors:
    # an untouched rotated log never reads as TAMPERED.
    live = verify(log_path(tmp_path))
    assert live.ok and live.records == report.records


async def test_rotation_by_age_continues_the_chain_across_restarts(tmp_path: Path) -> None:
    from amplifier_tools.builtins.audit.chain import chain_files

    for _ in range(2):  # the second host finds a log whose first record is already too old
        host = await make(tmp_path, rotate_seconds=0.05)
        try:
            assert (await host.call("test_echo", {"text": "first"}, context=CTX)).success
            time.sleep(0.1)  # only needs to exceed rotate_seconds; longer is fine
            assert (await host.call("test_echo", {"text": "second"}, context=CTX)).success
        finally:
            await host.close()
    directory = log_path(tmp_path).parent
    files = [f.name for f in chain_files(directory)]
    assert files[0] == "log.1.jsonl" and files[-1] == "log.jsonl" and len(files) >= 3, files
    report = verify(directory)
    assert report.ok, report
    calls = [r for f in chain_files(directory) for r in map(json.loads, f.read_text().splitlines())
             if r["kind"] == "call"]
    assert [r["arguments"]["text"] for r in calls] == ["first", "second"] * 2


async def test_a_host_that_makes_no_call_leaves_no_log_behind(tmp_path: Path) -> None:
    host = await make(tmp_path)
    await host.close()
    assert not log_path(tmp_path).parent.exists()


class FullDisk:
    """The audit writer's view of ``os`` with a disk that fills up: ``write(2)`` writes at most
    ``budget`` more bytes (a short write), then fails with ENOSPC."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if self.budget <= 0:
            raise OSError(28, "No space left on device")
        n = min(len(data), self.budget)
        self.budget -= n
        return os.write(fd, data[:n])


async def test_a_short_write_is_never_acknowledged_and_fails_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from amplifier_tools.builtins.audit import writer as writer_module

    host = await make(tmp_path)
    try:
        assert (await host.call("test_echo", {"text": "ok"}, context=CTX)).success
        size = log_path(tmp_path).stat().st_size
        monkeypatch.setattr(writer_module, "os", FullDisk(40))  # the next record gets 40 bytes, then ENOSPC
        failed = await host.call("test_echo", {"text": "private output"}, context=CTX)
        assert not failed.success and failed.output is None
        assert failed.error["type"] == "SystemError" and failed.error["plugin"] == "audit"
        assert failed.error["code"] == "audit_unavailable"  # from the first failing call on
        assert log_path(tmp_path).stat().st_size == size  # the partial line was cut off
        blocked = await host.call("test_echo", {"text": "next"}, context=CTX)
        assert blocked.error["code"] == "audit_unavailable"
        assert "audit log cannot be written" in blocked.error["message"]
        monkeypatch.setattr(writer_module, "os", os)  # space again: the refused call's record heals the writer
        refused = await host.call("test_echo", {"text": "refused"}, context=CTX)
        assert not refused.success
        assert (await host.call("test_echo", {"text": "after"}, context=CTX)).success
    finally:
        await host.close()
    texts = [r["arguments"]["text"] for r in records(tmp_path) if r["kind"] == "call"]
    assert texts == ["ok", "refused", "after"]
    assert verify(log_path(tmp_path)).ok


async def test_a_full_disk_in_fail_open_mode_warns_once_and_calls_go_on(
        tmp_path: Path, caplog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from amplifier_tools.builtins.audit import writer as writer_module

    open_host = await make(tmp_path, mode="fail_open")
    try:
        monkeypatch.setattr(writer_module, "os", FullDisk(0))
        with caplog.at_level(logging.WARNING, logger="amplifier_tools.audit"):
            first = await open_host.call("test_echo", {"text": "a"}, context=CTX)
            second = await open_host.call("test_echo", {"text": "b"}, context=CTX)
        assert first.success and second.success
        assert sum("continuing without an audit record" in r.getMessage() for r in caplog.records) == 1
    finally:
        monkeypatch.setattr(writer_module, "os", os)
        await open_host.close()


async def test_unopenable_log_fails_host_start_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PluginLoadError, match=r"plugins\.audit\.path"):
        host = ToolHost(config={"plugins": {"audit": {"path": str(tmp_path / "file" / "log.jsonl")}}},
                        builtins=["audit"], entry_points=False, working_dir=workdir(tmp_path), discover=False)
        await host.start()


WRITER = textwrap.dedent("""
    import asyncio, sys
    from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl

    class Noop:
        spec = ToolSpec(name="local::noop", description="noop", effect="Pure")
        name, description = spec.name, spec.description
        async def execute(self, input):
            return ToolResult(output=input.get("i"))

    class Mount:
        name = "m"
        @hookimpl
        async def mount(self, coordinator):
            await coordinator.mount("tools", Noop())

    async def main(path, count, tag):
        config = {"plugins": {"audit": {"path": path, "fsync": sys.argv[4]}}}
        async with ToolHost(config=config, plugins=[Mount()], builtins=["audit"], entry_points=False,
                            discover=False) as host:
            for i in range(count):
                result = await host.call("noop", {"i": i, "tag": tag})
                assert result.success
                print(f"ack {tag} {i}", flush=True)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
""")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.slow
def test_eight_processes_share_one_valid_chain(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), "2000", f"p{n}", "never"],
                              stdout=subprocess.DEVNULL, env=_env()) for n in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    report = verify(path)
    assert report.ok, report
    seen = [(r["arguments"]["tag"], r["arguments"]["i"]) for r in map(json.loads, path.read_text().splitlines())]
    assert len(seen) == 16_000 and len(set(seen)) == 16_000


SHARING = textwrap.dedent("""
    import random, sys, time
    from amplifier_tools.builtins.audit.chain import encode_body
    from amplifier_tools.builtins.audit.writer import AuditWriter

    path, tag, lives, most, rotate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(tag)
    for life in range(lives):
        writer = AuditWriter(path, fsync="never", fsync_interval_ms=20, checkpoint_key=b"k" * 32,
                             checkpoint_every=7, rotate_bytes=rotate)
        for i in range(rng.randint(1, most)):
            writer.append(encode_body({"v": 1, "kind": "call", "ts": time.time(), "tag": tag, "n": f"{life}.{i}"}))
            if rng.random() < 0.01:
                time.sleep(0.01)  # idle while the others rotate the log
        tampered = writer.tampered
        writer.close()
        print(f"{tag} {life} {tampered or writer.tampered}" if tampered or writer.tampered else f"{tag} {life} ok",
              flush=True)
""")


def _share_a_rotating_log(path: Path, processes: int, lives: int, most: int, rotate: int) -> None:
    """``processes`` processes share one keyed log rotated every ``rotate`` bytes, each starting,
    appending up to ``most`` records and closing its writer ``lives`` times: no writer finds
    tampering, the log verifies with the key, and it holds every record appended, once."""
    procs = [subprocess.Popen([sys.executable, "-c", SHARING, str(path), f"p{n}", str(lives), str(most), str(rotate)],
                              stdout=subprocess.PIPE, env=_env(), text=True) for n in range(processes)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * processes, outputs
    lines = "".join(outputs).splitlines()
    assert len(lines) == processes * lives and all(line.endswith(" ok") for line in lines), \
        [line for line in lines if not line.endswith(" ok")][:5]
    assert not [p.name for p in path.parent.iterdir() if ".tampered-" in p.name]
    report = verify(path, key=b"k" * 32)
    assert report.ok, report
    assert len(report.files) > 3  # it was rotated
    seen = [(r["tag"], r["n"]) for file in report.files for r in map(json.loads, Path(file).read_text().splitlines())
            if r["kind"] == "call"]
    assert len(seen) == len(set(seen)) == report.records - sum(
        1 for file in report.files for r in map(json.loads, Path(file).read_text().splitlines()) if r["kind"] != "call")


def test_processes_sharing_a_rotating_log_keep_one_valid_chain(tmp_path: Path) -> None:
    """Found by a stress test: with rotation, several processes sharing one log reported false
    tampering and the log no longer verified (a writer appended to a file another had just
    rotated away; one that missed several rotations took the live file for its file's successor;
    one starting mid-rotation found the path empty, or the new file not yet locked)."""
    _share_a_rotating_log(tmp_path / "shared.jsonl", processes=4, lives=4, most=80, rotate=2000)


def _record(tag: str) -> bytes:
    return encode_body({"v": 1, "kind": "call", "ts": time.time(), "tag": tag})


def _quiet_writer(path: Path, key: bytes | None) -> AuditWriter:
    """A writer whose thread does not refresh the anchor within a test (as on a loaded machine)."""
    return AuditWriter(path, fsync="never", fsync_interval_ms=600_000, checkpoint_key=key)


@pytest.mark.parametrize("case", ["closer_wrote_last", "closer_checkpointed", "closer_only_read"])
def test_a_writer_at_the_end_another_closes_the_log_at_anchors_before_it_appends_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Found by the sharing test on a loaded machine: writer B was at the end writer A then closed
    the log at (B adopted the log there as it started: after A's last record, or between A's closing
    checkpoint and its closed anchor; or B wrote that last record, and A adopted it and closed with
    no record), and B's next records, the log unchanged by others for all B knew, went unanchored:
    a writer C starting before B's thread refreshed the anchor took them for ones "appended while
    no writer ran", set the log aside, and every other writer then took it for replaced. A writer
    now anchors with its first record at an end it read, and marks "closed" only an end it made."""
    path = tmp_path / "shared.jsonl"
    key = b"k" * 32 if case == "closer_checkpointed" else None
    started: list[AuditWriter] = []
    if case == "closer_only_read":
        started.append(_quiet_writer(path, key))
        started[0].append(_record("b0"))
        _quiet_writer(path, key).close()  # adopted B's end, closed with no record of its own
    else:
        first = _quiet_writer(path, key)
        first.append(_record("a0"))
        if case == "closer_wrote_last":
            started.append(_quiet_writer(path, key))
            first.close()
        else:  # B starts after the final checkpoint (one hold of the lock), before the closed anchor (another)
            anchor_closed = AuditWriter._anchor_closed

            def late(writer: AuditWriter) -> None:
                if writer is first:
                    started.append(_quiet_writer(path, key))
                anchor_closed(writer)

            monkeypatch.setattr(AuditWriter, "_anchor_closed", late)
            first.close()
            monkeypatch.undo()
    second = started[0]
    try:
        for i in range(3):
            second.append(_record(f"b{i + 1}"))
        third = _quiet_writer(path, key)
        assert third.tampered is None
        third.append(_record("c0"))
        third.close()
    finally:
        second.close()
    assert not [p.name for p in tmp_path.iterdir() if ".tampered-" in p.name]
    assert verify(path, key=key).ok
    # Closed for real now: a record chained on after it is still tampering.
    last = json.loads(path.read_text().splitlines()[-1])["hash"]
    with path.open("ab") as handle:
        handle.write(link(_record("forged"), last)[0])
    fourth = _quiet_writer(path, key)
    try:
        assert fourth.tampered is not None and "appended while no writer ran" in fourth.tampered
    finally:
        fourth.close()


def test_a_writer_that_adopted_a_closed_log_and_wrote_nothing_closes_it_again(tmp_path: Path) -> None:
    """The closed end a writer adopted is the one end it did not write that it marks closed again
    (a host that made no call): a record chained on after it is still tampering."""
    path = tmp_path / "shared.jsonl"
    writer = _quiet_writer(path, None)
    writer.append(_record("a0"))
    writer.close()
    _quiet_writer(path, None).close()
    last = json.loads(path.read_text().splitlines()[-1])["hash"]
    with path.open("ab") as handle:
        handle.write(link(_record("forged"), last)[0])
    writer = _quiet_writer(path, None)
    try:
        assert writer.tampered is not None and "appended while no writer ran" in writer.tampered
    finally:
        writer.close()


@pytest.mark.parametrize("refresh", ["close", "thread"])
def test_records_of_another_writer_cut_off_back_to_an_idle_writers_end_are_found(tmp_path: Path,
                                                                                  refresh: str) -> None:
    """Found by attack: writer B appended after idle writer A's end and anchored (closed) there; the
    records were cut off back to A's end; A re-anchored at its end (as it closed, or at its thread's
    refresh), and the next start found a whole log. The anchor past A's end is now left as it is."""
    path = tmp_path / "shared.jsonl"
    first = _quiet_writer(path, None)
    first.append(_record("a0"))
    end = path.stat().st_size
    second = _quiet_writer(path, None)
    second.append(_record("b0"))
    second.close()
    os.truncate(path, end)
    if refresh == "thread":
        with first._lock:
            first._anchor_if_current()
    first.close()
    third = _quiet_writer(path, None)
    try:
        assert third.tampered is not None and "cut short" in third.tampered, third.tampered  # before: None
    finally:
        third.close()


@pytest.mark.slow
def test_many_processes_sharing_a_rotating_log_keep_one_valid_chain(tmp_path: Path) -> None:
    """The stress test that found it, and more: 8 processes, each starting its writer 15 times,
    rotating every 5 KB."""
    _share_a_rotating_log(tmp_path / "shared.jsonl", processes=8, lives=15, most=300, rotate=5000)


@pytest.mark.slow
def test_deleting_the_lock_file_while_two_writers_run_keeps_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    lock = tmp_path / "shared.jsonl.lock"  # earlier versions locked this file; a tool could delete it
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), "3000", f"p{n}", "never"],
                              stdout=subprocess.DEVNULL, env=_env()) for n in range(2)]
    while any(p.poll() is None for p in procs):
        lock.unlink(missing_ok=True)
        time.sleep(0.001)
    assert [p.returncode for p in procs] == [0, 0]
    report = verify(path)
    assert report.ok, report
    seen = [(r["arguments"]["tag"], r["arguments"]["i"]) for r in map(json.loads, path.read_text().splitlines())
            if r["kind"] == "call"]
    assert len(seen) == 6000 and len(set(seen)) == 6000


@pytest.mark.slow
def test_sigkill_never_breaks_the_chain_or_loses_acknowledged_records(tmp_path: Path) -> None:
    path = tmp_path / "crash.jsonl"
    rng = random.Random(7)
    acknowledged: set[tuple[str, int]] = set()
    for run in range(50):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "100000", f"r{run}", "always"],
                                stdout=subprocess.PIPE, env=_env(), text=True)
        assert proc.stdout is not None
        # Wait for the first acknowledged call before starting the clock, so a slow
        # interpreter start-up on a loaded machine cannot make a run acknowledge nothing.
        line = proc.stdout.readline()
        assert line, f"writer {run} exited before its first call"
        deadline = time.monotonic() + rng.uniform(0.02, 0.25)
        while line:
            _, tag, i = line.split()
            acknowledged.add((tag, int(i)))
            if time.monotonic() >= deadline:
                break
            line = proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        report = verify(path)
        assert report.ok, (run, report)
    on_disk = {(r["arguments"]["tag"], r["arguments"]["i"]) for r in map(json.loads, path.read_text().splitlines())
               if r.get("kind") == "call"}
    assert len(acknowledged) >= 50 and acknowledged <= on_disk


async def test_opentelemetry_span_and_histogram_per_call(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from amplifier_tools.builtins.audit import AuditPlugin

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    audit = AuditPlugin(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    config = {"plugins": {"audit": {"path": str(log_path(tmp_path)), "otel": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Echo()), audit], builtins=False, entry_points=False,
                        working_dir=workdir(tmp_path), discover=False) as host:
        ok = await host.call("test_echo", {"text": "hi"}, context=CTX)
        failed = await host.call("test_echo", {"text": "fail"}, context=CTX)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["execute_tool local::test.echo"] * 2
    first, second = (dict(s.attributes or {}) for s in spans)
    assert first["gen_ai.operation.name"] == "execute_tool" and first["gen_ai.tool.name"] == "local::test.echo"
    assert first["gen_ai.tool.call.id"] == ok.tool_call_id and "error.type" not in first
    assert second["error.type"] == "ExecutionError" and second["gen_ai.tool.call.id"] == failed.tool_call_id
    assert spans[1].status.is_ok is False
    metrics = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
    histogram = next(m for m in metrics if m.name == "amplifier_tools.tool.duration")
    assert sum(p.count for p in histogram.data.data_points) == 2
    assert CANARY not in repr([s.attributes for s in spans])


def test_otel_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def no_otel(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_otel)
    with pytest.raises(PluginLoadError, match=r"plugins\.audit\.otel.*amplifier-tools\[otel\]"):
        import asyncio

        asyncio.run(ToolHost(config={"plugins": {"audit": {"path": str(log_path(tmp_path)), "otel": True}}},
                             builtins=["audit"], entry_points=False, working_dir=workdir(tmp_path),
                             discover=False).start())


def test_the_record_timestamp_is_datetimes_isoformat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timestamp formats the date and time once per second; the bytes are isoformat's."""
    import datetime as dt

    from amplifier_tools.builtins import audit

    for ns in (0, 1_764_000_000_123_456_789, 1_764_000_000_999_999_999, 1_764_000_001_000_000_000,
               1_764_000_000_000_000_999):
        monkeypatch.setattr(audit.time, "time_ns", lambda ns=ns: ns)
        expected = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)
        assert audit.timestamp() == expected.isoformat(timespec="microseconds")
