"""The host's tools as LangChain ``BaseTool``s, and a LangChain tool as a tool of the host (extra
``langchain``).

``tools(host)`` gives one ``BaseTool`` per mounted tool, for ``langchain.agents.create_agent``,
LangGraph's ``ToolNode`` or ``model.bind_tools``: the model-facing name, the contract's description,
its input schema as the tool's JSON-schema ``args_schema``. Invoked with a model's tool call, the
call runs ``host.call`` with the tool-call id as the call id; the ``ToolContext`` comes from your
function of the ``RunnableConfig`` (for example its ``configurable`` keys), and the LangChain run id
of the whole graph run fills ``trace_id`` when the context has none — LangGraph knows it when the
caller names it (``agent.invoke(..., config={"run_id": ...})``), so every call of that agent run
shares it; otherwise it is the run that called the tool (the tool's parent run). LangChain does not validate the
arguments here; the host does, so a bad argument is its ``ContractError`` naming the field.

A failed call becomes a ``ToolMessage`` with ``status="error"`` and the text
``Error (<type>, <code>): <message>`` (through LangChain's ``handle_tool_error``), never an exception
in the agent loop. Async invocation (``ainvoke``, async graphs) is the native path. Sync invocation
(``invoke``) blocks on the event loop the host runs on, so that loop must be running in another
thread (the loop that is running when ``tools()`` is called, or ``loop=``); from that loop's own
thread use ``ainvoke``. A sync call whose host loop stops making progress — typically because the
loop's own thread is blocked in ``agent.invoke`` while LangGraph runs the tool in a worker thread,
a deadlock — ends in a ``RuntimeError`` saying so (after ``stall_timeout`` seconds) instead of
hanging; if the waiting thread gives up, the host call is cancelled (recorded ``cancelled``).

``host_tool(tool)`` goes the other way: a LangChain tool becomes a tool that a ``ToolHost`` mounts,
so its calls pass the host's validation, policies and audit; a tool with injected arguments
(``InjectedToolArg``, ``ToolRuntime``, ``InjectedState``...) other than the tool-call id is refused
at wrap time, since the host has nothing to inject.

Not carried over: LangChain's injected arguments (``InjectedToolArg``, ``ToolRuntime``) and
``return_direct`` are not offered on the tools made here; streaming of tool output and LangChain
middleware are the framework's and run around these tools unchanged (the host's hooks run inside).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast

from ..errors import missing_extra

try:
    from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
    from langchain_core.messages import ToolMessage
    from langchain_core.messages.content import create_file_block, create_image_block, create_text_block
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, InjectedToolCallId, ToolException
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise missing_extra("langchain", exc) from exc

from ..definitions import model_name
from ..host import ToolHost
from ..models import ToolContext, ToolResult
from ..spec import Effect, to_effect
from ._common import (
    call_context,
    call_host,
    framework_call_id,
    media_block,
    model_parts,
    model_text,
    rich_result,
    select_specs,
    sendable,
    sendable_schema,
)

__all__ = ["AmplifierTool", "host_tool", "tools"]

#: A function from the invocation's ``RunnableConfig`` to the call's ``ToolContext``.
ContextFunction = Callable[[RunnableConfig], ToolContext]


def tools(host: ToolHost, *, context: ToolContext | ContextFunction | None = None,
          tools: Iterable[str] | None = None, loop: asyncio.AbstractEventLoop | None = None,
          max_output_chars: int | None = 50_000, stall_timeout: float = 5.0) -> list[AmplifierTool]:
    """One LangChain tool per mounted tool (or per name in ``tools``), each calling ``host``.

    ``context`` is the calls' ``ToolContext``, or a function building it from the invocation's
    ``RunnableConfig``; without it the host's default context is used. ``loop`` is the event loop
    the host runs on, needed only for sync invocation (default: the loop running now, if any).
    ``stall_timeout`` is how long a sync invocation waits for that loop to respond at all before
    it reports the loop as blocked (a deadlock) instead of waiting for ever.
    """
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        else:
            _note_loop_thread(loop)
    return [AmplifierTool(name=model_name(spec.name), description=sendable(spec.description or spec.title or spec.name),
                          args_schema=sendable_schema(spec.input_schema), host=host, tool_name=spec.name,
                          context_source=context, host_loop=loop, max_output_chars=max_output_chars,
                          stall_timeout=stall_timeout)
            for spec in select_specs(host, tools)]


class AmplifierTool(BaseTool):
    """One of the host's tools as a LangChain tool (made by :func:`tools`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    host: Any
    tool_name: str
    context_source: Any = None
    host_loop: Any = None
    max_output_chars: int | None = 50_000
    stall_timeout: float = 5.0
    handle_tool_error: bool | str | Callable[[ToolException], str] | None = True

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any], tool_call_id: str | None,
                            ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # The arguments go to the host as the model sent them (it validates them); the model's
        # tool-call id becomes the host's call id.
        return (), {"arguments": tool_input, "call_id": tool_call_id}

    async def _arun(self, arguments: Any, call_id: str | None, config: RunnableConfig,
                    run_manager: AsyncCallbackManagerForToolRun | None = None) -> str | list[Any]:
        context = call_context(self.host, self.context_source, config, _trace_id(config, run_manager))
        result = await call_host(self.host, self.tool_name, arguments, context, framework_call_id(call_id))
        return self._content(result)

    def _content(self, result: ToolResult) -> str | list[Any]:
        """The tool message's content: the text a model sees, or, for a result with images or files,
        LangChain's standard text, image and file blocks; a failure raises ``ToolException``
        (``handle_tool_error`` turns it into a ``ToolMessage`` with status "error")."""
        parts = model_parts(result, self.max_output_chars)
        if parts is not None:
            return [create_text_block(part[1]) if part[0] == "text"
                    else create_image_block(base64=part[1], mime_type=part[2]) if part[0] == "image"
                    else create_file_block(base64=part[1], mime_type=part[2], filename=part[3]) for part in parts]
        text = model_text(result, self.max_output_chars)
        if not result.success:
            raise ToolException(text)
        return text

    def _run(self, arguments: Any, call_id: str | None, config: RunnableConfig,
             run_manager: CallbackManagerForToolRun | None = None) -> str | list[Any]:
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
        context = call_context(self.host, self.context_source, config, _trace_id(config, run_manager))
        abandoned = threading.Event()

        async def call() -> ToolResult:
            if abandoned.is_set():  # the waiter gave up before the loop got to the call: do not start it
                raise asyncio.CancelledError
            result: ToolResult = await call_host(self.host, self.tool_name, arguments, context,
                                                 framework_call_id(call_id))
            return result

        future = asyncio.run_coroutine_threadsafe(call(), loop)
        try:
            result = _wait(future, loop, self.stall_timeout, self.name)
        except BaseException:
            # The waiting thread gave up (interrupted, or the loop is blocked): a call that has not
            # started never starts, a running one is cancelled (the host records it as cancelled).
            abandoned.set()
            future.cancel()
            raise
        return self._content(result)


