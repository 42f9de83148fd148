"""The OpenAI Agents SDK runs our tools through the host: whole ``Runner.run`` agent runs with a
scripted model (no network), and the SDK's own tools mounted on the host."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from integration_helpers import REFUND_SCOPE, audit_records, held
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from amplifier_tools import Deny, ToolContext, ToolHost, hookimpl
from amplifier_tools.integrations.openai_agents import function_tools, host_tool

Turn = Callable[[dict[str, str]], list[Any]]


def call(name: str, call_id: str, arguments: dict[str, Any] | str) -> ResponseFunctionToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ResponseFunctionToolCall(type="function_call", name=name, call_id=call_id, arguments=text,
                                    id=f"fc_{call_id}", status="completed")


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


class ScriptedModel(Model):
    """A model that plays its turns in order; each turn sees the tool outputs so far, by call id."""

    def __init__(self, *turns: Turn) -> None:
        self.turns = list(turns)
        self.tools_seen: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        self.tools_seen = list(tools)
        outputs = {item["call_id"]: item["output"] for item in (input if isinstance(input, list) else [])
                   if isinstance(item, dict) and item.get("type") == "function_call_output"}
        return ModelResponse(output=self.turns.pop(0)(outputs), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run Runner.run, which does not stream")


def tool_calls_then_report(*calls: ResponseFunctionToolCall) -> ScriptedModel:
    """Turn 1 calls the tools; turn 2 reports every output it got back as JSON."""
    return ScriptedModel(lambda outputs: list(calls), lambda outputs: [say(json.dumps(outputs))])


@dataclass
class User:
    """The application's run context (``Runner.run(context=...)``)."""

    name: str
    scopes: frozenset[str] = frozenset()


def user_context(ctx: Any) -> ToolContext:
    user: User = ctx.context
    return ToolContext(principal=user.name, scopes=user.scopes)


async def run_agent(host: ToolHost, model: ScriptedModel, user: User, **options: Any) -> dict[str, str]:
    agent = Agent(name="shop", model=model, tools=function_tools(host, context=user_context, **options))
    result = await Runner.run(agent, "help me", context=user, run_config=RunConfig(tracing_disabled=True))
    return json.loads(result.final_output)  # type: ignore[no-any-return]


async def test_the_model_sees_the_output_of_an_allowed_call_and_the_typed_error_of_a_denied_one(
        host: ToolHost) -> None:
    model = tool_calls_then_report(call("shop__orders_lookup", "call_look_1", {"order_id": "A1"}),
                                   call("shop__orders_refund", "call_refund_1", {"order_id": "A1", "amount": 5}))
    seen = await run_agent(host, model, User("alice"))
    assert json.loads(seen["call_look_1"]) == {"order_id": "A1", "status": "shipped", "total": 42}
    assert seen["call_refund_1"].startswith("Error (AuthError, missing_scope): ")
    assert REFUND_SCOPE in seen["call_refund_1"]
    records = {r["call_id"]: r for r in audit_records(host)}
    assert sorted(records) == ["call_look_1", "call_refund_1"]  # one record per call, the SDK's call ids
    assert records["call_look_1"]["status"] == "ok" and records["call_look_1"]["principal"] == "alice"
    assert records["call_refund_1"]["error"]["code"] == "missing_scope"


async def test_scopes_from_the_run_context_let_the_call_through(host: ToolHost) -> None:
    model = tool_calls_then_report(call("shop__orders_refund", "call_r", {"order_id": "A1", "amount": 5}))
    seen = await run_agent(host, model, User("bob", frozenset({REFUND_SCOPE})))
    assert seen == {"call_r": "refunded 5 on A1"}
    [record] = audit_records(host)
    assert (record["principal"], record["scopes"], record["status"]) == ("bob", [REFUND_SCOPE], "ok")


async def test_bad_arguments_from_the_model_are_a_contract_error_naming_the_field(host: ToolHost) -> None:
    model = tool_calls_then_report(call("shop__orders_refund", "call_bad", {"order_id": "A1", "amount": "ten"}),
                                   call("shop__orders_lookup", "call_nojson", "{not json"))
    seen = await run_agent(host, model, User("carol", frozenset({REFUND_SCOPE})))
    assert seen["call_bad"].startswith("Error (ContractError, invalid_input): ")
    assert "/amount" in seen["call_bad"] and "'ten' is not of type 'integer'" in seen["call_bad"]
    assert seen["call_nojson"].startswith("Error (ContractError, invalid_input): ")
    assert [r["status"] for r in audit_records(host)] == ["error", "error"]


