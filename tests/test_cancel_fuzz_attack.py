"""Attack: the exactly-once promise under cancellation and close, k loop iterations at a time.

DESIGN "Completion, cancellation and close"; docs/design.md "The completion invariant". One host
(the built-in policy and audit plugins) whose tool carries every policy at once: a concurrency cap
of 1 (not queued, so a leaked slot shows as ``concurrency_limited`` at once), a rate limit, call
and time budgets, a circuit breaker, retries and a timeout. For k = 0, 1, 2, ... a call is started,
the loop runs k iterations, the caller's task is cancelled (or the host closed), and after each:
exactly one audit record and one ``tool_complete`` per call id, with the status the caller saw;
nothing held; rate tokens and budget calls charged for exactly the calls the policy admitted;
the breaker counting only the calls that failed in their own right (cancellations are neutral).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin
from test_exactly_once import Counting

from amplifier_tools import ExecutionError, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.builtins.policy import COUNTED_FAILURES, NEUTRAL_CODES, NOT_RUN_CODES, TOOL_FAULT_CODES

N = 24  # loop iterations before the cancel: past every await of the slowest tool below

POLICIES: dict[str, Any] = {
    "timeout_ms": 5000,
    "concurrency": {"limit": 1, "queue": False},
    "rate_limit": {"limit": 100000, "interval_ms": 3_600_000},
    "budgets": [{"per": "principal", "max_calls": 100000, "max_seconds": 100000, "window_ms": 3_600_000}],
    "circuit_breaker": {"failure_threshold": 100, "window_ms": 3_600_000, "cooldown_ms": 3_600_000},
    "retry": {"max_attempts": 3, "initial_backoff_ms": 0, "max_backoff_ms": 0, "jitter": False},
}


class FuzzTool:
    """One tool per behaviour (``kind``); each run counts, per call id, its starts and ends."""

    def __init__(self, kind: str, *, timeout_ms: float = 5000) -> None:
        self.kind = kind
        self.name = f"fz_{kind}"
        self.description = f"behaves: {kind}"
        self.spec = ToolSpec(name=self.name, description=self.description, effect="Pure",
                             policies={**POLICIES, "timeout_ms": timeout_ms})
        self.attempts: Counter[str] = Counter()
        self.running = 0
        self.gate = asyncio.Event()  # what a call with ``hold`` waits for

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        call = input.get("id", "")
        self.attempts[call] += 1
        self.running += 1
        try:
            if input.get("fail"):
                raise ExecutionError("down", code="backend_down", retryable=False)
            if input.get("hold"):
                await self.gate.wait()
                return ToolResult(True, "held")
            return await getattr(self, f"_{self.kind}")(call)
        finally:
            self.running -= 1

    async def _instant(self, call: str) -> ToolResult:
        return ToolResult(True, "instant")

    async def _suspends(self, call: str) -> ToolResult:
        for _ in range(6):
            await asyncio.sleep(0)
        return ToolResult(True, "suspended")

    async def _flaky(self, call: str) -> ToolResult:
        await asyncio.sleep(0)
        if self.attempts[call] == 1:
            raise ExecutionError("first attempt fails", code="backend_down", retryable=True)
        await asyncio.sleep(0)
        return ToolResult(True, "second attempt")

    async def _swallows(self, call: str) -> ToolResult:
        """Catches the first cancellation and goes on for a few iterations."""
        for _ in range(4):
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                for _ in range(3):
                    await asyncio.sleep(0)
                return ToolResult(True, "swallowed")
        return ToolResult(True, "swallows")

    async def _stubborn(self, call: str) -> ToolResult:
        """Ignores every cancellation for 8 iterations, then returns."""
        for _ in range(8):
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass
        return ToolResult(True, "stubborn")

    async def _raises_in_finally(self, call: str) -> ToolResult:
        try:
            for _ in range(4):
                await asyncio.sleep(0)
        finally:
            raise RuntimeError("cleanup failed")


class Rig:
    """A started host and its checks."""

    def __init__(self, host: ToolHost, tool: FuzzTool, counting: Counting) -> None:
        self.host, self.tool, self.counting = host, tool, counting
        self.policy = host.plugin_manager.get_plugin("policy")
        self.admitted = 0
        admit = self.policy._admit

        def counted_admit(context: Any, held: Any) -> None:
            self.admitted += 1
            admit(context, held)

        self.policy._admit = counted_admit
        self.counted_failures = 0
        self.started_calls: list[str] = []

    def records(self) -> dict[str, list[dict[str, Any]]]:
        path = Path(self.host.capabilities["audit.path"])
        out: dict[str, list[dict[str, Any]]] = {}
        if not path.exists():  # created at the first record
            return out
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "call":
                out.setdefault(record["call_id"], []).append(record)
        return out

    def held(self) -> dict[str, int]:
        held: dict[str, int] = self.policy.held_resources()
        return held

    def check(self, call_id: str, outcome: ToolResult | BaseException | None, *, ran: bool = True) -> None:
        """``outcome``: the result the caller got, the exception it raised (CancelledError), or
        None when the call's coroutine never ran (cancelled before its first step)."""
        seen, records = self.counting.seen, self.records()
        if not ran:
            assert call_id not in records and not any(key[1] == call_id for key in seen), (call_id, seen)
            return
        assert seen["tool_post", call_id] + seen["tool_error", call_id] == 1, (call_id, outcome, seen)
        assert seen["tool_complete", call_id] == 1, (call_id, outcome, seen)
        assert len(records.get(call_id, [])) == 1, (call_id, outcome, records.get(call_id))
        (record,) = records[call_id]
        completed = self.counting.completed[call_id]
        if isinstance(outcome, ToolResult):
            assert record["status"] == ("ok" if outcome.success else "error"), (record, outcome)
            if not outcome.success:
                assert record["error"]["code"] == outcome.error["code"], (record, outcome)
                assert outcome.error["code"] != "cancelled", outcome  # a caller who got a result did not get that
        else:
            assert isinstance(outcome, asyncio.CancelledError), outcome
            # Cancelled: recorded as cancelled — or, when the cancel arrived only while tool_complete
            # observers ran, as what was completed (the documented one case where they differ).
            if record["status"] != "ok":
                assert record["error"]["code"] in ("cancelled", completed.error["code"]), record
        error = completed.error
        if error is not None and error.get("plugin") is None and not error.get("by_deadline") and not (
                error.get("code") in NEUTRAL_CODES and error.get("type") == "SystemError") and (
                (error.get("type"), error.get("code")) not in NOT_RUN_CODES) and (
                error.get("type") in COUNTED_FAILURES or error.get("code") in TOOL_FAULT_CODES):
            self.counted_failures += 1
        self.check_held()

    def check_held(self) -> None:
        assert not any(self.held().values()), self.held()
        assert self.tool.running == 0
        name = self.tool.name
        spec = self.tool.spec
        rate = spec.policies.rate_limit
        assert rate is not None
        window = int(self.policy.clock() // (rate.interval_ms / 1000.0))
        key = self.policy._rate_keys.get(name)  # the plugin's own key for the tool's counter
        assert (self.policy.state.get(key, window) if key is not None else 0) == self.admitted
        (budget,) = self.policy._plan_of(spec).budgets
        key = budget.key("anonymous")
        bwindow = int(self.policy.clock() // (budget.window_ms / 1000.0))
        assert self.policy.state.get(f"{key}:calls", bwindow) == self.admitted
        breaker = self.policy._breakers.get(name)
        if breaker is not None:
            assert breaker.state == "closed" and breaker.probe is None
            assert len(breaker._failures) == self.counted_failures, (breaker.snapshot(), self.counted_failures)
            if self.counted_failures >= 90:  # the tool's own failures near the threshold: start afresh
                del self.policy._breakers[name]
                self.counted_failures = 0

    async def slot_is_free(self) -> None:
        """The concurrency slot came back: a call at cap=1 (not queued) gets in at once."""
        call_id = f"probe-{len(self.started_calls)}"
        self.started_calls.append(call_id)
        result = await asyncio.wait_for(self.host.call(self.tool.name, {"id": call_id}, call_id=call_id), 10)
        assert (result.error or {}).get("code") != "concurrency_limited", result.error
        self.check(call_id, result)


async def make_rig(tmp_path: Path, tool: FuzzTool, *extra: Any, config: dict[str, Any] | None = None) -> Rig:
    counting = Counting()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}, **(config or {})},
                    plugins=[ToolsPlugin(tool), counting, *extra], builtins=["policy", "audit"],
                    entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    return Rig(host, tool, counting)


