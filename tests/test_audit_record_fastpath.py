"""``audit.record_body`` (issue #16: the common record encoded once, pre-scanned as encoded) gives the
bytes of ``encode_record(build_record(...))`` for every call: secrets and credential shapes anywhere
(arguments, output recorded or only hashed, error, principal, tool name), values JSON cannot say,
redaction rules, changed arguments, either setting."""

from __future__ import annotations

import math
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import ToolContext, ToolResult, ToolSpec, _json
from amplifier_tools.builtins import audit
from amplifier_tools.builtins.audit.settings import AuditSettings
from amplifier_tools.models import ToolCall
from amplifier_tools.redaction import SecretSet

SECRET = "hunter2-secret-value"
WORDS = st.sampled_from(["ok", "README.md", SECRET, f"x{SECRET}y", "Bearer abcdefgh12345678", "sk-" + "a" * 20,
                         "https://u:pw@host", "gh", "\\", "é", "\u2028", "null", "a\x00b", "68756e746572"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**70, max_value=2**80),
                   st.floats(), st.just(math.nan), WORDS, st.text(max_size=6))
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(WORDS, st.text(max_size=4)), inner, max_size=3),
    st.dictionaries(st.integers(), inner, max_size=2)), max_leaves=10)
SPECS = [ToolSpec(name="third::tool", version="1.0.0", description="d", effect="Pure", input_schema={"type": "object"}),
         ToolSpec(name="third::tool", version="1.0.0", description="d", effect="Pure", input_schema={"type": "object"},
                  security={"redaction_rules": ["arguments/token"]}),
         ToolSpec(name="mcp::gh_tool", version="2.0.0", description="d", effect="ExternalSideEffects",
                  input_schema={"type": "object"}, tags=["sha256:" + "a" * 64, "mcp-server-version:1.2"])]


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "timestamp", lambda: "2026-11-24T11:00:00.000000+00:00")


OPTIONAL_WORDS = st.one_of(st.none(), WORDS)


def _unchecked_context(**fields: Any) -> ToolContext:
    """A context holding identifiers its constructor refuses (``models.identifier_problem``), set around
    it: the record must still be written and redacted alike (a context changed with
    ``object.__setattr__``, a secret registered after the call began)."""
    context = ToolContext()
    for name, value in fields.items():
        object.__setattr__(context, name, value)
    return context


@settings(max_examples=800, deadline=None)
@given(arguments=st.dictionaries(st.one_of(WORDS, st.text(max_size=4)), VALUES, max_size=4),
       original=st.one_of(st.none(), st.dictionaries(WORDS, VALUES, max_size=2)),
       output=VALUES, failed=st.booleans(), message=WORDS, spec=st.sampled_from([*SPECS, None]),
       name=st.one_of(st.none(), WORDS), principal=WORDS, role=OPTIONAL_WORDS, environment=OPTIONAL_WORDS,
       scopes=st.frozensets(WORDS, max_size=3), trace_id=OPTIONAL_WORDS, call_id=WORDS,
       attempts=st.one_of(st.none(), st.integers(1, 5), WORDS, st.floats()),
       duration=st.one_of(st.none(), st.floats(0, 1e20)), session=OPTIONAL_WORDS,
       record_output=st.booleans(), patterns=st.booleans(), secret=st.booleans(), stdlib=st.booleans(),
       trail=st.lists(st.dictionaries(WORDS, st.one_of(WORDS, st.floats()), max_size=2), max_size=2))