async def test_a_run_cancelled_mid_call_leaves_one_audit_record_and_no_held_slot(host: ToolHost, gate: Any) -> None:
    model = tool_calls_then_report(call("shop__slow", "call_slow", {"seconds": 30}))
    run = asyncio.create_task(run_agent(host, model, User("dave")))
    await asyncio.wait_for(gate.started.wait(), 10)
    assert held(host)["slots"] == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The SDK cancels its tool tasks without waiting for them; the host's close() waits for the
    # cancelled call to finish recording.
    assert len(audit_records(host)) <= 1
    await host.close()
    [record] = audit_records(host)
    assert (record["call_id"], record["error"]["code"]) == ("call_slow", "cancelled")
    assert not any(held(host).values())


async def test_the_tools_schema_is_the_contract_and_strict_only_when_nothing_changes(host: ToolHost) -> None:
    tools = {t.name: t for t in function_tools(host)}
    assert sorted(tools) == ["shop__orders_lookup", "shop__orders_refund", "shop__slow"]
    lookup = tools["shop__orders_lookup"]
    assert lookup.strict_json_schema is True
    assert lookup.params_json_schema["properties"] == {"order_id": {"type": "string"}}
    assert lookup.description == "Look an order up by its id."


async def test_a_schema_with_an_optional_argument_is_not_made_strict(tmp_path: Any) -> None:
    from amplifier_tools import tool

    @tool(name="greet")
    def greet(name: str, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"

    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[greet], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")}) as bare:
        [made] = function_tools(bare)
        assert made.strict_json_schema is False
        assert made.params_json_schema.get("required") == ["name"]  # optional stays optional
        model = tool_calls_then_report(call("greet", "call_g", {"name": "ann"}))
        agent = Agent(name="greeter", model=model, tools=[made])
        result = await Runner.run(agent, "hi", run_config=RunConfig(tracing_disabled=True))
        assert json.loads(result.final_output) == {"call_g": "hello ann!"}


async def test_an_unknown_tool_name_is_refused_naming_it(host: ToolHost) -> None:
    with pytest.raises(ValueError, match="'shop__nope' names no tool"):
        function_tools(host, tools=["shop__orders_lookup", "shop__nope"])
    assert [t.name for t in function_tools(host, tools=["shop::orders.lookup"])] == ["shop__orders_lookup"]


class DenyDeletes:
    """A policy plugin: every call of ``delete_file`` is denied."""

    name = "deny-deletes"

    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        return Deny("deleting files is not allowed here", code="no_deletes") if call.name == "delete_file" else None


async def test_an_sdk_tool_mounted_on_the_host_is_denied_by_its_policy_and_audited(tmp_path: Any) -> None:
    deleted: list[str] = []

    @function_tool(failure_error_function=None)
    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    @function_tool(failure_error_function=None)
    def read_note(title: str) -> str:
        """Read a note."""
        return f"note {title}"

    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[host_tool(delete_file), host_tool(read_note, effect="Pure"), DenyDeletes()],
                        builtins=["audit"], entry_points=False, discover=False, working_dir=tmp_path / "w",
                        config={"state_dir": str(tmp_path / "s")}) as wrapped:
        denied = await wrapped.call("delete_file", {"path": "/etc/passwd"}, call_id="c1")
        allowed = await wrapped.call("read_note", {"title": "todo"}, call_id="c2")
        invalid = await wrapped.call("read_note", {"title": 3}, call_id="c3")
    assert (denied.error or {})["code"] == "no_deletes" and deleted == []
    assert allowed.output == "note todo"
    assert (invalid.error or {})["type"] == "ContractError" and "/title" in (invalid.error or {})["message"]
    assert {r["tool"]: r["effect"] for r in audit_records(wrapped)} == {
        "delete_file": "ExternalSideEffects", "read_note": "Pure"}
    assert [(r["call_id"], r["status"]) for r in audit_records(wrapped)] == [
        ("c1", "error"), ("c2", "ok"), ("c3", "error")]


