"""A half-open breaker's probe, seen by the calls refused while it runs, on every store.

Found by review: a call refused while the probe ran was told ``retry_after = 0.0`` (the cooldown
was over), so a caller that honours the hint retried at once, and again, for as long as the probe
ran. And on a shared store, a probe whose host never reported its outcome (killed, or its reply
lost) kept the breaker half-open for as long as calls kept coming: each refusal wrote the record
back, so it never expired.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import shared
from amplifier_tools.builtins.policy.breaker import CircuitBreaker, is_record
from amplifier_tools.spec import CircuitBreakerPolicy

COOLDOWN_MS = 400



class Probed:
    """Fails while ``fail`` is set; otherwise waits for ``gate`` (so a probe stays in flight)."""

    name, description = "probed", "probed"

    def __init__(self, timeout_ms: float = 10_000) -> None:
        self.spec = ToolSpec(name="probed", description="probed", effect="Pure",
                             policies={"timeout_ms": timeout_ms,
                                       "circuit_breaker": {"failure_threshold": 1, "cooldown_ms": COOLDOWN_MS}})
        self.gate, self.entered, self.fail = asyncio.Event(), 0, True

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.entered += 1
        if self.fail:
            raise ExecutionError("backend down", code="backend_down")
        await self.gate.wait()
        return ToolResult(output="ok")


async def started(tool: Probed, store: str, tmp_path: Path, store_timeout_ms: float = 2000) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    policy = {"store": store, "store_timeout_ms": store_timeout_ms}
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": policy}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")
    await host.start()
    return host


async def open_then_probe(host: ToolHost, tool: Probed) -> asyncio.Future[Any]:
    """Open the breaker, wait out the cooldown, and start a probe that stays in flight."""
    assert (await host.call("probed", {})).error["code"] == "backend_down"
    assert (await host.call("probed", {})).error["code"] == "circuit_open"
    await asyncio.sleep(COOLDOWN_MS / 1000 + 0.05)
    tool.fail, entered = False, tool.entered
    probe = asyncio.ensure_future(host.call("probed", {}))
    while tool.entered == entered:
        await asyncio.sleep(0.005)
    return probe


async def test_a_call_refused_during_the_probe_is_told_to_wait_not_to_retry_at_once(store: str,
                                                                                   tmp_path: Path) -> None:
    tool = Probed()
    host = await started(tool, store, tmp_path)
    try:
        probe = await open_then_probe(host, tool)
        refused = await host.call("probed", {})
        assert refused.error["code"] == "circuit_open"
        # Not 0.0: the probe's outcome is not in yet. The cooldown at most (the tool's bound is longer).
        assert refused.error["retry_after"] == COOLDOWN_MS / 1000
        tool.gate.set()
        assert (await probe).success  # the probe closed the breaker
        assert (await host.call("probed", {})).success
    finally:
        await host.close()


async def test_the_hint_is_the_probes_bound_when_shorter_than_the_cooldown(store: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe bound to end sooner than a cooldown: a refused call is told to come back when the
    probe is over: the waits it may still have had ahead of it and its timeout, plus, on a shared
    store, the grace its outcome has to arrive (``LEASE_GRACE``, here 0, and ``store_timeout_ms``)."""
    monkeypatch.setattr(shared, "LEASE_GRACE", 0.0)
    tool = Probed(timeout_ms=100)
    host = await started(tool, store, tmp_path, store_timeout_ms=100)
    try:
        probe = await open_then_probe(host, tool)
        refused = await host.call("probed", {})
        bound = 0.1 + 0.1 + (0.1 if store != "memory" else 0.0)
        assert refused.error["code"] == "circuit_open"
        assert 0 < refused.error["retry_after"] <= bound < COOLDOWN_MS / 1000
        assert (await probe).error["code"] == "timeout"  # the probe's own failure opens it again
    finally:
        await host.close()


@pytest.mark.parametrize("store", ["sqlite", "redis"], indirect=True)
async def test_a_probe_whose_outcome_never_comes_is_replaced_after_its_bound(store: str, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A probe whose host never reports back (killed; simulated by dropping its outcome) holds the
    breaker half-open only until its bound has passed, also while refused calls keep coming."""
    monkeypatch.setattr(shared, "LEASE_GRACE", 0.0)

    async def lost(*args: Any) -> None:
        return None

    tool = Probed(timeout_ms=100)
    host = await started(tool, store, tmp_path, store_timeout_ms=100)
    try:
        probe = await open_then_probe(host, tool)
        monkeypatch.setattr(shared.SharedPolicy, "_record", lost)
        monkeypatch.setattr(shared.SharedPolicy, "_abandon", lost)
        assert (await probe).error["code"] == "timeout"  # its outcome is lost
        monkeypatch.undo()
        monkeypatch.setattr(shared, "LEASE_GRACE", 0.0)
        tool.gate.set()  # the next probe answers at once
        codes = []
        for _ in range(80):  # refused calls keep coming, each writing the record back
            result = await host.call("probed", {})
            codes.append("ok" if result.success else result.error["code"])
            if result.success:
                break
            await asyncio.sleep(0.025)
        assert codes[-1] == "ok" and set(codes[:-1]) <= {"circuit_open"}  # a new probe ran and closed it
        # Said where an operator looks (found by review: the replacement was neither logged nor in the trail).
        assert [r for r in caplog.records if "taken as lost" in r.getMessage() and "'probed'" in r.getMessage()]
        trail = result.metadata["trail"]
        assert [d for d in trail if d["details"].get("lost_probe") is True and d["action"] == "circuit"]
    finally:
        tool.gate.set()
        await host.close()


def test_a_probe_bound_past_what_a_record_keeps_leaves_the_record_readable() -> None:
    """A huge timeout (the spec accepts any finite one) gives a probe no bound, rather than a record
    that the next reader takes for foreign (and so for a closed breaker)."""
    policy = CircuitBreakerPolicy(failure_threshold=1, cooldown_ms=1)
    breaker = CircuitBreaker(policy)
    breaker.record(0.0, True, None)
    assert breaker.admit(1.0, 1e300) == (True, "half_open", 1)
    assert breaker.probe_until is None and is_record(breaker.snapshot())
    assert breaker.retry_after(1.5) == 0.001  # refused calls are told one cooldown
    assert not is_record({**breaker.snapshot(), "probe_until": "soon"})
