"""LangChain and LangGraph run our tools through the host: whole ``create_agent`` runs with a scripted
chat model (no network), LangGraph's ``ToolNode`` async and sync, and a LangChain tool mounted on
the host."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest
from integration_helpers import REFUND_SCOPE, audit_records, held, shop_host
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolArg, InjectedToolCallId, StructuredTool, ToolException
from langchain_core.tools import tool as lc_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from amplifier_tools import Deny, ToolContext, ToolHost, hookimpl
from amplifier_tools.integrations.langchain import host_tool, tools


class ScriptedChatModel(BaseChatModel):
    """Turn 1 answers with ``tool_calls``; later turns report every ``ToolMessage`` seen, as JSON."""

    tool_calls: list[dict[str, Any]]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        seen = {m.tool_call_id: [m.status, m.content] for m in messages if isinstance(m, ToolMessage)}
        reply = AIMessage(content=json.dumps(seen)) if seen else AIMessage(content="", tool_calls=self.tool_calls)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def tool_graph(node: ToolNode) -> Any:
    """A one-node LangGraph graph: the ``ToolNode`` runs the tool calls of the last message."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def tool_call(name: str, call_id: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def from_config(config: RunnableConfig) -> ToolContext:
    user = config.get("configurable", {}).get("user", {})
    return ToolContext(principal=user.get("name", "nobody"), scopes=frozenset(user.get("scopes", ())))


async def run_agent(host: ToolHost, calls: list[dict[str, Any]], user: dict[str, Any]) -> dict[str, list[Any]]:
    agent = create_agent(ScriptedChatModel(tool_calls=calls), tools(host, context=from_config))
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "help"}]},
                                config={"configurable": {"user": user}})
    return json.loads(state["messages"][-1].content)  # type: ignore[no-any-return]


async def test_the_model_sees_the_output_of_an_allowed_call_and_the_typed_error_of_a_denied_one(
        host: ToolHost) -> None:
    seen = await run_agent(host, [tool_call("shop__orders_lookup", "lc_look", {"order_id": "A1"}),
                                  tool_call("shop__orders_refund", "lc_refund", {"order_id": "A1", "amount": 5})],
                           {"name": "alice"})
    status, content = seen["lc_look"]
    assert status == "success" and json.loads(content)["status"] == "shipped"
    status, content = seen["lc_refund"]
    assert status == "error" and content.startswith("Error (AuthError, missing_scope): ")
    records = {r["call_id"]: r for r in audit_records(host)}
    assert sorted(records) == ["lc_look", "lc_refund"]
    assert {r["principal"] for r in records.values()} == {"alice"}
    assert records["lc_look"]["trace_id"]  # the LangChain run id of the tool run


async def test_scopes_from_the_config_let_the_call_through(host: ToolHost) -> None:
    seen = await run_agent(host, [tool_call("shop__orders_refund", "lc_ok", {"order_id": "C3", "amount": 1})],
                           {"name": "bob", "scopes": [REFUND_SCOPE]})
    assert seen == {"lc_ok": ["success", "refunded 1 on C3"]}
    [record] = audit_records(host)
    assert (record["principal"], record["scopes"], record["call_id"]) == ("bob", [REFUND_SCOPE], "lc_ok")


async def test_bad_arguments_from_the_model_are_a_contract_error_naming_the_field(host: ToolHost) -> None:
    seen = await run_agent(host, [tool_call("shop__orders_refund", "lc_bad", {"order_id": "A1", "amount": "ten"}),
                                  tool_call("shop__orders_lookup", "lc_missing", {})],
                           {"name": "carol", "scopes": [REFUND_SCOPE]})
    status, content = seen["lc_bad"]
    assert status == "error" and "(ContractError, invalid_input)" in content and "/amount" in content
    status, content = seen["lc_missing"]
    assert status == "error" and "/order_id: is a required property and is missing" in content
    assert [r["status"] for r in audit_records(host)] == ["error", "error"]