def _trace_id(config: RunnableConfig,
              run_manager: AsyncCallbackManagerForToolRun | CallbackManagerForToolRun | None) -> str | None:
    """The graph run's id when LangGraph knows it (the caller passed ``config={"run_id": ...}``),
    else the run that called the tool (its parent run), else the tool run itself."""
    runtime = (config.get("configurable") or {}).get("__pregel_runtime")  # LangGraph's per-task runtime
    graph_run = getattr(getattr(runtime, "execution_info", None), "run_id", None)
    if graph_run is not None:
        return str(graph_run)
    if run_manager is None:
        return None
    return str(run_manager.parent_run_id or run_manager.run_id)


#: How often a waiting sync invocation checks that the host's loop still runs callbacks.
_PROBE_SECONDS = 0.05


def _wait(future: concurrent.futures.Future[ToolResult], loop: asyncio.AbstractEventLoop, stall_timeout: float,
          name: str) -> ToolResult:
    """The call's result, waiting for as long as the call takes while the host's loop keeps
    running; a ``RuntimeError`` when the loop has not run a callback for ``stall_timeout`` seconds.

    A loop that runs no callback at all is blocked — in a sync ``agent.invoke`` on the loop's own
    thread waiting for this very thread, a deadlock no timeout inside the call can end. A waiting
    loop thread (blocked on a lock or a future) is reported after a few probes, not the full
    ``stall_timeout``.
    """
    beat = threading.Event()
    beat.set()
    since = time.monotonic()
    blocked_probes = 0
    while True:
        try:
            return future.result(timeout=_PROBE_SECONDS)
        except concurrent.futures.TimeoutError:
            pass
        if beat.is_set():  # the loop ran the last heartbeat: it is making progress
            beat.clear()
            since = time.monotonic()
            blocked_probes = 0
            loop.call_soon_threadsafe(_beat, loop, beat)
            continue
        waited = time.monotonic() - since
        blocked_probes = blocked_probes + 1 if _thread_waits(loop) else 0
        if waited >= stall_timeout or blocked_probes >= 5:
            raise RuntimeError(
                f"{name}: sync invoke() is waiting for the host's event loop, which has run nothing for "
                f"{waited:.1f}s — it is blocked, most likely in a sync call (agent.invoke) on its own thread "
                "waiting for this tool: a deadlock. Run the agent with ainvoke() on that loop, or run the host's "
                "loop in another thread (tools(host, loop=...))")


