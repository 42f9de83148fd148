"""Our host against its peers' tool-call paths, per call, side by side in one process (issue 16).

Every variant calls the same no-op tool (it returns ``"ok"``) with bench_core's ``ARGS`` against the
same argument schema (``path`` a string and required, ``limit`` an integer ≥ 0); all of them are
measured in one interleaved run, in process, with no network and no model.

Cases:
- ours: the bare host (``builtins=False``, no plugins), the bare host with bench_core's 4 no-op
  plugins on ``tool_pre``/``tool_post``, and the default host (every built-in, bench_core's
  ``_default_host``) with the same 4 plugins; each through ``host.call(name, ARGS)``.
- openai-agents: a ``function_tool`` for the same function, called through
  ``FunctionTool.on_invoke_tool(ctx, json_string)`` with one ``ToolContext`` built up front; and the
  same tool with 4 input + 4 output tool guardrails that allow, run around ``on_invoke_tool`` by the
  runner's own guardrail helpers (as ``Runner`` does for a function call).
- pydantic-ai: ``ToolManager.handle_call`` over a ``FunctionToolset``, the manager prepared for a run
  step with a ``RunContext`` (``TestModel``, never called); and the same with 4 capabilities that
  implement ``before_tool_execute`` and ``after_tool_execute`` and return what they are given.
- LangGraph: ``ToolNode([tool]).ainvoke`` with an ``AIMessage`` carrying the tool call (the node's
  ``Runtime`` passed in the config, as a graph passes it); and the same node with 4 pass-through
  ``awrap_tool_call`` wrappers composed outermost first, as langchain's ``create_agent`` composes
  4 middleware's ``awrap_tool_call``.
- MCP SDK: ``MCPServer.call_tool`` (the server's tool path: argument model, call, result conversion)
  and ``Client(server).call_tool`` over the SDK's in-memory transport.

Targets (issue 16; ratio = ours / peer, lower is faster): the bare host ≤ openai-agents'
``on_invoke_tool``; the default host with 4 plugins faster than openai-agents with 4 + 4 guardrails,
than pydantic-ai with 4 capabilities and than LangGraph's ``ToolNode`` with 4 middleware. The other
rows orient. A peer that is not installed gets a row saying so.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from .bench_core import ARGS, NoopTool, _default_host, _host
from .harness import Row, interleaved, isolated_state, row, run_async

Variant = Callable[[], Awaitable[Any]]
ARGS_JSON = json.dumps(ARGS)
HOOKS = 4


def _peer_function() -> Callable[..., Awaitable[str]]:
    """The peers' tool: ``SCHEMA`` as a Python signature (pydantic builds the argument model from it)."""
    from typing import Annotated

    from pydantic import Field

    async def noop(path: str, limit: int = 10) -> str:
        """does nothing"""
        return "ok"

    # Real objects, not this module's postponed (string) annotations, which name a local import.
    noop.__annotations__ = {"path": str, "limit": Annotated[int, Field(ge=0)], "return": str}
    return noop


def _check(got: Any, where: str) -> None:
    if "ok" not in str(got):
        raise RuntimeError(f"{where} did not return the tool's output: {got!r}")


