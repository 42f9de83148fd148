"""The SQLite policy store at the edges: a cancelled call, a closing host, a full disk, a file
swapped for a symlink, and an idempotency claim that must outlive the call's queueing."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ConfigError, ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy.sqlite_store import SCHEMA


class Slow:
    """Holds its one concurrency slot until cancelled."""

    spec = ToolSpec(name="slow", description="Hold the slot.", effect="Pure",
                    policies={"concurrency": {"limit": 1, "queue": False}, "timeout_ms": 60000})
    name, description = spec.name, spec.description

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.started.set()
        await asyncio.sleep(30)
        return ToolResult(output="done")


class Quick:
    spec = ToolSpec(name="quick", description="Count against a rate limit.", effect="Pure",
                    policies={"rate_limit": {"limit": 1000, "interval_ms": 60000, "per": "principal"}})
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


def _host(tmp_path: Path, *tools: Any) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": "sqlite", "store_timeout_ms": 500}}}
    return ToolHost(config=config, plugins=[ToolsPlugin(*tools)], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work")


def _leases(tmp_path: Path) -> list[Any]:
    with sqlite3.connect(tmp_path / "state" / "policy.sqlite3") as db:
        return db.execute("SELECT key, holder FROM leases").fetchall()


async def test_a_cancelled_call_gives_its_lease_back(tmp_path: Path) -> None:
    tool = Slow()
    async with _host(tmp_path, tool) as host:
        task = asyncio.ensure_future(host.call("slow", {}))
        await tool.started.wait()
        assert len(_leases(tmp_path)) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _leases(tmp_path) == []
        follower = asyncio.ensure_future(host.call("slow", {}))  # the slot is free again
        await asyncio.wait_for(tool.started.wait(), 5)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_closing_the_host_with_a_call_in_flight_gives_the_lease_back(tmp_path: Path) -> None:
    tool = Slow()
    host = _host(tmp_path, tool)
    await host.start()
    task = asyncio.ensure_future(host.call("slow", {}))
    await tool.started.wait()
    await host.close()
    await asyncio.gather(task, return_exceptions=True)
    assert _leases(tmp_path) == []


async def test_a_wal_file_swapped_for_a_symlink_never_writes_through_it(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "state" / "policy.sqlite3-wal")
    async with _host(tmp_path, Quick()) as host:
        await host.call("quick", {})
    assert victim.read_text() == "precious\n"


async def test_a_full_disk_fails_calls_closed_and_the_store_recovers(tmp_path: Path) -> None:
    async with _host(tmp_path, Quick()) as host:
        assert (await host.call("quick", {})).success
        store: Any = host.plugin_manager.get_plugin("policy").shared.store  # type: ignore[union-attr]
        db = store._db
        db.execute("CREATE TABLE filler(x)")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages + 3}")
        with pytest.raises(sqlite3.Error):  # the database cannot grow: what a full disk looks like to SQLite
            while True:
                db.execute("INSERT INTO filler VALUES (randomblob(3000))")
        # Each new principal needs a new counter row: sooner or later one needs a page there is none of.
        outcomes = [await host.call("quick", {}, context=ToolContext(principal=f"p{i}")) for i in range(300)]
        failed = [r for r in outcomes if not r.success]
        assert failed and all(r.error["code"] == "policy_store_unavailable" for r in failed)
        assert not any(r.success for r in outcomes[outcomes.index(failed[0]):])  # closed from then on
        db.execute("DROP TABLE filler")
        db.execute("PRAGMA max_page_count = 1073741823")
        assert (await host.call("quick", {})).success


class Writer:
    """An idempotent write behind a concurrency cap of 1 (so a call can queue)."""

    spec = ToolSpec(name="writer", description="Write once.", effect="IdempotentWrite", idempotency_key="optional",
                    policies={"concurrency": {"limit": 1, "queue": True}, "timeout_ms": 5000})
    name, description = spec.name, spec.description

    def __init__(self) -> None:
        self.runs: list[str | None] = []

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        self.runs.append(context.idempotency_key)
        await asyncio.sleep(input["hold"])
        return ToolResult(output="done")


@pytest.mark.slow
async def test_an_idempotency_claim_outlives_the_calls_queueing_and_run(tmp_path: Path) -> None:
    """Found by review: the claim lasted the call's longest run from when it was taken, before the
    call queued for its slot; a duplicate arriving after that ran the write a second time."""
    tool = Writer()
    async with _host(tmp_path, tool) as host:
        started = time.monotonic()
        blocker = asyncio.ensure_future(host.call("writer", {"hold": 4.5}))
        await asyncio.sleep(0.1)
        first = asyncio.ensure_future(host.call("writer", {"hold": 4.0}, context=ToolContext(idempotency_key="K")))
        await asyncio.sleep(7.3 - (time.monotonic() - started))  # past 5 s + grace, with `first` still running
        duplicate = await host.call("writer", {"hold": 4.0}, context=ToolContext(idempotency_key="K"))
        await asyncio.gather(blocker, first)
    assert tool.runs.count("K") == 1
    assert duplicate.success and duplicate.metadata.get("replayed")


async def test_a_host_starting_while_another_process_sets_up_the_new_file_waits_for_it(tmp_path: Path) -> None:
    """Found broken in CI: 4 hosts starting on one new store file, and 7 calls of one failed
    closed with ``database is locked``. Switching to WAL while another process holds the new
    (rollback-journal) file's write lock is refused at once, without SQLite's busy timeout;
    the store now retries its setup within ``store_timeout_ms``."""
    async with _host(tmp_path, Quick()) as host:
        assert not (tmp_path / "state" / "policy.sqlite3").exists()  # the store opens it on first use
        other = sqlite3.connect(tmp_path / "state" / "policy.sqlite3", isolation_level=None, check_same_thread=False)
        os.chmod(tmp_path / "state" / "policy.sqlite3", 0o600)
        # Another process creating the file (one of the store's own tables: a file with any other
        # table is refused), not yet in WAL mode
        other.execute(SCHEMA["counters"])
        other.execute("BEGIN IMMEDIATE")  # and holding its write lock
        release = threading.Timer(0.2, other.execute, ("COMMIT",))  # while the first call's setup backs off
        release.start()
        try:
            result = await host.call("quick", {})
        finally:
            release.join()
            other.close()
    assert result.success, result.error
    assert result.output == "done"


async def test_a_new_file_locked_for_good_fails_the_call_closed_within_the_store_timeout(tmp_path: Path) -> None:
    async with _host(tmp_path, Quick()) as host:
        other = sqlite3.connect(tmp_path / "state" / "policy.sqlite3", isolation_level=None)
        os.chmod(tmp_path / "state" / "policy.sqlite3", 0o600)
        other.execute(SCHEMA["counters"])
        other.execute("BEGIN IMMEDIATE")  # never released during the call
        try:
            started = time.monotonic()
            result = await host.call("quick", {})
            waited = time.monotonic() - started
        finally:
            other.close()
    assert not result.success and result.error["code"] == "policy_store_unavailable"
    assert 0.4 <= waited < 5  # store_timeout_ms = 500: retried that long, then closed


@pytest.mark.parametrize("spelling", [
    "unix://{work}/redis.sock",
    "unix://{quoted}/redis.sock",  # %xx, as redis-py decodes it (found by attack: protected as written)
    "unix://{tmp}/link/../redis.sock",  # .. after a symlink, as the kernel resolves it (found by attack)
    "unix://?path={work}/redis.sock",  # the path in the query (found by attack: the cwd was protected)
])
def test_a_redis_socket_inside_the_working_directory_is_refused_at_start(tmp_path: Path, spelling: str) -> None:
    """Found by attack: with ``store = "unix://<working dir>/redis.sock"`` a sandboxed bash command
    replaced the socket with a fake server answering every decision with "admitted"."""
    pytest.importorskip("redis")
    work = tmp_path / "work"
    work.mkdir()
    (work / "sub").mkdir()
    os.symlink(work / "sub", tmp_path / "link")  # link/.. is work/sub/.. = work (written: tmp_path)
    quoted = str(work)[:-1] + "%" + format(ord(str(work)[-1]), "02x")
    store = spelling.format(work=work, tmp=tmp_path, quoted=quoted)
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": store}}}
    host = ToolHost(config=config, builtins=["policy"], entry_points=False, discover=False, working_dir=work)
    with pytest.raises(ConfigError) as caught:
        asyncio.run(host.start())
    assert caught.value.key == "plugins.policy.store"
    assert "redis.sock" in str(caught.value) and "writable root" in str(caught.value)


async def test_a_redis_socket_outside_the_writable_roots_is_a_protected_path(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    work = tmp_path / "work"
    work.mkdir()
    socket_path = tmp_path / "run" / "redis.sock"
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"policy": {"store": f"unix://{socket_path}"}}}
    async with ToolHost(config=config, builtins=["policy"], entry_points=False, discover=False,
                        working_dir=work) as host:
        entry = host.protected_paths.protects(str(socket_path))
        assert entry is not None and entry.reason == "the policy store's Redis socket"


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://h:6379/0?password=hunter2", "redis://h:6379/0"),  # found by attack: shown as given
    ("redis://:hunter2@h:6379/0", "redis://h:6379/0"),
    ("rediss://user:hunter2@h:6380/2", "rediss://h:6380/2"),
    ("unix:///run/redis.sock?db=1&password=hunter2", "unix:///run/redis.sock?db=1"),
])
def test_a_redis_password_is_never_shown(url: str, shown: str, tmp_path: Path) -> None:
    """``policy status``, store errors (which the model sees) and the audit trail show ``where``."""
    pytest.importorskip("redis")
    from amplifier_tools.builtins.policy.store import open_store

    store = open_store(url, "t:", 1.0, tmp_path)
    try:
        assert store.where == shown
    finally:
        asyncio.run(store.close())


class Capped:
    spec = ToolSpec(name="capped", description="capped", effect="Pure",
                    policies={"concurrency": {"limit": 2}, "rate_limit": {"limit": 50, "interval_ms": 1000},
                              "timeout_ms": 200})  # a deadline under the store timeout
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="done")


async def test_a_store_file_swapped_for_a_symlink_fails_closed_and_leaves_no_coroutine_behind(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: the refusal came with ``RuntimeWarning: coroutine 'SQLiteStore.lease' was
    never awaited`` (the bound is set, and the file opened, after the operation was made)."""
    import gc
    import warnings

    (tmp_path / "state").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "state" / "policy.sqlite3")
    # No log records: pytest keeps them, and with them the failure's traceback and its frames.
    caplog.set_level(logging.CRITICAL + 1, logger="amplifier_tools")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with _host(tmp_path, Capped()) as host:
            result = await host.call("capped", {})
        failed = not result.success
        del result, host
        gc.collect()
    assert failed and victim.read_text() == "precious\n"
    assert not [w for w in caught if "never awaited" in str(w.message)]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/abc", "rediss://h:6380/0x1", "redis://h:1/-1"])
