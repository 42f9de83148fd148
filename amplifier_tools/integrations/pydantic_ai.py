"""The host's tools as a Pydantic AI toolset (extra ``pydantic-ai``).

``AmplifierToolset(host)`` is an ``AbstractToolset``: ``Agent(model, toolsets=[AmplifierToolset(host)])``
offers the model every mounted tool (or those named in ``tools``) under its model-facing name, with
the contract's description and input schema (``strict`` only when the schema already is strict, and
``strict=False`` otherwise: Pydantic AI's OpenAI models read ``strict=None`` as "make it strict if
you can" and close every object of the schema on the way).
Each call runs ``host.call`` with the model's tool-call id as the call id and a ``ToolContext`` built
by your function from the run's ``RunContext`` (its ``deps`` carry who is calling). The run id
fills ``trace_id`` when the context has none, and the run's deadline bounds the call (the earlier of it
and a deadline your context sets).

A failed call reaches the model as Pydantic AI's terminal tool failure (``ToolFailed``) with the
text ``Error (<type>, <code>): <message>``: the run goes on, no retry budget is spent. The host
validates the arguments; Pydantic AI's own validator here accepts anything the model sent — text
that is not JSON, JSON that is not an object — and hands it on, so a bad argument is the host's
``ContractError`` naming the field (or the parse error), recorded like any call.

Not carried over: Pydantic AI's approvals (deferred tools) and capabilities' tool hooks see these
tools like any others, but the host decides on its own (its policies and approval hook); streamed
tool output does not exist on either side. There is no reverse wrapper: a Pydantic AI
``tool_plain`` tool is a plain function, so decorate the function with ``amplifier_tools.tool`` and
mount it instead; a tool taking a ``RunContext`` first needs that parameter removed (take what it
read from ``ctx.deps`` as an argument, or from the host's ``ToolContext``).
"""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import missing_extra

try:
    from pydantic_ai import BinaryContent, RunContext
    from pydantic_ai.exceptions import ToolFailed
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
    from pydantic_core import SchemaValidator, core_schema
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    if sys.version_info < (3, 11):
        raise ImportError("the Pydantic AI adapter needs Python 3.11 or later: the Pydantic AI releases it "
                          f"supports (pydantic-ai-slim 2.68 to 3) do not install on {sys.version.split()[0]}") from exc
    raise missing_extra("pydantic-ai", exc) from exc

import attrs

from ..content import Part
from ..definitions import model_name
from ..host import ToolHost
from ..models import ToolContext
from ._common import (
    call_context,
    call_host,
    framework_call_id,
    is_strict_schema,
    model_parts,
    model_text,
    parse_arguments,
    select_specs,
    sendable,
    sendable_schema,
)

__all__ = ["AmplifierToolset"]

#: What partial (streamed) arguments are checked with: a JSON object, nothing more.
_ANY_OBJECT = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


class _Unchecked(dict[str, Any]):
    """Arguments that are not a JSON object, carried past Pydantic AI to the host (which refuses
    them as a ``ContractError`` and records the call): ``raw`` is what the model sent, ``problem``
    why it did not parse (``None`` when it parsed but is not an object)."""

    def __init__(self, raw: Any, problem: str | None) -> None:
        super().__init__()
        self.raw = raw
        self.problem = problem


class _PassThrough:
    """The toolset's ``args_validator``: Pydantic AI must not validate (and spend a retry on) what
    the host validates, so every complete argument value is accepted and handed on as it is."""

    def validate_json(self, input: str | bytes | bytearray, *, allow_partial: Any = False, **kwargs: Any) -> Any:
        if allow_partial not in (False, "off"):  # a streamed preview, not a call
            return _ANY_OBJECT.validate_json(input, allow_partial=allow_partial, **kwargs)
        text = input.decode("utf-8", "replace") if isinstance(input, (bytes, bytearray)) else input
        parsed, problem = parse_arguments(text)
        return parsed if isinstance(parsed, dict) else _Unchecked(parsed, problem)

    def validate_python(self, input: Any, *, allow_partial: Any = False, **kwargs: Any) -> Any:
        return input if isinstance(input, dict) else _Unchecked(input, None)


