"""The bounded breaker record under attack: what was found.

- A window shorter than the clock's resolution (``window_ms = 1e-4`` on the wall clock a shared
  store stamps with, ``1e-9`` on the monotonic one) or one whose fiftieth underflows to 0
  (``window_ms = 1e-320``): counting an outcome in its bucket raised (IndexError: the loop
  forgetting old buckets emptied the deque; ZeroDivisionError: ``now // 0.0``). In memory every call
  of a healthy tool failed with ``hook_failed`` and left its budget reservation behind, so the
  budget refused every call after a few; in a shared store the outcome was never recorded.
- A record of an earlier release (``outcomes``) holding a time near ``2**53`` (which ``is_record``
  lets through) raised IndexError as it was converted: a breaker record read from a store raised
  instead of being read.
- A reload between an exact and a bucketed threshold forgot the failures in the window (the
  breaker's state is documented as kept): 150 failures, then a threshold lowered from 200 to 50,
  and the breaker still needed 50 more.
- A record read from a store was kept as long as it was (any length ``is_record`` accepts) and
  written back whole at every outcome; an earlier release's record was converted in stored order,
  so after a clock step back the latest failures could be dropped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import PolicyPlugin
from amplifier_tools.builtins.policy.breaker import BUCKETS, CLOSED, EXACT_FAILURES, OPEN, CircuitBreaker, is_record
from amplifier_tools.spec import CircuitBreakerPolicy


def _breaker(**policy: Any) -> CircuitBreaker:
    return CircuitBreaker(CircuitBreakerPolicy(**policy))


def test_a_window_shorter_than_the_clocks_resolution_counts_without_raising() -> None:
    for window_ms in (1e-4, 1e-9, 1e-300, 1e-320):
        for policy in ({"failure_rate": 0.5, "min_calls": 3}, {"failure_threshold": 101}):
            breaker = _breaker(window_ms=window_ms, **policy)
            now = 1_700_000_000.123
            for i in range(200):
                # Successes and failures at distinct clock readings: at most one per window.
                assert breaker.record(now + i * 1e-6, i % 2 == 0, None) is None, (window_ms, policy)
            snapshot = breaker.snapshot()
            assert len(snapshot["counts"]) == 1 and is_record(snapshot), (window_ms, snapshot)


def test_a_rate_breaker_with_a_window_shorter_than_the_clocks_resolution_still_opens() -> None:
    breaker = _breaker(window_ms=1e-9, failure_rate=0.5, min_calls=3)
    now = 1_700_000_000.5
    assert breaker.record(now, True, None) is None
    assert breaker.record(now, True, None) is None
    assert breaker.record(now, True, None) == OPEN  # three at one clock reading: within any window


class Healthy:
    spec = ToolSpec(name="healthy", description="Always works.", effect="Pure",
                    policies={"circuit_breaker": {"failure_rate": 0.5, "window_ms": 1e-320},
                              "budgets": [{"per": "principal", "max_seconds": 5}]})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


async def test_a_tiny_window_neither_fails_calls_nor_leaks_budget_reservations(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    policy = PolicyPlugin()
    async with ToolHost(config={"state_dir": str(tmp_path / "state")}, plugins=[ToolsPlugin(Healthy()), policy],
                        builtins=False, entry_points=False, discover=False, working_dir=tmp_path / "work") as host:
        errors = [(await host.call("healthy", {})).error for _ in range(10)]
        assert errors == [None] * 10, errors  # was: 5 hook_failed, then budget_exceeded for good
        assert policy.held_resources()["budget_reservations"] == 0


class Down:
    spec = ToolSpec(name="down", description="Always fails.", effect="Pure",
                    policies={"circuit_breaker": {"failure_threshold": 2, "failure_rate": 0.5, "min_calls": 2,
                                                  "window_ms": 1, "cooldown_ms": 60_000}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(success=False, error={"message": "down", "code": "down"})


async def test_an_earlier_releases_record_with_a_time_near_the_largest_number_is_read_not_raised(
        tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite"}}}
    old = {"state": "open", "opened_at": 0.0, "probe": None, "tokens": 0, "outcomes": [[2**53, True]]}
    assert is_record(old)
    async with ToolHost(config=config, plugins=[ToolsPlugin(Down())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        await host.call("down", {})  # the file and its tables exist
        with sqlite3.connect(tmp_path / "state" / "policy.sqlite3") as db:
            db.execute("DELETE FROM blobs WHERE key LIKE '%breaker:down'")
            db.execute("INSERT INTO blobs VALUES (?, ?, ?)",
                       ("amplifier-tools:breaker:down", json.dumps(old), time.time() + 3600))
        codes = [(await host.call("down", {})).error["code"] for _ in range(3)]
    # The open breaker's cooldown has passed: a probe runs and fails, and the breaker opens again.
    assert codes == ["down", "circuit_open", "circuit_open"], codes  # was: hook_failed at every call


def test_a_reload_lowering_a_bucketed_threshold_keeps_the_failures_in_the_window() -> None:
    breaker = _breaker(failure_threshold=200, window_ms=60_000)
    for i in range(150):
        assert breaker.record(100.0 + i * 0.1, True, None) is None
    breaker.policy = CircuitBreakerPolicy(failure_threshold=50, window_ms=60_000)  # as a reload does
    assert breaker.record(116.0, True, None) == OPEN  # 151 failures within the window


def test_a_reload_raising_an_exact_threshold_past_the_limit_keeps_the_failures_in_the_window() -> None:
    breaker = _breaker(failure_threshold=EXACT_FAILURES, window_ms=60_000)
    for i in range(EXACT_FAILURES - 1):
        assert breaker.record(100.0 + i * 0.1, True, None) is None
    breaker.policy = CircuitBreakerPolicy(failure_threshold=EXACT_FAILURES + 10, window_ms=60_000)
    changes = [breaker.record(120.0 + i * 0.1, True, None) for i in range(11)]
    assert changes == [None] * 10 + [OPEN], changes  # 99 + 11 = 110 failures within the window


def test_a_reload_raising_an_exact_threshold_does_not_invent_a_rate() -> None:
    breaker = _breaker(failure_threshold=5, window_ms=60_000)
    for i in range(4):
        breaker.record(100.0 + i, True, None)  # 4 failures among calls whose successes were not counted
    breaker.policy = CircuitBreakerPolicy(failure_threshold=500, failure_rate=0.5, min_calls=2, window_ms=60_000)
    assert breaker.record(110.0, False, None) is None and breaker.record(111.0, False, None) is None
    assert breaker.record(112.0, True, None) is None  # 1 failure in 3 counted calls, not 5 in 7
    assert breaker.state == CLOSED


def test_a_record_read_from_a_store_is_cut_to_the_bounded_size() -> None:
    policy = CircuitBreakerPolicy(failure_threshold=3, failure_rate=0.5, min_calls=10**6, window_ms=60_000)
    huge = {"state": "closed", "opened_at": 0.0, "probe": None, "tokens": 0,
            "failures": [1e15] * 10_000, "counts": [[1e15, 0, 0]] * 10_000}
    assert is_record(huge)
    breaker = CircuitBreaker.restore(policy, huge)
    breaker.record(1000.0, False, None)
    snapshot = breaker.snapshot()
    assert len(snapshot["failures"]) <= 3 and len(snapshot["counts"]) <= 2 * BUCKETS
    assert len(json.dumps(snapshot)) < 10_000


def test_an_earlier_releases_record_is_converted_in_time_order() -> None:
    # Written by an earlier release after the clock stepped back: not in time order.
    old = {"state": "closed", "opened_at": 0.0, "probe": None, "tokens": 0,
           "outcomes": [[100.0, True], [50.0, True], [99.0, True]]}
    breaker = CircuitBreaker.restore(CircuitBreakerPolicy(failure_threshold=3, window_ms=10_000), old)
    assert breaker.record(101.0, True, None) == OPEN  # 99, 100 and 101: three within 10 s
