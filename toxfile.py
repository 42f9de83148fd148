"""tox's inline plugin for this project: find every installed CPython 3.10-3.13.

tox looks interpreters up on ``PATH``; pyenv hides the versions that are not selected behind
its shims, so a plain ``tox`` used to skip py310 and py313 and still end in "congratulations".
Loaded by tox itself (``toxfile.py`` beside ``tox.ini``), this puts each pyenv-installed
3.10-3.13 ``bin`` directory on ``PATH`` for the run, and says loudly which of the four
interpreters it cannot find, so a skipped environment is never a surprise. ``.ci/run`` uses the
same mechanism (it runs plain ``tox``) and additionally refuses to skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tox.plugin import impl

WANTED = ("3.10", "3.11", "3.12", "3.13")


def _pyenv_bins() -> list[str]:
    root = os.environ.get("PYENV_ROOT")
    if not root and shutil.which("pyenv"):
        try:
            root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            root = None
    versions = Path(root or Path.home() / ".pyenv") / "versions"
    found: dict[str, str] = {}
    for directory in sorted(versions.glob("3.*"), key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()]):
        minor = ".".join(directory.name.split(".")[:2])
        if minor in WANTED and (directory / "bin" / f"python{minor}").exists():
            found[minor] = str(directory / "bin")  # the newest patch release wins
    return list(found.values())


@impl
def tox_add_core_config(core_conf: Any, state: Any) -> None:
    bins = [b for b in _pyenv_bins() if b not in os.environ.get("PATH", "").split(os.pathsep)]
    if bins:
        os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])
    missing = [v for v in WANTED if shutil.which(f"python{v}") is None]
    if missing:
        print(f"toxfile.py: WARNING: no interpreter for Python {', '.join(missing)}: their environments "
              "will be SKIPPED (install them, e.g. with pyenv, to run the whole matrix)", file=sys.stderr)
