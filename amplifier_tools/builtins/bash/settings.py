"""``[plugins.bash]``: the settings of the bash plugin, as configured.

Structured by ``plugin_settings.structure_settings``; docs/bash.md describes each key. The
plugin resolves them at mount (paths, the user, the sandbox probe) into the tool's
``tool.Settings``.
"""

from __future__ import annotations

from typing import Annotated, Literal

import attrs

from ...plugin_settings import Count, EnvNames, EnvTable, Expect, Invalid, Seconds, Strings, settings_class

#: "none" is a deprecated alias of "off" (logged at mount).
Sandbox = Annotated[Literal["auto", "bubblewrap", "off", "none"],
                    Expect("'auto' (bubblewrap where it works, else calls fail), 'bubblewrap' (required) or 'off' "
                           "(unconfined)")]


@settings_class
@attrs.frozen
class BashSettings:
    """The plugin's settings; the defaults are the values of an empty table."""

    default_timeout: Seconds = attrs.field(default=120.0)
    max_timeout: Seconds = 600.0
    kill_grace: Seconds = 2.0
    max_output_bytes: Count = 32 * 1024
    spill_dir: Annotated[str, Expect("a directory path", bool)] | None = None
    allowed_paths: Strings | None = None  # None: the filesystem plugin's write roots, else the working directory
    env_allowlist: EnvNames = ()
    env: EnvTable = attrs.field(factory=dict)
    secrets: EnvTable = attrs.field(factory=dict)
    allow: Strings = ()
    deny: Strings = ()
    sandbox: Sandbox = "auto"
    sandbox_network: bool = False
    sandbox_read_paths: Strings = ()
    sandbox_write_paths: Strings = ()
    user: Annotated[str | int, Expect("a user name or uid")] | None = None
    max_cpu_seconds: Count | None = None
    max_memory_bytes: Count | None = None
    max_processes: Count | None = None
    max_file_size_bytes: Count | None = None

    @default_timeout.validator
    def _within_max_timeout(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value > self.max_timeout:
            raise Invalid(f"must not exceed max_timeout ({self.max_timeout:g}), got {value:g}", at=(attribute.name,))
