"""Rich result content (``metadata["content"]``): what a model reads, what the audit log keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.content import MAX_SUMMARY_BLOCKS, amplifier_spelling, render, summary


def test_a_result_with_only_content_reads_as_one_line_per_block_and_output_still_wins() -> None:
    blocks = [{"type": "text", "text": "chart:"}, {"type": "image", "data": "QUJD", "mimeType": "image/svg+xml"}]
    assert ToolResult(output=None, metadata={"content": blocks}).get_serialized_output() == (
        "chart:\n[image: image/svg+xml, 3 bytes]")
    assert ToolResult(output="own text", metadata={"content": blocks}).get_serialized_output() == "own text"
    assert ToolResult(output=None).get_serialized_output() == ""


@pytest.mark.parametrize("block", [
    {"type": "image"}, {"type": "image", "data": 5, "mimeType": None}, {"type": "audio", "source": "x"},
    {"type": "resource"}, {"type": "resource", "resource": [1]}, {"type": "resource_link"},
    {"type": None}, {}, {"type": "hologram", "data": "x" * 10_000}, {"type": "text", "text": 3},
    {"type": "resource_link", "uri": "x\n" * 5_000, "name": "\x00" * 3},
])
def test_junk_blocks_are_rendered_summarized_and_converted_without_raising(block: dict[str, Any]) -> None:
    text = render([block])
    assert isinstance(text, str) and len(text) < 2_000
    (entry,) = summary([block])
    assert len(entry["sha256"]) == 64 and len(json.dumps(entry)) < 3_000
    assert amplifier_spelling(block)["type"] in ("text", "image")


def test_the_audit_summary_of_many_blocks_is_bounded_and_still_covers_every_block() -> None:
    blocks = [{"type": "text", "text": str(n)} for n in range(10_000)]
    entries = summary(blocks)
    assert len(entries) == MAX_SUMMARY_BLOCKS + 1
    assert entries[-1]["type"] == "more" and entries[-1]["blocks"] == 10_000 - MAX_SUMMARY_BLOCKS
    changed = [*blocks[:-1], {"type": "text", "text": "tampered"}]
    assert summary(changed)[-1]["sha256"] != entries[-1]["sha256"]


class _Album:
    name = "album"
    description = "Many pictures."
    spec = ToolSpec(name="album", effect="Pure")

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        picture = {"type": "image", "data": "QUJD" * 25_000, "mimeType": "image/png"}
        return ToolResult(output=None, metadata={"content": [picture] * 200})


class _AlbumPlugin:
    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", _Album())


async def test_the_audit_record_of_megabytes_of_content_holds_digests_not_data(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "audit.jsonl"
    async with ToolHost(config={"plugins": {"audit": {"path": str(log), "record_output": True}}},
                        plugins=[_AlbumPlugin()], builtins=["audit"], entry_points=False, discover=False,
                        working_dir=work) as host:
        result = await host.call("album", {})
    assert result.success and len(result.metadata["content"]) == 200
    (record,) = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("kind") == "call"]
    assert len(json.dumps(record)) < 20_000  # 20 MB of base64 in the result, a short line in the log
    first = record["content"][0]
    assert (first["type"], first["mimeType"]) == ("image", "image/png") and first["bytes"] > 100_000
    assert "data" not in first and first["sha256"] == record["content"][1]["sha256"]
    assert record["content"][-1]["blocks"] == 200 - MAX_SUMMARY_BLOCKS
