"""Docs and hooks stay in step (as datasette does): every hookspec is documented
with its exact signature, the generated reference is current, and each hook has
a test of its own."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_hooks", ROOT / "docs" / "gen_hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
SPECS = GEN.hookspecs()


def test_every_hookspec_is_found() -> None:
    assert {name for name, _, _ in SPECS} >= {"mount", "tool_pre", "tool_post", "tool_error"}


@pytest.mark.parametrize(("name", "signature"), [(n, s) for n, s, _ in SPECS])
def test_hook_is_documented_with_its_signature(name: str, signature: str) -> None:
    assert f"## `{signature}`" in (ROOT / "docs" / "hooks.md").read_text()


def test_hook_reference_is_up_to_date() -> None:
    assert (ROOT / "docs" / "hooks.md").read_text() == GEN.render(), "run: python docs/gen_hooks.py"


@pytest.mark.parametrize("name", [n for n, _, _ in SPECS])
def test_hook_has_a_test_of_its_own(name: str) -> None:
    pattern = re.compile(rf"def test_hook_{name}(_|\()")
    assert any(pattern.search(p.read_text()) for p in (ROOT / "tests").glob("test_*.py")), (
        f"no test named test_hook_{name}_* in tests/")


def test_published_config_schema_is_current() -> None:
    import json

    from amplifier_tools.config import CONFIG_SCHEMA

    assert json.loads((ROOT / "docs" / "config.schema.json").read_text()) == CONFIG_SCHEMA


def test_example_config_is_valid() -> None:
    from amplifier_tools.config import load_config_file

    config = load_config_file(ROOT / "docs" / "amplifier-tools.example.toml")
    assert config["context"]["principal"] == "local-user"
