"""amplifier-tools: run AI agents' tool calls under a contract.

Only re-exports the public names; each lives in its own module.
"""

from ._markers import hookimpl, hookspec
from ._version import __version__
from .converter import converter
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
