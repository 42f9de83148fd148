"""The SQLite policy store under attack: what was found.

- A call with a deadline shorter than ``store_timeout_ms``, on a store not connected yet (the first
  call of a host; every ``amplifier-tools call``), whose file another process held locked: the
  connection's setup (switching to WAL, retried while locked) and its busy timeout used the whole
  store timeout, so a 0.2 s call was held for 2 s before failing closed.
- The file removed (a state directory cleaned) or replaced while a host ran: the host kept counting
  in the file it had open while every other process counted in the new one, so a rate limit of 3
  admitted 4 calls; a symlink put in its place (refused by the next process) went unnoticed.
- A rate-limit decision that is the store's 500th operation sweeps expired rows after taking its
  unit; another process's write landing in between (the sweep waited past its bound) failed the
  call ``policy_store_unavailable`` with its unit still counted (with ``"local"`` it was decided
  again in memory).
- ``amplifier-tools policy status`` on a SQLite file that is not a database told people to "check
  the server"; on a directory in its place it reported a bug ("run with --verbose").
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import ToolsPlugin
from mcp_helpers import Completions

from amplifier_tools import ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.sqlite_store import SWEEP_EVERY

POLICIES: dict[str, Any] = {
    "timeout_ms": 5000,
    "concurrency": {"limit": 1, "queue": False},
    "rate_limit": {"limit": 1000, "interval_ms": 3_600_000},
    "budgets": [{"per": "principal", "max_calls": 1000, "max_seconds": 1000, "window_ms": 3_600_000}],
    "circuit_breaker": {"failure_threshold": 100, "window_ms": 3_600_000, "cooldown_ms": 3_600_000},
}


class Guarded:
    """Every stateful policy at once."""

    spec = ToolSpec(name="guarded", description="Carry every policy.", effect="Pure", policies=POLICIES)
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


def _host(tmp_path: Path, completions: Completions, **policy: Any) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"audit": {"fsync": "never"}, "policy": {"store": "sqlite", **policy}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(Guarded()), completions], builtins=["policy", "audit"],
                    entry_points=False, discover=False, working_dir=tmp_path / "work")


def _audit_records(host: ToolHost) -> list[dict[str, Any]]:
    path = Path(host.capabilities["audit.path"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("table", ["counters", None])
async def test_a_first_call_on_a_locked_file_waits_its_deadline_not_the_store_timeout(
        tmp_path: Path, table: str | None) -> None:
    """The file is new (another process created it and holds its write lock), or already ours and
    in WAL mode (an earlier host made it) and locked: either way the first call ends at its deadline."""
    completions = Completions()
    database = tmp_path / "state" / "policy.sqlite3"
    if table is None:  # an earlier host's file, in WAL mode with the store's tables
        async with _host(tmp_path, completions) as host:
            assert (await host.call("guarded", {}, context=ToolContext(principal="earlier"))).success
    else:
        (tmp_path / "state").mkdir(mode=0o700)
    other = sqlite3.connect(database, isolation_level=None)
    os.chmod(database, 0o600)
    if table is not None:
        other.execute(f"CREATE TABLE {table} (x)")  # another process setting up the new file
    other.execute("BEGIN EXCLUSIVE")  # and holding it past the call's deadline
    try:
        async with _host(tmp_path, completions, store_timeout_ms=2000) as host:
            started = time.monotonic()
            result = await host.call("guarded", {}, context=ToolContext().with_timeout(0.2))
            waited = time.monotonic() - started
            records = _audit_records(host)
    finally:
        other.close()
    assert result.error is not None and result.error["code"] == "policy_store_unavailable", result.error
    assert str(database) in result.error["message"]
    # What to do, naming the settings, for a Python caller too (the error named none; the command
    # line's hint told people to check a server).
    assert "SQLite file" in result.error["hint"] and "store_timeout_ms" in result.error["hint"]
    assert "server" not in result.error["hint"]
    assert waited < 1.0, waited  # the call's 0.2 s deadline, not the store's 2 s
    (call_id, code) = completions.calls[-1]  # one tool_complete and one audit record for the call
    assert code == "policy_store_unavailable" and [c for c, _ in completions.calls].count(call_id) == 1
    assert [r["call_id"] for r in records].count(call_id) == 1


class Limited:
    spec = ToolSpec(name="limited", description="Three calls an hour.", effect="Pure",
                    policies={"rate_limit": {"limit": 3, "interval_ms": 3_600_000},
                              "concurrency": {"limit": 5, "queue": False}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


def _limited(tmp_path: Path) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite"}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(Limited())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


@pytest.mark.parametrize("replacement", ["removed", "symlink"])
async def test_a_store_file_removed_or_replaced_under_a_running_host_is_not_kept(
        tmp_path: Path, replacement: str) -> None:
    database = tmp_path / "state" / "policy.sqlite3"
    async with _limited(tmp_path) as first:
        assert (await first.call("limited", {})).success  # `first` has the file open
        for name in glob.glob(f"{database}*"):
            os.unlink(name)
        if replacement == "symlink":
            elsewhere = tmp_path / "elsewhere.sqlite3"
            elsewhere.touch(mode=0o600)
            os.symlink(elsewhere, database)
            result = await first.call("limited", {})
            assert result.error is not None and result.error["code"] == "hook_failed", result.error
            assert "symbolic link" in result.error["message"] or "symlink" in result.error["message"]
            assert elsewhere.stat().st_size == 0
            return
        async with _limited(tmp_path) as second:  # another process: a new file, three new calls
            assert all([(await second.call("limited", {})).success for _ in range(3)])
        result = await first.call("limited", {})
    assert result.error is not None and result.error["code"] == "rate_limited", result  # 3 an hour, on one file


class Rated:
    spec = ToolSpec(name="rated", description="A lone rate limit.", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 3_600_000}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


async def test_a_sweep_that_cannot_run_does_not_fail_a_call_whose_unit_was_taken(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite", "store_timeout_ms": 200}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Rated())], builtins=["policy"], entry_points=False,
                        discover=False, working_dir=tmp_path / "work") as host:
        assert (await host.call("rated", {})).success
        store: Any = host.plugin_manager.get_plugin("policy").shared.store  # type: ignore[union-attr]
        other = sqlite3.connect(tmp_path / "state" / "policy.sqlite3", isolation_level=None)

        def another_process_writes(statement: str) -> None:
            if statement == "BEGIN IMMEDIATE":  # the sweep's, right after the unit was taken
                other.execute("BEGIN IMMEDIATE")

        store._ops = SWEEP_EVERY - 1  # the next decision is the 500th operation: it sweeps
        store._db.set_trace_callback(another_process_writes)
        try:
            result = await host.call("rated", {})
        finally:
            store._db.set_trace_callback(None)
            other.execute("ROLLBACK")
            other.close()
        counted = [row["value"] for row in await store.status() if row["key"].startswith("rate:rated@")]
    assert result.success, result.error  # its unit was taken: the call was admitted
    assert counted == [2.0]


@pytest.mark.parametrize("planted", ["garbage", "directory"])
def test_policy_status_of_a_broken_sqlite_file_names_the_file_not_a_server(tmp_path: Path, planted: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    database = state / "policy.sqlite3"
    if planted == "garbage":
        database.write_bytes(b"not a database, " * 512)
        database.chmod(0o600)
    else:
        database.mkdir()
    (tmp_path / "amplifier-tools.toml").write_text(f'state_dir = "{state}"\n')
    out = cli(tmp_path, "policy", "status")
    assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr
    assert "error: " in out.stderr and str(database) in out.stderr
    assert "server" not in out.stderr and "--verbose" not in out.stderr, out.stderr
    assert '[plugins.policy] store = "sqlite"' in out.stderr
