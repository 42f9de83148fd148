"""The host's ``[secrets]`` table: each reference names the environment variable holding its value.

``EnvironmentSecrets`` is the resolver a host's default context gets. It also says why a
reference did not resolve (``why_missing``), so a ``missing_secret`` error and a ``token_ref``
that does not resolve name the setting to fix: the key missing from ``[secrets]``, or the
variable that is not set. Neither ever shows a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, final


@final
class EnvironmentSecrets:
    """Resolve a secret reference through ``[secrets]`` (reference -> variable) and the environment,
    read at each call (a variable set after start is seen)."""

    __slots__ = ("table",)

    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = dict(table)

    def __call__(self, name: str) -> str | None:
        variable = self.table.get(name)
        return os.environ.get(variable) if variable else None

    def variables(self) -> list[str]:
        """The values of the variables the table names that are set now."""
        return [os.environ[v] for v in self.table.values() if v in os.environ]

    def why_missing(self, name: str) -> tuple[str, str]:
        """Why ``name`` does not resolve, as ``(reason, hint)``; the reason does not repeat ``name``
        (a caller that must not show it, a ``token_ref`` that may be a token, can use it as it is)."""
        variable = self.table.get(name)
        if variable is None:
            known = ", ".join(sorted(map(repr, self.table))) or "none"
            return (f"is not a key of the host's [secrets] ([secrets] keys: {known})",
                    "a reference names a [secrets] entry, and that entry names the environment variable "
                    'holding the value: [secrets] my_ref = "MY_VARIABLE"')
        return (f"names, in [secrets], the environment variable {variable!r}, which is not set",
                f"set {variable} in the environment the host starts in")


def why_missing(resolver: Any, name: str) -> tuple[str, str]:
    """Why ``resolver`` (a context's ``secrets``) did not resolve ``name``: its own answer when it
    has one (``EnvironmentSecrets``, also inside a recording wrapper), else a general one."""
    explain = getattr(resolver, "why_missing", None)
    if explain is not None:
        answer: tuple[str, str] | None = explain(name)
        if answer is not None:
            return answer
    if resolver is None:
        return ("could not be resolved: the context has no secrets",
                'configure [secrets] in the host\'s config (my_ref = "MY_VARIABLE"), or pass '
                "ToolContext(secrets=...)")
    return "could not be resolved: the context's resolver returned nothing", \
        "the resolver passed as ToolContext(secrets=...) has no value for it"