_PASS_THROUGH = _PassThrough()


class AmplifierToolset(AbstractToolset[Any]):
    """A ``ToolHost``'s tools for a Pydantic AI ``Agent``.

    ``context`` is the calls' ``ToolContext`` or a function ``RunContext -> ToolContext`` (for
    example ``lambda ctx: ToolContext(principal=ctx.deps.user, scopes=ctx.deps.scopes)``); without
    it the host's default context is used. ``tools`` limits the toolset to those names (canonical or
    model-facing; an unknown one is a ``ValueError``). The host must be started before the agent
    runs and stay open while it does.
    """

    def __init__(self, host: ToolHost, *, context: ToolContext | Callable[[RunContext[Any]], ToolContext] | None = None,
                 tools: Iterable[str] | None = None, id: str | None = None, max_output_chars: int | None = 50_000,
                 ) -> None:
        self.host = host
        self.context = context
        self.max_output_chars = max_output_chars
        self._id = id
        self._names = None if tools is None else list(tools)
        select_specs(host, self._names)  # an unstarted host or an unknown name fails here, not at the first run

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        offered: dict[str, ToolsetTool[Any]] = {}
        # Read per run step: tools mounted later show up; a named tool unmounted since is left out.
        for spec in select_specs(self.host, self._names, skip_unmounted=True):
            name = model_name(spec.name)
            # strict=False, not None, for a schema that is not strict: with None Pydantic AI's OpenAI
            # models add additionalProperties: false to every object (strict mode or not), so a
            # free-form object argument reached the model as "empty object only" (found by attack).
            definition = ToolDefinition(name=name, description=sendable(spec.description or spec.title or spec.name),
                                        parameters_json_schema=sendable_schema(spec.input_schema),
                                        strict=is_strict_schema(spec.input_schema),
                                        metadata={"amplifier_tools": spec.name})
            offered[name] = ToolsetTool(toolset=self, tool_def=definition, max_retries=1,
                                         args_validator=_PASS_THROUGH)
        return offered

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        context = call_context(self.host, self.context, ctx, ctx.run_id)
        remaining = ctx.remaining_time()
        if remaining is not None:
            # The earlier of the two deadlines: a context function's own deadline (a request's
            # budget, say) must not stretch the run's. Found by attack: the run's deadline was
            # applied only when the context had none, so a later one there let the call outlive it.
            run_deadline = time.monotonic() + remaining
            if context.deadline is None or run_deadline < context.deadline:
                context = attrs.evolve(context, deadline=run_deadline)
        canonical = (tool.tool_def.metadata or {}).get("amplifier_tools", name)
        arguments: Any = tool_args
        problem = None
        if isinstance(tool_args, _Unchecked):
            arguments, problem = tool_args.raw, tool_args.problem
        result = await call_host(self.host, canonical, arguments, context, framework_call_id(ctx.tool_call_id))
        if not result.success:
            raise ToolFailed(model_text(result, self.max_output_chars, problem))
        parts = model_parts(result, self.max_output_chars)
        if parts is not None:  # images and files as Pydantic AI's binary content, which it shows the model
            return [part[1] if part[0] == "text" else _binary(part) for part in parts]
        return model_text(result, self.max_output_chars)


def _binary(part: Part) -> Any:
    """An image or file part as Pydantic AI's ``BinaryContent`` (base64 that does not decode: its
    text line, as ``render_block`` would have shown it)."""
    try:
        data = base64.b64decode(part[1], validate=True)
    except ValueError:
        return f"[{part[0]}: {part[2]}, undecodable base64]"
    return BinaryContent(data=data, media_type=part[2] or "application/octet-stream", identifier=part[3])
