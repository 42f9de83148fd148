"""The hook specifications: the whole extension surface of amplifier-tools.

Every built-in plugin (filesystem, bash, policy, audit) implements these hooks
and nothing else; a third-party plugin has exactly the same power. Each spec's
docstring is its reference documentation (``docs/hooks.md`` is generated from
it and a test keeps the two in step).

Any implementation may be ``async def``; the host awaits it. Order is pluggy's:
last registered runs first, ``tryfirst``/``trylast`` honoured. Hook *wrappers*
are not supported on the chained call hooks because each implementation must
see the value produced by the one before it; the host rejects them at
registration with a message naming the plugin.

Failure policy: an implementation of ``tool_pre``, ``tool_rewritten``,
``tool_post`` or ``tool_complete`` that raises or overruns its timeout fails the call closed
(a ``SystemError``-category error naming the plugin — ``hook_failed`` or
``hook_timeout``; output withheld) unless the plugin's config section sets
``on_error = "ignore"``. An implementation that raises one of the typed errors
(``ContractError`` … ``ToolSystemError``) fails the call with that error's
category and code instead, attributed to the plugin. A failure inside
``tool_error`` or ``tool_event`` is logged and recorded; it never changes the
outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._markers import hookspec

if TYPE_CHECKING:
    from .coordinator import Coordinator
    from .errors import ToolError
    from .models import Deny, Modify, ToolCall, ToolContext, ToolResult
    from .spec import ToolSpec


# -- lifecycle ----------------------------------------------------------------


@hookspec
def mount(coordinator: Coordinator, config: dict[str, Any]) -> Any:
    """Set the plugin up when the host starts; mount its tools.

    Called once per plugin with a coordinator bound to that plugin and the
    plugin's own config section (``[plugins.<name>]``, without the host's
    reserved keys ``on_error``, ``hook_timeout_ms`` and ``enabled``). Mount
    tools with ``await coordinator.mount("tools", tool)``. May return a cleanup
    callable (sync or async); cleanups run in reverse order when the host
    closes. Raising here fails host start with an error naming the plugin,
    whatever ``on_error`` says (it governs the other hooks); a ``hint=`` on the
    typed error raised becomes the error's hint.
    An async ``mount`` runs within the plugin's ``hook_timeout_ms`` (default
    10 s; unbounded for a plugin declaring ``hook_timeout_ms = None``; a host-wide
    ``hook_timeout_ms`` below 10 s does not shorten it, the plugin's own does); one
    still running then fails host start the same way (``hook_timeout``). From
    Python 3.11: on 3.10 a mount is not bounded.
    """


# -- one call ----------------------------------------------------------------


@hookspec
def tool_pre(call: ToolCall, spec: ToolSpec, context: ToolContext) -> Deny | Modify | None:
    """Inspect a call before the tool runs; veto it or rewrite its arguments.

    Called after the arguments passed input-schema validation. Implementations
    are chained: each sees ``call`` as rewritten by the ones before it. Return
    ``None`` to let the call through unchanged, ``Deny(reason, code=...)`` to
    stop the call (no later ``tool_pre`` runs, the tool does not run, the
    caller gets a ``PolicyError`` naming this plugin — or the ``AuthError`` /
    ``ContractError`` given as ``Deny(..., category=...)``), or
    ``Modify(arguments=...)`` to replace the arguments; the new arguments are
    validated against the input schema at once, and an invalid rewrite is a
    ``ContractError`` attributed to this plugin.
    """


@hookspec
def tool_rewritten(call: ToolCall, spec: ToolSpec, context: ToolContext) -> Deny | None:
    """Decide again on arguments a later ``tool_pre`` hook rewrote; veto the call.

    Called once after the ``tool_pre`` chain, only when a hook of it returned
    ``Modify``, with ``call`` holding the final arguments (the ones the tool
    runs with), and only for plugins whose ``tool_pre`` did not see them: one
    that ran before the last rewrite, or has no ``tool_pre``. A call no hook
    rewrote never reaches it. Return ``None`` to let the call run, or
    ``Deny(reason, code=...)`` to stop it exactly as a ``tool_pre`` denial does
    (no later ``tool_rewritten`` runs; the trail names this plugin and
    ``tool_rewritten``). Raising or overrunning fails the call closed as in
    ``tool_pre``. It cannot rewrite: a ``Modify`` returned here is the
    plugin's ``hook_invalid_return``, and arguments changed in place end the
    call (``hook_changed_arguments``). For plugins whose ``tool_pre`` decides
    on the arguments (rules, path guards): without it, a rewrite made after
    them (a ``trylast`` hook) reaches the tool unchecked.
    """


@hookspec
def tool_post(
    call: ToolCall, spec: ToolSpec, result: ToolResult, context: ToolContext
) -> ToolResult | None:
    """Inspect or replace the result of a call that executed successfully.

    Chained like ``tool_pre``: each implementation sees the result as replaced
    by the ones before it. Return ``None`` to keep it, a ``ToolResult`` to
    replace it, or ``Deny(reason, code=...)`` to withhold the output (the call
    fails with this plugin's denial, recorded as ``deny``); a replacement's
    output is validated against the tool's output schema at once and an
    invalid one becomes a ``ContractError`` attributed to this plugin; a failed
    replacement's error is read as a tool's reported failure (one of the five
    categories, ``ExecutionError`` for any other ``type``), attributed to this
    plugin. The output is read, never changed in place: one changed in place
    instead of replaced fails the call closed (``SystemError``
    ``hook_changed_output``, output withheld), as changed arguments do in
    ``tool_pre``, also when the changed object is returned. When an
    earlier implementation failed closed or denied, later ones see the failed
    result, so an observer still sees the call exactly once; a replacement or
    denial they return is recorded (``replace_ignored``, ``deny_ignored``) and
    never delivered: withheld output stays withheld. A caller that cancels while
    an ``async`` implementation is awaited does not cut the chain short: it and
    every later implementation run to their end (each within its hook timeout;
    one without a hook timeout is cut instead),
    then the call ends as ``cancelled`` (``tool_complete`` sees that; ``tool_error``
    does not run) and the caller gets ``CancelledError``.
    """


@hookspec
def tool_error(
    call: ToolCall, spec: ToolSpec | None, error: ToolError, context: ToolContext
) -> ToolResult | None:
    """Observe a failed call, or recover from the failure.

    Called for every call that did not execute successfully: unknown tool
    (``spec`` is ``None``), contract violation, veto, auth or policy failure,
    timeout, a tool exception, a tool that reported failure, a call the
    caller cancelled (``SystemError`` ``cancelled``; a recovery is ignored and
    the caller gets ``CancelledError``) or one cut by host close
    (``host_closing``). Every
    implementation is called, so each observer sees each failure once. The
    first implementation returning a ``ToolResult`` recovers the call: that
    result goes to the caller (a failed one with its error read as in
    ``tool_post``; a successful one's output checked against the output schema,
    and one it breaks is this plugin's failure); later recoveries are recorded
    and ignored. A
    ``Deny`` withholds the failed call's output (a tool-reported failure's,
    such as a command's output) and its denial becomes the call's error; no
    recovery before or after it is delivered. A failure raised here is logged
    and the original error stands. ``error`` is read-only: a change made to it
    in place (its message, code, details...) is undone before the next
    implementation runs, logged and recorded in the trail as
    ``changed_in_place`` naming the plugin, and the original error stands.
    """


@hookspec
def tool_complete(
    call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext
) -> None:
    """Observe the final result of every call, exactly once, after all other hooks.

    For observers that need the outcome the caller will see, with the full
    decision trail in ``result.metadata["trail"]``: audit logs, metrics,
    tracing. The return value is ignored. Raising fails the call closed (the
    output is withheld and the caller gets a ``SystemError``-category error)
    unless the plugin is configured ``on_error = "ignore"`` — so an audit log
    that cannot write can refuse to let an unrecorded result through. Observers
    after one that failed closed receive the failed result, so a record states
    what the caller got. Called for cancelled calls too, even when the
    caller cancels again meanwhile: an ``async`` observer is never cut short.
    Decisions an observer records with ``context.record`` are added to the
    trail of the result the caller gets, not to the ``result`` observers
    receive (built before any of them ran, so an audit log records the trail
    up to the end of ``tool_post``/``tool_error``). The result is read, never
    changed: what an observer changes in place on ``result`` (its output or
    metadata) reaches the caller unchecked and unredacted, and is not what the
    audit record says (not covered: checking it would cost a copy of every
    result). An implementation may be ``async``, or synchronous and return an awaitable
    only when it has something to wait for.
    """


@hookspec(firstresult=True)
def tool_approval(
    call: ToolCall, spec: ToolSpec, context: ToolContext, prompt: str, options: list[str], default: str
) -> bool | None:
    """Decide whether a call a hook wants a person to approve may run.

    Called when an Amplifier hook handler returns ``ask_user`` (``prompt``, ``options`` and
    ``default`` come from its ``approval_prompt``, ``approval_options`` and
    ``approval_default``). Return ``True`` to approve, ``False`` to deny, ``None`` to leave it
    to the next implementation (the first non-``None`` answer wins; an ``async``
    implementation is awaited and is the answer). With no implementation, or no approving
    answer, the call is denied (``PolicyError`` ``approval_unavailable`` /
    ``approval_denied``): the host fails closed.
    """


@hookspec
def tool_event(event: str, data: dict[str, Any]) -> None:
    """Observe an event: one emitted by a tool or plugin through
    ``coordinator.hooks.emit`` (for example ``circuit:open``), or the host's own
    ``tool:pre``, ``tool:post`` and ``tool:error`` events in the seed contract's
    shape. The return value is ignored; failures are logged. A call that sent
    ``tool:pre`` sends one of the other two: a cancelled call, or one cut by
    ``close()``, sends ``tool:error`` (code ``cancelled`` / ``host_closing``)
    unless its ``tool:post`` was sent; a cancellation while ``tool:post`` is
    delivered lets every observer get it first.

    Two events arrive while a call runs: ``tool:progress`` (``tool_name``,
    ``tool_call_id``, ``progress``, ``total``, ``message``; an imported MCP tool
    emits its server's ``notifications/progress`` so, with ``server``, and any
    tool may emit it; ``serve-mcp`` forwards it to a client that asked for
    progress) and ``mcp:message`` (an MCP server's ``notifications/message``:
    ``server``, ``level``, ``logger``, ``data``). What a tool, a plugin or an
    MCP server emits is redacted of the host's secrets first. Keep
    implementations quick: the server's next messages wait for them.
    """
