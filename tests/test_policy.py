"""The policy plugin under load, with an injectable clock (no sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, PluginLoadError, ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import PolicyPlugin


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class Tool:
    def __init__(self, name: str, *, effect: str = "Pure", fail: bool = False, delay: float = 0.0,
                 **spec: Any) -> None:
        self.spec = ToolSpec(name=name, description=name, effect=effect, **spec)
        self.name, self.description = name, name
        self.fail, self.delay = fail, delay
        self.runs = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.runs += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail:
                raise ExecutionError("backend down", code="backend_down", retryable=True)
            return ToolResult(output={"run": self.runs, "args": input})
        finally:
            self.in_flight -= 1


async def host_with(*tools: Tool, clock: FakeClock | None = None, config: dict[str, Any] | None = None) -> ToolHost:
    clock = clock or FakeClock()
    host = ToolHost(plugins=[ToolsPlugin(*tools), PolicyPlugin(clock=clock, sleep=clock.sleep)], builtins=False,
                    entry_points=False, discover=False, config=config)
    await host.start()
    return host


async def test_rate_limit_allows_exactly_n_per_window_under_10000_concurrent_calls() -> None:
    clock = FakeClock()
    tool = Tool("limited", policies={"rate_limit": {"limit": 37, "interval_ms": 1000}})
    host = await host_with(tool, clock=clock)
    try:
        for window in range(3):
            results = await asyncio.gather(*(host.call("limited", {}) for _ in range(10_000 // 3)))
            allowed = [r for r in results if r.success]
            denied = [r for r in results if not r.success]
            assert len(allowed) == 37, window
            assert {r.error["code"] for r in denied} == {"rate_limited"}
            assert all(0 < r.error["retry_after"] <= 1 for r in denied)
            clock.now += 1.0
    finally:
        await host.close()
    assert tool.runs == 3 * 37


async def test_rate_limit_queue_waits_for_the_next_window() -> None:
    clock = FakeClock()
    tool = Tool("queued", policies={"rate_limit": {"limit": 2, "interval_ms": 1000, "queue": True}})
    host = await host_with(tool, clock=clock)
    try:
        results = [await host.call("queued", {}) for _ in range(5)]
    finally:
        await host.close()
    assert all(r.success for r in results) and clock.now >= 1002.0
    assert any(d["action"] == "waited" for r in results for d in r.metadata["trail"])


async def test_concurrency_cap_is_never_exceeded() -> None:
    tool = Tool("capped", delay=0.001, policies={"concurrency": {"limit": 8}})
    host = await host_with(tool)
    try:
        results = await asyncio.gather(*(host.call("capped", {}) for _ in range(2000)))
    finally:
        await host.close()
    assert all(r.success for r in results)
    assert tool.max_in_flight == 8


async def test_concurrency_without_queue_rejects_excess() -> None:
    tool = Tool("strict", delay=0.01, policies={"concurrency": {"limit": 2, "queue": False}})
    host = await host_with(tool)
    try:
        results = await asyncio.gather(*(host.call("strict", {}) for _ in range(6)))
    finally:
        await host.close()
    assert sum(r.success for r in results) == 2
    assert {r.error["code"] for r in results if not r.success} == {"concurrency_limited"}


async def test_circuit_breaker_opens_probes_and_closes_or_reopens() -> None:
    clock = FakeClock()
    tool = Tool("flaky", fail=True, policies={"circuit_breaker": {"failure_threshold": 3, "cooldown_ms": 5000}})
    events: list[str] = []
    host = await host_with(tool, clock=clock)
    host.events.register("circuit:open", lambda e, d: events.append(e))
    host.events.register("circuit:half_open", lambda e, d: events.append(e))
    host.events.register("circuit:closed", lambda e, d: events.append(e))
    try:
        codes = [(await host.call("flaky", {})).error["code"] for _ in range(3)]
        await asyncio.sleep(0)  # state-change events are delivered asynchronously
        assert codes == ["backend_down"] * 3 and events == ["circuit:open"]
        rejected = await host.call("flaky", {})
        assert rejected.error["code"] == "circuit_open" and tool.runs == 3
        clock.now += 5.0
        probe = await host.call("flaky", {})  # half-open probe fails -> open again
        assert probe.error["code"] == "backend_down" and tool.runs == 4
        assert (await host.call("flaky", {})).error["code"] == "circuit_open"
        clock.now += 5.0
        tool.fail = False
        assert (await host.call("flaky", {})).success  # probe succeeds -> closed
        assert (await host.call("flaky", {})).success
        await asyncio.sleep(0)
    finally:
        await host.close()
    assert events == ["circuit:open", "circuit:half_open", "circuit:open", "circuit:half_open", "circuit:closed"]


async def test_non_idempotent_tool_with_retryable_error_runs_exactly_once() -> None:
    tool = Tool("send", effect="NonIdempotentWrite", fail=True)
    host = await host_with(tool)
    try:
        result = await host.call("send", {}, context=ToolContext(idempotency_key="k1"))
    finally:
        await host.close()
    assert result.error["retryable"] is True and tool.runs == 1


async def test_pure_tool_is_retried_and_reports_attempts() -> None:
    tool = Tool("lookup", fail=True, policies={"retry": {"max_attempts": 3, "initial_backoff_ms": 1,
                                                          "max_backoff_ms": 2}})
    host = await host_with(tool)
    try:
        failed = await host.call("lookup", {})
        assert tool.runs == 3 and failed.error["code"] == "backend_down"
        assert [d["action"] for d in failed.metadata["trail"]] == ["retry", "retry"]
        tool.fail, tool.runs = False, 0
        ok = await host.call("lookup", {})
        assert ok.success and tool.runs == 1
    finally:
        await host.close()


def test_retry_config_on_non_idempotent_tool_is_rejected_at_start() -> None:
    tool = Tool("send", effect="NonIdempotentWrite")
    with pytest.raises(Exception, match=r"tools\.send\.policies\.retry.*never be retried"):
        asyncio.run(host_with(tool, config={"tools": {"send": {"policies": {"retry": {"max_attempts": 3}}}}}))
    declared = Tool("mail", effect="ExternalSideEffects", policies={"retry": {"max_attempts": 2}})
    with pytest.raises(PluginLoadError, match="never be retried"):
        asyncio.run(host_with(declared))


async def test_idempotency_replay_runs_the_tool_once_under_100_duplicates() -> None:
    tool = Tool("put", effect="IdempotentWrite", idempotency_key="required", delay=0.01)
    host = await host_with(tool)
    try:
        ctx = ToolContext(idempotency_key="order-42")
        results = await asyncio.gather(*(host.call("put", {"v": 1}, context=ctx) for _ in range(100)))
        conflict = await host.call("put", {"v": 2}, context=ctx)
        missing = await host.call("put", {"v": 1})
    finally:
        await host.close()
    assert tool.runs == 1
    assert all(r.success and r.output == results[0].output for r in results)
    assert sum(bool(r.metadata.get("replayed")) for r in results) == 99
    assert conflict.error["type"] == "ContractError" and conflict.error["code"] == "idempotency_conflict"
    assert missing.error["type"] == "ContractError" and missing.error["code"] == "idempotency_key_required"


async def test_scope_and_budget_denials_name_what_is_missing() -> None:
    clock = FakeClock()
    tool = Tool("admin", security={"required_scopes": ["admin:write"]},
                policies={"budgets": [{"per": "principal", "max_calls": 2, "window_ms": 60000}]})
    host = await host_with(tool, clock=clock)
    try:
        nope = await host.call("admin", {}, context=ToolContext(principal="bob"))
        assert nope.error["type"] == "AuthError" and "'admin:write'" in nope.error["message"]
        ctx = ToolContext(principal="alice", scopes=frozenset({"admin:write"}))
        assert (await host.call("admin", {}, context=ctx)).success
        assert (await host.call("admin", {}, context=ctx)).success
        over = await host.call("admin", {}, context=ctx)
        assert over.error["code"] == "budget_exceeded" and over.error["budget"] == "principal:calls"
        assert "'alice'" in over.error["message"]
        clock.now += 60.0
        assert (await host.call("admin", {}, context=ctx)).success
    finally:
        await host.close()


async def test_rules_first_match_decides_and_paths_are_normalized(tmp_path: Any) -> None:
    rules = [
        {"name": "no-etc", "action": "deny", "tools": ["local::fs.*"], "arguments": {"/path": "/etc/*"},
         "reason": "system files"},
        {"name": "prod-readonly", "action": "deny", "environments": ["prod"], "tools": ["local::fs.write_file"]},
        {"name": "everyone-reads", "action": "allow", "tools": ["local::fs.read_file"]},
    ]
    (tmp_path / "a.txt").write_text("hello")
    async with ToolHost(config={"plugins": {"policy": {"rules": rules},
                                            "filesystem": {"allowed_read_paths": ["/"]}}},
                        builtins=["filesystem", "policy"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        sneaky = await host.call("fs_read_file", {"path": f"{tmp_path}/{'../' * 12}etc/hostname"})
        assert sneaky.error["code"] == "rule_denied" and sneaky.error["rule"] == "no-etc"
        prod = await host.call("fs_write_file", {"path": "b.txt", "content": "x"},
                               context=ToolContext(environment="prod"))
        assert prod.error["rule"] == "prod-readonly"
        ok = await host.call("fs_read_file", {"path": "a.txt"})
        assert ok.success and ok.metadata["trail"][0]["details"]["rule"] == "everyone-reads"


@pytest.mark.parametrize(("section", "key"), [
    ({"rulez": []}, "plugins.policy.rulez"),
    ({"rules": [{"action": "maybe"}]}, r"plugins.policy.rules\[0\].action"),
    ({"rules": [{"action": "deny", "tools": "x"}]}, r"plugins.policy.rules\[0\].tools"),
    ({"default_action": "perhaps"}, "plugins.policy.default_action"),
])
def test_invalid_policy_config_fails_start_naming_the_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(PluginLoadError, match=key):
        asyncio.run(ToolHost(config={"plugins": {"policy": section}}, builtins=["policy"], entry_points=False,
                             discover=False).start())


def test_negative_limits_are_rejected_naming_the_field() -> None:
    with pytest.raises(Exception, match="limit must be positive"):
        Tool("x", policies={"rate_limit": {"limit": -1}})


async def test_circuit_breaker_opens_on_failure_rate() -> None:
    clock = FakeClock()
    tool = Tool("rated", policies={"circuit_breaker": {"failure_threshold": 100, "failure_rate": 0.5,
                                                       "min_calls": 4, "window_ms": 10000}})
    host = await host_with(tool, clock=clock)
    try:
        assert (await host.call("rated", {})).success
        assert (await host.call("rated", {})).success
        tool.fail = True
        first = await host.call("rated", {})  # 1 of 3: below min_calls
        second = await host.call("rated", {})  # 2 of 4 = 50 %: opens
        blocked = await host.call("rated", {})
    finally:
        await host.close()
    assert first.error["code"] == second.error["code"] == "backend_down"
    assert blocked.error["code"] == "circuit_open" and tool.runs == 4
