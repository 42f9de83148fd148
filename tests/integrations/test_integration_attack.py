"""The framework adapters attacked at their edges, as a hostile model or an unlucky user would hit
them; each test is a finding that failed before its fix.

- A model sending the JSON text ``null`` as a call's arguments: ``host.call`` reads ``None`` as "no
  arguments", so the Agents SDK and Pydantic AI adapters ran a tool whose arguments are all optional
  with its defaults (recorded ``ok``), a call the contract never allowed.
- Pydantic AI's run deadline was applied only when the context function set no deadline, so a later
  deadline there let the call outlive the run's.
- ``host_tool`` kept an SDK tool's structured output (``ToolOutputText``, ``ToolOutputImage``,
  ``ToolOutputFileContent``, or a list of them) as ``str(output)``: the model read a Python repr,
  an image's whole base64 data URL as text, and a list of them stayed a list of Python objects.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from agents import ToolOutputFileContent, ToolOutputImage, ToolOutputText, function_tool
from agents.tool_context import ToolContext as AgentsToolContext
from integration_helpers import audit_records
from pydantic_ai import Agent, RunContext
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from amplifier_tools import ToolContext, ToolHost, tool
from amplifier_tools.integrations.openai_agents import function_tools, host_tool
from amplifier_tools.integrations.pydantic_ai import AmplifierToolset


@tool(name="shop::orders.list", effect="Pure")
async def list_orders(limit: int = 10) -> str:
    """List the latest orders (every argument optional)."""
    return f"listed {limit}"


def _work(tmp_path: Path) -> Path:
    """A working directory beside the state directory (host state must lie outside it)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return work


@pytest.fixture
async def optional_host(tmp_path: Path) -> Any:
    """A started host with one tool whose arguments are all optional, and the audit log."""
    async with ToolHost(plugins=[list_orders], builtins=["policy", "audit"], entry_points=False, discover=False,
                        working_dir=_work(tmp_path), config={"state_dir": str(tmp_path / "state"),
                                                      "plugins": {"audit": {"fsync": "never"}}}) as host:
        yield host


async def test_json_null_arguments_from_an_agents_sdk_model_are_refused_not_run_with_defaults(
        optional_host: ToolHost) -> None:
    [sdk_tool] = function_tools(optional_host)
    ctx = AgentsToolContext(context=None, tool_name=sdk_tool.name, tool_call_id="call_null", tool_arguments="null")
    text = await sdk_tool.on_invoke_tool(ctx, "null")
    assert text.startswith("Error (ContractError, invalid_input): ") and "JSON null" in text
    [record] = audit_records(optional_host)
    assert (record["call_id"], record["status"], record["error"]["code"]) == ("call_null", "error", "invalid_input")
    # An empty argument text still means "no arguments", as the SDK's own tools read it.
    ctx = AgentsToolContext(context=None, tool_name=sdk_tool.name, tool_call_id="call_empty", tool_arguments="")
    assert await sdk_tool.on_invoke_tool(ctx, "") == "listed 10"


async def test_json_null_arguments_from_a_pydantic_ai_model_are_refused_not_run_with_defaults(
        optional_host: ToolHost) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [part for message in messages if isinstance(message, ModelRequest) for part in message.parts
                    if isinstance(part, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(json.dumps([returned[0].outcome, returned[0].content]))])
        return ModelResponse(parts=[ToolCallPart("shop__orders_list", "null", tool_call_id="pyd_null")])

    result = await Agent(FunctionModel(model), toolsets=[AmplifierToolset(optional_host)]).run("go")
    outcome, content = json.loads(result.output)
    assert outcome == "failed" and content.startswith("Error (ContractError, invalid_input)") and "JSON null" in content
    [record] = audit_records(optional_host)
    assert (record["call_id"], record["status"]) == ("pyd_null", "error")


async def test_the_pydantic_ai_runs_deadline_bounds_a_call_whose_context_sets_a_later_one(
        host: ToolHost, gate: Any) -> None:
    from datetime import datetime, timedelta, timezone

    later = ToolContext(principal="alice").with_timeout(120)  # e.g. the request's own budget
    toolset = AmplifierToolset(host, tools=["shop__slow"], context=later)
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage(), tool_call_id="pyd_earlier",
                     deadline=datetime.now(timezone.utc) + timedelta(seconds=1))
    tool_ = (await toolset.get_tools(ctx))["shop__slow"]
    asyncio.get_running_loop().call_later(4, gate.release.set)  # the tool ends after 4 s, well past the run's 1 s
    with pytest.raises(ToolFailed, match=r"^Error \(PolicyError, timeout\)"):  # before: "done" after 4 s
        await toolset.call_tool("shop__slow", {"seconds": 30}, ctx, tool_)
    [record] = audit_records(host)
    assert (record["call_id"], record["principal"], record["error"]["code"]) == ("pyd_earlier", "alice", "timeout")


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(600)).decode()


@function_tool(failure_error_function=None)
def say_hello() -> ToolOutputText:
    """Greets."""
    return ToolOutputText(text="hello")


@function_tool(failure_error_function=None)
def chart() -> list[Any]:
    """Draws a chart, with a caption and the data file."""
    return [ToolOutputText(text="the chart"), ToolOutputImage(image_url=f"data:image/png;base64,{PNG}"),
            {"type": "file", "file_url": "https://example.com/data.csv", "filename": "data.csv"},
            ToolOutputFileContent(file_id="file-123")]


async def test_host_tool_keeps_an_sdk_tools_structured_output_as_text_and_content_blocks(tmp_path: Path) -> None:
    async with ToolHost(plugins=[host_tool(say_hello, effect="Pure"), host_tool(chart, effect="Pure")],
                        builtins=["audit"], entry_points=False, discover=False, working_dir=_work(tmp_path),
                        config={"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}},
                        ) as host:
        hello = await host.call("say_hello", {})
        assert (hello.success, hello.output) == (True, "hello")  # before: "type='text' text='hello'"
        drawn = await host.call("chart", {})
    assert drawn.success and isinstance(drawn.output, str)
    assert PNG not in drawn.output and "base64" not in drawn.output  # the model reads no bytes
    assert drawn.output.splitlines() == ["the chart", "[image: image/png, 608 bytes]",
                                         "[resource link: data.csv <https://example.com/data.csv>]",
                                         "[file: file id file-123]"]
    image = drawn.metadata["content"][1]
    assert image == {"type": "image", "data": PNG, "mimeType": "image/png"}
    json.dumps(drawn.output)  # JSON data, not Python objects