async def test_a_run_cancelled_mid_call_leaves_one_audit_record_and_no_held_slot(host: ToolHost, gate: Any) -> None:
    run = asyncio.create_task(run_agent(host, [tool_call("shop__slow", "lc_slow", {"seconds": 30})],
                                        {"name": "dave"}))
    await asyncio.wait_for(gate.started.wait(), 10)
    assert held(host)["slots"] == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await host.close()  # waits for any call still recording
    [record] = audit_records(host)
    assert (record["call_id"], record["error"]["code"]) == ("lc_slow", "cancelled")
    assert not any(held(host).values())


async def test_tool_node_runs_the_calls_and_the_tools_carry_the_contract(host: ToolHost) -> None:
    made = {t.name: t for t in tools(host)}
    assert made["shop__orders_lookup"].args_schema == host.tools.resolve("shop__orders_lookup").spec.input_schema
    assert made["shop__orders_lookup"].description == "Look an order up by its id."
    # what bind_tools / create_agent send the model
    from langchain_core.utils.function_calling import convert_to_openai_tool

    sent = convert_to_openai_tool(made["shop__orders_lookup"])["function"]
    assert sent["name"] == "shop__orders_lookup"
    assert sent["parameters"]["properties"] == {"order_id": {"type": "string"}}
    assert sent["parameters"]["required"] == ["order_id"]
    node = ToolNode(list(made.values()))
    graph_input = {"messages": [AIMessage(content="", tool_calls=[
        tool_call("shop__orders_lookup", "node_1", {"order_id": "Z9"})])]}
    out = await tool_graph(node).ainvoke(graph_input)
    message = out["messages"][-1]
    assert isinstance(message, ToolMessage) and message.tool_call_id == "node_1"
    assert json.loads(message.content)["order_id"] == "Z9"
    assert [r["call_id"] for r in audit_records(host)] == ["node_1"]


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own (where a sync application keeps its host)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_sync_invocation_runs_on_the_hosts_loop_in_another_thread(tmp_path: Any,
                                                                    loop_thread: asyncio.AbstractEventLoop) -> None:
    from integration_helpers import lookup_order

    (tmp_path / "w").mkdir()
    started = ToolHost(plugins=[lookup_order], builtins=["audit"], entry_points=False, discover=False,
                       working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")})
    asyncio.run_coroutine_threadsafe(started.start(), loop_thread).result(10)
    try:
        [lookup] = tools(started, loop=loop_thread)
        message = lookup.invoke(tool_call("shop__orders_lookup", "sync_1", {"order_id": "S1"}))
        assert isinstance(message, ToolMessage) and json.loads(message.content)["order_id"] == "S1"
        failed = lookup.invoke(tool_call("shop__orders_lookup", "sync_2", {"order_id": 1}))
        assert failed.status == "error" and "/order_id" in failed.content
        out = tool_graph(ToolNode([lookup])).invoke({"messages": [AIMessage(content="", tool_calls=[
            tool_call("shop__orders_lookup", "sync_3", {"order_id": "S3"})])]})
        assert json.loads(out["messages"][-1].content)["order_id"] == "S3"
    finally:
        asyncio.run_coroutine_threadsafe(started.close(), loop_thread).result(10)
    assert [r["call_id"] for r in audit_records(started)] == ["sync_1", "sync_2", "sync_3"]


async def test_sync_invocation_from_the_hosts_own_loop_is_refused_not_deadlocked(host: ToolHost) -> None:
    [lookup] = tools(host, tools=["shop__orders_lookup"])
    with pytest.raises(RuntimeError, match="use ainvoke"):
        lookup.invoke(tool_call("shop__orders_lookup", "x", {"order_id": "A"}))
    assert audit_records(host) == []


class DenyDeletes:
    """A policy plugin: every call of ``delete_file`` is denied."""

    name = "deny-deletes"

    @hookimpl
    def tool_pre(self, call: Any) -> Deny | None:
        return Deny("deleting files is not allowed here", code="no_deletes") if call.name == "delete_file" else None


async def test_a_langchain_tool_mounted_on_the_host_is_denied_by_its_policy_and_audited(tmp_path: Any) -> None:
    deleted: list[str] = []

    def delete_file(path: str) -> str:
        """Delete a file."""
        deleted.append(path)
        return f"deleted {path}"

    def read_note(title: str) -> str:
        """Read a note."""
        if title == "missing":
            raise ToolException("no such note")
        return f"note {title}"

    delete = StructuredTool.from_function(delete_file)
    read = StructuredTool.from_function(read_note, handle_tool_error=True)
    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[host_tool(delete), host_tool(read, effect="Pure"), DenyDeletes()],
                        builtins=["audit"], entry_points=False, discover=False, working_dir=tmp_path / "w",
                        config={"state_dir": str(tmp_path / "s")}) as wrapped:
        assert wrapped.tools.resolve("read_note").spec.input_schema["required"] == ["title"]
        denied = await wrapped.call("delete_file", {"path": "/etc/passwd"}, call_id="c1")
        allowed = await wrapped.call("read_note", {"title": "todo"}, call_id="c2")
        invalid = await wrapped.call("read_note", {"title": 3}, call_id="c3")
        failing = await wrapped.call("read_note", {"title": "missing"}, call_id="c4")
    assert (denied.error or {})["code"] == "no_deletes" and deleted == []
    assert allowed.output == "note todo"
    assert (invalid.error or {})["type"] == "ContractError" and "/title" in (invalid.error or {})["message"]
    assert (failing.error or {})["type"] == "ExecutionError" and "no such note" in (failing.error or {})["message"]
    assert {r["tool"]: r["effect"] for r in audit_records(wrapped)} == {
        "delete_file": "ExternalSideEffects", "read_note": "Pure"}
    assert [(r["call_id"], r["status"]) for r in audit_records(wrapped)] == [
        ("c1", "error"), ("c2", "ok"), ("c3", "error"), ("c4", "error")]