async def cancel_after(rig: Rig, call_id: str, k: int, *, times: int = 1) -> ToolResult | BaseException:
    task = asyncio.ensure_future(rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id))
    for _ in range(k):
        await asyncio.sleep(0)
    for _ in range(times):
        task.cancel()
        await asyncio.sleep(0) if times > 1 else None
    try:
        return await task
    except asyncio.CancelledError as exc:
        return exc


KINDS = ["instant", "suspends", "flaky", "swallows", "stubborn", "raises_in_finally"]


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_after_k_iterations_keeps_every_invariant(tmp_path: Path, kind: str) -> None:
    rig = await make_rig(tmp_path, FuzzTool(kind))
    try:
        for k in range(N):
            call_id = f"{kind}-{k}"
            outcome = await cancel_after(rig, call_id, k)
            rig.check(call_id, outcome, ran=k > 0)
            await rig.slot_is_free()
    finally:
        await rig.host.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_twice_after_k_iterations_keeps_every_invariant(tmp_path: Path, kind: str) -> None:
    rig = await make_rig(tmp_path, FuzzTool(kind))
    try:
        for k in range(N):
            call_id = f"{kind}-{k}"
            outcome = await cancel_after(rig, call_id, k, times=2)
            rig.check(call_id, outcome, ran=k > 0)
            await rig.slot_is_free()
    finally:
        await rig.host.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_close_after_k_iterations_records_each_call_once(tmp_path: Path, kind: str) -> None:
    for k in range(N):
        (tmp_path / f"{k}").mkdir()
        rig = await make_rig(tmp_path / f"{k}", FuzzTool(kind), config={"shutdown_grace_ms": 0})
        call_id = f"{kind}-{k}"
        task = asyncio.ensure_future(rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id))
        for _ in range(k):
            await asyncio.sleep(0)
        await rig.host.close()
        if k == 0:  # the call's coroutine had not begun: it arrives after close() and is refused, unrecorded
            assert (await task).error["code"] == "host_closing"
            rig.check(call_id, None, ran=False)
            continue
        assert task.done()
        outcome = task.result()  # a cut by close() returns, never raises
        assert isinstance(outcome, ToolResult)
        rig.check(call_id, outcome)
        assert (await rig.host.call(rig.tool.name, {"id": "late"})).error["code"] == "host_closing"



