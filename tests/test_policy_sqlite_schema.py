"""The SQLite policy store's schema version (``PRAGMA user_version``).

Found by review: the file had no version, so a state file of another layout (an older or newer
release, another program's database) was used as it was. Now a new file gets
``SCHEMA_VERSION``; a file of version 0 holding our tables (made before files had a version) is
adopted; any other file is refused with ``policy_store_unavailable`` naming the file and the
versions, with a hint naming what to do, and is left as it was.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.sqlite_store import SCHEMA_VERSION, SQLiteStore
from amplifier_tools.builtins.policy.store import StoreUnavailable

#: The tables as every release before the schema version made them (``CREATE TABLE IF NOT EXISTS``).
UNVERSIONED = """
CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value REAL NOT NULL, expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS leases (key TEXT NOT NULL, holder TEXT NOT NULL, amount REAL NOT NULL,
                                   expires REAL NOT NULL, PRIMARY KEY (key, holder));
CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, holder TEXT, digest TEXT NOT NULL, value TEXT,
                                    expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, value TEXT NOT NULL, expires REAL NOT NULL);
"""


class Limited:
    spec = ToolSpec(name="limited", description="limited", effect="Pure",
                    policies={"rate_limit": {"limit": 2, "interval_ms": 3_600_000}})
    name, description = "limited", "limited"

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def planted(tmp_path: Path, script: str = "", *, version: int = 0, content: bytes | None = None) -> Path:
    """A policy file in the state directory, made as ``script`` and ``version`` (or ``content``) say."""
    path = state(tmp_path) / "policy.sqlite3"
    if content is not None:
        path.write_bytes(content)
    else:
        db = sqlite3.connect(path)
        db.executescript(script)
        db.execute(f"PRAGMA user_version = {version}")
        db.commit()
        db.close()
    path.chmod(0o600)
    return path


async def calls(tmp_path: Path, count: int, **policy: Any) -> list[ToolResult]:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(state(tmp_path)), "plugins": {"policy": {"store": "sqlite", **policy}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(Limited())], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")
    await host.start()
    try:
        return [await host.call("limited", {}) for _ in range(count)]
    finally:
        await host.close()


def version_of(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def assert_refused(result: ToolResult, path: Path, found: str) -> None:
    error = result.error
    assert error is not None and error["code"] == "policy_store_unavailable", error
    assert str(path) in error["message"] and found in error["message"], error["message"]
    assert error["retryable"] is False  # the same file answers the same way
    hint = error["hint"]
    assert "delete or move it" in hint and "state_dir" in hint and '[plugins.policy] store = "sqlite"' in hint


async def test_a_new_file_gets_the_schema_version_and_is_used_again_when_reopened(tmp_path: Path) -> None:
    first = await calls(tmp_path, 1)
    path = state(tmp_path) / "policy.sqlite3"
    assert first[0].success and version_of(path) == SCHEMA_VERSION == 1
    again = await calls(tmp_path, 2)  # a new host: the same file, the same window's count
    assert [r.success for r in again] == [True, False] and again[1].error["code"] == "rate_limited"


async def test_a_file_made_before_schema_versions_is_adopted_with_its_state(tmp_path: Path) -> None:
    path = planted(tmp_path, UNVERSIONED)
    assert [r.success for r in await calls(tmp_path, 1)] == [True]
    assert version_of(path) == SCHEMA_VERSION
    assert [r.success for r in await calls(tmp_path, 2)] == [True, False]  # its count was kept


async def test_a_file_of_version_0_with_only_some_of_our_tables_gets_the_rest(tmp_path: Path) -> None:
    path = planted(tmp_path, UNVERSIONED.split(";")[0] + ";")
    assert [r.success for r in await calls(tmp_path, 3)] == [True, True, False]
    assert version_of(path) == SCHEMA_VERSION


@pytest.mark.parametrize("version", [2, 99, -1])
async def test_a_file_of_another_schema_version_is_refused_and_left_as_it_was(tmp_path: Path, version: int) -> None:
    path = planted(tmp_path, UNVERSIONED, version=version)
    before = path.read_bytes()
    (result,) = await calls(tmp_path, 1)
    assert_refused(result, path, f"has schema version {version}; this release reads version {SCHEMA_VERSION}")
    assert path.read_bytes() == before and version_of(path) == version  # not switched to WAL, not written


async def test_a_file_of_another_program_is_refused(tmp_path: Path) -> None:
    path = planted(tmp_path, "CREATE TABLE counters (key TEXT PRIMARY KEY, value REAL NOT NULL, expires REAL NOT "
                             "NULL); CREATE TABLE customers (id INTEGER);")
    (result,) = await calls(tmp_path, 1)
    assert_refused(result, path, "tables that are not a policy store's (customers)")


async def test_a_table_of_ours_with_other_columns_is_refused(tmp_path: Path) -> None:
    path = planted(tmp_path, "CREATE TABLE counters (key TEXT PRIMARY KEY, total INTEGER);")
    (result,) = await calls(tmp_path, 1)
    assert_refused(result, path, "a table 'counters' of other columns")


async def test_a_file_that_is_not_a_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = planted(tmp_path, content=b"not a database, " * 512)
    (result,) = await calls(tmp_path, 1)
    assert_refused(result, path, "is not a SQLite database")


async def test_an_empty_file_is_set_up_as_a_new_store(tmp_path: Path) -> None:
    path = planted(tmp_path, content=b"")
    assert [r.success for r in await calls(tmp_path, 3)] == [True, True, False]
    assert version_of(path) == SCHEMA_VERSION


async def test_a_refused_file_is_decided_in_memory_with_store_unavailable_local(tmp_path: Path) -> None:
    planted(tmp_path, UNVERSIONED, version=2)
    results = await calls(tmp_path, 3, store_unavailable="local")
    assert [r.success for r in results] == [True, True, False]  # the documented fallback, in this process


def test_policy_status_of_a_file_of_another_version_prints_the_versions_and_the_hint(tmp_path: Path) -> None:
    path = planted(tmp_path, UNVERSIONED, version=3)
    (tmp_path / "amplifier-tools.toml").write_text(f'state_dir = "{state(tmp_path)}"\n')
    out = cli(tmp_path, "policy", "status")
    assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr
    assert f"{path} has schema version 3; this release reads version {SCHEMA_VERSION}" in out.stderr
    assert "hint: the file holds only policy state that expires" in out.stderr and "state_dir" in out.stderr


def _open_and_take(path: str, barrier: threading.Barrier, outcomes: list[Any]) -> None:
    store = SQLiteStore(path, "p:", 5.0)
    barrier.wait()
    try:
        outcomes.append(asyncio.run(store.take("rate", 3600.0, 100)) >= 0)
    except StoreUnavailable as exc:  # the failure the test below looks for
        outcomes.append(exc)
    finally:
        asyncio.run(store.close())


def test_processes_setting_up_one_new_file_at_once_all_use_it(tmp_path: Path) -> None:
    """Openers racing on one new file (threads, each with its own connection, as processes have):
    one creates the tables and the version, the others wait for its lock and find them."""
    for round_ in range(10):
        directory = tmp_path / f"race{round_}"
        directory.mkdir(mode=0o700)
        path = str(directory / "policy.sqlite3")
        barrier = threading.Barrier(4)
        outcomes: list[Any] = []
        threads = [threading.Thread(target=_open_and_take, args=(path, barrier, outcomes)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert outcomes == [True] * 4, outcomes
        assert version_of(Path(path)) == SCHEMA_VERSION and os.path.getsize(path) > 0