async def test_the_agents_runtime_context_can_name_the_principal(host: ToolHost) -> None:
    """``create_agent(context_schema=...)`` and ``ainvoke(..., context=...)``: the context function reads
    LangGraph's runtime, as a LangChain v1 tool would through ``ToolRuntime``."""
    from dataclasses import dataclass

    from langgraph.runtime import get_runtime

    @dataclass
    class Caller:
        user: str
        scopes: tuple[str, ...] = ()

    def who(config: RunnableConfig) -> ToolContext:
        caller = get_runtime(Caller).context
        return ToolContext(principal=caller.user, scopes=frozenset(caller.scopes))

    model = ScriptedChatModel(tool_calls=[tool_call("shop__orders_refund", "rt_1", {"order_id": "R", "amount": 2})])
    agent = create_agent(model, tools(host, context=who), context_schema=Caller)
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "refund"}]},
                                context=Caller("zed", (REFUND_SCOPE,)))
    assert json.loads(state["messages"][-1].content) == {"rt_1": ["success", "refunded 2 on R"]}
    [record] = audit_records(host)
    assert (record["principal"], record["call_id"]) == ("zed", "rt_1")


async def test_a_sync_agent_run_blocking_the_hosts_loop_is_a_clear_error_not_a_deadlock(host: ToolHost) -> None:
    # agent.invoke on the host loop's own thread: LangGraph runs the tool in a worker thread, which
    # waits for the loop, which waits for agent.invoke.
    calls = [tool_call("shop__orders_lookup", "dead_1", {"order_id": "A"})]
    agent = create_agent(ScriptedChatModel(tool_calls=calls), tools(host, stall_timeout=10))
    started = asyncio.get_running_loop().time()
    with pytest.raises(RuntimeError, match="deadlock"):
        agent.invoke({"messages": [{"role": "user", "content": "help"}]})
    assert asyncio.get_running_loop().time() - started < 5  # the blocked loop thread is seen, no full stall_timeout
    await asyncio.sleep(0.1)
    assert audit_records(host) == []  # cancelled before it started: nothing ran


