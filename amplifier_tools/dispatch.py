"""The one narrow layer between the host and pluggy: typed, chained hook calls.

pluggy calls every implementation with the same arguments; the call hooks
here are *chained* (each ``tool_pre`` sees the call as rewritten by the one
before it), so this module walks the implementations itself, in exactly the
order pluggy would call them (LIFO registration, ``tryfirst``/``trylast``), and
records who did what in the call's decision trail.

The ordered implementation list is rebuilt only when the set of registered
implementations changes, never per call. Sync implementations run inline;
async ones are awaited under the plugin's hook timeout. A sync implementation
cannot be interrupted: a blocking one blocks the event loop (documented limit).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import operator
import sys
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from typing import Any, Final

import attrs
import pluggy

from ._json import fingerprint, same_json
from .copies import copy_of
from .errors import ERROR_CLASSES, ContractError, PluginLoadError, ToolError, ToolSystemError
from .models import Deny, Modify, ToolCall, ToolContext, ToolResult
from .redaction import chain_without_secrets, redact_text
from .results import _error_from_result, error_dict, normalize_result
from .timeouts import TimeLimitExceeded, run_with_timeout

log = logging.getLogger("amplifier_tools")

CHAINED_HOOKS: Final = ("tool_pre", "tool_rewritten", "tool_post", "tool_error", "tool_complete")
#: The hooks a call may run: the chained ones and the ``tool_event`` observers.
CALL_HOOKS: Final = (*CHAINED_HOOKS, "tool_event")


def thrown_in(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``GeneratorExit`` thrown into the catching frame at its ``await``: the
    awaiting coroutine is being closed (``coroutine.close()``, a pending task's coroutine
    collected), never the tool's or hook's own failure. ``close()`` reaches every frame of an
    ``await`` chain as a fresh ``GeneratorExit`` raised where that frame waits (PEP 380), so its
    traceback has this one frame; one a tool or hook raised comes up from the frames below.
    Found by attack: caught and awaited on, it made ``close()`` fail with "coroutine ignored
    GeneratorExit" and recorded the call as the tool's failure."""
    return isinstance(exc, GeneratorExit) and (exc.__traceback__ is None or exc.__traceback__.tb_next is None)


#: The fields of a denial's error and trail entry the host sets itself: a ``Deny``'s ``details``
#: cannot give them (``_denial``).
_OWN_FIELDS: Final = frozenset({"plugin", "hook", "action", "reason", "code", "message"})


def _seen(future: asyncio.Future[Any]) -> None:
    """A done callback marking ``future``'s exception retrieved (a future no one waits for any more)."""
    if not future.cancelled():
        future.exception()


def _denial(impl: Impl, hook: str, deny: Deny, context: ToolContext) -> ToolError:
    """The error a plugin's ``Deny`` ends the call with, recorded in the trail as ``deny``.

    Of the ``details`` (a dict), those keyed by a string other than the fields the host sets
    itself (``_OWN_FIELDS``; a ``retryable`` only when a bool) are kept. Found by attack:
    ``details={"plugin": ...}`` (or ``message``, ``code``...) ended the call as the host's
    ``internal`` error naming no plugin, and from ``tool_error`` made ``host.call`` raise
    ``TypeError`` with no record."""
    given = deny.details if isinstance(deny.details, dict) else {}  # attrs does not check its type
    details = {key: value for key, value in given.items() if type(key) is str and key not in _OWN_FIELDS
               and (key != "retryable" or isinstance(value, bool))}
    context.record(impl.plugin, hook, "deny", deny.reason, code=deny.code, **details)
    return ERROR_CLASSES[deny.category](f"denied by plugin {impl.plugin!r}: {deny.reason}", code=deny.code,
                                        plugin=impl.plugin, **details)


def _usable(out: ToolResult, impl: Impl, hook: str, call: ToolCall, context: ToolContext,
            secrets: Any) -> ToolResult | ToolError:
    """The result a plugin returned from ``tool_post`` or ``tool_error``, as the host reads a tool's
    (``normalize_result``: a ``success`` that is a bool, ``metadata`` a dict, a subclass read
    once), or the error naming the plugin when it is not usable (found by attack: a tool's
    ``metadata=5`` made ``host.call`` raise with no record; a plugin's did the same).

    A failed result's error is read as a tool's reported failure (``error_from_result``: one of
    the five categories, ``ExecutionError`` for any other ``type``), attributed to the plugin and
    completed with the call's fields (``error_dict``; found by attack: the plugin's dict reached the
    caller and the audit record as it was, ``type`` None or ``"Weird"``, ``code`` 5, no ``tool``,
    ``call_id`` or ``plugin``)."""
    if type(out) is ToolResult and out.success is True and out.error is None and type(out.metadata) is dict:
        return out
    try:
        usable = normalize_result(out, call.name)
        if usable.success:
            if usable.error is not None:  # a stray error beside success: dropped, as for a tool's result
                usable = ToolResult(True, usable.output, None, usable.metadata, usable.tool_call_id)
            return usable
        error = usable.error
        if error is None:  # a failure with no error: the caller and the record get one naming the plugin
            error = {"message": f"plugin {impl.plugin!r} returned a failed result from {hook} without an error"}
        elif not isinstance(error.get("message", ""), str):
            error = {**error, "message": str(error["message"])}  # raises for a message str() cannot read
        typed = _error_from_result(ToolResult(False, usable.output, error, usable.metadata), call.name, secrets)
        if typed.plugin is None:
            typed.plugin = impl.plugin
        typed.details.setdefault("hook", hook)
        return ToolResult(False, usable.output, error_dict(typed, tool=call.name, context=context, secrets=secrets),
                          usable.metadata, usable.tool_call_id)
    except Exception as bad:
        reason = bad.message if isinstance(bad, ContractError) else f"{type(bad).__name__} reading its error"
        reason = reason.replace(f"tool {call.name!r} returned ", "", 1)  # the plugin returned it, not the tool
        return ToolSystemError(f"plugin {impl.plugin!r} returned a ToolResult from {hook} that the host cannot use "
                               f"({reason})", code="hook_invalid_return", plugin=impl.plugin)


