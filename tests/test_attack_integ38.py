"""The framework adapters attacked by a helper (integ38), driven through each framework's own
tool-invocation path: what was found.

- A framework's correlation id that the host does not take as ``ToolContext.trace_id`` — the Agents
  SDK takes any ``RunConfig(trace_id=...)`` / ``trace(trace_id=...)``, LangGraph any
  ``config={"run_id": ...}`` — made every tool call of the run raise (``ContextFieldError`` from
  ``attrs.evolve`` in ``call_context``): the Agents SDK ended the run with ``UserError: Error
  running tool ...``, LangGraph's graph run ended with the ``ContextFieldError``, and no call was
  recorded. The id is now bounded as a call id is (printable prefix and a hash), or left out.
- A tool output holding a lone surrogate — a file name that is not UTF-8 as Python lists it
  (``os.fsdecode``, the built-in ``fs.glob``'s matches), a tool echoing a model's ``"\\ud83d"`` —
  was handed to the framework as it was; the OpenAI client cannot encode it, so the next model
  request raised ``UnicodeEncodeError`` and the whole agent run ended (Agents SDK and Pydantic AI
  with OpenAI's client), the call recorded ``ok``. So did a tool description holding one (an MCP
  server's JSON ``"\\ud83d"``), at the run's first request. The adapters now escape lone
  surrogates (``\\udcff``) in what they hand a model, as the audit record escapes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolHost, ToolResult, tool


@tool(name="echo", effect="Pure")
async def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool(name="files", effect="Pure")
def files() -> list[str]:
    """The files here (one named in Latin-1, as Python lists it)."""
    return [os.fsdecode(b"report\xff.txt")]


class HalfEmoji:
    """An imported tool whose server's JSON description held ``"\\ud83d"``."""

    name = "mcp::notes"
    description = "Find notes \ud83d"
    input_schema = {"type": "object"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="none")


def audit_records(host: ToolHost) -> list[dict[str, Any]]:
    path = host.state_dir / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, filter(str.strip, lines)) if r.get("kind") == "call"]


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[ToolHost]:
    (tmp_path / "work").mkdir()
    async with ToolHost(plugins=[echo, files, HalfEmoji()], builtins=["audit"], entry_points=False, discover=False,
                        working_dir=tmp_path / "work",
                        config={"state_dir": str(tmp_path / "state"),
                                "plugins": {"audit": {"fsync": "never"}}}) as started:
        yield started


#: Correlation ids a framework accepts and the host does not take as a trace id as they are.
BAD_TRACE_IDS = ["trace_" + "a" * 300, "trace_\u00e9t\u00e9"]


@pytest.mark.parametrize("trace_id", BAD_TRACE_IDS)
async def test_an_agents_sdk_trace_id_the_host_refuses_does_not_fail_the_tool_call(host: ToolHost,
                                                                                   trace_id: str) -> None:
    pytest.importorskip("agents")
    from agents.tool_context import ToolContext as AgentsToolContext
    from agents.tracing.processor_interface import TracingProcessor
    from agents.tracing.traces import TraceImpl

    from amplifier_tools.integrations.openai_agents import function_tools

    class Nowhere(TracingProcessor):  # no exporter: nothing leaves the machine
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    [made] = function_tools(host, tools=["echo"])
    context = AgentsToolContext(context=None, tool_name="echo", tool_call_id="call_t1",
                                tool_arguments='{"text": "hi"}')
    with TraceImpl("workflow", trace_id, None, None, Nowhere()):  # as Runner.run(run_config=RunConfig(trace_id=...))
        output = await made.on_invoke_tool(context, '{"text": "hi"}')
    assert output == "hi"
    [record] = audit_records(host)
    assert record["call_id"] == "call_t1" and record["status"] == "ok"
    assert record["trace_id"] is None or (record["trace_id"].isascii() and len(record["trace_id"]) <= 256)


