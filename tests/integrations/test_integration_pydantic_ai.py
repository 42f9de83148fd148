"""Pydantic AI runs our tools through the host: whole ``Agent.run`` runs with its ``FunctionModel``
and ``TestModel`` (no network), the ``ToolContext`` built from the run's deps."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from integration_helpers import REFUND_SCOPE, audit_records, held
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from amplifier_tools import ToolContext, ToolHost
from amplifier_tools.integrations.pydantic_ai import AmplifierToolset


@dataclass
class Deps:
    user: str
    scopes: set[str] = field(default_factory=set)


def from_deps(ctx: RunContext[Deps]) -> ToolContext:
    return ToolContext(principal=ctx.deps.user, scopes=frozenset(ctx.deps.scopes))


def returns(messages: list[ModelMessage]) -> dict[str, tuple[str, Any]]:
    """Every tool result the model has been sent: call id -> (outcome, content)."""
    return {part.tool_call_id: (part.outcome, part.content) for message in messages
            if isinstance(message, ModelRequest) for part in message.parts if isinstance(part, ToolReturnPart)}


def calls_then_report(*calls: ToolCallPart) -> FunctionModel:
    """Turn 1 calls the tools; turn 2 answers with every tool result it got, as JSON."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen = returns(messages)
        if not seen:
            return ModelResponse(parts=list(calls))
        return ModelResponse(parts=[TextPart(json.dumps(seen))])

    return FunctionModel(model)


async def run_agent(host: ToolHost, model: FunctionModel, deps: Deps) -> dict[str, list[Any]]:
    agent = Agent(model, deps_type=Deps, toolsets=[AmplifierToolset(host, context=from_deps)])
    result = await agent.run("help me", deps=deps)
    return json.loads(result.output)  # type: ignore[no-any-return]


async def test_the_model_sees_the_output_of_an_allowed_call_and_the_typed_error_of_a_denied_one(
        host: ToolHost) -> None:
    model = calls_then_report(
        ToolCallPart("shop__orders_lookup", {"order_id": "A1"}, tool_call_id="pyd_look"),
        ToolCallPart("shop__orders_refund", {"order_id": "A1", "amount": 5}, tool_call_id="pyd_refund"))
    seen = await run_agent(host, model, Deps("alice"))
    outcome, content = seen["pyd_look"]
    assert outcome == "success" and json.loads(content)["status"] == "shipped"
    outcome, content = seen["pyd_refund"]
    assert outcome == "failed" and content.startswith("Error (AuthError, missing_scope): ")
    records = {r["call_id"]: r for r in audit_records(host)}
    assert sorted(records) == ["pyd_look", "pyd_refund"]
    assert {r["principal"] for r in records.values()} == {"alice"}
    assert records["pyd_refund"]["error"]["code"] == "missing_scope"
    assert records["pyd_look"]["trace_id"]  # the run id


async def test_scopes_from_the_deps_let_the_call_through(host: ToolHost) -> None:
    model = calls_then_report(ToolCallPart("shop__orders_refund", {"order_id": "B2", "amount": 7},
                                           tool_call_id="pyd_ok"))
    seen = await run_agent(host, model, Deps("bob", {REFUND_SCOPE}))
    assert seen == {"pyd_ok": ["success", "refunded 7 on B2"]}
    [record] = audit_records(host)
    assert (record["principal"], record["scopes"]) == ("bob", [REFUND_SCOPE])


async def test_bad_arguments_from_the_model_are_a_contract_error_naming_the_field(host: ToolHost) -> None:
    model = calls_then_report(ToolCallPart("shop__orders_refund", {"order_id": "A1", "amount": "ten"},
                                           tool_call_id="pyd_bad"),
                              ToolCallPart("shop__orders_lookup", {"order_id": "A1", "extra": 1},
                                           tool_call_id="pyd_extra"))
    seen = await run_agent(host, model, Deps("carol", {REFUND_SCOPE}))
    outcome, content = seen["pyd_bad"]
    assert outcome == "failed" and "(ContractError, invalid_input)" in content and "/amount" in content
    outcome, content = seen["pyd_extra"]
    assert outcome == "failed" and "/extra: is not an allowed property" in content
    assert [r["status"] for r in audit_records(host)] == ["error", "error"]


