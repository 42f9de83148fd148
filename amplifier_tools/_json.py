"""Compact, key-sorted JSON bytes: ``orjson`` when the ``fast`` extra is installed, else the stdlib.

Used where JSON is produced on every call (audit records, output digests,
the redaction pre-scan). Both encoders give sorted keys, no spaces and UTF-8;
they can differ in how they spell some floats (``1e-05`` vs ``1e-5``) and NaN
(``NaN`` vs ``null``), which is harmless: audit hashes cover the bytes as
written, and nothing re-encodes a record to check it. Values orjson refuses
(integers beyond 64 bits, non-string keys) fall back to the stdlib encoder, so
the choice of encoder never changes whether a value can be encoded.

``encodable`` turns what neither can encode (lone surrogates, integers over
``sys.get_int_max_str_digits()`` digits, mixed-type keys, NaN and infinities,
nesting deeper than ``MAX_DEPTH``, unknown objects) into values that encode,
noting each change: for records that must be written whatever a caller passed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import orjson

_STDLIB: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
#: Nesting depth beyond which ``encodable`` summarizes a value.
MAX_DEPTH: Final = 100
MAX_NOTES: Final = 20


def __getattr__(name: str) -> Any:
    """``orjson``: the module, or None without the ``fast`` extra. It is imported by the first
    encoding, not with this module: it costs every command's start a few ms (it imports uuid,
    datetime, dataclasses), and a command that encodes nothing (``list``) needs none of it."""
    if name == "orjson":
        return _load_orjson()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_orjson() -> Any:
    global orjson
    try:
        import orjson as module
    except ImportError:  # the optional ``fast`` extra is not installed
        module = None  # type: ignore[assignment]
    orjson = module
    return module


def _fast() -> Any:
    """The ``orjson`` module or None (the global once loaded; tests replace it)."""
    try:
        return orjson
    except NameError:
        return _load_orjson()


def dumps(value: Any) -> bytes:
    """``value`` as compact, key-sorted UTF-8 JSON; unknown objects are encoded as ``str(obj)``."""
    fast = _fast()
    if fast is not None:
        try:
            return fast.dumps(value, default=str, option=fast.OPT_SORT_KEYS)  # type: ignore[no-any-return]
        except (TypeError, fast.JSONEncodeError) as exc:
            if "ecursion" in str(exc):
                # Too deep for orjson (255 levels): the same on every CPython, where the stdlib
                # encoder's limit moves with the interpreter's (3.13 writes what 3.11 cannot read).
                raise ValueError(str(exc)) from None
    return _stdlib_piece(value)


def _orjson_piece(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS)


def _stdlib_piece(value: Any) -> bytes:
    return _STDLIB.encode(value).encode("utf-8")


def piece_encoder() -> Callable[[Any], bytes]:
    """What ``dumps`` encodes with, without its fallback: orjson when installed (raising for what
    it refuses), else the stdlib encoder. For a document encoded in pieces and joined: ``dumps``
    of the whole spells every value with one encoder, so the pieces must be spelled by that one
    too (the two disagree on some floats); a piece that raises means "encode the whole instead"."""
    return _orjson_piece if _fast() is not None else _stdlib_piece


def fingerprint(value: Any) -> bytes:
    """Bytes that differ whenever JSON data ``value`` does (a value JSON spells otherwise: ``1``
    for ``true`` or ``1.0``; a key added, removed or moved), at the least cost: to tell whether
    data was changed in place. Not canonical (keys in their order), never written anywhere.
    What it does not tell apart: what JSON spells alike (a tuple for a list, an ``IntEnum``
    member for its number, a ``str`` subclass for its text)."""
    fast = _fast()
    if fast is not None:
        try:
            return fast.dumps(value)  # type: ignore[no-any-return]
        except (TypeError, fast.JSONEncodeError):  # an integer past 64 bits, a str subclass orjson refuses
            pass
    return _STDLIB.encode(value).encode("utf-8", "surrogatepass")  # a lone surrogate is valid JSON text


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON for hashing: always the stdlib encoder (sorted keys, no spaces,
    UTF-8), so a digest does not depend on whether the ``fast`` extra is installed (the encoders
    spell some floats differently). Unlike ``dumps`` it refuses what JSON cannot hold (NaN,
    unknown objects) with ``ValueError``/``TypeError``."""
    return _CANONICAL.encode(value).encode("utf-8")


