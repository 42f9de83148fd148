"""``audit.record_body`` (issue #16: the common record encoded once, pre-scanned as encoded) gives the
bytes of ``encode_record(build_record(...))`` for every call: secrets and credential shapes anywhere
(arguments, output recorded or only hashed, error, principal, tool name), values JSON cannot say,
redaction rules, changed arguments, either setting."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import ToolContext, ToolResult, ToolSpec
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


@settings(max_examples=600, deadline=None)
@given(arguments=st.dictionaries(st.one_of(WORDS, st.text(max_size=4)), VALUES, max_size=4),
       original=st.one_of(st.none(), st.dictionaries(WORDS, VALUES, max_size=2)),
       output=VALUES, failed=st.booleans(), message=WORDS, spec=st.sampled_from(SPECS),
       principal=WORDS, record_output=st.booleans(), patterns=st.booleans(), secret=st.booleans(),
       trail=st.lists(st.dictionaries(WORDS, WORDS, max_size=2), max_size=2))
def test_the_fast_record_is_the_reference_record(arguments: dict[str, Any], original: Any, output: Any, failed: bool,
                                                 message: str, spec: ToolSpec, principal: str, record_output: bool,
                                                 patterns: bool, secret: bool, trail: list[Any]) -> None:
    call = ToolCall("call_1", spec.name, arguments)
    error = {"type": "ExecutionError", "code": "x", "message": message, "plugin": None} if failed else None
    result = ToolResult(not failed, output, error, {"trail": trail, "duration_ms": 1.5}, "call_1")
    context = ToolContext(principal=principal, session_id="session_1")
    settings_ = AuditSettings(record_output=record_output, redact_patterns=patterns)
    original = arguments if original is None else original
    expected = audit.encode_record(audit.build_record(call, spec, result, context, original, settings_,
                                                      SecretSet([SECRET] if secret else [])))
    got = audit.record_body(call, spec, result, context, original, settings_, SecretSet([SECRET] if secret else []))
    assert got == expected


def test_a_plain_call_is_encoded_once_and_a_secret_in_the_hashed_output_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path is the common case; an output that is only hashed is searched too (its hash is
    of the redacted output)."""
    slow: list[bool] = []
    real = audit._slow_body
    monkeypatch.setattr(audit, "_slow_body", lambda *a: slow.append(True) or real(*a))
    spec, secrets = SPECS[0], SecretSet([SECRET])
    call = ToolCall("call_1", spec.name, {"path": "README.md", "limit": 10})
    context, settings_ = ToolContext(session_id="session_1"), AuditSettings()
    plain = ToolResult(True, "ok", None, {"trail": [], "duration_ms": 1.0}, "call_1")
    assert audit.record_body(call, spec, plain, context, call.arguments, settings_, secrets) == \
        audit.encode_record(audit.build_record(call, spec, plain, context, call.arguments, settings_, secrets))
    assert slow == []
    leaky = ToolResult(True, f"the key is {SECRET}", None, {"trail": []}, "call_1")
    body = audit.record_body(call, spec, leaky, context, call.arguments, settings_, secrets)
    assert slow == [True] and SECRET.encode() not in body
    assert body == audit.encode_record(audit.build_record(call, spec, leaky, context, call.arguments, settings_,
                                                          secrets))
