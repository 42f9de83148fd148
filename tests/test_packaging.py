"""What the built distributions carry (found by a new-user trial of the built wheel and sdist):
the sdist held ``tests/test_*.py`` only, setuptools' default, so an unpacked sdist could not
collect its own tests (no ``conftest.py``, helpers or fixtures; the docs they read); neither held a
license file, though the metadata says MIT."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_sdist_can_run_its_tests_and_both_distributions_carry_the_license(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"  # the build writes egg-info and build/ beside the sources
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(".git", ".tox", "*.egg-info", "build", "dist",
                                                                   "__pycache__", ".venv", "results"))
    # No isolation: the test env has setuptools (the test extra), and a test must not download it.
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--sdist",
                           "--wheel", "--outdir", str(tmp_path), str(checkout)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [sdist] = tmp_path.glob("*.tar.gz")
    [wheel] = tmp_path.glob("*.whl")
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    needed = {"LICENSE", "tox.ini", "toxfile.py", "tests/conftest.py", "tests/helpers.py", "tests/mcp_helpers.py",
              "tests/bash_helpers.py", "tests/cli_helpers.py", "docs/gen_hooks.py", "docs/config.schema.json",
              "docs/amplifier-tools.example.toml", "bench/readme.py"}
    assert needed <= names, sorted(needed - names)
    assert any(name.startswith("tests/mcp_fixtures/") for name in names)
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = archive.namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in wheel_names), wheel_names
    assert "amplifier_tools/py.typed" in wheel_names
