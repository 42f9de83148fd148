"""``python -m bench.calls KIND N [P] [--cpu] [--opcodes]``: N sequential calls on one host, for
instruction and system-call counts (``--cpu``: also print the user and system CPU per call, from
``os.times()``; ``--opcodes``: count the bytecode instructions the N calls execute, per function,
with ``sys.settrace`` opcode events, and print the total per call and the 30 largest: what a
call touches, where instruction counts say what it costs).

KIND is ``default`` (the ``default host`` case of ``bench_core``: every built-in, 4 no-op plugins),
``bare`` (no built-ins, P no-op plugins, 4 unless given: the per-plugin slope is the difference
of two P's) or ``direct`` (``await tool.execute`` only). 200 calls warm the host up first.
Wall time on a shared machine cannot tell small changes apart; counts can::

    PYTHONHASHSEED=0 valgrind --tool=callgrind python -m bench.calls default 2000   # minus the same with 0
    strace -f -c python -m bench.calls default 2000                                  # minus the same with 0

(docs/performance.md, "default host"). Not a benchmark case: ``python -m bench`` does not run it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
from types import FrameType
from typing import Any

from .bench_core import ARGS, NoopTool, _default_host, _host
from .harness import isolated_state


class OpcodeCounter:
    """Bytecode instructions executed, per function (file, first line, name), while tracing."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, int, str]] = collections.Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            self.counts[(os.path.basename(code.co_filename), code.co_firstlineno, code.co_name)] += 1
        return self.trace

    def report(self, n: int) -> None:
        print(f"bytecode instructions per call: {sum(self.counts.values()) / n:.1f}", file=sys.stderr)
        for (file, line, name), count in self.counts.most_common(30):
            print(f"{count / n:8.1f}  {file}:{line} {name}", file=sys.stderr)


async def main(kind: str, n: int, plugins: int = 4, cpu: bool = False, opcodes: bool = False) -> None:
    tool = NoopTool()
    if kind == "direct":
        before = os.times()
        for _ in range(n):
            await tool.execute(ARGS)
        _report(kind, before, n, cpu)
        return
    async with _default_host(tool) if kind == "default" else _host(plugins, [tool]) as host:
        for _ in range(200):
            result = await host.call("noop", ARGS)
            assert result.success, result
        counter = OpcodeCounter() if opcodes else None
        if counter is not None:
            sys.settrace(counter.trace)
        before = os.times()
        for _ in range(n):
            await host.call("noop", ARGS)
        if counter is not None:
            sys.settrace(None)
            counter.report(n)
        _report(kind, before, n, cpu)


def _report(kind: str, before: os.times_result, n: int, cpu: bool) -> None:
    after = os.times()
    if cpu and n:
        print(f"{kind}: user {(after.user - before.user) / n * 1e6:.1f} µs, "
              f"system {(after.system - before.system) / n * 1e6:.1f} µs per call (os.times(), tick-sampled)",
              file=sys.stderr)


if __name__ == "__main__":
    args = [arg for arg in sys.argv[1:] if arg not in ("--cpu", "--opcodes")]
    if len(args) not in (2, 3) or args[0] not in ("default", "bare", "direct"):
        sys.exit(__doc__)
    with isolated_state():
        asyncio.run(main(args[0], int(args[1]), int(args[2]) if len(args) == 3 else 4, cpu="--cpu" in sys.argv[1:],
                         opcodes="--opcodes" in sys.argv[1:]))
