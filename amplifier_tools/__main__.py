"""``python -m amplifier_tools`` runs the command line.

Python puts the current directory first on ``sys.path`` for ``-m`` (unless ``-P`` or
``PYTHONSAFEPATH``): run in a working directory, every module a tool wrote there (``pluggy.py``,
``attrs/``) is imported by the host in place of the installed one, before any check (found by
attack: a ``pluggy.py`` a tool wrote ran in the host at the next start). That has already happened
by the time this runs, so it is said, not prevented: on stderr, with the way to run without it
(not when ``PYTHONPATH`` names the directory too: then it is imported by the user's choice).
"""

import os
import sys

from .cli import main


def _current_directory_imported() -> bool:
    if getattr(sys.flags, "safe_path", False) or not sys.path:
        return False
    try:
        here = os.path.realpath(os.getcwd())
        # on PYTHONPATH too: imported by the user's own choice, which -P would not change
        chosen = {os.path.realpath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
        return os.path.realpath(sys.path[0] or os.curdir) == here and here not in chosen
    except OSError:
        return False


if _current_directory_imported():
    safe = "the amplifier-tools command" + (", or python -P -m amplifier_tools" if sys.version_info >= (3, 11) else "")
    print(f"warning: the current directory {os.getcwd()} is on sys.path (python -m adds it): a module written "
          "there — by a tool, where tools can write — is imported by the host in place of the installed one, "
          f"before any check; run {safe}", file=sys.stderr)
sys.exit(main())
