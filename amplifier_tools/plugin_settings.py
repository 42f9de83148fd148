"""One settings path for every built-in plugin: its ``[plugins.<name>]`` table, structured by the
one converter into the plugin's frozen attrs class, with one error format.

A plugin declares its settings as a frozen attrs class marked ``@settings_class`` (field defaults
are the plugin's defaults) and builds it with ``structure_settings(config, cls, "plugins.<name>")``.
Every problem — an unknown key, a value of the wrong type, a broken rule, at the top or in a nested
table or list — is one ``ConfigError`` naming the full key (``plugins.bash.max_timeout``,
``plugins.mcp.servers.fs.command``, ``plugins.policy.rules[2].action``) and saying what the key
must be; an unknown key also gets a did-you-mean hint. The first problem is reported: unknown keys
before values (a misspelled key is the likelier cause), the rest in the order of the fields.

Strict types. Config comes from TOML or JSON, and a setting is never coerced into something else:
``true`` is not an integer, ``1.9`` is not a count, ``5`` is not a path, ``"rm"`` is not a list.
cattrs' own hooks do coerce (``int("5")``, ``int(1.9)``, ``str(5)``), and the shared converter
structures ``ToolSpec`` and the per-tool overrides with them, so making ``int`` or ``str`` strict
there would change what a tool contract accepts. The strictness is scoped to settings classes
instead: ``@settings_class`` registers the class, and every attrs class nested in its fields, for a
hook factory on the one converter. The factory builds each class's structure function with cattrs'
``make_dict_structure_fn`` — unknown keys, required keys, defaults and error locations stay
cattrs' — and gives each field a strict hook that checks the value's JSON type against the field's
type (every element of a list or table of plain values included) before the converter structures
it. A nested settings class is checked by its own hook, so its errors keep their path.

Rules. A field typed ``Annotated[T, Expect("a positive integer", check)]`` says what the key must
be and the rule beyond its type (``check`` gets a value already of type ``T``); other fields are
described from their type ("true or false", "'a' or 'b'", "a list of strings"). A rule across
fields is an attrs validator raising ``Invalid(message, at=(field,))``.

Limits: the types are what TOML and JSON hold — bool, int, float, str, None, ``Literal``, a
str-valued ``Enum``, ``tuple[X, ...]``, ``Mapping[str, X]``, unions of these, and settings classes.
A list or table of plain values is reported at its key, not at the element. An attrs validator runs
whenever the class is built; an ``Expect`` rule only when a table is structured.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import threading
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar, Union, get_args, get_origin

import attrs
from attrs import AttrsInstance

from .errors import ConfigError, double_bracket_hint, shown_value

if TYPE_CHECKING:  # cattrs is imported where a table is structured, not by a plugin that gets none
    import cattrs

T = TypeVar("T")
A = TypeVar("A", bound=AttrsInstance)

#: The classes marked ``@settings_class`` (and those nested in them), their annotations resolved.
_SETTINGS: set[type[Any]] = set()
#: Classes marked and not resolved yet: resolving evaluates their annotations (``typing`` at work,
#: ≈ 7 ms for the built-ins), which only structuring a table needs, not a plugin that gets none.
_PENDING: list[type[Any]] = []
#: Held while the pending classes are resolved. Found by running hosts on uvloop in two threads:
#: two hosts starting at once each marked the first pending class and deleted the first entry, so
#: one start failed (``IndexError``) or a class left the list unmarked (refused, or structured loosely).
_RESOLVING = threading.Lock()


def _fresh_lock() -> None:
    """In a child made by ``os.fork``: a lock another thread of the parent held at the fork would
    stay held for good (found by review), and the child's first host start would hang."""
    global _RESOLVING
    _RESOLVING = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_fresh_lock)


def _is_settings(t: Any) -> bool:
    if _PENDING:
        _resolve_pending()
    return isinstance(t, type) and t in _SETTINGS


def _resolve_pending() -> None:
    with _RESOLVING:
        while _PENDING:
            _mark(_PENDING[0])
            del _PENDING[0]


