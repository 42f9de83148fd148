"""Regressions found reviewing the session-28 fixes (``git diff 00fd3d6..HEAD``)."""

from __future__ import annotations

import errno
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolContext, ToolHost, ToolResult, hookimpl
from amplifier_tools.redaction import PLACEHOLDER


def _pieces(secret: str) -> list[str]:
    """Every run of 8 characters of ``secret``: none may be seen."""
    return [secret[i:i + 8] for i in range(len(secret) - 7)]


def _places(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "w").mkdir(exist_ok=True)
    return {"working_dir": tmp_path / "w", "config": {"state_dir": str(tmp_path / "state")}}


async def test_a_secret_resolved_after_start_is_redacted_where_read_file_cuts_a_line(tmp_path: Path) -> None:
    """The filesystem tools took ``session.secrets`` as ``registry or ()``: a registry still empty
    when they mounted (no ``[secrets]`` table; the secrets come from a caller's resolver, or a plugin
    adds them later) was replaced by an empty tuple for good, and a secret resolved later was shown
    all but its end where ``fs_read_file`` cut a long line."""
    secret = f"late-{uuid.uuid4().hex}-{uuid.uuid4().hex}"
    places = _places(tmp_path)
    (places["working_dir"] / "long.txt").write_text("a" * 90 + secret + "b" * 50 + "\nshort\n")
    config = {**places.pop("config"), "plugins": {"filesystem": {"max_line_chars": 100}}}
    async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, discover=False,
                        **places) as host:
        result = await host.call("fs_read_file", {"path": "long.txt"},
                                 context=ToolContext(secrets={"api": secret}))
    assert result.success, result.error
    assert f"a{PLACEHOLDER} … [line truncated]" in result.output["content"], result.output["content"]
    assert [p for p in _pieces(secret) if p in repr(result)] == []


async def test_a_secret_resolved_after_start_is_redacted_where_bash_cuts_its_output(tmp_path: Path) -> None:
    """As above, for bash's head and tail past ``max_output_bytes``."""
    secret = f"late-{uuid.uuid4().hex}-{uuid.uuid4().hex}"
    places = _places(tmp_path)
    config = {**places.pop("config"),
              "plugins": {"bash": {"sandbox": "off", "max_output_bytes": 1000}}}
    command = f'printf "%0490d" 0; printf %s "{secret}"; printf "%05000d" 0'
    async with ToolHost(config=config, builtins=["bash"], entry_points=False, discover=False, **places) as host:
        result = await host.call("bash", {"command": command}, context=ToolContext(secrets={"api": secret}))
    assert result.success, result.error
    assert result.output["stdout_truncated"] is True
    assert result.output["stdout"].split("\n[... ")[0].endswith(PLACEHOLDER), result.output["stdout"][:600]
    assert [p for p in _pieces(secret) if p in repr(result)] == []


async def test_a_non_ascii_secret_cut_inside_a_character_by_bash_is_redacted(tmp_path: Path) -> None:
    """Bash keeps bytes: a cut inside a character of a non-ASCII secret decodes as U+FFFD, which no
    form of the secret holds, so ``redact_cut`` found nothing beside it and the tail showed all of
    the secret but its first characters (the head its first few)."""
    secret = f"секретный-ключ-{uuid.uuid4().hex}"
    places = _places(tmp_path)
    config = {**places.pop("config"),
              "plugins": {"bash": {"sandbox": "off", "max_output_bytes": 1000}}}
    size = len(secret.encode())
    # the head ends 9 bytes into the secret, the tail begins 9 bytes into it: both inside a character
    command = (f'printf "%0491d" 0; printf %s "{secret}"; printf "%05000d" 0; printf %s "{secret}"; '
               f'printf "%0{500 - (size - 9)}d" 0')
    async with ToolHost(config=config, builtins=["bash"], entry_points=False, discover=False, **places) as host:
        result = await host.call("bash", {"command": command}, context=ToolContext(secrets={"api": secret}))
    assert result.success, result.error
    head, tail = result.output["stdout"].split("\n[... ")
    assert head.endswith(PLACEHOLDER) and tail.split("...]\n")[1].startswith(PLACEHOLDER), result.output["stdout"]
    assert [p for p in _pieces(secret) if p in repr(result)] == []


TOKEN = "tok-review-0123456789abcdef"


