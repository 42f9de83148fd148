"""``[plugins.policy]``: the settings of the policy plugin — its rules, its default action, the
idempotency window and the policy state store.

Structured by ``plugin_settings.structure_settings``; docs/policy.md describes each key. The
policies themselves come from each tool's contract, not from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import attrs

from ...plugin_settings import Expect, Invalid, Number, settings_class
from .rules import Rule

STORE_HINT = 'e.g. store = "redis://127.0.0.1:6379/0" (rediss:// for TLS, unix:///path/redis.sock)'


def parse_store(value: Any) -> str:
    """``store``: ``memory``, ``sqlite`` or a Redis URL, its scheme in any case (as redis-py takes it).
    A refused value is never shown: a URL may hold a password (found by attack)."""
    if value in ("memory", "sqlite"):
        return str(value)
    if isinstance(value, str):
        scheme, separator, rest = value.partition("://")
        if separator and scheme.lower() in ("redis", "rediss", "unix"):
            return f"{scheme.lower()}://{rest}"
    raise Invalid("must be 'memory', 'sqlite' or a URL starting redis://, rediss:// or unix:// (the value is not "
                  "shown: it may hold a password)", hint=STORE_HINT)


def _numbered(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    """The rules, each without a name named by its place in the list: ``rule 1``, ``rule 2``…"""
    return tuple(rule if rule.name else attrs.evolve(rule, name=f"rule {place}") for place, rule in enumerate(rules, 1))


Store = Annotated[str, Expect("'memory', 'sqlite' or a Redis URL", parse=parse_store, hint=STORE_HINT)]
OnUnavailable = Annotated[Literal["fail", "local"], Expect(
    "'fail' or 'local'", hint="'fail' refuses calls while the store is down; 'local' falls back to this process")]
Prefix = Annotated[str, Expect("a non-empty string", bool, hint='one prefix per deployment, e.g. "team-a:prod:"')]


@settings_class
@attrs.frozen
class PolicySettings:
    """The plugin's settings; the defaults are the values of an empty table."""

    rules: Annotated[tuple[Rule, ...], Expect("a list of rule tables")] = attrs.field(default=(), converter=_numbered)
    default_action: Literal["allow", "deny"] = "allow"
    idempotency_window_ms: Number = 24 * 3600 * 1000.0
    store: Store = "memory"  # the command line's default is "sqlite" (capability policy.default_store)
    store_unavailable: OnUnavailable = "fail"
    store_prefix: Prefix = "amplifier-tools:"
    store_timeout_ms: Number = 2000.0