@pytest.mark.slow
def test_the_fast_record_is_the_reference_record(
        arguments: dict[str, Any], original: Any, output: Any, failed: bool, message: str, spec: ToolSpec | None,
        name: str | None, principal: str, role: str | None, environment: str | None, scopes: frozenset[str],
        trace_id: str | None, call_id: str, attempts: Any, duration: float | None, session: str | None,
        record_output: bool, patterns: bool, secret: bool, stdlib: bool, trail: list[Any]) -> None:
    """Every member the splice takes from the tool, the caller or the call, with either encoder."""
    tool = name if name is not None or spec is None else spec.name
    call = ToolCall(call_id, tool or "unknown", arguments)
    error = {"type": "ExecutionError", "code": "x", "message": message, "plugin": None} if failed else None
    metadata: dict[str, Any] = {"trail": trail}
    if attempts is not None:
        metadata["attempts"] = attempts
    if duration is not None:
        metadata["duration_ms"] = duration
    result = ToolResult(not failed, output, error, metadata, call_id)
    context = _unchecked_context(principal=principal, role=role, environment=environment, scopes=scopes,
                                 trace_id=trace_id, session_id=session)
    settings_ = AuditSettings(record_output=record_output, redact_patterns=patterns)
    original = arguments if original is None else original
    with mock.patch.object(_json, "orjson", None if stdlib else _json._fast()):
        expected = audit.encode_record(audit.build_record(call, spec, result, context, original, settings_,
                                                          SecretSet([SECRET] if secret else [])))
        got = audit.record_body(call, spec, result, context, original, settings_,
                                SecretSet([SECRET] if secret else []))
    assert got == expected


def test_a_secret_registered_later_is_found_in_the_members_encoded_before() -> None:
    """The tool's and caller's members are encoded and searched once; a secret that joins the
    registry afterwards is searched for in them again (a principal that turns out to hold it)."""
    spec, settings_ = SPECS[0], AuditSettings(redact_patterns=False)
    call = ToolCall("call_1", spec.name, {"path": "README.md"})
    context = ToolContext(principal=f"agent-{SECRET}", session_id="session_1")
    result = ToolResult(True, "ok", None, {"trail": []}, "call_1")
    secrets = SecretSet()
    assert SECRET.encode() in audit.record_body(call, spec, result, context, call.arguments, settings_, secrets)
    secrets.add(SECRET)
    body = audit.record_body(call, spec, result, context, call.arguments, settings_, secrets)
    assert SECRET.encode() not in body
    assert body == audit.encode_record(audit.build_record(call, spec, result, context, call.arguments, settings_,
                                                          secrets))


def test_a_plain_call_is_encoded_once_and_a_secret_in_the_hashed_output_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the common case; an output that is only hashed is searched too (its hash is
    of the redacted output)."""
    slow: list[bool] = []
    real = audit.build_record
    monkeypatch.setattr(audit, "build_record", lambda *a: slow.append(True) or real(*a))
    spec, secrets = SPECS[0], SecretSet([SECRET])
    call = ToolCall("call_1", spec.name, {"path": "README.md", "limit": 10})
    context, settings_ = ToolContext(session_id="session_1"), AuditSettings()
    plain = ToolResult(True, "ok", None, {"trail": [], "duration_ms": 1.0}, "call_1")
    assert audit.record_body(call, spec, plain, context, call.arguments, settings_, secrets) == \
        audit.encode_record(real(call, spec, plain, context, call.arguments, settings_, secrets))
    assert slow == []
    leaky = ToolResult(True, f"the key is {SECRET}", None, {"trail": []}, "call_1")
    body = audit.record_body(call, spec, leaky, context, call.arguments, settings_, secrets)
    assert slow == [True] and SECRET.encode() not in body
    assert body == audit.encode_record(real(call, spec, leaky, context, call.arguments, settings_, secrets))


def _both(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext,
          secrets: SecretSet | None = None) -> tuple[bytes, bytes]:
    settings_ = AuditSettings(record_output=True)
    secrets = secrets if secrets is not None else SecretSet()
    return (audit.record_body(call, spec, result, context, call.arguments, settings_, secrets),
            audit.encode_record(audit.build_record(call, spec, result, context, call.arguments, settings_, secrets)))


class Sly(str):
    """A principal equal to every string, hashed as a known one: it must never find another
    caller's members (found by attack)."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("agent-1")