class SuspendingHooks:
    """Async hooks that each suspend ``iterations`` loop iterations; ``position`` orders them
    before (tryfirst) or after (trylast) the policy plugin's ``tool_pre``."""

    name = "suspending"

    def __init__(self, iterations: int = 5) -> None:
        self.iterations = iterations

    async def _suspend(self) -> None:
        for _ in range(self.iterations):
            await asyncio.sleep(0)

    @hookimpl(trylast=True)
    async def tool_pre(self, call: Any) -> None:
        await self._suspend()

    @hookimpl
    async def tool_post(self, call: Any) -> None:
        await self._suspend()

    @hookimpl
    async def tool_error(self, call: Any) -> None:
        await self._suspend()


class SuspendingFirst(SuspendingHooks):
    name = "suspending-first"

    @hookimpl(tryfirst=True)
    async def tool_pre(self, call: Any) -> None:
        await self._suspend()


@pytest.mark.parametrize("hooks", [SuspendingHooks, SuspendingFirst])
@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_while_async_hooks_are_suspended(tmp_path: Path, kind: str, hooks: type) -> None:
    rig = await make_rig(tmp_path, FuzzTool(kind), hooks())
    try:
        for k in range(N + 20):
            call_id = f"{kind}-{k}"
            outcome = await cancel_after(rig, call_id, k)
            rig.check(call_id, outcome, ran=k > 0)
            await rig.slot_is_free()
        for k in range(N + 20):
            call_id = f"twice-{kind}-{k}"
            outcome = await cancel_after(rig, call_id, k, times=2)
            rig.check(call_id, outcome, ran=k > 0)
    finally:
        await rig.host.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_close_while_async_hooks_are_suspended(tmp_path: Path, kind: str) -> None:
    for k in range(1, N + 20):
        (tmp_path / f"{k}").mkdir()
        rig = await make_rig(tmp_path / f"{k}", FuzzTool(kind), SuspendingHooks(), config={"shutdown_grace_ms": 0})
        call_id = f"{kind}-{k}"
        task = asyncio.ensure_future(rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id))
        for _ in range(k):
            await asyncio.sleep(0)
        await rig.host.close()
        assert task.done()
        outcome = task.result()
        assert isinstance(outcome, ToolResult)
        rig.check(call_id, outcome)


