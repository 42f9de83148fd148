"""amplifier-tools: run AI agents' tool calls under a contract.

Only re-exports the public names; each lives in its own module. The names are imported when
first used (PEP 562), so ``import amplifier_tools`` and the command line's ``--help`` do not pay
for jsonschema, cattrs and pluggy until something needs them (``tests/test_cli.py`` checks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

#: Public name -> the module that defines it. No module may share a public name: importing
#: ``amplifier_tools.NAME`` would set the package's attribute ``NAME`` to that module.
_LAZY: dict[str, str] = {
    "converter": "._converter",
    **dict.fromkeys(("hookimpl", "hookspec"), "._markers"),
    **dict.fromkeys(("AuthError", "ConfigError", "ContractError", "ExecutionError", "PluginLoadError", "PolicyError",
                     "ToolError", "ToolSystemError"), ".errors"),
    "tool": ".function_tool",
    "ToolHost": ".host",
    **dict.fromkeys(("Decision", "Deny", "Modify", "ToolCall", "ToolContext", "ToolResult"), ".models"),
    "redact": ".redaction",
    **dict.fromkeys(("Budget", "CircuitBreakerPolicy", "ConcurrencyPolicy", "Deprecation", "Effect", "Example",
                     "IdempotencyKeyRequirement", "Policies", "RateLimit", "RetryPolicy", "Security", "ToolSpec"),
                    ".spec"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'amplifier_tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if TYPE_CHECKING:
    from ._converter import converter
    from ._markers import hookimpl, hookspec
    from .errors import (
        AuthError,
        ConfigError,
        ContractError,
        ExecutionError,
        PluginLoadError,
        PolicyError,
        ToolError,
        ToolSystemError,
    )
    from .function_tool import tool
    from .host import ToolHost
    from .models import Decision, Deny, Modify, ToolCall, ToolContext, ToolResult
    from .redaction import redact
    from .spec import (
        Budget,
        CircuitBreakerPolicy,
        ConcurrencyPolicy,
        Deprecation,
        Effect,
        Example,
        IdempotencyKeyRequirement,
        Policies,
        RateLimit,
        RetryPolicy,
        Security,
        ToolSpec,
    )

__all__ = [
    "AuthError", "Budget", "CircuitBreakerPolicy", "ConcurrencyPolicy", "ConfigError", "ContractError",
    "Decision", "Deny", "Deprecation", "Effect", "Example", "ExecutionError", "IdempotencyKeyRequirement",
    "Modify", "PluginLoadError", "Policies", "PolicyError", "RateLimit", "RetryPolicy", "Security",
    "ToolCall", "ToolContext", "ToolError", "ToolHost", "ToolResult", "ToolSpec", "ToolSystemError",
    "__version__", "converter", "hookimpl", "hookspec", "redact", "tool",
]