@pytest.mark.parametrize("run_id", BAD_TRACE_IDS)
async def test_a_langgraph_run_id_the_host_refuses_does_not_end_the_graph_run(host: ToolHost, run_id: str) -> None:
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    from amplifier_tools.integrations.langchain import tools

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools(host, tools=["echo"])))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    call = {"name": "echo", "args": {"text": "hi"}, "id": "lc_t1"}
    state = await graph.compile().ainvoke({"messages": [AIMessage("", tool_calls=[call])]},
                                          config={"run_id": run_id})
    [answer] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert (answer.status, answer.content) == ("success", "hi")
    [record] = audit_records(host)
    assert record["call_id"] == "lc_t1" and record["status"] == "ok"
    assert record["trace_id"] is None or (record["trace_id"].isascii() and len(record["trace_id"]) <= 256)


def utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def chat_completions(tool_name: str) -> tuple[Any, list[dict[str, Any]]]:
    """An httpx client answering as OpenAI's Chat Completions API: a call of ``tool_name``, then "done"."""
    import httpx

    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if len(sent) == 1:
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": tool_name, "arguments": "{}"}}]}
        else:
            message = {"role": "assistant", "content": "done"}
        return httpx.Response(200, json={"id": "r", "object": "chat.completion", "created": 0, "model": "gpt-4.1",
                                         "choices": [{"index": 0, "message": message,
                                                      "finish_reason": "tool_calls" if len(sent) == 1 else "stop"}]})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer)), sent


