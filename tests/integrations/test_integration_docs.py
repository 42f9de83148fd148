"""docs/integrations.md's examples run as written, each in a fresh interpreter, in a temporary working
directory with the host's state there too (the default envs leave this file to ``tox -e
integrations``, which has the frameworks: tests/test_docs_snippets.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_docs_snippets import FENCE  # noqa: E402  (one definition of what a fenced block is)

DOC = ROOT / "docs" / "integrations.md"
EXAMPLES = [match.group(2) for match in FENCE.finditer(DOC.read_text()) if match.group(1) == "python"]


def test_each_framework_has_an_example() -> None:
    text = "\n".join(EXAMPLES)
    for module in ("openai_agents", "pydantic_ai", "langchain"):
        assert f"amplifier_tools.integrations.{module} import" in text


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_integrations_example_runs(index: int, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"),
               PYTHONPATH=str(Path(__import__("amplifier_tools").__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-c", EXAMPLES[index]], cwd=work, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"docs/integrations.md python block {index} failed:\n{done.stderr}"


def test_no_example_hands_the_model_the_filesystem_or_bash_tools() -> None:
    # ToolHost() mounts the filesystem and bash built-ins, and an adapter offers every mounted tool
    # unless told otherwise: each example must mount only what it needs and name what the agent gets.
    for example in EXAMPLES:
        assert "ToolHost(" in example and "builtins=[" in example, example[:200]
        assert "tools=[" in example, example[:200]


def test_the_docs_warn_that_every_mounted_tool_is_offered_by_default() -> None:
    head = DOC.read_text().split("## What every adapter does")[0]
    assert "Warning" in head and "bash" in head and "tools=[...]" in head
