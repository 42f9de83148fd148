"""Regressions found by review of the day's changes (ToolContext field checks, retries, host lifecycle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import ToolsPlugin

from amplifier_tools import ToolContext, ToolResult


class Echo:
    name = "echo"
    description = "Says it ran."
    input_schema = {"type": "object"}

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.runs += 1
        return ToolResult(True, "ran")


@pytest.mark.parametrize("scopes", [5, None, ["fs:read"]])
async def test_scopes_changed_around_the_constructor_to_no_set_is_invalid_context_not_raised(
        host_factory: Any, scopes: Any) -> None:
    """The host's own check of a context changed with ``object.__setattr__`` iterated ``scopes``:
    ``scopes=5`` made ``host.call`` raise ``TypeError`` (it must never raise); ``None`` and a list
    went on to the policies, whose ``required <= context.scopes`` fails on them."""
    tool = Echo()
    host = await host_factory(ToolsPlugin(tool))
    for session_id in (None, "s"):
        context = ToolContext(session_id=session_id)
        object.__setattr__(context, "scopes", scopes)
        result = await host.call("echo", {}, context=context)
        assert (result.error or {}).get("code") == "invalid_context", result
        assert result.error["message"].startswith("context: ToolContext.scopes must be a set")
    assert tool.runs == 0


UNICODE_MODULE = '''
from amplifier_tools import ToolResult

class Greet:
    name = "local::demo.greet"
    description = "Returns text beyond ASCII."
    input_schema = {"type": "object"}

    async def execute(self, input):
        return ToolResult(output={"greeting": "h\\u00e9llo \\u2713"})

async def mount(coordinator, config):
    await coordinator.mount("tools", Greet())
'''


def test_call_json_prints_on_a_terminal_that_is_not_utf8(tmp_path: Path) -> None:
    """``call --json`` wrote its JSON escaped to ASCII (the stdlib's default); writing it through
    ``json_text`` (``ensure_ascii=False``) made it fail as "a bug", exit 1, on a stdout that cannot
    encode the output (``PYTHONIOENCODING=ascii``, a Latin-1 locale, a Windows console) after the
    call had succeeded and was recorded."""
    (tmp_path / "greet_tools.py").write_text(UNICODE_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "greet_tools"\n')
    done = cli(tmp_path, "call", "local::demo.greet", "{}", "--json", env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"greeting": "h\u00e9llo \u2713"}
