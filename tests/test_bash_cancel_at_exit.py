"""A caller cancelling a bash call just as its command exits gets ``CancelledError``.

Found by review of the cut-and-cancel class (session 37): on CPython 3.10 and 3.11
``asyncio.wait_for`` returns the awaited result when the caller is cancelled within the few turns
of the loop in which that result arrives (bpo-42130), so the bash tool's wait for its command's
exit lost the caller's cancellation: ``cancel()`` said True and the call ended as a success. The
waits now go through ``run_with_timeout``, which never swallows one.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost
from amplifier_tools.builtins.bash import process


@pytest.mark.parametrize("turns", [0, 1, 2])
async def test_a_cancellation_as_the_command_exits_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                turns: int) -> None:
    calls: list[asyncio.Future[Any]] = []
    said: list[bool] = []
    exited = process._Protocol.process_exited
    loop = asyncio.get_running_loop()

    def cancel_after(n: int) -> None:
        if n:
            loop.call_soon(cancel_after, n - 1)
        elif calls:
            said.append(calls[0].cancel())

    def process_exited(self: process._Protocol) -> None:
        exited(self)  # the exit is seen: the wait for it ends in the next turns
        cancel_after(turns)

    monkeypatch.setattr(process._Protocol, "process_exited", process_exited)
    config = {"plugins": {"bash": {"sandbox": "off"}, "audit": {"fsync": "never"}}}
    async with ToolHost(config=config, builtins=["bash", "audit"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        calls.append(asyncio.ensure_future(host.call("bash", {"command": "exit 0"}, call_id="x1")))
        try:
            result = await calls[0]
        except asyncio.CancelledError:
            result = None
        records = [json.loads(line) for line in Path(host.capabilities["audit.path"]).read_text().splitlines()]
    assert said, "the command's exit was never seen"
    if said[0]:  # the cancellation reached a call still running: the caller must get it
        assert result is None, f"cancel() returned True, yet the call returned {result}"
    calls_recorded = [r for r in records if r.get("kind") == "call" and r["call_id"] == "x1"]
    assert len(calls_recorded) == 1
    assert (calls_recorded[0]["error"] or {}).get("code") == ("cancelled" if said[0] else None)
