"""The host's tools as OpenAI Agents SDK ``FunctionTool``s, and an SDK ``FunctionTool`` as a tool of
the host (extra ``openai-agents``).

``function_tools(host)`` gives one ``FunctionTool`` per mounted tool: the model-facing name, the
contract's description and input schema (strict mode only when the schema already is strict, so
that strict mode never makes an optional argument required), and an invocation that runs
``host.call`` with the SDK's tool-call id as the call id. A failed call is returned to the model as
``Error (<type>, <code>): <message>``, never raised, so the run goes on and the model can adapt.

``host_tool(function_tool)`` goes the other way: the SDK tool becomes a tool that a ``ToolHost``
mounts, so its calls pass the host's validation, policies and audit. Its ``timeout_seconds``
becomes the contract's ``timeout_ms``; a tool whose safeguards the host cannot run
(``needs_approval``, tool input/output guardrails, ``is_enabled`` other than ``True``) is refused
with a ``ContractError`` naming the setting, rather than mounted without them.

Not carried over: the SDK's approvals (``needs_approval``), tool guardrails and per-tool timeouts
are left unset on the tools made here (the host's hooks, policies and ``timeout_ms`` do that job);
a cancelled run cancels the call, which the host records as ``cancelled``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import missing_extra

try:
    from agents import FunctionTool, ToolOutputFileContent, ToolOutputImage, ToolOutputText
    from agents.exceptions import UserError
    from agents.strict_schema import ensure_strict_json_schema
    from agents.tool_context import ToolContext as AgentsToolContext
    from agents.tracing import get_current_trace
    from agents.tracing.traces import NoOpTrace
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise missing_extra("openai-agents", exc) from exc

from ..content import data_url
from ..definitions import model_name
from ..errors import ContractError
from ..host import ToolHost
from ..models import ToolContext, ToolResult
from ..spec import Effect, to_effect
from ._common import (
    ContextSource,
    call_context,
    call_host,
    framework_call_id,
    is_strict_schema,
    media_block,
    model_parts,
    model_text,
    parse_arguments,
    rich_result,
    select_specs,
    sendable,
    sendable_schema,
)

__all__ = ["function_tools", "host_tool"]

#: A function from the SDK's per-call ``ToolContext`` (its ``.context`` is what was passed to
#: ``Runner.run(context=...)``) to the call's ``ToolContext``.
ContextFunction = Callable[[AgentsToolContext[Any]], ToolContext]


def function_tools(host: ToolHost, *, context: ToolContext | ContextFunction | None = None,
                   tools: Iterable[str] | None = None, max_output_chars: int | None = 50_000) -> list[FunctionTool]:
    """One ``FunctionTool`` per mounted tool (or per name in ``tools``), each calling ``host``.

    ``context`` is the calls' ``ToolContext``, or a function building it from the SDK's
    ``ToolContext`` (principal and scopes from your run context); without it the host's default
    context is used. The SDK's current trace id fills ``trace_id`` when the context has none.
    The host must be started before the agent runs and stay open while it does.
    """
    made = []
    for spec in select_specs(host, tools):  # the host must be started: its tools are mounted then
        schema = copy.deepcopy(sendable_schema(spec.input_schema))  # the SDK's to keep; the contract's stays
        strict = is_strict_schema(schema) and _sdk_keeps(schema)
        made.append(FunctionTool(
            name=model_name(spec.name),
            description=sendable(spec.description or spec.title or spec.name),
            params_json_schema=schema,
            on_invoke_tool=_Invoker(host, spec.name, context, max_output_chars),
            strict_json_schema=strict,
        ))
    return made


def _sdk_keeps(schema: dict[str, Any]) -> bool:
    """Whether the SDK's strict conversion leaves ``schema`` as it is (it rewrites ``oneOf``, inlines
    a ``$ref`` with siblings, drops ``default: null``): strict mode must not change the contract."""
    try:
        return ensure_strict_json_schema(copy.deepcopy(schema)) == schema
    except (UserError, TypeError, ValueError):  # a keyword the SDK's strict normalizer refuses
        return False


class _Invoker:
    """``on_invoke_tool`` of one adapted tool: the model's JSON string through ``host.call``."""

    __slots__ = ("context", "host", "max_output_chars", "name")

    def __init__(self, host: ToolHost, name: str, context: ContextSource[AgentsToolContext[Any]],
                 max_output_chars: int | None) -> None:
        self.host = host
        self.name = name
        self.context = context
        self.max_output_chars = max_output_chars

    async def __call__(self, ctx: AgentsToolContext[Any], arguments: str) -> str | list[Any]:
        # Text that is not JSON (or nested too deeply to parse) goes to the host as it is: the host
        # refuses it as a ContractError and records the call; the model is told the parse error.
        parsed, problem = parse_arguments(arguments)
        trace = get_current_trace()
        trace_id = None if trace is None or isinstance(trace, NoOpTrace) else trace.trace_id
        context = call_context(self.host, self.context, ctx, trace_id)
        result = await call_host(self.host, self.name, parsed, context, framework_call_id(ctx.tool_call_id))
        parts = model_parts(result, self.max_output_chars)
        if parts is not None:  # images and files as the SDK's image and file parts
            return [ToolOutputText(text=part[1]) if part[0] == "text" else ToolOutputImage(image_url=data_url(part))
                    if part[0] == "image" else ToolOutputFileContent(file_data=data_url(part), filename=part[3])
                    for part in parts]
        return model_text(result, self.max_output_chars, problem)