def test_a_redis_database_that_is_no_number_is_refused(url: str) -> None:
    """Found by attack: redis-py took ``/abc`` as database 0, silently."""
    pytest.importorskip("redis")
    from amplifier_tools.builtins.policy.store import open_store

    with pytest.raises(ConfigError) as caught:
        open_store(url, "t:", 1.0, None)
    assert caught.value.key == "plugins.policy.store" and "must be a number" in str(caught.value)


async def test_calls_without_a_short_deadline_run_no_busy_timeout_pragma(tmp_path: Path) -> None:
    """Found by attack: the releases set SQLite's busy timeout to what was left of a shared bound
    (1999 ms) and the next admission back to 2000: two statements per call the docs say it runs none of."""
    async with _host(tmp_path, Slow()) as host:
        store: Any = host.plugin_manager.get_plugin("policy").shared.store  # type: ignore[union-attr]
        task = asyncio.ensure_future(host.call("slow", {}))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        for _ in range(5):
            task = asyncio.ensure_future(host.call("slow", {}))
            await asyncio.sleep(0.02)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert len([s for s in statements if "INSERT" in s or "DELETE" in s]) >= 5  # it did decide and release
        assert [s for s in statements if "busy_timeout" in s] == []


@pytest.mark.parametrize("value", ["redis+tls://:s3cret@127.0.0.1:1/0", " redis://:s3cret@127.0.0.1:1/0",
                                   "postgres://u:s3cret@db/0"])
def test_a_refused_store_setting_never_shows_its_value(value: str) -> None:
    """Found by attack: the settings check printed the whole URL, password included."""
    from amplifier_tools.builtins.policy.settings import PolicySettings
    from amplifier_tools.plugin_settings import structure_settings

    with pytest.raises(ConfigError) as caught:
        structure_settings({"store": value}, PolicySettings, "plugins.policy")
    assert caught.value.key == "plugins.policy.store" and "s3cret" not in str(caught.value)


def test_a_store_url_scheme_is_taken_in_any_case() -> None:
    from amplifier_tools.builtins.policy.settings import PolicySettings
    from amplifier_tools.plugin_settings import structure_settings

    settings = structure_settings({"store": "REDIS://127.0.0.1:6379/0"}, PolicySettings, "plugins.policy")
    assert settings.store == "redis://127.0.0.1:6379/0"
