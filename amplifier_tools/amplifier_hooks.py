"""Amplifier's hook registry on our host: ``coordinator.hooks`` for seed-style modules.

Amplifier modules register handlers with ``coordinator.hooks.register(event, handler,
priority=0, name=None)`` (or ``coordinator.get("hooks").register(...)``). Handlers for
``tool:pre``, ``tool:post`` and ``tool:error`` run *inside* our call chain, at the point of the
matching hook, lower priority first; each is attributed to the module that registered it, so a
denial, a failure and ``on_error = "ignore"`` name and follow that module's settings. Their data
uses Amplifier's keys (``tool_name``, ``tool_input``, ``tool_call_id``, ``tool_result``,
``error``); their results — ``amplifier_core.models.HookResult`` objects or plain dicts with an
``action`` — map onto ours:

- ``continue`` (or ``None``) -> nothing;
- ``deny`` -> ``Deny`` (in ``tool:post``: the output is withheld);
- ``modify`` -> ``Modify`` of ``data["tool_input"]`` (re-validated, attributed), or in
  ``tool:post`` a replacement of ``data["tool_result"]``;
- ``ask_user`` -> the ``tool_approval`` hook; denied when no plugin implements it or it does not
  approve (fail closed, where Amplifier proceeds);
- ``inject_context`` -> recorded in the decision trail (``metadata["trail"]``, action
  ``inject_context``, with the text, role and ``ephemeral``);
- anything else, or a raising handler -> the call fails closed, naming the module.

Handlers for other events are called by ``emit`` with Amplifier's semantics (``deny`` stops the
chain, ``modify`` chains ``data``, ``ask_user`` and ``inject_context`` are handed back, else
``continue`` with the data); ``emit`` returns the outcome, and delivers the event to every
``tool_event`` hook too. Answers are read as amplifier-core reads them: one with a value its
``HookResult`` cannot hold is unreadable (denied by ``emit``, failing the call in the chain).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from .copies import copy_of
from .definitions import model_name
from .dispatch import being_cancelled, thrown_in
from .errors import did_you_mean
from .models import Deny, Modify, ToolCall, ToolContext, ToolResult
from .redaction import PLACEHOLDER, chain_without_secrets, redact, redact_text
from .results import normalize_result

if TYPE_CHECKING:
    from .host import ToolHost

log = logging.getLogger("amplifier_tools")

TOOL_EVENTS: Final = {"tool:pre": "tool_pre", "tool:post": "tool_post", "tool:error": "tool_error"}
#: Events emitted during a call rather than run inside its chain: a tool's progress (an imported
#: MCP tool emits its server's ``notifications/progress`` so), a server's log message.
NOTIFICATION_EVENTS: Final = frozenset({"tool:progress", "mcp:message"})
ACTIONS: Final = frozenset({"continue", "deny", "modify", "ask_user", "inject_context"})

Handler = Callable[[str, dict[str, Any]], Any]


@attrs.frozen
class Registration:
    """One handler: the event, its priority, its name, and the plugin (module) that registered it."""

    event: str
    priority: int
    name: str
    handler: Handler
    owner: str
    order: int


#: Between injected texts joined into one, as amplifier-core joins them (its ``emit``, and its
#: registry projecting ``context_injections``).
INJECTION_SEPARATOR: Final = "\n\n"


@attrs.frozen
class EmitInjection:
    """One injected text of an ``EmitResult``, as amplifier-core's ``ContextInjection``."""

    content: str
    role: str = "system"
    ephemeral: bool = False
    append_to_last_tool_result: bool = False
    hook_name: str = "unknown"
    event: str = ""


