"""The per-call data: what comes in (``ToolCall``, ``ToolContext``), what hooks
return (``Deny``, ``Modify``), what goes out (``ToolResult``) and the decision
trail (``Decision``).

All are attrs classes; JSON conversion lives in ``amplifier_tools.converter`` (defined in
:mod:`amplifier_tools._converter`), never in methods here.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Final, Union

import attrs

from .errors import AuthError

#: Default cut-off for ``ToolResult.get_serialized_output`` (the seed's
#: ~12.5k-token guidance).
DEFAULT_MAX_OUTPUT_CHARS: Final = 50_000

#: How a context resolves a secret reference: a mapping or a callable that
#: returns ``None`` for an unknown name.
SecretResolver = Union[Mapping[str, str], Callable[[str], Union[str, None]]]


_CALL_ID_PREFIX = "call_" + uuid.uuid4().hex[:12] + "_"
_call_counter = itertools.count(1)


def new_call_id() -> str:
    """A fresh call id, unique across processes (random per-process prefix + counter)."""
    return f"{_CALL_ID_PREFIX}{next(_call_counter)}"


#: The longest id a caller may choose for a call (``host.call(call_id=...)``, ``ToolCall.id``), and
#: each of ``ToolContext.scopes``.
MAX_CALL_ID: Final = 128
#: The longest ``ToolContext.principal``, ``role``, ``environment``, ``idempotency_key``,
#: ``trace_id`` or ``session_id`` (an e-mail address may have 254 characters, an idempotency key
#: commonly 255; a session id nested by sub-sessions, as Amplifier's, grows with each level).
MAX_NAME: Final = 256


def identifier_problem(value: object, secrets: Any = (), longest: int = MAX_CALL_ID, kind: str = "id") -> str | None:
    """Why the host refuses an identifier a caller chose, or None: an identifier is a correlation key
    or a name, not free text. It must be a string of 1 to ``longest`` characters holding neither a
    secret value of ``secrets`` (the host's ``SecretSet``) nor a credential shape (``redaction``'s
    patterns); its characters, by ``kind``: ``"id"`` printable ASCII (a call, trace or session id),
    ``"token"`` printable ASCII but no space (a scope, as OAuth's), ``"name"`` any printable
    character, non-ASCII letters too (a principal such as ``zoë@example.com``, a role) but no control,
    format (bidirectional overrides, zero-width) or line-separating character, and no white space
    at either end (``"alice "`` would be a principal of its own, with its own rate limits and budgets,
    and read as ``alice`` in a log; a principal of spaces alone would be no name). The reason never quotes
    the value. Found by attack: a call id holding a token reached the caller's result and every
    ``tool_event`` observer whole, the error's and the audit record's ``call_id`` as ``[REDACTED]``
    (no longer a key to find the call by), and an id of 200 KB or with control characters went into
    the audit log as it was; so did a ``ToolContext.session_id``, ``trace_id`` or ``principal``.

    Limits: a secret registered after the check (a tool resolving one equal to the value) is not
    looked for here; the audit record and the result are still scrubbed of it. Names that look
    alike (a Cyrillic letter for the Latin one it resembles) are not told apart."""
    if value.__class__ is not str:
        return f"must be a string, got {type(value).__name__}"
    assert isinstance(value, str)
    if not value:
        return "is empty"
    if len(value) > longest:
        return f"is {len(value)} characters long, more than {longest}"
    if not value.isprintable():
        return "holds a control, format or line-separating character"
    if kind != "name" and not value.isascii():
        return "holds characters other than printable ASCII"
    if kind == "token" and " " in value:
        return "holds a space (one scope per item: scopes={'fs:read', 'fs:write'})"
    if kind == "name" and value.strip() != value:
        return "begins or ends with white space (it would name someone else than the same name without it)"
    redact_text = _redaction or _load_redaction()
    if redact_text(value, secrets) != value:
        return "holds a secret value or a credential-shaped string (not quoted here)"
    return None


#: ``redaction.redact_text``, once first needed: ``import amplifier_tools`` does not load the
#: redaction, and an import statement in ``identifier_problem`` cost each check ≈ 3.5 µs of its 4.3.
_redaction: Callable[..., str] | None = None


def _load_redaction() -> Callable[..., str]:
    global _redaction
    from .redaction import redact_text

    _redaction = redact_text
    return redact_text


def _fresh_call_ids() -> None:
    """A forked child's call ids: a prefix of its own, its counter anew. Found by review: a child
    forked by ``multiprocessing`` or ``gunicorn --preload`` made its parent's ids, so two calls
    had one id in a shared audit log. Limit: a fork that skips Python's fork hooks (libc's
    ``fork`` through ``ctypes``) keeps the parent's; asking the process id at every call instead
    would cost each call a system call."""
    global _CALL_ID_PREFIX, _call_counter
    _CALL_ID_PREFIX = "call_" + uuid.uuid4().hex[:12] + "_"
    _call_counter = itertools.count(1)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_fresh_call_ids)


@attrs.frozen(slots=False)
class ToolCall:
    """One request to run a tool: correlation ``id``, tool ``name``, JSON ``arguments``."""

    id: str
    name: str
    arguments: Any = attrs.field(factory=dict)


@attrs.frozen(slots=False)
class ToolResult:
    """The outcome of a call.

    ``success`` and ``output`` on success; ``error`` (a dict with ``type``,
    ``code``, ``message``, ``retryable`` and correlation fields) on failure.
    ``metadata`` holds the decision trail (``metadata["trail"]``), timing, the rich
    content blocks when there are any (``metadata["content"]``, see
    :mod:`amplifier_tools.content`) and whatever the tool adds.
    """

    success: bool = True
    output: Any = None
    error: dict[str, Any] | None = None
    metadata: dict[str, Any] = attrs.field(factory=dict)
    tool_call_id: str | None = None

    @property
    def is_error(self) -> bool:
        """True when the call failed (the seed's alternative spelling)."""
        return not self.success

    def get_serialized_output(self, max_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS) -> str:
        """The text to put into a model's context.

        Failures read ``Error: <message>``; non-string output is JSON; a result with no output
        but rich content (``metadata["content"]``: images, audio, resources) reads as that
        content rendered by ``amplifier_tools.content.render`` (a line per block, no bytes). Text
        longer than ``max_chars`` is cut and ends with a notice saying how many
        characters were left out, so a model knows it saw a part only.
        ``max_chars=None`` never cuts.
        """
        if self.error is not None or not self.success:
            message = (self.error or {}).get("message", "Unknown error")
            text = f"Error: {message}"
        elif self.output is None and self.metadata.get("content"):
            from .content import blocks_of, render

            text = render(blocks_of(self.metadata))
        else:
            text = output_text(self.output)
        return truncate_text(text, max_chars)


def truncate_text(text: str, max_chars: int | None) -> str:
    """``text`` cut to its first ``max_chars`` characters, followed by the one notice a model
    sees of a cut, ``[Truncated: N of M characters omitted]`` (``N`` left out of ``M``), on a
    line of its own after a blank one; ``text`` as it is when ``max_chars`` is None or it is no
    longer than ``max_chars``. ``max_chars=0`` keeps none of the text, only the notice.

    The one implementation of the notice: ``ToolResult.get_serialized_output`` and the framework
    adapters' ``model_text`` and ``model_parts`` all cut with it, so a model reads a cut the same
    way whichever path it came by.
    """
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n\n[Truncated: {len(text) - max_chars} of {len(text)} characters omitted]"


def output_text(output: Any) -> str:
    """A tool's output as text: a string as it is, nothing as ``""``, anything else as compact JSON
    that a strict parser reads (``_json.json_text``).

    What JSON cannot hold is written as the audit record writes it (``_json.encodable``): found by
    trial, a function tool returning ``math.factorial(2000)`` (over 4,300 digits) or a list holding
    itself made ``get_serialized_output`` raise ``ValueError`` — in the framework adapters,
    ``serve-mcp`` and ``amplifier-tools call`` — after the call had succeeded. Found by attack: so
    did an object whose ``__str__`` raises (``encodable`` writes it as ``<TypeName>``), and NaN
    was written as ``NaN``, which is no JSON (now ``"NaN"``, a string, as in the record).
    """
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    from ._json import json_text

    return json_text(output)


@attrs.frozen(slots=True)
class Decision:
    """One entry of the decision trail: which plugin did what, in which hook, and why."""

    plugin: str
    hook: str
    action: str
    reason: str | None = None
    code: str | None = None
    details: dict[str, Any] = attrs.field(factory=dict)


_new_context = object.__new__


def _dict_setter(cls: type) -> Callable[[Any, dict[str, Any]], None]:
    """What sets the instance dict of an object of ``cls`` (or a subclass) whole: the setter of
    ``cls``'s own ``__dict__`` descriptor, which ``object.__setattr__(obj, "__dict__", fields)``
    finds and calls, without that lookup by name and its argument tuples (≈ 450 instructions
    fewer on CPython 3.11, a call sets three or four dicts: session 32). Frozen classes' own
    ``__setattr__`` is bypassed alike."""
    setter: Callable[[Any, dict[str, Any]], None] = vars(cls)["__dict__"].__set__
    return setter


_set_call_dict: Final = _dict_setter(ToolCall)
_set_result_dict: Final = _dict_setter(ToolResult)


def _frozen_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """``scopes`` as a frozenset; ``TypeError`` for one string (found by attack: ``scopes="fs:read"``
    became the scopes ``f``, ``s``, ``:``, ``r`` ...)."""
    if type(scopes) is frozenset:
        return scopes
    if isinstance(scopes, (str, bytes)):
        raise TypeError(f"ToolContext.scopes must be a collection of scope names, not one {type(scopes).__name__}: "
                        f"write scopes={{{scopes!r}}}")
    return frozenset(scopes)


#: ``ToolContext`` fields that hold a string or None.
_OPTIONAL_TEXT: Final = ("role", "environment", "idempotency_key", "call_id", "trace_id", "session_id")


#: The identifiers a caller sets in a ``ToolContext``, each with its longest length and kind of
#: characters (``identifier_problem``); each of ``scopes`` is a ``"token"`` of ``MAX_CALL_ID``.
#: ``attributes`` is the caller's free data for plugins, not checked.
_IDENTIFIERS: Final = (("principal", MAX_NAME, "name"), ("role", MAX_NAME, "name"),
                       ("environment", MAX_NAME, "name"), ("idempotency_key", MAX_NAME, "name"),
                       ("call_id", MAX_CALL_ID, "id"), ("trace_id", MAX_NAME, "id"),
                       ("session_id", MAX_NAME, "id"))


class ContextFieldError(ValueError):
    """A ``ToolContext`` identifier the host refuses (``identifier_problem``); ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"ToolContext.{field} {reason}")
        self.field = field


#: Identifiers found fine with no secret to look for (credential shapes only), by ``(value, kind, longest)``:
#: a context built per call with the same principal, role and scopes pays a lookup, not a check
#: (≈ 1 µs each). At most ``_MAX_FINE`` of at most ``MAX_NAME`` characters; emptied when full.
_fine: dict[tuple[str, str, int], None] = {}
_MAX_FINE: Final = 4096


def _shape_problem(value: str, longest: int, kind: str) -> str | None:
    """``identifier_problem`` of ``value`` with no secrets, its verdicts of fine values kept."""
    key = (value, kind, longest)
    if key in _fine:
        return None
    reason = identifier_problem(value, (), longest, kind)
    if reason is None:
        if len(_fine) >= _MAX_FINE:
            _fine.clear()
        _fine[key] = None
    return reason


def _identifiers_problem(context: Any, secrets: Any) -> Exception | None:
    """The first identifier of ``context`` (its fields of the right types) the host refuses, or None.
    Only ids (``"id"``) are searched for the values of ``secrets``: a name or a scope is looked at for
    credential shapes alone, since a configured one found by substitution (``role = "${ROLE}"``) is a
    registered secret itself, and a caller passing the same role on must not be refused."""
    for name, longest, kind in _IDENTIFIERS:
        value = getattr(context, name)
        if value is None:
            continue
        reason = identifier_problem(value, secrets, longest, kind) if secrets and kind == "id" \
            else _shape_problem(value, longest, kind)
        if reason is not None:
            return ContextFieldError(name, reason)
    for scope in context.scopes:
        if (reason := _shape_problem(scope, MAX_CALL_ID, "token")) is not None:
            return ContextFieldError("scopes", f"holds a scope that {reason}")
    return None


def context_problem(context: Any, registered: Any = ()) -> Exception | None:
    """What is wrong with the fields of ``context`` (a ``ToolContext``, typed ``Any``: its annotations say
    what the fields should hold, this checks what they do), naming the field; None when nothing is.
    Its identifiers must also be ones ``identifier_problem`` takes (``_IDENTIFIERS``), its ids holding no
    secret value of ``registered`` (the host's ``SecretSet``: the constructor knows none and looks for
    credential shapes only) — refused with a ``ContextFieldError``. A copy the host makes for a call
    (``for_call``) is not checked again: the common call pays nothing for this."""
    role, environment, key, call_id, trace_id, session = (context.role, context.environment, context.idempotency_key,
                                                           context.call_id, context.trace_id, context.session_id)
    deadline = context.deadline
    if (context.principal.__class__ is str and (role is None or role.__class__ is str)
            and (environment is None or environment.__class__ is str) and (key is None or key.__class__ is str)
            and (call_id is None or call_id.__class__ is str) and (trace_id is None or trace_id.__class__ is str)
            and (session is None or session.__class__ is str)
            and (deadline is None or (deadline.__class__ is float and deadline == deadline))  # NaN != NaN
            and context.attributes.__class__ is dict and context.trail.__class__ is list
            and (context.secrets is None or context.secrets.__class__ is dict)
            and context.scopes.__class__ is frozenset
            and (not context.scopes or all(scope.__class__ is str for scope in context.scopes))):
        return _identifiers_problem(context, registered)  # the common context's types, in one expression
    if not isinstance(context.principal, str):
        return TypeError(f"ToolContext.principal must be a str, got {type(context.principal).__name__}")
    for name in _OPTIONAL_TEXT:
        value = getattr(context, name)
        if value is not None and not isinstance(value, str):
            return TypeError(f"ToolContext.{name} must be a str or None, got {type(value).__name__}")
    if not isinstance(context.scopes, AbstractSet):  # the constructor makes one; found by review: 5 raised out of call
        return TypeError(f"ToolContext.scopes must be a set of scope names, got {type(context.scopes).__name__}")
    for scope in context.scopes:
        if not isinstance(scope, str):
            return TypeError(f"ToolContext.scopes must hold strings, got {type(scope).__name__} {scope!r}")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
            return TypeError(f"ToolContext.deadline must be a time.monotonic() reading (a float) or None, "
                             f"got {type(deadline).__name__}; ToolContext.with_timeout(seconds) sets one")
        if deadline != deadline:
            return ValueError("ToolContext.deadline must not be NaN")
    if not isinstance(context.attributes, Mapping):
        return TypeError(f"ToolContext.attributes must be a mapping, got {type(context.attributes).__name__}")
    secrets = context.secrets
    if secrets is not None and not isinstance(secrets, Mapping) and not callable(secrets):
        return TypeError(f"ToolContext.secrets must be a mapping or a callable (name -> value or None), "
                         f"got {type(secrets).__name__}")
    if not isinstance(context.trail, list):
        return TypeError(f"ToolContext.trail must be a list, got {type(context.trail).__name__}")
    return _identifiers_problem(context, registered)


@attrs.frozen(slots=False)
class ToolContext:
    """Who is calling, with what rights, under which correlation ids.

    ``deadline`` is a point on the ``time.monotonic()`` clock after which the
    call must not run (use :meth:`with_timeout`). ``secrets`` resolves the
    names in a tool's ``secret_refs``; values are never stored in results or
    logs. ``attributes`` carries caller-defined data for plugins (for example
    an approval token).

    The host gives every call its own copy with ``call_id`` set and an empty
    ``trail``; plugins append to the trail with :meth:`record`.
    """

    principal: str = "anonymous"
    role: str | None = None
    environment: str | None = None
    scopes: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen_scopes)
    secrets: SecretResolver | None = attrs.field(default=None, repr=False)
    idempotency_key: str | None = None
    deadline: float | None = None
    call_id: str | None = None
    trace_id: str | None = None
    session_id: str | None = None
    attributes: Mapping[str, Any] = attrs.field(factory=dict)
    trail: list[Decision] = attrs.field(factory=list, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        """Refuse a field of the wrong kind with ``TypeError`` (``ValueError`` for a NaN deadline, a
        ``ContextFieldError`` for an identifier ``identifier_problem`` refuses) naming it. Found by
        attack: ``deadline="soon"`` failed every call as the host's internal error, ``deadline=nan``
        ran calls with no deadline, and ``principal=5`` or ``attributes=5`` were taken as they were;
        so was a ``session_id`` holding a token, which reached ``tool_event`` observers whole and the
        audit record redacted (``identifier_problem``)."""
        problem = context_problem(self)
        if problem is not None:
            raise problem

    def with_timeout(self, seconds: float) -> ToolContext:
        """A copy whose deadline is ``seconds`` from now."""
        return attrs.evolve(self, deadline=time.monotonic() + seconds)

    def remaining(self) -> float | None:
        """Seconds left before the deadline (negative when past), or ``None``."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def secret(self, name: str) -> str:
        """Resolve a secret reference, or raise ``AuthError`` naming it."""
        resolver = self.secrets
        value: str | None
        if resolver is None:
            value = None
        elif isinstance(resolver, Mapping):
            value = resolver.get(name)
        else:
            value = resolver(name)
        if value is None:
            from .secrets_table import why_missing

            reason, hint = why_missing(resolver, name)
            raise AuthError(f"secret {name!r} {reason}", code="missing_secret", secret=name, hint=hint)
        return value

    def record(
        self,
        plugin: str,
        hook: str,
        action: str,
        reason: str | None = None,
        *,
        code: str | None = None,
        **details: Any,
    ) -> None:
        """Append a decision to this call's trail (it reaches the result and the audit log)."""
        self.trail.append(Decision(plugin, hook, action, reason, code, details))

    def for_call(self, call_id: str) -> ToolContext:
        """A copy for one call: ``call_id`` set, a fresh trail. Used by the host."""
        if type(self) is not ToolContext:  # a subclass may keep fields elsewhere (slots) or hold more
            return ToolContext(
                self.principal, self.role, self.environment, self.scopes, self.secrets, self.idempotency_key,
                self.deadline, call_id, self.trace_id, self.session_id, self.attributes, [],
            )
        copy = _new_context(ToolContext)
        if _FAST_FIELDS:
            # On CPython 3.11 and 3.12 the caller's dict is copied whole and given to the copy
            # (session 32): ``dict.copy`` of attrs' split dict copies its values and keeps the keys
            # shared, where updating the copy's own dict inserted the fields one by one (≈ 2 k
            # instructions a call more), and the copy's fields are read as fast either way. On
            # 3.13 a dict given whole is read slower than the inline values it replaces (≈ 0.3 k
            # instructions a read more), and on 3.10 it gains nothing: those update in place.
            fields = self.__dict__.copy()
            fields["call_id"] = call_id
            fields["trail"] = []
            _set_context_dict(copy, fields)
            return copy
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["call_id"] = call_id
        fields["trail"] = []
        return copy


_set_context_dict: Final = _dict_setter(ToolContext)


@attrs.frozen(slots=True)
class Deny:
    """What a ``tool_pre`` hook returns to veto a call.

    ``category`` is the error category the caller sees: ``PolicyError`` (the
    default), ``AuthError`` (e.g. a missing scope) or ``ContractError`` (e.g. a
    missing idempotency key). ``details`` are more fields of the error and of
    the trail's ``deny`` entry; keys that are no string, and the fields the host
    sets itself (``plugin``, ``hook``, ``action``, ``reason``, ``code``,
    ``message``; a ``retryable`` that is no bool), are left out, as are
    ``details`` that are no dict.
    """

    reason: str
    code: str = "denied"
    details: dict[str, Any] = attrs.field(factory=dict)
    category: str = attrs.field(
        default="PolicyError", validator=attrs.validators.in_(("PolicyError", "AuthError", "ContractError"))
    )


@attrs.frozen(slots=True)
class Modify:
    """What a ``tool_pre`` hook returns to replace the call's arguments."""

    arguments: dict[str, Any]
    reason: str | None = None


# -- construction of a call and a result on CPython 3.11 and 3.12 --------------------------------

_FRESH: Final = attrs.NOTHING  # an argument not given: the field's factory makes a fresh dict


def _result_fields(self: ToolResult, success: bool = True, output: Any = None, error: dict[str, Any] | None = None,
                   metadata: Any = _FRESH, tool_call_id: str | None = None) -> None:
    """``ToolResult.__init__`` on CPython 3.11 and 3.12 (``_FAST_FIELDS``): attrs' own, field for field."""
    _set_result_dict(self, {"success": success, "output": output, "error": error,
                            "metadata": {} if metadata is _FRESH else metadata, "tool_call_id": tool_call_id})


def _call_fields(self: ToolCall, id: str, name: str, arguments: Any = _FRESH) -> None:
    """``ToolCall.__init__`` on CPython 3.11 and 3.12 (``_FAST_FIELDS``): attrs' own, field for field."""
    _set_call_dict(self, {"id": id, "name": name, "arguments": {} if arguments is _FRESH else arguments})


#: Whether ``ToolResult`` and ``ToolCall`` are built with an instance dict of their own. attrs' frozen
#: ``__init__`` writes the fields into ``self.__dict__``, which CPython 3.11 and 3.12 make from the
#: object's inline values as a *split* dict; no read of a field from such a dict is specialized
#: (``LOAD_ATTR_WITH_HINT`` needs a dict of its own), so each costs ≈ 0.1 µs instead of ≈ 0.04, and
#: a call reads them dozens of times (the host, every plugin, the audit record). A dict given whole
#: is read at full speed, and is no slower to build. CPython 3.13 reads inline values through a
#: materialized dict at full speed and builds attrs' way faster, and 3.10 reads both alike: there
#: attrs' ``__init__`` stays. Same signature, defaults and fields either way (a test compares them).
_FAST_FIELDS: Final = (3, 11) <= sys.version_info < (3, 13)
if _FAST_FIELDS:
    _result_fields.__qualname__, _call_fields.__qualname__ = "ToolResult.__init__", "ToolCall.__init__"
    setattr(ToolResult, "__init__", _result_fields)  # noqa: B010 - mypy would refuse a method assigned
    setattr(ToolCall, "__init__", _call_fields)  # noqa: B010
