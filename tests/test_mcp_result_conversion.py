"""``mcp.client.to_tool_result``: an imported tool's ``CallToolResult`` as the host's ``ToolResult``.

One bare text block (most results) takes a short path; these tests pin that it gives what the
general path gives, and that every other shape still takes the general path."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("mcp")

import mcp_types

from amplifier_tools.errors import ExecutionError
from amplifier_tools.mcp.client import ServerConnection, to_tool_result

META = {"server": "s", "tool": "t", "server_version": "1", "definition_sha256": "ab" * 32}


def _tool(max_content_blocks: int = 64) -> Any:
    connection = SimpleNamespace(settings=SimpleNamespace(max_content_blocks=max_content_blocks), secrets=(),
                                 name="s")
    connection.too_many_blocks = lambda blocks: ServerConnection.too_many_blocks(connection, blocks)  # type: ignore[arg-type]
    return SimpleNamespace(name="mcp::s::t", connection=connection, call_metadata=lambda: dict(META))


def test_one_bare_text_block_is_the_output_as_it_is() -> None:
    result = to_tool_result(mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="5")]), _tool())
    assert (result.success, result.output, result.error) == (True, "5", None)
    assert result.metadata == {"mcp": META}  # the output alone carries the block: no copy of it


@pytest.mark.parametrize("block", [
    mcp_types.TextContent(type="text", text="5", annotations=mcp_types.Annotations(priority=0.5)),
    mcp_types.TextContent(type="text", text="5", _meta={"k": "v"}),
])
def test_a_text_block_carrying_more_than_its_text_keeps_the_block(block: mcp_types.TextContent) -> None:
    result = to_tool_result(mcp_types.CallToolResult(content=[block]), _tool())
    assert result.success and result.output == "5"
    assert result.metadata["content"] == [block.model_dump(by_alias=True, mode="json", exclude_none=True)]


def test_an_error_a_structured_result_and_a_block_limit_take_the_general_path() -> None:
    text = [mcp_types.TextContent(type="text", text="no")]
    failed = to_tool_result(mcp_types.CallToolResult(content=text, is_error=True), _tool())
    assert not failed.success and failed.error is not None and failed.error["code"] == "mcp_tool_error"
    structured = to_tool_result(mcp_types.CallToolResult(content=text, structured_content={"n": 1}), _tool())
    assert structured.success and structured.output == {"n": 1}
    with pytest.raises(ExecutionError) as caught:
        to_tool_result(mcp_types.CallToolResult(content=text), _tool(max_content_blocks=0))
    assert caught.value.code == "mcp_too_many_content_blocks"
