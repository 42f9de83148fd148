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


# -- the short path against the general one --------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from amplifier_tools.mcp.client import _general_result  # noqa: E402

#: Any text a server's JSON can carry, lone surrogates (``"\ud800"``) and controls included.
TEXT = st.text(st.characters(codec=None, categories=None), max_size=40)
PNG_B64 = "iVBORw0KGgo="
ANNOTATIONS = st.fixed_dictionaries({}, optional={
    "audience": st.lists(st.sampled_from(["user", "assistant"]), max_size=2),
    "priority": st.floats(0, 1), "lastModified": st.just("2026-01-01T00:00:00Z")})
META_FIELD = st.dictionaries(st.sampled_from(["k", "progressToken", ""]), st.none() | st.integers() | TEXT, max_size=2)


@st.composite
def _text_block(draw: st.DrawFn) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(TEXT)}
    if draw(st.booleans()):
        block["annotations"] = draw(ANNOTATIONS | st.none())
    if draw(st.booleans()):
        block["_meta"] = draw(st.none() | META_FIELD)
    if draw(st.booleans()):
        block["unknownField"] = draw(st.none() | TEXT)  # a field MCP does not define
    return block


BLOCK = st.one_of(
    _text_block(), _text_block(),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "audio"]),
                           "data": st.sampled_from([PNG_B64, "not base64!", ""]),
                           "mimeType": st.sampled_from(["image/png", "no media type", "s3cr3t/x"])}),
    st.fixed_dictionaries({"type": st.just("resource_link"), "uri": st.just("file:///a"), "name": TEXT}),
    st.fixed_dictionaries({"type": st.just("resource"),
                           "resource": st.fixed_dictionaries({"uri": st.just("file:///n"), "text": TEXT})}),
)


@st.composite
def _result(draw: st.DrawFn) -> dict[str, Any]:
    # Half the results are one text block, the short path's shape, each near miss drawn apart.
    one_text = st.lists(_text_block(), min_size=1, max_size=1)
    wire: dict[str, Any] = {"content": draw(one_text | st.lists(BLOCK, max_size=3))}
    if draw(st.booleans()):
        wire["isError"] = draw(st.booleans())
    if draw(st.booleans()):
        wire["structuredContent"] = draw(st.dictionaries(TEXT, st.integers() | TEXT, max_size=2))
    if draw(st.booleans()):
        wire["_meta"] = draw(META_FIELD)
    return wire


def _tool_with_secrets(max_content_blocks: int) -> Any:
    tool = _tool(max_content_blocks)
    tool.connection.secrets = ("s3cr3t",)
    return tool


def _outcome(convert: Any, result: mcp_types.CallToolResult, tool: Any) -> tuple[Any, ...]:
    """What a caller sees of one conversion: the result's fields, or the error raised."""
    try:
        converted = convert(result, tool)
    except ExecutionError as error:
        return ("raised", type(error).__name__, error.code, error.message)
    except Exception as error:
        return ("raised", type(error).__name__, str(error))
    return ("returned", converted.success, type(converted.output), converted.output, converted.error,
            converted.metadata)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire=_result(), max_content_blocks=st.integers(0, 3))
def test_the_short_path_gives_what_the_general_path_gives_for_any_result_a_server_sends(
        wire: dict[str, Any], max_content_blocks: int) -> None:
    """Property: for any ``CallToolResult`` read from a server's JSON (as the SDK reads it), the
    conversion equals the general path's — outcome, output (type and value), error and metadata."""
    result = mcp_types.CallToolResult.model_validate(wire, by_name=False)
    tool = _tool_with_secrets(max_content_blocks)
    assert _outcome(to_tool_result, result, tool) == _outcome(_general_result, result, tool)


class _Text(mcp_types.TextContent):
    """A text block of another class (not the SDK's own): never taken for a bare one."""


class _Str(str):
    """A text that is no plain ``str``."""


@pytest.mark.parametrize("result", [
    mcp_types.CallToolResult(content=[_Text(type="text", text="5")]),
    mcp_types.CallToolResult(content=[mcp_types.TextContent.model_construct(type="text", text=_Str("5"))]),
    mcp_types.CallToolResult(content=[mcp_types.TextContent.model_construct(type="text", text=5)]),
    mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="no")], is_error=True),
    mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text='{"error": {"type": "X"}}')],
                             is_error=True),
    mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="5")], structured_content={}),
    mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="5", _meta={})]),
    mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="x" * 5_000_000)]),
], ids=["subclass", "str-subclass", "non-str", "is-error", "remote-error", "empty-structured", "empty-meta",
        "huge"])
def test_hostile_blocks_convert_as_the_general_path_converts_them(result: mcp_types.CallToolResult) -> None:
    """Results no server's JSON gives but a Python caller may build (a subclass, a text that is no
    ``str``), and the near misses of the short path: each converts as the general path does."""
    tool = _tool_with_secrets(64)
    assert _outcome(to_tool_result, result, tool) == _outcome(_general_result, result, tool)
