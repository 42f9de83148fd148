"""Content hashes of MCP tool definitions, and the pin check made at host start.

A tool's hash is the SHA-256 of its canonical definition: the fields that
make up its contract (``name``, ``title``, ``description``, ``inputSchema``,
``outputSchema``, ``annotations``, ``execution``) as JSON with sorted keys,
no insignificant whitespace and UTF-8 text. ``_meta`` and ``icons`` are left
out: they do not change what the tool accepts or does. Any change to a
schema, a description (which models read as instructions) or an annotation
changes the hash. Works on plain JSON data; never needs the SDK.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._json import canonical

#: The definition fields covered by the hash (MCP wire names).
HASHED_FIELDS: Final = ("name", "title", "description", "inputSchema", "outputSchema", "annotations", "execution")
HASH_PREFIX: Final = "sha256:"


def canonical_definition(definition: Mapping[str, Any]) -> bytes:
    """The bytes that are hashed: the contract fields of ``definition`` as canonical JSON."""
    fields = {key: definition[key] for key in HASHED_FIELDS if definition.get(key) is not None}
    return canonical(fields)


def definition_hash(definition: Mapping[str, Any]) -> str:
    """``"sha256:<hex>"`` of the canonical definition."""
    return HASH_PREFIX + hashlib.sha256(canonical_definition(definition)).hexdigest()


@attrs.frozen
class PinMismatch:
    """One pinned expectation the server did not meet."""

    tool: str | None  # None: the server version
    pinned: str
    actual: str | None  # None: the tool is gone

    def describe(self, server: str) -> str:
        if self.tool is None:
            return f"MCP server {server!r} reports version {self.actual!r}, pinned {self.pinned!r}"
        if self.actual is None:
            return f"MCP server {server!r} no longer lists pinned tool {self.tool!r} (pinned {self.pinned})"
        return (f"MCP server {server!r} tool {self.tool!r} definition changed: "
                f"pinned {self.pinned}, server now sends {self.actual}")


def check_pins(
    *,
    version: str | None,
    pinned_version: str | None,
    hashes: Mapping[str, str],
    pins: Mapping[str, str],
) -> list[PinMismatch]:
    """Every way the server's ``version`` and tool ``hashes`` differ from the pins."""
    problems: list[PinMismatch] = []
    if pinned_version is not None and version != pinned_version:
        problems.append(PinMismatch(None, pinned_version, version))
    for tool, pinned in sorted(pins.items()):
        actual = hashes.get(tool)
        if actual != _normalized(pinned):
            problems.append(PinMismatch(tool, _normalized(pinned), actual))
    return problems


def _normalized(pin: str) -> str:
    return pin if pin.startswith(HASH_PREFIX) else HASH_PREFIX + pin