def _changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The keys a ``Modify`` added, removed or changed (a value of another type too: ``1`` to
    ``True``), sorted (for the trail's ``modify`` note). Both sides passed the argument check, so
    they nest no deeper than ``MAX_JSON_DEPTH``."""
    return sorted(set(after) ^ set(before)
                  | {key for key in after if key in before and not same_json(after[key], before[key])})


#: What ``_changed_in_place`` says of each hook: what was changed, what the host did, the error's
#: code and hint.
_CHANGED_IN_PLACE: Final = {
    "tool_pre": ("arguments", "the call was not run", "hook_changed_arguments",
                 "rewrite arguments by returning Modify with a new object (a changed copy) from tool_pre: it is "
                 "checked against the input schema and recorded"),
    "tool_rewritten": ("arguments", "the call was not run", "hook_changed_arguments",
                       "tool_rewritten only decides (None or Deny); rewrite arguments with Modify in tool_pre"),
    "tool_post": ("output", "the output was withheld", "hook_changed_output",
                  "replace the output by returning a ToolResult with a new output (a changed copy) from tool_post: "
                  "it is checked against the output schema and recorded"),
}


def _output_print(output: Any) -> bytes | None:
    """``fingerprint`` of a result's output, to tell whether a ``tool_post`` hook changed it in
    place; None for a value that cannot change (text, a number) and for one that is no JSON data
    (a set, an object: not covered)."""
    if output is None or type(output) in (str, int, float, bool, bytes):
        return None
    try:
        return fingerprint(output)
    except Exception:
        return None


class ErrorState:
    """What a ``tool_error`` implementation must not change of the ``ToolError`` it is given: its
    class, its exception arguments, its fields (``message``, ``code``, ``retryable``, ``cause``,
    ``plugin``, ``reported``, ``attempts``, any other) and its ``details``, compared as JSON data
    (``fingerprint``) and kept as a deep copy to put back.

    Limits: the inside of ``reported`` (the failed result the tool returned: its output and
    metadata) and the call's arguments are not compared; ``details`` that are no JSON data and
    cannot be deep-copied are kept and put back as ``copies.copy_of`` makes them (their dicts and
    lists copied, what cannot be copied shared)."""

    __slots__ = ("_args", "_class", "_details", "_details_print", "_fields")

    def __init__(self, error: ToolError) -> None:
        self._class = type(error)
        self._args = error.args
        self._fields = {key: value for key, value in vars(error).items() if key != "details"}
        self._details = copy_of(error.details)
        self._details_print = _json_print(error.details)

    def changed(self, error: ToolError) -> list[str]:
        """The names of what differs in ``error`` now, sorted; empty when nothing does."""
        names = [] if type(error) is self._class else ["class"]
        if error.args != self._args:
            names.append("args")
        fields = {key: value for key, value in vars(error).items() if key != "details"}
        names += sorted(key for key in fields.keys() | self._fields.keys()
                        if key not in fields or key not in self._fields or not _same(fields[key], self._fields[key]))
        details = getattr(error, "details", None)
        if self._details_print is not None:
            if _json_print(details) != self._details_print:
                names.append("details")
        elif not _same(details, self._details):
            names.append("details")
        return names

    def restore_changed(self, error: ToolError, plugin: str, context: ToolContext) -> None:
        """Undo what ``plugin``'s implementation changed in ``error``, logged and recorded."""
        changed = self.changed(error)
        if not changed:
            return
        message = (f"plugin {plugin!r} changed the error it was given in place in tool_error ({', '.join(changed)}); "
                   "the change is ignored and the original error stands")
        log.error("%s", message)
        context.record(plugin, "tool_error", "changed_in_place", message, code="hook_changed_error",
                       hint="return Deny(...) from tool_error to report another error, or a ToolResult to recover")
        if type(error) is not self._class:
            try:
                error.__class__ = self._class
            except TypeError:  # pragma: no cover - every ToolError subclass shares one layout
                pass
        error.args = self._args
        fields = vars(error)
        details = fields.get("details")
        fields.clear()
        fields.update(self._fields)
        # ``details`` put back only when changed: one held elsewhere stays the error's own.
        fields["details"] = copy_of(self._details) if "details" in changed else details


def _json_print(value: Any) -> bytes | None:
    try:
        return fingerprint(value)
    except Exception:
        return None


def _same(first: Any, second: Any) -> bool:
    """Whether two field values are the same (the same object, or equal); False when asking fails."""
    if first is second:
        return True
    try:
        return bool(first == second) and type(first) is type(second)
    except Exception:
        return False


def _pending(impl: Impl, out: Any) -> bool:
    """Whether what ``impl`` returned must still be awaited (an async implementation's coroutine)."""
    return impl.is_async or (out is not None and inspect.isawaitable(out))


@attrs.frozen(slots=True)
class PluginSettings:
    """How the host treats one plugin's hook failures."""

    fail_open: bool = False
    hook_timeout: float | None = 10.0
    #: The bound of an async ``mount`` (``hook_timeout``, never shortened by a host-wide default).
    mount_timeout: float | None = 10.0


@attrs.frozen(slots=True)
class Impl:
    """One hook implementation, ready to call."""

    plugin: str
    function: Callable[..., Any]
    argnames: tuple[str, ...]
    is_async: bool
    fail_open: bool
    timeout: float | None
    #: pluggy's own record of the implementation (None for the Amplifier bridge's handlers).
    hookimpl: Any = None
    #: The positional arguments for ``function`` from a hook call's keyword arguments, in
    #: ``argnames`` order (built once here, not per call).
    arguments: Callable[[Mapping[str, Any]], tuple[Any, ...]] = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda self: argument_getter(self.argnames), takes_self=True))


def argument_getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function taking a hook call's keyword arguments to the tuple of ``names``' values."""
    if len(names) > 1:
        return operator.itemgetter(*names)  # a tuple for 2+ names
    if names:
        name = names[0]
        return lambda kwargs: (kwargs[name],)
    return lambda kwargs: ()


#: The task each ``finish_despite_cancel`` task works for (``works_for``).
_WORKS_FOR: weakref.WeakKeyDictionary[asyncio.Task[Any], asyncio.Task[Any] | None] = weakref.WeakKeyDictionary()


def works_for(task: asyncio.Task[Any]) -> list[asyncio.Task[Any]]:
    """``task`` and each task it does work for through ``finish_despite_cancel``, nearest first:
    code running in an async ``tool_post``, ``tool_error`` or ``tool_complete`` implementation is
    inside the call whose task awaits it (found by review: ``close()`` awaited there was not told
    for one awaited inside the call, and waited for that call through the grace and the hook timeout)."""
    chain: list[asyncio.Task[Any]] = []
    current: asyncio.Task[Any] | None = task
    while current is not None and current not in chain:
        chain.append(current)
        current = _WORKS_FOR.get(current)
    return chain


async def finish_despite_cancel(awaitable: Any) -> tuple[Any, bool]:
    """``(result, cancelled)``: await ``awaitable`` to its end even if the awaiting task is
    cancelled meanwhile; ``cancelled`` says whether a cancellation arrived (the caller honours it
    once its own work is done). Only for work that must finish once started, like recording a
    call's completion. The work runs in a task of its own from its first step: code that binds to
    the current task (``asyncio.timeout``, task groups, anyio scopes) must see one task.

    Nobody else holds that task, so nobody cancels it: a ``CancelledError`` raised in it is the
    work's own (``being_cancelled`` is False there, also before 3.11)."""
    future = asyncio.ensure_future(awaitable)
    if sys.version_info < (3, 11):
        _UNCANCELLED.add(future)
    if isinstance(future, asyncio.Task):
        _WORKS_FOR[future] = asyncio.current_task()
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                cancelled = True  # ours, not the awaitable's: keep waiting
            elif not future.cancelled():
                cancelled = True  # both at once: the work is done, the cancellation stands
        except BaseException as exc:
            if thrown_in(exc):  # this coroutine is being closed (the work goes on in its task)
                raise
            break  # the awaitable's own exception: raised below
    return future.result(), cancelled  # the awaitable's exception (or its own cancellation), if any


