"""Strict mode only when the framework's strict conversion leaves the schema as it is: an untyped
array, a ``format`` OpenAI's strict mode does not know, a lookaround ``pattern`` and a schema over
strict mode's size limits are offered without it (Pydantic AI's OpenAI models end a run with a
``UserError`` on an untyped array in strict mode, and move an unknown ``format`` into the
description)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.integrations.openai_agents import function_tools
from amplifier_tools.integrations.pydantic_ai import AmplifierToolset


def closed(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = closed({"a": schema})
    return schema


SCHEMAS = {
    "untyped_array": closed({"xs": {"type": "array"}}),
    "uri": closed({"u": {"type": "string", "format": "uri"}}),
    "lookahead": closed({"p": {"type": "string", "pattern": "^(?!admin).*$"}}),
    "deep": nested(12),
}


class SchemaTool:
    def __init__(self, name: str, schema: dict[str, Any]) -> None:
        self.name, self.description, self.input_schema = f"x::{name}", "A tool.", schema

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


class Mount:
    name = "schema-tools"

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        for name, schema in SCHEMAS.items():
            await coordinator.mount("tools", SchemaTool(name, schema))


@pytest.fixture
async def schema_host(tmp_path: Path) -> Any:
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[Mount()], builtins=False, entry_points=False, discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state")}) as host:
        yield host


@pytest.mark.parametrize("name", sorted(SCHEMAS))
async def test_a_schema_strict_mode_would_refuse_or_rewrite_is_not_made_strict(schema_host: ToolHost,
                                                                               name: str) -> None:
    [sdk_tool] = function_tools(schema_host, tools=[f"x::{name}"])
    assert sdk_tool.strict_json_schema is False
    [offered] = (await AmplifierToolset(schema_host, tools=[f"x::{name}"]).get_tools(None)).values()  # type: ignore[arg-type]
    assert offered.tool_def.strict is False  # strict=None lets Pydantic AI close the schema's objects


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", ["untyped_array", "uri"])
async def test_a_pydantic_ai_openai_run_gets_the_schema_as_it_is(schema_host: ToolHost, name: str) -> None:
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "r", "object": "chat.completion", "created": 0, "model": "gpt-4.1",
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant", "content": "hi"}}]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    model = OpenAIChatModel("gpt-4.1", provider=OpenAIProvider(api_key="test", http_client=client))
    agent = Agent(model, toolsets=[AmplifierToolset(schema_host, tools=[f"x::{name}"])])
    await agent.run("hi")  # an untyped array in strict mode: UserError before any request
    [function] = [tool["function"] for tool in sent[0]["tools"]]
    assert function["parameters"] == SCHEMAS[name]
    assert not function.get("strict")
