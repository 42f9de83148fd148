"""The host's tools as a Pydantic AI toolset (extra ``pydantic-ai``).

``AmplifierToolset(host)`` is an ``AbstractToolset``: ``Agent(model, toolsets=[AmplifierToolset(host)])``
offers the model every mounted tool (or those named in ``tools``) under its model-facing name, with
the contract's description and input schema (``strict`` only when the schema already is strict).
Each call runs ``host.call`` with the model's tool-call id as the call id and a ``ToolContext`` built
by your function from the run's ``RunContext`` (its ``deps`` carry who is calling). The run id
fills ``trace_id`` when the context has none, and the run's deadline bounds the call.

A failed call reaches the model as Pydantic AI's terminal tool failure (``ToolFailed``) with the
text ``Error (<type>, <code>): <message>``: the run goes on, no retry budget is spent. The host
validates the arguments; Pydantic AI's own validator here accepts any JSON object, so a bad
argument is the host's ``ContractError`` naming the field, recorded like any call.

Not carried over: Pydantic AI's approvals (deferred tools) and capabilities' tool hooks see these
tools like any others, but the host decides on its own (its policies and approval hook); streamed
tool output does not exist on either side. There is no reverse wrapper: a Pydantic AI tool is a
plain function, so decorate the function with ``amplifier_tools.tool`` and mount it instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from ..definitions import model_name
from ..host import ToolHost
from ..models import ToolContext
from ._common import call_context, is_strict_schema, model_text, select_specs

__all__ = ["AmplifierToolset"]

#: Pydantic AI checks only that the model sent a JSON object; the host validates the rest.
_ANY_OBJECT = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


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
        select_specs(host, self._names)  # an unknown name fails here, not at the first run

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        offered: dict[str, ToolsetTool[Any]] = {}
        for spec in select_specs(self.host, self._names):  # read per run step: tools mounted later show up
            name = model_name(spec.name)
            definition = ToolDefinition(name=name, description=spec.description or spec.title or spec.name,
                                        parameters_json_schema=spec.input_schema,
                                        strict=True if is_strict_schema(spec.input_schema) else None,
                                        metadata={"amplifier_tools": spec.name})
            offered[name] = ToolsetTool(toolset=self, tool_def=definition, max_retries=1, args_validator=_ANY_OBJECT)
        return offered

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        context = call_context(self.host, self.context, ctx, ctx.run_id)
        remaining = ctx.remaining_time()
        if remaining is not None and context.deadline is None:
            context = context.with_timeout(remaining)
        canonical = (tool.tool_def.metadata or {}).get("amplifier_tools", name)
        result = await self.host.call(canonical, tool_args, context=context, call_id=ctx.tool_call_id or None)
        if not result.success:
            raise ToolFailed(model_text(result, self.max_output_chars))
        return model_text(result, self.max_output_chars)
