"""Every module under ``bench/`` imports, with or without the peers installed.

Lint and mypy do not see a name a bench module imports from a package module that moved; only
``python -m bench`` did, in CI's last environment (found when ``bench_bash`` imported
``live_members`` from its old home). Importing each module here finds it in every interpreter's run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__main__")


@pytest.mark.skipif(not MODULES, reason="no bench/ next to the tests (an sdist without it)")
def test_every_bench_module_imports() -> None:
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module('bench.' + name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'bench/{name}.py: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    # A fresh interpreter, so that a module the tests imported already cannot hide a broken import.
    done = subprocess.run([sys.executable, "-c", script, *MODULES], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout
    assert "calls" in MODULES and "bench_core" in MODULES
