"""Imported calls in the audit log and in failed results (issue 18): every record of an imported
tool's call names the exact definition (its hash) and the server's version, whatever the outcome,
and ``metadata["mcp"]`` stays on failed results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import fixture_server

from amplifier_tools import Deny, ToolHost, hookimpl


class _VetoIssues:
    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        return Deny("not today", code="vetoed") if call.name.endswith("issues.create") else None


def audited(tmp_path: Path, **server: Any) -> ToolHost:
    config = {"state_dir": str(tmp_path / "state"),
              "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                          "mcp": {"servers": {"fx": fixture_server(**server)}}}}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return ToolHost(config=config, builtins=["audit", "mcp"], plugins=[_VetoIssues()], entry_points=False,
                    working_dir=work, discover=False)


def records(tmp_path: Path) -> dict[str, dict[str, Any]]:
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    return {r["tool"]: r for r in map(json.loads, lines) if r.get("kind") == "call"}


async def test_records_of_imported_calls_name_the_definition_hash_and_server_version(tmp_path: Path) -> None:
    """Records carried the tool's name and a SemVer-or-0.0.0 version only; the docs promised they
    could be tied to the exact definition (found by a real-server trial)."""
    async with audited(tmp_path) as host:
        digests = {spec.name: next(t for t in spec.tags if t.startswith("sha256:")) for spec in host.specs}
        assert (await host.call("mcp::fx::echo", {"text": "hi"})).success
        assert not (await host.call("mcp::fx::fail", {})).success              # the server said isError
        assert not (await host.call("mcp::fx::add", {"a": "two", "b": 3})).success  # never sent: bad input
        assert not (await host.call("mcp::fx::issues.create", {"title": "x"})).success  # vetoed
        assert not (await host.call("mcp::fx::crash", {})).success             # the server died
    written = records(tmp_path)
    for tool in ("mcp::fx::echo", "mcp::fx::fail", "mcp::fx::add", "mcp::fx::issues.create", "mcp::fx::crash"):
        assert written[tool]["definition"] == {"sha256": digests[tool], "server_version": "1.4.2"}, tool


async def test_a_tool_without_a_definition_hash_has_no_definition_in_its_record(tmp_path: Path) -> None:
    from amplifier_tools.builtins.audit import definition_of
    from amplifier_tools.spec import ToolSpec

    assert definition_of(ToolSpec(name="local::x", tags=("fast",))) is None
    assert definition_of(None) is None


async def test_failed_results_keep_the_server_and_definition_in_their_metadata(tmp_path: Path) -> None:
    """``metadata["mcp"]`` was dropped from every failed result: an ``isError`` answer and a server
    that died mid-call came back with only the trail (found by a real-server trial)."""
    async with audited(tmp_path) as host:
        digest = {spec.name: next(t for t in spec.tags if t.startswith("sha256:")) for spec in host.specs}
        reported = await host.call("mcp::fx::fail", {})
        died = await host.call("mcp::fx::crash", {})
    assert reported.error is not None and reported.error["code"] == "mcp_tool_error"
    assert reported.metadata["mcp"] == {"server": "fx", "tool": "fail", "server_version": "1.4.2",
                                        "definition_sha256": digest["mcp::fx::fail"]}
    # The typed error is the same as when it was raised: category, code, retryable, details.
    assert died.error is not None
    assert (died.error["type"], died.error["code"], died.error["retryable"]) == (
        "ExecutionError", "mcp_server_died", True)
    assert "exit_status" in died.error
    assert died.metadata["mcp"]["definition_sha256"] == digest["mcp::fx::crash"]
    assert "trail" in died.metadata and "duration_ms" in died.metadata


async def test_a_bare_sdk_http_server_is_imported_with_pins_policies_and_audited_definitions(tmp_path: Path) -> None:
    """Issue 18: an SDK server started by the test (tests/mcp_fixtures/bare_http_server.py), imported
    over Streamable HTTP through the host with a pin and a scope policy; its records name the
    definition and the server's version like a stdio server's."""
    import subprocess
    import sys

    from mcp_helpers import FIXTURES

    from amplifier_tools import ToolContext

    process = subprocess.Popen([sys.executable, str(FIXTURES / "bare_http_server.py")], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        work = tmp_path / "work"
        work.mkdir()

        def host(**server: Any) -> ToolHost:
            config = {"state_dir": str(tmp_path / "state"),
                      "tools": {"mcp::web::add": {"security": {"required_scopes": ["math"]}}},
                      "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                                  "mcp": {"servers": {"web": {"url": url, **server}}}}}
            return ToolHost(config=config, builtins=["audit", "policy", "mcp"], entry_points=False,
                            working_dir=work, discover=False)

        async with host() as first:
            add = next(s for s in first.specs if s.name == "mcp::web::add")
            digest = next(t for t in add.tags if t.startswith("sha256:"))
        async with host(pins={"add": digest}, require_pins=True) as pinned:
            assert [s.name for s in pinned.specs] == ["mcp::web::add"]  # big has no pin: not mounted
            denied = await pinned.call("mcp::web::add", {"a": 2, "b": 3})
            assert denied.error is not None and denied.error["type"] in ("AuthError", "PolicyError"), denied.error
            ok = await pinned.call("mcp::web::add", {"a": 2, "b": 3}, context=ToolContext(scopes={"math"}))
            assert ok.success and ok.output == "5", ok.error
            assert ok.metadata["mcp"] == {"server": "web", "tool": "add", "server_version": "2.0.0",
                                          "definition_sha256": digest}
    finally:
        process.terminate()
        process.wait(10)
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    calls = [r for r in lines if r.get("kind") == "call"]
    assert [r["status"] for r in calls] == ["error", "ok"]
    assert all(r["definition"] == {"sha256": digest, "server_version": "2.0.0"} for r in calls)


async def test_a_callers_deadline_bounds_an_imported_call_and_cancels_it_on_the_server(tmp_path: Path) -> None:
    """The SDK's own per-request timer is gone (the host's deadline bounds the call, bench_mcp):
    a deadline from the caller's context, with no timeout policy, still ends the call in time and
    reaches the server as a cancellation."""
    import asyncio
    import time

    from amplifier_tools import ToolContext

    marker = tmp_path / "cancelled"
    async with audited(tmp_path, env={"FIXTURE_CANCEL_FILE": str(marker)}) as host:
        started = time.monotonic()
        result = await host.call("mcp::fx::sleep", {"seconds": 30}, context=ToolContext().with_timeout(0.5))
        assert result.error is not None and result.error["code"] in ("timeout", "deadline_exceeded"), result.error
        assert time.monotonic() - started < 15
        for _ in range(1000):
            if marker.exists():
                break
            await asyncio.sleep(0.02)
        assert marker.read_text() == "cancelled"
