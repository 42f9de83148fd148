"""The built-in plugins. Each is an ordinary plugin module using only the public hooks.

``BUILTIN_PLUGINS`` maps plugin name -> ``"module"`` or ``"module:Class"`` (a
class is instantiated once per host, for per-host state); the host imports and
registers them first, so entry-point plugins registered later run before them
in pluggy's LIFO order unless they use ``tryfirst``/``trylast``.
"""

from __future__ import annotations

from typing import Final

BUILTIN_PLUGINS: Final[dict[str, str]] = {
    "filesystem": "amplifier_tools.builtins.filesystem:FilesystemPlugin",
    "bash": "amplifier_tools.builtins.bash:BashPlugin",  # after filesystem: uses its fs.path_rules
    "policy": "amplifier_tools.builtins.policy:PolicyPlugin",
    "audit": "amplifier_tools.builtins.audit:AuditPlugin",
    "mcp": "amplifier_tools.mcp:McpImportPlugin",  # inert (no SDK import) unless servers are configured
}