@attrs.frozen
class EmitResult:
    """What ``emit`` returns when amplifier-core is not installed (its ``HookResult`` otherwise)."""

    action: str = "continue"
    data: dict[str, Any] | None = None
    reason: str | None = None
    context_injection: str | None = None
    context_injection_role: str = "system"
    ephemeral: bool = False
    approval_prompt: str | None = None
    approval_options: list[str] | None = None
    approval_timeout: float = 300.0
    approval_default: str = "deny"
    suppress_output: bool = False
    user_message: str | None = None
    user_message_level: str = "info"
    user_message_source: str | None = None
    append_to_last_tool_result: bool = False
    context_injections: list[EmitInjection] = attrs.field(factory=list)


class HookRegistry:
    """The host's registry of Amplifier handlers; one per host."""

    def __init__(self, host: ToolHost) -> None:
        self._host = host
        self._handlers: dict[str, list[Registration]] = {}
        self._order = 0
        #: While the host starts: the events emitted so far, each with the data its handlers got
        #: and the last registration it reached (replayed by ``started``).
        self._during_start: list[tuple[str, dict[str, Any], int]] | None = None

    def register(self, event: str, handler: Handler, priority: int = 0, name: str | None = None, *,
                 owner: str = "host") -> Callable[[], None]:
        """Call ``handler(event, data)`` on ``event``; returns the function that unregisters it."""
        self._order += 1
        entry = Registration(event, int(priority), str(name or getattr(handler, "__name__", "handler")), handler,
                             owner, self._order)
        handlers = self._handlers.setdefault(event, [])
        handlers.append(entry)
        handlers.sort(key=lambda r: (r.priority, r.order))
        if event in TOOL_EVENTS:
            self._host.dispatcher.invalidate()
        elif event not in NOTIFICATION_EVENTS:
            close = did_you_mean(event, TOOL_EVENTS)
            if close is not None:  # Amplifier accepts any event name: a typo would silently never run
                log.warning("plugin %r registered handler %r for event %r, which no tool call emits; %s",
                            owner, entry.name, event, close)

        def unregister() -> None:
            if entry in handlers:
                handlers.remove(entry)
                if event in TOOL_EVENTS:
                    self._host.dispatcher.invalidate()

        return unregister

    def unregister(self, event: str, name: str | None = None, handler: Handler | None = None) -> int:
        """Remove handlers of ``event`` by name or function (all of them when neither); how many.

        ``unregister(name)`` alone, amplifier-core's spelling, removes the handlers of that name
        from every event when no handler is registered for an event so called (found by attack:
        the name was taken for an event, nothing was removed, and the handler kept running)."""
        if name is None and handler is None and not self._handlers.get(event):
            return sum(self.unregister(e, event) for e in list(self._handlers)
                       if any(r.name == event for r in self._handlers[e]))
        handlers = self._handlers.get(event, [])
        gone = [r for r in handlers if (name is None or r.name == name) and (handler is None or r.handler is handler)]
        for r in gone:
            handlers.remove(r)
        if gone and event in TOOL_EVENTS:
            self._host.dispatcher.invalidate()
        return len(gone)

    def forget(self, owner: str) -> int:
        """Remove every handler ``owner`` registered (a plugin whose mount failed); how many."""
        gone = 0
        for event, handlers in self._handlers.items():
            kept = [r for r in handlers if r.owner != owner]
            if len(kept) != len(handlers):
                gone += len(handlers) - len(kept)
                handlers[:] = kept  # in place: an ``unregister`` function still holds the list
                if event in TOOL_EVENTS:
                    self._host.dispatcher.invalidate()
        return gone

    def list_handlers(self, event: str | None = None) -> dict[str, list[str]]:
        """Handler names by event (one event, or all), in call order."""
        events = [event] if event is not None else sorted(self._handlers)
        return {e: [r.name for r in self._handlers.get(e, [])] for e in events}

    def tool_handlers(self, event: str) -> list[Registration]:
        """The handlers the call chain runs for ``tool:pre``/``tool:post``/``tool:error``."""
        return list(self._handlers.get(event, ()))

    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        """Run ``event``'s handlers, then every ``tool_event`` hook; answer as amplifier-core's ``emit``.

        Each handler gets its own copy of the data; a ``modify`` with ``data`` replaces what later
        handlers get; a ``deny`` stops the chain; a failing handler is logged and skipped. Returns
        a ``HookResult`` (amplifier-core's when installed, else an ``EmitResult``): the denying
        handler's answer, else the first ``ask_user`` answer (found by review: it was ``continue``,
        so a module asking ``emit`` whether to go on went on unasked), else the ``inject_context``
        answers (one handler's whole, several joined), else ``continue`` with the data as the
        handlers left it. It is the emitter's to act on them.

        Limits: the ``deny`` for an answer that cannot be read names the handler in its reason,
        where amplifier-core says "Hook handler returned invalid response"; the data gets no
        ``timestamp`` (amplifier-core stamps one on it)."""
        secrets = self._host.secrets
        # Scrubbed of the host's secrets as a tool's output is (found by attack: a local tool's
        # ``tool:progress`` message reached handlers, ``serve-mcp``'s client and every ``tool_event``
        # hook with the secret it had resolved; an imported MCP server's events were scrubbed).
        current = _redacted_event(dict(data), secrets)
        if self._during_start is not None:
            self._during_start.append((event, dict(current), self._order))
        denied: Parsed | None = None
        asking: Parsed | None = None  # the first ``ask_user``: a later ``deny`` still wins
        injected: list[tuple[Registration, Parsed]] = []
        for r in list(self._handlers.get(event, ())):
            # A copy each (found by attack: a handler changing the data in place changed what the
            # next handler got and what emit answered; amplifier-core hands each handler its own).
            parsed = await self._run_handler(r, event, copy_of(current))
            if parsed is None:
                continue
            if parsed.action == "deny":
                denied = parsed
                break
            if parsed.action == "modify" and parsed.data is not None:
                current = dict(parsed.data)
            elif parsed.action == "ask_user" and asking is None:
                asking = parsed
            elif parsed.action == "inject_context" and parsed.injections:
                injected.append((r, parsed))
        await self._host.dispatcher.tool_event(event, current)
        # Found by attack: a chain of ``modify`` answers came back as ``modify`` and a chain without
        # one without ``data``; amplifier-core answers ``continue`` with the data either way, and
        # hands back the deciding answer whole (its ``user_message``, ``approval_timeout``, ...).
        if denied is not None:
            return _hook_result("deny", denied.fields)
        if asking is not None:
            return _hook_result("ask_user", asking.fields)
        if injected:
            return _hook_result("inject_context", _injected(event, injected))
        return _hook_result("continue", {"data": current})

    async def _run_handler(self, r: Registration, event: str, data: dict[str, Any]) -> Parsed | None:
        """``r``'s handler on ``event``: what it answered, or None when it failed (logged). An answer
        that cannot be read is a ``deny``, as amplifier-core's ``emit`` makes it (found by attack: it
        was skipped, and a module asking ``emit`` whether to go on went on)."""
        out = None
        try:
            out = r.handler(event, data)
            if inspect.isawaitable(out):
                out = await out
        except BaseException as exc:  # its traceback without the host's secrets
            if isinstance(exc, KeyboardInterrupt) or thrown_in(exc):  # thrown_in: the emitter is being closed
                raise
            if isinstance(exc, asyncio.CancelledError) and inspect.isawaitable(out) and being_cancelled():
                raise  # the caller's cancellation, not the handler's failure
            # A CancelledError the handler raised itself is its failure (found by attack: the
            # call that emitted was recorded as cancelled and its caller got CancelledError).
            # The event's name is a tool's too: the line is scrubbed whole.
            secrets = self._host.secrets
            log.error("%s", redact_text(f"event handler {r.name!r} of {r.owner!r} failed on {event!r}", secrets,
                                        patterns=False), exc_info=chain_without_secrets(exc, secrets))
            return None
        try:
            return parse_result(out)
        except Exception as exc:  # ValueError, or an answer whose attributes raise
            reason = redact_text(f"event handler {r.name!r} of {r.owner!r} returned an answer that cannot be read "
                                 f"on {event!r} ({exc}); denied", self._host.secrets, patterns=False)
            log.error("%s", reason)
            return Parsed("deny", reason, fields={"reason": reason})

    def starting(self) -> None:
        """The host begins mounting its plugins: keep what is emitted until ``started``."""
        self._during_start = []

    async def started(self, mounted: bool) -> None:
        """The host's plugins are mounted (``mounted``; False: its start failed, nothing is
        replayed). An event emitted while the host started reached only the handlers registered by
        then; each handler registered later now gets it too, in the order the events were emitted,
        with the data the first handlers got (found by attack: ``audit:tamper``, emitted when the
        audit plugin found its log tampered with at start, never reached an alerting plugin
        mounted after a plugin whose ``mount`` waited, such as the MCP plugin starting its
        servers). What a late handler answers changes nothing: the emit has returned; ``tool_event``
        hooks are not run again (every plugin's were registered before the first mount).
        """
        emitted, self._during_start = self._during_start, None
        if not mounted or not emitted:
            return
        for event, data, reached in emitted:
            for r in list(self._handlers.get(event, ())):
                if r.order > reached:
                    await self._run_handler(r, event, dict(data))


