"""Retries and their accounting, attacked: what a retried call reports, how its waits meet the
caller's deadline, and what a retry policy makes a time budget reserve."""

from __future__ import annotations

import asyncio
import json
import re
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from helpers import FakeClock, ToolsPlugin

from amplifier_tools import ExecutionError, PluginLoadError, ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import PolicyPlugin
from amplifier_tools.spec import Budget, CircuitBreakerPolicy, ConcurrencyPolicy, RateLimit, RetryPolicy


class Flaky:
    """Fails with a retryable error: raised (``report=False``) or reported as a failed result.
    ``gate``: each run waits for it first; ``hang``: each run waits forever (until cancelled)."""

    def __init__(self, name: str, *, effect: str = "Pure", report: bool = False, fail: bool = True,
                 gate: asyncio.Event | None = None, hang: bool = False, **spec: Any) -> None:
        self.spec = ToolSpec(name=name, description=name, effect=effect, **spec)
        self.name, self.description = name, name
        self.report, self.fail, self.gate, self.hang = report, fail, gate, hang
        self.runs = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.runs += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.hang:
            await asyncio.Event().wait()
        if not self.fail:
            return ToolResult(output="done")
        if self.report:
            return ToolResult(success=False, output="partial", error={
                "type": "ExecutionError", "code": "busy", "message": "backend busy", "retryable": True})
        raise ExecutionError("backend down", code="backend_down", retryable=True)


def _call_records(log: Path) -> list[dict[str, Any]]:
    return [row for row in map(json.loads, log.read_text().splitlines()) if row["kind"] == "call"]


