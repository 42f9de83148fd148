"""The policy plugin under load, with an injectable clock (no sleeps)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from helpers import FakeClock, ToolsPlugin

from amplifier_tools import ExecutionError, PluginLoadError, ToolCall, ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import PolicyPlugin


class Tool:
    """A test tool. ``gate``: each run waits for this event (holds calls in flight without sleeping);
    ``clock`` + ``takes``: each run advances the fake clock by ``takes`` seconds (execution time)."""

    def __init__(self, name: str, *, effect: str = "Pure", fail: bool = False, delay: float = 0.0,
                 gate: asyncio.Event | None = None, clock: FakeClock | None = None, takes: float = 0.0,
                 **spec: Any) -> None:
        self.spec = ToolSpec(name=name, description=name, effect=effect, **spec)
        self.name, self.description = name, name
        self.fail, self.delay = fail, delay
        self.gate, self.clock, self.takes = gate, clock, takes
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
            if self.gate is not None:
                await self.gate.wait()
            if self.clock is not None:
                self.clock.now += self.takes
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


@pytest.mark.slow
async def test_rate_limit_allows_exactly_n_per_window_under_10000_concurrent_calls() -> None:
    clock = FakeClock()
    tool = Tool("limited", policies={"rate_limit": {"limit": 37, "interval_ms": 1000}})
    host = await host_with(tool, clock=clock)
    try:
        for window in range(3):  # each window: 10,000 calls in flight at once
            results = await asyncio.gather(*(host.call("limited", {}) for _ in range(10_000)))
            assert len(results) == 10_000
            allowed = [r for r in results if r.success]
            denied = [r for r in results if not r.success]
            assert len(allowed) == 37, window
            assert len(denied) == 10_000 - 37
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
    gate = asyncio.Event()  # holds admitted calls in flight until released: no timing race
    tool = Tool("strict", gate=gate, policies={"concurrency": {"limit": 2, "queue": False}})
    host = await host_with(tool)
    try:
        tasks = [asyncio.create_task(host.call("strict", {})) for _ in range(6)]
        for _ in range(1000):  # bounded: the four rejections need only a few loop turns
            if sum(t.done() for t in tasks) == 4 and tool.in_flight == 2:
                break
            await asyncio.sleep(0)
        assert tool.in_flight == 2 and sum(t.done() for t in tasks) == 4
        rejected = [t.result() for t in tasks if t.done()]
        assert {r.error["code"] for r in rejected} == {"concurrency_limited"}
        gate.set()
        results = await asyncio.gather(*tasks)
        assert (await host.call("strict", {})).success  # slots were released
    finally:
        gate.set()
        await host.close()
    assert sum(r.success for r in results) == 2 and tool.runs == 3 and tool.max_in_flight == 2
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


async def test_rules_matching_deny_denies_and_paths_are_normalized(tmp_path: Any) -> None:
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


# -- rules: any matching deny denies, whatever the order -------------------------------------------


async def test_an_earlier_broad_allow_does_not_cancel_a_later_deny(tmp_path: Any) -> None:
    rules = [
        {"name": "everyone-reads", "action": "allow", "tools": ["local::fs.*"]},
        {"name": "no-etc", "action": "deny", "tools": ["local::fs.read_file"], "arguments": {"/path": "/etc/*"}},
    ]
    (tmp_path / "a.txt").write_text("hello")
    async with ToolHost(config={"plugins": {"policy": {"rules": rules},
                                            "filesystem": {"allowed_read_paths": ["/"]}}},
                        builtins=["filesystem", "policy"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        etc = await host.call("fs_read_file", {"path": "/etc/hostname"})
        assert etc.error["type"] == "PolicyError" and etc.error["code"] == "rule_denied"
        assert etc.error["rule"] == "no-etc" and etc.output is None
        ok = await host.call("fs_read_file", {"path": "a.txt"})
        assert ok.success and ok.metadata["trail"][0]["details"]["rule"] == "everyone-reads"


async def test_first_matching_deny_is_the_one_reported() -> None:
    rules = [{"name": "allow-all", "action": "allow"},
             {"name": "first-deny", "action": "deny", "tools": ["t*"]},
             {"name": "second-deny", "action": "deny", "tools": ["tool"]}]
    host = await host_with(Tool("tool"), config={"plugins": {"policy": {"rules": rules}}})
    try:
        result = await host.call("tool", {})
    finally:
        await host.close()
    assert result.error["rule"] == "first-deny"


async def test_rules_match_by_principal_and_role() -> None:
    rules = [
        {"name": "admins", "action": "allow", "roles": ["admin"]},
        {"name": "bots", "action": "allow", "principals": ["bot-*"]},
        {"name": "no-mallory", "action": "deny", "principals": ["mallory"]},
        {"name": "no-interns-deploy", "action": "deny", "roles": ["intern"], "tools": ["deploy"]},
    ]
    tool, other = Tool("deploy"), Tool("status")
    host = await host_with(tool, other, config={"plugins": {"policy": {"rules": rules, "default_action": "deny"}}})
    try:
        async def rule(name: str, **ctx: Any) -> str | None:
            result = await host.call(name, {}, context=ToolContext(**ctx))
            return None if result.success else result.error["rule"]

        assert await rule("deploy", principal="alice", role="admin") is None
        assert await rule("deploy", principal="bot-7") is None
        assert await rule("deploy", principal="mallory", role="admin") == "no-mallory"  # allow does not cancel
        assert await rule("deploy", principal="bot-intern", role="intern") == "no-interns-deploy"
        assert await rule("status", principal="bot-intern", role="intern") is None
        assert await rule("deploy", principal="carol", role="dev") == "default"  # no allow rule matches
        assert await rule("deploy", principal="carol") == "default"  # no role: a role rule cannot match
    finally:
        await host.close()


async def test_an_unusable_path_never_earns_an_allow(tmp_path: Any) -> None:
    rules = [{"name": "reads-under-tmp", "action": "allow", "tools": ["local::fs.read_file"],
              "arguments": {"/path": f"{tmp_path}/*"}}]
    async with ToolHost(config={"plugins": {"policy": {"rules": rules, "default_action": "deny"}}},
                        builtins=["filesystem", "policy"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        (tmp_path / "a.txt").write_text("hello")
        assert (await host.call("fs_read_file", {"path": "a.txt"})).success
        bad = await host.call("fs_read_file", {"path": "a\x00.txt"})
        assert bad.error["code"] == "rule_denied" and bad.error["rule"] == "default"


# -- budgets ------------------------------------------------------------------------------------------


async def test_max_seconds_budget_counts_execution_time() -> None:
    clock = FakeClock()
    tool = Tool("slow", clock=clock, takes=3.0,
                policies={"budgets": [{"per": "principal", "max_seconds": 5, "window_ms": 60000}]})
    host = await host_with(tool, clock=clock)
    ctx = ToolContext(principal="alice")
    try:
        assert (await host.call("slow", {}, context=ctx)).success  # 3 s used
        assert (await host.call("slow", {}, context=ctx)).success  # 3 < 5 when it starts; 6 s used
        over = await host.call("slow", {}, context=ctx)
        assert over.error["type"] == "PolicyError" and over.error["code"] == "budget_exceeded"
        assert over.error["budget"] == "principal:seconds" and "'alice'" in over.error["message"]
        assert tool.runs == 2
        assert (await host.call("slow", {}, context=ToolContext(principal="bob"))).success  # bob has his own
        clock.now = (clock.now // 60 + 1) * 60  # next window
        assert (await host.call("slow", {}, context=ctx)).success
    finally:
        await host.close()
    assert tool.runs == 4


async def test_budgets_per_role_and_per_environment_are_shared_by_their_members() -> None:
    clock = FakeClock()
    tool = Tool("b", policies={"budgets": [{"per": "role", "max_calls": 2, "window_ms": 60000},
                                           {"per": "environment", "max_calls": 3, "window_ms": 60000}]})
    host = await host_with(tool, clock=clock)
    try:
        async def code(**ctx: Any) -> str | None:
            result = await host.call("b", {}, context=ToolContext(**ctx))
            return None if result.success else f"{result.error['code']}:{result.error['budget']}"

        # role "dev" has 2 calls, shared by alice and bob
        assert await code(principal="alice", role="dev", environment="staging") is None
        assert await code(principal="bob", role="dev", environment="staging") is None
        assert await code(principal="bob", role="dev", environment="prod") == "budget_exceeded:role:calls"
        # role "ops" is separate, but environment "staging" (3 calls) is shared across roles
        assert await code(principal="carol", role="ops", environment="staging") is None
        assert await code(principal="carol", role="ops", environment="staging") == \
            "budget_exceeded:environment:calls"
        assert await code(principal="carol", role="ops", environment="prod") is None
        clock.now += 60.0
        assert await code(principal="alice", role="dev", environment="staging") is None
    finally:
        await host.close()


# -- rate limits per principal ------------------------------------------------------------------------


async def test_rate_limit_per_principal_limits_each_principal_separately() -> None:
    clock = FakeClock()
    tool = Tool("pp", policies={"rate_limit": {"limit": 3, "interval_ms": 1000, "per": "principal"}})
    host = await host_with(tool, clock=clock)
    alice, bob = ToolContext(principal="alice"), ToolContext(principal="bob")
    try:
        flood = await asyncio.gather(*(host.call("pp", {}, context=alice) for _ in range(50)))
        assert sum(r.success for r in flood) == 3
        assert {r.error["code"] for r in flood if not r.success} == {"rate_limited"}
        # alice is limited; bob, under his own limit, is not
        assert all(r.success for r in [await host.call("pp", {}, context=bob) for _ in range(3)])
        assert (await host.call("pp", {}, context=bob)).error["code"] == "rate_limited"
        clock.now += 1.0
        assert (await host.call("pp", {}, context=alice)).success
    finally:
        await host.close()
    assert tool.runs == 3 + 3 + 1


# -- retries: exponential backoff with jitter ---------------------------------------------------------


async def test_retry_backoff_has_jitter_within_bounds(delays: list[float]) -> None:
    random.seed(1234)  # tenacity draws its jitter from the random module: deterministic here
    tool = Tool("jittery", fail=True, policies={"retry": {"max_attempts": 4, "initial_backoff_ms": 100,
                                                           "max_backoff_ms": 60000, "multiplier": 2}})
    host = await host_with(tool)
    try:
        per_call = []
        for _ in range(5):
            delays.clear()
            result = await host.call("jittery", {})
            assert result.error["code"] == "backend_down"
            per_call.append(list(delays))
    finally:
        await host.close()
    assert tool.runs == 5 * 4
    for call_delays in per_call:
        assert len(call_delays) == 3  # a delay before each retry
        for n, delay in enumerate(call_delays):  # equal jitter: between half and all of 0.1 * 2**n
            assert 0.05 * 2 ** n <= delay <= 0.1 * 2 ** n, (n, delay)
    for n in range(3):  # the same retry of different calls waits different times
        assert len({round(d[n], 9) for d in per_call}) == 5, [d[n] for d in per_call]


async def test_retry_backoff_keeps_its_jitter_at_the_cap(delays: list[float]) -> None:
    random.seed(99)
    tool = Tool("capped_backoff", fail=True, policies={"retry": {"max_attempts": 6, "initial_backoff_ms": 100,
                                                                  "max_backoff_ms": 200, "multiplier": 2}})
    host = await host_with(tool)
    try:
        await host.call("capped_backoff", {})
    finally:
        await host.close()
    at_cap = delays[2:]  # 0.1 * 2**2 = 0.4 > 0.2: every later delay is at the cap
    assert len(at_cap) == 3 and all(0.1 <= d <= 0.2 for d in at_cap)
    assert len(set(at_cap)) > 1, at_cap


# -- decisions reach the audit record ----------------------------------------------------------------


async def test_policy_decisions_reach_the_audit_record(tmp_path: Any) -> None:
    rules = [{"name": "bots-ok", "action": "allow", "principals": ["bot"]},
             {"name": "no-mallory", "action": "deny", "principals": ["mallory"], "reason": "banned"}]
    config = {"plugins": {"policy": {"rules": rules}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Tool("t"))], builtins=["policy", "audit"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        log = host.state_dir / "audit.jsonl"  # the default: outside the working directory
        allowed = await host.call("t", {}, context=ToolContext(principal="bot"))
        denied = await host.call("t", {}, context=ToolContext(principal="mallory"))
    assert allowed.success and denied.error["rule"] == "no-mallory"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    calls = {row["principal"]: row for row in rows if row["kind"] == "call"}
    allow_trail = calls["bot"]["trail"]
    assert [(d["plugin"], d["action"]) for d in allow_trail] == [("policy", "allow")]
    assert allow_trail[0]["details"]["rule"] == "bots-ok"
    deny_trail = calls["mallory"]["trail"]
    assert calls["mallory"]["status"] == "error" and calls["mallory"]["error"]["code"] == "rule_denied"
    assert [(d["plugin"], d["hook"], d["action"], d["code"], d["details"]) for d in deny_trail] == [
        ("policy", "tool_pre", "deny", "rule_denied", {"rule": "no-mallory"})]


# -- config errors in per-tool policy overrides ------------------------------------------------------


def test_per_tool_policy_override_errors_name_the_key_not_the_mounting_plugin() -> None:
    with pytest.raises(Exception) as info:
        asyncio.run(host_with(Tool("t"), config={"tools": {"t": {"policies": {"rate_limit": {"limit": -1}}}}}))
    message = str(info.value)
    assert "tools.t.policies.rate_limit.limit" in message
    assert "plugin 'tools'" not in message


async def test_a_rule_without_a_reason_is_named_once(tmp_path: Any, echo: Any) -> None:
    config = {"plugins": {"policy": {"rules": [{"name": "no-echo", "action": "deny", "tools": ["echo"]}]}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(echo)], builtins=["policy"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        result = await host.call("echo", {"path": "a"})
    assert result.error["code"] == "rule_denied"
    assert result.error["message"] == "denied by plugin 'policy': denied by rule 'no-echo'"


# -- what tool_pre keeps of a spec ----------------------------------------------------------------


def test_a_tool_given_another_spec_is_decided_by_the_new_one() -> None:
    """``tool_pre`` works out what it needs of a tool's spec once per tool, not per call; a spec of
    the same name that is another object (the tool mounted again, a changed override) is read anew."""
    plugin = PolicyPlugin()
    call = ToolCall("c1", "t", {})
    guarded = ToolSpec(name="t", description="t", security={"required_scopes": ["admin"]})
    free = ToolSpec(name="t", description="t")
    limited = ToolSpec(name="t", description="t", policies={"rate_limit": {"limit": 1, "interval_ms": 60000}})
    assert plugin.tool_pre(call, guarded, ToolContext()).code == "missing_scope"
    assert plugin.tool_pre(call, guarded, ToolContext(scopes={"admin"})) is None
    assert plugin.tool_pre(call, free, ToolContext()) is None
    assert plugin.tool_pre(call, limited, ToolContext()) is None
    assert plugin.tool_pre(call, limited, ToolContext()).code == "rate_limited"
    assert plugin.tool_pre(call, free, ToolContext()) is None
    assert plugin.tool_pre(call, guarded, ToolContext()).code == "missing_scope"


# -- found by attack: budgets, memory, remounts, deadlines --------------------------------------------


async def test_two_budgets_of_one_principal_each_keep_their_own_window() -> None:
    """Found by attack: every budget of a principal shared one counter key, so a one-minute budget's
    new window wiped the hourly one (30 calls admitted in 10 minutes against an hourly 5)."""
    clock = FakeClock()
    tool = Tool("b", policies={"budgets": [{"per": "principal", "max_calls": 5, "window_ms": 3_600_000},
                                           {"per": "principal", "max_calls": 3, "window_ms": 60_000}]})
    host = await host_with(tool, clock=clock)
    try:
        admitted = 0
        for _ in range(10):  # ten minutes, three calls tried in each
            for _ in range(3):
                admitted += (await host.call("b", {})).success
            clock.now += 60
        assert admitted == 5
    finally:
        await host.close()


async def test_two_budgets_of_one_window_count_each_call_once_with_the_tighter_limit() -> None:
    """Found by attack: a calls budget and a seconds budget of the same window shared a counter and
    counted each call twice (2 admitted of a max_calls of 4)."""
    tool = Tool("b", policies={"budgets": [{"per": "principal", "max_calls": 4, "window_ms": 3_600_000},
                                           {"per": "principal", "max_seconds": 1000, "window_ms": 3_600_000},
                                           {"per": "principal", "max_calls": 6, "window_ms": 3_600_000}]})
    host = await host_with(tool)
    try:
        assert [(await host.call("b", {})).success for _ in range(6)] == [True] * 4 + [False] * 2
    finally:
        await host.close()


async def test_a_time_budget_reserves_the_waits_between_retries_too() -> None:
    """Found by attack: a call reserved its timeout times its attempts but was charged its backoff
    sleeps as well: ten concurrent callers spent 8 s of a 1 s budget. With the waits reserved, a
    call that may run longer than the budget leaves no room for a second one."""
    clock = FakeClock()
    tool = Tool("r", fail=True, clock=clock, takes=0.01,
                policies={"timeout_ms": 100, "retry": {"max_attempts": 3, "initial_backoff_ms": 1000,
                                                       "max_backoff_ms": 1000, "jitter": False},
                          "budgets": [{"per": "principal", "max_seconds": 1, "window_ms": 3_600_000}]})
    host = await host_with(tool, clock=clock)
    try:
        results = await asyncio.gather(*(host.call("r", {}) for _ in range(10)))
        admitted = [r for r in results if r.error["code"] != "budget_exceeded"]
        assert len(admitted) == 1, [r.error["code"] for r in results]
        policy: PolicyPlugin = host.plugin_manager.get_plugin("policy")  # type: ignore[assignment]
        assert not any(policy.held_resources().values())
    finally:
        await host.close()


async def test_a_principal_of_none_never_escapes_a_per_principal_budget() -> None:
    """Found by attack: ``principal=None`` skipped every per-principal budget (5 of 5 admitted with
    a max_calls of 1). ``ToolContext`` now refuses it, and the host refuses a context whose
    principal was set around the constructor (``invalid_context``): no call escapes the count."""
    tool = Tool("b", policies={"budgets": [{"per": "principal", "max_calls": 1, "window_ms": 60_000}]})
    host = await host_with(tool)
    try:
        with pytest.raises(TypeError, match="ToolContext.principal must be a str"):
            ToolContext(principal=None)  # type: ignore[arg-type]  # what a careless caller passes
        nobody = ToolContext()  # set around the constructor: refused by the host, never uncounted
        object.__setattr__(nobody, "principal", None)
        assert [(await host.call("b", {}, context=nobody)).error["code"] for _ in range(2)] == ["invalid_context"] * 2
        assert [(await host.call("b", {}, context=ToolContext(principal="x"))).success for _ in range(2)] == \
            [True, False]
        assert (await host.call("b", {}, context=ToolContext(principal="None"))).success
    finally:
        await host.close()


async def test_a_callers_own_deadline_does_not_open_the_breaker_for_everyone() -> None:
    """Found by attack: three calls of one caller with a 10 ms deadline on a healthy 200 ms tool
    timed out and opened the breaker: the next caller got circuit_open for the whole cooldown."""
    tool = Tool("slow", delay=0.2, policies={"timeout_ms": 5000,
                                             "circuit_breaker": {"failure_threshold": 3, "cooldown_ms": 60_000}})
    host = ToolHost(plugins=[ToolsPlugin(tool), PolicyPlugin()], builtins=False, entry_points=False, discover=False)
    await host.start()
    try:
        for _ in range(3):
            cut = await host.call("slow", {}, context=ToolContext(principal="mallory").with_timeout(0.01))
            assert cut.error["code"] == "timeout" and cut.error["by_deadline"] is True
        assert (await host.call("slow", {}, context=ToolContext(principal="alice"))).success
    finally:
        await host.close()


async def test_a_tool_mounted_again_with_another_cap_gets_that_cap() -> None:
    """Found by attack: concurrency slots were kept by tool name, so a tool mounted again with a cap
    of 4 instead of 1 still ran one call at a time (and 4 → 1 ran four at once)."""
    for first, second in ((1, 4), (4, 1)):
        gate = asyncio.Event()
        tool = Tool("c", gate=gate, policies={"concurrency": {"limit": first}})
        host = await host_with(tool)
        try:
            policy: PolicyPlugin = host.plugin_manager.get_plugin("policy")  # type: ignore[assignment]
            gate.set()
            assert (await host.call("c", {})).success  # the first spec's slots exist now
            again = Tool("c", gate=asyncio.Event(), policies={"concurrency": {"limit": second}})
            host.tools.remove("c")
            host.tools.add(again, plugin="test")
            calls = [asyncio.ensure_future(host.call("c", {})) for _ in range(4)]
            await asyncio.sleep(0.05)
            assert again.max_in_flight == second
            again.gate.set()  # type: ignore[union-attr]
            results = await asyncio.gather(*calls)
            assert all(r.success for r in results), [r.error for r in results]  # the rest queued
            assert again.max_in_flight == second
            assert not any(policy.held_resources().values())
        finally:
            await host.close()


def test_the_memory_store_drops_ended_windows_and_expired_records_as_it_grows() -> None:
    """Found by attack: the counters of principals gone quiet and the idempotency records of keys
    never asked again were kept for the life of the process (5,100 records of a 1 s window an hour
    later), and each key entering a new window rebuilt the whole table (4 s of the event loop for
    8,000 principals). Now each key keeps its current window only, and what has ended is swept
    out whenever a table has doubled: it never holds more than about twice what is live."""
    from amplifier_tools.builtins.policy.state import MemoryState

    state = MemoryState()
    for i in range(5000):
        state.add(f"rate:t:gone{i}", 0, 1, 1.0)  # window 0 of a 1 s interval: over by t = 1
        state.remember(f"idem:gone{i}", i, expires_at=1.0, now=0.5)
    for i in range(5000):
        state.add(f"rate:t:here{i}", 100, 1, 1.0)
        state.remember(f"idem:here{i}", i, expires_at=200.0, now=100.0)
    assert len(state._counters) < 7000 and len(state._records) < 7000
    assert state.get("rate:t:here7", 100) == 1 and state.recall("idem:here7", 100.0) == 7
    # Counting is unchanged: a key's window, a new window, a late settlement into an ended one.
    assert state.add("k", 5, 2, 1.0) == 2 and state.add("k", 5, 1, 1.0) == 3 and state.get("k", 5) == 3
    assert state.add("k", 6, 1, 1.0) == 1 and state.get("k", 5) == 0
    assert state.add("k", 5, 4, 1.0) == 4 and state.get("k", 6) == 1