class PluginHooks:
    """``coordinator.hooks`` as one plugin sees it: what it registers is attributed to it."""

    def __init__(self, registry: HookRegistry, plugin: str) -> None:
        self._registry = registry
        self._plugin = plugin

    def register(self, event: str, handler: Handler, priority: int = 0, name: str | None = None) -> Callable[[], None]:
        """Amplifier's ``HookRegistry.register``; returns the unregister function."""
        return self._registry.register(event, handler, priority, name, owner=self._plugin)

    def on(self, event: str, handler: Handler, priority: int = 0, name: str | None = None) -> Callable[[], None]:
        """amplifier-core's other spelling of ``register``."""
        return self.register(event, handler, priority, name)

    def unregister(self, event: str, name: str | None = None, handler: Handler | None = None) -> int:
        return self._registry.unregister(event, name, handler)

    def list_handlers(self, event: str | None = None) -> dict[str, list[str]]:
        return self._registry.list_handlers(event)

    async def emit(self, event: str, data: dict[str, Any]) -> Any:
        return await self._registry.emit(event, data)


@attrs.frozen
class Parsed:
    """A handler's result, whatever its type: the fields the host acts on, every ``HookResult``
    field it gave (``fields``, for ``emit`` to hand back) and what it injects (``injections``)."""

    action: str
    reason: str | None = None
    data: Any = None
    context_injection: str | None = None
    context_injection_role: str = "system"
    ephemeral: bool = False
    approval_prompt: str | None = None
    approval_options: list[str] | None = None
    approval_default: str = "deny"
    fields: dict[str, Any] = attrs.field(factory=dict)
    injections: tuple[dict[str, Any], ...] = ()


