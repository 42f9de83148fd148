"""``[plugins.filesystem]``: the settings of the filesystem plugin and its six tools.

Structured by ``plugin_settings.structure_settings``; docs/filesystem.md describes each key.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import attrs

from ...plugin_settings import Count, Expect, Invalid, settings_class
from .paths import DEFAULT_WRITE_DENIED

MODE_HINT: Final = 'write permission bits in octal, e.g. new_file_mode = 0o640 or "0640"'


def parse_mode(value: Any) -> int:
    """``new_file_mode``: permission bits only (``0o640`` in TOML, or the string ``"0640"``); setuid,
    setgid and sticky bits are refused, since the tools never create such files."""
    if isinstance(value, str):
        try:
            value = int(value.removeprefix("0o"), 8)
        except ValueError:
            raise Invalid(f"{value!r} is not an octal mode; {MODE_HINT}", hint=MODE_HINT) from None
    if type(value) is not int or not 0 <= value <= 0o777:
        shown = oct(value) if type(value) is int else repr(value)
        raise Invalid(f"{shown} is not a permission mode between 0o000 and 0o777 (setuid, setgid and sticky bits "
                      f"are never set); {MODE_HINT}", hint=MODE_HINT)
    return value


#: Paths or path patterns (relative to the working directory, ``~`` expanded), none of them empty.
Paths = Annotated[tuple[str, ...], Expect("a list of paths or patterns", lambda items: "" not in items)]
Mode = Annotated[int, Expect("permission bits in octal", parse=parse_mode)]


@settings_class
@attrs.frozen
class FilesystemSettings:
    """The plugin's settings; the defaults are the values of an empty table."""

    allowed_read_paths: Paths | None = None  # None: the working directory
    allowed_write_paths: Paths | None = None
    denied_paths: Paths = ()
    write_denied_paths: Paths = DEFAULT_WRITE_DENIED
    allow_hardlinks: bool = False
    require_read_before_write: bool = False
    max_size: Count = 10 * 1024 * 1024
    default_limit: Count = 2000
    max_line_chars: Count = 2000
    max_results: Count = 1000
    max_matches: Count = 200
    new_file_mode: Mode | None = None  # None: 0o644 & ~umask