def test_callers_whose_members_only_compare_equal_never_share_encoded_members() -> None:
    """Found by attack: the cache of a tool's and caller's members was keyed with ``==``, so a
    caller with principal ``True`` got ``1`` written, and a ``str`` subclass equal to everything
    reused another caller's clean verdict and had a credential spliced in unredacted."""
    spec, result = SPECS[0], ToolResult(True, "ok", None, {"trail": []}, "c")
    call = ToolCall("c", spec.name, {"a": 1})
    for principal in (1, True, 1.0, "agent-1", Sly("Bearer abcdefgh12345678")):
        # ToolContext refuses a principal that is no str; one set around its constructor (as a
        # plugin could with object.__setattr__) must still be recorded as it is.
        context = ToolContext(session_id="s")
        object.__setattr__(context, "principal", principal)
        got, expected = _both(call, spec, result, context)
        assert got == expected, principal
    assert b"abcdefgh12345678" not in got


def test_an_unknown_tools_name_and_long_members_are_not_kept() -> None:
    """Found by attack: an unknown tool's name is the caller's to choose, and each was kept (1,023
    names of 1 MB held 3 GB). Members of an unknown tool, or longer than MAX_CACHED_CHARS, are
    encoded per call and never kept."""
    from amplifier_tools.builtins.audit import spliced

    spliced._segments.clear()
    result = ToolResult(False, None, {"type": "ContractError", "code": "unknown_tool", "message": "m"}, {"trail": []})
    for i in range(5):
        call = ToolCall("c", f"{'x' * 100_000}{i}", {})
        got, expected = _both(call, None, result, ToolContext(session_id="s"))
        assert got == expected
    long_principal = _unchecked_context(principal="p" * (spliced.MAX_CACHED_CHARS + 1), session_id="s")
    call = ToolCall("c", SPECS[0].name, {})
    assert _both(call, SPECS[0], result, long_principal)[0] == _both(call, SPECS[0], result, long_principal)[1]
    assert spliced._segments == {}


@pytest.mark.parametrize("depth", [250, 252, 253, 254, 300])
def test_arguments_nested_at_the_encoders_limit_are_written_as_the_reference_writes_them(depth: int) -> None:
    """Found by attack: at exactly 253 levels a piece encoded alone fitted orjson's limit while the
    whole record did not, so the splice wrote what the reference summarized."""
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested]
    call = ToolCall("c", SPECS[0].name, {"deep": nested})
    got, expected = _both(call, SPECS[0], ToolResult(True, nested, None, {"trail": []}), ToolContext(session_id="s"))
    assert got == expected


def test_a_trail_of_none_is_written_as_null_as_the_reference_does() -> None:
    """Found by attack: ``metadata["trail"] = None`` (a plugin's replacement result) was written as ``[]``."""
    call = ToolCall("c", SPECS[0].name, {})
    got, expected = _both(call, SPECS[0], ToolResult(True, "ok", None, {"trail": None}), ToolContext(session_id="s"))
    assert got == expected and b'"trail":null' in got


@pytest.mark.parametrize("spliced", [True, False])
def test_a_secret_in_the_callers_session_id_or_the_tools_attempts_is_redacted(spliced: bool) -> None:
    """Found by a review: the reference record wrote ``session_id`` (a caller-built context's) and
    ``attempts`` (a tool's result metadata, when the host did not retry) as they were, so a secret
    or a credential there reached the log, whichever path built the record (the splice hands any
    record with a hit to the reference path)."""
    secrets = SecretSet([SECRET])
    spec = SPECS[0]
    context = ToolContext(principal="p", session_id=f"session-{SECRET}")
    result = ToolResult(True, "ok", None, {"attempts": "Bearer abcdefgh12345678", "duration_ms": 1.0}, "c1")
    call = ToolCall("c1", spec.name, {"path": "README.md"})
    settings_ = AuditSettings(redact_patterns=True)
    if spliced:
        body = audit.record_body(call, spec, result, context, call.arguments, settings_, secrets)
    else:
        body = _json.dumps(audit.build_record(call, spec, result, context, call.arguments, settings_, secrets))
    text = body.decode()
    assert SECRET not in text and "abcdefgh12345678" not in text
    assert '"session_id":"session-[REDACTED]"' in text
    assert '"attempts":"Bearer [REDACTED]"' in text or '"attempts":"[REDACTED]"' in text