class _OwnCancellation(Exception):
    """A hook raised ``CancelledError`` although its task was not cancelled."""


#: The task a call, start or close runs in, with the cancellation requests it found pending there
#: when it began (CPython 3.11+; set only when there were some): ``being_cancelled`` counts beyond them.
_PENDING_BEFORE: ContextVar[tuple[asyncio.Task[Any], int] | None] = ContextVar("_PENDING_BEFORE", default=None)


if sys.version_info >= (3, 11):

    def being_cancelled() -> bool:
        """Whether the current task has a cancellation request pending that arrived since the call,
        start or close running in it began (``counting_from_here``). A request already pending then
        is not this work's cancellation: a cancel caught and never withdrawn, or one a ``TaskGroup``
        whose child failed left behind before CPython 3.12.3 (gh-116720). Found by review: with one
        standing, a tool's or hook's own ``CancelledError`` was taken for the caller's cancellation,
        and ``host.call`` raised it into a caller nobody had cancelled."""
        task = asyncio.current_task()
        if task is None:
            return True
        requests = task.cancelling()
        if not requests:
            return False
        before = _PENDING_BEFORE.get()
        return before is None or before[0] is not task or requests > before[1]

    def requests_before(task: asyncio.Task[Any] | None) -> int:
        """The cancellation requests of ``task`` pending as work begins in it that are not that
        work's: those already thrown into the task. A request made while the task runs (it cancelled
        itself: ``task.cancel()``, then ``await host.call(...)``) is thrown in at its next suspension,
        inside the work: the caller's cancellation, never the work's own (found by attack: taken for
        a tool's, mount's or cleanup's own ``CancelledError``, it was lost and the cancelled caller
        got a result). The last request is then left out of the count."""
        if task is None:
            return 0
        requests = task.cancelling()
        return requests - 1 if requests and getattr(task, "_must_cancel", False) else requests

    def counting_from_here(task: asyncio.Task[Any] | None) -> Token[Any] | None:
        """Make ``being_cancelled`` count only the cancellation requests of ``task`` beyond those
        pending as work begins in it (``requests_before``), until ``stop_counting`` of what this
        returns (``None`` when none were pending)."""
        requests = requests_before(task)
        return count_beyond(task, requests) if requests else None

else:  # pragma: no cover - exercised by the py310 tox env

    def being_cancelled() -> bool:
        """Python 3.10 cannot tell: every CancelledError counts as the task's own cancellation,
        except in ``finish_despite_cancel``'s task, which nobody else can cancel (found by attack:
        an async ``tool_error`` hook or ``tool_complete`` observer raising ``CancelledError`` made
        ``host.call`` raise it, and the call was never recorded)."""
        return asyncio.current_task() not in _UNCANCELLED

    def requests_before(task: asyncio.Task[Any] | None) -> int:
        """3.10 counts no cancellation requests: 0."""
        return 0

    def counting_from_here(task: asyncio.Task[Any] | None) -> Token[Any] | None:
        """3.10 counts no cancellation requests: ``None``."""
        return None


def count_beyond(task: Any, requests: int) -> Token[Any]:
    """Make ``being_cancelled`` in ``task`` count only the cancellation requests beyond ``requests``
    (those pending as a call, start or close began in it), until ``stop_counting`` of the token."""
    return _PENDING_BEFORE.set((task, requests))


def stop_counting(token: Token[Any] | None) -> None:
    """End what ``counting_from_here`` began (nothing for ``None``)."""
    if token is not None:
        try:
            _PENDING_BEFORE.reset(token)
        except ValueError:
            # A coroutine closed from another context (collected, or closed by hand): nothing of this
            # work's there (found by attack: the error skipped the rest of the call's ``finally``, its
            # ``in_flight`` entry was never removed and close() waited out the grace for it).
            pass


#: ``finish_despite_cancel``'s tasks before 3.11 (``being_cancelled``): those tasks alone, not the
#: tasks their work starts (which that work may cancel: ``wait_for`` runs its awaitable in one).
_UNCANCELLED: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()


class HookFailure(Exception):
    """An implementation raised or timed out; carries the plugin and hook."""

    def __init__(self, impl: Impl, hook: str, cause: BaseException, secrets: Any = ()) -> None:
        kind = "timed out" if isinstance(cause, TimeLimitExceeded) else f"raised {type(cause).__name__}: {cause}"
        # Its text is logged and traced as it is: the host's secrets are out of it from the start
        # (found by attack: a hook's error quoting a resolved secret went whole to the log).
        super().__init__(redact_text(f"plugin {impl.plugin!r} failed in {hook}: {kind}", secrets, patterns=False))
        self.impl = impl
        self.hook = hook
        self.cause = cause
        #: Whether the caller's cancellation arrived while this implementation was awaited to its
        #: end (``tool_complete``): the failure must not drop it.
        self.cancelled_meanwhile = False


