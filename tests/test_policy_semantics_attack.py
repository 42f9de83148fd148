"""Attacks on what the policies promise with the default ``memory`` store: rate-limit keys and windows,
``retry_after`` hints, remounts, and the breaker and concurrency cap under 200 concurrent callers."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from helpers import FakeClock, ToolsPlugin
from test_policy import Tool, host_with

from amplifier_tools import ToolContext, ToolHost, hookimpl
from amplifier_tools.builtins.policy import PolicyPlugin


def policy_of(host: ToolHost) -> PolicyPlugin:
    return host.plugin_manager.get_plugin("policy")  # type: ignore[no-any-return]


def remount(host: ToolHost, tool: Tool) -> None:
    host.tools.remove(tool.name)
    host.tools.add(tool, plugin="test")


# -- found by attack: rate-limit keys, windows and hints ------------------------------------------


async def test_a_principal_beginning_with_a_colon_shares_no_counter_with_another_tool() -> None:
    """Found by attack: the key was ``rate:<tool>:<principal>``, and a tool name holds ``::``, so
    principal ``:b`` of tool ``a`` was counted on tool ``a::b``'s per-tool counter, and principal
    ``::b:x`` of tool ``a`` on principal ``x``'s counter of tool ``a::b``: one caller used up another
    tool's (or another principal's) limit."""
    per_principal = {"rate_limit": {"limit": 1, "interval_ms": 60_000, "per": "principal"}}
    a = Tool("a", policies=per_principal)
    ab_tool = Tool("a::b", policies={"rate_limit": {"limit": 1, "interval_ms": 60_000}})
    host = await host_with(a, ab_tool)
    try:
        assert (await host.call("a::b", {}, context=ToolContext(principal="bob"))).success
        odd = await host.call("a", {}, context=ToolContext(principal=":b"))
        assert odd.success, odd.error
        # The per-tool counter of a::b is still its own: used up by bob, not by ':b'.
        assert (await host.call("a::b", {})).error["code"] == "rate_limited"
    finally:
        await host.close()
    b = Tool("a", policies=per_principal)
    ab_principal = Tool("a::b", policies=per_principal)
    host = await host_with(b, ab_principal)
    try:
        assert (await host.call("a::b", {}, context=ToolContext(principal="x"))).success
        for principal in ("::b:x", '"::b:x"', '"x"'):
            other = await host.call("a", {}, context=ToolContext(principal=principal))
            assert other.success, (principal, other.error)
        assert (await host.call("a", {}, context=ToolContext(principal="::b:x"))).error["code"] == "rate_limited"
    finally:
        await host.close()


async def test_a_rate_limited_hint_never_names_a_moment_before_the_next_window() -> None:
    """Found by attack: ``retry_after`` was rounded to the nearest millisecond, so a call 0.4 ms
    before a window's end heard ``retry_after = 0.0``, and at a 100 ms interval on a clock of
    1000.0 (where the window ends 1e-13 s later) it heard 0.0 too; a caller retrying when told was
    refused again. Now it is rounded up, and at least 1 ms."""
    for interval_ms, start in ((1000, 1000.9996), (1000, 1000.0004), (100, 1000.0), (100, 1000.05), (250, 7.3)):
        clock = FakeClock()
        clock.now = start
        tool = Tool("limited", policies={"rate_limit": {"limit": 1, "interval_ms": interval_ms}})
        host = await host_with(tool, clock=clock)
        try:
            assert (await host.call("limited", {})).success
            refused = await host.call("limited", {})
            assert refused.error["code"] == "rate_limited"
            hint = refused.error["retry_after"]
            assert 0 < hint <= interval_ms / 1000 + 0.001, (interval_ms, start, hint)
            clock.now += hint  # the caller waits exactly as long as told
            again = await host.call("limited", {})
            assert again.success, (interval_ms, start, hint, again.error)
        finally:
            await host.close()


async def test_a_circuit_open_hint_never_names_a_moment_before_the_cooldown_ends() -> None:
    """Found by attack, as for the rate limit: 0.4 ms before the cooldown's end the breaker said
    ``retry_after = 0.0``, and a caller retrying then was refused."""
    clock = FakeClock()
    tool = Tool("flaky", fail=True, policies={"circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 1000}})
    host = await host_with(tool, clock=clock)
    try:
        assert (await host.call("flaky", {})).error["code"] == "backend_down"
        clock.now += 0.9996
        refused = await host.call("flaky", {})
        assert refused.error["code"] == "circuit_open" and refused.error["retry_after"] > 0
        clock.now += refused.error["retry_after"]
        tool.fail = False
        probe = await host.call("flaky", {})
        assert probe.success, probe.error
    finally:
        await host.close()


async def test_a_queued_call_on_a_100_ms_rate_limit_reaches_the_next_window() -> None:
    """Found by attack: with ``queue = true``, the wait slept the rounded hint; at 100 ms on a clock
    of 1000.0 that was 0.0 s, and on a clock that moves only when slept on the call waited for ever
    (the host never answered)."""
    clock = FakeClock()
    tool = Tool("queued", policies={"rate_limit": {"limit": 1, "interval_ms": 100, "queue": True},
                                    "timeout_ms": 10_000})
    host = await host_with(tool, clock=clock)
    try:
        results = await asyncio.wait_for(asyncio.gather(*(host.call("queued", {}) for _ in range(5))), 10)
        assert all(r.success for r in results), [r.error for r in results]
        assert tool.runs == 5 and clock.now - 1000.0 <= 0.5
        assert not any(policy_of(host).held_resources().values())
    finally:
        await host.close()


async def test_a_remount_with_a_longer_rate_interval_still_limits_calls() -> None:
    """Found by attack: a tool's counter was kept under one key whatever its interval, and windows
    are numbered ``now // interval``; after a remount from 60 s to 3600 s at a monotonic clock of
    100,000 s, the counter's window (1666) looked later than the new one (27), was taken for a
    late settlement of an ended window and never counted: every call was admitted (for 69 days)."""
    clock = FakeClock()
    clock.now = 100_000.0
    for per in ("tool", "principal"):
        tool = Tool("t", policies={"rate_limit": {"limit": 2, "interval_ms": 60_000, "per": per}})
        host = await host_with(tool, clock=clock)
        try:
            assert [(await host.call("t", {})).success for _ in range(3)] == [True, True, False]
            remount(host, Tool("t", policies={"rate_limit": {"limit": 3, "interval_ms": 3_600_000, "per": per}}))
            admitted = [(await host.call("t", {})).success for _ in range(6)]
            assert admitted == [True, True, True, False, False, False], (per, admitted)
        finally:
            await host.close()


async def test_a_window_shorter_than_a_clock_reading_fails_no_call() -> None:
    """Found by attack: ``interval_ms`` (and a budget's ``window_ms``) is valid if positive and
    finite, but at ``1e-310`` numbering the window raised ``OverflowError``: every call of the
    tool failed ``hook_failed``. Such a window counts the calls of one clock reading."""
    for policies in ({"rate_limit": {"limit": 1, "interval_ms": 1e-310}},
                     {"budgets": [{"per": "principal", "max_calls": 1, "window_ms": 1e-310}]}):
        clock = FakeClock()
        tool = Tool("tiny", policies=policies)
        host = await host_with(tool, clock=clock)
        try:
            first, second = [await host.call("tiny", {}) for _ in range(2)]
            assert first.success, first.error
            assert second.error["code"] in {"rate_limited", "budget_exceeded"}  # the same clock reading
            clock.now += 0.001
            assert (await host.call("tiny", {})).success
        finally:
            await host.close()


# -- found by attack: a probe that never reached the tool -------------------------------------------


class SlowPre:
    """A plugin whose ``tool_pre`` (after the policy plugin's) takes 0.1 s while ``on``."""

    name = "slow"
    on = False

    @hookimpl(trylast=True)
    def tool_pre(self) -> Any:
        return asyncio.sleep(0.1) if self.on else None


async def test_a_probe_whose_deadline_passes_before_the_tool_starts_does_not_close_the_breaker() -> None:
    """Found by attack: the host ended the half-open breaker's probe ``deadline_exceeded`` (its
    deadline passed in a later plugin's ``tool_pre``; the tool never ran), the breaker read that
    as a success and closed, and every caller reached the failing tool again."""
    clock = FakeClock()
    slow = SlowPre()
    tool = Tool("flaky", fail=True, policies={"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 5000}})
    host = ToolHost(plugins=[ToolsPlugin(tool), PolicyPlugin(clock=clock, sleep=clock.sleep), slow], builtins=False,
                    entry_points=False, discover=False)
    await host.start()
    try:
        for _ in range(2):
            assert (await host.call("flaky", {})).error["code"] == "backend_down"  # opens
        clock.now += 5.0
        slow.on = True
        cut = await host.call("flaky", {}, context=ToolContext().with_timeout(0.05))
        assert cut.error["code"] == "deadline_exceeded" and tool.runs == 2
        assert not any(policy_of(host).held_resources().values())
        slow.on = False
        assert (await host.call("flaky", {})).error["code"] == "backend_down"  # still half-open: the probe
        assert (await host.call("flaky", {})).error["code"] == "circuit_open"  # its failure reopened it
        assert tool.runs == 3
    finally:
        await host.close()


async def test_a_probe_whose_secret_is_missing_does_not_close_the_breaker() -> None:
    """Found by attack, as above: a probe ended ``missing_secret`` before its tool started closed
    the breaker."""
    clock = FakeClock()
    tool = Tool("flaky", fail=True, security={"secret_refs": ["API_KEY"]},
                policies={"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 5000}})
    host = await host_with(tool, clock=clock)
    keyed = ToolContext(secrets={"API_KEY": "k"})
    try:
        for _ in range(2):
            assert (await host.call("flaky", {}, context=keyed)).error["code"] == "backend_down"  # opens
        clock.now += 5.0
        assert (await host.call("flaky", {})).error["code"] == "missing_secret"
        assert (await host.call("flaky", {}, context=keyed)).error["code"] == "backend_down"  # the probe
        assert (await host.call("flaky", {}, context=keyed)).error["code"] == "circuit_open"
        assert tool.runs == 3
    finally:
        await host.close()


# -- what holds: exact edges under 200 concurrent callers ------------------------------------------


async def test_a_half_open_breaker_lets_exactly_one_of_200_concurrent_callers_probe() -> None:
    clock = FakeClock()
    gate = asyncio.Event()
    tool = Tool("b", fail=True, policies={"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 1000}})
    host = await host_with(tool, clock=clock)
    try:
        for _ in range(2):
            assert (await host.call("b", {})).error["code"] == "backend_down"
        clock.now += 1.0
        tool.fail, tool.gate = False, gate
        calls = [asyncio.ensure_future(host.call("b", {})) for _ in range(200)]
        await asyncio.sleep(0.05)
        assert tool.in_flight == 1 and policy_of(host).held_resources()["probes"] == 1
        gate.set()
        results = await asyncio.gather(*calls)
        outcome = collections.Counter(r.error["code"] if r.error else "ok" for r in results)
        assert outcome == {"ok": 1, "circuit_open": 199}
        assert (await host.call("b", {})).success  # the probe closed it
        assert not any(policy_of(host).held_resources().values())
    finally:
        await host.close()


async def test_a_probe_that_times_out_reopens_the_breaker_and_the_next_cooldown_probes_again() -> None:
    clock = FakeClock()
    tool = Tool("b", fail=True, policies={"timeout_ms": 50,
                                          "circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 1000}})
    host = await host_with(tool, clock=clock)
    try:
        assert (await host.call("b", {})).error["code"] == "backend_down"
        clock.now += 1.0
        tool.fail, tool.delay = False, 0.2
        assert (await host.call("b", {})).error["code"] == "timeout"  # a timeout counts: open again
        refused = await host.call("b", {})
        assert refused.error["code"] == "circuit_open" and refused.error["retry_after"] == 1.0
        clock.now += 1.0
        tool.delay = 0.0
        assert (await host.call("b", {})).success
        assert not any(policy_of(host).held_resources().values())
    finally:
        await host.close()


async def test_200_queued_callers_get_a_cap_of_3_first_come_first_served() -> None:
    gate = asyncio.Event()
    order: list[int] = []

    class Ordered(Tool):
        async def execute(self, input: dict[str, Any]) -> Any:
            order.append(input["i"])
            return await super().execute(input)

    tool = Ordered("c", gate=gate, policies={"concurrency": {"limit": 3}},
                   input_schema={"type": "object", "properties": {"i": {"type": "integer"}}})
    host = await host_with(tool)
    try:
        calls = []
        for i in range(200):
            calls.append(asyncio.ensure_future(host.call("c", {"i": i})))
            await asyncio.sleep(0)  # arrive in order
        await asyncio.sleep(0.05)
        assert tool.in_flight == 3 and policy_of(host).held_resources()["slot_waiters"] == 197
        gate.set()
        results = await asyncio.gather(*calls)
        assert all(r.success for r in results)
        assert order == list(range(200)) and tool.max_in_flight == 3
        assert not any(policy_of(host).held_resources().values())
    finally:
        await host.close()


async def test_a_tool_whose_output_breaks_its_schema_opens_its_breaker() -> None:
    """Found by attack: ``invalid_output`` (the tool's own output failing its output schema, no
    plugin involved) counted as a success, so a tool that always answered so never opened its
    breaker, and such a half-open probe closed it. It is the tool's failure."""
    clock = FakeClock()
    tool = Tool("drifted", output_schema={"type": "object", "required": ["answer"]},
                policies={"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 5000}})
    host = await host_with(tool, clock=clock)
    try:
        for _ in range(2):
            assert (await host.call("drifted", {})).error["code"] == "invalid_output"
        assert (await host.call("drifted", {})).error["code"] == "circuit_open"
        clock.now += 5.0
        assert (await host.call("drifted", {})).error["code"] == "invalid_output"  # the probe fails: open again
        assert (await host.call("drifted", {})).error["code"] == "circuit_open"
        assert tool.runs == 3
    finally:
        await host.close()
