"""A result's images and files for a framework's model, under attack: what was found.

- Line-wrapped base64 (``base64.encodebytes``) hid a secret from the host's scrub (a line break
  inside the secret's encoding) and reached the model (and ``mcp serve``'s client) as a file that
  decodes to it: the scrub now looks in the canonical spelling and withholds such a block. Text
  that is no base64 went to the Agents SDK and LangChain as a data URL: only canonical base64 is
  media for an adapter now.
- 40,000 small blocks beside one image took two minutes of the event loop (the text joined again
  at every block); a media type with line breaks and a file name of a megabyte, or ``..``, or a
  Windows path, were passed on as they were.
- LangChain ``host_tool``: a file URL other than http(s)/file (``s3://``) was kept as the file's
  base64 data; ``"base64": None`` beside ``data``, or one item not read beside an image, made the
  whole list JSON text again, base64 and all, for the model and the audit record.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

from test_integration_images import _mount

from amplifier_tools import ToolContext, ToolHost, ToolResult, ToolSpec
from amplifier_tools.integrations._common import media_block, model_parts

SECRET = "sk-live-0123456789abcdefghijklmnopqrstuv"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()


class Blocks:
    def __init__(self, blocks: list[Any]) -> None:
        self.spec = ToolSpec(name="local::t.blocks", description="Blocks.", effect="Pure")
        self.name, self.description = self.spec.name, self.spec.description
        self.blocks = blocks

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=None, metadata={"content": self.blocks})


async def _call(tmp_path: Path, blocks: list[Any]) -> ToolResult:
    async with ToolHost(plugins=[_mount(Blocks(blocks))], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path) as host:
        return await host.call("t_blocks", {}, context=ToolContext(secrets={"TOKEN": SECRET}))


async def test_line_wrapped_base64_holding_a_secret_never_reaches_a_model(tmp_path: Path) -> None:
    wrapped = base64.encodebytes(b"A" * 30 + b"token=" + SECRET.encode()).decode()
    assert "\n" in wrapped.strip()  # the line break falls inside the secret's encoding
    result = await _call(tmp_path, [{"type": "text", "text": "notes"}, {"type": "resource", "resource": {
        "uri": "file:///notes.txt", "blob": wrapped, "mimeType": "text/plain"}}])
    # The host withholds it (mcp serve's client and Amplifier get the content as it is): before, a
    # blob that decodes to the secret.
    assert result.metadata["content"][1] == {
        "type": "text", "text": "[resource <file:///notes.txt> (text/plain): binary content withheld because it "
                                "contained a secret]"}
    urlsafe = base64.urlsafe_b64encode(b"\xfb\xef" * 20 + SECRET.encode()).decode()
    mixed = await _call(tmp_path, [{"type": "image", "data": urlsafe, "mimeType": "image/png"},
                                   {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                "data": wrapped}}])
    assert [block["type"] for block in mixed.metadata["content"]] == ["text", "text"]
    parts = model_parts(result) or []
    for part in parts:
        assert part[0] == "text", part  # before: a file part whose data decodes to the secret
        assert SECRET not in part[1]


def test_text_that_is_no_base64_is_not_sent_as_media() -> None:
    for data in ("not base64 at all!!", f"data:image/png;base64,{PNG}", PNG + "\n", PNG[:-1]):
        blocks = [{"type": "image", "data": data, "mimeType": "image/png"},
                  {"type": "image", "data": PNG, "mimeType": "image/png"}]
        result = ToolResult(output=None, metadata={"content": blocks})
        parts = model_parts(result)
        assert parts is not None and [part[0] for part in parts] == ["text", "image"], (data, parts)
        assert "not base64" in parts[0][1] and parts[1][1] == PNG


def test_many_small_blocks_beside_an_image_take_linear_time() -> None:
    blocks: list[Any] = [{"type": "resource_link", "uri": "file:///x", "name": "n" * 100} for _ in range(100_000)]
    blocks.append({"type": "image", "data": PNG, "mimeType": "image/png"})
    started = time.perf_counter()
    parts = model_parts(ToolResult(output=None, metadata={"content": blocks}), 50_000)
    assert time.perf_counter() - started < 5  # before: 40,000 blocks took 121 s
    assert parts is not None and [part[0] for part in parts] == ["text", "image"]
    assert "[Truncated:" in parts[0][1]


def test_media_type_and_file_name_are_bounded() -> None:
    def file_part(uri: str, mime: str) -> Any:
        result = ToolResult(output=None, metadata={"content": [
            {"type": "resource", "resource": {"uri": uri, "blob": PNG, "mimeType": mime}}]})
        parts = model_parts(result)
        assert parts is not None
        return parts[0]

    assert file_part("file:///a/report.pdf", "application/pdf")[2:] == ("application/pdf", "report.pdf")
    assert file_part("file:///a/b.pdf", "image/png\r\nX-Evil: 1")[2] == "application/octet-stream"
    assert file_part("file:///a/b/..", "text/plain")[3] == "file"
    assert file_part("file:///C:\\..\\..\\evil.exe", "text/plain")[3] == "evil.exe"
    assert len(file_part("file:///" + "n" * 1_000_000, "text/plain")[3]) == 255


def test_a_file_url_that_is_no_base64_stays_a_link() -> None:
    assert media_block("s3://bucket/key.pdf", None, "file", "key.pdf") == {
        "type": "resource_link", "uri": "s3://bucket/key.pdf", "name": "key.pdf"}  # before: its "base64"
    assert media_block(PNG, None, "file", "a.png")["resource"]["blob"] == PNG  # the SDK's file_data


def test_langchain_items_not_read_beside_an_image_do_not_turn_it_back_into_json() -> None:
    from amplifier_tools.integrations.langchain import _content_blocks

    blocks = _content_blocks([{"type": "text", "text": {"odd": 1}},
                              {"type": "image", "base64": None, "data": PNG, "mime_type": "image/png"},
                              {"type": "audio", "base64": PNG, "mime_type": "audio/wav"}])
    assert blocks == [{"type": "text", "text": '{"type": "text", "text": {"odd": 1}}'},
                      {"type": "image", "data": PNG, "mimeType": "image/png"},
                      {"type": "audio", "data": PNG, "mimeType": "audio/wav"}]  # before: None (JSON text)
    assert _content_blocks([{"type": "reasoning", "reasoning": "x"}, "y"]) is None  # no media: JSON as before
