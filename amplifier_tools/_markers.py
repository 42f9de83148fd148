"""The pluggy markers of the ``amplifier_tools`` project.

Kept apart from :mod:`amplifier_tools.hookspecs` so that a plugin importing
``hookimpl`` never has to import the specification module first.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "amplifier_tools"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
