"""The Redis store attacked a second time, as an operator under faults and as an attacker.

- A budget reservation whose reply did not come within the store timeout (a slow link, a stalled
  server), or whose call was cancelled during the round trip, was made in Redis but never given
  back: the call, refused ``policy_store_unavailable`` or cancelled, stayed counted against the
  call budget, and its seconds stayed reserved until the reservation expired — for a call with no
  bound, all that was left of the time budget, for its whole window. Leases and idempotency claims
  were kept before their round trip already; a reservation now is too, its window unknown, and
  its give-back (``UNRESERVE``) finds it by its holder. A budget of calls only now records its
  holder too, so a reservation of one resent after its reply was lost is no longer counted twice.
- A missing or wrong password, a Redis user without the right to run scripts (ACL ``NOPERM``), and
  a key of another type at one of the deployment's keys (another program writing under the prefix:
  ``WRONGTYPE``) each failed every call as a *retryable* ``policy_store_unavailable`` whose hint
  said to check the server; retrying never mends them. They are now not retryable, and the hint
  names what to change (the URL's password, the user's ACL, ``store_prefix``).
- A give-back (a rate-limit unit or a budget call returned by a call refused later) is never
  resent, since it may have run; so one sent on an idle connection the server had already closed
  (its ``timeout``, a restart, a load balancer dropping idle links, ``CLIENT KILL``) was lost,
  though it had certainly not run: the unit stayed counted for its window. A give-back now goes
  only to a connection the server has not closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import ToolsPlugin
from redis_proxy import ReplyDropper
from redis_server import RedisServer

from amplifier_tools import ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.store import open_store


class Budgeted:
    """A tool under a budget per principal an hour: one call, or fewer seconds than a call may run
    (a call reserves all of them while it runs), or both."""

    def __init__(self, budget: dict[str, Any]) -> None:
        self.spec = ToolSpec(name="budgeted", description="Budgeted.", effect="Pure",
                             policies={"timeout_ms": 60_000,
                                       "budgets": [{"per": "principal", "window_ms": 3_600_000, **budget}]})
        self.name, self.description = self.spec.name, self.spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


def _host(tmp_path: Path, url: str, tool: Any, timeout_ms: float) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"policy": {"store": url, "store_timeout_ms": timeout_ms}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


BUDGETS = {"calls": {"max_calls": 1}, "seconds": {"max_seconds": 30}, "both": {"max_calls": 1, "max_seconds": 30}}


async def _settled(proxy: ReplyDropper) -> None:
    proxy.delay = 0.0
    await asyncio.sleep(0.5)  # the late reply arrives, then the background give-back runs


@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
async def test_a_reservation_whose_reply_came_too_late_is_given_back(redis_server: RedisServer, tmp_path: Path,
                                                                     budget: dict[str, Any]) -> None:
    proxy = ReplyDropper(redis_server.port)
    try:
        async with _host(tmp_path, await proxy.start(), Budgeted(budget), 200) as host:
            warm = await host.call("budgeted", {}, context=ToolContext(principal="warm"))  # a connection open
            assert warm.success, warm.error
            proxy.delay = 0.4  # longer than the store timeout: the reservation runs, its reply is late
            late = await host.call("budgeted", {})
            assert not late.success and late.error is not None
            assert late.error["code"] == "policy_store_unavailable"
            await _settled(proxy)
            again = await host.call("budgeted", {})
            # before: budget_exceeded for the hour ("used up" or "reserved by calls in flight")
            assert again.success, again.error
            if "max_calls" in budget:  # the budget still holds: the call that ran counts
                refused = await host.call("budgeted", {})
                assert not refused.success and refused.error is not None
                assert refused.error["code"] == "budget_exceeded"
    finally:
        await proxy.close()


async def test_a_call_cancelled_during_its_reservation_gives_it_back(redis_server: RedisServer,
                                                                    tmp_path: Path) -> None:
    proxy = ReplyDropper(redis_server.port)
    try:
        async with _host(tmp_path, await proxy.start(), Budgeted(BUDGETS["both"]), 5_000) as host:
            assert (await host.call("budgeted", {}, context=ToolContext(principal="warm"))).success
            proxy.delay = 0.4
            call = asyncio.ensure_future(host.call("budgeted", {}))
            await asyncio.sleep(0.2)  # the reservation is in Redis, its reply on its way
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await _settled(proxy)
            again = await host.call("budgeted", {})
            assert again.success, again.error  # before: budget_exceeded for the hour
    finally:
        await proxy.close()


class Slotted:
    spec = ToolSpec(name="slotted", description="One at a time.", effect="Pure", policies={"concurrency": {"limit": 1}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


def _no_password(client: redis.Redis, port: int) -> str:
    client.config_set("requirepass", "s3cret")
    return f"redis://127.0.0.1:{port}/0"


def _no_scripts(client: redis.Redis, port: int) -> str:
    client.acl_setuser("noscripts", enabled=True, passwords=["+pw"], commands=["+@all", "-eval", "-evalsha"],
                       keys=["*"])
    return f"redis://noscripts:pw@127.0.0.1:{port}/0"


def _foreign_key(client: redis.Redis, port: int) -> str:
    client.set("amplifier-tools:slots:slotted", "a string another program wrote")  # no expiry: for good
    return f"redis://127.0.0.1:{port}/0"


MISCONFIGURED = {"no-password": (_no_password, "password"), "no-right-to-run-scripts": (_no_scripts, "EVALSHA"),
                 "a-key-of-another-type": (_foreign_key, "store_prefix")}


@pytest.mark.parametrize(("setup", "named"), MISCONFIGURED.values(), ids=MISCONFIGURED.keys())
async def test_what_retrying_cannot_mend_is_not_retryable_and_names_the_setting(
        redis_server: RedisServer, tmp_path: Path, setup: Any, named: str) -> None:
    client = redis.Redis(port=redis_server.port)
    try:
        url = setup(client, redis_server.port)
    finally:
        client.close()
    async with _host(tmp_path, url, Slotted(), 2_000) as host:
        result = await host.call("slotted", {})
    assert not result.success and result.error is not None
    assert result.error["code"] == "policy_store_unavailable"
    assert result.error["retryable"] is False  # before: True, and the hint said to check the server
    assert named in result.error["hint"] and "[plugins.policy]" in result.error["hint"]


class Everything:
    spec = ToolSpec(name="everything", description="Every shared policy.", effect="Pure", policies={
        "rate_limit": {"limit": 100, "interval_ms": 60_000}, "concurrency": {"limit": 2},
        "budgets": [{"per": "principal", "max_calls": 100, "max_seconds": 100}],
        "circuit_breaker": {"failure_threshold": 3, "window_ms": 60_000, "cooldown_ms": 1_000}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=input)


async def test_a_script_cache_flushed_mid_run_costs_nothing_but_a_resend(redis_server: RedisServer,
                                                                         tmp_path: Path) -> None:
    """Not a defect (a guard: no test flushed the script cache of a running server): every script,
    the rate limit's packed one too, comes back by ``EVAL`` after ``NOSCRIPT``."""
    client = redis.Redis(port=redis_server.port)
    try:
        async with _host(tmp_path, redis_server.url, Everything(), 2_000) as host:
            context = ToolContext(idempotency_key="once")
            assert (await host.call("everything", {"n": 1}, context=context)).success
            client.script_flush()
            replayed = await host.call("everything", {"n": 1}, context=context)
            fresh = await host.call("everything", {"n": 2})
        assert replayed.success and replayed.metadata.get("replayed"), replayed
        assert fresh.success, fresh.error
        assert client.script_exists(*[s.sha.split(b"\r\n")[1].decode() for s in _scripts()]) == [True] * 5
    finally:
        client.close()