def _mark(cls: type[Any]) -> None:
    attrs.resolve_types(cls)
    if cls not in _SETTINGS:
        _SETTINGS.add(cls)
        for field in attrs.fields(cls):
            for nested in _attrs_classes(field.type):
                _mark(nested)


@attrs.frozen
class Expect:
    """What a setting must be, for an ``Annotated`` field type.

    ``description`` completes "must be …"; ``check`` is the rule on a value of the right type;
    ``parse`` replaces the type check for a setting spelled more than one way (it returns the
    value to keep or raises ``Invalid``); ``hint`` is the next step printed with the error.
    """

    description: str
    check: Callable[[Any], bool] | None = None
    parse: Callable[[Any], Any] | None = None
    hint: str | None = None


class Invalid(ValueError):
    """A setting refused by a rule: ``message`` follows the key; ``at`` locates it below the
    table being structured (a validator of a class names its field this way)."""

    def __init__(self, message: str, *, at: tuple[str | int, ...] = (), hint: str | None = None,
                 expected: str | None = None, got: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.at = at
        self.hint = hint
        #: What the setting must be, and, when the value is of another type, what it is ("a string"):
        #: the hint made of them when ``hint`` is None (``_config_error``).
        self.expected = expected
        self.got = got


def _positive(value: float) -> bool:
    return value > 0  # NaN compares false: refused


#: The largest ``Count``: 2**63 - 1, the largest limit ``setrlimit`` and ``prlimit(1)`` take below
#: "unlimited" (found by attack: ``max_memory_bytes = 10**23`` failed every bash call in prlimit, and
#: 2**64 - 1 is RLIM_INFINITY, no limit at all), and far beyond any real size or count.
MAX_COUNT: Final = 2**63 - 1


def _count(value: Any) -> int:
    """A ``Count``: an integer above zero and at most ``MAX_COUNT``, each refusal saying which."""
    if type(value) is not int or value <= 0:
        raise Invalid(f"must be a positive integer, got {shown_value(value)}")
    if value > MAX_COUNT:
        raise Invalid(f"must be at most {MAX_COUNT} (2**63 - 1), got {shown_value(value)}")
    return value


#: An integer above zero, at most ``MAX_COUNT``: a size, a count, a limit.
Count = Annotated[int, Expect("a positive integer", lambda value: 0 < value <= MAX_COUNT, parse=_count)]
#: A number above zero (an integer or a float), e.g. milliseconds.
Number = Annotated[float, Expect("a positive number", _positive)]
#: A duration above zero, in seconds (an integer or a float).
Seconds = Annotated[float, Expect("a positive number of seconds", _positive)]
#: A string that is not empty.
Text = Annotated[str, Expect("a non-empty string", bool)]
#: A list of strings none of which is empty (paths, globs, patterns).
Strings = Annotated[tuple[str, ...], Expect("a list of non-empty strings", lambda items: "" not in items)]

_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_names(names: Iterable[str]) -> bool:
    """Whether every one of ``names`` is an environment variable name (``[A-Za-z_][A-Za-z0-9_]*``)."""
    return all(_ENV_NAME.match(name) for name in names)


#: Names of environment variables to pass through.
EnvNames = Annotated[tuple[str, ...], Expect("a list of environment variable names", env_names)]
#: Environment variables to set: names to values (a NUL byte cannot be in an environment).
EnvTable = Annotated[Mapping[str, str], Expect("a table of environment variable names to strings without NUL bytes",
                                               lambda table: env_names(table) and
                                               all("\x00" not in value for value in table.values()))]


def structure_settings(config: Mapping[str, Any], cls: type[T], where: str) -> T:
    """``config`` (a plugin's table) as an instance of the settings class ``cls``; a ``ConfigError``
    naming the key below ``where`` (``plugins.<name>``) for the first problem."""
    if cls not in _SETTINGS and cls not in _PENDING and not _is_settings(cls):
        raise TypeError(f"{cls.__name__} is not marked @settings_class, so it would not be structured strictly")
    if not isinstance(config, Mapping):
        raise ConfigError(f"must be a table, got {shown_value(config)}", key=where)
    if not config:
        # No table: the class's defaults, which is what the converter builds from an empty one, without
        # importing cattrs (the start-up of every command); defaults the class refuses take the path below.
        with contextlib.suppress(Exception):
            return cls()
    import cattrs

    from ._converter import converter

    _resolve_pending()
    try:
        return converter.structure(config, cls)
    except cattrs.BaseValidationError as exc:
        raise _config_error(exc, where) from None


def settings_class(cls: type[A]) -> type[A]:
    """Mark the attrs class ``cls``, and the attrs classes in its fields, as settings classes:
    the one converter structures them strictly (see the module docstring). The marks take effect
    (and the annotations are resolved) when a settings class is first looked up."""
    _PENDING.append(cls)
    return cls


def register_settings_hooks(converter: cattrs.Converter) -> None:
    """Make ``converter`` (the one converter, which calls this as it is built) structure every
    settings class strictly."""

    def structure_fn(cls: type[Any]) -> Callable[[Any, Any], Any]:
        """The structure function of a settings class: cattrs' own, with a strict hook per field."""
        from cattrs.gen import make_dict_structure_fn, override

        hooks: dict[str, Any] = {field.name: override(struct_hook=_field_hook(field.type))
                                 for field in attrs.fields(cls) if field.init}
        structure = make_dict_structure_fn(cls, converter, **hooks)

        def table(value: Any, _: Any) -> Any:
            if not isinstance(value, Mapping):
                raise Invalid(f"must be a table, got {shown_value(value)}")
            return structure(value, cls)

        return table

    converter.register_structure_hook_factory(_is_settings, structure_fn)


def _field_hook(t: Any) -> Callable[[Any, Any], Any]:
    optional = _is_union(t) and type(None) in get_args(t)
    inner = _without_none(t)
    expect, base = _split(inner)
    description = _describe(t)

    def hook(value: Any, _: Any) -> Any:
        if value is None and optional:
            return None
        if expect is not None and expect.parse is not None:
            try:
                return expect.parse(value)
            except Invalid as exc:
                if exc.hint is None and exc.expected is None:
                    exc.expected, exc.got = description, _wrong_kind(value, inner)
                raise
        if not _fits(value, base) or (expect is not None and expect.check is not None and not expect.check(value)):
            raise Invalid(f"must be {description}, got {shown_value(value)}", hint=expect.hint if expect else None,
                          expected=description, got=_wrong_kind(value, inner))
        return _build(value, base)

    return hook


def _takes_strings(t: Any) -> bool:
    """Whether some strings are of type ``t``: a string refused there is refused by a rule (one of
    a ``Literal``'s choices, say), not for its type."""
    t = _split(t)[1]
    if t is str or _choices(t) is not None:
        return True
    return _is_union(t) and any(_takes_strings(member) for member in get_args(t))


#: What a value is, as TOML and JSON name it, for a hint ("got a string").
_KINDS: Final = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                 (list, "a list"), (tuple, "a list"), (Mapping, "a table"), (type(None), "nothing"))


