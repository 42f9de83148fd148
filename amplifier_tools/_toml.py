"""The TOML reader: ``tomllib``, or ``tomli`` before Python 3.11.

Imported by ``config`` when it reads a file, not with it: a command run where there is no
configuration file (``list`` in a new directory) does not pay for the parser (it imports
``datetime`` too).
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from tomllib import TOMLDecodeError, loads
else:  # pragma: no cover - py310 only
    from tomli import TOMLDecodeError, loads

__all__ = ["TOMLDecodeError", "loads"]