async def test_a_context_function_that_returns_no_tool_context_stops_the_run_before_the_call(host: ToolHost) -> None:
    from agents.exceptions import UserError

    model = tool_calls_then_report(call("shop__orders_lookup", "call_x", {"order_id": "A1"}))
    agent = Agent(name="shop", model=model, tools=function_tools(host, context=lambda ctx: {"principal": "root"}))
    with pytest.raises(UserError, match="returned dict, not a ToolContext"):
        await Runner.run(agent, "hi", run_config=RunConfig(tracing_disabled=True))
    assert audit_records(host) == []  # never ran under a principal nobody chose


async def test_the_sdks_trace_id_is_the_records_trace_id(host: ToolHost) -> None:
    from agents import trace
    from agents.tracing import set_trace_processors

    set_trace_processors([])  # no exporter: nothing leaves the process
    trace_id = "trace_" + "0123456789abcdef" * 2
    model = tool_calls_then_report(call("shop__orders_lookup", "call_t", {"order_id": "A1"}))
    agent = Agent(name="shop", model=model, tools=function_tools(host))
    with trace("shop workflow", trace_id=trace_id):
        await Runner.run(agent, "hi")
    [record] = audit_records(host)
    assert (record["call_id"], record["trace_id"], record["principal"]) == ("call_t", trace_id, "default-user")


async def test_host_tool_refuses_an_sdk_tool_whose_safeguards_the_host_cannot_run() -> None:
    from agents import ToolGuardrailFunctionOutput, tool_input_guardrail, tool_output_guardrail

    from amplifier_tools.errors import ContractError

    @tool_input_guardrail
    def block_input(data: Any) -> ToolGuardrailFunctionOutput:
        return ToolGuardrailFunctionOutput.reject_content("blocked")

    @tool_output_guardrail
    def block_output(data: Any) -> ToolGuardrailFunctionOutput:
        return ToolGuardrailFunctionOutput.reject_content("blocked")

    def wire_money(to: str, amount: int) -> str:
        """Wire money."""
        return f"wired {amount} to {to}"

    for setting, options in [("needs_approval", {"needs_approval": True}),
                             ("tool_input_guardrails", {"tool_input_guardrails": [block_input]}),
                             ("tool_output_guardrails", {"tool_output_guardrails": [block_output]}),
                             ("is_enabled", {"is_enabled": False}),
                             ("is_enabled", {"is_enabled": lambda ctx, agent: True})]:
        with pytest.raises(ContractError, match=setting) as refused:
            host_tool(function_tool(wire_money, failure_error_function=None, **options))
        assert refused.value.code == "unsupported_setting"


async def test_an_sdk_tools_timeout_becomes_the_contracts_timeout(tmp_path: Any) -> None:
    @function_tool(failure_error_function=None, timeout=0.2)
    async def sleepy(x: int) -> str:
        """Sleep."""
        await asyncio.sleep(5)
        return "slept"

    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[host_tool(sleepy)], builtins=["audit"], entry_points=False, discover=False,
                        working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")}) as started:
        result = await started.call("sleepy", {"x": 1}, call_id="slow_1")
    assert not result.success and result.error is not None and result.error["code"] == "timeout"


async def test_arguments_nested_too_deeply_to_parse_are_a_recorded_contract_error(host: ToolHost) -> None:
    from agents.tool_context import ToolContext as AgentsToolContext

    [lookup] = function_tools(host, tools=["shop::orders.lookup"])
    deep = '{"order_id": ' + "[" * 100_000 + "]" * 100_000 + "}"
    ctx = AgentsToolContext(context=None, tool_name=lookup.name, tool_call_id="deep_1", tool_arguments=deep)
    text = await lookup.on_invoke_tool(ctx, deep)
    assert text.startswith("Error (ContractError, invalid_input)") and "nested too deeply" in text
    [record] = audit_records(host)
    assert record["call_id"] == "deep_1" and record["status"] == "error"


