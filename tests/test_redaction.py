"""Redaction: the fast pre-scan never changes what is scrubbed."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amplifier_tools import _json
from amplifier_tools.redaction import PLACEHOLDER, _matcher, _redact_strings, redact

SECRET = "s3cr3t-canary-value"
ESCAPED = 'q"uo\\te-é'  # its JSON text is not itself
CONTROL = "ctl\x01-secret"  # encoders may disagree on how to escape it
FRAGMENTS = [ESCAPED, CONTROL, "\x01", "q\"uo",
             "Bearer ", "bearer\t", "abcdefgh12345678", "sk-", "AKIA", "ABCDEFGHIJKLMNOP", "ghp_", "://",
             "user:", "pw@", "host", "-----BEGIN RSA PRIVATE KEY-----", "\n", "\"", "\\", "é", "xoxb-", SECRET,
             "s3cr3t", "-canary-value", " ", "/"]

text = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join) | st.text(max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans(), st.booleans(), st.sampled_from([[SECRET], [SECRET, ESCAPED], [CONTROL]]))
def test_fast_path_scrubs_exactly_what_the_full_walk_scrubs(value: Any, patterns: bool, stdlib: bool,
                                                            secrets: list[str]) -> None:
    expected = _redact_strings(value, _matcher(secrets), patterns)
    with mock.patch.object(_json, "orjson", None if stdlib else _json.orjson):
        assert redact(value, secrets=secrets, patterns=patterns) == expected


def test_secret_inside_nested_arguments_is_replaced_and_input_untouched() -> None:
    args = {"headers": {"Authorization": f"token {SECRET}"}, "items": [SECRET, "plain"]}
    out = redact(args, secrets=[SECRET])
    assert out == {"headers": {"Authorization": f"token {PLACEHOLDER}"}, "items": [PLACEHOLDER, "plain"]}
    assert args["items"][0] == SECRET


def test_secret_split_by_json_escaping_is_still_found() -> None:
    # The JSON text of this value escapes the quote inside the secret; the scan must not miss it.
    secret = 'pa"ss\\word'
    assert redact({"a": f"x{secret}y"}, secrets=[secret]) == {"a": f"x{PLACEHOLDER}y"}


def test_bearer_token_after_a_tab_is_found() -> None:
    assert redact(["Bearer\tabcdefgh12345678"]) == [PLACEHOLDER]


def test_every_default_pattern_needs_a_trigger() -> None:
    import re

    from amplifier_tools.redaction import DEFAULT_PATTERNS, PATTERN_TRIGGERS

    samples = ["-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "BEARER abcdefgh12345678",
               "sk-abcdefghijklmnopqrst", "pk-abcdefghijklmnopqrst", "AKIAABCDEFGHIJKLMNOP",
               "ghp_" + "a" * 36, "xoxb-1234567890ab", "https://user:pw@host/x"]
    for pattern in DEFAULT_PATTERNS:
        matched = [m.group(0) for s in samples for m in [re.search(pattern, s)] if m]
        assert matched, pattern
    for sample in samples:
        assert any(t in sample.lower() for t in PATTERN_TRIGGERS), sample
    assert all(PLACEHOLDER in r for r in redact(samples))


def test_may_hold_pattern_tests_exactly_the_triggers() -> None:
    """``may_hold_pattern`` spells the triggers out (faster than a loop over the tuple): each one,
    in any case and anywhere in a text, is found; a text with none is not."""
    from amplifier_tools.redaction import PATTERN_TRIGGERS, may_hold_pattern

    for trigger in PATTERN_TRIGGERS:
        assert may_hold_pattern(trigger) and may_hold_pattern(f"x {trigger.upper()} y"), trigger
        assert not may_hold_pattern(trigger[:-1] + " " + trigger[-1]), trigger
    assert not may_hold_pattern('{"path":"README.md","limit":10}\n"ok"\nnull\n[]\n"call_1"')
    assert len(PATTERN_TRIGGERS) == 9  # one more in the tuple must be spelled out in the function too


def test_a_secret_or_credential_inside_a_set_bytes_or_an_object_is_redacted_where_it_is_written() -> None:
    """Found by attack: the walk did not enter what JSON has no type for, and the encoders write
    such a value as its ``str()`` (``default=str``): a set, bytes or an object holding a secret or
    a credential reached the audit log unredacted. Now that text is scrubbed; a value with nothing
    to scrub is kept as it is."""

    class Token:
        def __str__(self) -> str:
            return "token hunter2-secret-value"

    value = {"set": {"Bearer abcdefgh12345678"}, "bytes": b"hunter2-secret-value", "object": Token(),
             "clean": {"a set", "of words"}}
    clean = redact(value, secrets=["hunter2-secret-value"])
    assert clean["set"] == f"{{'{PLACEHOLDER}'}}"
    assert clean["bytes"] == f"b'{PLACEHOLDER}'"
    assert clean["object"] == f"token {PLACEHOLDER}"
    assert clean["clean"] is value["clean"]
    assert b"hunter2" not in _json.dumps(clean) and b"abcdefgh12345678" not in _json.dumps(clean)


def test_an_object_whose_str_raises_is_left_to_the_encoders_escaping() -> None:
    """Scrubbing a value JSON has no type for goes through its ``str()``; one that raises is kept
    as it is (no encoder can write it either: the audit escapes it), never an exception here."""

    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    value = {"x": Hostile(), "y": "Bearer abcdefgh12345678"}
    clean = redact(value, secrets=["hunter2-secret-value"])
    assert clean["x"] is value["x"] and clean["y"] == PLACEHOLDER
