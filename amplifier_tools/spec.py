"""The tool contract: ``ToolSpec`` and its parts (effects, policies, security).

A spec is data only. It is derived once, when a tool is mounted, from a
``ToolSpec`` the tool carries (``tool.spec``) or from the optional attributes
of a seed-style tool (``name``, ``description``, ``input_schema`` or
``get_schema()``, ``output_schema``, ``version``, ``effect`` ...). Nothing here
runs per call.
"""

from __future__ import annotations

import enum
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import attrs

from .errors import ContractError

#: Canonical tool names: segments separated by ``::`` (origin, server, tool),
#: each made of letters, digits, ``_``, ``-`` and ``.``.
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.\-]+(::[A-Za-z0-9_.\-]+)*$")
SEMVER_PATTERN: Final = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
)


class Effect(str, enum.Enum):
    """What running the tool does to the world; decides what may be retried."""

    Pure = "Pure"
    IdempotentWrite = "IdempotentWrite"
    NonIdempotentWrite = "NonIdempotentWrite"
    ExternalSideEffects = "ExternalSideEffects"

    @property
    def retry_safe(self) -> bool:
        """Whether automatic retries can ever be allowed for this effect."""
        return self in (Effect.Pure, Effect.IdempotentWrite)


class IdempotencyKeyRequirement(str, enum.Enum):
    """Whether a call must carry ``ToolContext.idempotency_key``."""

    required = "required"
    optional = "optional"
    none = "none"


_E = TypeVar("_E", bound=enum.Enum)


def _to_enum(cls: type[_E], field: str, value: Any) -> _E:
    """``value`` as a member of ``cls`` (a member or its value); anything else a ``ValueError`` naming
    ``field``, the values it takes and the one meant (found by a newcomer's trial:
    ``effect="Puree"`` said only "'Puree' is not a valid Effect")."""
    try:
        return cls(value)
    except ValueError:
        pass
    from .errors import did_you_mean
    from .plugin_settings import describe_type

    guess = did_you_mean(value, [member.value for member in cls]) if isinstance(value, str) else None
    raise ValueError(f"{field} must be {describe_type(cls)}, got {value!r}" + (f" ({guess})" if guess else ""))


def to_effect(value: Any) -> Effect:
    """``Effect(value)``, refusing a value that is none with a ``ValueError`` that names the field."""
    return _to_enum(Effect, "effect", value)


def _to_idempotency_key(value: Any) -> IdempotencyKeyRequirement:
    return _to_enum(IdempotencyKeyRequirement, "idempotency_key", value)


