"""A tool's images and files reach each framework's model as that framework's image and file
parts. Found by trial: every adapter showed a model a tool's image as a line naming it
(``[image: image/png, 67 bytes]``), never the picture, though each framework can send one."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import BinaryContent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from test_integration_openai_agents import ScriptedModel, call, say

from amplifier_tools import ToolHost, ToolResult, ToolSpec
from amplifier_tools.integrations.openai_agents import function_tools
from amplifier_tools.integrations.pydantic_ai import AmplifierToolset

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
PDF = base64.b64encode(b"%PDF-1.4 a report").decode()


class Chart:
    """Draws a chart: a text block, an image and an embedded PDF, as an MCP server would send them."""

    spec = ToolSpec(name="local::report.chart", description="Draw a chart.", effect="Pure")
    name, description = spec.name, spec.description

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        blocks = [{"type": "text", "text": "sales by month"},
                  {"type": "image", "data": PNG, "mimeType": "image/png"},
                  {"type": "resource", "resource": {"uri": "file:///reports/q3.pdf", "blob": PDF,
                                                    "mimeType": "application/pdf"}}]
        output = input.get("output")
        return ToolResult(output=output, metadata={"content": blocks})


@pytest.fixture
async def chart_host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[_mount(Chart())], builtins=["audit"], entry_points=False, discover=False,
                        working_dir=work, config={"state_dir": str(tmp_path / "state"),
                                                  "plugins": {"audit": {"fsync": "never"}}}) as host:
        yield host


def _mount(tool: Any) -> Any:
    from amplifier_tools import hookimpl

    class Mount:
        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", tool)

    return Mount()


async def test_openai_agents_gets_image_and_file_parts(chart_host: ToolHost) -> None:
    seen: dict[str, Any] = {}

    def report(outputs: dict[str, Any]) -> list[Any]:
        seen.update(outputs)
        return [say("done")]

    model = ScriptedModel(lambda outputs: [call("report_chart", "c1", {})], report)
    agent = Agent(name="a", model=model, tools=function_tools(chart_host))
    await Runner.run(agent, "chart", run_config=RunConfig(tracing_disabled=True))
    assert seen["c1"] == [
        {"type": "input_text", "text": "sales by month"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
        {"type": "input_file", "file_data": f"data:application/pdf;base64,{PDF}", "filename": "q3.pdf"},
    ]


async def test_an_output_beside_the_images_comes_first_and_text_is_cut_at_max_output_chars(
        chart_host: ToolHost) -> None:
    seen: dict[str, Any] = {}
    model = ScriptedModel(lambda outputs: [call("report_chart", "c1", {"output": "x" * 100})],
                          lambda outputs: (seen.update(outputs), [say("done")])[1])
    agent = Agent(name="a", model=model, tools=function_tools(chart_host, max_output_chars=10))
    await Runner.run(agent, "chart", run_config=RunConfig(tracing_disabled=True))
    parts = seen["c1"]
    assert parts[0] == {"type": "input_text", "text": "x" * 10 + "\n\n[Truncated: 90 of 100 characters omitted]"}
    assert [part["type"] for part in parts[1:]] == ["input_image", "input_file"]


async def test_pydantic_ai_gets_binary_content(chart_host: ToolHost) -> None:
    returned: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests = [part for message in messages if isinstance(message, ModelRequest) for part in message.parts]
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("report_chart", {}, tool_call_id="c1")])
        returned.extend(item for part in requests if isinstance(part, ToolReturnPart)
                        for item in (part.content if isinstance(part.content, list) else [part.content]))
        return ModelResponse(parts=[TextPart(json.dumps("done"))])

    agent = PydanticAgent(FunctionModel(model), toolsets=[AmplifierToolset(chart_host)])
    await agent.run("chart")
    assert returned[0] == "sales by month"  # the tool return's content, which each model class sends as it can
    assert all(isinstance(item, BinaryContent) for item in returned[1:])
    assert [(item.media_type, item.data) for item in returned[1:]] == [
        ("image/png", base64.b64decode(PNG)), ("application/pdf", base64.b64decode(PDF))]
    assert returned[2].identifier == "q3.pdf"


async def test_langchain_gets_standard_image_and_file_blocks(chart_host: ToolHost) -> None:
    from amplifier_tools.integrations.langchain import tools

    (chart,) = tools(chart_host)
    message = await chart.ainvoke({"type": "tool_call", "name": chart.name, "args": {}, "id": "c1"})
    blocks = [{key: value for key, value in block.items() if key != "id"} for block in message.content]
    assert blocks == [
        {"type": "text", "text": "sales by month"},
        {"type": "image", "base64": PNG, "mime_type": "image/png"},
        {"type": "file", "base64": PDF, "mime_type": "application/pdf", "extras": {"filename": "q3.pdf"}},
    ]
    assert message.status == "success"


async def test_text_only_content_stays_text_in_every_adapter(chart_host: ToolHost, tmp_path: Path) -> None:
    """A result whose content has no image or file is shown as its text, as before."""
    from amplifier_tools.integrations._common import model_parts

    link = ToolResult(output=None, metadata={"content": [{"type": "text", "text": "a"},
                                                         {"type": "resource_link", "uri": "file:///x", "name": "x"}]})
    assert model_parts(link) is None
    failed = ToolResult(success=False, error={"message": "no"}, metadata={"content": [
        {"type": "image", "data": PNG, "mimeType": "image/png"}]})
    assert model_parts(failed) is None


@pytest.mark.parametrize("image", [
    {"type": "image", "base64": PNG, "mime_type": "image/png"},                           # standard (langchain-core 1)
    {"type": "image", "source_type": "base64", "data": PNG, "mime_type": "image/png"},    # langchain-core 0.3
    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},          # OpenAI's
], ids=["standard", "source_type", "image_url"])
async def test_a_langchain_tools_image_becomes_an_image_block_not_json(tmp_path: Path, image: dict[str, Any]) -> None:
    """Found by trial: the image came back as its JSON block: the model was shown the base64
    text, and so was the audit record."""
    from langchain_core.tools import tool as langchain_tool

    from amplifier_tools.integrations.langchain import host_tool

    @langchain_tool
    def snapshot() -> list[Any]:
        """Take a snapshot."""
        return ["the screen", image]

    work = tmp_path / "work"
    work.mkdir()
    config = {"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}}
    async with ToolHost(plugins=[_mount(host_tool(snapshot, name="local::screen.snapshot"))], builtins=["audit"],
                        entry_points=False, discover=False, working_dir=work, config=config) as host:
        result = await host.call("screen_snapshot", {})
        log = next((tmp_path / "state").rglob("audit.jsonl")).read_text()
    assert result.metadata["content"] == [{"type": "text", "text": "the screen"},
                                          {"type": "image", "data": PNG, "mimeType": "image/png"}]
    assert result.output == "the screen\n[image: image/png, 48 bytes]"
    assert PNG not in log
