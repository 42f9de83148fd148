"""The one redaction function, used for error messages, results and audit records.

``redact`` replaces, anywhere inside a JSON-like value: exact secret values
(resolved ``secret_refs``), well-known credential shapes (bearer tokens, API
keys, private-key blocks, passwords in URLs) and the values at configured
paths (``arguments/password``, ``output/headers/*``).

Limits, stated plainly: a secret is found only as the exact string the resolver
returned (not base64- or URL-encoded, not split across values); patterns catch
common shapes, not every credential; secrets shorter than
``MIN_SECRET_LENGTH`` characters are not searched for, because replacing
every occurrence of a 1-3 character string destroys output without
protecting anything.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from ._json import dumps

PLACEHOLDER: Final = "[REDACTED]"
MIN_SECRET_LENGTH: Final = 4
MAX_MESSAGE_CHARS: Final = 2_000

DEFAULT_PATTERNS: Final = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    r"\b[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9\-._~+/]{8,}=*",
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{16,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)",
)
_DEFAULT_RE: Final = re.compile("|".join(f"(?:{p})" for p in DEFAULT_PATTERNS))
#: Every match of a default pattern contains one of these (compared lower-case):
#: a cheap ``in`` test that lets text without any of them skip the regex.
PATTERN_TRIGGERS: Final = ("-----begin", "bearer", "sk-", "pk-", "rk-", "akia", "gh", "xox", "://")


def _may_hold_pattern(text: str) -> bool:
    low = text.lower()
    return any(trigger in low for trigger in PATTERN_TRIGGERS)
_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _secret_regex(secrets: Iterable[str]) -> re.Pattern[str] | None:
    values = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
    if not values:
        return None
    return re.compile("|".join(re.escape(v) for v in values))


def redact_text(text: str, secrets: Collection[str] = (), *, patterns: bool = True) -> str:
    """``text`` with secret values and credential-shaped substrings replaced."""
    secret_re = _secret_regex(secrets)
    if secret_re is not None:
        text = secret_re.sub(PLACEHOLDER, text)
    if patterns and _may_hold_pattern(text):
        text = _DEFAULT_RE.sub(PLACEHOLDER, text)
    return text


def _split_rule(rule: str) -> list[str]:
    return [part for part in rule.strip("/").split("/") if part]


def _redact_path(value: Any, parts: list[str]) -> Any:
    if not parts:
        return PLACEHOLDER
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        return {
            key: (_redact_path(item, rest) if head in ("*", key) else item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            _redact_path(item, rest) if head in ("*", str(index)) else item
            for index, item in enumerate(value)
        ]
    return value


def _redact_strings(value: Any, secret_re: re.Pattern[str] | None, patterns: bool) -> Any:
    if isinstance(value, str):
        if secret_re is not None:
            value = secret_re.sub(PLACEHOLDER, value)
        return _DEFAULT_RE.sub(PLACEHOLDER, value) if patterns and _may_hold_pattern(value) else value
    if isinstance(value, Mapping):
        return {
            _redact_strings(key, secret_re, patterns) if isinstance(key, str) else key:
            _redact_strings(item, secret_re, patterns)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact_strings(item, secret_re, patterns) for item in value]
    return value


def redact(
    value: Any,
    *,
    secrets: Collection[str] = (),
    paths: Iterable[str] = (),
    patterns: bool = True,
) -> Any:
    """A redacted version of a JSON-like ``value``; the input is never changed.

    When nothing in ``value`` needs scrubbing, ``value`` itself is returned
    (not a copy): treat the result as read-only.

    ``paths`` are ``/``-separated paths relative to ``value`` (``*`` matches any
    one key or index); the whole value at a path becomes ``[REDACTED]``.
    Then every string (keys included) is scrubbed of ``secrets`` and, with
    ``patterns``, of credential-shaped substrings.
    """
    for rule in paths:
        value = _redact_path(value, _split_rule(rule))
    secret_re = _secret_regex(secrets)
    if secret_re is None and not patterns:
        return value
    if not isinstance(value, str) and not _may_match(value, secret_re, patterns):
        return value
    return _redact_strings(value, secret_re, patterns)


def _may_match(value: Any, secret_re: re.Pattern[str] | None, patterns: bool) -> bool:
    """Whether any string inside ``value`` could need scrubbing: one regex scan of its JSON text.

    Sound because, when the JSON text has no escape sequences, every string and
    key appears in it verbatim, so a secret or a pattern trigger inside any one
    string is also in the text; a hit anywhere only means the full walk runs.
    Anything that escapes, or does not serialize, takes the full walk.
    """
    try:
        text = dumps(value).decode("utf-8")
    except Exception:  # anything that does not serialize (a hostile __str__ included): the full walk
        return True
    if "\\" in text:
        return True
    return bool((secret_re is not None and secret_re.search(text)) or (patterns and _may_hold_pattern(text)))


def sanitize_message(text: str, secrets: Collection[str] = ()) -> str:
    """An error message safe to show a model or log: redacted, without control
    characters, at most ``MAX_MESSAGE_CHARS`` long."""
    text = _CONTROL_RE.sub("?", redact_text(str(text), secrets))
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + f"... [{len(text) - MAX_MESSAGE_CHARS} characters cut]"
    return text