@pytest.mark.parametrize("kind", ["suspends", "swallows", "stubborn", "raises_in_finally"])
async def test_close_while_a_caller_cancels_too(tmp_path: Path, kind: str) -> None:
    """The caller cancels at k, close() cuts at once: one record; the caller's cancel stands (3.11+)."""
    for k in range(1, N):
        (tmp_path / f"{k}").mkdir()
        rig = await make_rig(tmp_path / f"{k}", FuzzTool(kind), SuspendingHooks(2), config={"shutdown_grace_ms": 0})
        call_id = f"{kind}-{k}"
        task = asyncio.ensure_future(rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id))
        for _ in range(k):
            await asyncio.sleep(0)
        task.cancel()
        await rig.host.close()
        try:
            outcome: ToolResult | BaseException = await task
        except asyncio.CancelledError as exc:
            outcome = exc
        rig.check(call_id, outcome)


async def test_caller_timeout_and_tool_timeout_expire_together(tmp_path: Path) -> None:
    """``asyncio.timeout`` of the caller and the tool's own ``timeout_ms`` at the same moment."""
    if sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is 3.11+")

    class Slow(FuzzTool):
        async def _slow(self, call: str) -> ToolResult:
            await asyncio.sleep(30)
            return ToolResult(True, "slow")

    rig = await make_rig(tmp_path, Slow("slow", timeout_ms=20))
    try:
        for i in range(30):
            call_id = f"slow-{i}"
            delay = 0.02 + (i - 15) * 0.0005
            outcome: ToolResult | BaseException
            try:
                async with asyncio.timeout(delay):
                    outcome = await rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id)
            except TimeoutError:
                outcome = asyncio.CancelledError()
            rig.check(call_id, outcome)
            await rig.slot_is_free()
    finally:
        await rig.host.close()


