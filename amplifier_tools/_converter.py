"""The one converter between the attrs models and plain JSON data.

``converter.unstructure(obj)`` gives JSON-ready data; ``converter.structure(data,
cls)`` builds the attrs object back, rejecting unknown keys. Round trips are
lossless for ``ToolCall``, ``ToolResult``, ``ToolSpec`` and ``Decision``.
``ToolContext`` unstructures without its secret resolver, which is never data.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import cattrs
from cattrs.v import format_exception

from .models import ToolContext
from .plugin_settings import register_settings_hooks
from .spec import Effect, IdempotencyKeyRequirement

converter = cattrs.Converter(forbid_extra_keys=True)

converter.register_unstructure_hook(frozenset, lambda value: sorted(value))

# A value typed ``Any`` (a contract's schemas, examples and annotations, a decision's details) is
# unstructured by its runtime class, as cattrs 24.1 and later do by default; cattrs 23.2 (the floor,
# setup.cfg) handed it back as it is, so a tuple stayed a tuple and a frozenset or an attrs object
# was not JSON data (found by the floors env: ``describe`` and the converter disagreed).
converter.register_unstructure_hook_func(lambda type_: type_ is Any, converter.unstructure)


def unstructure_enum_as_value(cls: type[enum.Enum]) -> None:
    """Unstructure the members of ``cls`` (a str-valued enum) as their values (cattrs' singledispatch
    would otherwise take the ``str`` base and pass the members through)."""
    converter.register_unstructure_hook(cls, lambda value: value.value)


# The models import no converter (a host's start need not import cattrs): it is set up for them here.
unstructure_enum_as_value(Effect)
unstructure_enum_as_value(IdempotencyKeyRequirement)
register_settings_hooks(converter)

converter.register_unstructure_hook(
    ToolContext,
    lambda ctx: {
        "principal": ctx.principal,
        "role": ctx.role,
        "environment": ctx.environment,
        "scopes": sorted(ctx.scopes),
        "idempotency_key": ctx.idempotency_key,
        "call_id": ctx.call_id,
        "trace_id": ctx.trace_id,
        "session_id": ctx.session_id,
        "attributes": dict(ctx.attributes),
    },
)


def describe_structure_error(exc: BaseException) -> str:
    """One readable line per problem, each naming the field path (``$.policies.retry``)."""
    if isinstance(exc, (cattrs.ClassValidationError, cattrs.IterableValidationError)):
        return "; ".join(_field_path(line) for line in cattrs.transform_error(exc, format_exception=_format_exception))
    return str(exc)


_VALIDATOR_LINE = re.compile(r"^(?P<field>[a-z_][a-z0-9_]*) (?P<rule>must .*) @ (?P<path>\$\S*)$")


def _field_path(line: str) -> str:
    """Move the field a validator names into the path: ``limit must be positive @ $.rate_limit.limit``.

    attrs validators run in ``__init__``, so cattrs locates their errors at the
    object that holds the field; our validators start their message with it.
    """
    match = _VALIDATOR_LINE.match(line)
    if match is None:
        return line
    return f"{match['field']} {match['rule']} @ {match['path']}.{match['field']}"


def _format_exception(exc: BaseException, type_: Any) -> str:
    # Validators raise ValueError with a message that names the rule; keep it.
    if type(exc) is ValueError and exc.args:
        return str(exc.args[0])
    return format_exception(exc, type_)