def _wrong_kind(value: Any, t: Any) -> str | None:
    """What ``value`` is ("a string"), when it is not of the type ``t`` at all; None when it is
    (a rule of ``t`` refused it, not its type), or for a type settings never hold. A string that
    would fit without its quotes says so."""
    try:
        if _fits(value, _split(t)[1]) or (isinstance(value, str) and _takes_strings(t)):
            return None
    except TypeError:
        return None
    kind = next((name for cls, name in _KINDS if isinstance(value, cls)), type(value).__name__)
    if isinstance(value, str):
        try:
            unquoted = json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: ``"[[[…"`` (found by review: it became the error)
            return kind
        with contextlib.suppress(TypeError):
            if not isinstance(unquoted, str) and unquoted == unquoted and _fits(unquoted, t):  # NaN: no
                return f"{kind}: write it without quotes"  # max_timeout = "600"
    return kind


# -- types -------------------------------------------------------------------------------------


def _is_union(t: Any) -> bool:
    return get_origin(t) in (Union, types.UnionType)


def _without_none(t: Any) -> Any:
    """``t`` without ``None`` among its members (``X | None`` -> ``X``)."""
    if not _is_union(t):
        return t
    members = [m for m in get_args(t) if m is not type(None)]
    return members[0] if len(members) == 1 else Union[tuple(members)]