class _Structured:
    name = "structured"
    description = "Returns an object its output schema describes."
    input_schema = {"type": "object"}
    output_schema = {"type": "object", "properties": {"a": {"type": "integer"}, "leak": {"type": "string"}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(True, {"a": 1})


class _ChangesAndReturns:
    """The common ``tool_post`` shape: change ``result.output`` and return ``result``."""

    name = "changes-and-returns"

    def __init__(self, change: bool) -> None:
        self.change = change

    @hookimpl
    def tool_post(self, result: ToolResult) -> ToolResult:
        if self.change:
            result.output["leak"] = TOKEN
        return result


async def test_an_output_changed_in_place_and_returned_by_tool_post_is_withheld(tmp_path: Path) -> None:
    """hookspecs: the output "is read, never changed in place: one changed in place instead of
    replaced fails the call closed (hook_changed_output)". A hook that changed it and returned
    ``result`` (or a ToolResult holding the same object) was taken as a replacement: checked
    against the schema, but the final scrub skips the object scrubbed before tool_post, so the
    caller got the host's secret."""
    places = _places(tmp_path)
    async with ToolHost(config=places.pop("config"), plugins=[ToolsPlugin(_Structured()), _ChangesAndReturns(True)],
                        builtins=False, entry_points=False, discover=False, **places) as host:
        host.capabilities["session.secrets"].add(TOKEN)
        result = await host.call("structured", {})
    assert TOKEN not in repr(result)
    assert (result.success, result.error and result.error["code"]) == (False, "hook_changed_output")


async def test_a_result_returned_unchanged_by_tool_post_is_delivered(tmp_path: Path) -> None:
    places = _places(tmp_path)
    async with ToolHost(config=places.pop("config"), plugins=[ToolsPlugin(_Structured()), _ChangesAndReturns(False)],
                        builtins=False, entry_points=False, discover=False, **places) as host:
        result = await host.call("structured", {})
    assert (result.success, result.output) == (True, {"a": 1})


async def test_an_fsync_failure_met_by_an_anchors_fsync_fails_the_records_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_make_durable`` (new) fsyncs the log before an anchor; the kernel reports a lost write
    once per open file (errseq), so when that fsync took the report (here: at a checkpoint) and
    only logged it ("the next record retries the checkpoint"), the fsync thread's next fsync of
    the same descriptor succeeded and acknowledged as durable a record whose bytes were lost —
    under ``fsync = "always"`` a call told its record is on disk. Before the change every fsync
    of the live file was the thread's, which fails the waiters and marks the writer unhealthy."""
    import os
    import threading

    from amplifier_tools.builtins.audit import writer as writer_module
    from amplifier_tools.builtins.audit.chain import encode_body

    log = tmp_path / "audit.jsonl"
    real_fsync = os.fsync
    armed = {"on": False}

    def fsync(fd: Any) -> None:
        # the first fsync of the log outside the fsync thread meets the lost write; the kernel
        # reports it once: later fsyncs of the descriptor succeed
        if armed["on"] and not threading.current_thread().name.startswith("audit-fsync"):
            armed["on"] = False
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writer = writer_module.AuditWriter(log, fsync="always", fsync_interval_ms=60_000, checkpoint_key=b"k" * 32,
                                       checkpoint_key_ref="KEY", checkpoint_every=2)
    try:
        armed["on"] = True
        seq = writer.append(encode_body({"v": 1, "kind": "event", "i": 0}))
        waiting = writer.wait_synced(seq)
        writer.append(encode_body({"v": 1, "kind": "event", "i": 1}))  # a checkpoint: its anchor fsyncs
        assert armed["on"] is False  # the anchor's fsync met the failure
        assert waiting is not None
        with pytest.raises(writer_module.AuditWriteError):
            await waiting
    finally:
        writer.close()


async def test_a_secret_cut_by_greps_line_limit_is_redacted(tmp_path: Path) -> None:
    """configuration.md: "Where the host cuts a text short before the whole result is redacted
    [...] a secret the cut goes through is redacted on the side shown". ``fs_grep`` cuts each
    matching line (and each context line) at 500 characters, and showed all but the end of a
    secret there."""
    secret = f"grep-{uuid.uuid4().hex}-{uuid.uuid4().hex}"
    places = _places(tmp_path)
    line = "a" * 480 + secret + "b" * 50 + " needle"
    (places["working_dir"] / "long.txt").write_text(f"{line}\n{line}\nneedle here\n")
    async with ToolHost(config=places.pop("config"), builtins=["filesystem"], entry_points=False, discover=False,
                        **places) as host:
        result = await host.call("fs_grep", {"pattern": "needle", "path": "long.txt", "context": 1},
                                 context=ToolContext(secrets={"api": secret}))
    assert result.success, result.error
    first = result.output["matches"][0]
    assert first["text"] == "a" * 480 + PLACEHOLDER, first["text"]
    assert [p for p in _pieces(secret) if p in repr(result)] == []


async def test_a_write_waiting_for_its_files_lock_stops_waiting_once_its_call_timed_out(tmp_path: Path) -> None:
    """A write hung while holding its file's lock (a stalled disk) kept every write of a file sharing
    its stripe waiting in its worker thread for good, after that call had timed out: the wait now
    gives up once the call is abandoned, and the file is left as it was."""
    import asyncio
    import sys

    from amplifier_tools.builtins.filesystem import tools as fs_tools

    places = _places(tmp_path)
    config = {**places.pop("config"), "default_timeout_ms": 300}
    held = [lock for lock in fs_tools._FILE_LOCKS if lock.acquire(blocking=False)]
    assert len(held) == len(fs_tools._FILE_LOCKS)

    def waiting() -> int:
        return sum(1 for frame in sys._current_frames().values()
                   if any(f.f_code is fs_tools.file_lock.__wrapped__.__code__ for f in _stack(frame)))

    try:
        async with ToolHost(config=config, builtins=["filesystem"], entry_points=False, discover=False,
                            **places) as host:
            result = await host.call("fs_write_file", {"path": "new.txt", "content": "x"})
            assert result.error is not None and result.error["code"] == "timeout", result.error
            for _ in range(40):  # the worker notices within LOCK_POLL
                if waiting() == 0:
                    break
                await asyncio.sleep(0.05)
            assert waiting() == 0
    finally:
        for lock in held:
            lock.release()
    assert not (tmp_path / "w" / "new.txt").exists()


def _stack(frame: Any) -> list[Any]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames
