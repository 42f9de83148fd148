"""Regular expressions in imported schemas: run on RE2 (linear time), or refused at mount.

An MCP server writes its tools' input and output schemas, and JSON Schema's ``pattern`` and
``patternProperties`` are regular expressions the host must run on every call. On Python's
backtracking ``re`` one pattern such as ``^(a+)+$`` and a 30-character string freeze the event
loop for minutes. So every imported tool's schemas are checked with RE2 (google-re2, the
``mcp`` extra), which matches in time linear in the text: ``compile_pattern`` is the engine
the registry uses for them (``McpTool.pattern_engine``), and ``unsupported_patterns`` lists,
at mount, what RE2 cannot run so the tool is refused (or skipped) instead of checked on
``re``. The host's own tools keep ``re``.

Limits: JSON Schema patterns are ECMA-262; RE2 has no lookaround and no backreferences, so
patterns using them are refused, never approximated. ``\\uXXXX`` escapes are translated to
RE2's ``\\x{XXXX}``; other ECMA-262 differences (``\\d``/``\\w`` are ASCII in both; ``$``
matches only at the end, ``[^]``, ``\\cX``) are whatever RE2 makes of them. A schema is refused
too when it nests ``$schema`` below its root, or combines ``unevaluatedProperties`` with
``patternProperties``, because jsonschema would then evaluate the patterns on ``re``. Refusal
is decided by keyword name wherever it appears (also inside ``const``, ``enum``, ``default``
and ``examples`` data): it errs towards refusing. A pattern whose RE2 program is larger than
``MAX_PROGRAM_SIZE`` instructions is refused too, and a string longer than ``MAX_MATCH_WORK``
divided by the program's size is not matched at all (it fails validation): RE2's fallback when
its DFA explodes costs time per character times program size.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

import re2

from .._json import json_pointer
from ..schema_fastpath import CompiledPattern

log = logging.getLogger(__name__)
_ECMA_ESCAPE: Final = re.compile(r"\\(u([0-9A-Fa-f]{4})|.)", re.DOTALL)
_OPTIONS: Final = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported by us, not logged to stderr by RE2


def _to_re2(pattern: str) -> str:
    return _ECMA_ESCAPE.sub(lambda m: f"\\x{{{m.group(2)}}}" if m.group(2) else m.group(0), pattern)


#: RE2 is linear in the text, but a pattern whose DFA explodes (``[ab]*a[ab]{999}``) falls back to a
#: simulation costing time per character *times* the program's size: a server that writes the
#: pattern and the value could stall the event loop for minutes. Larger programs are refused.
MAX_PROGRAM_SIZE: Final = 1000
#: Characters x program instructions one match may cost (about a quarter second at worst); a longer
#: string counts as not matching, and the call fails validation instead of stalling the loop.
MAX_MATCH_WORK: Final = 20_000_000


class PatternTooLarge(re2.error):  # type: ignore[misc]  # re2 has no type hints
    """A pattern RE2 could compile, refused for its size (``MAX_PROGRAM_SIZE``)."""


class BoundedPattern:
    """An RE2 pattern that refuses (does not match) a string too long for ``MAX_MATCH_WORK``."""

    __slots__ = ("_regex", "max_length")

    def __init__(self, regex: Any, size: int) -> None:
        self._regex = regex
        self.max_length = MAX_MATCH_WORK // max(size, 1)

    def search(self, string: str) -> object:
        if len(string) > self.max_length:
            log.warning("an imported schema's pattern was not run on a %d-character string (at most %d for "
                        "this pattern); the value counts as not matching", len(string), self.max_length)
            return None
        return self._regex.search(string)


def compile_pattern(pattern: str) -> CompiledPattern:
    """``pattern`` compiled by RE2; ``re2.error`` when RE2 cannot run it or its program is larger
    than ``MAX_PROGRAM_SIZE``."""
    compiled = re2.compile(_to_re2(pattern), _OPTIONS)
    size = max(compiled.programsize, compiled.reverseprogramsize)
    if size > MAX_PROGRAM_SIZE:
        raise PatternTooLarge(f"its RE2 program has {size} instructions, more than {MAX_PROGRAM_SIZE} (a pattern this "
                              "large could stall the host on a long string)")
    return BoundedPattern(compiled, size)


def _reason(pattern: str) -> str | None:
    try:
        compile_pattern(pattern)
    except PatternTooLarge as exc:
        return f"refused: {exc}"
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return f"RE2 cannot run it ({detail}; lookaround and backreferences are not supported)"
    return None


def unsupported_patterns(schema: Any) -> list[tuple[str, str]]:
    """``(JSON pointer, reason)`` for each part of ``schema`` that cannot run on RE2, in order.

    Walks every object in the document (a ``$ref`` may point anywhere in it).
    """
    problems: list[tuple[str, str]] = []
    with_pattern_properties: list[str] = []
    unevaluated: list[str] = []
    stack: list[tuple[tuple[str, ...], Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack.extend(((*path, str(i)), item) for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            reason = _reason(node["pattern"])
            if reason is not None:
                problems.append((json_pointer((*path, "pattern")), reason))
        if isinstance(node.get("patternProperties"), dict):
            with_pattern_properties.append(json_pointer(path))
            for key in node["patternProperties"]:
                reason = _reason(key)
                if reason is not None:
                    problems.append((json_pointer((*path, "patternProperties", key)), reason))
        if path and isinstance(node.get("$schema"), str):
            problems.append((json_pointer((*path, "$schema")),
                             "a $schema below the root would check the patterns beneath it on Python's re"))
        if "unevaluatedProperties" in node:
            unevaluated.append(json_pointer((*path, "unevaluatedProperties")))
        stack.extend(((*path, key), value) for key, value in reversed(list(node.items())))
    if unevaluated and with_pattern_properties:
        problems.append((unevaluated[0], "unevaluatedProperties together with patternProperties would "
                                         "check the patterns on Python's re"))
    return problems
