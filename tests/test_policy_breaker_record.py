"""A circuit breaker's record stays bounded however many calls its window holds, and decides as
before: exact for a threshold up to ``EXACT_FAILURES``, per bucket of the window for a rate and
a larger threshold. Found by test: the record held every outcome of its window, and a shared store
rewrote it whole at each one (16.6 ms a call on SQLite after 3,000 calls of a tool with a
``failure_rate``, growing linearly)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.breaker import BUCKETS, CLOSED, OPEN, CircuitBreaker, is_record
from amplifier_tools.spec import CircuitBreakerPolicy


def _breaker(**policy: Any) -> CircuitBreaker:
    return CircuitBreaker(CircuitBreakerPolicy(**policy))


def _size(breaker: CircuitBreaker) -> int:
    return len(json.dumps(breaker.snapshot()))


def test_a_rate_breakers_record_is_bounded_by_its_buckets() -> None:
    breaker = _breaker(failure_threshold=50, failure_rate=0.9, window_ms=60_000)
    for i in range(20_000):  # 20,000 calls in 30 s, one in 1,000 failing
        assert breaker.record(1000.0 + i * 0.0015, i % 1000 == 999, None) is None
    snapshot = breaker.snapshot()
    assert len(snapshot["counts"]) <= BUCKETS and len(snapshot["failures"]) == 20
    assert sum(calls for _, calls, _ in snapshot["counts"]) == 20_000
    assert _size(breaker) < 4000


def test_a_threshold_breaker_keeps_no_successes_and_at_most_threshold_failures() -> None:
    breaker = _breaker(failure_threshold=3, window_ms=1000)
    for i in range(10_000):  # failures spread out so that never 3 fall within one second
        breaker.record(i * 0.4, i % 3 == 0, None)
    assert breaker.state == CLOSED
    snapshot = breaker.snapshot()
    assert snapshot["counts"] == [] and len(snapshot["failures"]) <= 3


def test_the_exact_threshold_counts_failures_by_their_time() -> None:
    breaker = _breaker(failure_threshold=3, window_ms=10_000)
    assert breaker.record(0.0, True, None) is None
    assert breaker.record(5.0, True, None) is None
    assert breaker.record(10.0001, True, None) is None  # the first is 10.0001 s old: out of the window
    assert breaker.record(14.9, True, None) == OPEN      # 5.0, 10.0001, 14.9: three within 10 s


def test_the_rate_counts_min_calls_and_forgets_whole_buckets_older_than_the_window() -> None:
    breaker = _breaker(failure_threshold=1000, failure_rate=0.5, min_calls=4, window_ms=10_000)
    for at in (0.0, 0.1, 0.2):
        assert breaker.record(at, False, None) is None
    assert breaker.record(0.3, True, None) is None   # 1 of 4
    assert breaker.record(0.4, True, None) is None   # 2 of 5
    assert breaker.record(0.5, True, None) == OPEN   # 3 of 6: 50 %
    later = _breaker(failure_threshold=1000, failure_rate=0.5, min_calls=4, window_ms=10_000)
    for at in (0.0, 0.1, 0.2, 0.3):
        later.record(at, False, None)
    # 10.3 s later the successes are older than the window; two failures are not min_calls.
    assert later.record(10.5, True, None) is None and later.record(10.6, True, None) is None
    assert later.record(10.7, True, None) is None
    assert later.record(10.8, True, None) == OPEN    # 4 of 4, the successes forgotten


def test_a_threshold_above_the_exact_limit_is_counted_in_buckets() -> None:
    breaker = _breaker(failure_threshold=500, window_ms=60_000)
    changes = [breaker.record(100.0 + i * 0.01, True, None) for i in range(500)]
    assert changes[:-1] == [None] * 499 and changes[-1] == OPEN
    snapshot = breaker.snapshot()
    assert snapshot["failures"] == [] and sum(failed for _, _, failed in snapshot["counts"]) == 500


def test_the_bucketed_window_never_counts_an_outcome_older_than_the_window() -> None:
    window_s = 10.0
    breaker = _breaker(failure_threshold=200, window_ms=window_s * 1000)
    for i in range(199):
        breaker.record(i * 0.01, True, None)    # 199 failures in the first 2 s
    # Every one of them is older than the window at 12.01 s: one more failure must not trip.
    assert breaker.record(12.01, True, None) is None
    assert all(start > 12.01 - window_s for start, _, _ in breaker.snapshot()["counts"])


def test_a_clock_stepping_back_counts_into_the_latest_bucket() -> None:
    breaker = _breaker(failure_rate=0.5, min_calls=2, failure_threshold=50, window_ms=10_000)
    breaker.record(100.0, False, None)
    assert breaker.record(90.0, True, None) == OPEN  # 1 of 2, though stamped earlier
    assert len(breaker.snapshot()["counts"]) == 1


def test_a_record_of_an_earlier_release_is_read_and_converted() -> None:
    old = {"state": "closed", "opened_at": 0.0, "probe": None, "tokens": 2,
           "outcomes": [[10.0, True], [11.0, False], [12.0, 1]]}
    assert is_record(old)
    policy = CircuitBreakerPolicy(failure_threshold=3, window_ms=10_000)
    breaker = CircuitBreaker.restore(policy, old)
    assert breaker.snapshot()["failures"] == [10.0, 12.0] and "outcomes" not in breaker.snapshot()
    assert breaker.record(13.0, True, None) == OPEN  # the two old failures counted
    assert is_record(breaker.snapshot())


@pytest.mark.parametrize("bad", [
    {"failures": None}, {"counts": None}, {"failures": [10**400]}, {"failures": ["1"]},
    {"counts": [[0, 1]]}, {"counts": [[0, 1, 2, 3]]}, {"counts": [[0, 1.5, 0]]}, {"counts": [[0, 2**60, 0]]},
    {"counts": [[float("nan"), 1, 0]]}, {"counts": [(0, 1, 0)]},
])
def test_a_malformed_bounded_record_is_foreign(bad: dict[str, Any]) -> None:
    good = {"state": "closed", "opened_at": 0.0, "probe": None, "tokens": 0, "failures": [1.0],
            "counts": [[0.0, 3, 1]]}
    assert is_record(good)
    assert not is_record({**good, **bad})


class Flaky:
    spec = ToolSpec(name="flaky", description="Fails one call in ten.", effect="Pure",
                    policies={"circuit_breaker": {"failure_threshold": 1000, "failure_rate": 0.5,
                                                  "min_calls": 10, "window_ms": 600_000}})
    name, description = spec.name, spec.description

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.runs += 1
        if self.runs % 10 == 0 or self.runs > 700:
            return ToolResult(success=False, error={"message": "backend down", "code": "backend_down"})
        return ToolResult(output="ok")


async def test_a_shared_stores_breaker_record_stays_small_and_still_opens_by_rate(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite"}}}
    tool = Flaky()
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        codes = [(await host.call("flaky", {})).error for _ in range(600)]
        with sqlite3.connect(tmp_path / "state" / "policy.sqlite3") as db:
            (value,) = db.execute("SELECT value FROM blobs WHERE key LIKE '%breaker:flaky'").fetchone()
        record = json.loads(value)
        assert is_record(record) and record["state"] == CLOSED
        assert len(value) < 2000, len(value)  # 600 outcomes held every one: ≈ 14 KB
        assert sum(calls for _, calls, _ in record["counts"]) == 600
        assert sum(error is not None for error in codes) == 60
        # Runs 1-700: 630 successes, 70 failures; from run 701 every run fails. Run 1,260 brings the
        # failures to 630 of 1,260, 50 %: it opens the breaker, and the next call is refused.
        errors = [(await host.call("flaky", {})).error for _ in range(700)]
    first_open = next(i for i, error in enumerate(errors) if error and error["code"] == "circuit_open")
    assert tool.runs == 1260 and first_open == 660
