"""Found by scale testing: what a deployment hits with many files, many calls or big outputs."""

from __future__ import annotations

import asyncio
import os
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost
from amplifier_tools.builtins.filesystem.tools import MAX_WALK_DEPTH, Grep


async def test_a_timed_out_grep_stops_walking_and_frees_its_worker_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A grep over a big tree that times out stops at the next file: before, its thread searched
    on (a grep of 200,000 files timed out at 0.5 s and ran for 6 s more), and six such calls held
    every worker of the default executor, so a ``list_dir`` of 100 entries timed out too."""
    for d in range(10):
        (tmp_path / f"d{d}").mkdir()
        for i in range(100):
            (tmp_path / f"d{d}" / f"f{i}.txt").write_text("needle\n")
    searched = [0]
    original = Grep._search_fd

    def slow_search(*args: Any) -> None:  # 10 ms a file: 1,000 files are 10 s of walking
        searched[0] += 1
        time.sleep(0.01)
        original(*args)

    monkeypatch.setattr(Grep, "_search_fd", staticmethod(slow_search))
    tools = {name: {"policies": {"timeout_ms": 200}} for name in ("local::fs.grep", "local::fs.list_dir")}
    async with ToolHost(config={"tools": tools}, builtins=["filesystem"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        results = await asyncio.gather(*[host.call("fs_grep", {"pattern": "nomatch"}) for _ in range(8)])
        assert all(r.error and r.error["code"] == "timeout" for r in results)
        await asyncio.sleep(0.3)
        after = searched[0]
        await asyncio.sleep(0.5)
        assert searched[0] == after, "abandoned greps kept searching"
        listing = await host.call("fs_list_dir", {"path": "d0"})
        assert listing.success, listing.error


async def test_the_counts_of_a_capped_listing_or_search_survive_the_cut_of_its_text(tmp_path: Path) -> None:
    """1,000 entries of list_dir (its default cap) pass the 50,000 characters a model is shown,
    and so do 200 grep matches of long lines: the cut took ``omitted`` and ``truncated`` off the
    end, so a model saw part of a listing without learning that 1,000 more entries existed."""
    for i in range(2000):
        (tmp_path / f"a-rather-long-file-name-{i:06d}.txt").write_text("needle " + "x" * 400 + "\n")
    async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=tmp_path, discover=False) as host:
        listing = await host.call("fs_list_dir", {"path": "."})
        text = listing.get_serialized_output()
        assert "[Truncated:" in text and '"omitted": 1000' in text
        found = await host.call("fs_glob", {"pattern": "*.txt"})
        assert '"omitted": 1000' in found.get_serialized_output()
        search = await host.call("fs_grep", {"pattern": "needle"})
        text = search.get_serialized_output()
        assert "[Truncated:" in text and '"truncated": true' in text


def _chain(root: Path, depth: int, files: dict[int, str]) -> None:
    """``depth`` nested directories ``d/d/…`` under ``root``, with a file named ``files[level]`` at
    each of those levels (made through descriptors: the path outgrows PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for level in range(1, depth + 1):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
            if level in files:
                f = os.open(files[level], os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(f, b"needle\n")
                os.close(f)
    finally:
        os.close(fd)


async def test_a_walk_down_a_very_deep_chain_of_directories_stops_at_a_bounded_depth(tmp_path: Path) -> None:
    """A walk holds a descriptor per level: a 10,000-deep chain made one glob hold 10,000 of them
    (``Too many open files`` under a limit of 1,024, for the host's other calls too) and 110 MB of
    path prefixes. Below ``MAX_WALK_DEPTH`` levels nothing is entered, and the result counts it."""
    _chain(tmp_path, 600, {10: "shallow.txt", MAX_WALK_DEPTH - 1: "edge.txt", 590: "deep.txt"})
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, len(os.listdir("/proc/self/fd")) + 300), hard))
    try:
        async with ToolHost(builtins=["filesystem"], entry_points=False, working_dir=tmp_path, discover=False) as host:
            found = await host.call("fs_glob", {"pattern": "**/*.txt"})
            assert found.success, found.error
            assert sorted(m.rsplit("/", 1)[1] for m in found.output["matches"]) == ["edge.txt", "shallow.txt"]
            assert found.output["too_deep"] == 1
            search = await host.call("fs_grep", {"pattern": "needle"})
            assert search.success, search.error
            assert search.output["files_searched"] == 2 and search.output["too_deep"] == 1
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_burst_of_bash_calls_leaves_the_event_loop_free_between_spawns(tmp_path: Path) -> None:
    """Each spawn blocks the event loop (fork, exec, the wait for it), and calls started together
    all spawned in one turn of the loop: 300 bash calls at once froze it for 6 s, and an unrelated
    0.2 s tool with a 1 s timeout failed as timed out. Spawns now take turns, the loop running
    its timers between them."""
    from bash_helpers import bash_host

    host = await bash_host(tmp_path, sandbox="off")
    try:
        await host.call("bash", {"command": "true"})
        lag = [0.0]
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                started = time.monotonic()
                await asyncio.sleep(0.02)
                lag[0] = max(lag[0], time.monotonic() - started - 0.02)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        results = await asyncio.gather(*[host.call("bash", {"command": "true"}) for _ in range(200)])
        done.set()
        await tick
        assert all(r.success for r in results)
        assert lag[0] < 0.4, f"the event loop was held {lag[0]:.2f} s"
    finally:
        await host.close()