@pytest.mark.parametrize("seed", range(6))
async def test_gather_of_50_calls_with_random_cancels(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    kinds = KINDS
    tools = [FuzzTool(kind) for kind in kinds]
    for tool in tools:  # queued here: cancels land on waiting calls too
        tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                             policies={**POLICIES, "concurrency": {"limit": 2, "queue": True}})
    counting = Counting()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(*tools), counting, SuspendingHooks(rng.randrange(0, 4))],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    try:
        calls = [(f"g{seed}-{i}", rng.choice(tools)) for i in range(50)]
        tasks = [asyncio.ensure_future(host.call(tool.name, {"id": cid}, call_id=cid)) for cid, tool in calls]
        plan = sorted((rng.randrange(0, 40), i) for i in rng.sample(range(50), 25))
        step = 0
        for at, i in plan:
            while step < at:
                await asyncio.sleep(0)
                step += 1
            tasks[i].cancel()
            if rng.random() < 0.3:
                tasks[i].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        records = Counter()
        path = Path(host.capabilities["audit.path"])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "call":
                records[record["call_id"]] += 1
        for (cid, _), outcome in zip(calls, outcomes, strict=True):
            started = any(key[1] == cid for key in counting.seen)
            if isinstance(outcome, ToolResult):
                assert outcome.error is None or outcome.error["code"] != "cancelled", outcome
                assert records[cid] == 1 and counting.seen["tool_complete", cid] == 1
            else:
                assert isinstance(outcome, asyncio.CancelledError), outcome
                assert records[cid] == (1 if started else 0), (cid, records[cid])
                assert counting.seen["tool_complete", cid] == (1 if started else 0)
            assert counting.seen["tool_post", cid] + counting.seen["tool_error", cid] == (1 if started else 0)
        policy = host.plugin_manager.get_plugin("policy")
        assert not any(policy.held_resources().values()), policy.held_resources()
        for tool in tools:
            assert tool.running == 0
            breaker = policy._breakers.get(tool.name)
            assert breaker is None or (breaker.state == "closed" and breaker.probe is None)
            follow = await asyncio.wait_for(host.call(tool.name, {"id": "after"}), 10)
            assert (follow.error or {}).get("code") not in ("concurrency_limited", "circuit_open"), follow.error
    finally:
        await host.close()


# -- regressions: the defects the fuzzing above found -----------------------------------------


