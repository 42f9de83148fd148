"""Measurement helpers shared by the benchmark modules.

The machines are shared and noisy, so every case interleaves ours and its
reference in the same process, repeats the pair several times, and reports
medians and the spread; the ratio is the result, absolute times orient.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs

Row = dict[str, Any]


def row(case: str, ours: float, reference: float | None, unit: str, *, ratio: float | None = None,
        target: str = "", met: bool | None = None, notes: str = "", spread: float | None = None) -> Row:
    """One result row (the format every ``bench_*.run`` returns)."""
    if ratio is None and reference:
        ratio = reference / ours if ours else None
    return {"case": case, "ours": ours, "reference": reference, "unit": unit, "ratio": ratio,
            "target": target, "met": met, "notes": notes, "spread": spread}


@contextlib.contextmanager
def isolated_state() -> Iterator[str]:
    """``XDG_STATE_HOME`` pointed at a fresh directory for the run, removed afterwards (restored
    on exit): the hosts a benchmark starts keep their state — audit logs of throwaway working
    directories, trust records — there, as in the tests, never in the user's ``~/.local/state``
    (a full run left megabytes of logs of deleted directories there). The default state directory
    is still chosen as a user's host chooses it, below that base, outside the working directory."""
    before = os.environ.get("XDG_STATE_HOME")
    with tempfile.TemporaryDirectory(prefix="amplifier-tools-bench-state-") as state:
        os.environ["XDG_STATE_HOME"] = state
        try:
            yield state
        finally:
            if before is None:
                os.environ.pop("XDG_STATE_HOME", None)
            else:
                os.environ["XDG_STATE_HOME"] = before


async def per_call_us(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    """Mean microseconds per awaited call over ``n`` sequential calls."""
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n * 1e6


async def interleaved(variants: dict[str, Callable[[], Awaitable[Any]]], *, n: int, rounds: int,
                      warmup: int = 200) -> dict[str, tuple[float, float]]:
    """Median and spread (max-min) of µs/call for each variant, measured in alternating rounds."""
    for fn in variants.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(await per_call_us(fn, n))
    return {name: (statistics.median(s), max(s) - min(s)) for name, s in samples.items()}


async def alternating(variants: dict[str, Callable[[], Awaitable[Any]]], *, n: int, warmup: int = 20,
                      clock: Callable[[], float] = time.perf_counter,
                      block: int = 1) -> dict[str, tuple[float, float]]:
    """Median and interquartile range of µs per call for each variant, the variants called in
    turn, ``block`` calls each, ``n`` times (each sample is one block's mean). For calls of
    milliseconds on a loaded machine, where a round's mean is dominated by the slowest calls and
    a small difference drowns in the spread. ``clock=time.process_time`` measures this process's
    CPU time instead of the wall clock: what a client-side layer adds, without the waits for a
    server or for a busy CPU.

    Work a call leaves to the event loop after it returns (an HTTP connection's teardown, say)
    runs inside whatever call comes next: with ``block=1`` one variant pays for the other's, and
    a variant that takes a turn or two more of the loop is charged differently. A block of calls
    pays its own leftovers but for its last call's."""
    for fn in variants.values():
        for _ in range(warmup):
            await fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(n):
        for name, fn in variants.items():
            start = clock()
            for _ in range(block):
                await fn()
            samples[name].append((clock() - start) * 1e6 / block)
    result = {}
    for name, values in samples.items():
        quartiles = statistics.quantiles(values, n=4)
        result[name] = (statistics.median(values), quartiles[2] - quartiles[0])
    return result


@attrs.frozen
class Paired:
    """What ``paired_rounds`` measured: each side's median µs per call, and the median and
    quartiles of the rounds' differences (``ours`` minus ``reference``, µs per call)."""

    ours: float
    reference: float
    added: float
    low: float
    high: float


async def paired_rounds(ours: Callable[[], Awaitable[Any]], reference: Callable[[], Awaitable[Any]], *,
                        rounds: int, block: int, clock: Callable[[], float] = time.process_time,
                        warmup: int = 20, frozen: bool = True) -> Paired:
    """A layer's cost per call on a shared machine: ``rounds`` rounds of a block of ``block`` calls
    of each side, in turn, each side first every other round; the result is the median of the
    rounds' differences, each taken between two blocks measured moments apart (the load a round
    sees is the same on both sides, where the difference of two medians mixes every round's load).
    ``clock=time.process_time`` (the default) is this process's CPU time.

    ``frozen``: the heap as it is after warming up is frozen for the measurement (``gc.freeze``),
    so that a full collection, which walks the whole heap and lands on whichever side happens to
    run, walks only what the calls made. Limits: what a call leaves to the loop after it returns
    runs in the next call, so a block's last call's leftovers fall into the other side's block; a
    difference of a few per cent of a call still needs a few hundred rounds to settle."""
    import gc

    for fn in (ours, reference):
        for _ in range(warmup):
            await fn()
    if frozen:
        gc.collect()
        gc.freeze()
    try:
        samples: dict[int, list[float]] = {0: [], 1: []}
        order = [(0, ours), (1, reference)]
        for _ in range(rounds):
            order.reverse()
            for side, fn in order:
                start = clock()
                for _ in range(block):
                    await fn()
                samples[side].append((clock() - start) * 1e6 / block)
    finally:
        if frozen:
            gc.unfreeze()
    differences = [a - b for a, b in zip(samples[0], samples[1], strict=True)]
    added = statistics.median(differences)
    low, _, high = statistics.quantiles(differences, n=4) if len(differences) >= 2 else (added, added, added)
    return Paired(statistics.median(samples[0]), statistics.median(samples[1]), added, low, high)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_async(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]
