"""Running the ``amplifier-tools`` command line in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import amplifier_tools

PACKAGE_ROOT = Path(amplifier_tools.__file__).resolve().parent.parent
# The repository's example plugins need config: where they are installed (tox -e plugins, a
# developer's env) they would stop every host that does not configure them. Only the tests that
# are about them keep them.
EXAMPLE_PLUGIN_NAMES = "approval,http-fetch"


def cli_environ(cwd: Path, *, site: Path | None = None, examples: bool = False,
                env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a CLI run in ``cwd``: no inherited AMPLIFIER_TOOLS_* settings."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
    if not examples:
        environ["AMPLIFIER_TOOLS_DISABLE_PLUGINS"] = EXAMPLE_PLUGIN_NAMES
    environ["PYTHONPATH"] = os.pathsep.join([*([str(site)] if site else []), str(cwd), str(PACKAGE_ROOT)])
    environ.update(env or {})
    return environ


def cli(cwd: Path, *args: str, stdin: str | None = None, site: Path | None = None, examples: bool = False,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``amplifier-tools ARGS`` in ``cwd``; its exit status and output."""
    return subprocess.run([sys.executable, "-m", "amplifier_tools", *args], cwd=cwd,
                          env=cli_environ(cwd, site=site, examples=examples, env=env),
                          input=stdin, capture_output=True, text=True, timeout=120)