async def test_cancel_while_an_async_tool_post_hook_runs_still_runs_the_rest_of_the_chain(tmp_path: Path) -> None:
    """Found by attack: a cancellation while one async ``tool_post`` implementation was awaited cut
    the chain, and every plugin after it saw neither ``tool_post`` nor ``tool_error`` for the call
    (DESIGN: every call ends in exactly one of them, so an observer sees every call exactly once)."""
    entered, release = asyncio.Event(), asyncio.Event()

    class SlowPost:
        name = "slow-post"

        @hookimpl(tryfirst=True)
        async def tool_post(self, call: Any) -> None:
            entered.set()
            await release.wait()

    counting = Counting()
    tool = FuzzTool("instant")
    async with ToolHost(plugins=[ToolsPlugin(tool), counting, SlowPost()], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        task = asyncio.ensure_future(host.call(tool.name, {}, call_id="p1"))
        await entered.wait()
        task.cancel()
        await asyncio.sleep(0.01)
        assert not task.done()  # the awaited implementation finishes first, within its hook timeout
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert counting.seen["tool_post", "p1"] == 1 and counting.seen["tool_error", "p1"] == 0
        assert counting.seen["tool_complete", "p1"] == 1
        assert counting.completed["p1"].error["code"] == "cancelled"
        policy = host.plugin_manager.get_plugin("policy")
        assert not any(policy.held_resources().values())


async def test_close_cutting_a_call_in_an_async_tool_post_hook_runs_the_rest_of_the_chain(tmp_path: Path) -> None:
    """The same through ``close()``: the cut call returns ``host_closing``, and every ``tool_post``
    implementation saw it."""
    entered = asyncio.Event()

    class SlowPost:
        name = "slow-post"

        @hookimpl(tryfirst=True)
        async def tool_post(self, call: Any) -> None:
            entered.set()
            for _ in range(5):
                await asyncio.sleep(0)

    counting = Counting()
    tool = FuzzTool("instant")
    host = ToolHost(config={"shutdown_grace_ms": 0}, plugins=[ToolsPlugin(tool), counting, SlowPost()],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    task = asyncio.ensure_future(host.call(tool.name, {}, call_id="k1"))
    await entered.wait()
    await host.close()
    result = await task
    assert result.error["code"] == "host_closing"
    assert counting.seen["tool_post", "k1"] == 1 and counting.seen["tool_error", "k1"] == 0
    assert counting.seen["tool_complete", "k1"] == 1


async def test_a_caller_cancel_then_a_cut_by_close_raises_on_every_version(tmp_path: Path) -> None:
    """Found by attack on 3.10: a caller cancelled, and ``close()`` cut the call while it was being
    recorded as cancelled; the caller got a returned ``ToolResult`` with code ``cancelled``
    instead of ``CancelledError`` (3.11+ told the two cancellations apart by counting them)."""
    gate, release = asyncio.Event(), asyncio.Event()

    class SlowError:
        name = "slow-error"

        @hookimpl
        async def tool_error(self, call: Any) -> None:
            gate.set()
            await release.wait()

    counting = Counting()
    tool = FuzzTool("suspends")
    host = ToolHost(config={"shutdown_grace_ms": 0}, plugins=[ToolsPlugin(tool), counting, SlowError()],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    task = asyncio.ensure_future(host.call(tool.name, {}, call_id="c1"))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    await gate.wait()  # being recorded as the caller's cancellation
    closing = asyncio.ensure_future(host.close())
    await asyncio.sleep(0.01)  # close() cuts the call now
    release.set()
    await closing
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counting.completed["c1"].error["code"] == "cancelled"
    assert counting.seen["tool_error", "c1"] == 1 and counting.seen["tool_complete", "c1"] == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_with_an_idempotency_key_after_k_iterations_frees_the_key(tmp_path: Path, kind: str) -> None:
    """A cancelled call's idempotency claim is given back: the same key runs again (or replays a
    stored success), never ``idempotency_in_progress`` and never a wait."""
    from amplifier_tools import ToolContext

    rig = await make_rig(tmp_path, FuzzTool(kind))
    try:
        for k in range(N):
            call_id = f"{kind}-{k}"
            context = ToolContext(idempotency_key=f"key-{k}")
            task = asyncio.ensure_future(rig.host.call(rig.tool.name, {"id": call_id}, call_id=call_id,
                                                       context=context))
            for _ in range(k):
                await asyncio.sleep(0)
            task.cancel()
            try:
                outcome: ToolResult | BaseException = await task
            except asyncio.CancelledError as exc:
                outcome = exc
            rig.check(call_id, outcome, ran=k > 0)
            again = await asyncio.wait_for(rig.host.call(rig.tool.name, {"id": call_id}, call_id=f"again-{k}",
                                                         context=ToolContext(idempotency_key=f"key-{k}")), 10)
            assert (again.error or {}).get("code") not in ("idempotency_in_progress", "concurrency_limited"), again
            if isinstance(outcome, ToolResult) and outcome.success:
                assert again.metadata.get("replayed") is True, again
            rig.check(f"again-{k}", again)
    finally:
        await rig.host.close()


@pytest.mark.parametrize("kind", ["instant", "suspends", "swallows"])
async def test_cancel_a_queued_call_after_k_iterations(tmp_path: Path, kind: str) -> None:
    """Cap 1, queued: a holder runs, a second call waits for the slot and is cancelled at k; it
    never starts, the holder finishes, the next call gets the slot."""
    tool = FuzzTool(kind)
    tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                         policies={**POLICIES, "concurrency": {"limit": 1, "queue": True}})
    counting = Counting()
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}}, plugins=[ToolsPlugin(tool), counting],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    policy = host.plugin_manager.get_plugin("policy")
    try:
        for k in range(N):
            tool.gate.clear()
            holder = asyncio.ensure_future(host.call(tool.name, {"id": f"h{k}", "hold": True}, call_id=f"h{k}"))
            while tool.running == 0:
                await asyncio.sleep(0)
            queued = asyncio.ensure_future(host.call(tool.name, {"id": f"q{k}"}, call_id=f"q{k}"))
            for _ in range(k):
                await asyncio.sleep(0)
            queued.cancel()
            tool.gate.set()
            assert (await holder).success
            with pytest.raises(asyncio.CancelledError):
                await queued
            assert tool.attempts[f"q{k}"] == 0  # queued, never started
            nxt = await asyncio.wait_for(host.call(tool.name, {"id": f"n{k}"}, call_id=f"n{k}"), 10)
            assert nxt.success, nxt.error
            assert not any(policy.held_resources().values()), policy.held_resources()
            for cid in (f"h{k}", f"q{k}", f"n{k}"):
                ran = not (cid.startswith("q") and k == 0)
                assert counting.seen["tool_complete", cid] == (1 if ran else 0), (cid, counting.seen)
                assert counting.seen["tool_post", cid] + counting.seen["tool_error", cid] == (1 if ran else 0)
    finally:
        await host.close()