def _number(attribute: attrs.Attribute[Any], value: Any, *, integer: bool = False) -> None:
    """``TypeError`` naming the field unless ``value`` is an integer (or, unless ``integer``, a real
    number: NumPy's count as both); a bool is neither (found by attack:
    ``RetryPolicy(max_attempts=True)`` was one attempt, and ``max_attempts=2.5`` failed a time
    budget's reservation with ``TypeError`` at every call)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        raise TypeError(f"{attribute.name} must be {'an integer' if integer else 'a number'}, got {value!r}")


def is_finite(value: Any) -> bool:
    """Whether the real number ``value`` is finite as the host computes with it: a float. Found by
    attack: an integer past a float's range (``timeout_ms = 10**400``) passed as finite, and every
    call of the tool then failed with ``OverflowError`` (``internal``, ``hook_failed``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    # ``not value > 0`` also refuses NaN (it compares false with everything); infinity is refused too.
    if value is None:
        return
    _number(attribute, value)
    if not value > 0 or not is_finite(value):
        raise ValueError(f"{attribute.name} must be positive and finite, got {shown_number(value)}")


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _number(attribute, value, integer=True)
    _positive(instance, attribute, value)


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    _number(attribute, value)
    if not value >= 0 or not is_finite(value):
        raise ValueError(f"{attribute.name} must not be negative, and must be finite, got {shown_number(value)}")


def shown_number(value: Any) -> str:
    """``value`` for a message: an integer past a float's range by its size (its digits may be more
    than ``repr`` writes: ``ValueError`` past ``sys.get_int_max_str_digits()``)."""
    if isinstance(value, numbers.Integral) and not is_finite(value):
        return f"an integer of {int(value).bit_length()} bits (past the largest float, about 1.8e308)"
    return repr(value)


def _flag(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):  # found by attack: jitter="no" turned jitter on
        raise TypeError(f"{attribute.name} must be true or false, got {value!r}")


@attrs.frozen(slots=True)
class RetryPolicy:
    """Automatic retries for retryable errors; only ever applied to ``Pure`` and
    keyed ``IdempotentWrite`` tools."""

    max_attempts: int = attrs.field(default=3, validator=_positive_int)
    initial_backoff_ms: float = attrs.field(default=100.0, validator=_non_negative)
    max_backoff_ms: float = attrs.field(default=5_000.0, validator=_non_negative)
    multiplier: float = attrs.field(default=2.0, validator=_positive)
    jitter: bool = attrs.field(default=True, validator=_flag)


@attrs.frozen(slots=True)
class RateLimit:
    """At most ``limit`` calls per ``interval_ms``, per tool or per principal."""

    limit: int = attrs.field(validator=_positive_int)
    interval_ms: float = attrs.field(default=1_000.0, validator=_positive)
    per: str = attrs.field(default="tool", validator=attrs.validators.in_(("tool", "principal")))
    queue: bool = attrs.field(default=False, validator=_flag)


@attrs.frozen(slots=True)
class ConcurrencyPolicy:
    """At most ``limit`` calls in flight; excess calls queue until their deadline
    (``queue=True``) or are rejected at once."""

    limit: int = attrs.field(validator=_positive_int)
    queue: bool = attrs.field(default=True, validator=_flag)


@attrs.frozen(slots=True)
class CircuitBreakerPolicy:
    """Open after ``failure_threshold`` failures (or ``failure_rate`` over at
    least ``min_calls``) within ``window_ms``; probe again after ``cooldown_ms``."""

    failure_threshold: int = attrs.field(default=5, validator=_positive_int)
    failure_rate: float | None = attrs.field(default=None)
    min_calls: int = attrs.field(default=10, validator=_positive_int)
    window_ms: float = attrs.field(default=60_000.0, validator=_positive)
    cooldown_ms: float = attrs.field(default=30_000.0, validator=_positive)

    @failure_rate.validator
    def _check_rate(self, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is not None:
            _number(attribute, value)
        if value is not None and not 0.0 < value <= 1.0:
            raise ValueError(f"failure_rate must be in (0, 1], got {value!r}")


@attrs.frozen(slots=True)
class Budget:
    """Calls and execution seconds allowed per principal, role or environment per window."""

    per: str = attrs.field(validator=attrs.validators.in_(("principal", "role", "environment")))
    max_calls: int | None = attrs.field(default=None, validator=_positive_int)
    max_seconds: float | None = attrs.field(default=None, validator=_positive)
    window_ms: float = attrs.field(default=3_600_000.0, validator=_positive)


@attrs.frozen(slots=True)
class Policies:
    """Policy defaults declared by the tool; host configuration overrides them per tool."""

    timeout_ms: float | None = attrs.field(default=None, validator=_positive)
    retry: RetryPolicy | None = None
    rate_limit: RateLimit | None = None
    concurrency: ConcurrencyPolicy | None = None
    circuit_breaker: CircuitBreakerPolicy | None = None
    budgets: tuple[Budget, ...] = ()


@attrs.frozen(slots=True)
class Security:
    """Scopes a caller needs, secrets the tool uses, and what to redact.

    ``redaction_rules`` are paths such as ``arguments/password`` or
    ``output/headers/*`` (``*`` matches one segment of any name).
    """

    required_scopes: tuple[str, ...] = ()
    secret_refs: tuple[str, ...] = ()
    redaction_rules: tuple[str, ...] = ()
    data_classification: str = attrs.field(
        default="internal",
        validator=attrs.validators.in_(("public", "internal", "confidential", "restricted")),
    )


@attrs.frozen(slots=True)
class Deprecation:
    """Deprecation notice: since which version, until when, and what replaces it."""

    since: str | None = None
    sunset: str | None = None
    replacement: str | None = None
    message: str | None = None


def _check_example_files(instance: Any, attribute: Any, files: dict[str, str]) -> None:
    """Example files are relative paths inside the workspace, with text content."""
    for path, content in files.items():
        parts = path.split("/")
        if not isinstance(content, str) or not path or path.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"examples: files: {path!r} must be a relative path inside the workspace (no '..', "
                             "no leading '/') mapped to text content")


@attrs.frozen(slots=True)
class Example:
    """A typical or edge-case input, with its expected output or error code.

    ``files`` are the files (relative path -> text) the example expects in the working
    directory: ``validate`` writes them into the temporary workspace it runs examples in.
    """

    input: dict[str, Any]
    output: Any = None
    error_code: str | None = None
    description: str = ""
    files: dict[str, str] = attrs.field(factory=dict, validator=_check_example_files)


def _structure(value: Any, cls: type[Any]) -> Any:
    """``value`` as an instance of ``cls``: as is, or structured from plain data (by the one converter,
    imported here: a host that mounts only tools whose contracts are attrs instances and plain
    examples never imports cattrs)."""
    if value is None or isinstance(value, cls):
        return value
    from ._converter import converter, describe_structure_error
    from .plugin_settings import check_json_types

    if isinstance(value, Mapping):
        # Types as written first, as for host configuration: the converter would coerce them (found
        # by attack: a contract's retry ``max_attempts = true`` became 1 attempt, ``2.5`` became 2,
        # ``jitter = "no"`` became jitter on — each silently another policy than the one written).
        try:
            check_json_types(value, cls, "$")
        except ValueError as exc:
            raise ValueError(f"invalid {cls.__name__.lower()}: {exc}") from exc
    try:
        return converter.structure(value, cls)
    except Exception as exc:  # name the field, not just the class
        raise ValueError(f"invalid {cls.__name__.lower()}: {describe_structure_error(exc)}") from exc


def _to_policies(value: Any) -> Policies:
    result: Policies = _structure(value, Policies)
    return result


def _to_security(value: Any) -> Security:
    result: Security = _structure(value, Security)
    return result


def _to_deprecation(value: Any) -> Deprecation | None:
    result: Deprecation | None = _structure(value, Deprecation)
    return result


def _to_tags(values: Any) -> tuple[str, ...]:
    return tuple(values)


def _to_examples(values: Any) -> tuple[Example, ...]:
    return tuple(_plain_example(value) or _structure(value, Example) for value in values)


_EXAMPLE_KEYS: Final = frozenset({"input", "output", "error_code", "description", "files"})


def _is_str_table(value: Any) -> bool:
    return type(value) is dict and all(type(key) is str for key in value)


def _plain_example(value: Any) -> Example | None:
    """An example given as plain data whose every value already has its field's type (as the built-in
    tools' are), built as the converter would build it (the tables copied, ``output`` as it is);
    ``None`` for anything else, which the converter structures or refuses."""
    if not (type(value) is dict and "input" in value and value.keys() <= _EXAMPLE_KEYS
            and _is_str_table(value["input"])):
        return None
    error_code = value.get("error_code")
    description = value.get("description", "")
    files = value.get("files", {})
    if not ((error_code is None or type(error_code) is str) and type(description) is str and _is_str_table(files)
            and all(type(content) is str for content in files.values())):
        return None
    return Example(dict(value["input"]), value.get("output"), error_code, description, dict(files))


def _check_name(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise ValueError(
            f"tool name {value!r} is not valid: use segments of letters, digits, "
            "'_', '-', '.' separated by '::' (e.g. 'local::fs.write')"
        )


def _check_version(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not SEMVER_PATTERN.match(value):
        raise ValueError(f"version {value!r} is not a SemVer version (e.g. '1.2.3')")


def _check_schema_type(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{attribute.name} must be a JSON Schema object, got {type(value).__name__}")


def _check_annotations(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not (isinstance(value, dict) and all(isinstance(key, str) for key in value)):
        raise ValueError(f"annotations must be an object with string keys, got {type(value).__name__}")


@attrs.frozen(slots=True)
class ToolSpec:
    """A tool's contract: identity, I/O schemas, effect, policies and security."""

    name: str = attrs.field(validator=_check_name)
    description: str = ""
    version: str = attrs.field(default="0.0.0", validator=_check_version)
    title: str | None = None
    owner: str | None = None
    tags: tuple[str, ...] = attrs.field(default=(), converter=_to_tags)
    input_schema: dict[str, Any] = attrs.field(
        factory=lambda: {"type": "object"}, validator=_check_schema_type
    )
    output_schema: dict[str, Any] | None = attrs.field(default=None, validator=_check_schema_type)
    examples: tuple[Example, ...] = attrs.field(default=(), converter=_to_examples)
    effect: Effect = attrs.field(default=Effect.ExternalSideEffects, converter=to_effect)
    idempotency_key: IdempotencyKeyRequirement = attrs.field(
        default=IdempotencyKeyRequirement.none,
        converter=_to_idempotency_key,
    )
    policies: Policies = attrs.field(default=Policies(), converter=_to_policies)
    security: Security = attrs.field(default=Security(), converter=_to_security)
    deprecation: Deprecation | None = attrs.field(default=None, converter=_to_deprecation)
    #: MCP tool annotations as the tool's source gave them (an imported tool: its server's hints,
    #: unchanged). Shown to MCP clients and by ``describe``; never read by policy, which follows
    #: ``effect``. ``None``: MCP definitions derive the hints from ``effect``.
    annotations: dict[str, Any] | None = attrs.field(default=None, validator=_check_annotations)

    @property
    def origin(self) -> str:
        """Where the tool comes from: the first ``::`` segment (``local``, ``mcp``),
        or ``local`` for a name without a namespace."""
        head, sep, _ = self.name.partition("::")
        return head if sep else "local"


#: Attributes of a seed-style tool object copied into its spec when present.
_OPTIONAL_TOOL_ATTRIBUTES: Final = (
    "version", "title", "owner", "tags", "output_schema", "examples", "effect",
    "idempotency_key", "policies", "security", "deprecation",
)


def spec_from_tool(tool: Any, *, name: str | None = None) -> ToolSpec:
    """Derive the contract of a mounted tool object.

    A tool carrying a ``spec`` attribute that is a ``ToolSpec`` uses it as is
    (``name`` overrides its name). Otherwise the spec is built from the
    tool's attributes; missing ones take safe defaults (effect
    ``ExternalSideEffects``, so nothing is retried automatically). Raises
    ``ContractError`` naming the tool and the field when something is invalid.
    """
    own = getattr(tool, "spec", None)
    if isinstance(own, ToolSpec):
        return own if name is None or name == own.name else attrs.evolve(own, name=name)
    tool_name = name or getattr(tool, "name", None)
    label = tool_name if isinstance(tool_name, str) else repr(tool)
    if not isinstance(tool_name, str):
        raise ContractError(f"tool {label} has no string 'name'", code="invalid_tool")
    if not callable(getattr(tool, "execute", None)):
        raise ContractError(f"tool {label!r} has no callable 'execute'", code="invalid_tool")
    schema = getattr(tool, "input_schema", None)
    # An empty ``input_schema`` inherited from the seed's Protocol must not hide ``get_schema()``.
    if not schema and callable(getattr(tool, "get_schema", None)):
        schema = tool.get_schema()
    if schema is None or schema == {}:
        schema = {"type": "object"}
    fields: dict[str, Any] = {
        "name": tool_name,
        "description": getattr(tool, "description", "") or "",
        "input_schema": schema,
    }
    for attribute in _OPTIONAL_TOOL_ATTRIBUTES:
        value = getattr(tool, attribute, None)
        if value is not None:
            fields[attribute] = value
    try:
        # The field converters accept both attrs instances (Policies(...)) and plain data.
        return ToolSpec(**fields)
    except Exception as exc:  # validators name the field; cattrs groups nested errors
        from ._converter import describe_structure_error

        raise ContractError(
            f"tool {label!r} has an invalid contract: {describe_structure_error(exc)}",
            code="invalid_contract",
        ) from exc
