"""Compact, key-sorted JSON bytes: ``orjson`` when the ``fast`` extra is installed, else the stdlib.

Used where JSON is produced on every call (audit records, output digests,
the redaction pre-scan). Both encoders give sorted keys, no spaces and UTF-8;
they can differ in how they spell some floats (``1e-05`` vs ``1e-5``) and NaN
(``NaN`` vs ``null``), which is harmless: audit hashes cover the bytes as
written, and nothing re-encodes a record to check it. Values orjson refuses
(integers beyond 64 bits, non-string keys) fall back to the stdlib encoder, so
the choice of encoder never changes whether a value can be encoded.
"""

from __future__ import annotations

import json
from typing import Any, Final

try:
    import orjson
except ImportError:  # the optional ``fast`` extra is not installed
    orjson = None  # type: ignore[assignment]

_STDLIB: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_ORJSON_OPTIONS: Final = orjson.OPT_SORT_KEYS if orjson is not None else 0


def dumps(value: Any) -> bytes:
    """``value`` as compact, key-sorted UTF-8 JSON; unknown objects are encoded as ``str(obj)``."""
    if orjson is not None:
        try:
            return orjson.dumps(value, default=str, option=_ORJSON_OPTIONS)
        except (TypeError, orjson.JSONEncodeError):
            pass
    return _STDLIB.encode(value).encode("utf-8")


def encoder_name() -> str:
    """Which encoder ``dumps`` uses (for benchmark reports)."""
    return f"orjson {orjson.__version__}" if orjson is not None else "json (stdlib)"