async def _openai_agents(stack: contextlib.AsyncExitStack, notes: dict[str, str]) -> dict[str, Variant]:
    from agents import Agent, ToolGuardrailFunctionOutput, function_tool, tool_input_guardrail, tool_output_guardrail
    from agents.tool_context import ToolContext

    fn = _peer_function()
    tool = function_tool(fn, name_override="noop")
    ctx = ToolContext(context=None, tool_name="noop", tool_call_id="call-1", tool_arguments=ARGS_JSON)
    _check(await tool.on_invoke_tool(ctx, ARGS_JSON), "openai-agents on_invoke_tool")
    variants: dict[str, Variant] = {"openai-agents": lambda: tool.on_invoke_tool(ctx, ARGS_JSON)}
    notes["openai-agents"] = ("function_tool (default strict schema; pydantic checks path/limit, ignores unknown "
                              "keys), on_invoke_tool(ctx, json string): parses the JSON itself; one ToolContext "
                              "reused (the runner builds one per call, not counted)")

    def allow_in(i: int) -> Any:
        return tool_input_guardrail(name=f"allow-in-{i}")(lambda data: ToolGuardrailFunctionOutput.allow())

    def allow_out(i: int) -> Any:
        return tool_output_guardrail(name=f"allow-out-{i}")(lambda data: ToolGuardrailFunctionOutput.allow())

    try:
        guarded = function_tool(fn, name_override="noop", tool_input_guardrails=[allow_in(i) for i in range(HOOKS)],
                                tool_output_guardrails=[allow_out(i) for i in range(HOOKS)])
    except TypeError:
        notes["openai-agents+guardrails"] = "this openai-agents version has no tool guardrails"
        return variants
    agent = Agent(name="bench", tools=[guarded])
    try:  # the helpers Runner runs a function call's guardrails with
        from agents.run_internal.tool_execution import (
            _execute_tool_input_guardrails,
            _execute_tool_output_guardrails,
        )
        how = "the runner's _execute_tool_input/output_guardrails"
    except ImportError:  # the same loop through the public guardrail API
        from agents.tool_guardrails import ToolInputGuardrailData, ToolOutputGuardrailData

        async def _execute_tool_input_guardrails(*, func_tool: Any, tool_context: Any, agent: Any,
                                                 tool_input_guardrail_results: list[Any]) -> None:
            for guardrail in func_tool.tool_input_guardrails:
                await guardrail.run(ToolInputGuardrailData(context=tool_context, agent=agent))

        async def _execute_tool_output_guardrails(*, func_tool: Any, tool_context: Any, agent: Any, real_result: Any,
                                                  tool_output_guardrail_results: list[Any]) -> Any:
            for guardrail in func_tool.tool_output_guardrails:
                await guardrail.run(ToolOutputGuardrailData(context=tool_context, agent=agent, output=real_result))
            return real_result
        how = "a loop over guardrail.run (the runner's helpers were not found)"

    async def with_guardrails() -> Any:
        await _execute_tool_input_guardrails(func_tool=guarded, tool_context=ctx, agent=agent,
                                             tool_input_guardrail_results=[])
        result = await guarded.on_invoke_tool(ctx, ARGS_JSON)
        await _execute_tool_output_guardrails(func_tool=guarded, tool_context=ctx, agent=agent, real_result=result,
                                              tool_output_guardrail_results=[])
        return result

    _check(await with_guardrails(), "openai-agents with guardrails")
    variants["openai-agents+guardrails"] = with_guardrails
    notes["openai-agents+guardrails"] = (f"{HOOKS} input + {HOOKS} output tool guardrails returning allow(), "
                                         f"run by {how} around on_invoke_tool")
    return variants


async def _pydantic_ai(stack: contextlib.AsyncExitStack, notes: dict[str, str]) -> dict[str, Variant]:
    from dataclasses import dataclass

    from pydantic_ai import RunContext
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tool_manager import ToolManager
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RunUsage

    toolset = await stack.enter_async_context(FunctionToolset([_peer_function()]))
    call = ToolCallPart(tool_name="noop", args=dict(ARGS), tool_call_id="call-1")

    async def manager(root: Any) -> Any:
        ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())
        return await ToolManager(toolset, root_capability=root).for_run_step(ctx)

    bare = await manager(None)
    _check(await bare.handle_call(call), "pydantic-ai handle_call")
    variants: dict[str, Variant] = {"pydantic-ai": lambda: bare.handle_call(call)}
    notes["pydantic-ai"] = ("ToolManager.handle_call (validate + execute), no root capability; args as a dict; "
                            "the argument model forbids unknown keys")
    try:
        from pydantic_ai.capabilities import AbstractCapability, CombinedCapability
    except ImportError:
        notes["pydantic-ai+capabilities"] = "this pydantic-ai version has no capabilities"
        return variants

    @dataclass
    class PassThrough(AbstractCapability[Any]):
        index: int = 0

        async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
            return args

        async def after_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, result: Any) -> Any:
            return result

    hooked = await manager(CombinedCapability([PassThrough(i) for i in range(HOOKS)]))
    _check(await hooked.handle_call(call), "pydantic-ai handle_call with capabilities")
    variants["pydantic-ai+capabilities"] = lambda: hooked.handle_call(call)
    notes["pydantic-ai+capabilities"] = (f"{HOOKS} capabilities (before_tool_execute + after_tool_execute returning "
                                         "their input) as the ToolManager's root capability")
    return variants