#: ``PluginManager.generation``'s values: each taken once (``next`` on a count is one step under the GIL).
new_stamp: Final[Callable[[], int]] = itertools.count(1).__next__


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, counting registrations so hook order is recomputed only on change."""

    #: Moves at every registration and unregistration, and when a dispatcher's handlers change
    #: (``HookDispatcher.invalidate``/``configure``): the one stamp its caches are kept for. Each
    #: move stores a value never stored before (``new_stamp``), not ``generation + 1``: a store
    #: computed before another thread's move and made after it could set the stamp back to a
    #: value a cache was kept for (found by attack: an ``invalidate`` interrupted by a
    #: registration hid the registered plugin's hooks).
    generation = 0

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """pluggy's, refusing a plugin that implements a hook of the host's as a hook wrapper
        (``HookWrapperRefused``, a ``PluginLoadError`` naming it and the hook; the plugin is left
        unregistered): the host calls each implementation itself. Found by attack: one registered
        after the host's start (``host.plugin_manager.register``) was taken, and every later
        ``host.call`` raised, with no ``tool_complete`` and no audit record."""
        self.generation = new_stamp()
        try:
            registered = super().register(plugin, name)
            wrapped = _wrapped_hook(self, plugin)
            if wrapped is not None:
                own = getattr(plugin, "name", None)
                label = name if name is not None else own if isinstance(own, str) and own else registered
                super().unregister(plugin)
                raise HookWrapperRefused(str(label), f"implements {wrapped} as a hook wrapper; the host calls each "
                                                  "implementation itself (use tryfirst/trylast for order)")
            return registered
        finally:
            self.generation = new_stamp()  # after too: a list built while pluggy was adding it is not kept

    def unregister(self, plugin: Any | None = None, name: str | None = None) -> Any | None:
        self.generation = new_stamp()
        try:
            return super().unregister(plugin, name)
        finally:
            self.generation = new_stamp()

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> pluggy.HookimplOpts | None:
        """pluggy's, skipping at once the names a plugin object only inherits from ``object``
        (``__init__``, ``__repr__``...: slot wrappers, never hook implementations), about 25 of
        the 30-odd names ``register`` asks about per plugin; pluggy's static lookup of those was
        ≈ 1.4 % of the instructions of ``amplifier-tools list``.

        Nor is a property (or ``functools.cached_property``) of a plugin's class evaluated to look
        at it: it is never a hook. pluggy 1.7 looks names up statically; before it (pluggy 1.5 and
        1.6, within setup.cfg's range) ``getattr`` ran every property at registration (found by the
        floors env: the MCP plugin's ``settings`` imported its settings module at every start)."""
        if isinstance(plugin, type) or name in _instance_names(plugin):
            return super().parse_hookimpl_opts(plugin, name)
        if name in _OBJECT_NAMES and all(name not in vars(klass) for klass in type(plugin).__mro__[:-1]):
            return None
        if runs_code_on_access(plugin, name):
            return None
        return super().parse_hookimpl_opts(plugin, name)


_OBJECT_NAMES: Final = frozenset(vars(object))
#: Class attributes whose lookup on an instance runs the plugin's code.
_EVALUATED_ON_ACCESS: Final = (property, functools.cached_property)


def runs_code_on_access(plugin: Any, name: str) -> bool:
    """Whether ``getattr(plugin, name)`` would run a property (or ``functools.cached_property``) of
    the plugin's class — never a hook, so never looked at. Other descriptors and a class's
    ``__getattr__`` are not covered (hooks are plain methods)."""
    if isinstance(plugin, type) or name in _instance_names(plugin):
        return False
    for klass in type(plugin).__mro__:
        if name in vars(klass):
            return isinstance(vars(klass)[name], _EVALUATED_ON_ACCESS)
    return False


class HookWrapperRefused(PluginLoadError):
    """A plugin implements a hook of the host's as a hook wrapper (``PluginManager.register``)."""


def _wrapped_hook(pm: pluggy.PluginManager, plugin: Any) -> str | None:
    """The first hook of the host's (one with a spec) that ``plugin`` implements as a hook
    wrapper (``hookwrapper=True`` or ``wrapper=True``), or None."""
    for caller in pm.get_hookcallers(plugin) or []:
        if caller.has_spec() and any(impl.plugin is plugin and (impl.hookwrapper or impl.wrapper)
                                     for impl in caller.get_hookimpls()):
            return caller.name
    return None


def _instance_names(obj: Any) -> Mapping[str, Any]:
    try:
        names = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return {}
    return names if isinstance(names, dict) else {}


class HookDispatcher:
    """Calls the hooks of one plugin manager with chaining, attribution and fail-closed handling."""

    def __init__(self, pm: PluginManager, settings: Mapping[str, PluginSettings] | None = None,
                 *, default_timeout: float | None = 10.0, trace: bool = False) -> None:
        self._pm = pm
        self._settings = dict(settings or {})
        self._default = PluginSettings(hook_timeout=default_timeout)
        #: The host-wide default hook timeout in seconds (None: no limit).
        self.default_timeout = default_timeout
        self._trace = trace
        #: The host-wide secrets (``session.secrets``), redacted from failures logged and traced.
        self.secrets: Any = ()
        # pluggy's hook executor as it is without monitoring: when ``add_hookcall_monitoring`` or
        # ``enable_tracing`` replaced it, each call goes through the replacement (see ``_start``).
        self._plain_hookexec = pm._inner_hookexec
        #: ``impls``' lists, for the plugin generation they were built for.
        self._cache: dict[str, list[Impl]] = {}
        self._cache_generation = -1
        #: ``present()``'s answer, and the plugin generation it was computed for.
        self._present: frozenset[str] = frozenset()
        self._present_generation = -1
        #: More implementations to run in the chain, after the plain pluggy ones and before the
        #: ``trylast`` ones: ``hook -> [(plugin, function, argnames)]`` (the Amplifier bridge).
        self.extra_impls: Callable[[str], list[tuple[str, Callable[..., Any], tuple[str, ...]]]] | None = None

    def invalidate(self) -> None:
        """Recompute the implementation lists on the next call (the set of handlers changed)."""
        self._pm.generation = new_stamp()  # a change pluggy does not count

    def settings_of(self, plugin: str) -> PluginSettings:
        """How ``plugin``'s failures are treated (its ``on_error`` and ``hook_timeout_ms``)."""
        return self._settings.get(plugin, self._default)

    def configure(self, plugin: str, settings: PluginSettings) -> None:
        """Set how ``plugin``'s failures are treated; takes effect on the next call."""
        self._settings[plugin] = settings
        self._pm.generation = new_stamp()

    def impls(self, hook: str) -> list[Impl]:
        """Implementations of ``hook`` in call order (pluggy's order).

        Cached per plugin generation, read before a list is built: when it moves, a fresh dict
        replaces the cache (never cleared in place), so a list built from the old state (a
        handler registered from another thread meanwhile) lands in the dict that was dropped,
        not in the one the next call reads."""
        generation = self._pm.generation
        cache = self._cache
        if self._cache_generation != generation:
            cache = self._cache = {}
            self._cache_generation = generation
        cached = cache.get(hook)
        if cached is not None:
            return cached
        ordered = []
        extra = self.extra_impls(hook) if self.extra_impls is not None else []
        for hookimpl in reversed(getattr(self._pm.hook, hook).get_hookimpls()):
            if extra and hookimpl.trylast:
                ordered.extend(self._extra(extra))
                extra = []
            if hookimpl.hookwrapper or hookimpl.wrapper:
                raise ToolSystemError(
                    f"plugin {hookimpl.plugin_name!r} implements {hook} as a hook wrapper; "
                    "chained hooks take plain implementations (use tryfirst/trylast for order)",
                    code="plugin_invalid",
                    plugin=hookimpl.plugin_name,
                )
            settings = self._settings.get(hookimpl.plugin_name, self._default)
            function = hookimpl.function
            ordered.append(
                Impl(
                    plugin=hookimpl.plugin_name,
                    function=function,
                    argnames=tuple(hookimpl.argnames),
                    is_async=inspect.iscoroutinefunction(function),
                    fail_open=settings.fail_open,
                    timeout=settings.hook_timeout,
                    hookimpl=hookimpl,
                )
            )
        ordered.extend(self._extra(extra))
        cache[hook] = ordered
        return ordered

    def _extra(self, extra: list[tuple[str, Callable[..., Any], tuple[str, ...]]]) -> list[Impl]:
        impls = []
        for plugin, function, argnames in extra:
            settings = self._settings.get(plugin, self._default)
            impls.append(Impl(plugin=plugin, function=function, argnames=argnames, is_async=True,
                              fail_open=settings.fail_open, timeout=settings.hook_timeout))
        return impls

    def _start(self, impl: Impl, hook: str, kwargs: dict[str, Any]) -> Any:
        """Call ``impl``; its result, or the awaitable an async implementation returned.

        When pluggy's hook-call monitoring is on (``add_hookcall_monitoring``, ``enable_tracing``,
        ``AMPLIFIER_TOOLS_TRACE``), the call goes through pluggy's executor with this one
        implementation, so the monitors see every call as they would in any pluggy project (an async
        implementation's outcome is its coroutine, awaited here afterwards). Otherwise it is called
        directly: this is the hot path."""
        hookexec = self._pm._inner_hookexec
        monitored = hookexec is not self._plain_hookexec and impl.hookimpl is not None
        if self._trace and impl.hookimpl is None:  # an Amplifier handler: no pluggy hookimpl to monitor
            print(f"amplifier_tools: calling {hook} of plugin {impl.plugin!r} (Amplifier handler)", file=sys.stderr)
        try:
            if monitored:
                return hookexec(hook, [impl.hookimpl], kwargs, True)
            return impl.function(*impl.arguments(kwargs))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise self._raised(impl, hook, exc, monitored) from exc

    def _raised(self, impl: Impl, hook: str, exc: BaseException, monitored: bool = False) -> HookFailure:
        """The failure of an implementation that raised when called (before anything was awaited):
        a plugin bug, the caller decides open/closed. A ``CancelledError`` raised by a sync
        function is its own doing, never the caller's cancellation; so is any other exception that
        is no ``Exception`` but ``KeyboardInterrupt`` (a ``GeneratorExit``, a ``SystemExit``: found
        by attack, they left ``host.call`` with no record of the call)."""
        if isinstance(exc, asyncio.CancelledError):
            exc = _OwnCancellation(str(exc) or "raised CancelledError")
        return self._failure(impl, hook, exc, monitored)

    async def _finish(self, impl: Impl, hook: str, awaitable: Any) -> Any:
        """Await an async implementation's result under the plugin's hook timeout.

        A ``CancelledError`` the implementation raised itself, while nobody cancelled the task, is a
        plugin failure like any other (it must not pass for the caller's cancellation)."""
        try:
            out = await run_with_timeout(awaitable, impl.timeout)
        except Exception as exc:
            raise self._failure(impl, hook, exc) from exc
        except asyncio.CancelledError as exc:
            if being_cancelled():
                raise
            raise self._failure(impl, hook, _OwnCancellation(str(exc) or "raised CancelledError")) from exc
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a GeneratorExit, a SystemExit: the plugin's failure too (``_raised``)
            if thrown_in(exc):  # the awaiting coroutine is being closed
                raise
            raise self._failure(impl, hook, exc) from exc
        if self._trace:  # the trace's first line said "returned coroutine": say what it came to
            print(f"amplifier_tools: {hook} of plugin {impl.plugin!r} (awaited) returned {type(out).__name__}",
                  file=sys.stderr)
        return out

    async def _finish_future(self, impl: Impl, future: asyncio.Future[Any]) -> bool:
        """Wait for a future a ``tool_complete`` observer returned: to its end despite a
        cancellation of the caller (the answer: whether one arrived), within the plugin's hook
        timeout; its exception, its own cancellation or the timeout is the plugin's failure
        (``HookFailure``). A future needs no task to run in, unlike a coroutine
        (``finish_despite_cancel``): waiting for the audit record's fsync took one per call.

        The wait is for ``wake``, a future of this wait's own that the observer's future, once
        done, and the timeout set (never cancel), so every ``CancelledError`` thrown into it is
        the caller's, on every version (found by review: the timeout cancelled the wait, and a
        cancellation of the caller arriving in the same turn of the loop was taken for it and lost:
        the cancelled caller got the call's result)."""
        cancelled = expired = False
        if not future.done():
            loop = asyncio.get_running_loop()
            wake = loop.create_future()

            def ring(_: object = None) -> None:
                if not wake.done():
                    wake.set_result(None)

            def expire() -> None:
                nonlocal expired
                expired = True
                ring()

            future.add_done_callback(ring)
            timer = loop.call_later(impl.timeout, expire) if impl.timeout is not None else None
            try:
                while not (future.done() or expired):
                    try:
                        await wake
                    except asyncio.CancelledError:
                        cancelled = True  # the caller's: keep waiting, then honour it
                        if wake.cancelled():  # the cancellation cancelled ``wake`` itself: a new one
                            wake = loop.create_future()
            finally:
                future.remove_done_callback(ring)
                if timer is not None:
                    timer.cancel()
            if not future.done():
                # Given up on, never cancelled: its outcome, when it comes, is seen here (found by
                # attack: a future failing after its wait timed out, as the audit's fsync wait does
                # when the fsync fails late, kept an exception nobody retrieved; asyncio logs "Future
                # exception was never retrieved" once such a future is collected).
                future.add_done_callback(_seen)
                raise self._failure_meanwhile(impl, TimeLimitExceeded(impl.timeout), cancelled)
        if future.cancelled():
            raise self._failure_meanwhile(impl, _OwnCancellation("its future was cancelled"), cancelled)
        exc = future.exception()
        if exc is not None and not isinstance(exc, KeyboardInterrupt):
            raise self._failure_meanwhile(impl, exc, cancelled) from exc
        if exc is not None:
            raise exc
        return cancelled

    def _failure_meanwhile(self, impl: Impl, cause: BaseException, cancelled: bool) -> HookFailure:
        """A ``tool_complete`` observer's failure, carrying whether the caller was cancelled while
        it was awaited (found by attack: a cancellation that arrived before an observer failed
        or timed out was lost, and the cancelled caller got a result)."""
        failure = self._failure(impl, "tool_complete", cause)
        failure.cancelled_meanwhile = cancelled
        return failure

    async def _finish_chained(self, impl: Impl, hook: str, out: Any) -> tuple[Any, bool]:
        """``_finish`` for an async implementation in the ``tool_post`` chain, awaited to its end
        despite a cancellation of the caller: ``(its result, whether a cancellation arrived)``; its
        failure is raised as ``HookFailure`` with ``cancelled_meanwhile`` set. Once the chain has
        begun every implementation sees the call, as in ``tool_error`` and ``tool_complete``
        (found by attack: a cancellation while one was awaited cut the chain, and the plugins after
        it saw neither ``tool_post`` nor ``tool_error`` for the call)."""
        (returned, failure), cancelled = await finish_despite_cancel(self._finish_caught(impl, hook, out))
        if failure is not None:
            failure.cancelled_meanwhile = cancelled
            raise failure
        return returned, cancelled

    async def _finish_caught(self, impl: Impl, hook: str, out: Any) -> tuple[Any, HookFailure | None]:
        """``_finish``, its failure returned, not raised (``_finish_chained``)."""
        try:
            return await self._finish(impl, hook, out), None
        except HookFailure as failure:
            return None, failure

    async def _finish_observer(self, impl: Impl, out: Any) -> HookFailure | None:
        """``_finish`` for an async ``tool_complete`` observer, its failure returned, not raised:
        ``finish_despite_cancel``'s answer (whether a cancellation arrived) is not lost with it."""
        try:
            await self._finish(impl, "tool_complete", out)
        except HookFailure as failure:
            return failure
        return None

    async def _invoke(self, impl: Impl, hook: str, kwargs: dict[str, Any]) -> Any:
        """Call one implementation to completion; ``HookFailure`` if it raises or times out.

        The one way every hook implementation is called (``tool_complete`` alone splits it into
        ``_start`` and ``_finish``, to finish an async observer despite a cancellation). A sync
        implementation never creates a coroutine of its own here.
        """
        out = self._start(impl, hook, kwargs)
        if _pending(impl, out):
            out = await self._finish(impl, hook, out)
        return out

    def _failure(self, impl: Impl, hook: str, exc: BaseException, monitored: bool = False) -> HookFailure:
        """The failure of one implementation; traced (``AMPLIFIER_TOOLS_TRACE``) unless pluggy's
        monitors saw it raised already (``monitored``): an async implementation fails after them."""
        if self._trace and not monitored:
            print(redact_text(f"amplifier_tools: {hook} of plugin {impl.plugin!r} raised {exc!r} (awaited)",
                              self.secrets, patterns=False), file=sys.stderr)
        return HookFailure(impl, hook, exc, self.secrets)

    def _log_traceback(self, failure: HookFailure) -> None:
        """Where an implementation raised, for its author: logged at INFO (``--verbose``), the
        host's secrets out of it; not for a timeout or a typed error the plugin meant to raise."""
        cause = failure.cause
        if not isinstance(cause, (TimeLimitExceeded, ToolError)) and log.isEnabledFor(logging.INFO):
            log.info("traceback of %s", failure, exc_info=chain_without_secrets(cause, self.secrets))

    def _failed(self, failure: HookFailure, context: ToolContext) -> ToolError | None:
        """Record a hook failure; the error to fail the call with, or None when fail-open."""
        impl, hook = failure.impl, failure.hook
        timed_out = isinstance(failure.cause, TimeLimitExceeded)
        if impl.fail_open:
            log.warning("%s (ignored: plugin is configured on_error='ignore')", failure)
            self._log_traceback(failure)
            context.record(impl.plugin, hook, "ignored_failure", str(failure))
            return None
        log.error("%s", failure)
        self._log_traceback(failure)
        context.record(impl.plugin, hook, "failed", str(failure))
        if isinstance(failure.cause, ToolError):  # a typed refusal keeps its category and code
            typed = failure.cause
            if typed.plugin is None:
                typed.plugin = impl.plugin
            typed.details.setdefault("hook", hook)
            return typed
        return ToolSystemError(
            str(failure),
            code="hook_timeout" if timed_out else "hook_failed",
            cause=type(failure.cause).__name__,
            plugin=impl.plugin,
            hook=hook,
        )

    # -- the chained call hooks ------------------------------------------------

    async def tool_pre(
        self,
        call: ToolCall,
        spec: Any,
        context: ToolContext,
        revalidate: Callable[[Any, str], None],
    ) -> ToolCall:
        """Run the ``tool_pre`` chain; the call as rewritten, or raise the ``ToolError`` that stops it.

        A rewrite is a ``Modify``, checked (``revalidate``) and recorded. The arguments object the
        chain was given, and each ``Modify``'s once checked, must come out of the chain as they
        went in (``fingerprint`` before and after, ``_changed_in_place``): changed in place, they
        would reach the tool unchecked and be missing from the trail and the audit record."""
        kwargs = {"call": call, "spec": spec, "context": context}
        pm, plain = self._pm, self._plain_hookexec
        given, given_print = call.arguments, fingerprint(call.arguments)
        #: the last Modify's arguments, their fingerprint once checked, and the implementation that returned it
        latest: tuple[Any, bytes, Impl] | None = None
        for impl in self.impls("tool_pre"):
            try:
                # ``_invoke`` inlined, and ``_start``'s unmonitored path: a sync implementation
                # (most) costs no coroutine and no extra frame per call. Whether a monitor is
                # installed is asked before each one: an earlier hook may have installed it.
                if pm._inner_hookexec is plain:
                    try:
                        out = impl.function(*impl.arguments(kwargs))
                    except KeyboardInterrupt:
                        raise
                    except BaseException as exc:
                        raise self._raised(impl, "tool_pre", exc) from exc
                else:
                    out = self._start(impl, "tool_pre", kwargs)
                if impl.is_async or (out is not None and inspect.isawaitable(out)):  # ``_pending``
                    out = await self._finish(impl, "tool_pre", out)
            except HookFailure as failure:
                error = self._failed(failure, context)
                if error is not None:
                    raise error from None
                continue
            if out is None:
                continue
            if isinstance(out, Deny):
                raise _denial(impl, "tool_pre", out, context)
            if isinstance(out, Modify):
                try:
                    revalidate(out.arguments, impl.plugin)
                except ContractError as exc:
                    context.record(impl.plugin, "tool_pre", "invalid_modify", exc.message)
                    raise
                context.record(impl.plugin, "tool_pre", "modify", out.reason,
                               changed=_changed_keys(call.arguments, out.arguments))
                call = kwargs["call"] = ToolCall(call.id, call.name, out.arguments)
                latest = (out.arguments, fingerprint(out.arguments), impl)
                continue
            context.record(impl.plugin, "tool_pre", "failed", f"returned {type(out).__name__}")
            raise ToolSystemError(
                f"plugin {impl.plugin!r} returned {type(out).__name__} from tool_pre; "
                "expected None, Deny or Modify",
                code="hook_invalid_return",
                plugin=impl.plugin,
            )
        if latest is None:
            if fingerprint(given) != given_print:
                raise self._changed_in_place("tool_pre", call.name, context)
            return call
        arguments, arguments_print, rewriter = latest
        if fingerprint(given) != given_print or fingerprint(arguments) != arguments_print:
            raise self._changed_in_place("tool_pre", call.name, context)
        await self._tool_rewritten(call, kwargs, rewriter, context)
        if fingerprint(given) != given_print or fingerprint(arguments) != arguments_print:
            raise self._changed_in_place("tool_rewritten", call.name, context)
        return call

    async def _tool_rewritten(self, call: ToolCall, kwargs: dict[str, Any], rewriter: Impl,
                              context: ToolContext) -> None:
        """Run ``tool_rewritten`` after a ``tool_pre`` chain that rewrote the arguments (``rewriter``
        made the last ``Modify``), for each plugin whose ``tool_pre`` did not see the final ones;
        raise the ``ToolError`` of the first ``Deny`` or failure, as ``tool_pre`` does. Found by
        attack: a ``trylast`` hook's ``Modify`` reached the tool unchecked by the policy's rules and
        the filesystem's protected-path guard, which had decided on the arguments before it."""
        pre = self.impls("tool_pre")  # a list rebuilt meanwhile (a plugin registered) lacks it: all decide
        after = next((n + 1 for n, impl in enumerate(pre) if impl is rewriter), len(pre))
        # a plugin's own pluggy ``tool_pre`` only: found by attack, an Amplifier handler it registered
        # (named by it) running after the rewrite skipped its check of arguments its tool_pre never saw
        saw_final = {impl.plugin for impl in pre[after:] if impl.hookimpl is not None}
        for impl in self.impls("tool_rewritten"):
            if impl.plugin in saw_final:
                continue
            try:
                out = await self._invoke(impl, "tool_rewritten", kwargs)
            except HookFailure as failure:
                error = self._failed(failure, context)
                if error is not None:
                    raise error from None
                continue
            if out is None:
                continue
            if isinstance(out, Deny):
                raise _denial(impl, "tool_rewritten", out, context)
            context.record(impl.plugin, "tool_rewritten", "failed", f"returned {type(out).__name__}")
            raise ToolSystemError(
                f"plugin {impl.plugin!r} returned {type(out).__name__} from tool_rewritten; expected None or Deny "
                "(arguments are rewritten in tool_pre only)",
                code="hook_invalid_return",
                plugin=impl.plugin,
            )

    def _changed_in_place(self, hook: str, tool: str, context: ToolContext) -> ToolSystemError:
        """The call's end when a ``tool_pre`` hook changed the arguments in place, or a
        ``tool_post`` hook the output (found by attack: it skipped the output schema check and the
        final secret scrub, which passes over the object scrubbed before ``tool_post``, and the
        trail said nothing of it)."""
        what, end, code, hint = _CHANGED_IN_PLACE[hook]
        plugins = sorted({impl.plugin for impl in self.impls(hook)})
        message = f"a {hook} hook changed the {what} of {tool!r} in place ({hook} ran in: {', '.join(plugins)}); {end}"
        context.record("host", hook, "changed_in_place", message)
        return ToolSystemError(message, code=code, hint=hint)

    async def tool_post(
        self,
        call: ToolCall,
        spec: Any,
        result: ToolResult,
        context: ToolContext,
        check_output: Callable[..., None],
        on_failure: Callable[[ToolCall, Any, ToolContext, ToolError], ToolResult],
    ) -> ToolResult:
        """Run the ``tool_post`` chain over ``result``; a failed hook replaces it with a failure.

        A replacement's output is checked (``check_output(output, plugin=...)``, raising
        ``ContractError``); a failure, and a refused replacement, become
        ``on_failure(call, spec, context, error)``. A ``Deny`` withholds the output the same way,
        as the plugin's denial (``hook_denied``, recorded as ``deny``). After either the withheld
        output stays withheld: later implementations still see the (failed) result, but a
        replacement or another denial they return is recorded and ignored (found by attack: an
        Amplifier handler's ``modify`` after another's ``deny`` turned the call back into a success).

        A cancellation of the caller's task while an async implementation is awaited does not cut
        the chain short: that implementation and every later one run to their end (each within its
        hook timeout), then ``CancelledError`` is raised for the caller to honour (``_finish_chained``).
        One without a hook timeout (``hook_timeout_ms = None``) is cut by the cancellation instead.
        """
        kwargs = {"call": call, "spec": spec, "result": result, "context": context}
        failed_closed = False
        cancelled = False
        pm, plain = self._pm, self._plain_hookexec
        checked, checked_print = result.output, _output_print(result.output)  # the output as last checked
        for impl in self.impls("tool_post"):
            try:
                if pm._inner_hookexec is plain:  # ``_invoke`` and ``_start`` inlined, as in tool_pre
                    try:
                        out = impl.function(*impl.arguments(kwargs))
                    except KeyboardInterrupt:
                        raise
                    except BaseException as exc:
                        raise self._raised(impl, "tool_post", exc) from exc
                else:
                    out = self._start(impl, "tool_post", kwargs)
                if impl.timeout is None and (impl.is_async or (out is not None and inspect.isawaitable(out))):
                    # Nothing bounds it: a cancellation cuts it, as before (found by review: one that
                    # never returned, run to its end past a cut by close(), lost the call's record).
                    out = await self._finish(impl, "tool_post", out)
                elif impl.is_async or (out is not None and inspect.isawaitable(out)):
                    out, late = await self._finish_chained(impl, "tool_post", out)
                    cancelled = cancelled or late
            except HookFailure as failure:
                cancelled = cancelled or failure.cancelled_meanwhile
                error = self._failed(failure, context)
                if error is not None and not failed_closed:
                    failed_closed = True
                    result = kwargs["result"] = on_failure(call, spec, context, error)
                continue
            if out is None:
                continue
            if isinstance(out, Deny):
                if failed_closed:
                    context.record(impl.plugin, "tool_post", "deny_ignored", out.reason, code=out.code)
                    continue
                failed_closed = True
                result = kwargs["result"] = on_failure(call, spec, context, _denial(impl, "tool_post", out, context))
                continue
            if isinstance(out, ToolResult):
                if failed_closed:
                    context.record(impl.plugin, "tool_post", "replace_ignored",
                                   "an earlier plugin withheld the output (it failed closed or denied)")
                    continue
                usable = _usable(out, impl, "tool_post", call, context, self.secrets)
                if isinstance(usable, ToolError):
                    context.record(impl.plugin, "tool_post", "failed", usable.message)
                    failed_closed = True
                    result = kwargs["result"] = on_failure(call, spec, context, usable)
                    continue
                out = usable
                if out.success and out.output is checked and checked_print is not None \
                        and _output_print(checked) != checked_print:
                    # The output object changed in place and handed back (``return result``): still not
                    # scrubbed again, the object the pipeline scrubbed before tool_post (found by review).
                    failed_closed = True
                    result = kwargs["result"] = on_failure(call, spec, context,
                                                           self._changed_in_place("tool_post", call.name, context))
                    continue
                context.record(impl.plugin, "tool_post", "replace")
                if out.success:
                    try:
                        check_output(out.output, plugin=impl.plugin)
                    except ContractError as refused:
                        out = on_failure(call, spec, context, refused)
                    else:
                        checked, checked_print = out.output, _output_print(out.output)
                result = kwargs["result"] = out
                continue
            error = ToolSystemError(
                f"plugin {impl.plugin!r} returned {type(out).__name__} from tool_post; "
                "expected None or a ToolResult",
                code="hook_invalid_return",
                plugin=impl.plugin,
            )
            context.record(impl.plugin, "tool_post", "failed", error.message)
            if not failed_closed:
                failed_closed = True
                result = kwargs["result"] = on_failure(call, spec, context, error)
        if result.success and result.output is checked and checked_print is not None \
                and _output_print(checked) != checked_print:
            result = on_failure(call, spec, context, self._changed_in_place("tool_post", call.name, context))
        if cancelled:
            raise asyncio.CancelledError
        return result

    async def tool_error(
        self, call: ToolCall, spec: Any, error: ToolError, context: ToolContext,
        check_output: Callable[..., None] | None = None,
    ) -> tuple[ToolResult | None, ToolError | None]:
        """Run every ``tool_error`` implementation: ``(the first recovery result or None, the first
        denial's error or None)``. A ``Deny`` withholds the failed call's output (a tool-reported
        failure's: bash's stdout) and its error (``hook_denied``) is the call's; a recovery before
        or after it, and a second denial, are recorded and ignored, as after a denial in
        ``tool_post`` (found by attack: such a denial was recorded as a recovery).

        The ``ToolError`` given is the call's error: an implementation that changes it in place (its
        message, code, ``retryable``, details, class) has the change undone before the next one runs,
        logged and recorded as ``changed_in_place`` naming the plugin; the original error stands, as
        for a failure inside ``tool_error`` (``ErrorState``; found by attack: the change reached later
        plugins, the caller and the audit record, where ``tool_pre`` and ``tool_post`` refuse a change
        in place). To report another error a plugin returns ``Deny``; to recover, a ``ToolResult``.

        A successful recovery's output is checked as a ``tool_post`` replacement's
        (``check_output(output, plugin=...)``, the tool's when it is known): one it refuses is that
        plugin's failure, recorded, and the original error stands (found by attack: a recovery
        breaking the output schema reached the caller as a success)."""
        recovery: ToolResult | None = None
        denied: ToolError | None = None
        kwargs = {"call": call, "spec": spec, "error": error, "context": context}
        kept: ErrorState | None = None  # taken before the first implementation runs
        for impl in self.impls("tool_error"):
            if kept is None:
                kept = ErrorState(error)
            try:
                out = await self._invoke(impl, "tool_error", kwargs)
            except HookFailure as failure:
                log.error("%s (the original error stands)", failure)
                self._log_traceback(failure)
                context.record(impl.plugin, "tool_error", "failed", str(failure))
                kept.restore_changed(error, impl.plugin, context)
                continue
            kept.restore_changed(error, impl.plugin, context)
            if isinstance(out, Deny):
                if denied is None:
                    denied = _denial(impl, "tool_error", out, context)
                else:
                    context.record(impl.plugin, "tool_error", "deny_ignored", out.reason, code=out.code)
            elif isinstance(out, ToolResult):
                usable = _usable(out, impl, "tool_error", call, context, self.secrets)
                if isinstance(usable, ToolError):
                    log.error("%s (the original error stands)", usable.message)
                    context.record(impl.plugin, "tool_error", "failed", usable.message)
                elif recovery is None and denied is None:
                    if usable.success and check_output is not None:
                        try:
                            check_output(usable.output, plugin=impl.plugin)
                        except ContractError as refused:
                            log.error("%s (the original error stands)", refused.message)
                            context.record(impl.plugin, "tool_error", "failed", refused.message)
                            continue
                    recovery = usable
                    context.record(impl.plugin, "tool_error", "recover")
                else:
                    context.record(impl.plugin, "tool_error", "recover_ignored",
                                   "an earlier plugin recovered" if denied is None else "an earlier plugin denied")
            elif out is not None:
                context.record(impl.plugin, "tool_error", "failed", f"returned {type(out).__name__}")
        return (recovery if denied is None else None), denied

    async def tool_complete(
        self, call: ToolCall, spec: Any, result: ToolResult, context: ToolContext,
        on_failure: Callable[[ToolCall, Any, ToolContext, ToolResult, ToolError], ToolResult] | None = None,
    ) -> tuple[ToolResult, ToolError | None, bool]:
        """Run every ``tool_complete`` observer once; ``(final result, error that failed it closed,
        whether the caller's task was cancelled meanwhile)``.

        When an observer fails closed, ``on_failure(call, spec, context, result, error)`` builds the result the caller
        will get and every later observer (the audit log last of all) sees that one, so the record
        states what the caller received. A cancellation that arrives while an async observer is
        awaited does not cut the chain short: every observer still runs to its end, and the caller
        is told (it honours the cancellation then: raises ``CancelledError``, or returns the
        ``host_closing`` result of a call cut by ``close``), also when the observer that was
        awaited failed.
        """
        first: ToolError | None = None
        cancelled = False
        kwargs = {"call": call, "spec": spec, "result": result, "context": context}
        for impl in self.impls("tool_complete"):
            try:
                out = self._start(impl, "tool_complete", kwargs)
                if isinstance(out, asyncio.Future):  # only waited for: no task of its own (the audit's fsync)
                    cancelled = await self._finish_future(impl, out) or cancelled
                elif impl.is_async or (out is not None and inspect.isawaitable(out)):
                    failed, late = await finish_despite_cancel(self._finish_observer(impl, out))
                    cancelled = cancelled or late
                    if failed is not None:
                        raise failed
            except HookFailure as failure:
                cancelled = cancelled or failure.cancelled_meanwhile
                error = self._failed(failure, context)
                if first is None and error is not None:
                    first = error
                    if on_failure is not None:
                        result = kwargs["result"] = on_failure(call, spec, context, result, error)
        return result, first, cancelled

    def present(self) -> frozenset[str]:
        """The call hooks (``CALL_HOOKS``) that have at least one implementation, cached until a
        plugin is registered or unregistered or ``invalidate``/``configure`` runs (the plugin
        manager's ``generation``): one question where asking ``impls`` hook by hook cost a call
        each. The pipeline asks at a call's start, again before ``tool_post`` (a plugin registered
        while the tool ran gets its ``tool_post``) and before ``tool_complete``."""
        generation = self._pm.generation
        if self._present_generation == generation:
            return self._present
        return self._refresh_present(generation)

    def _refresh_present(self, generation: int) -> frozenset[str]:
        """``present``'s answer computed for the stamp ``generation``, read before computing (a
        change meanwhile is seen by the next call). Apart from ``present``: its comprehension
        would make ``self`` a cell on every call."""
        present = frozenset(hook for hook in CALL_HOOKS if self.impls(hook))
        self._present, self._present_generation = present, generation
        return present

    async def tool_event(self, event: str, data: dict[str, Any]) -> None:
        """Deliver an event to every ``tool_event`` implementation; failures are logged."""
        for impl in self.impls("tool_event"):
            try:
                await self._invoke(impl, "tool_event", {"event": event, "data": data})
            except HookFailure as failure:
                log.error("%s", failure)
                self._log_traceback(failure)

    async def mount(self, plugin: Any, coordinator: Any, config: dict[str, Any]) -> Any:
        """Call one plugin's own ``mount`` implementation (not the whole hook); an async one within
        the plugin's ``mount_timeout`` (its ``hook_timeout_ms``, never less than the default 10 s
        when that comes from the host-wide setting), as every async hook (found by attack: a
        ``mount`` that never returned hung the host's start, and ``amplifier-tools validate`` with
        it, for ever). Past it, ``SystemError`` ``hook_timeout`` naming the plugin and the setting.
        From Python 3.11 only, where the bound runs the mount in the caller's own task."""
        for hookimpl in self._pm.hook.mount.get_hookimpls():
            if hookimpl.plugin is plugin:
                kwargs = {"coordinator": coordinator, "config": config}
                out = hookimpl.function(*[kwargs[name] for name in hookimpl.argnames])
                if inspect.isawaitable(out) and sys.version_info < (3, 11):
                    # Unbounded: ``wait_for`` would run the mount in a task of its own, and even a mount
                    # that never waits would let the loop run first (found by CI: an ``audit:tamper``
                    # event the audit plugin emitted at mount reached no handler of a later plugin).
                    out = await out
                elif inspect.isawaitable(out):
                    name = hookimpl.plugin_name
                    seconds = self.settings_of(name).mount_timeout
                    try:
                        out = await run_with_timeout(out, seconds)
                    except TimeLimitExceeded:
                        raise ToolSystemError(
                            f"mount did not finish within {seconds:g} s (hook_timeout_ms)", code="hook_timeout",
                            plugin=name, hint=f"raise [plugins.{name}] hook_timeout_ms if its start needs longer, "
                            "or find what its mount waits for") from None
                return out
        return None