def _text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _flag(value: Any) -> bool:
    return isinstance(value, bool)


def _one_of(*allowed: str) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, str) and value in allowed


ROLES: Final = ("system", "user", "assistant")
#: ``ContextInjection``'s fields (``content`` required), each with its check and default.
INJECTION_FIELDS: Final[dict[str, tuple[Callable[[Any], bool], Any]]] = {
    "content": (lambda value: isinstance(value, str), None), "role": (_one_of(*ROLES), "system"),
    "ephemeral": (_flag, False), "append_to_last_tool_result": (_flag, False),
    "hook_name": (lambda value: isinstance(value, str), "unknown"), "event": (lambda value: isinstance(value, str), ""),
}


def _checked(get: Callable[[str, Any], Any], table: dict[str, tuple[Callable[[Any], bool], Any]],
             what: str) -> dict[str, Any]:
    """Each field of ``table`` read with ``get`` (its default when absent); ``ValueError`` naming
    the first one amplifier-core's registry would refuse."""
    out = {}
    for key, (valid, default) in table.items():
        out[key] = value = get(key, default)
        if not valid(value):
            raise ValueError(f"returned {what}{key} = {value!r}, which a HookResult cannot hold")
    return out


def _getter(out: Any) -> Callable[[str, Any], Any]:
    """``out``'s fields by name: a dict's keys, else its attributes."""
    if isinstance(out, dict):
        return out.get
    return lambda key, default: getattr(out, key, default)