# The bytes HEAD wrote before the splice's members were found by identity and joined in fewer
# pieces (issue #16, session 40): a record of the default host's common call, and one with a
# definition, an error, a trail, retries and a caller's every member.
GOLDEN = [
    (0, b'{"arguments":{"limit":10,"path":"README.md"},"attempts":1,"call_id":"call_1","duration_ms":0.071,'
        b'"effect":"ExternalSideEffects","environment":null,"error":null,"kind":"call","original_arguments":null,'
        b'"output":"ok","output_bytes":4,'
        b'"output_sha256":"c48b5b1a9776c84602de2306d7903a7241158a5077e7a8519af75c33441b8334",'
        b'"principal":"anonymous","role":null,"scopes":[],"session_id":"session_1","status":"ok","tool":"noop",'
        b'"tool_version":"0.0.0","trace_id":null,"trail":[],"ts":"2026-11-24T11:00:00.000000+00:00","v":1}'),
    (1, b'{"arguments":{"q":"\xc3\xa9\xe2\x80\xa8\\"x\\\\"},"attempts":3,"call_id":"call_2","definition":'
        b'{"server_version":"1.2","sha256":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},'
        b'"duration_ms":12.346,"effect":"ExternalSideEffects","environment":"prod","error":{"code":"boom",'
        b'"message":"it failed","plugin":null,"type":"ExecutionError"},"kind":"call","original_arguments":null,'
        b'"output_bytes":0,"output_sha256":null,"principal":"agent-1","role":"dev","scopes":["fs:read","fs:write"],'
        b'"session_id":"s2","status":"error","tool":"mcp::gh_tool","tool_version":"2.0.0",'
        b'"trace_id":"tttttttttttttttttttttttttttttttt","trail":[{"action":"allow","plugin":"p"}],'
        b'"ts":"2026-11-24T11:00:00.000000+00:00","v":1}'),
]


@pytest.mark.parametrize("stdlib", [False, True])
@pytest.mark.parametrize("case, expected", GOLDEN)
def test_the_spliced_record_is_byte_for_byte_the_one_written_before(case: int, expected: bytes,
                                                                      stdlib: bool) -> None:
    """The common record's bytes are pinned: the splice (and the reference path it is compared with)
    write what HEAD wrote before the fast path was changed, with either encoder, twice in a row (the
    second call finds the tool's and caller's members kept)."""
    noop = ToolSpec(name="noop", version="0.0.0", description="d", effect="ExternalSideEffects",
                    input_schema={"type": "object"})
    if case == 0:
        spec, call = noop, ToolCall("call_1", "noop", {"path": "README.md", "limit": 10})
        result = ToolResult(True, "ok", None, {"trail": [], "duration_ms": 0.0714999}, "call_1")
        context, settings_ = ToolContext(session_id="session_1"), AuditSettings(record_output=True)
    else:
        spec, call = SPECS[2], ToolCall("call_2", "mcp::gh_tool", {"q": "é\u2028\"x\\"})
        result = ToolResult(False, None, {"type": "ExecutionError", "code": "boom", "message": "it failed",
                                          "plugin": None},
                            {"trail": [{"plugin": "p", "action": "allow"}], "attempts": 3, "duration_ms": 12.3456},
                            "call_2")
        context = ToolContext(principal="agent-1", role="dev", environment="prod", scopes={"fs:read", "fs:write"},
                              session_id="s2", trace_id="t" * 32)
        settings_ = AuditSettings(record_output=False)
    with mock.patch.object(_json, "orjson", None if stdlib else _json._fast()):
        for copy in (context.for_call("call_x"), context.for_call("call_y")):
            assert audit.record_body(call, spec, result, copy, call.arguments, settings_, SecretSet()) == expected
        assert audit.encode_record(audit.build_record(call, spec, result, context, call.arguments, settings_,
                                                      SecretSet())) == expected