async def test_test_model_calls_every_tool_it_is_offered(host: ToolHost) -> None:
    toolset = AmplifierToolset(host, context=from_deps, tools=["shop__orders_lookup", "shop::orders.refund"])
    agent = Agent(TestModel(), deps_type=Deps, toolsets=[toolset])
    result = await agent.run("go", deps=Deps("erin"))
    records = audit_records(host)
    assert sorted(r["tool"] for r in records) == ["shop::orders.lookup", "shop::orders.refund"]
    by_tool = {r["tool"]: r for r in records}
    assert by_tool["shop::orders.lookup"]["status"] == "ok"
    assert by_tool["shop::orders.refund"]["error"]["code"] == "missing_scope"
    # the ids the model gave its calls are the audit's call ids
    sent = {part.tool_call_id for message in result.all_messages() if isinstance(message, ModelResponse)
            for part in message.parts if isinstance(part, ToolCallPart)}
    assert {r["call_id"] for r in records} == sent


async def test_a_run_cancelled_mid_call_leaves_one_audit_record_and_no_held_slot(host: ToolHost, gate: Any) -> None:
    model = calls_then_report(ToolCallPart("shop__slow", {"seconds": 30}, tool_call_id="pyd_slow"))
    run = asyncio.create_task(run_agent(host, model, Deps("dave")))
    await asyncio.wait_for(gate.started.wait(), 10)
    assert held(host)["slots"] == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await host.close()  # waits for any call still recording
    [record] = audit_records(host)
    assert (record["call_id"], record["error"]["code"]) == ("pyd_slow", "cancelled")
    assert not any(held(host).values())


async def test_the_toolset_offers_the_contracts(host: ToolHost) -> None:
    agent = Agent(TestModel(call_tools=[]), toolsets=[AmplifierToolset(host, tools=["shop__orders_lookup"])])
    seen: list[Any] = []

    def capture(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("ok")])

    await agent.run("list", model=FunctionModel(capture))
    [definition] = seen
    assert definition.name == "shop__orders_lookup"
    assert definition.parameters_json_schema["required"] == ["order_id"]
    assert definition.strict is True
    assert definition.description == "Look an order up by its id."


async def test_an_unknown_tool_name_is_refused_naming_it(host: ToolHost) -> None:
    with pytest.raises(ValueError, match="'nope' names no tool"):
        AmplifierToolset(host, tools=["nope"])


async def test_the_runs_deadline_bounds_the_call(host: ToolHost, gate: Any) -> None:
    from datetime import datetime, timedelta, timezone

    from pydantic_ai.exceptions import ToolFailed
    from pydantic_ai.usage import RunUsage

    toolset = AmplifierToolset(host, tools=["shop__slow"])
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage(), tool_call_id="pyd_deadline",
                     deadline=datetime.now(timezone.utc) + timedelta(seconds=1))
    tool = (await toolset.get_tools(ctx))["shop__slow"]
    with pytest.raises(ToolFailed, match=r"^Error \(PolicyError, timeout\)"):
        await toolset.call_tool("shop__slow", {"seconds": 30}, ctx, tool)
    [record] = audit_records(host)
    assert (record["call_id"], record["error"]["code"]) == ("pyd_deadline", "timeout")


@pytest.mark.parametrize("arguments, problem", [
    ("not json", "not valid JSON: Expecting value"),
    ('{"order_id": "A"', "not valid JSON"),
    ("[1, 2]", "must be a JSON object, got list"),
    ('{"order_id": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
async def test_malformed_arguments_reach_the_host_and_are_recorded(host: ToolHost, arguments: str,
                                                                   problem: str) -> None:
    model = calls_then_report(ToolCallPart("shop__orders_lookup", arguments, tool_call_id="pyd_bad"))
    seen = await run_agent(host, model, Deps("alice"))
    outcome, content = seen["pyd_bad"]
    assert outcome == "failed" and content.startswith("Error (ContractError, invalid_input)") and problem in content
    [record] = audit_records(host)
    assert record["call_id"] == "pyd_bad" and record["error"]["code"] == "invalid_input"


async def test_a_named_tool_unmounted_later_is_left_out_with_a_warning(host: ToolHost,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    toolset = AmplifierToolset(host, tools=["shop::orders.lookup", "shop::orders.refund"])
    host.tools.remove("shop::orders.refund")
    agent = Agent(TestModel(), toolsets=[toolset])
    result = await agent.run("go")
    assert "shop__orders_lookup" in result.output
    assert "no longer mounted" in caplog.text and "shop::orders.refund" in caplog.text