#: ``HookResult``'s fields beside ``action``, each with the check amplifier-core's registry makes
#: of a handler's answer and the default; an answer failing one cannot be read, and is denied as
#: amplifier-core denies it (found by attack: ``context_injection_role = "bogus"``, a list as
#: ``data`` or ``approval_default = "maybe"`` passed here, reshaped, where amplifier-core denies).
RESULT_FIELDS: Final[dict[str, tuple[Callable[[Any], bool], Any]]] = {
    "data": (lambda value: value is None or isinstance(value, dict), None),
    "reason": (_text, None),
    "context_injection": (_text, None),
    "context_injection_role": (_one_of(*ROLES), "system"),
    "ephemeral": (_flag, False),
    "approval_prompt": (_text, None),
    "approval_options": (lambda value: value is None or (isinstance(value, (list, tuple)) and all(
        isinstance(option, str) for option in value)), None),
    "approval_timeout": (lambda value: isinstance(value, (int, float)) and not isinstance(value, bool), 300.0),
    "approval_default": (_one_of("allow", "deny"), "deny"),
    "suppress_output": (_flag, False),
    "user_message": (_text, None),
    "user_message_level": (_one_of("info", "warning", "error"), "info"),
    "user_message_source": (_text, None),
    "append_to_last_tool_result": (_flag, False),
    "context_injections": (lambda value: isinstance(value, (list, tuple)), ()),
}


def parse_result(out: Any) -> Parsed:
    """A ``HookResult``-like object or dict -> ``Parsed``; ``ValueError`` naming what is wrong.

    Read as amplifier-core's registry reads it: unknown keys are ignored, a missing ``action`` is
    ``continue``, a field of the wrong type or value makes the answer unreadable. What it injects
    is its ``context_injections`` when it gives any (its ``context_injection`` is then ignored),
    else its ``context_injection`` with its role, ``ephemeral`` and ``append_to_last_tool_result``;
    ``context_injection`` and the role are then projected from those items (texts joined, the
    first one's role; ``ephemeral`` when any is)."""
    if out is None:
        return Parsed("continue")
    if not isinstance(out, dict) and not hasattr(out, "action"):
        raise ValueError(f"returned {type(out).__name__}; expected a HookResult, a dict with 'action', or None")
    get = _getter(out)
    action = get("action", "continue")
    if action not in ACTIONS:
        raise ValueError(f"returned unknown action {action!r} (expected one of {sorted(ACTIONS)})")
    fields = _checked(get, RESULT_FIELDS, "")
    given = [_checked(_getter(item), INJECTION_FIELDS, "a context_injections item's ")
             for item in fields["context_injections"]]
    fields["context_injections"] = given
    items = tuple(given)  # found by attack: the text given only so was lost, the trail entry had none
    if not items and fields["context_injection"] is not None:
        items = ({"content": fields["context_injection"], "role": fields["context_injection_role"],
                  "ephemeral": fields["ephemeral"],
                  "append_to_last_tool_result": fields["append_to_last_tool_result"]},)
    if fields["approval_options"] is not None:
        fields["approval_options"] = list(fields["approval_options"])
    return Parsed(action, fields["reason"], fields["data"],
                  INJECTION_SEPARATOR.join(item["content"] for item in items) if items else None,
                  items[0]["role"] if items else fields["context_injection_role"],
                  any(item["ephemeral"] for item in items) if items else fields["ephemeral"],
                  fields["approval_prompt"], fields["approval_options"], fields["approval_default"], fields, items)


