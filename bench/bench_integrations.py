"""The framework adapters (``amplifier_tools.integrations``, issue 20), per call, in one interleaved run.

Every variant calls bench_core's no-op tool (``SCHEMA``, returns ``"ok"``) with ``ARGS``, in
process, with no model and no network.

Two kinds of rows:
- adapter overhead: each adapter's entry point against ``host.call`` on the same bare host
  (``builtins=False``): the Agents SDK tool's ``on_invoke_tool(ctx, json)``, the Pydantic AI
  toolset's ``call_tool``, the LangChain tool's ``_arun`` (the adapter's own code; LangChain's
  ``BaseTool.arun`` callback machinery around it is the framework's, in the next rows). Target
  (issue 20): the difference ≤ 10 µs.
- the framework's own tool path against the same path running our tool through the host: the
  Agents SDK's ``FunctionTool.on_invoke_tool``; Pydantic AI's ``ToolManager.handle_call``; LangGraph's
  ``ToolNode.ainvoke``, each once with the framework's own tool for the same function and once with
  the adapter's tool on the bare host and on the default host (every built-in: policy, audit with
  its default durability, …). Ratio = through the host / own; it orients (the host does more:
  validation, hooks, policies, audit), no target.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from amplifier_tools import ToolHost

from .bench_core import ARGS, Mount, NoopTool
from .bench_peers import _peer_function
from .harness import Row, interleaved, isolated_state, row, run_async

Variant = Callable[[], Awaitable[Any]]
ARGS_JSON = json.dumps(ARGS)
OVERHEAD_TARGET_US = 10.0
#: (adapter, its entry point measured) and the variant that measures it.
ADAPTERS = (("openai-agents", "FunctionTool.on_invoke_tool"), ("pydantic-ai", "AmplifierToolset.call_tool"),
            ("langchain", "AmplifierTool._arun"))
ADAPTER_VARIANTS = ("agents:bare", "pydantic-ai:adapter", "langchain:adapter")


@contextlib.asynccontextmanager
async def _hosts() -> AsyncIterator[tuple[ToolHost, ToolHost]]:
    """The bare host and the default host (every built-in, as ``ToolHost()`` gives it), each with the tool."""
    with tempfile.TemporaryDirectory(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as base:
        work = os.path.join(base, "work")
        os.mkdir(work)
        async with ToolHost(plugins=[Mount([NoopTool()])], builtins=False, entry_points=False, working_dir=work,
                            discover=False) as bare, \
                ToolHost(plugins=[Mount([NoopTool()])], entry_points=False, working_dir=work, discover=False) as full:
            yield bare, full


def _check(got: Any, where: str) -> None:
    if "ok" not in str(got) or "Error" in str(got):
        raise RuntimeError(f"{where} did not return the tool's output: {got!r}")


async def _openai_agents(bare: ToolHost, full: ToolHost) -> tuple[dict[str, Variant], str]:
    from agents import function_tool
    from agents.tool_context import ToolContext

    from amplifier_tools.integrations.openai_agents import function_tools

    ctx = ToolContext(context=None, tool_name="noop", tool_call_id="call-1", tool_arguments=ARGS_JSON)
    own = function_tool(_peer_function(), name_override="noop")
    [on_bare] = function_tools(bare, tools=["noop"])
    [on_full] = function_tools(full, tools=["noop"])
    variants: dict[str, Variant] = {
        "agents:own": lambda: own.on_invoke_tool(ctx, ARGS_JSON),
        "agents:bare": lambda: on_bare.on_invoke_tool(ctx, ARGS_JSON),
        "agents:default": lambda: on_full.on_invoke_tool(ctx, ARGS_JSON),
    }
    for name, fn in variants.items():
        _check(await fn(), name)
    return variants, "FunctionTool.on_invoke_tool(ctx, json string), one ToolContext reused"


async def _pydantic_ai(bare: ToolHost, full: ToolHost, stack: contextlib.AsyncExitStack,
                       ) -> tuple[dict[str, Variant], str]:
    from pydantic_ai import RunContext
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.tool_manager import ToolManager
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.usage import RunUsage

    from amplifier_tools.integrations.pydantic_ai import AmplifierToolset

    call = ToolCallPart(tool_name="noop", args=dict(ARGS), tool_call_id="call-1")
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())

    async def manager(toolset: Any) -> Any:
        return await ToolManager(await stack.enter_async_context(toolset)).for_run_step(ctx)

    own = await manager(FunctionToolset([_peer_function()]))
    on_bare = await manager(AmplifierToolset(bare, tools=["noop"]))
    on_full = await manager(AmplifierToolset(full, tools=["noop"]))
    direct = AmplifierToolset(bare)
    tool = (await direct.get_tools(ctx))["noop"]
    call_ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage(), tool_call_id="call-1", tool_name="noop")
    variants: dict[str, Variant] = {
        "pydantic-ai:own": lambda: own.handle_call(call),
        "pydantic-ai:bare": lambda: on_bare.handle_call(call),
        "pydantic-ai:default": lambda: on_full.handle_call(call),
        "pydantic-ai:adapter": lambda: direct.call_tool("noop", dict(ARGS), call_ctx, tool),
    }
    for name, fn in variants.items():
        _check(await fn(), name)
    return variants, "ToolManager.handle_call (validate + execute) prepared for one run step"


async def _langgraph(bare: ToolHost, full: ToolHost) -> tuple[dict[str, Variant], str]:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import StructuredTool
    from langgraph.prebuilt import ToolNode
    from pydantic import BaseModel, ConfigDict, Field

    from amplifier_tools.integrations.langchain import tools

    class NoopArgs(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str
        limit: int = Field(10, ge=0)

    own = StructuredTool.from_function(coroutine=_peer_function(), name="noop", description="does nothing",
                                       args_schema=NoopArgs)
    state = {"messages": [AIMessage(content="", tool_calls=[{"name": "noop", "args": dict(ARGS), "id": "call-1"}])]}
    config: dict[str, Any] = {}
    with contextlib.suppress(ImportError):  # the Runtime a graph hands its nodes
        from langgraph._internal._constants import CONFIG_KEY_RUNTIME
        from langgraph.runtime import Runtime

        config = {"configurable": {CONFIG_KEY_RUNTIME: Runtime()}}
    [lc_bare] = tools(bare, tools=["noop"])
    [lc_full] = tools(full, tools=["noop"])
    nodes = {"own": ToolNode([own]), "bare": ToolNode([lc_bare]), "default": ToolNode([lc_full])}
    variants: dict[str, Variant] = {f"langgraph:{k}": (lambda node=node: node.ainvoke(state, config))
                                    for k, node in nodes.items()}
    variants["langchain:adapter"] = lambda: lc_bare._arun(dict(ARGS), "call-1", {})
    for name, fn in variants.items():
        _check(await fn(), name)
    return variants, "ToolNode.ainvoke({'messages': [AIMessage with the tool call]})"


async def _all(quick: bool) -> list[Row]:
    n, rounds, warmup = (100, 2, 20) if quick else (2_000, 7, 200)
    rows: list[Row] = []
    async with _hosts() as (bare, full), contextlib.AsyncExitStack() as stack:
        variants: dict[str, Variant] = {"host.call": lambda: bare.call("noop", ARGS)}
        how: dict[str, str] = {}
        agents, how["openai-agents"] = await _openai_agents(bare, full)
        pydantic, how["pydantic-ai"] = await _pydantic_ai(bare, full, stack)
        graph, how["langgraph"] = await _langgraph(bare, full)
        for group in (agents, pydantic, graph):
            variants.update(group)
        # The adapters against host.call first, in a run of their own: the framework paths (up to a
        # millisecond a call, with much garbage) would otherwise drown a few µs in their noise.
        adapters = {name: variants[name] for name in ("host.call", *ADAPTER_VARIANTS)}
        timings = await interleaved(adapters, n=n, rounds=3 * rounds, warmup=warmup)
        timings.update(await interleaved({k: v for k, v in variants.items() if k not in adapters},
                                         n=n, rounds=rounds, warmup=warmup))
    direct, direct_spread = timings["host.call"]
    for (adapter, entry), variant in zip(ADAPTERS, ADAPTER_VARIANTS, strict=True):
        ours, spread = timings[variant]
        overhead = ours - direct
        rows.append(row(f"integrations: {adapter} adapter overhead over host.call", overhead, None, "µs/call",
                        target=f"≤ {OVERHEAD_TARGET_US:g} µs (issue 20)", met=overhead <= OVERHEAD_TARGET_US,
                        spread=spread, notes=f"{entry} {ours:.1f} µs - host.call {direct:.1f} µs (bare host, "
                                             f"interleaved in a run of their own; spreads {spread:.1f} / "
                                             f"{direct_spread:.1f} µs)"))
    for framework, key in (("openai-agents", "agents"), ("pydantic-ai", "pydantic-ai"), ("langgraph", "langgraph")):
        own, own_spread = timings[f"{key}:own"]
        for host_kind in ("bare", "default"):
            ours, spread = timings[f"{key}:{host_kind}"]
            rows.append(row(f"integrations: {framework} through the {host_kind} host vs its own tool", ours, own,
                            "µs/call", ratio=ours / own, spread=spread,
                            notes=f"{how[framework]}; own: the framework's tool for the same function "
                                  f"(spread {own_spread:.1f} µs); ratio = through the host / own"))
    return rows


def run(quick: bool) -> list[Row]:
    return list(run_async(_all(quick)))


if __name__ == "__main__":
    with isolated_state():
        for r in run(quick=False):
            print(r)
