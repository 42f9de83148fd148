"""The reverse direction: our tools mounted on amplifier-core's own coordinator.

Needs amplifier-core (the ``amplifier`` tox environment installs it); each call must still go
through our host: validation, policy and the audit record.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest

amplifier_core = pytest.importorskip("amplifier_core")

from amplifier_tools import amplifier_module  # noqa: E402


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("first\nsecond\n")
    config = tmp_path / "amplifier-tools.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      '[[plugins.policy.rules]]\nname = "no-secrets"\naction = "deny"\n'
                      'tools = ["local::fs.*"]\narguments = {"/path" = "*secret*"}\nreason = "not for agents"\n')
    return work


def _coordinator() -> Any:
    from amplifier_core.testing import create_test_coordinator

    return create_test_coordinator()


async def test_the_entry_point_names_this_modules_mount_function() -> None:
    """amplifier-core calls what the entry point loads (it named the module: 'module' object is not
    callable, found by a new-user trial)."""
    group = importlib.metadata.entry_points(group="amplifier.modules")
    found = [ep for ep in group if ep.name == "tool-amplifier-tools"]
    assert found and found[0].load() is amplifier_module.mount


async def test_amplifier_cores_module_loader_mounts_our_tools(workspace: Path) -> None:
    """The way an Amplifier session mounts a module named in its mount plan: ``ModuleLoader.load``."""
    from amplifier_core.loader import ModuleLoader

    coordinator = _coordinator()
    config = {"config": str(workspace.parent / "amplifier-tools.toml"), "working_dir": str(workspace),
              "tools": ["local::fs.read_file"]}
    mount = await ModuleLoader(coordinator=coordinator).load("tool-amplifier-tools", config)
    await mount(coordinator)
    try:
        result = await coordinator.get("tools")["fs_read_file"].execute({"path": "notes.txt"})
        assert isinstance(result, amplifier_core.ToolResult) and result.success
    finally:
        await coordinator.cleanup()


async def test_our_tools_run_on_amplifier_cores_coordinator_through_our_host(workspace: Path) -> None:
    coordinator = _coordinator()
    config = {"config": str(workspace.parent / "amplifier-tools.toml"), "working_dir": str(workspace),
              "tools": ["local::fs.read_file", "local::fs.write_file"]}
    await amplifier_module.mount(coordinator, config)
    try:
        tools = coordinator.get("tools")
        assert {"fs_read_file", "fs_write_file"} <= set(tools) and "fs_glob" not in tools  # only those named
        read = tools["fs_read_file"]
        assert read.input_schema["required"] == ["path"]

        ok = await read.execute({"path": "notes.txt", "_tool_call_id": "toolu_01"})
        assert isinstance(ok, amplifier_core.ToolResult) and ok.success
        assert "first" in json.dumps(ok.output)

        invalid = await read.execute({"path": 3})  # our input validation
        assert not invalid.success and invalid.error["type"] == "ContractError"
        assert invalid.error["code"] == "invalid_input"

        denied = await read.execute({"path": "secret.txt"})  # our policy rules
        assert not denied.success and denied.error["type"] == "PolicyError"
        assert "not for agents" in denied.error["message"]
    finally:
        await coordinator.cleanup()
    records = [json.loads(line) for line in (workspace.parent / "state" / "audit.jsonl").read_text().splitlines()]
    calls = [r for r in records if r["kind"] == "call"]
    assert [r["status"] for r in calls] == ["ok", "error", "error"]
    assert calls[0]["call_id"] == "toolu_01"  # Amplifier's call id is ours: the trails line up
    assert calls[0]["session_id"] == coordinator.session_id


async def test_a_tool_it_does_not_have_stops_the_mount(workspace: Path) -> None:
    from amplifier_tools import ConfigError

    with pytest.raises(ConfigError, match="names no tool of this host"):
        await amplifier_module.mount(_coordinator(), {"config": str(workspace.parent / "amplifier-tools.toml"),
                                                      "working_dir": str(workspace), "tools": ["local::nope"]})


async def test_amplifier_cores_own_tool_validator_accepts_the_module(workspace: Path) -> None:
    from amplifier_core.validation.tool import ToolValidator

    report = await ToolValidator().validate(
        "amplifier_tools.amplifier_module",
        config={"config": str(workspace.parent / "amplifier-tools.toml"), "working_dir": str(workspace),
                "tools": ["local::fs.read_file"]})
    assert report.passed, report.summary()


async def test_content_blocks_cross_in_both_directions(workspace: Path) -> None:
    """amplifier-core's own block objects from a seed tool are kept, and handed back to Amplifier."""
    from amplifier_core.models import ToolResult as AmplifierResult

    from amplifier_tools import ToolHost
    from amplifier_tools.amplifier_module import to_amplifier_result

    class Picture:
        name = "picture"
        description = "Return an image."
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> Any:
            return AmplifierResult(success=True, output="see image", content=[
                {"type": "text", "text": "see image"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}])

    async with ToolHost(plugins=[Picture()], builtins=False, entry_points=False, working_dir=workspace,
                        discover=False) as host:
        result = await host.call("picture", {})
    assert [b["type"] for b in result.metadata["content"]] == ["text", "image"]
    back = to_amplifier_result(result)
    assert back.content is not None and len(back.content) == 2
    assert back.model_dump()["content"][1]["source"]["media_type"] == "image/png"