def _hook_result(action: str, fields: dict[str, Any]) -> Any:
    """``emit``'s result: amplifier-core's ``HookResult`` when installed, else an ``EmitResult``."""
    try:
        from amplifier_core.models import HookResult
    except ImportError:
        injections = [EmitInjection(**item) for item in fields.get("context_injections", ())]
        return EmitResult(action, **{**fields, "context_injections": injections})
    return HookResult(action=action, **fields)


def _injected(event: str, injected: Sequence[tuple[Registration, Parsed]]) -> dict[str, Any]:
    """The fields of ``emit``'s ``inject_context`` answer, as amplifier-core's ``emit`` makes it:
    one handler's answer whole, several handlers' with only the first one's ``suppress_output``;
    each item named by its handler and the event, their texts joined, the first item's role,
    ``ephemeral`` and ``append_to_last_tool_result`` when any item has it."""
    fields = dict(injected[0][1].fields) if len(injected) == 1 else {
        "suppress_output": injected[0][1].fields["suppress_output"]}
    items = [{**item, "hook_name": r.name, "event": event} for r, parsed in injected for item in parsed.injections]
    fields.update(context_injection=INJECTION_SEPARATOR.join(item["content"] for item in items),
                  context_injection_role=items[0]["role"], ephemeral=any(item["ephemeral"] for item in items),
                  append_to_last_tool_result=any(item["append_to_last_tool_result"] for item in items),
                  context_injections=items)
    return fields


def event_data(call: ToolCall, context: ToolContext | None = None, **extra: Any) -> dict[str, Any]:
    """Amplifier's event data for a call: ``tool_name`` (the model-facing name), ``tool_input``,
    ``tool_call_id``, ``session_id``, plus ``tool_canonical_name`` and ``extra`` (``tool_result``,
    ``error``). The spellings Amplifier's own orchestrators and older modules read are there too:
    ``result`` beside ``tool_result``, ``name``/``input`` beside ``tool_name``/``tool_input``, and
    ``msg`` beside ``message`` in ``error``."""
    name = call.name if isinstance(call.name, str) else str(call.name)
    # A copy all the way down: a handler changing it in place must not change the call unvalidated.
    arguments = copy_of(call.arguments)
    short = model_name(name)
    data = {"tool_name": short, "name": short, "tool_canonical_name": name, "tool_input": arguments,
            "input": arguments, "tool_call_id": call.id,
            "session_id": context.session_id if context is not None else None, **extra}
    if "tool_result" in extra:
        data["result"] = extra["tool_result"]
    error = extra.get("error")
    if isinstance(error, dict) and "message" in error:
        data["error"] = {**error, "msg": error["message"]}
    return data


def result_data(result: ToolResult) -> dict[str, Any]:
    """A result as Amplifier's ``tool_result``: ``success``, ``output``, ``error``.

    A copy all the way down, as ``tool_input`` is (found by attack: a handler changing the output
    in place changed what the caller got, unchecked against the output schema, missing from the
    trail, and with a secret it wrote there unredacted: the output was scrubbed before ``tool_post``)."""
    return {"success": result.success, "output": copy_of(result.output), "error": copy_of(result.error)}


def _redacted_event(data: dict[str, Any], secrets: Any) -> dict[str, Any]:
    """``data`` scrubbed of ``secrets``; a value the scrub cannot walk (a cycle, nesting past the
    stack) is left out as ``[REDACTED]`` (found by attack: such event data, which handlers got
    before, failed the tool that emitted it)."""
    try:
        clean: dict[str, Any] = redact(data, secrets=secrets, patterns=False)
        return clean
    except Exception:  # RecursionError included
        pass
    parts: dict[str, Any] = {}
    for key, value in data.items():
        try:
            parts.update(redact({key: value}, secrets=secrets, patterns=False))
        except Exception:
            parts.update(dict.fromkeys(redact({key: None}, secrets=secrets, patterns=False), PLACEHOLDER))
    return parts