async def test_cancelling_the_half_open_probe_after_k_iterations_lets_the_next_call_probe(tmp_path: Path) -> None:
    tool = FuzzTool("suspends")
    tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                         policies={**POLICIES, "circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 1}})
    rig = await make_rig(tmp_path, tool)
    try:
        for k in range(1, N):
            opened = await rig.host.call(tool.name, {"id": f"f{k}", "fail": True}, call_id=f"f{k}")
            assert opened.error["code"] == "backend_down"
            breaker = rig.policy._breakers[tool.name]
            assert breaker.state == "open"
            await asyncio.sleep(0.005)  # past the cooldown: the next call is the probe
            outcome = await cancel_after(rig, f"p{k}", k)
            records = rig.records()
            assert len(records[f"p{k}"]) == 1
            assert not any(rig.held().values()), rig.held()
            if isinstance(outcome, BaseException):
                assert breaker.state == "half_open" and breaker.probe is None  # abandoned: not poisoned
            nxt = await asyncio.wait_for(rig.host.call(tool.name, {"id": f"n{k}"}, call_id=f"n{k}"), 10)
            assert nxt.success, nxt.error
            assert breaker.state == "closed"
    finally:
        await rig.host.close()


@pytest.mark.parametrize("k", range(12))
async def test_cancel_a_call_queued_for_the_next_rate_window(tmp_path: Path, k: int) -> None:
    tool = FuzzTool("instant")
    tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                         policies={**POLICIES, "rate_limit": {"limit": 1, "interval_ms": 200, "queue": True}})
    rig = await make_rig(tmp_path, tool)
    try:
        first = await rig.host.call(tool.name, {"id": "a"}, call_id="a")
        assert first.success
        outcome = await cancel_after(rig, "b", k)
        assert isinstance(outcome, BaseException) or outcome.success
        assert tool.attempts["b"] == (1 if isinstance(outcome, ToolResult) else 0)
        assert len(rig.records().get("b", [])) == (1 if k else 0)
        assert not any(rig.held().values()), rig.held()
    finally:
        await rig.host.close()


@pytest.mark.parametrize("backoff_ms", [0, 3])
async def test_cancel_during_retries_reports_the_attempts_that_ran(tmp_path: Path, backoff_ms: float) -> None:
    """A retried call cancelled in an attempt or in the wait between two: recorded once, with the
    number of attempts that began; nothing held."""
    tool = FuzzTool("flaky")
    tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                         policies={**POLICIES, "retry": {"max_attempts": 3, "initial_backoff_ms": backoff_ms,
                                                         "max_backoff_ms": backoff_ms, "jitter": False}})
    rig = await make_rig(tmp_path, tool)
    try:
        for k in range(1, 40):
            call_id = f"r{k}"
            task = asyncio.ensure_future(rig.host.call(tool.name, {"id": call_id}, call_id=call_id))
            for _ in range(k):
                await asyncio.sleep(0 if backoff_ms == 0 or k % 2 else 0.0005)
            task.cancel()
            try:
                outcome: ToolResult | BaseException = await task
            except asyncio.CancelledError as exc:
                outcome = exc
            rig.check(call_id, outcome)
            completed = rig.counting.completed[call_id]
            if tool.attempts[call_id]:
                assert completed.metadata.get("attempts") == tool.attempts[call_id], (completed, tool.attempts)
            await rig.slot_is_free()
    finally:
        await rig.host.close()


