"""The host's tools as LangChain ``BaseTool``s, and a LangChain tool as a tool of the host (extra
``langchain``).

``tools(host)`` gives one ``BaseTool`` per mounted tool, for ``langchain.agents.create_agent``,
LangGraph's ``ToolNode`` or ``model.bind_tools``: the model-facing name, the contract's description,
its input schema as the tool's JSON-schema ``args_schema``. Invoked with a model's tool call, the
call runs ``host.call`` with the tool-call id as the call id; the ``ToolContext`` comes from your
function of the ``RunnableConfig`` (for example its ``configurable`` keys), and the LangChain run id
of the tool run fills ``trace_id`` when the context has none. LangChain does not validate the
arguments here; the host does, so a bad argument is its ``ContractError`` naming the field.

A failed call becomes a ``ToolMessage`` with ``status="error"`` and the text
``Error (<type>, <code>): <message>`` (through LangChain's ``handle_tool_error``), never an exception
in the agent loop. Async invocation (``ainvoke``, async graphs) is the native path. Sync invocation
(``invoke``) blocks on the event loop the host runs on, so that loop must be running in another
thread (the loop that is running when ``tools()`` is called, or ``loop=``); from that loop's own
thread use ``ainvoke``.

``host_tool(tool)`` goes the other way: a LangChain tool becomes a tool that a ``ToolHost`` mounts,
so its calls pass the host's validation, policies and audit.

Not carried over: LangChain's injected arguments (``InjectedToolArg``, ``ToolRuntime``) and
``return_direct`` are not offered on the tools made here; streaming of tool output and LangChain
middleware are the framework's and run around these tools unchanged (the host's hooks run inside).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict

from ..definitions import model_name
from ..host import ToolHost
from ..models import ToolContext, ToolResult
from ..spec import Effect
from ._common import call_context, model_text, select_specs

__all__ = ["AmplifierTool", "host_tool", "tools"]

#: A function from the invocation's ``RunnableConfig`` to the call's ``ToolContext``.
ContextFunction = Callable[[RunnableConfig], ToolContext]


def tools(host: ToolHost, *, context: ToolContext | ContextFunction | None = None,
          tools: Iterable[str] | None = None, loop: asyncio.AbstractEventLoop | None = None,
          max_output_chars: int | None = 50_000) -> list[AmplifierTool]:
    """One LangChain tool per mounted tool (or per name in ``tools``), each calling ``host``.

    ``context`` is the calls' ``ToolContext``, or a function building it from the invocation's
    ``RunnableConfig``; without it the host's default context is used. ``loop`` is the event loop
    the host runs on, needed only for sync invocation (default: the loop running now, if any).
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    return [AmplifierTool(name=model_name(spec.name), description=spec.description or spec.title or spec.name,
                          args_schema=spec.input_schema, host=host, tool_name=spec.name, context_source=context,
                          host_loop=loop, max_output_chars=max_output_chars)
            for spec in select_specs(host, tools)]


class AmplifierTool(BaseTool):
    """One of the host's tools as a LangChain tool (made by :func:`tools`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    host: Any
    tool_name: str
    context_source: Any = None
    host_loop: Any = None
    max_output_chars: int | None = 50_000
    handle_tool_error: bool | str | Callable[[ToolException], str] | None = True

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any], tool_call_id: str | None,
                            ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The arguments go to the host as the model sent them (it validates them); the model's
        # tool-call id becomes the host's call id.
        return (), {"arguments": tool_input, "call_id": tool_call_id}

    async def _arun(self, arguments: Any, call_id: str | None, config: RunnableConfig,
                    run_manager: AsyncCallbackManagerForToolRun | None = None) -> str:
        run_id = str(run_manager.run_id) if run_manager is not None else None
        context = call_context(self.host, self.context_source, config, run_id)
        result = await self.host.call(self.tool_name, arguments, context=context, call_id=call_id or None)
        text = model_text(result, self.max_output_chars)
        if not result.success:
            raise ToolException(text)  # handle_tool_error turns it into a ToolMessage with status "error"
        return text

    def _run(self, arguments: Any, call_id: str | None, config: RunnableConfig,
             run_manager: CallbackManagerForToolRun | None = None) -> str:
        loop = self.host_loop
        if loop is None or not loop.is_running():
            raise RuntimeError(f"{self.name}: sync invoke() needs the event loop the host runs on, running in "
                               "another thread (pass loop= to tools()); in async code use ainvoke()")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(f"{self.name}: sync invoke() from the host's own event loop would block it; "
                               "use ainvoke()")
        run_id = str(run_manager.run_id) if run_manager is not None else None
        context = call_context(self.host, self.context_source, config, run_id)
        future = asyncio.run_coroutine_threadsafe(
            self.host.call(self.tool_name, arguments, context=context, call_id=call_id or None), loop)
        result: ToolResult = future.result()
        text = model_text(result, self.max_output_chars)
        if not result.success:
            raise ToolException(text)
        return text


def host_tool(tool: BaseTool, *, name: str | None = None, effect: Effect | str = Effect.ExternalSideEffects,
              ) -> _LangChainTool:
    """A LangChain tool as a tool for ``ToolHost`` (mount it with a plugin or ``coordinator.mount``).

    The contract's input schema is the one LangChain sends models for it (injected arguments left
    out); ``effect`` is what the tool does, which LangChain does not say, so it defaults to
    the most cautious. The tool runs with the host's call id as its tool-call id; a ``ToolMessage``
    it returns with ``status="error"`` (a handled ``ToolException``) is an ``ExecutionError``.
    """
    return _LangChainTool(tool, name or tool.name, Effect(effect))


class _LangChainTool:
    """A LangChain ``BaseTool`` behind the host's tool interface."""

    def __init__(self, tool: BaseTool, name: str, effect: Effect) -> None:
        self.tool = tool
        self.name = name
        self.description = tool.description
        # LangChain's own conversion for model APIs: the tool-call schema, injected arguments left out.
        self.input_schema: dict[str, Any] = dict(convert_to_openai_tool(tool)["function"]["parameters"])
        self.effect = effect

    async def execute(self, input: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        call_id = context.call_id if context is not None and context.call_id else "call"
        message = await self.tool.ainvoke({"type": "tool_call", "name": self.tool.name, "args": input, "id": call_id})
        content = message.content if isinstance(message, ToolMessage) else message
        if isinstance(message, ToolMessage) and message.status == "error":
            return ToolResult(success=False, output=content,
                              error={"type": "ExecutionError", "code": "tool_error", "message": str(content)})
        return ToolResult(success=True, output=content if isinstance(content, (str, dict, list)) else json.dumps(
            content, default=str))
