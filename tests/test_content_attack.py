"""Attacks on tool results and rich content end to end: what a model reads
(``get_serialized_output``), what ``serve-mcp`` sends, what the audit log keeps."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.errors import ExecutionError

pytest.importorskip("mcp")

from mcp import Client

from amplifier_tools.mcp.server import build_server
from amplifier_tools.mcp.settings import ServeSettings


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    __repr__ = __str__


class _Returns:
    """A tool returning a fixed result (or raising a fixed error)."""

    description = "Returns what it was given."

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.spec = ToolSpec(name=name, effect="Pure")
        self.value = value

    async def execute(self, input: dict[str, Any]) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


def _strict(text: str) -> Any:
    """``text`` parsed as JSON that RFC 8259 allows (no NaN or Infinity)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _call_records(log: Path, tool: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("kind") == "call" and r["tool"] == tool]


@pytest.mark.parametrize("block", [
    {"type": "text", "text": 10**5000}, {"type": "text", "text": _Unprintable()}, {"type": _Unprintable()},
], ids=["huge-int-text", "unprintable-text", "unprintable-type"])
async def test_a_content_block_that_cannot_be_shown_is_a_line_for_the_model_not_a_raise(
        tmp_path: Path, block: dict[str, Any]) -> None:
    """HEAD: ``get_serialized_output`` raised ``ValueError``/``RuntimeError`` after the call had
    succeeded and been recorded, and ``serve-mcp`` answered the call with a JSON-RPC internal error."""
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "audit.jsonl"
    tool = _Returns("shows", ToolResult(output=None, metadata={"content": [{"type": "text", "text": "before"}, block]}))
    async with ToolHost(config={"plugins": {"audit": {"path": str(log)}}}, plugins=[ToolsPlugin(tool)],
                        builtins=["audit"], entry_points=False, discover=False, working_dir=work) as host:
        result = await host.call("shows", {})
        assert result.success, result.error
        text = result.get_serialized_output()
        assert text.splitlines()[0] == "before" and "could not be read" in text.splitlines()[1]
        async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
            served = await client.call_tool("shows", {})
    assert not served.is_error
    assert [block.text for block in served.content] == [text]  # type: ignore[union-attr]
    assert len(_call_records(log, "shows")) == 2  # one record per call: host.call and the served one


@pytest.mark.parametrize(("detail", "written"), [
    (float("nan"), "NaN"), (float("-inf"), "-Infinity"), (10**5000, "<integer of 16610 bits>"),
], ids=["nan", "infinity", "huge-int"])
async def test_a_failure_whose_error_detail_json_cannot_hold_is_served_as_its_typed_error(
        host_factory: Any, detail: Any, written: str) -> None:
    """``serve-mcp`` sends a failure as ``{"error": {...}}`` text. HEAD: a detail of an integer over
    4,300 digits made the call a JSON-RPC internal error (the client never saw the typed error),
    and NaN or an infinity was written as a token no strict JSON parser reads."""
    host = await host_factory(ToolsPlugin(_Returns("fails", ExecutionError("the ratio is off", ratio=detail))))
    result = await host.call("fails", {})
    assert result.error is not None and result.error["message"] == "the ratio is off"
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        served = await client.call_tool("fails", {})
    assert served.is_error
    error = _strict(served.content[0].text)["error"]  # type: ignore[union-attr]
    assert (error["type"], error["code"], error["message"]) == ("ExecutionError", "execution_failed",
                                                                "the ratio is off")
    assert error["ratio"] == written


class _Upstream:
    """A tool passing on an upstream API's error as it came (its own keys beside the message)."""

    name = "upstream"
    description = "Calls an upstream API."

    def __init__(self, extra: dict[str, Any]) -> None:
        self.spec = ToolSpec(name="upstream", effect="Pure")
        self.extra = extra
        self.runs = 0

    async def execute(self, input: dict[str, Any]) -> Any:
        self.runs += 1
        return {"success": False, "error": {"message": "upstream said no", **self.extra}}


@pytest.mark.parametrize("extra", [{"plugin": "wp-seo"}, {"by_deadline": True}, {"trace_id": "forged"}],
                         ids=["plugin", "by_deadline", "trace_id"])