def test_a_sync_call_whose_waiter_gives_up_is_cancelled_and_recorded(tmp_path: Any,
                                                                      loop_thread: asyncio.AbstractEventLoop) -> None:
    import time

    from integration_helpers import GATE, Gate, slow

    (tmp_path / "w").mkdir()
    started = ToolHost(plugins=[slow], builtins=["audit"], entry_points=False, discover=False,
                       working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")})
    asyncio.run_coroutine_threadsafe(started.start(), loop_thread).result(10)

    async def make_gate() -> None:
        GATE["current"] = Gate()

    asyncio.run_coroutine_threadsafe(make_gate(), loop_thread).result(10)
    try:
        [tool] = tools(started, loop=loop_thread, stall_timeout=0.3)
        # Once the tool runs, block the loop for longer than stall_timeout: the waiting thread gives up.
        asyncio.run_coroutine_threadsafe(GATE["current"].started.wait(), loop_thread).add_done_callback(
            lambda _: loop_thread.call_soon_threadsafe(time.sleep, 1.0))
        with pytest.raises(RuntimeError, match="run nothing"):
            tool.invoke(tool_call("shop__slow", "given_up", {"seconds": 5}))
        time.sleep(1.2)
    finally:
        asyncio.run_coroutine_threadsafe(started.close(), loop_thread).result(10)
    [record] = audit_records(started)
    assert record["call_id"] == "given_up" and record["error"]["code"] == "cancelled"


async def test_the_calls_of_one_agent_run_share_its_run_id_as_trace_id(host: ToolHost) -> None:
    import uuid

    calls = [tool_call("shop__orders_lookup", "t1", {"order_id": "A"}),
             tool_call("shop__orders_lookup", "t2", {"order_id": "B"})]
    agent = create_agent(ScriptedChatModel(tool_calls=calls), tools(host))
    run_id = uuid.uuid4()
    await agent.ainvoke({"messages": [{"role": "user", "content": "help"}]}, config={"run_id": run_id})
    assert [r["trace_id"] for r in audit_records(host)] == [str(run_id), str(run_id)]


def test_host_tool_refuses_a_tool_with_injected_arguments_but_takes_the_call_id() -> None:

    @lc_tool
    def needs_user(x: int, user: Annotated[str, InjectedToolArg]) -> str:
        """Needs a user."""
        return user

    @lc_tool
    def needs_runtime(x: int, runtime: ToolRuntime) -> str:
        """Needs the runtime."""
        return "x"

    @lc_tool
    def takes_call_id(x: int, call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Takes the call id."""
        return call_id

    for refused, argument in ((needs_user, "user"), (needs_runtime, "runtime")):
        with pytest.raises(TypeError, match=f"injected arguments \\({argument}\\)"):
            host_tool(refused)
    assert host_tool(takes_call_id).input_schema["properties"] == {"x": {"type": "integer"}}


async def test_a_host_tool_taking_the_tool_call_id_gets_the_hosts_call_id(tmp_path: Any) -> None:
    @lc_tool
    def echo_call_id(x: int, call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Echo the call id."""
        return call_id

    (tmp_path / "w").mkdir()
    async with ToolHost(plugins=[host_tool(echo_call_id)], builtins=False, entry_points=False, discover=False,
                        working_dir=tmp_path / "w", config={"state_dir": str(tmp_path / "s")}) as started:
        result = await started.call("echo_call_id", {"x": 1}, call_id="cid_7")
    assert result.success and result.output == "cid_7"


def test_a_sync_agent_run_blocking_a_uvloop_hosts_loop_is_seen_within_probes(tmp_path: Path) -> None:
    """Found by running on uvloop, which keeps no ``_thread_id``: the blocked loop thread was not
    seen, so the deadlock was reported after the whole ``stall_timeout`` (here 10 s), not after a
    few probes as on asyncio's loop."""
    from helpers import run_on

    from amplifier_tools.integrations import langchain

    async def scenario() -> float:
        async with shop_host(tmp_path) as started:
            calls = [tool_call("shop__orders_lookup", "dead_1", {"order_id": "A"})]
            agent = create_agent(ScriptedChatModel(tool_calls=calls), tools(started, stall_timeout=10))
            loop = asyncio.get_running_loop()
            assert not hasattr(loop, "_thread_id")  # uvloop's
            begun = time.monotonic()
            with pytest.raises(RuntimeError, match="deadlock"):
                agent.invoke({"messages": [{"role": "user", "content": "help"}]})
            return time.monotonic() - begun

    assert run_on("uvloop", scenario()) < 5
    assert not langchain._LOOP_THREADS or all(not loop.is_running() for loop in langchain._LOOP_THREADS)
