"""Core pipeline overhead, plugin and tool scaling, and concurrency.

Cases (issue 2 and issue 8):
- overhead: a no-op tool with an input schema and four plugins implementing
  ``tool_pre`` and ``tool_post`` that return None, through ``host.call``,
  against a direct ``await tool.execute(...)``; and amplifier-core's
  ``HookRegistry`` emitting ``tool:pre`` and ``tool:post`` to four no-op handlers
  (the hook dispatch alone, without validation: a reference in its favour).
- scaling with 1, 4, 16, 64 plugins and with 10, 100, 1,000 mounted tools.
- 10,000 concurrent calls of a tool sleeping 50 ms: wall time against the same tool
  coroutines gathered without the host.
- host-wide secret redaction (issue 14): a call returning a typical ~3 KB file-read result, with
  three secrets registered in ``session.secrets`` against none (the per-call cost of the pre-scan).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from typing import Any, ClassVar

from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl

from .harness import Row, interleaved, isolated_state, row, run_async

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer", "minimum": 0}},
    "required": ["path"],
    "additionalProperties": False,
}
ARGS = {"path": "README.md", "limit": 10}


class NoopTool:
    description = "does nothing"
    input_schema = SCHEMA

    def __init__(self, name: str = "noop") -> None:
        self.name = name

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


class Mount:
    name = "bench-tools"

    def __init__(self, tools: list[Any]) -> None:
        self.tools = tools

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        for tool in self.tools:
            await coordinator.mount("tools", tool)


def noop_plugin(i: int) -> Any:
    class NoopPlugin:
        name = f"noop-{i}"

        @hookimpl
        def tool_pre(self, call: Any, spec: Any, context: Any) -> None:
            return None

        @hookimpl
        def tool_post(self, call: Any, spec: Any, result: Any, context: Any) -> None:
            return None

    return NoopPlugin()


def _host(plugins: int, tools: list[Any]) -> ToolHost:
    return ToolHost(plugins=[Mount(tools), *(noop_plugin(i) for i in range(plugins))],
                    builtins=False, entry_points=False)


def _amplifier_registry() -> Any | None:
    try:
        from amplifier_core import HookRegistry, HookResult
    except ImportError:
        return None
    registry = HookRegistry()
    for i in range(4):
        async def handler(event: str, data: dict[str, Any]) -> Any:
            return HookResult(action="continue")

        registry.register("tool:pre", handler, name=f"noop-pre-{i}")
        registry.register("tool:post", handler, name=f"noop-post-{i}")
    return registry


async def _overhead(quick: bool) -> list[Row]:
    n, rounds = (300, 2) if quick else (5_000, 7)
    tool = NoopTool()
    rows: list[Row] = []
    async with _host(4, [tool]) as host:
        variants: dict[str, Any] = {
            "host": lambda: host.call("noop", ARGS),
            "direct": lambda: tool.execute(ARGS),
        }
        registry = _amplifier_registry()
        if registry is not None:
            async def amplifier() -> None:
                await registry.emit("tool:pre", {"tool_name": "noop", "input": ARGS})
                await registry.emit("tool:post", {"tool_name": "noop", "result": {"output": "ok"}})

            variants["amplifier"] = amplifier
        # amplifier-core's registry is ~100x slower per call: fewer calls keep the run short.
        timings = await interleaved({k: v for k, v in variants.items() if k != "amplifier"}, n=n, rounds=rounds)
        if registry is not None:
            timings.update(await interleaved({"amplifier": variants["amplifier"]}, n=max(50, n // 50),
                                             rounds=rounds, warmup=20))
    host_us, spread = timings["host"]
    direct_us, _ = timings["direct"]
    overhead = host_us - direct_us
    rows.append(row("core overhead per call (4 no-op plugins, schema)", overhead, None, "µs/call",
                    target="≤ 40 µs (≥ 25,000 calls/s)", met=overhead <= 40, spread=spread,
                    notes=f"host {host_us:.1f} µs/call = {1e6 / host_us:,.0f} calls/s; "
                          f"direct execute {direct_us:.2f} µs"))
    if "amplifier" in timings:
        amp_us, amp_spread = timings["amplifier"]
        ratio = amp_us / overhead
        rows.append(row("vs amplifier-core HookRegistry (tool:pre + tool:post, 4 handlers)", overhead, amp_us,
                        "µs/call", ratio=ratio, target="≥ 50x faster", met=ratio >= 50, spread=amp_spread,
                        notes="reference = amplifier-core emit pre+post only (no validation)"))
    else:
        rows.append(row("vs amplifier-core HookRegistry", overhead, None, "µs/call", target="≥ 50x faster",
                        notes="amplifier-core not installed (pip install amplifier-core)"))
    return rows


@contextlib.asynccontextmanager
async def _default_host(tool: Any) -> Any:
    """``ToolHost()`` as a user gets it (every built-in: filesystem, bash, policy, audit with its
    default durability, mcp) in a fresh working directory, plus the tool and 4 no-op plugins."""
    with tempfile.TemporaryDirectory(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as base:
        work = os.path.join(base, "work")
        os.mkdir(work)
        with open(os.path.join(work, ARGS["path"]), "w") as readme:  # the file the calls name exists
            readme.write("# a project\n")
        async with ToolHost(plugins=[Mount([tool]), *(noop_plugin(i) for i in range(4))], entry_points=False,
                            working_dir=work, discover=False) as host:
            yield host


async def _default_overhead(quick: bool) -> list[Row]:
    """Issue 16: the default host against the bare host and a direct execute, interleaved."""
    n, rounds = (300, 2) if quick else (5_000, 7)
    tool = NoopTool()
    async with _default_host(tool) as default, _host(4, [tool]) as bare:
        timings = await interleaved({"default": lambda: default.call("noop", ARGS),
                                     "bare": lambda: bare.call("noop", ARGS),
                                     "direct": lambda: tool.execute(ARGS)}, n=n, rounds=rounds)
    (default_us, spread), (bare_us, _), (direct_us, _) = timings["default"], timings["bare"], timings["direct"]
    overhead = default_us - direct_us
    return [row("default host overhead per call (every built-in + 4 no-op plugins)", overhead, bare_us - direct_us,
                "µs/call", ratio=overhead / max(bare_us - direct_us, 1e-9), target="≤ 20 µs (issue 16)",
                met=overhead <= 20, spread=spread,
                notes=f"default host {default_us:.1f} µs/call (default audit durability); reference = the bare "
                      f"host with the same 4 plugins, {bare_us - direct_us:.1f} µs over a direct execute; "
                      "ratio = default/bare overhead")]


async def _scaling(quick: bool) -> list[Row]:
    n, rounds = (200, 1) if quick else (3_000, 5)
    rows: list[Row] = []
    base: float | None = None
    for plugins in (1, 4, 16, 64):
        tool = NoopTool()
        async with _host(plugins, [tool]) as host:
            t = await interleaved({"host": lambda h=host: h.call("noop", ARGS),
                                   "direct": lambda t=tool: t.execute(ARGS)}, n=n, rounds=rounds)
        overhead = t["host"][0] - t["direct"][0]
        base = base or overhead
        rows.append(row(f"scaling: {plugins} plugins", overhead, None, "µs/call", target="linear, small slope",
                        notes=f"{(overhead - base) / max(plugins - 1, 1):.2f} µs per extra plugin" if plugins > 1
                        else ""))
    # The three hosts side by side in one interleaved run, so machine load hits them alike.
    counts = (10, 100, 1000)
    async with contextlib.AsyncExitStack() as stack:
        hosts = {count: await stack.enter_async_context(_host(4, [NoopTool(f"noop{i}") for i in range(count)]))
                 for count in counts}
        t = await interleaved({str(count): (lambda h=host: h.call("noop0", ARGS)) for count, host in hosts.items()},
                              n=n, rounds=rounds)
    first = t["10"][0]
    for count in counts:
        per_call = t[str(count)][0]
        rows.append(row(f"scaling: {count} mounted tools", per_call, first, "µs/call", ratio=per_call / first,
                        target="no growth (ratio to 10 tools ≈ 1)", met=per_call / first < 1.25,
                        notes="whole call through the host; the three hosts interleaved in one run"))
    return rows


class SleepTool:
    name = "sleeper"
    description = "sleeps"
    spec = ToolSpec(name="sleeper", input_schema={"type": "object"}, effect="Pure")  # type: ignore[arg-type]

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0.05)
        return ToolResult(output=None)


async def _concurrency(quick: bool) -> list[Row]:
    """Many concurrent calls of a sleeping tool, against the same coroutines gathered without the host."""
    count = 1_000 if quick else 10_000
    tool = SleepTool()
    async with _host(4, [SleepTool()]) as host:
        walls: dict[str, list[float]] = {"ours": [], "direct": []}
        results: list[ToolResult] = []
        for _ in range(1 if quick else 3):  # alternate, so both see the same machine load
            start = time.perf_counter()
            await asyncio.gather(*(tool.execute({}) for _ in range(count)))
            walls["direct"].append(time.perf_counter() - start)
            start = time.perf_counter()
            results = await asyncio.gather(*(host.call("sleeper", {}) for _ in range(count)))
            walls["ours"].append(time.perf_counter() - start)
    ours, direct = (statistics.median(walls[k]) * 1000 for k in ("ours", "direct"))
    ok = sum(r.success for r in results)
    return [row(f"concurrency: {count:,} calls of a 50 ms tool", ours, direct, "ms wall", ratio=ours / direct,
                notes=f"{ok}/{count} succeeded; reference = the same {count:,} tool coroutines gathered "
                      f"without the host; the sleep is 50 ms")]


async def _default_burst(quick: bool) -> list[Row]:
    """Issue 16: a burst of concurrent calls on the default host, against the same tool coroutines
    gathered without the host. The tool yields to the loop once, as a tool doing I/O does, so the
    calls really interleave (and their audit records land in the same turns of the loop)."""
    count, rounds = (200, 2) if quick else (1_000, 5)
    tool = YieldingTool()
    walls: dict[str, list[float]] = {"ours": [], "direct": []}
    async with _default_host(tool) as host:
        for _ in range(rounds):  # alternate, so both see the same machine load
            start = time.perf_counter()
            await asyncio.gather(*(tool.execute(ARGS) for _ in range(count)))
            walls["direct"].append(time.perf_counter() - start)
            start = time.perf_counter()
            results = await asyncio.gather(*(host.call("noop", ARGS) for _ in range(count)))
            walls["ours"].append(time.perf_counter() - start)
            assert all(r.success for r in results), results[0]
    ours, direct = (statistics.median(walls[k]) * 1000 for k in ("ours", "direct"))
    return [row(f"concurrency: {count:,} concurrent calls on the default host", ours, direct, "ms wall",
                ratio=ours / direct, target="≤ 3x without the host (issue 16)", met=ours / direct <= 3,
                notes=f"every built-in + 4 no-op plugins; reference = the same {count:,} coroutines "
                      f"(one `await asyncio.sleep(0)` each) gathered without the host; "
                      f"{ours / count * 1000:.1f} µs per call")]


class YieldingTool(NoopTool):
    """The no-op tool, but it yields to the event loop once before answering."""

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        await asyncio.sleep(0)
        return ToolResult(output="ok")


class ReadResultTool:
    """Returns what a file read typically looks like: ~3 KB of numbered lines and a few fields."""

    description = "a typical read result"
    input_schema = SCHEMA
    name = "reader"
    OUTPUT: ClassVar[dict[str, Any]] = {
        "path": "src/app/module.py", "lines_returned": 60, "total_lines": 60, "partial": False,
        "content": "".join(f"{i:6}\tdef function_{i}(value: int) -> int: return value * {i}\n" for i in range(1, 61)),
    }

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=self.OUTPUT)


async def _redaction(quick: bool) -> list[Row]:
    n, rounds = (300, 2) if quick else (5_000, 7)
    async with _host(0, [ReadResultTool()]) as plain, _host(0, [ReadResultTool()]) as guarded:
        guarded.capabilities["session.secrets"].update(
            ["deploy-key-0123456789abcdef", "ghp_notarealtoken000000000000000000000", 'pa"ss\\word-é-42'])
        timings = await interleaved({"none": lambda: plain.call("reader", ARGS),
                                     "three": lambda: guarded.call("reader", ARGS)}, n=n, rounds=rounds)
    (none_us, _), (three_us, spread) = timings["none"], timings["three"]
    size = len(str(ReadResultTool.OUTPUT))
    return [row("secret redaction per call (3 secrets, ~3 KB result)", three_us - none_us, None, "µs/call",
                spread=spread, notes=f"host call {three_us:.1f} µs with 3 registered secrets, {none_us:.1f} µs "
                                     f"with none; a {size:,}-character read result with no secret in it")]


async def _all(quick: bool) -> list[Row]:
    return [*await _overhead(quick), *await _default_overhead(quick), *await _default_burst(quick),
            *await _scaling(quick), *await _concurrency(quick), *await _redaction(quick)]


def run(quick: bool) -> list[Row]:
    return list(run_async(_all(quick)))


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