def host_tool(tool: FunctionTool, *, name: str | None = None, effect: Effect | str = Effect.ExternalSideEffects,
              context: Any = None) -> _SDKTool:
    """An SDK ``FunctionTool`` as a tool for ``ToolHost`` (mount it with a plugin or ``coordinator.mount``).

    The contract's input schema is the tool's ``params_json_schema`` (the host validates it, the
    SDK validates again); ``effect`` is what the tool does, which the SDK does not say, so it
    defaults to the most cautious. The tool's ``timeout_seconds`` becomes the contract's
    ``timeout_ms`` (the host's timeout then ends the call as a ``PolicyError`` ``timeout``).

    ``context`` is the run context the SDK tool sees — ``ctx.context`` of a tool taking a
    ``RunContextWrapper``/``ToolContext`` first argument, what ``Runner.run(context=...)`` would
    have passed — the same object for every call; the host's ``ToolContext`` (principal, scopes)
    is not handed to the SDK tool. Its ``tool_call_id`` is the host's call id.

    A tool carrying a safeguard the host cannot run is refused with a ``ContractError`` naming the
    setting, rather than mounted without it: ``needs_approval`` (use the host's approval hook or
    policies), ``tool_input_guardrails``/``tool_output_guardrails`` (use a ``tool_pre``/``tool_post``
    hook), ``is_enabled`` other than ``True`` (a disabled tool must not be callable). Build the tool
    without them to mount it.

    The SDK tool turns its own exceptions into text by default (``failure_error_function``); such a
    text reads as a success to the host. Create the tool with ``failure_error_function=None`` so
    that it raises instead, and the host records an ``ExecutionError``.
    """
    tool_name = name or tool.name
    refused = [setting for setting, unset in (("needs_approval", tool.needs_approval is False),
                                              ("tool_input_guardrails", not tool.tool_input_guardrails),
                                              ("tool_output_guardrails", not tool.tool_output_guardrails),
                                              ("is_enabled", tool.is_enabled is True)) if not unset]
    if refused:
        raise ContractError(f"host_tool: the SDK tool {tool.name!r} sets {', '.join(refused)}, which the host "
                            "cannot carry out; build it without them and use the host's approval hook, "
                            "tool_pre/tool_post hooks or policies instead", code="unsupported_setting")
    return _SDKTool(tool, tool_name, to_effect(effect), context)


class _SDKTool:
    """An SDK ``FunctionTool`` behind the host's tool interface."""

    def __init__(self, tool: FunctionTool, name: str, effect: Effect, run_context: Any) -> None:
        self.tool = tool
        self.name = name
        self.description = tool.description
        self.input_schema = tool.params_json_schema
        self.effect = effect
        self.run_context = run_context
        timeout = getattr(tool, "timeout_seconds", None)
        if timeout is not None:
            self.policies = {"timeout_ms": float(timeout) * 1000}

    async def execute(self, input: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        arguments = json.dumps(input)
        call_id = context.call_id if context is not None and context.call_id else "call"
        ctx = AgentsToolContext(context=self.run_context, tool_name=self.tool.name, tool_call_id=call_id,
                                tool_arguments=arguments)
        output = await self.tool.on_invoke_tool(ctx, arguments)
        blocks = _content_blocks(output)
        if blocks is not None:
            if len(blocks) == 1 and blocks[0]["type"] == "text":
                return ToolResult(success=True, output=blocks[0]["text"])
            return rich_result(blocks, context)
        return ToolResult(success=True, output=output if isinstance(output, (str, dict, list)) else str(output))


_SDK_OUTPUTS: dict[str, Any] = {"text": ToolOutputText, "image": ToolOutputImage, "file": ToolOutputFileContent}


def _sdk_output(item: Any) -> Any:
    """``item`` as one of the SDK's structured tool outputs (a model or its dict spelling), or ``None``."""
    if isinstance(item, (ToolOutputText, ToolOutputImage, ToolOutputFileContent)):
        return item
    kind = _SDK_OUTPUTS.get(str(item.get("type"))) if isinstance(item, dict) else None
    if kind is None:
        return None
    try:
        return kind.model_validate(item)
    except ValueError:  # pydantic's ValidationError: not one after all, an ordinary dict output
        return None


def _content_blocks(output: Any) -> list[dict[str, Any]] | None:
    """An SDK tool's structured output — ``ToolOutputText``/``ToolOutputImage``/``ToolOutputFileContent``
    or a list of them, which the SDK sends a model as text, image and file parts — as the host's
    content blocks (MCP spelling, ``amplifier_tools.content``); ``None`` for any other output.

    Found by attack: ``host_tool`` kept such an output as ``str(output)``, so the model read a
    Python repr (``type='text' text='hello'``), an image's whole base64 data URL as text, and a
    list of them was kept as a list of Python objects, not JSON.
    """
    items = output if isinstance(output, (list, tuple)) else [output]
    converted = [_sdk_output(item) for item in items]
    if not converted or any(item is None for item in converted):
        return None
    blocks: list[dict[str, Any]] = []
    for item in converted:
        if isinstance(item, ToolOutputText):
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, ToolOutputImage):
            blocks.append(media_block(item.image_url, item.file_id, "image", None))
        else:
            blocks.append(media_block(item.file_data or item.file_url, item.file_id, "file", item.filename))
    return blocks
