"""A benchmark run leaves nothing in the user's state directory.

Found while measuring: every ``python -m bench`` and ``python -m bench.calls`` run started hosts on
throwaway working directories, and each left its audit log (and trust records) under
``~/.local/state/amplifier-tools/workspaces/`` for good: two days of runs had left 2,300
directories and 1.8 GB there. The runs now keep their hosts' state in a directory of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [
    ["-m", "bench", "--quick", "--only", "policy"],
    ["-m", "bench.calls", "default", "10"],
], ids=["bench", "bench.calls"])
def test_a_bench_run_keeps_no_state_in_the_users_home(tmp_path: Path, command: list[str]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env["HOME"] = str(home)
    if command[1] == "bench":
        command = [*command, "--json", str(tmp_path / "results.json")]
    done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (home / ".local" / "state").exists(), sorted(str(p) for p in home.rglob("*"))
    assert os.environ.get("XDG_STATE_HOME") != str(home)  # the test's own environment is untouched