@pytest.mark.parametrize("report", [False, True], ids=["raised", "reported"])
async def test_a_retried_call_that_fails_reports_every_attempt_to_the_caller_and_the_audit_record(
        tmp_path: Path, report: bool) -> None:
    """Found by attack: a call whose three attempts all failed said ``attempts`` nothing to the
    caller and ``attempts: 1`` in its audit record; only a success reported its count."""
    tool = Flaky("lookup", report=report,
                 policies={"retry": {"max_attempts": 3, "initial_backoff_ms": 1, "max_backoff_ms": 2}})
    async with ToolHost(plugins=[ToolsPlugin(tool)], builtins=["policy", "audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        result = await host.call("lookup", {})
        log = host.state_dir / "audit.jsonl"
    assert tool.runs == 3
    assert result.error["code"] == ("busy" if report else "backend_down")
    assert result.metadata["attempts"] == 3
    [record] = _call_records(log)
    assert record["status"] == "error" and record["attempts"] == 3
    assert [d["action"] for d in record["trail"]] == ["retry", "retry"]


async def test_a_backoff_that_would_end_past_the_callers_deadline_is_not_started(delays: list[float]) -> None:
    """Found by attack: with a 5 s backoff and 0.5 s left of its deadline, a call slept the 5 s
    (the caller waited 10 times its deadline), then failed ``deadline_exceeded`` "before tool could
    run" — though the tool had run and failed. Now the retry is not started: the call ends at once
    with its attempt's own error."""
    tool = Flaky("lookup", policies={"retry": {"max_attempts": 3, "initial_backoff_ms": 5000,
                                               "max_backoff_ms": 5000, "jitter": False}})
    host = ToolHost(plugins=[ToolsPlugin(tool)], builtins=False, entry_points=False, discover=False)
    async with host:
        result = await host.call("lookup", {}, context=ToolContext(deadline=time.monotonic() + 0.5))
    assert delays == [] and tool.runs == 1
    assert result.error["code"] == "backend_down" and result.metadata["attempts"] == 1


async def test_a_timeout_at_the_callers_deadline_is_not_retried(delays: list[float]) -> None:
    """Found by attack: an attempt cut by the caller's deadline (``timeout``, ``by_deadline``) was
    retried after its backoff, and the call ended ``deadline_exceeded`` instead of the timeout."""
    tool = Flaky("slow", hang=True, policies={"timeout_ms": 5000, "retry": {
        "max_attempts": 3, "initial_backoff_ms": 1, "max_backoff_ms": 1}})
    async with ToolHost(plugins=[ToolsPlugin(tool)], builtins=False, entry_points=False, discover=False) as host:
        result = await host.call("slow", {}, context=ToolContext(deadline=time.monotonic() + 0.05))
    assert tool.runs == 1 and delays == []
    assert result.error["code"] == "timeout" and result.error["by_deadline"] is True


async def test_a_retry_within_the_deadline_still_runs(delays: list[float]) -> None:
    tool = Flaky("lookup", policies={"retry": {"max_attempts": 3, "initial_backoff_ms": 10,
                                               "max_backoff_ms": 10, "jitter": False}})
    async with ToolHost(plugins=[ToolsPlugin(tool)], builtins=False, entry_points=False, discover=False) as host:
        result = await host.call("lookup", {}, context=ToolContext(deadline=time.monotonic() + 60))
    assert tool.runs == 3 and delays == [0.01, 0.01] and result.metadata["attempts"] == 3


async def test_a_huge_max_attempts_does_not_fail_every_call_of_a_tool_with_a_time_budget() -> None:
    """Found by attack: reserving a time budget summed ``initial * multiplierⁿ`` for every
    attempt; at 5,000 attempts the power overflowed and every call failed ``hook_failed``
    (OverflowError) — and with ``multiplier = 1`` a billion attempts looped for minutes."""
    clock = FakeClock()
    tool = Flaky("lookup", fail=False, policies={
        "retry": {"max_attempts": 5000, "initial_backoff_ms": 100, "max_backoff_ms": 1000},
        "budgets": [{"per": "principal", "max_seconds": 10}]})
    host = ToolHost(plugins=[ToolsPlugin(tool), PolicyPlugin(clock=clock, sleep=clock.sleep)],
                    builtins=False, entry_points=False, discover=False)
    async with host:
        result = await host.call("lookup", {})
    assert result.success and result.output == "done", result.error


async def test_an_unkeyed_idempotent_write_reserves_one_attempt_of_a_time_budget() -> None:
    """Found by attack: an ``IdempotentWrite`` call without an idempotency key is never retried,
    yet it reserved all its attempts and waits (here the whole 0.5 s budget for a 0.1 s call), so
    a second concurrent call was refused ``budget_exceeded`` "reserved by calls in flight"."""
    clock, gate = FakeClock(), asyncio.Event()
    tool = Flaky("put", effect="IdempotentWrite", fail=False, gate=gate, policies={
        "timeout_ms": 100, "retry": {"max_attempts": 5, "initial_backoff_ms": 1000},
        "budgets": [{"per": "principal", "max_seconds": 0.5}]})
    host = ToolHost(plugins=[ToolsPlugin(tool), PolicyPlugin(clock=clock, sleep=clock.sleep)],
                    builtins=False, entry_points=False, discover=False)
    async with host:
        tasks = [asyncio.create_task(host.call("put", {})) for _ in range(3)]
        for _ in range(100):
            if tool.runs == 3 or any(t.done() for t in tasks):
                break
            await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*tasks)
        keyed = await host.call("put", {}, context=ToolContext(idempotency_key="k"))
    assert [r.success for r in results] == [True, True, True], [r.error for r in results]
    assert keyed.success and tool.runs == 4


@pytest.mark.parametrize(("retry", "message"), [
    ({"max_attempts": True}, "max_attempts: must be an integer, got True"),
    ({"max_attempts": 2.5}, "max_attempts: must be an integer, got 2.5"),
    ({"max_attempts": "3"}, "max_attempts: must be an integer, got '3'"),
    ({"initial_backoff_ms": "1"}, "initial_backoff_ms: must be a number, got '1'"),
    ({"jitter": "no"}, "jitter: must be true or false, got 'no'"),
])
def test_a_contracts_retry_policy_of_the_wrong_type_is_refused_naming_the_field(
        retry: dict[str, Any], message: str) -> None:
    """Found by attack: host configuration refused these, but the same values in a tool's own
    contract were coerced — ``max_attempts = true`` into one attempt (no retries), ``2.5`` into 2,
    ``jitter = "no"`` into jitter on: silently another policy than the one written."""
    with pytest.raises(ValueError, match=r"invalid policies: \$\.retry\." + re.escape(message)):
        ToolSpec(name="lookup", effect="Pure", policies={"retry": retry})

    class Seed:
        name, description, effect = "lookup", "look up", "Pure"
        policies = {"retry": retry}

        async def execute(self, input: dict[str, Any]) -> str:
            return "done"

    async def start() -> None:
        async with ToolHost(plugins=[ToolsPlugin(Seed())], builtins=False, entry_points=False, discover=False):
            pass

    with pytest.raises(PluginLoadError, match="tool 'lookup' has an invalid contract: .*" + re.escape(message)):
        asyncio.run(start())


@pytest.mark.parametrize(("build", "message"), [
    (lambda: RetryPolicy(max_attempts=True), "max_attempts must be an integer, got True"),
    (lambda: RetryPolicy(max_attempts=2.5), "max_attempts must be an integer, got 2.5"),
    (lambda: RetryPolicy(initial_backoff_ms="1"), "initial_backoff_ms must be a number, got '1'"),
    (lambda: RetryPolicy(jitter="no"), "jitter must be true or false, got 'no'"),
    (lambda: RateLimit(limit="3"), "limit must be an integer, got '3'"),
    (lambda: ConcurrencyPolicy(limit=2, queue=1), "queue must be true or false, got 1"),
    (lambda: CircuitBreakerPolicy(failure_rate="half"), "failure_rate must be a number, got 'half'"),
    (lambda: Budget(per="principal", max_seconds=True), "max_seconds must be a number, got True"),
])
def test_a_policy_object_of_the_wrong_type_is_refused_naming_the_field(build: Any, message: str) -> None:
    """Found by review of the attack above: the policy classes themselves took ``max_attempts=True``
    (one attempt), ``2.5`` (a time budget's reservation then raised ``TypeError`` at every call) and
    ``jitter="no"`` (jitter on); only plain data was checked."""
    with pytest.raises(TypeError) as refused:
        build()
    assert str(refused.value) == message


def test_policy_objects_of_the_right_types_are_taken() -> None:
    retry = RetryPolicy(max_attempts=2, initial_backoff_ms=0, max_backoff_ms=10, multiplier=1.5, jitter=False)
    assert (retry.max_attempts, retry.initial_backoff_ms, retry.max_backoff_ms, retry.multiplier, retry.jitter) == (
        2, 0, 10, 1.5, False)
    budget = Budget(per="principal", max_calls=3, max_seconds=1, window_ms=1000)
    assert (budget.per, budget.max_calls, budget.max_seconds, budget.window_ms) == ("principal", 3, 1, 1000)
    breaker = CircuitBreakerPolicy(failure_rate=1, min_calls=2)
    assert (breaker.failure_rate, breaker.min_calls) == (1, 2)
    # Numbers of other kinds count as what they are (found by review: a Fraction, NumPy's integers
    # were refused): ``numbers.Integral`` and ``numbers.Real``.
    assert RetryPolicy(max_attempts=3, initial_backoff_ms=Fraction(1, 2)).initial_backoff_ms == 0.5
    with pytest.raises(TypeError, match="max_attempts must be an integer, got Fraction"):
        RetryPolicy(max_attempts=Fraction(3, 1))


class SecondAttemptSignals(Flaky):
    """Fails retryably; ``second`` is set when the second attempt begins, which hangs when
    ``hang_second`` (until cancelled)."""

    def __init__(self, *args: Any, hang_second: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.second, self.hang_second = asyncio.Event(), hang_second

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if self.runs == 1:
            self.second.set()
            if self.hang_second:
                self.runs += 1
                await asyncio.Event().wait()
        return await super().execute(input)


@pytest.mark.parametrize("where", ["in-the-wait", "in-the-attempt"])
async def test_a_retried_call_cancelled_after_its_first_attempt_reports_the_attempts_begun(
        tmp_path: Path, where: str) -> None:
    """Found by review of the attack above: cancelled in the wait after its second attempt (or
    during that attempt), a call was recorded as one attempt."""
    tool = SecondAttemptSignals("lookup", hang_second=where == "in-the-attempt", policies={
        "retry": {"max_attempts": 5, "initial_backoff_ms": 1, "max_backoff_ms": 60_000, "multiplier": 60_000,
                  "jitter": False}})  # 1 ms after the first attempt, 60 s after the second
    async with ToolHost(plugins=[ToolsPlugin(tool)], builtins=["audit"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        call = asyncio.ensure_future(host.call("lookup", {}))
        await tool.second.wait()
        for _ in range(5):  # on into the second attempt's failure and the wait after it
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        log = host.state_dir / "audit.jsonl"
    assert tool.runs == 2
    [record] = _call_records(log)
    assert record["error"]["code"] == "cancelled" and record["attempts"] == 2


class RaisesWithAnOutputDetail:
    """Raises a retryable error whose own details name an ``output``."""

    def __init__(self, retry: bool) -> None:
        policies = {"retry": {"max_attempts": 2, "initial_backoff_ms": 1, "max_backoff_ms": 1}} if retry else {}
        self.spec = ToolSpec(name="detail", description="d", effect="Pure", policies=policies)
        self.name, self.description = "detail", "d"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        raise ExecutionError("boom", code="boom", retryable=True, output="a detail of its own")


@pytest.mark.parametrize("retry", [False, True], ids=["without-retries", "with-retries"])
async def test_a_raised_errors_output_detail_stays_in_the_error_with_or_without_retries(retry: bool) -> None:
    """Found by the attack above: with a retry policy, the detail became the result's output (the
    path without retries kept it in the error)."""
    async with ToolHost(plugins=[ToolsPlugin(RaisesWithAnOutputDetail(retry))], builtins=False,
                        entry_points=False, discover=False) as host:
        result = await host.call("detail", {})
    assert result.output is None and result.error["output"] == "a detail of its own"