@pytest.mark.parametrize("seed", range(8))
async def test_close_amid_50_calls_with_random_cancels(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    tools = [FuzzTool(kind) for kind in KINDS]
    for tool in tools:
        tool.spec = ToolSpec(name=tool.name, description=tool.description, effect="Pure",
                             policies={**POLICIES, "concurrency": {"limit": 2, "queue": True}})
    counting = Counting()
    extra = [SuspendingHooks(rng.randrange(0, 4))] if rng.random() < 0.7 else []
    host = ToolHost(config={"plugins": {"audit": {"fsync": "never"}}, "shutdown_grace_ms": rng.choice([0, 1, 5])},
                    plugins=[ToolsPlugin(*tools), counting, *extra],
                    builtins=["policy", "audit"], entry_points=False, working_dir=tmp_path, discover=False)
    await host.start()
    path = Path(host.capabilities["audit.path"])
    policy = host.plugin_manager.get_plugin("policy")
    calls = [(f"c{seed}-{i}", rng.choice(tools)) for i in range(50)]
    tasks = [asyncio.ensure_future(host.call(tool.name, {"id": cid}, call_id=cid)) for cid, tool in calls]
    await asyncio.sleep(0)  # every call's coroutine has begun
    cancelled: set[int] = set()
    close_at = rng.randrange(1, 30)
    closing: asyncio.Future[None] | None = None
    for step in range(40):
        if step == close_at:
            closing = asyncio.ensure_future(host.close())
        if rng.random() < 0.4:
            i = rng.randrange(50)
            tasks[i].cancel()
            cancelled.add(i)
        await asyncio.sleep(0)
    assert closing is not None
    await closing
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    records: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "call":
                records[record["call_id"]] += 1
    for i, ((cid, _), outcome) in enumerate(zip(calls, outcomes, strict=True)):
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, asyncio.CancelledError) and i in cancelled, (cid, outcome)
        else:
            assert outcome.error is None or outcome.error["code"] != "cancelled", (cid, outcome.error)
        assert records[cid] == 1, (cid, outcome, records[cid])
        assert counting.seen["tool_complete", cid] == 1
        assert counting.seen["tool_post", cid] + counting.seen["tool_error", cid] == 1, (cid, outcome)
    assert not any(policy.held_resources().values()), policy.held_resources()
    assert all(tool.running == 0 for tool in tools)


async def test_a_second_cancel_does_not_leave_a_tool_that_ignores_cancellation_running(tmp_path: Path) -> None:
    """Found by attack on 3.10, where a tool under a timeout runs in a task of its own: a
    second cancellation ended ``wait_for``'s wait for the run it had cancelled, so the call was
    recorded and its concurrency slot given back while the tool went on running (a second call
    then ran beside it, over the cap of 1). Now the call ends when the tool does, as on 3.11+."""
    tool = FuzzTool("stubborn")
    rig = await make_rig(tmp_path, tool)
    try:
        task = asyncio.ensure_future(rig.host.call(tool.name, {"id": "s1"}, call_id="s1"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert tool.running == 1
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        try:
            outcome: ToolResult | BaseException = await task
        except asyncio.CancelledError as exc:
            outcome = exc
        assert tool.running == 0  # the tool's run ended before the call did
        rig.check("s1", outcome)
        await rig.slot_is_free()
    finally:
        await rig.host.close()