#: The thread each loop was last seen running in, for a loop that does not say (uvloop has no
#: ``_thread_id``): noted by ``tools()`` on the running loop and by every heartbeat the loop runs.
_LOOP_THREADS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int] = weakref.WeakKeyDictionary()


def _note_loop_thread(loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(TypeError):  # a loop that cannot be weakly referenced
        _LOOP_THREADS[loop] = threading.get_ident()


def _beat(loop: asyncio.AbstractEventLoop, beat: threading.Event) -> None:
    _note_loop_thread(loop)
    beat.set()


def _thread_waits(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the loop's thread is blocked waiting on a lock, condition or future (not computing).
    Found by running on uvloop: it keeps no ``_thread_id``, so a deadlocked sync ``invoke`` was
    reported after ``stall_timeout``, not after a few probes; its thread is noted here instead."""
    thread_id = getattr(loop, "_thread_id", None)  # set by BaseEventLoop.run_forever
    if thread_id is None:
        thread_id = _LOOP_THREADS.get(loop)
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    if frame is None:
        return False
    filename = frame.f_code.co_filename.replace("\\", "/")
    return filename.endswith(("/threading.py", "/concurrent/futures/_base.py", "/queue.py"))


def host_tool(tool: BaseTool, *, name: str | None = None, effect: Effect | str = Effect.ExternalSideEffects,
              ) -> _LangChainTool:
    """A LangChain tool as a tool for ``ToolHost`` (mount it with a plugin or ``coordinator.mount``).

    The contract's input schema is the one LangChain sends models for it (injected arguments left
    out); ``effect`` is what the tool does, which LangChain does not say, so it defaults to
    the most cautious. The tool runs with the host's call id as its tool-call id; a ``ToolMessage``
    it returns with ``status="error"`` (a handled ``ToolException``) is an ``ExecutionError``.
    """
    model_facing = convert_to_openai_tool(tool)["function"]["parameters"].get("properties", {})
    accepted = set(getattr(tool.get_input_schema(), "model_fields", {})) | set(getattr(tool, "_injected_args_keys", ()))
    injected = sorted(key for key in accepted if key not in model_facing and not _is_call_id(tool, key))
    if injected:
        raise TypeError(f"host_tool: the LangChain tool {tool.name!r} takes injected arguments "
                        f"({', '.join(injected)}) the host cannot supply; wrap a tool whose arguments all come "
                        "from the model (a tool-call id, InjectedToolCallId, is fine)")
    return _LangChainTool(tool, name or tool.name, to_effect(effect))


def _is_call_id(tool: BaseTool, key: str) -> bool:
    """Whether the tool's argument ``key`` is an ``InjectedToolCallId`` (which LangChain fills from
    the tool call the host makes)."""
    annotation = getattr(tool.get_input_schema(), "model_fields", {}).get(key)
    metadata = getattr(annotation, "metadata", ())
    return any(item is InjectedToolCallId or isinstance(item, InjectedToolCallId) for item in metadata)


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
        blocks = _content_blocks(content)
        if blocks is not None:
            if all(block["type"] == "text" for block in blocks):
                return ToolResult(success=True, output="\n".join(block["text"] for block in blocks))
            return rich_result(blocks, context)
        return ToolResult(success=True, output=content if isinstance(content, (str, dict, list)) else json.dumps(
            content, default=str))


def _content_blocks(content: Any) -> list[dict[str, Any]] | None:
    """A tool message's content blocks — strings, ``text``, ``image``, ``audio`` and ``file`` blocks
    in LangChain's standard spelling (``base64``/``url``/``file_id``, a file's name in ``extras``),
    the older ``source_type`` spelling, or OpenAI's ``image_url`` — as the host's content blocks
    (MCP spelling); None for content that is not such a list (an ordinary JSON output, kept as it is).

    Found by trial: a LangChain tool's image came back as its JSON block, so the model was shown
    the whole base64 text and the audit record held it. Found by attack: so it still was beside
    one item not read (an ``audio`` or ``text-plain`` block, a ``reasoning`` block, ``"base64":
    None`` beside ``data``): a list holding an image, audio or file is now read item by item, an
    item not read a text block of its JSON."""
    if not isinstance(content, list) or not content:
        return None
    blocks: list[dict[str, Any] | None] = [_content_block(item) for item in content]
    if all(block is not None for block in blocks):
        return cast("list[dict[str, Any]]", blocks)
    if not any(block is not None and block["type"] not in ("text", "resource_link") for block in blocks):
        return None  # no media: the list is the tool's JSON output
    return [block if block is not None else {"type": "text", "text": json.dumps(item, default=str)}
            for block, item in zip(blocks, content, strict=True)]


def _content_block(item: Any) -> dict[str, Any] | None:
    """One item of a tool message's content as a content block (MCP spelling), or None."""
    if isinstance(item, str):
        return {"type": "text", "text": item}
    kind = item.get("type") if isinstance(item, dict) else None
    if kind in ("text", "text-plain") and isinstance(item.get("text"), str):
        return {"type": "text", "text": item["text"]}
    if kind in ("image", "file", "audio"):
        data, url = item.get("base64") or item.get("data"), item.get("url")
        extras = item.get("extras")
        name = extras.get("filename") if isinstance(extras, dict) else item.get("filename")
        mime = item.get("mime_type")
        if isinstance(data, str):
            if kind == "audio":
                return {"type": "audio", "data": data,
                        "mimeType": mime if isinstance(mime, str) else "application/octet-stream"}
            url = f"data:{mime if isinstance(mime, str) else ''};base64,{data}"
        file_id = item.get("file_id") or (item.get("id") if item.get("source_type") == "id" else None)
        if not isinstance(url, str) and not isinstance(file_id, str):
            return None
        return media_block(url if isinstance(url, str) else None, file_id, "file" if kind == "audio" else kind,
                           name if isinstance(name, str) else None)
    if kind == "image_url" and isinstance(item.get("image_url"), dict) \
            and isinstance(item["image_url"].get("url"), str):
        return media_block(item["image_url"]["url"], None, "image", None)
    return None
