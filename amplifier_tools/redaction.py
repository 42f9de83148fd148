"""The one redaction function, used for results, error messages, audit records and spans.

``redact`` replaces, anywhere inside a JSON-like value: secret values (the
host-wide ``SecretSet`` of every secret resolved in this run, or a given
collection), well-known credential shapes (bearer tokens, API keys,
private-key blocks, passwords in URLs) and the values at configured paths
(``arguments/password``, ``output/headers/*``; keys compared case-insensitively).

A secret is found as the exact string the resolver returned and in the forms a
launderer gets for free: JSON string escapes (a secret holding ``"``, ``\\`` or
non-ASCII characters, escaped with or without ``ensure_ascii``, ``/`` as ``\\/`` or not), a JSON
pointer's spelling of it (``~`` as ``~0``, ``/`` as ``~1``: a key named by an error's pointer),
percent-encoding as the standard library writes it (``quote`` with or without ``/`` escaped,
``quote_plus`` and ``urlencode`` with a space as ``+``), lower- and upper-case hex of its UTF-8
bytes, as Python writes it inside a string's or its bytes' ``repr`` (``str()`` of bytes, a set, a
list), the text a secret holding JSON escapes (``\\n``) stands for, and standard or URL-safe
base64 at any of the three byte alignments (the stable middle of the encoding: up to 3
characters at either end of a base64 form stay visible). Secrets that overlap in a text are
replaced as one run.

Limits, stated plainly: not a secret split across lines, values or calls; not
base64 wrapped into lines (``base64`` wraps at 76 columns), compressed,
reversed, case-changed, or under any other transformation; not a prefix or part
of a secret (but where a text was cut through one: ``redact_cut``). Patterns catch
common shapes, not every credential. Secrets shorter
than ``MIN_SECRET_LENGTH`` characters are not searched for (and encoded forms
shorter than ``MIN_ENCODED_LENGTH``), because replacing every occurrence of a
short string destroys output without protecting anything.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import functools
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final, Union, final

from ._json import dumps

try:  # what ``re.compile`` calls, without its cache (``_compile_uncached``)
    from re import _compiler as _sre_compiler  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_compile as _sre_compiler

PLACEHOLDER: Final = "[REDACTED]"
MIN_SECRET_LENGTH: Final = 4
#: Encoded forms (hex, base64 middles) shorter than this are not searched for.
MIN_ENCODED_LENGTH: Final = 8
MAX_MESSAGE_CHARS: Final = 2_000

DEFAULT_PATTERNS: Final = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    r"\b[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9\-._~+/]{8,}=*",
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{16,}",
    r"\bAKIA[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    r"(?<=://)[^/\s:@]*:[^/\s@]+(?=@)",  # user:password@, or :password@ (redis://:password@host)
)


@functools.cache
def _default_re() -> re.Pattern[str]:
    """The default patterns as one regex, compiled when first needed (≈ 1 ms: not at every start)."""
    return re.compile("|".join(f"(?:{p})" for p in DEFAULT_PATTERNS))


#: Every match of a default pattern contains one of these (compared lower-case):
#: a cheap ``in`` test that lets text without any of them skip the regex.
PATTERN_TRIGGERS: Final = ("-----begin", "bearer", "sk-", "pk-", "rk-", "akia", "gh", "xox", "://")


def may_hold_pattern(text: str) -> bool:
    """Whether a default pattern could match somewhere in ``text`` (a cheap test before the regex):
    whether it holds one of ``PATTERN_TRIGGERS``, spelled out (0.46 against 0.8 µs for a loop over
    the tuple; a test keeps the two the same)."""
    lowered = text.lower()
    return ("-----begin" in lowered or "bearer" in lowered or "sk-" in lowered or "pk-" in lowered
            or "rk-" in lowered or "akia" in lowered or "gh" in lowered or "xox" in lowered or "://" in lowered)


_CONTROL_RE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _base64_middles(data: bytes) -> set[str]:
    """The part of ``data``'s base64 encoding that is the same wherever ``data`` starts in a
    longer byte string: for each of the 3 alignments, the characters that depend on ``data`` alone."""
    middles = set()
    for shift, skip in ((0, 0), (1, 2), (2, 3)):
        padded = b"\0" * shift + data
        whole = len(padded) // 3 * 3  # a trailing partial group depends on what follows
        middle = base64.b64encode(padded[:whole]).decode("ascii")[skip:]
        if len(middle) >= MIN_ENCODED_LENGTH:
            middles.add(middle)
    return middles


def _json_escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _python_escapes(secret: str, raw: bytes) -> set[str]:
    """``secret`` as Python writes it between the quotes of a literal: the ``repr`` of a string (in
    the ``str()`` of a set, list or object) and of its UTF-8 bytes, ``'`` escaped or not (which one
    depends on the quotes around it). Found by attack: bytes holding a non-ASCII secret (what a
    ``subprocess`` call returns) are written ``b'caf\\xc3\\xa9...'``, which no other form matches."""
    forms: set[str] = set()
    for pieces in ([repr(part)[1:-1] for part in secret.split("'")],
                   [codecs.escape_encode(part)[0].decode("ascii") for part in raw.split(b"'")]):
        forms.update(("'".join(pieces), "\\'".join(pieces)))
    return forms


def secret_forms(secret: str) -> set[str]:
    """The strings searched for to find ``secret``: itself and its cheap encodings (see the module)."""
    if len(secret) < MIN_SECRET_LENGTH:
        return set()
    raw = secret.encode("utf-8", "surrogatepass")
    # Percent-encoding as the standard library writes it: every reserved character escaped, ``/``
    # kept (``quote``'s default) and a space as ``+`` (``quote_plus``, ``urlencode``: a form or query
    # string). Found by attack: only the first was searched for, so ``quote(secret)`` of a secret
    # holding a ``/`` or ``urlencode({"key": secret})`` of one holding a space came out whole.
    forms = {secret, _json_escaped(secret), json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe=""),
             urllib.parse.quote(secret), urllib.parse.quote_plus(secret, safe="")}
    # ``/`` may be escaped in JSON (``\\/``: PHP's ``json_encode`` does by default); a secret holding
    # one (base64 often does) is also looked for so.
    forms.update(form.replace("/", "\\/") for form in (_json_escaped(secret), json.dumps(secret)[1:-1]))
    # A secret used as a key is named in a JSON pointer (an error's ``pointer``, a schema violation's
    # message), ``~`` written ``~0`` and ``/`` ``~1``. Found by attack: a base64 token as a key of a
    # tool's output that broke its output schema came back whole in that spelling.
    forms.add(secret.replace("~", "~0").replace("/", "~1"))
    if len(raw) * 2 >= MIN_ENCODED_LENGTH:
        forms.update((raw.hex(), raw.hex().upper()))
    forms.update(_base64_middles(raw))
    forms.update(_python_escapes(secret, raw))
    # A secret that is itself JSON-escaped text (a private key kept in one line, ``\\n`` for each
    # line end): the text it stands for is written back as the secret by every JSON encoder. Found
    # by attack: a tool returning the key with its line ends restored put the exact secret in the
    # audit record and ``--json``.
    with contextlib.suppress(ValueError):
        decoded = json.loads(f'"{secret}"')
        if decoded != secret and len(decoded) >= MIN_SECRET_LENGTH:
            forms.add(decoded)
    return forms


_UNSTABLE_ESCAPE: Final = re.compile(r"[\x00-\x1f\ud800-\udfff]")


def _compile_uncached(pattern: str) -> re.Pattern[str]:
    """``re.compile(pattern)`` without a place in the ``re`` module's cache of the last 512 (3.10,
    3.11) or 256 (3.12+) patterns compiled. A matcher's pattern is the alternation of every form
    of every secret, compiled once per change of the set and kept by the matcher: cached, each
    superseded one stayed alive too. Found by attack (a long-lived host whose callers each bring
    their own token): 400 secrets added one at a time held 233 MB in that cache, quadratic in
    the count of secrets; 2.6 MB without it."""
    return _sre_compiler.compile(pattern, 0)  # type: ignore[no-any-return]


@final
class SecretMatcher:
    """The compiled search for a set of secrets: ``needles`` for the cheap ``in`` pre-scan (each
    form and its JSON-escaped spelling), one ``regex`` to replace them, built once per set."""

    __slots__ = ("_overlaps", "forms", "needles", "regex", "walk_on_escape")

    def __init__(self, forms: set[str]) -> None:
        self.forms = tuple(sorted(forms))
        self._overlaps: dict[str, tuple[int, ...]] = {}
        self.needles = tuple(sorted(forms | {_json_escaped(f) for f in forms}))
        # Longest first: a secret that contains another is replaced whole.
        self.regex = _compile_uncached("|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f))))
        # Encoders disagree on how to escape control characters and surrogates: a secret holding
        # one cannot be looked for in JSON text, whose every backslash then means the full walk.
        self.walk_on_escape = any(_UNSTABLE_ESCAPE.search(f) for f in forms)

    def found_in(self, text: str) -> bool:
        """Whether any form may occur in ``text`` (one C-level substring search per needle)."""
        return any(map(text.__contains__, self.needles))

    def sub(self, text: str) -> str:
        """``text`` with every occurrence of a form replaced by the placeholder; occurrences that
        overlap become one (found by attack: two secrets sharing a middle, ``A-shared`` and
        ``shared-B``, written as one run ``A-shared-B``: replacing the first left ``-B``, most of
        the second, in view)."""
        match = self.regex.search(text)
        if match is None:
            return text
        parts: list[str] = []
        at = 0
        while match is not None:
            start, end = match.span()
            found = [match]
            while found:  # a form that may start inside one found and end past it: one run
                inner = found.pop()
                for offset in self._overlapping(inner.group()):
                    longer = self.regex.match(text, inner.start() + offset)
                    if longer is not None and longer.end() > end:
                        end = longer.end()
                        found.append(longer)
            parts += (text[at:start], PLACEHOLDER)
            at = end
            match = self.regex.search(text, end)
        parts.append(text[at:])
        return "".join(parts)

    def _overlapping(self, form: str) -> tuple[int, ...]:
        """The offsets in ``form`` at which another form (or itself again) may begin and run past
        its end: where the rest of ``form`` begins a longer form. Worked out once per form found."""
        offsets = self._overlaps.get(form)
        if offsets is None:
            offsets = self._overlaps[form] = tuple(
                k for k in range(1, len(form))
                if any(len(other) > len(form) - k and other.startswith(form[k:]) for other in self.forms))
        return offsets


def _compile(values: frozenset[str]) -> SecretMatcher | None:
    forms: set[str] = set().union(*(secret_forms(v) for v in values)) if values else set()
    return SecretMatcher(forms) if forms else None


@functools.lru_cache(maxsize=64)
def _compile_cached(values: frozenset[str]) -> SecretMatcher | None:
    return _compile(values)


#: A mapping or a callable returning ``None`` for an unknown name (``models.SecretResolver``).
SecretResolverLike = Union[Mapping[str, str], Callable[[str], Union[str, None]]]


@final
class SecretSet:
    """The host-wide registry of secret values resolved in this run (the ``session.secrets``
    capability): whatever is added here is redacted from every tool's output, every error,
    every audit record and span, whichever tool or plugin resolved it.

    Values are only ever added (a secret once seen stays secret for the host's life). The
    combined matcher is compiled once per change of the set, never per call; adding is safe
    from worker threads. It holds values in memory only and never writes them anywhere.

    ``values`` is the values registered so far: a new frozenset after every change (compare with
    ``is``). Read it; never assign it (``update`` adds). An attribute, not a property: the call
    path reads it twice a call, and on CPython 3.11 a property's getter is a call of its own
    (≈ 4 % of a bare host's call).
    """

    __slots__ = ("_compiled", "_lock", "values")

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self.values: frozenset[str] = frozenset()
        self._compiled: tuple[frozenset[str], SecretMatcher | None] = (self.values, None)
        self.update(values)

    def add(self, value: str) -> None:
        """Register one secret value (values shorter than ``MIN_SECRET_LENGTH`` are ignored)."""
        self.update((value,))

    def update(self, values: Iterable[str]) -> None:
        """Register several secret values at once (one recompilation)."""
        new = {v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH} - self.values
        if new:
            with self._lock:
                self.values = self.values | new

    def __len__(self) -> int:
        return len(self.values)

    def __contains__(self, value: object) -> bool:
        return value in self.values

    def __iter__(self) -> Any:
        return iter(self.values)

    @property
    def matcher(self) -> SecretMatcher | None:
        """The search for every form of every value; None while the set is empty."""
        values, compiled = self._compiled
        current = self.values
        if values is not current:
            compiled = _compile(current)
            self._compiled = (current, compiled)
        return compiled

    def recording(self, resolver: SecretResolverLike) -> Callable[[str], str | None]:
        """A resolver that registers every value ``resolver`` returns (a mapping's values at once)."""
        if isinstance(resolver, RecordingResolver) and resolver.registry is self:
            return resolver
        return RecordingResolver(resolver, self)


@final
class RecordingResolver:
    """A secret resolver that adds each value it hands out to a ``SecretSet`` before returning it."""

    __slots__ = ("registry", "resolver")

    def __init__(self, resolver: SecretResolverLike, registry: SecretSet) -> None:
        self.resolver = resolver
        self.registry = registry
        if isinstance(resolver, Mapping):  # every value of a caller's table is a secret: known at once
            registry.update(v for v in resolver.values() if isinstance(v, str))

    def __call__(self, name: str) -> str | None:
        resolver = self.resolver
        value = resolver.get(name) if isinstance(resolver, Mapping) else resolver(name)
        if isinstance(value, str):
            self.registry.add(value)
        return value

    def why_missing(self, name: str) -> tuple[str, str] | None:
        """The wrapped resolver's reason ``name`` did not resolve, when it can say."""
        explain = getattr(self.resolver, "why_missing", None)
        return explain(name) if explain is not None else None


def _matcher(secrets: Collection[str] | SecretSet) -> SecretMatcher | None:
    if isinstance(secrets, SecretSet):
        return secrets.matcher
    if not secrets:
        return None
    return _compile_cached(frozenset(s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LENGTH))


def redact_text(text: str, secrets: Collection[str] | SecretSet = (), *, patterns: bool = True) -> str:
    """``text`` with secret values and credential-shaped substrings replaced."""
    matcher = _matcher(secrets)
    if matcher is not None and matcher.found_in(text):
        text = matcher.sub(text)
    if patterns and may_hold_pattern(text):
        text = _default_re().sub(PLACEHOLDER, text)
    return text


def redact_cut(text: str, secrets: Collection[str] | SecretSet = (), *, cut_before: bool = False,
               cut_after: bool = False) -> str:
    """``text``, a piece cut out of a longer text, redacted of ``secrets`` (``redact_text``, no
    patterns) and of a secret the cut went through: with ``cut_before`` (the text was cut just
    before its first character) a start that is the end of a secret's form, with ``cut_after`` an
    end that is its beginning, becomes the placeholder when at least ``MIN_SECRET_LENGTH``
    characters of the form are there. For whoever shortens a text before the host redacts it (a
    head and a tail of a command's output): redaction finds whole secrets only, so a secret cut
    in two otherwise shows all but a few of its characters. Found by attack: bash's output past
    ``max_output_bytes`` showed the head and the tail of a secret on either side of the cut."""
    text = redact_text(text, secrets, patterns=False)
    matcher = _matcher(secrets)
    if matcher is None or not (cut_before or cut_after):
        return text
    # Bytes cut inside a character and decoded with ``errors="replace"`` end (or begin) in U+FFFD,
    # which no form holds: the secret's part is looked for beside it, and the U+FFFD goes with it
    # (found by review: a non-ASCII secret bash's tail began inside showed all but its start).
    if cut_after:
        core = text.rstrip("\ufffd")
        head = max((_begun(core, form) for form in matcher.needles), default=0)
        if head:
            text = core[:len(core) - head] + PLACEHOLDER
    if cut_before:
        core = text.lstrip("\ufffd")
        tail = max((_ended(core, form) for form in matcher.needles), default=0)
        if tail:
            text = PLACEHOLDER + core[tail:]
    return text


def _begun(text: str, form: str) -> int:
    """The length of the longest end of ``text`` that begins ``form`` (not all of it), at least
    ``MIN_SECRET_LENGTH`` characters; else 0."""
    window = text[len(text) - len(form) + 1:] if len(text) >= len(form) else text
    at = window.find(form[0])
    while at != -1 and len(window) - at >= MIN_SECRET_LENGTH:
        if form.startswith(window[at:]):
            return len(window) - at
        at = window.find(form[0], at + 1)
    return 0


def _ended(text: str, form: str) -> int:
    """The length of the longest start of ``text`` that ends ``form`` (not all of it), at least
    ``MIN_SECRET_LENGTH`` characters; else 0."""
    window = text[:len(form) - 1]
    at = window.rfind(form[-1])
    while at + 1 >= MIN_SECRET_LENGTH:
        if form.endswith(window[:at + 1]):
            return at + 1
        at = window.rfind(form[-1], 0, at)
    return 0


def _split_rule(rule: str) -> list[str]:
    return [part for part in rule.strip("/").split("/") if part]


def _redact_path(value: Any, parts: list[str]) -> Any:
    if not parts:
        return PLACEHOLDER
    head, rest = parts[0], parts[1:]
    if isinstance(value, Mapping):
        folded = head.casefold()
        return {
            key: (_redact_path(item, rest) if head == "*" or str(key).casefold() == folded else item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            _redact_path(item, rest) if head in ("*", str(index)) else item
            for index, item in enumerate(value)
        ]
    return value


def _digits(number: int | float) -> str:
    """A number as the encoders write it; ``""`` for an integer past Python's 4,300-digit limit,
    which no encoder writes as digits (``_json.encodable`` summarizes it). Found by trial: a
    function tool returning ``math.factorial(2000)`` on a host with secrets ended in an
    ``internal`` error — ``str()`` raised inside the redaction."""
    try:
        return str(number)
    except ValueError:
        return ""


def _redact_strings(value: Any, matcher: SecretMatcher | None, patterns: bool) -> Any:
    if isinstance(value, str):
        if matcher is not None and matcher.found_in(value):
            value = matcher.sub(value)
        return _default_re().sub(PLACEHOLDER, value) if patterns and may_hold_pattern(value) else value
    if isinstance(value, Mapping):
        return {
            _redact_key(key, matcher, patterns): _redact_strings(item, matcher, patterns)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact_strings(item, matcher, patterns) for item in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and matcher is not None \
            and matcher.found_in(_digits(value)):
        return PLACEHOLDER  # a numeric secret (a PIN, an account number) returned as a JSON number
    if value is None or isinstance(value, (bool, int, float)):
        return value
    # Anything else (a set, bytes, an object) is written as its str() by the encoders (default=str):
    # scrub that text, and keep the object itself when there was nothing in it to scrub.
    try:
        text = str(value)
    except Exception:  # a hostile __str__: nothing can write it either (the audit escapes it)
        return value
    clean = _redact_strings(text, matcher, patterns)
    return value if clean == text else clean


def _redact_key(key: Any, matcher: SecretMatcher | None, patterns: bool) -> Any:
    """A mapping key, scrubbed: a string as any string; a number whose digits hold a secret
    becomes the placeholder (the encoders write an ``int`` or ``float`` key as its digits: found by
    attack, ``{918273645546372819: ...}`` came out whole); a tuple's parts likewise (a Python caller
    gets the object). Other keys are kept (they stay hashable)."""
    if isinstance(key, str):
        return _redact_strings(key, matcher, patterns)
    if isinstance(key, (int, float)) and not isinstance(key, bool) and matcher is not None \
            and matcher.found_in(_digits(key)):
        return PLACEHOLDER
    if isinstance(key, tuple):  # a Python caller gets the object itself: its parts, kept hashable
        clean = tuple(_redact_key(part, matcher, patterns) for part in key)
        return key if all(a is b for a, b in zip(clean, key, strict=True)) else clean
    return key


def redact(
    value: Any,
    *,
    secrets: Collection[str] | SecretSet = (),
    paths: Iterable[str] = (),
    patterns: bool = True,
) -> Any:
    """A redacted version of a JSON-like ``value``; the input is never changed.

    When nothing in ``value`` needs scrubbing, ``value`` itself is returned
    (not a copy): treat the result as read-only.

    ``paths`` are ``/``-separated paths relative to ``value`` (``*`` matches any
    one key or index, keys compared case-insensitively); the whole value at a path becomes
    ``[REDACTED]``.
    Then every string (keys included) is scrubbed of ``secrets`` and, with
    ``patterns``, of credential-shaped substrings.
    """
    for rule in paths:
        value = _redact_path(value, _split_rule(rule))
    matcher = _matcher(secrets)
    if matcher is None and not patterns:
        return value
    if not isinstance(value, str) and not _may_match(value, matcher, patterns):
        return value
    return _redact_strings(value, matcher, patterns)


def _may_match(value: Any, matcher: SecretMatcher | None, patterns: bool) -> bool:
    """Whether any string inside ``value`` could need scrubbing: substring searches of its JSON text.

    Sound because JSON escapes character by character: a string (or key) holding a secret form
    or a pattern trigger appears in the text with that form JSON-escaped, which is one of the
    matcher's needles (triggers have nothing to escape). A hit anywhere only means the full walk
    runs. A secret whose escaping differs between encoders (control characters, surrogates)
    sends any text with a backslash to the full walk; so does anything that does not serialize.
    """
    try:
        text = dumps(value).decode("utf-8")
    except Exception:  # anything that does not serialize (a hostile __str__ included): the full walk
        return True
    if matcher is not None and ((matcher.walk_on_escape and "\\" in text) or matcher.found_in(text)):
        return True
    return patterns and may_hold_pattern(text)


class RedactedError(Exception):
    """Stands in, in an exception chain, for an exception whose text held a secret: its message
    is ``<original type>: <original text, redacted>``; its traceback frames are the original's
    (they show code, not values)."""


#: Exceptions deeper than this in a chain are dropped by ``chain_without_secrets`` (a chain is
#: rarely longer than a few links; a cycle would otherwise never end).
MAX_CHAIN_DEPTH: Final = 32


def _note_text(note: object) -> str:
    if isinstance(note, str):
        return note
    try:
        return str(note)
    except Exception:  # a hostile __str__: say only what it was
        return "<a note that could not be read>"


def chain_without_secrets(exc: BaseException | None, secrets: Collection[str] | SecretSet,
                          depth: int = 0) -> BaseException | None:
    """``exc`` as a traceback would print it, with ``secrets`` out of every message in it: its
    cause, context and (for an exception group) sub-exceptions, to any depth. An exception whose
    text held a secret is replaced by a ``RedactedError``; ``exc`` itself when none did.

    Limits: only exception text (``str(exc)``, and a ``SyntaxError``'s file name and source line,
    which a traceback prints too) is scrubbed; an attribute a handler reads (an HTTP library's
    ``request``) is not, nor local variables a debugger shows."""
    if exc is None or depth >= MAX_CHAIN_DEPTH:
        return None
    cause = chain_without_secrets(exc.__cause__, secrets, depth + 1)
    context = chain_without_secrets(exc.__context__, secrets, depth + 1)
    members = getattr(exc, "exceptions", None)
    clean_members = [chain_without_secrets(m, secrets, depth + 1) for m in members] \
        if isinstance(members, tuple) else None
    try:
        text = str(exc)
    except Exception:  # a hostile __str__: say only what it was
        text = "<its message could not be read>"
    clean_text = redact_text(text, secrets, patterns=False)
    # A traceback prints a ``SyntaxError``'s source line (and file name) beside its message, which
    # holds neither. Found by attack: ``ast.literal_eval`` of a text holding a secret, in a tool's
    # chain, printed the secret whole in ``-v``'s "traceback of tool".
    if isinstance(exc, SyntaxError):
        shown = f"{exc.filename}: {exc.text}".rstrip()
        clean_shown = redact_text(shown, secrets, patterns=False)
        if clean_shown != shown:
            clean_text += f" [{clean_shown}]"
    same_members = clean_members is None or all(a is b for a, b in zip(clean_members, members or (), strict=True))
    # ``add_note`` text is printed with the traceback (Python 3.11+): scrubbed like the message
    # (found by attack: a note quoting a header's token was printed whole by ``-v``).
    notes = getattr(exc, "__notes__", None)
    clean_notes = [redact_text(_note_text(note), secrets, patterns=False) for note in notes] \
        if isinstance(notes, list) else None
    same_notes = clean_notes is None or clean_notes == notes
    if clean_text == text and cause is exc.__cause__ and context is exc.__context__ and same_members \
            and same_notes:
        return exc
    replaced: BaseException | None = None
    if clean_members is not None and clean_text == text and hasattr(exc, "derive"):
        with contextlib.suppress(ValueError):  # no member left (past MAX_CHAIN_DEPTH): a stand-in below
            replaced = exc.derive([m for m in clean_members if m is not None])  # the group, members scrubbed
    if replaced is None:
        replaced = RedactedError(f"{type(exc).__name__}: {clean_text}")
    if clean_notes:
        replaced.__notes__ = clean_notes  # type: ignore[attr-defined]  # Python 3.11+, set by add_note
    replaced.__traceback__ = exc.__traceback__
    replaced.__cause__ = cause
    replaced.__context__ = context
    replaced.__suppress_context__ = exc.__suppress_context__
    return replaced


def sanitize_message(text: str, secrets: Collection[str] | SecretSet = ()) -> str:
    """An error message safe to show a model or log: redacted, without control
    characters, at most ``MAX_MESSAGE_CHARS`` long."""
    text = _CONTROL_RE.sub("?", redact_text(str(text), secrets))
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + f"... [{len(text) - MAX_MESSAGE_CHARS} characters cut]"
    return text