def json_pointer(parts: Iterable[Any]) -> str:
    """The JSON pointer (RFC 6901) of a path of keys and indexes: ``("a/b", 0)`` -> ``/a~1b/0``."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON data: equal, and of the same types all through.
    ``==`` holds ``1``, ``1.0`` and ``True`` equal (and ``0.0`` and ``-0.0``), yet a tool
    receives, and a record writes, different values. Raises ``RecursionError`` for data nested past the stack."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        return len(a) == len(b) and all(key in b and same_json(value, b[key]) for key, value in a.items())
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if kind is float:  # 0.0 == -0.0, yet JSON spells them apart (and a tool can tell them apart)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def encoder_name() -> str:
    """Which encoder ``dumps`` uses (for benchmark reports)."""
    fast = _fast()
    return f"orjson {fast.__version__}" if fast is not None else "json (stdlib)"


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a hostile __repr__, an integer too long to print
        return f"<{type(value).__name__}>"


def json_text(value: Any, *, indent: int | None = None, ensure_ascii: bool = False) -> str:
    """``value`` as JSON text that a strict parser reads (RFC 8259 has no ``NaN`` or ``Infinity``):
    for a model, a terminal or an MCP client. As the stdlib writes it (``ensure_ascii=False``, an
    object JSON has no type for as its ``str()``) when it can; else as ``encodable`` renders the
    value, the audit record's rule: NaN and infinities as strings, an integer over
    ``sys.get_int_max_str_digits()`` digits summarized, a cycle cut at ``MAX_DEPTH``, a non-string
    key written as a string.

    The one rule for a tool's output as text: ``ToolResult.get_serialized_output``, ``amplifier-tools
    call`` (with ``--json`` too) and serve-mcp's text and ``structuredContent`` use it (found by
    attack: NaN was written as ``NaN``, which JSON parsers refuse, and ``call --json`` failed as
    "a bug" on a long integer or a cycle after the call had succeeded). ``ensure_ascii`` escapes
    what is not ASCII, for a stream that may not encode it (``call --json``'s stdout)."""
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, default=str, allow_nan=False, indent=indent)
    except Exception:  # ValueError (a non-finite float, a long integer, a cycle), RecursionError, a hostile __str__
        return json.dumps(encodable(value, []), ensure_ascii=ensure_ascii, default=str, allow_nan=False,
                          indent=indent)


def encodable(value: Any, altered: list[str], where: str = "") -> Any:
    """``value`` with everything ``dumps`` cannot encode escaped or summarized; each change is
    appended to ``altered`` as ``"<path>: <what was done>"`` (at most ``MAX_NOTES`` of them)."""
    return _encodable(value, altered, where, 0)


def _note(altered: list[str], where: str, what: str) -> None:
    if len(altered) < MAX_NOTES:
        altered.append(f"{where or '/'}: {what}")
    elif len(altered) == MAX_NOTES:
        altered.append("...: more values were altered")


def utf8_text(value: str) -> str:
    """``value`` with its lone surrogates escaped as ``\\udXXX`` (the very object when it has none):
    text that UTF-8 can encode, as the audit record and what the adapters hand a model need."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _text(value: str, altered: list[str], where: str) -> str:
    escaped = utf8_text(value)
    if escaped is not value:
        _note(altered, where, "lone surrogates escaped as \\udXXX")
    return escaped


def _encodable(value: Any, altered: list[str], where: str, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _text(value, altered, where)
    if isinstance(value, int):
        try:
            str(value)
        except ValueError:
            _note(altered, where, f"integer of {value.bit_length()} bits summarized")
            return f"<integer of {value.bit_length()} bits>"
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        _note(altered, where, f"{value!r} written as a string")
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if depth >= MAX_DEPTH:
        _note(altered, where, f"nested deeper than {MAX_DEPTH} levels, summarized")
        return f"<{type(value).__name__} nested too deep>"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            # repr is str for int, float, bool and None, and _safe_repr survives what str() cannot
            # (an integer key over 4,300 digits, a hostile __repr__).
            name = key if isinstance(key, str) else _safe_repr(key)
            if not isinstance(key, str):
                _note(altered, f"{where}/{name}", f"{type(key).__name__} key written as a string")
            name = _text(name, altered, f"{where}/{name!r}")
            while name in out:
                name += "'"
            out[name] = _encodable(item, altered, f"{where}/{name}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_encodable(item, altered, f"{where}/{index}", depth + 1) for index, item in enumerate(value)]
    _note(altered, where, f"{type(value).__name__} written as its str()")
    try:
        text = str(value)
    except Exception:  # a hostile __str__: the record is written anyway
        text = f"<{type(value).__name__}>"
    return _text(text, altered, where)