async def test_an_agents_sdk_run_survives_a_file_name_that_is_not_utf8(host: ToolHost) -> None:
    pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
    from openai import AsyncOpenAI

    from amplifier_tools.integrations.openai_agents import function_tools

    client, sent = chat_completions("files")
    model = OpenAIChatCompletionsModel("gpt-4.1", AsyncOpenAI(api_key="test", http_client=client, max_retries=0))
    agent = Agent(name="files", model=model, tools=function_tools(host, tools=["files"]))
    result = await Runner.run(agent, "what is here?", run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "done"
    assert sent[-1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": '["report\\udcff.txt"]'}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_a_pydantic_ai_run_survives_a_file_name_that_is_not_utf8(host: ToolHost) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from amplifier_tools.integrations.pydantic_ai import AmplifierToolset

    client, sent = chat_completions("files")
    model = OpenAIChatModel("gpt-4.1", provider=OpenAIProvider(api_key="test", http_client=client))
    result = await Agent(model, toolsets=[AmplifierToolset(host, tools=["files"])]).run("what is here?")
    assert result.output == "done"
    assert sent[-1]["messages"][-1]["content"] == '["report\\udcff.txt"]'


async def test_a_langchain_tool_message_is_utf8_for_a_file_name_that_is_not(host: ToolHost) -> None:
    pytest.importorskip("langchain_core")
    from amplifier_tools.integrations.langchain import tools

    [made] = tools(host, tools=["files"])
    message = await made.ainvoke({"type": "tool_call", "name": "files", "args": {}, "id": "lc_f"})
    assert message.content == '["report\\udcff.txt"]' and utf8(message.content)


async def test_every_adapter_offers_a_description_a_client_can_encode(host: ToolHost) -> None:
    offered: list[str] = []
    try:
        from amplifier_tools.integrations.openai_agents import function_tools
    except ImportError:
        pass
    else:
        offered += [t.description for t in function_tools(host, tools=["mcp::notes"])]
    try:
        from amplifier_tools.integrations.langchain import tools
    except ImportError:
        pass
    else:
        offered += [t.description for t in tools(host, tools=["mcp::notes"])]
    try:
        from pydantic_ai.models.test import TestModel
        from pydantic_ai.tools import RunContext
        from pydantic_ai.usage import RunUsage

        from amplifier_tools.integrations.pydantic_ai import AmplifierToolset
    except ImportError:
        pass
    else:
        toolset = AmplifierToolset(host, tools=["mcp::notes"])
        found = await toolset.get_tools(RunContext(deps=None, model=TestModel(), usage=RunUsage()))
        offered += [t.tool_def.description or "" for t in found.values()]
    if not offered:
        pytest.skip("no framework installed")
    assert offered and all(text == "Find notes \\ud83d" for text in offered), [ascii(text) for text in offered]


async def test_the_shared_adapter_code_bounds_a_trace_id_and_escapes_lone_surrogates(host: ToolHost) -> None:
    """What the three adapters share, without any framework (every Python the project supports)."""
    from amplifier_tools.integrations._common import call_context, model_text

    for trace_id in BAD_TRACE_IDS:
        context = call_context(host, None, None, trace_id)
        assert context.trace_id is not None and context.trace_id.isascii() and len(context.trace_id) <= 256
    assert call_context(host, None, None, "trace_ok").trace_id == "trace_ok"
    result = await host.call("files", {})
    assert model_text(result) == '["report\\udcff.txt"]'
    failed = ToolResult(success=False, error={"type": "ExecutionError", "code": "x", "message": "no \udcff"})
    assert model_text(failed) == "Error (ExecutionError, x): no \\udcff"


class HalfEmojiSchema:
    """An imported tool whose server's JSON input schema held ``"\\ud83d"`` (a property's
    description, and a property's name)."""

    name = "mcp::search"
    description = "Search"
    input_schema = {"type": "object", "properties": {"q\udcff": {"type": "string", "description": "query \ud83d",
                                                                 "enum": ["a", "b\ud800"]}}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="none")


async def test_a_lone_surrogate_in_an_input_schema_is_escaped_in_what_each_adapter_offers(tmp_path: Path) -> None:
    """Found by review: the adapters escaped a description's lone surrogates but handed the input
    schema on as it was, and OpenAI's client (``ensure_ascii=False``, then UTF-8) raised
    ``UnicodeEncodeError`` at the run's first request, for a server whose schema held
    ``"\\ud83d"``: every agent run offered that tool ended. The contract's own schema is unchanged."""
    from amplifier_tools.integrations._common import sendable_schema

    schema = HalfEmojiSchema.input_schema
    escaped = sendable_schema(schema)
    json.dumps(escaped, ensure_ascii=False).encode("utf-8")
    assert escaped["properties"]["q\\udcff"] == {"type": "string", "description": "query \\ud83d",
                                                 "enum": ["a", "b\\ud800"]}
    assert sendable_schema({"type": "object", "x": [1, None, True]}) == {"type": "object", "x": [1, None, True]}
    (tmp_path / "work").mkdir()
    async with ToolHost(plugins=[HalfEmojiSchema()], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path / "work", config={"state_dir": str(tmp_path / "state")}) as host:
        offered: list[Any] = []
        try:
            from amplifier_tools.integrations.openai_agents import function_tools
        except ImportError:
            pass
        else:
            offered += [t.params_json_schema for t in function_tools(host)]
        try:
            from amplifier_tools.integrations.langchain import tools
        except ImportError:
            pass
        else:
            offered += [t.args_schema for t in tools(host)]
        try:
            from pydantic_ai.models.test import TestModel
            from pydantic_ai.tools import RunContext
            from pydantic_ai.usage import RunUsage

            from amplifier_tools.integrations.pydantic_ai import AmplifierToolset
        except ImportError:
            pass
        else:
            found = await AmplifierToolset(host).get_tools(RunContext(deps=None, model=TestModel(), usage=RunUsage()))
            offered += [t.tool_def.parameters_json_schema for t in found.values()]
        if not offered:
            pytest.skip("no framework installed")
        for offer in offered:
            json.dumps(offer, ensure_ascii=False).encode("utf-8")  # what OpenAI's client does
        assert schema["properties"]["q\udcff"]["description"] == "query \ud83d"  # the contract's: as it was
