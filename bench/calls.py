"""``python -m bench.calls KIND N [P]``: N sequential calls on one host, for instruction and system-call counts.

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
import sys

from .bench_core import ARGS, NoopTool, _default_host, _host


async def main(kind: str, n: int, plugins: int = 4) -> None:
    tool = NoopTool()
    if kind == "direct":
        for _ in range(n):
            await tool.execute(ARGS)
        return
    async with _default_host(tool) if kind == "default" else _host(plugins, [tool]) as host:
        for _ in range(200):
            result = await host.call("noop", ARGS)
            assert result.success, result
        for _ in range(n):
            await host.call("noop", ARGS)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("default", "bare", "direct"):
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])))
