"""The policy stores against limits the contract accepts but a store could not hold (policy38).

- A rate limit of 2**63 calls or more (``RateLimit.limit`` has no upper bound; "no limit in
  practice") failed every call of the tool on the SQLite store with ``hook_failed``
  (``OverflowError: Python int too large to convert to SQLite INTEGER``): the one-statement take
  bound the limit as a SQLite integer. Memory and Redis admitted the calls.
- On the Redis store, a window or cooldown long enough that twice it is past a float's range
  (``window_ms = 1e308`` of a budget; ``cooldown_ms = 1e308`` of a breaker, "open until reset")
  made ``_ms`` raise ``OverflowError`` (``int(inf)``) in the release: a time budget's reservations
  were never settled, so calls that ran for no time at all were refused ``budget_exceeded`` ("reserved
  by calls in flight") with nothing in flight, for as long as the reservations lived; and a breaker's
  failures were never recorded, so it never opened (memory and SQLite opened it after 2 failures).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import ToolsPlugin
from redis_server import RedisServer

from amplifier_tools import ExecutionError, ToolContext, ToolHost, ToolResult, ToolSpec


def _tool(policies: dict[str, Any], *, fails: bool = False) -> Any:
    class Tool:
        spec = ToolSpec(name="t", description="A tool.", effect="Pure", policies=policies)
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            if fails:
                raise ExecutionError("boom")
            return ToolResult(output="ok")
    return Tool()


def _host(tmp_path: Path, store: str, tool: Any) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")




@pytest.mark.parametrize("limit", [2**63 - 1, 2**63, 2**70])
async def test_a_rate_limit_past_a_sqlite_integer_admits_calls_on_every_store(
        tmp_path: Path, store: str, limit: int) -> None:
    tool = _tool({"rate_limit": {"limit": limit, "interval_ms": 60_000}})
    async with _host(tmp_path, store, tool) as host:
        results = [await host.call("t", {}) for _ in range(3)]
    assert [result.error for result in results] == [None, None, None]


async def test_a_time_budget_with_a_window_past_a_floats_range_gives_its_reservations_back(
        tmp_path: Path, store: str) -> None:
    """Each call reserves its timeout (1 s) of a 3 s budget and runs for no time: all six fit."""
    tool = _tool({"timeout_ms": 1000,
                  "budgets": [{"per": "principal", "max_seconds": 3, "window_ms": 1e308}]})
    async with _host(tmp_path, store, tool) as host:
        results = [await host.call("t", {}, context=ToolContext(principal="p")) for _ in range(6)]
    assert [result.error and result.error["code"] for result in results] == [None] * 6


@pytest.mark.parametrize("breaker", [
    {"failure_threshold": 2, "window_ms": 1e308, "cooldown_ms": 1e308},
    {"failure_threshold": 2, "window_ms": 1000, "cooldown_ms": 1e308},
    {"failure_threshold": 2, "failure_rate": 0.5, "min_calls": 2, "window_ms": 1e308, "cooldown_ms": 1e308},
])
async def test_a_breaker_with_a_cooldown_past_a_floats_range_still_opens(
        tmp_path: Path, store: str, breaker: dict[str, Any]) -> None:
    async with _host(tmp_path, store, _tool({"circuit_breaker": breaker}, fails=True)) as host:
        codes = [(await host.call("t", {})).error["code"] for _ in range(4)]
    assert codes == ["execution_failed", "execution_failed", "circuit_open", "circuit_open"]


# -- ``amplifier-tools policy status`` -----------------------------------------------------------
#
# - SQLite: a breaker record whose expiry is past a float's range (``cooldown_ms = 1e308``, "open
#   until reset", which the contract accepts) was listed with ``expires_in: Infinity`` by
#   ``policy status --json``: not JSON (RFC 8259; ``jq`` and strict parsers refuse the whole
#   output), and ``inf s`` in the table.
# - Redis: a string ``nan``/``inf`` or a sorted set's ``inf`` score under the prefix was listed as a
#   bare ``NaN``/``Infinity`` by ``--json`` as well.
# - Redis: a key under the prefix without an expiry (``PTTL`` -1: written by hand or by another
#   program — what an operator runs ``policy status`` to find, since every key of ours expires) was
#   listed as expiring in ``0 s``; the table's ``-`` (no expiry) is what it is.


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


async def test_policy_status_json_of_a_record_that_never_expires_is_json(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    tool = _tool({"circuit_breaker": {"failure_threshold": 1, "cooldown_ms": 1e308}}, fails=True)
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(state), "plugins": {"policy": {"store": "sqlite"}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        assert [(await host.call("t", {})).error["code"] for _ in range(2)] == ["execution_failed", "circuit_open"]
    (tmp_path / "amplifier-tools.toml").write_text(f'state_dir = "{state}"\n')
    out = await asyncio.to_thread(cli, tmp_path, "policy", "status", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = _strict_json(out.stdout)["keys"]
    assert row["key"] == "breaker:t" and row["expires_in"] is None
    table = await asyncio.to_thread(cli, tmp_path, "policy", "status")
    assert "inf" not in table.stdout, table.stdout


def test_policy_status_shows_a_redis_key_without_expiry_as_never_expiring(
        tmp_path: Path, redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        client.set("amplifier-tools:rate:planted@1", 5)  # no expiry
        client.set("amplifier-tools:rate:planted@2", "nan", px=60_000)  # not a number JSON holds
        client.zadd("amplifier-tools:slots:planted", {"holder": float("inf")})
        client.pexpire("amplifier-tools:slots:planted", 60_000)
    finally:
        client.close()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "amplifier-tools.toml").write_text(
        f'state_dir = "{state}"\n[plugins.policy]\nstore = "{redis_server.url}"\n')
    out = cli(tmp_path, "policy", "status", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["key"]: row for row in _strict_json(out.stdout)["keys"]}
    assert rows["rate:planted@1"]["expires_in"] is None, rows
    assert 0 < rows["rate:planted@2"]["expires_in"] <= 60 and 0 < rows["slots:planted"]["expires_in"] <= 60, rows