class ToolHandlerImpls:
    """Turns registered ``tool:*`` handlers into hook implementations the dispatcher runs in the chain."""

    def __init__(self, host: ToolHost, registry: HookRegistry) -> None:
        self._host = host
        self._registry = registry

    def impls(self, hook: str) -> list[tuple[str, Callable[..., Any], tuple[str, ...]]]:
        """``(owner plugin, implementation, argument names)`` for each handler of ``hook``'s
        Amplifier event, in call order (priority, then registration)."""
        event = next((e for e, h in TOOL_EVENTS.items() if h == hook), None)
        if event is None:
            return []
        impls = [(r.owner, *self.functions(hook, r)) for r in self._registry.tool_handlers(event)]
        if hook == "tool_error":  # Amplifier emits tool:post for a result with success=False too
            impls = [(r.owner, *self.reported_failure(r)) for r in self._registry.tool_handlers("tool:post")] + impls
        return impls

    def reported_failure(self, r: Registration) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """``tool:post`` handler ``r`` for a failure the tool itself reported (a result with
        ``success=False``, such as bash's non-zero exit), as Amplifier's orchestrators deliver it:
        ``tool_result`` holds the output and the error. Its ``deny`` withholds the output, its
        ``modify`` replaces the result (a recovery). Not called for failures the tool raised or
        the host decided (those reach ``tool:error`` handlers only)."""
        async def post_failure(call: ToolCall, spec: Any, error: Any, context: ToolContext
                               ) -> ToolResult | Deny | None:
            reported = getattr(error, "reported", None)
            if not isinstance(reported, ToolResult):
                return None
            failed = ToolResult(False, reported.output, {"type": error.category, "code": error.code,
                                                          "message": error.message}, {}, call.id)
            parsed = await self._run(r, event_data(call, context, tool_result=result_data(failed)))
            return await self._post_outcome(r, parsed, call, spec, failed, context)
        return post_failure, ("call", "spec", "error", "context")

    def functions(self, hook: str, r: Registration) -> tuple[Callable[..., Any], tuple[str, ...]]:
        """``(implementation, argument names)`` for handler ``r`` in ``hook``."""
        if hook == "tool_pre":
            async def pre(call: ToolCall, spec: Any, context: ToolContext) -> Deny | Modify | None:
                parsed = await self._run(r, event_data(call, context))
                return await self._pre_outcome(r, parsed, call, spec, context)
            return pre, ("call", "spec", "context")
        if hook == "tool_post":
            async def post(call: ToolCall, spec: Any, result: ToolResult, context: ToolContext
                           ) -> ToolResult | Deny | None:
                parsed = await self._run(r, event_data(call, context, tool_result=result_data(result)))
                return await self._post_outcome(r, parsed, call, spec, result, context)
            return post, ("call", "spec", "result", "context")

        async def error(call: ToolCall, error: Any, context: ToolContext) -> None:
            data = event_data(call, context, error={"type": error.category, "code": error.code,
                                                    "message": error.message})
            parsed = await self._run(r, data)
            if parsed.action == "inject_context":
                self._inject(r, "tool_error", parsed, context)
            elif parsed.action != "continue":  # Amplifier acts on none of them here: said, not dropped
                context.record(r.owner, "tool_error", f"{parsed.action}_ignored", parsed.reason, handler=r.name,
                               why="a tool:error handler cannot deny, modify or ask; the error stands")
        return error, ("call", "error", "context")

    @staticmethod
    async def _run(r: Registration, data: dict[str, Any]) -> Parsed:
        out = r.handler(r.event, data)
        if inspect.isawaitable(out):
            out = await out
        try:
            return parse_result(out)
        except ValueError as exc:
            raise ValueError(f"handler {r.name!r} {exc}") from None

    @staticmethod
    def _inject(r: Registration, hook: str, parsed: Parsed, context: ToolContext) -> None:
        context.record(r.owner, hook, "inject_context", parsed.context_injection, handler=r.name,
                       role=parsed.context_injection_role, ephemeral=parsed.ephemeral)

    async def _approved(self, r: Registration, parsed: Parsed, call: ToolCall, spec: Any,
                        context: ToolContext) -> Deny | None:
        prompt = parsed.approval_prompt or parsed.reason or f"approve {call.name}?"
        if self._host.dispatcher.settings_of(r.owner).fail_open:
            # The approval is awaited inside the module's hook timeout: one still pending then would
            # let the call go on unapproved (found by attack), so a fail-open module cannot ask.
            return Deny(f"handler {r.name!r} asks the user to approve ({prompt!r}), but its module is configured "
                        "on_error = 'ignore' (fail open), under which an approval cannot be enforced",
                        code="approval_unavailable",
                        details={"handler": r.name, "hint": f"remove on_error = 'ignore' from [plugins.{r.owner}]: "
                                 "a module that asks for approval must fail closed"})
        impls = self._host.plugin_manager.hook.tool_approval.get_hookimpls()
        if not impls:
            return Deny(f"handler {r.name!r} asks the user to approve ({prompt!r}) and no approval plugin is "
                        "installed (the host fails closed here, where Amplifier would proceed)",
                        code="approval_unavailable", details={"handler": r.name})
        try:
            out = self._host.plugin_manager.hook.tool_approval(
                call=call, spec=spec, context=context, prompt=prompt,
                options=list(parsed.approval_options or ["Allow", "Deny"]), default=parsed.approval_default)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:
            # No approving answer: denied, whatever the asking module's on_error says (found by
            # attack: the failure passed for the module's own, and on_error = "ignore" ran the call).
            log.error("the approval that handler %r of %r asked for failed", r.name, r.owner,
                      exc_info=chain_without_secrets(exc, self._host.secrets))
            return Deny(f"not approved: the approval hook failed ({type(exc).__name__}): {prompt}",
                        code="approval_denied", details={"handler": r.name})
        if out is True:
            context.record(r.owner, "tool_pre", "approved", prompt, handler=r.name)
            return None
        return Deny(f"not approved: {prompt}", code="approval_denied", details={"handler": r.name})

    async def _pre_outcome(self, r: Registration, parsed: Parsed, call: ToolCall, spec: Any,
                           context: ToolContext) -> Deny | Modify | None:
        if parsed.action == "deny":
            return Deny(parsed.reason or f"denied by handler {r.name!r}", code="hook_denied",
                        details={"handler": r.name})
        if parsed.action == "modify":
            data = parsed.data
            if not isinstance(data, dict) or not isinstance(data.get("tool_input"), dict):
                raise ValueError(f"handler {r.name!r} returned 'modify' without a 'tool_input' object in data")
            return Modify(dict(data["tool_input"]), reason=parsed.reason or f"handler {r.name!r}")
        if parsed.action == "ask_user":
            return await self._approved(r, parsed, call, spec, context)
        if parsed.action == "inject_context":
            self._inject(r, "tool_pre", parsed, context)
        return None

    async def _post_outcome(self, r: Registration, parsed: Parsed, call: ToolCall, spec: Any, result: ToolResult,
                            context: ToolContext) -> ToolResult | Deny | None:
        if parsed.action == "ask_user":
            denied = await self._approved(r, parsed, call, spec, context)
            if denied is not None:
                return denied
            return None
        if parsed.action == "deny":  # withholds the output; no later handler or plugin gives it back
            return Deny(parsed.reason or f"handler {r.name!r} withheld the output", code="hook_denied",
                        details={"handler": r.name})
        if parsed.action == "modify":
            data = parsed.data
            replaced = data.get("tool_result") if isinstance(data, dict) else None
            if not isinstance(replaced, dict) or "success" not in replaced:
                raise ValueError(f"handler {r.name!r} returned 'modify' without a 'tool_result' object in data")
            return normalize_result(replaced, call.name)
        if parsed.action == "inject_context":
            self._inject(r, "tool_post", parsed, context)
        return None
