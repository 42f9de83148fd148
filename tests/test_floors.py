"""``tests/constraints-floors.txt`` (what ``tox -e floors`` installs) pins every core dependency of
setup.cfg to its declared lower bound: the file is kept by hand, and this keeps the two in step."""

from __future__ import annotations

import configparser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _floors() -> dict[str, Version]:
    """Each ``install_requires`` entry's lower bound (``>=``), by normalized name; entries whose
    marker excludes Python 3.11 (the floors env's interpreter) are left out."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    floors = {}
    for line in config["options"]["install_requires"].splitlines():
        if not line.strip():
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"python_version": "3.11"}):
            continue
        (lower,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        floors[_normal(requirement.name)] = Version(lower)
    return floors


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_the_floors_constraints_pin_every_core_dependency_to_its_lower_bound() -> None:
    pins = {}
    for line in (ROOT / "tests" / "constraints-floors.txt").read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_normal(name)] = Version(version)
    assert pins == _floors()
