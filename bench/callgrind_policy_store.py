"""Instructions per call of the policy store cases, counted by ``valgrind --tool=callgrind``.

``python -m bench.callgrind_policy_store [VARIANT ...]`` runs each variant twice under callgrind
(200 and 1,200 calls after 100 warm-up calls) and prints (Ir(1,200) - Ir(200)) / 1,000: the
instructions this process executes per call, start-up and set-up cancelled out. Deterministic,
unlike the wall-clock cases on a shared machine, so it decides where time goes; it counts
neither the kernel (system calls, the loopback) nor the Redis server. Variants: ``plain`` (the
host without the policy plugin), ``memory``, ``sqlite``, ``redis`` (one rate limit each) and
``ping`` (one ``PING`` on the Redis store's own connections, no call). Needs ``valgrind`` (and
``redis-server`` for the Redis variants). Not a ``bench_*`` module: ``python -m bench`` skips it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ("plain", "memory", "sqlite", "redis", "ping")
ROOT = str(Path(__file__).resolve().parent.parent)


async def _calls(variant: str, url: str, n: int, warm: int) -> None:
    from .bench_core import ARGS
    from .bench_policy_store import _host

    store = {"plain": None, "memory": "memory", "sqlite": "sqlite"}.get(variant, url)
    with tempfile.TemporaryDirectory() as base:
        async with _host(store, os.path.join(base, "state")) as host:
            if variant == "ping":
                ping = host.plugin_manager.get_plugin("policy").shared.store.ping  # type: ignore[union-attr]
                for _ in range(warm + n):
                    await ping()
                return
            for _ in range(warm + n):
                await host.call("noop", ARGS)


def _instructions(variant: str, url: str, n: int, directory: str) -> int:
    out = os.path.join(directory, f"callgrind.{variant}.{n}")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                    "bench.callgrind_policy_store", "--run", variant, url, str(n)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    match = re.search(r"^(?:summary|totals): (\d+)", Path(out).read_text(), re.MULTILINE)
    assert match is not None
    return int(match.group(1))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--run"]:
        asyncio.run(_calls(argv[1], argv[2], int(argv[3]), 100))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    from .bench_policy_store import _Redis

    with tempfile.TemporaryDirectory() as directory:
        server = _Redis(directory) if {"redis", "ping"} & set(argv or VARIANTS) else None
        try:
            for variant in argv or VARIANTS:
                url = server.url if server is not None else ""
                low, high = (_instructions(variant, url, n, directory) for n in (200, 1200))
                print(f"{variant:8s} {(high - low) / 1000:10,.0f} instructions per call", flush=True)
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
