"""One host process for the shared-store tests: runs calls against a configured policy store.

``python policy_store_worker.py SPEC_JSON`` prints one JSON line: the outcome of every call
(``ok`` or the error code) and the outputs. The tool counts its runs (a line per run in
``runs``) and its fleet-wide calls in flight (``inflight``: a file under ``flock``, its peak
kept in ``<inflight>.max``), so the tests measure what the tool itself saw.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, ToolContext, ToolHost, ToolResult, ToolSpec


def bump(path: str, delta: int) -> None:
    """Add ``delta`` to the shared in-flight counter; keep its peak."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now = int(f.read() or 0) + delta
        f.seek(0)
        f.truncate()
        f.write(str(now))
        f.flush()
        peak_path = Path(path + ".max")
        peak = int(peak_path.read_text() or 0) if peak_path.exists() else 0
        if now > peak:
            peak_path.write_text(str(now))


class Tool:
    def __init__(self, spec: dict[str, Any], hold: float, runs: str | None, inflight: str | None,
                 started: str | None, fail: bool = False) -> None:
        self.spec = ToolSpec(**spec)
        self.name, self.description = self.spec.name, self.spec.description
        self.hold, self.runs, self.inflight, self.started = hold, runs, inflight, started
        self.fail = fail

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if self.inflight:
            bump(self.inflight, 1)
        try:
            if self.started:
                with open(self.started, "a") as f:
                    f.write("x\n")
            if self.hold:
                await asyncio.sleep(self.hold)
            if self.fail:
                raise ExecutionError("backend down", code="backend_down")
            count = 0
            if self.runs:
                with open(self.runs, "a") as f:
                    f.write(f"{os.getpid()}\n")
                count = len(Path(self.runs).read_text().splitlines())
            return ToolResult(output={"run": count, "pid": os.getpid()})
        finally:
            if self.inflight:
                bump(self.inflight, -1)


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    tool = Tool(spec["tool"], spec.get("hold", 0.0), spec.get("runs"), spec.get("inflight"), spec.get("started"),
                spec.get("fail", False))
    config = {"state_dir": spec["state_dir"], "plugins": {"policy": spec.get("policy", {})}}
    work = Path(spec["state_dir"]).parent / "work"
    work.mkdir(exist_ok=True)
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=work) as host:
        context = ToolContext(principal=spec.get("principal", "p"), idempotency_key=spec.get("key"))
        limit = asyncio.Semaphore(spec.get("parallel", 1))

        async def one() -> ToolResult:
            async with limit:
                return await host.call(tool.name, spec.get("arguments", {}), context=context)

        results = await asyncio.gather(*(one() for _ in range(spec.get("calls", 1))))
    codes = Counter("ok" if r.success else r.error["code"] for r in results)
    return {"codes": dict(codes), "outputs": [r.output for r in results if r.success],
            "errors": sorted({f"{r.error['code']}: {r.error['message']}" for r in results if not r.success}),
            "replayed": sum(bool(r.success and r.metadata.get("replayed")) for r in results)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