def _split(t: Any) -> tuple[Expect | None, Any]:
    """(the ``Expect`` of an ``Annotated`` type or None, the type underneath)."""
    if get_origin(t) is Annotated:
        base, *extras = get_args(t)
        return next((e for e in extras if isinstance(e, Expect)), None), base
    return None, t


def _choices(t: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal`` or a str-valued ``Enum``; None for other types."""
    if get_origin(t) is Literal:
        return get_args(t)
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return tuple(member.value for member in t)
    return None


def _is_sequence(t: Any) -> bool:
    return get_origin(t) in (tuple, list)


def _is_mapping(t: Any) -> bool:
    return get_origin(t) in (dict, Mapping)


def _attrs_classes(t: Any) -> Iterator[type[Any]]:
    if isinstance(t, type) and attrs.has(t):
        yield t
    for arg in get_args(t):
        yield from _attrs_classes(arg)


def _fits(value: Any, t: Any) -> bool:
    """Whether ``value``, as TOML or JSON hold it, is of type ``t`` without any conversion. A
    settings class fits any value: its own hook checks it (and locates the error)."""
    expect, t = _split(t)
    if expect is not None and expect.check is not None:
        return _fits(value, t) and expect.check(value)
    if t is Any or _is_settings(t):
        return True
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is str:
        return isinstance(value, str)
    if t is type(None):
        return value is None
    choices = _choices(t)
    if choices is not None:
        return isinstance(value, str) and value in choices
    if _is_union(t):
        return any(_fits(value, member) for member in get_args(t))
    if _is_sequence(t):
        (item, *_) = get_args(t)
        return isinstance(value, (list, tuple)) and all(_fits(v, item) for v in value)
    if _is_mapping(t):
        key, item = get_args(t)
        return isinstance(value, Mapping) and all(_fits(k, key) and _fits(v, item) for k, v in value.items())
    raise TypeError(f"settings cannot hold {t!r}")  # a programming error in a settings class


def _build(value: Any, t: Any) -> Any:
    """``value`` (which fits ``t``) structured by the converter; a union by the member it fits."""
    if _is_union(t):
        return _build(value, next(member for member in get_args(t) if _fits(value, member)))
    from ._converter import converter

    return converter.structure(value, t)


_PLURALS = {bool: "true or false values", int: "integers", float: "numbers", str: "strings"}


def _describe(t: Any) -> str:
    """What a value of type ``t`` is, to complete "must be …"."""
    expect, t = _split(_without_none(t))
    if expect is not None:
        return expect.description
    if _is_settings(t):
        return "a table"
    if t is bool:
        return "true or false"
    choices = _choices(t)
    if choices is not None:
        return _one_of([repr(choice) for choice in choices])
    if _is_union(t):
        return _one_of([_describe(member) for member in get_args(t)])
    if _is_sequence(t):
        return f"a list of {_plural(get_args(t)[0])}"
    if _is_mapping(t):
        return f"a table of {_plural(get_args(t)[1])}"
    return {int: "an integer", float: "a number", str: "a string"}.get(t, repr(t))


def _plural(t: Any) -> str:
    return "tables" if _is_settings(t) else _PLURALS.get(t, "values")


def describe_type(t: Any) -> str:
    """What a value of type ``t`` is, completing "must be …": the one wording of every settings and
    contract error (``'a' or 'b'`` for an ``Enum``)."""
    return _describe(t)


def _one_of(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def check_json_types(data: Mapping[str, Any], cls: type[Any], where: str) -> None:
    """Refuse any value in ``data`` (a table for the attrs class ``cls``, such as a per-tool override
    of a ``ToolSpec``) that is not of its field's JSON type as written: the converter that builds
    ``cls`` afterwards would coerce it (a scope string into its letters, ``true`` into 1 ms).
    Unknown keys and values are left to that converter; ``ConfigError`` names the key below ``where``."""
    _check_table(data, cls, where)


def _check_table(data: Mapping[str, Any], cls: type[Any], where: str) -> None:
    attrs.resolve_types(cls)
    fields = {field.name: field.type for field in attrs.fields(cls)}
    for name, value in data.items():
        if name in fields:
            _check_value(value, fields[name], f"{where}.{name}")


def _check_value(value: Any, t: Any, key: str) -> None:
    if value is None and _is_union(t) and type(None) in get_args(t):
        return
    inner = _split(_without_none(t))[1]
    nested = inner if isinstance(inner, type) and attrs.has(inner) else None
    if nested is not None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"must be a table, got {shown_value(value)}", key=key)
        _check_table(value, nested, key)
        return
    if _is_sequence(inner) and get_args(inner) and isinstance(get_args(inner)[0], type) \
            and attrs.has(get_args(inner)[0]):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"must be a list of tables, got {shown_value(value)}", key=key)
        for index, item in enumerate(value):
            _check_value(item, get_args(inner)[0], f"{key}[{index}]")
        return
    try:
        fits = _fits(value, t)
    except TypeError:  # a type settings never hold: left to the converter
        return
    if not fits:
        raise ConfigError(f"must be {_describe(t)}, got {shown_value(value)}", key=key)


# -- errors ------------------------------------------------------------------------------------


def _problems(exc: BaseException, path: tuple[str | int, ...], t: Any
              ) -> Iterator[tuple[tuple[str | int, ...], BaseException, Any]]:
    """Every leaf of cattrs' error tree, with its path below the table and the type expected there."""
    import cattrs

    if isinstance(exc, (cattrs.ClassValidationError, cattrs.IterableValidationError)):
        located, unlocated = exc.group_exceptions()
        for sub, note in located:  # a field of a class, or an index or key of a list or table
            step = note.name if isinstance(note, cattrs.AttributeValidationNote) else note.index
            yield from _problems(sub, (*path, step), note.type)
        for sub in unlocated:
            yield from _problems(sub, path, t)
    else:
        yield path, exc, t


def _key(where: str, path: tuple[str | int, ...]) -> str:
    return where + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)


