"""Command-line start-up: ``--help``, ``list`` and ``describe`` as a user runs them, beside a bare
``python -c pass`` in the same run (interleaved, medians), so the interpreter's own start-up and the
machine's load show as the reference. Target (the newcomer issue): each command ≤ 200 ms.

The commands run with their bytecode cached, as from an installed package: in a private
``PYTHONPYCACHEPREFIX``, filled by one unmeasured run of each, whatever the environment says
(``PYTHONDONTWRITEBYTECODE=1`` would otherwise make every run compile the package's modules again)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import Row, row

TARGET_MS = 200.0
COMMANDS = {"--help": ["--help"], "list": ["list"], "describe": ["describe", "local::bash"]}


def _run_ms(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000


def run(*, quick: bool = False) -> list[Row]:
    rounds = 2 if quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("AMPLIFIER_TOOLS_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        bare = [sys.executable, "-c", "pass"]
        variants: dict[str, list[str]] = {"python -c pass": bare}
        variants.update({name: [sys.executable, "-m", "amplifier_tools", *args] for name, args in COMMANDS.items()})
        for argv in variants.values():  # compiles and caches the bytecode; not measured
            _run_ms(argv, str(work), env)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, argv in variants.items():
                times[name].append(_run_ms(argv, str(work), env))
        medians = {name: statistics.median(values) for name, values in times.items()}
    reference = medians.pop("python -c pass")
    rows: list[Row] = []
    for name, ms in medians.items():
        rows.append(row(f"CLI start-up: amplifier-tools {' '.join(COMMANDS[name])}", ms, reference, "ms",
                        ratio=ms / reference, target=f"≤ {TARGET_MS:.0f} ms", met=ms <= TARGET_MS,
                        notes=f"reference: python -c pass; median of {rounds}"))
    return rows