def _scripts() -> list[Any]:
    """The scripts a call of ``Everything`` runs (after the flush, each was sent again by ``EVAL``)."""
    from amplifier_tools.builtins.policy import redis_store
    from amplifier_tools.builtins.policy.redis_link import Script

    return [Script(text) for text in (redis_store.TAKE, redis_store.LEASE, redis_store.RESERVE,
                                      redis_store.SETTLE, redis_store.CLAIM)]


async def test_a_give_back_on_a_connection_the_server_closed_is_not_lost(redis_server: RedisServer,
                                                                         tmp_path: Path) -> None:
    client = redis.Redis(port=redis_server.port)
    store = open_store(redis_server.url, "t:", 2.0, tmp_path)
    try:
        window = await store.take("rate", 3600.0, 5)
        _, budget_window, _ = await store.reserve("budget", 3600.0, 5, None, None, "holder", 60.0)
        give_backs: list[Callable[[], Awaitable[None]]] = [
            lambda: store.untake("rate", 3600.0, window),
            lambda: store.settle("budget", 3600.0, budget_window, "holder", None)]
        for give_back in give_backs:
            client.client_kill_filter(_type="normal", skipme=True)  # the store's idle connections, as a timeout would
            await asyncio.sleep(0.05)  # the close reaches the host
            await give_back()  # before: StoreUnavailable "Connection closed by server", and nothing given back
        assert client.get(f"t:rate@{window}") == b"0"
        assert client.get(f"t:budget:calls@{budget_window}") == b"0"
    finally:
        await store.close()
        client.close()


async def test_a_host_whose_clock_runs_ahead_shares_the_same_windows(redis_server: RedisServer, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a defect (a guard): windows, leases and reservations are on the server's ``TIME``, so a
    host whose wall clock runs an hour ahead takes from the same window, not a fresh one."""
    import time

    on_time = open_store(redis_server.url, "t:", 2.0, tmp_path)
    ahead = open_store(redis_server.url, "t:", 2.0, tmp_path)
    try:
        assert await on_time.take("rate", 3600.0, 1) >= 0
        assert (await on_time.reserve("budget", 3600.0, 1, None, None, "a", 60.0))[0] == "ok"
        assert await on_time.lease("slots", 1, "a", 60.0)
        wall = time.time
        monkeypatch.setattr(time, "time", lambda: wall() + 3600.0)
        assert await ahead.take("rate", 3600.0, 1) < 0
        assert (await ahead.reserve("budget", 3600.0, 1, None, None, "b", 60.0))[0] == "calls"
        assert not await ahead.lease("slots", 1, "b", 60.0)
    finally:
        await on_time.close()
        await ahead.close()


async def test_a_call_budget_reservation_resent_after_its_reply_was_lost_counts_once(redis_server: RedisServer,
                                                                                     tmp_path: Path) -> None:
    """A budget of calls only now records its holder as a time budget does (what ``UNRESERVE``
    finds), so a reservation resent after its reply was lost finds its own: before, it counted
    the call twice (one call fewer admitted in the window)."""
    proxy = ReplyDropper(redis_server.port)
    client = redis.Redis(port=redis_server.port)
    store = open_store(await proxy.start(), "t:", 2.0, tmp_path)
    try:
        await store.reserve("warm", 3600.0, 5, None, None, "warm", 60.0)  # the script known, a connection idle
        proxy.armed = 1
        outcome, window, _ = await store.reserve("budget", 3600.0, 5, None, None, "holder", 60.0)
        assert proxy.dropped == 1 and outcome == "ok"
        assert client.get(f"t:budget:calls@{window}") == b"1"
    finally:
        await store.close()
        await proxy.close()
        client.close()