def _config_error(exc: BaseException, where: str) -> ConfigError:
    """The ``ConfigError`` for the first problem in ``exc`` (unknown keys first)."""
    import cattrs

    problems = sorted(_problems(exc, (), None), key=lambda p: not isinstance(p[1], cattrs.ForbiddenExtraKeysError))
    path, problem, t = problems[0]
    if isinstance(problem, cattrs.ForbiddenExtraKeysError):
        expected = sorted(field.name for field in attrs.fields(problem.cl) if field.init)
        return ConfigError(f"unknown key (expected one of {expected})",
                           key=_key(where, (*path, sorted(problem.extra_fields)[0])), expected=expected)
    if isinstance(problem, Invalid):
        key = _key(where, (*path, *problem.at))
        hint = problem.hint
        if hint is None and problem.expected == "a list of tables" and problem.got == "a table":
            # found by a newcomer's trial: [plugins.mcp.serve.clients] for [[…]] got a hint that
            # repeated the message ("… must be a list of tables, got a table")
            hint = double_bracket_hint(key)
        elif hint is None and problem.expected is not None:
            # What the key takes, never "set <key>" (found by a newcomer's trial: the command line's
            # generic hint said to set a key that was set, and to disable the plugin).
            hint = (f"{key} must be {problem.expected}, got {problem.got}" if problem.got is not None
                    else f"change {key} to {problem.expected}")
        return ConfigError(problem.message, key=key, hint=hint)
    if isinstance(problem, KeyError) and path:  # cattrs: a required key is missing
        return ConfigError(f"missing {path[-1]!r}: must be {_describe(t)}", key=_key(where, path))
    return ConfigError(f"invalid: {problem}", key=_key(where, path))