def _callers() -> list[ToolContext]:
    """Callers whose members are the same objects, equal but other objects, no ``str`` at all, a
    ``str`` equal to everything, a secret or a credential, or scopes that change in place."""
    base = ToolContext(principal="agent-1", role="dev", scopes={"fs:read"}, session_id="session_1")
    twin = ToolContext(principal="".join(["agent-", "1"]), role="".join(["de", "v"]),
                       scopes={"".join(["fs:", "read"])}, session_id="".join(["session_", "1"]))
    return [base, base.for_call("a"), base.for_call("b"), twin, ToolContext(session_id="session_1"),
            _unchecked_context(principal=Sly("Bearer abcdefgh12345678"), role="dev", scopes=frozenset({"fs:read"}),
                               session_id="session_1"),
            _unchecked_context(principal=1, session_id="session_1"),
            _unchecked_context(principal=f"agent-{SECRET}", session_id="session_1"),
            _unchecked_context(principal="agent-1", scopes={"fs:read"}, session_id="session_1"),  # a mutable set
            _unchecked_context(principal="agent-1", scopes=["sk-" + "a" * 20], session_id="session_1")]


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 9), st.sampled_from([*SPECS, None]), st.booleans(),
                                st.dictionaries(WORDS, VALUES, max_size=2), VALUES, st.booleans(), st.booleans(),
                                st.booleans()), min_size=1, max_size=12),
       patterns=st.booleans(), stdlib=st.booleans())
@pytest.mark.slow
def test_a_sequence_of_calls_is_recorded_as_the_reference_records_each(steps: list[Any], patterns: bool,
                                                                        stdlib: bool) -> None:
    """The members kept from one call are found again by identity: over sequences of calls by callers
    sharing objects or only equal ones (a ``str`` subclass equal to everything among them), tools
    alike or not, scopes changed in place, secrets registered midway, every record is the reference's."""
    callers, secrets = _callers(), SecretSet()
    settings_ = AuditSettings(record_output=True, redact_patterns=patterns)
    with mock.patch.object(_json, "orjson", None if stdlib else _json._fast()):
        for caller, spec, other_name, arguments, output, failed, register, mutate in steps:
            if register:
                secrets.add(SECRET)
            context = callers[caller]
            if mutate and isinstance(context.scopes, set):
                context.scopes.add("sk-" + "b" * 20)
            name = ("other" if other_name else spec.name) if spec is not None else "unknown"
            call = ToolCall("call_1", name, arguments)
            error = {"type": "ExecutionError", "code": "x", "message": "m", "plugin": None} if failed else None
            result = ToolResult(not failed, output, error, {"trail": [], "duration_ms": 1.5}, "call_1")
            expected = audit.encode_record(audit.build_record(call, spec, result, context, arguments, settings_,
                                                              secrets))
            assert audit.record_body(call, spec, result, context, arguments, settings_, secrets) == expected


#: The module's own ``timestamp`` (the autouse fixture replaces it during each test).
REAL_TIMESTAMP = audit.timestamp


@settings(max_examples=500, deadline=None)
@given(stamps=st.lists(st.integers(0, 4_102_444_800_000_000_000), min_size=1, max_size=8),
       nudge=st.lists(st.integers(-2_000_000_000, 2_000_000_000), max_size=8))
def test_the_timestamp_is_isoformats_in_any_order_of_seconds(stamps: list[int], nudge: list[int]) -> None:
    """The cached date and time of one second, with the microseconds written after it, are
    ``datetime.isoformat``'s for any time, in any order (the same second again, the next, an earlier)."""
    import datetime as dt

    times = [*stamps, *(stamps[0] + n for n in nudge if stamps[0] + n >= 0)]
    for ns in times:
        with mock.patch.object(audit.time, "time_ns", lambda ns=ns: ns):
            expected = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=ns // 1000)
            assert REAL_TIMESTAMP() == expected.isoformat(timespec="microseconds")
