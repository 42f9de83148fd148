"""The common call record's bytes, spliced from encoded pieces (issue #16).

A call record is the key-sorted JSON of a dict whose keys are fixed (``_assemble`` in the
package), so where each member goes is known in advance. Most members do not change from one
call of a tool to the next for one caller: the tool's name, version, definition hash and effect,
and the context's principal, role, environment, scopes and session. ``Segments`` holds those
encoded once per tool and caller, searched once; a call encodes only its own values (arguments,
output, call id, trace id, trail, error, time, duration) and puts the pieces in order.

The bytes are those of ``encode_record(build_record(...))`` whenever ``spliced_body`` answers:
JSON encoding is compositional (a value nested in a record is spelled as it is alone) as long as
every piece is spelled by one encoder, so a piece the preferred encoder refuses (an integer
beyond 64 bits for orjson) sends the record down the reference path, which encodes it whole.
``tests/test_audit_record_fastpath.py`` checks the equality on generated calls.

Redaction is decided as the reference path's pre-scan decides it: every string that a caller,
a tool or a plugin put in the record is searched, as encoded, for the forms of the host's secrets
and, when patterns are on, for the credential patterns' trigger words; a hit anywhere answers
``None`` and the caller takes ``build_record``, which redacts (the session id and ``attempts``
included: a caller builds its own context, and a tool's result metadata may say anything under
``attempts`` when the host did not retry). The host's own members (time, duration, status,
size, output hash, kind, version) are not searched: they hold digits, hex and fixed words from
which no trigger can be made, and the reference path does not redact them either.

What it does not cover: records with redaction rules or rich content, and values JSON cannot say
as they are (NaN, infinities, lone surrogates, huge integers, non-string keys): ``record_body``
sends those to the reference path.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Final

from ..._json import piece_encoder, same_json
from ...models import ToolCall, ToolContext, ToolResult
from ...redaction import SecretMatcher, SecretSet, may_hold_pattern
from ...spec import ToolSpec
from .chain import SCHEMA_VERSION, definition_of

#: Segments kept per process, one per (tool, caller); the cache is emptied when it grows past this.
MAX_SEGMENTS: Final = 1024
#: Members longer than this (in all, as encoded) are encoded per call, never kept.
MAX_CACHED_CHARS: Final = 2048


class Segments:
    """One tool's and one caller's members, encoded in the three runs they sort into (the record's
    keys in order: ``arguments attempts call_id [definition] duration_ms | effect environment |
    error kind original_arguments [output] output_bytes output_sha256 | principal role scopes
    session_id | status | tool tool_version | trace_id trail ts v``), and what a search of them
    found: the credential patterns' triggers once, the secrets once per matcher. ``before_duration``,
    ``before_error``, ``after_ok`` and ``after_error`` are the runs with the host's own keys around
    them, as a record splices them (fewer pieces to join)."""

    __slots__ = ("_secrets", "after_error", "after_ok", "before_duration", "before_error", "definition", "effect",
                 "pattern_hit", "plain", "spec", "text", "tool", "who")

    def __init__(self, spec: ToolSpec | None, name: Any, context: ToolContext, encode: Any,
                 plain: bool = False) -> None:
        self.spec = spec
        #: The name and the caller's members are strings or None (``_segments_for``'s check for
        #: keeping them): no NaN can be among them. False says nothing (they are walked per call).
        self.plain = plain
        definition = definition_of(spec)
        self.definition = b',"definition":' + encode([definition])[1:-1] if definition is not None else b""
        self.effect = b',"effect":%s,"environment":%s' % (
            _member(encode, spec.effect.value if spec is not None else None), _member(encode, context.environment))
        self.who = b',"principal":%s,"role":%s,"scopes":%s,"session_id":%s' % (
            _member(encode, context.principal), _member(encode, context.role),
            encode([sorted(context.scopes)])[1:-1], _member(encode, context.session_id))
        self.tool = b',"tool":%s,"tool_version":%s' % (
            _member(encode, name), _member(encode, spec.version if spec is not None else None))
        self.text = b"\n".join((self.definition, self.effect, self.who, self.tool)).decode("utf-8")
        self.before_duration = self.definition + b',"duration_ms":'
        self.before_error = self.effect + b',"error":'
        self.after_ok = b'%s,"status":"ok"%s,"trace_id":' % (self.who, self.tool)
        self.after_error = b'%s,"status":"error"%s,"trace_id":' % (self.who, self.tool)
        self.pattern_hit = may_hold_pattern(self.text)
        #: The last matcher searched for and its verdict, replaced together (one reference).
        self._secrets: tuple[SecretMatcher | None, bool] = (None, False)

    def secret_in(self, matcher: SecretMatcher) -> bool:
        """Whether a form of a secret may be among these members (searched again when the secrets change)."""
        searched, hit = self._secrets
        if searched is not matcher:
            hit = (matcher.walk_on_escape and "\\" in self.text) or matcher.found_in(self.text)
            self._secrets = (matcher, hit)
        return hit


_segments: dict[tuple[Any, ...], Segments] = {}

#: Values that hold nothing nested: encoded as they are.
_SCALARS: Final = (str, int, float, bool, type(None))


def _member(encode: Any, value: Any) -> bytes:
    """``value`` encoded as a member of the record: one level down when it is a container (see
    ``spliced_body``)."""
    return encode(value) if value.__class__ in _SCALARS else encode([value])[1:-1]  # type: ignore[no-any-return]


#: What ``_segments_for`` kept last, and the objects it was kept for: ``((principal, spec, name,
#: role, environment, scopes, session, encode), segments)``, replaced whole (one reference). At
#: first, objects no call hands over.
_last: tuple[tuple[Any, ...], Segments | None] = ((object(),) * 8, None)


def _segments_for(spec: ToolSpec | None, name: Any, context: ToolContext, encode: Any) -> Segments:
    """The members of ``spec`` called as ``name`` by ``context``'s caller: kept for the next call
    when they are a mounted tool's (an unknown tool's name is the caller's to choose), the name,
    principal and scopes are exactly ``str`` and the rest ``str`` or None (a key compares with
    ``==``: ``1``, ``True`` and a ``str`` subclass with its own ``__eq__`` must never find another
    caller's members), and they are short.

    The members kept last are found by identity first: every call of a tool by one caller hands
    over the same objects (a call's context is a copy of its caller's), and an object kept is
    immutable (``str``, None, a ``frozenset`` of ``str``: checked before it was kept), so the same
    objects are the same members. No ``==`` is asked of them, no key made."""
    global _last
    principal, role, environment, scopes, session = (context.principal, context.role, context.environment,
                                                     context.scopes, context.session_id)
    # Unpacked and compared one by one: 3.2 k instructions against 5.8 k for ``all(map(is_, ...))``.
    (kept_principal, kept_spec, kept_name, kept_role, kept_environment, kept_scopes, kept_session,
     kept_encode), found = _last
    if kept_principal is principal and kept_spec is spec and kept_name is name and kept_role is role \
            and kept_environment is environment and kept_scopes is scopes and kept_session is session \
            and kept_encode is encode:
        return found  # type: ignore[return-value]
    if spec is None or name.__class__ is not str or principal.__class__ is not str \
            or not (role is None or role.__class__ is str) \
            or not (environment is None or environment.__class__ is str) \
            or not (session is None or session.__class__ is str) or any(s.__class__ is not str for s in scopes):
        return Segments(spec, name, context, encode)
    key = (id(spec), name, principal, role, environment, scopes, session)
    found = _segments.get(key)
    if found is None or found.spec is not spec:  # a new pair, or another spec at a reused id
        found = Segments(spec, name, context, encode, plain=True)
        if len(found.text) > MAX_CACHED_CHARS:
            return found
        if len(_segments) >= MAX_SEGMENTS:
            _segments.clear()
        _segments[key] = found
    if scopes.__class__ is frozenset:  # a set or list may change and stay the same object
        _last = ((principal, spec, name, role, environment, scopes, session, encode), found)
    return found


#: The record's last member; ``ts`` (the host's own ISO 8601 text) needs no escaping before it.
_TAIL: Final = b'","v":%d}' % SCHEMA_VERSION


def has_nonfinite(value: Any) -> bool:
    """Whether ``value`` holds NaN or an infinity (a float, or one inside dicts, lists, tuples).
    For the small members neither encoder's text tells apart (``null`` is common in them)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_nonfinite(item) for item in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(has_nonfinite(item) for item in value)
    return False


def may_hold_nonfinite(encoded: bytes) -> bool:
    """Whether encoded JSON may stand for NaN or an infinity (orjson writes ``null``, json ``NaN``).

    ``find``, not ``in``: CPython's ``bytes.__contains__`` first tries its argument as an integer,
    which for ``bytes`` raises and clears a formatted ``TypeError`` each time (three per check)."""
    return encoded.find(b"null") >= 0 or encoded.find(b"NaN") >= 0 or encoded.find(b"Infinity") >= 0


#: ``may_hold_nonfinite`` as one search, for short text: one C call where three ``find`` per piece
#: cost more (248 against 877 ns for a call's arguments and output, timed apart); for long text the
#: ``find``s are faster (21 against 53 µs for 14 KB), so from ``_SHORT`` bytes on they are used.
_NONFINITE: Final = re.compile(rb"null|NaN|Infinity").search
_SHORT: Final = 256


def spliced_body(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext,
                 original: Any, record_output: bool, patterns: bool, secrets: SecretSet, ts: str) -> bytes | None:
    """The record's bytes, or None when the reference path must build it: something to redact
    may be in it, or a value is not plain JSON as it is. Never raises."""
    encode = piece_encoder()
    try:
        # Containers are encoded one level down, as they lie in the record: an encoder's nesting
        # limit must refuse a piece exactly when it would refuse the whole record.
        arguments = encode([call.arguments])[1:-1]
        output = result.output
        output_bytes = b"" if output is None else encode(output) if output.__class__ is str else \
            encode([output])[1:-1]
        segments = _segments_for(spec, call.name, context, encode)
        try:
            changed = original is not call.arguments and not same_json(original, call.arguments)
        except RecursionError:
            changed = True
        original_bytes = encode([original])[1:-1] if changed else b"null"
        metadata = result.metadata
        trail = metadata.get("trail", [])
        trail_bytes = b"[]" if trail.__class__ is list and not trail else encode([trail])[1:-1]
        error = result.error
        error_bytes = encode([{"type": error.get("type"), "code": error.get("code"), "message": error.get("message"),
                               "plugin": error.get("plugin")}])[1:-1] if error else b"null"
        call_id = encode(call.id) if call.id.__class__ is str else _member(encode, call.id)
        trace_id = b"null" if context.trace_id is None else _member(encode, context.trace_id)
        attempts = metadata.get("attempts", 1)
        attempts_bytes = b"1" if attempts == 1 and attempts.__class__ is int else _member(encode, attempts)
        duration = encode(round(float(metadata.get("duration_ms", 0.0)), 3))
        # NaN in a member neither encoder's text tells apart (``null`` is common in them) goes to the
        # reference path, which writes it as a string and notes it in ``altered``. The common call's
        # members (an int, no trail, no error, strings) hold none: walked only when one is not that.
        if (trail or error or attempts.__class__ is not int or call.id.__class__ is not str
                or not (context.trace_id is None or context.trace_id.__class__ is str) or not segments.plain) \
                and has_nonfinite((attempts, trail, error, call.id, context.trace_id, context.principal,
                                   context.role, context.environment, context.scopes, context.session_id)):
            return None
        # Every caller-, tool- or plugin-given string, as encoded (the constant members were searched
        # once), the arguments and the output first: where NaN is looked for, in one search of both
        # (no token spans the newline).
        given = b"\n".join((arguments, output_bytes, original_bytes, trail_bytes, error_bytes, call_id, trace_id,
                            attempts_bytes))
        head = len(arguments) + 1 + len(output_bytes)
        if _NONFINITE(given, 0, head) if head < _SHORT else \
                (may_hold_nonfinite(arguments) or may_hold_nonfinite(output_bytes)):
            return None
    except Exception:  # not encodable as it is by this encoder: the reference path escapes it
        return None
    matcher = secrets.matcher
    if matcher is not None or patterns:
        text = given.decode("utf-8")
        if patterns and (segments.pattern_hit or may_hold_pattern(text)):
            return None
        if matcher is not None and (segments.secret_in(matcher) or (matcher.walk_on_escape and "\\" in text)
                                    or matcher.found_in(text)):
            return None
    # Size and digest formatted as text (``bytes %`` formats ``%d`` through snprintf: 2.5 k instructions).
    sized = f',"output_bytes":{len(output_bytes)},"output_sha256":"{hashlib.sha256(output_bytes).hexdigest()}"' \
        if output_bytes else ',"output_bytes":0,"output_sha256":null'
    return b"".join((
        b'{"arguments":', arguments, b',"attempts":', attempts_bytes, b',"call_id":', call_id,
        segments.before_duration, duration, segments.before_error, error_bytes, b',"kind":"call","original_arguments":',
        original_bytes, b',"output":' + (output_bytes or b"null") if record_output else b"", sized.encode(),
        segments.after_ok if result.success else segments.after_error, trace_id, b',"trail":', trail_bytes,
        b',"ts":"', ts.encode(), _TAIL))
