"""Idempotency records belong to a principal: another principal reusing a key is another call.

Each test runs on the in-process store and on the shared SQLite store (the CLI's default)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.builtins.policy import PolicyPlugin


class Vault:
    """Returns the caller's own secret; ``gate`` holds a run in flight."""

    def __init__(self) -> None:
        self.spec = ToolSpec(name="vault", description="vault", effect="IdempotentWrite", idempotency_key="required")
        self.name, self.description = "vault", "vault"
        self.runs: list[str] = []
        self.gate: asyncio.Event | None = None

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        self.runs.append(context.principal)
        if self.gate is not None:
            await self.gate.wait()
        return ToolResult(output={"secret_of": context.principal})


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def state(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "work").mkdir()
    return {"state_dir": str(tmp_path / "state"), "work": tmp_path / "work"}


async def _host(tool: Vault, store: str, state: dict[str, Any]) -> ToolHost:
    config = {"state_dir": state["state_dir"], "plugins": {"policy": {"store": store}}}
    host = ToolHost(config=config, plugins=[ToolsPlugin(tool), PolicyPlugin()], builtins=False, entry_points=False,
                    discover=False, working_dir=state["work"])
    await host.start()
    return host


async def test_another_principal_with_the_same_key_gets_a_fresh_run_never_the_first_result(
        store: str, state: dict[str, Any]) -> None:
    tool = Vault()
    host = await _host(tool, store, state)
    try:
        alice = await host.call("vault", {"v": 1}, context=ToolContext(principal="alice", idempotency_key="k"))
        bob = await host.call("vault", {"v": 1}, context=ToolContext(principal="bob", idempotency_key="k"))
    finally:
        await host.close()
    assert alice.output == {"secret_of": "alice"}
    assert bob.success and bob.output == {"secret_of": "bob"}
    assert not bob.metadata.get("replayed")
    assert tool.runs == ["alice", "bob"]


async def test_another_principal_with_other_arguments_is_not_a_conflict(
        store: str, state: dict[str, Any]) -> None:
    tool = Vault()
    host = await _host(tool, store, state)
    try:
        await host.call("vault", {"v": 1}, context=ToolContext(principal="alice", idempotency_key="k"))
        bob = await host.call("vault", {"v": 2}, context=ToolContext(principal="bob", idempotency_key="k"))
    finally:
        await host.close()
    assert bob.success and bob.output == {"secret_of": "bob"}


async def test_another_principal_is_not_blocked_while_the_first_call_with_the_key_is_in_flight(
        store: str, state: dict[str, Any]) -> None:
    tool = Vault()
    tool.gate = asyncio.Event()
    host = await _host(tool, store, state)
    try:
        alice = asyncio.ensure_future(
            host.call("vault", {"v": 1}, context=ToolContext(principal="alice", idempotency_key="k")))
        while not tool.runs:
            await asyncio.sleep(0.001)
        bob_task = asyncio.ensure_future(
            host.call("vault", {"v": 1}, context=ToolContext(principal="bob", idempotency_key="k").with_timeout(5)))
        while len(tool.runs) < 2 and not bob_task.done():
            await asyncio.sleep(0.001)
        assert tool.runs == ["alice", "bob"]  # bob runs while alice still holds her key
        tool.gate.set()
        bob = await bob_task
        first = await alice
    finally:
        await host.close()
    assert bob.success and bob.output == {"secret_of": "bob"}
    assert first.output == {"secret_of": "alice"}


async def test_the_same_principal_still_replays_its_own_result(
        store: str, state: dict[str, Any]) -> None:
    tool = Vault()
    host = await _host(tool, store, state)
    try:
        ctx = ToolContext(principal="alice", idempotency_key="k")
        first = await host.call("vault", {"v": 1}, context=ctx)
        again = await host.call("vault", {"v": 1}, context=ctx)
    finally:
        await host.close()
    assert again.success and again.output == first.output and again.metadata.get("replayed")
    assert tool.runs == ["alice"]


async def test_a_principal_containing_the_separator_cannot_reach_another_slot(
        store: str, state: dict[str, Any]) -> None:
    tool = Vault()
    host = await _host(tool, store, state)
    try:
        await host.call("vault", {"v": 1}, context=ToolContext(principal="a", idempotency_key="b:k"))
        other = await host.call("vault", {"v": 1}, context=ToolContext(principal="a:b", idempotency_key="k"))
    finally:
        await host.close()
    assert other.output == {"secret_of": "a:b"} and not other.metadata.get("replayed")