async def test_arguments_that_are_not_json_name_the_parse_error(host: ToolHost) -> None:
    seen = await run_agent(host, tool_calls_then_report(call("shop__orders_lookup", "bad_json", '{"order_id": "A"')),
                           User("alice"))
    assert seen["bad_json"].startswith("Error (ContractError, invalid_input)")
    assert "not valid JSON: Expecting" in seen["bad_json"]
    assert [r["call_id"] for r in audit_records(host)] == ["bad_json"]


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "string", "default": "x"}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"^x": {"type": "string"}},
                                            "properties": {}, "required": [], "additionalProperties": False}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "string", "if": {"const": "x"}, "then": {"minLength": 2}}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"$ref": "#/$defs/P", "description": "a p"}}, "required": ["p"],
     "additionalProperties": False, "$defs": {"P": {"type": "object", "properties": {"r": {"type": "integer"}},
                                                    "required": ["r"], "additionalProperties": False}}},
])
async def test_a_schema_strict_mode_would_change_or_refuse_is_not_made_strict(tmp_path: Any,
                                                                               schema: dict[str, Any]) -> None:
    class Tool:
        name = "x::t"
        description = "t"
        input_schema = schema

        async def execute(self, input: dict[str, Any], context: Any = None) -> Any:
            return input

    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[Tool()], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")}) as started:
        [made] = function_tools(started)
    assert made.strict_json_schema is False


async def test_an_unstarted_host_is_refused_naming_start(tmp_path: Any) -> None:
    from amplifier_tools.integrations.langchain import tools as langchain_tools
    from amplifier_tools.integrations.pydantic_ai import AmplifierToolset

    (tmp_path / "w").mkdir()
    unstarted = ToolHost(builtins=False, entry_points=False, discover=False, working_dir=tmp_path / "w",
                         config={"state_dir": str(tmp_path / "s")})
    for make in (function_tools, AmplifierToolset, langchain_tools):
        with pytest.raises(RuntimeError, match="not started.*start"):
            make(unstarted)
    async with unstarted:
        pass
    for make in (function_tools, AmplifierToolset, langchain_tools):  # a closed host: said so, and what to do
        with pytest.raises(RuntimeError, match="or was closed.*make a new ToolHost"):
            make(unstarted)


async def test_a_call_id_too_long_or_with_control_characters_is_bounded(host: ToolHost) -> None:
    huge, odd = "c" * 200_000, "call\x00\n\x1b[31m"
    seen = await run_agent(host, tool_calls_then_report(call("shop__orders_lookup", huge, {"order_id": "A"}),
                                                        call("shop__orders_lookup", odd, {"order_id": "B"})),
                           User("alice"))
    assert len(seen) == 2
    ids = [r["call_id"] for r in audit_records(host)]
    assert len(ids) == 2 and all(len(i) <= 100 and i.isascii() and i.isprintable() for i in ids)
    assert ids[0] != ids[1] and ids[1].startswith("call[31m~")


@pytest.mark.parametrize("module, extra", [("openai_agents", "openai-agents"), ("pydantic_ai", "pydantic-ai"),
                                           ("langchain", "langchain")])
def test_a_missing_framework_is_an_import_error_naming_the_extra(module: str, extra: str) -> None:
    import subprocess
    import sys

    framework = {"openai_agents": "agents", "pydantic_ai": "pydantic_ai", "langchain": "langchain_core"}[module]
    code = f"import sys; sys.modules[{framework!r}] = None; import amplifier_tools.integrations.{module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"pip install 'amplifier-tools[{extra}]'" in done.stderr
    assert "ImportError:" in done.stderr.splitlines()[-1]


async def test_a_named_tool_unmounted_later_answers_the_model_with_unknown_tool(host: ToolHost) -> None:
    made = function_tools(host, context=user_context, tools=["shop::orders.lookup"])
    host.tools.remove("shop::orders.lookup")
    agent = Agent(name="shop", model=tool_calls_then_report(call("shop__orders_lookup", "gone_1", {"order_id": "A"})),
                  tools=made)
    result = await Runner.run(agent, "help me", context=User("alice"), run_config=RunConfig(tracing_disabled=True))
    assert json.loads(result.final_output)["gone_1"].startswith("Error (ContractError, unknown_tool)")