async def _langgraph(stack: contextlib.AsyncExitStack, notes: dict[str, str]) -> dict[str, Variant]:
    import inspect

    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolNode
    from pydantic import BaseModel, ConfigDict, Field

    class NoopArgs(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str
        limit: int = Field(10, ge=0)

    tool = StructuredTool.from_function(coroutine=_peer_function(), name="noop", description="does nothing",
                                        args_schema=NoopArgs)
    state = {"messages": [AIMessage(content="", tool_calls=[{"name": "noop", "args": dict(ARGS), "id": "call-1"}])]}
    config: dict[str, Any] = {}
    try:  # the Runtime a graph hands its nodes (ToolNode refuses to run without one)
        from langgraph._internal._constants import CONFIG_KEY_RUNTIME
        from langgraph.runtime import Runtime

        config = {"configurable": {CONFIG_KEY_RUNTIME: Runtime()}}
    except ImportError:
        pass
    node = ToolNode([tool])
    _check(await node.ainvoke(state, config), "LangGraph ToolNode")
    variants: dict[str, Variant] = {"langgraph": lambda: node.ainvoke(state, config)}
    notes["langgraph"] = ("ToolNode.ainvoke({'messages': [AIMessage with the tool call]}); the args model forbids "
                          "unknown keys")
    if "awrap_tool_call" not in inspect.signature(ToolNode).parameters:
        notes["langgraph+middleware"] = "this langgraph's ToolNode has no awrap_tool_call (tool-call middleware)"
        return variants

    async def pass_through(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await handler(request)

    def compose(outer: Any, inner: Any) -> Any:  # outer's handler runs inner (first = outermost)
        async def composed(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
            return await outer(request, lambda req: inner(req, execute))
        return composed

    wrapper = pass_through
    for _ in range(HOOKS - 1):
        wrapper = compose(pass_through, wrapper)
    wrapped = ToolNode([tool], awrap_tool_call=wrapper)
    _check(await wrapped.ainvoke(state, config), "LangGraph ToolNode with wrappers")
    variants["langgraph+middleware"] = lambda: wrapped.ainvoke(state, config)
    notes["langgraph+middleware"] = (f"{HOOKS} pass-through awrap_tool_call wrappers composed as create_agent "
                                     "composes middleware (langchain itself not needed)")
    return variants


async def _mcp(stack: contextlib.AsyncExitStack, notes: dict[str, str]) -> dict[str, Variant]:
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")
    server.tool(name="noop", description="does nothing")(_peer_function())
    _check(await server.call_tool("noop", ARGS), "MCPServer.call_tool")
    client = await stack.enter_async_context(Client(server))
    _check(await client.call_tool("noop", ARGS), "mcp Client.call_tool")
    notes["mcp-server"] = "MCPServer.call_tool (argument model, call, result conversion; unknown keys ignored)"
    notes["mcp-client"] = "Client(server).call_tool: JSON-RPC over the SDK's in-memory streams, same server"
    return {"mcp-server": lambda: server.call_tool("noop", ARGS), "mcp-client": lambda: client.call_tool("noop", ARGS)}


# package: (how to install it, its top-level modules, the setup returning its variants)
PEERS: dict[str, tuple[str, tuple[str, ...], Any]] = {
    "openai-agents": ("pip install openai-agents", ("agents", "pydantic"), _openai_agents),
    "pydantic-ai": ("pip install pydantic-ai-slim", ("pydantic_ai", "pydantic"), _pydantic_ai),
    "langgraph": ("pip install langgraph langchain-core", ("langgraph", "langchain_core", "pydantic"), _langgraph),
    "mcp": ("pip install 'amplifier-tools[mcp]'", ("mcp", "pydantic"), _mcp),
}

# (our variant, peer variant, the peer package, what is compared, target, the target's test)
COMPARISONS: list[tuple[str, str, str, str, str, Callable[[float], bool] | None]] = [
    ("bare", "openai-agents", "openai-agents", "bare host vs openai-agents FunctionTool.on_invoke_tool",
     "ours/peer ≤ 1.0 (issue 16)", lambda ratio: ratio <= 1.0),
    ("bare", "pydantic-ai", "pydantic-ai", "bare host vs pydantic-ai ToolManager.handle_call", "", None),
    ("bare", "langgraph", "langgraph", "bare host vs LangGraph ToolNode", "", None),
    ("bare", "mcp-server", "mcp", "bare host vs MCP SDK MCPServer.call_tool", "", None),
    ("bare", "mcp-client", "mcp", "bare host vs MCP SDK in-memory Client.call_tool", "", None),
    ("bare+4", "openai-agents+guardrails", "openai-agents",
     "bare host + 4 plugins vs openai-agents + 4/4 tool guardrails", "", None),
    ("bare+4", "pydantic-ai+capabilities", "pydantic-ai", "bare host + 4 plugins vs pydantic-ai + 4 capabilities",
     "", None),
    ("bare+4", "langgraph+middleware", "langgraph", "bare host + 4 plugins vs LangGraph ToolNode + 4 middleware",
     "", None),
    ("default+4", "openai-agents+guardrails", "openai-agents",
     "default host + 4 plugins vs openai-agents + 4/4 tool guardrails", "ours/peer < 1.0 (issue 16)",
     lambda ratio: ratio < 1.0),
    ("default+4", "pydantic-ai+capabilities", "pydantic-ai",
     "default host + 4 plugins vs pydantic-ai + 4 capabilities", "ours/peer < 1.0 (issue 16)",
     lambda ratio: ratio < 1.0),
    ("default+4", "langgraph+middleware", "langgraph",
     "default host + 4 plugins vs LangGraph ToolNode + 4 middleware", "ours/peer < 1.0 (issue 16)",
     lambda ratio: ratio < 1.0),
]

OURS_NOTES = {
    "bare": "ToolHost(builtins=False), no plugins",
    "bare+4": "ToolHost(builtins=False) + 4 no-op plugins (tool_pre, tool_post)",
    "default+4": "ToolHost() with every built-in (default audit durability) + 4 no-op plugins",
}


async def _all(quick: bool) -> list[Row]:
    n, rounds, warmup = (100, 2, 20) if quick else (2_000, 7, 200)
    notes: dict[str, str] = {}
    missing: dict[str, str] = {}
    tool = NoopTool()
    async with contextlib.AsyncExitStack() as stack:
        bare = await stack.enter_async_context(_host(0, [tool]))
        bare4 = await stack.enter_async_context(_host(HOOKS, [tool]))
        default4 = await stack.enter_async_context(_default_host(tool))
        variants: dict[str, Variant] = {"bare": lambda: bare.call("noop", ARGS),
                                        "bare+4": lambda: bare4.call("noop", ARGS),
                                        "default+4": lambda: default4.call("noop", ARGS)}
        for host_variant in (bare, bare4, default4):
            result = await host_variant.call("noop", ARGS)
            if not result.success:
                raise RuntimeError(f"our host failed the call: {result.error}")
        for package, (install, modules, setup) in PEERS.items():
            try:
                variants.update(await setup(stack, notes))
            except ModuleNotFoundError as exc:
                missing[package] = (f"not installed ({install})" if exc.name in modules
                                    else f"the installed version lacks what is measured: {exc}")
            except ImportError as exc:
                missing[package] = f"the installed version lacks what is measured: {exc}"
            except Exception as exc:  # a peer whose API moved must not hide the others
                missing[package] = f"could not be set up on the installed version: {type(exc).__name__}: {exc}"
        timings = await interleaved(variants, n=n, rounds=rounds, warmup=warmup)
    rows: list[Row] = []
    for ours, peer, package, case, target, test in COMPARISONS:
        ours_us = timings[ours][0]
        if peer not in timings:
            rows.append(row(f"peers: {case}", ours_us, None, "µs/call", target=target,
                            notes=missing.get(package) or notes.get(peer, "not measured")))
            continue
        peer_us, peer_spread = timings[peer]
        ratio = ours_us / peer_us
        rows.append(row(f"peers: {case}", ours_us, peer_us, "µs/call", ratio=ratio, target=target,
                        met=test(ratio) if test else None, spread=timings[ours][1],
                        notes=f"ours: {OURS_NOTES[ours]}; peer: {notes[peer]}; peer spread {peer_spread:.1f} µs; "
                              f"ratio = ours/peer"))
    return rows


def run(quick: bool) -> list[Row]:
    return list(run_async(_all(quick)))


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