async def test_a_tools_reported_error_cannot_set_the_fields_only_the_host_sets(
        host_factory: Any, extra: dict[str, Any]) -> None:
    """HEAD: the tool's failure was attributed to a plugin ``wp-seo`` that does not exist (or read as
    cut by the caller's deadline), so the policy plugin never counted it: the breaker
    (``failure_threshold = 2``) stayed closed and the failing tool ran on every call."""
    from amplifier_tools.builtins.policy import PolicyPlugin

    tool = _Upstream(extra)
    config = {"tools": {"upstream": {"policies": {"circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 60_000}}}}}
    host = await host_factory(ToolsPlugin(tool), PolicyPlugin(), config=config)
    first = await host.call("upstream", {})
    assert first.error is not None and first.error["message"] == "upstream said no"
    assert first.error.get("plugin") is None and "by_deadline" not in first.error
    assert first.error.get("trace_id") != "forged"
    for _ in range(3):
        last = await host.call("upstream", {})
    assert tool.runs == 2  # the breaker opened after two failures
    assert last.error is not None and (last.error["code"], last.error["plugin"]) == ("circuit_open", "policy")


class _SeedWithSdkBlocks:
    """A seed tool whose ``content`` holds the MCP SDK's own pydantic blocks."""

    name = "snapshot"
    description = "Returns a picture as MCP SDK blocks."

    async def execute(self, input: dict[str, Any]) -> Any:
        import mcp_types

        return {"success": True, "output": None, "content": [
            mcp_types.TextContent(type="text", text="the screen:"),
            mcp_types.ImageContent(type="image", data=_PNG, mime_type="image/png")]}


_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


async def test_a_seed_results_mcp_sdk_blocks_keep_their_media_type_and_are_served_as_blocks(host_factory: Any) -> None:
    """HEAD: the blocks were dumped by their Python names (``mime_type``, ``"annotations": None``):
    the image read ``[image: unknown type, 70 bytes]`` and ``serve-mcp`` sent one text block
    instead of the picture."""
    host = await host_factory(ToolsPlugin(_SeedWithSdkBlocks()))
    result = await host.call("snapshot", {})
    assert result.success, result.error
    assert result.metadata["content"] == [{"type": "text", "text": "the screen:"},
                                          {"type": "image", "data": _PNG, "mimeType": "image/png"}]
    assert result.get_serialized_output() == "the screen:\n[image: image/png, 70 bytes]"
    async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
        served = await client.call_tool("snapshot", {})
    assert [block.type for block in served.content] == ["text", "image"]
    assert served.content[1].mime_type == "image/png" and served.content[1].data == _PNG  # type: ignore[union-attr]


class _Unreadable(dict):  # type: ignore[type-arg]
    """A block whose ``get`` raises."""

    def get(self, *args: Any) -> Any:
        raise RuntimeError("get")


class _Unlistable(list):  # type: ignore[type-arg]
    """Content whose iteration raises."""

    def __iter__(self) -> Any:
        raise RuntimeError("iter")


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": "fine"}, _Unreadable(type="text")], _Unlistable([{"type": "text", "text": "fine"}]),
], ids=["unreadable-block", "unlistable-content"])
async def test_content_that_cannot_be_read_is_scrubbed_recorded_and_served_without_a_raise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: list[Any]) -> None:
    """HEAD, with a secret registered (any ``[secrets]`` entry): the host's scrub of the content
    raised ``RuntimeError`` out of ``host.call``, with no ``tool_complete`` and no audit record;
    content whose iteration raises also failed the audit plugin, and ``serve-mcp`` and the
    Amplifier bridge raised on both."""
    monkeypatch.setenv("CONTENT_ATTACK_SECRET", "content-attack-secret-1")
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "audit.jsonl"
    tool = _Returns("odd", ToolResult(output="the output", metadata={"content": content}))
    config = {"secrets": {"s": "CONTENT_ATTACK_SECRET"}, "plugins": {"audit": {"path": str(log)}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(tool)], builtins=["audit"], entry_points=False,
                        discover=False, working_dir=work) as host:
        result = await host.call("odd", {})
        assert result.success, result.error
        assert result.get_serialized_output() == "the output"
        async with Client(build_server(host, ServeSettings(tools=("*",)))) as client:
            served = await client.call_tool("odd", {})
        if importlib.util.find_spec("amplifier_core") is not None:
            from amplifier_tools.amplifier_module import to_amplifier_result

            assert to_amplifier_result(result).output == "the output"
    assert not served.is_error and [block.text for block in served.content] == ["the output"]  # type: ignore[union-attr]
    assert [r["status"] for r in _call_records(log, "odd")] == ["ok", "ok"]