async def test_an_amplifier_call_id_past_the_hosts_bound_still_runs_the_call(workspace: Path) -> None:
    """Amplifier hands the provider's tool-call id on as ``_tool_call_id``: one the host would refuse
    (longer than 128 characters, or with a control character) is mapped to a bounded stand-in as the
    framework integrations map theirs (found by review: the call was refused ``invalid_call_id``)."""
    coordinator = _coordinator()
    config = {"config": str(workspace.parent / "amplifier-tools.toml"), "working_dir": str(workspace),
              "tools": ["local::fs.read_file"]}
    await amplifier_module.mount(coordinator, config)
    try:
        read = coordinator.get("tools")["fs_read_file"]
        for odd in ("toolu_" + "x" * 200, "toolu_01\n"):
            result = await read.execute({"path": "notes.txt", "_tool_call_id": odd})
            assert result.success, result.error
    finally:
        await coordinator.cleanup()
    records = [json.loads(line) for line in (workspace.parent / "state" / "audit.jsonl").read_text().splitlines()]
    ids = [r["call_id"] for r in records if r["kind"] == "call"]
    assert len(ids) == 2 and all(i.startswith("toolu_") and len(i) <= 128 for i in ids)


class _Coordinator:
    """The part of an Amplifier coordinator ``amplifier_module.mount`` uses, with a session id."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.tools: dict[str, Any] = {}
        self.cleanups: list[Any] = []

    async def mount(self, kind: str, tool: Any, name: str) -> None:
        self.tools[name] = tool

    async def unmount(self, kind: str, name: str) -> None:
        self.tools.pop(name, None)

    def register_cleanup(self, cleanup: Any) -> None:
        self.cleanups.append(cleanup)


@pytest.mark.parametrize("session_id", ["s" * 300, "session\nforged"])
async def test_an_amplifier_session_id_the_host_refuses_leaves_the_calls_working(
        tmp_path: Path, session_id: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reverse direction set each call's ``session_id`` to the Amplifier session's: one the
    context refuses (too long, a control character) would make every call raise inside the
    session's tool. The calls keep the host's session id, and a warning says why."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("first\n")
    coordinator = _Coordinator(session_id)
    await amplifier_module.mount(coordinator, {"working_dir": str(work), "tools": ["local::fs.read_file"]})
    try:
        result = await coordinator.tools["fs_read_file"].execute({"path": "notes.txt"})
        assert result.success, result
    finally:
        for cleanup in coordinator.cleanups:
            await cleanup()
    assert any("calls are recorded under the host's session id" in r.getMessage() for r in caplog.records)
