"""The framework adapters attacked a third time, driven the way the frameworks drive them: what
was found.

- Pydantic AI's toolset offered a tool whose schema is not strict with ``strict=None`` ("let the
  model decide"). Pydantic AI's OpenAI models read that as "strict if it can be made so" and close
  every object on the way (``additionalProperties: false``) even when they then leave strict mode
  off: a free-form object argument (``{"type": "object"}``, an imported MCP tool's ``meta`` or
  ``options``) reached the model as "an empty object and nothing else", and a contract that allows
  extra keys was offered in strict mode forbidding them. The toolset now says ``strict=False``.
- A ``$ref`` pointing anywhere but the root or a top-level definition (``#/properties/from``, as
  zod-to-json-schema, behind the MCP TypeScript SDK, writes a reused subschema) passed
  ``is_strict_schema``, and both the Agents SDK and Pydantic AI tools were offered in strict mode,
  which OpenAI refuses for such a pointer (the whole run ends with the API's error).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from amplifier_tools import ToolHost, ToolResult, hookimpl
from amplifier_tools.integrations._common import is_strict_schema
from amplifier_tools.integrations.openai_agents import function_tools
from amplifier_tools.integrations.pydantic_ai import AmplifierToolset

#: An imported tool's schema, as MCP servers write them: no ``additionalProperties`` (so extra keys
#: are allowed), and a free-form object argument.
OPEN_SCHEMA = {"type": "object", "properties": {"query": {"type": "string"}, "options": {"type": "object"}},
               "required": ["query", "options"]}


class OpenTool:
    name = "mcp::search"
    description = "Search, with free-form options."
    input_schema = OPEN_SCHEMA

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output=json.dumps(input))


def closed(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False,
            **more}


#: zod-to-json-schema's spelling of a reused subschema: a pointer into ``properties``.
POINTER_SCHEMA = closed({"from": closed({"city": {"type": "string"}}), "to": {"$ref": "#/properties/from"}})


class PointerTool:
    name = "mcp::route"
    description = "A route between two places."
    input_schema = POINTER_SCHEMA

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(output="ok")


class MountOpen:
    name = "open-tools"

    @hookimpl
    async def mount(self, coordinator: Any) -> None:
        await coordinator.mount("tools", OpenTool())
        await coordinator.mount("tools", PointerTool())


def _answer(responses_api: bool) -> Any:
    if responses_api:
        return {"id": "r", "object": "response", "created_at": 0, "model": "gpt-4.1", "status": "completed",
                "output": [{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    return {"id": "r", "object": "chat.completion", "created": 0, "model": "gpt-4.1",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
async def test_pydantic_ai_does_not_close_an_open_schema_or_a_free_form_object(tmp_path: Path,
                                                                              model_class: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=_answer(model_class is OpenAIResponsesModel))

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    model = model_class("gpt-4.1", provider=OpenAIProvider(api_key="test", http_client=client))
    async with ToolHost(plugins=[MountOpen()], builtins=False, entry_points=False, discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state")}) as host:
        await Agent(model, toolsets=[AmplifierToolset(host)]).run("hi")
    [function] = [tool.get("function", tool) for tool in sent[0]["tools"] if "search" in str(tool)]
    assert not function.get("strict")  # before: strict mode on the chat API, extra keys forbidden
    parameters = function["parameters"]
    assert parameters.get("additionalProperties", True) is not False
    # before: {"type": "object", "properties": {}, "additionalProperties": false}, an empty object only
    assert parameters["properties"]["options"].get("additionalProperties", True) is not False


async def test_a_ref_strict_mode_cannot_resolve_is_not_offered_as_strict(tmp_path: Path) -> None:
    # The pointers strict mode resolves stay strict: the root and a top-level definition.
    assert is_strict_schema(closed({"a": {"$ref": "#/$defs/A"}}, **{"$defs": {"A": closed({"b": {"$ref": "#"}})}}))
    assert not is_strict_schema(POINTER_SCHEMA)  # before: True
    assert not is_strict_schema(closed({"a": {"$ref": "#/$defs/A/properties/b"}},
                                       **{"$defs": {"A": closed({"b": {"type": "string"}})}}))
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[MountOpen()], builtins=False, entry_points=False, discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state")}) as host:
        [sdk_tool] = function_tools(host, tools=["mcp::route"])
        assert sdk_tool.strict_json_schema is False
        assert sdk_tool.params_json_schema == POINTER_SCHEMA
        [offered] = (await AmplifierToolset(host, tools=["mcp::route"]).get_tools(None)).values()  # type: ignore[arg-type]
        assert offered.tool_def.strict is False
