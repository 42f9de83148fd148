"""Filesystem cases: read_file with a small limit on a large file (O(limit)), and grep over a
generated tree against ``grep -rn`` on the same tree, with peak memory."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from amplifier_tools import ToolHost

from .harness import Row, isolated_state, peak_rss_mb, row, run_async


def _big_file(path: Path, size: int) -> None:
    line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
    block = line * ((1 << 20) // len(line) + 1)
    with path.open("wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)


def _tree(root: Path, files: int, size: int) -> None:
    filler = (b"lorem ipsum dolor sit amet consectetur adipiscing elit\n" * (size // 56 + 1))[:size]
    for i in range(files):
        d = root / f"d{i % 200:03d}" / f"e{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        body = filler + (b"NEEDLE-FOUND here\n" if i % 997 == 0 else b"")
        (d / f"f{i}.txt").write_bytes(body)


async def _read_case(work: Path, size: int, rounds: int) -> Row:
    big = work / "big.log"
    _big_file(big, size)
    async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=work, discover=False) as host:
        times = []
        rss_before = peak_rss_mb()
        for _ in range(rounds):
            start = time.perf_counter()
            result = await host.call("fs_read_file", {"path": "big.log", "limit": 100})
            times.append((time.perf_counter() - start) * 1000)
            assert result.success and result.output["lines_returned"] == 100
        small = work / "small.log"
        _big_file(small, 1 << 20)
        small_times = []
        for _ in range(rounds):
            start = time.perf_counter()
            await host.call("fs_read_file", {"path": "small.log", "limit": 100})
            small_times.append((time.perf_counter() - start) * 1000)
    ours, ref = statistics.median(times), statistics.median(small_times)
    return row(f"read_file limit=100 on a {size >> 20} MiB file", ours, ref, "ms", ratio=ours / ref,
               target="O(limit): same time as on a 1 MiB file (ratio ≈ 1)", met=ours / ref < 2,
               notes=f"reference = same call on a 1 MiB file; peak RSS growth {peak_rss_mb() - rss_before:.1f} MiB")


async def _grep_case(work: Path, files: int, size: int, rounds: int) -> Row:
    tree = work / "tree"
    _tree(tree, files, size)
    ours_t, ref_t = [], []
    async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=tree, discover=False,
                        config={"plugins": {"filesystem": {"max_matches": 10000}}}) as host:
        for _ in range(rounds):
            start = time.perf_counter()
            result = await host.call("fs_grep", {"pattern": "NEEDLE-FOUND"})
            ours_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = subprocess.run(["grep", "-rn", "NEEDLE-FOUND", "."], cwd=tree, capture_output=True, check=False)
            ref_t.append(time.perf_counter() - start)
    ours_count = len(result.output["matches"])
    ref_count = len(out.stdout.splitlines())
    ours, ref = statistics.median(ours_t), statistics.median(ref_t)
    mb = files * size / 1e6
    return row(f"grep literal over {files:,} files ({mb:.0f} MB) vs grep -rn", ours, ref, "s", ratio=ours / ref,
               target="within 3x of grep -rn", met=ours / ref <= 3,
               notes=f"ours/grep = {ours / ref:.2f}; matches {ours_count} vs {ref_count}; "
                     f"peak RSS of this process {peak_rss_mb():.0f} MiB")


async def _all(quick: bool) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="amplifier-bench-fs-"))
    try:
        if quick:
            return [await _read_case(work, 8 << 20, 7), await _grep_case(work, 500, 2_000, 1)]
        return [await _read_case(work, 1 << 30, 5), await _grep_case(work, 20_000, 10_000, 3)]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> list[Row]:
    rows: list[Any] = run_async(_all(quick))
    return rows


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
    os._exit(0)
