"""``host_tool`` under attack again: what was found.

- ``host_tool`` rendered an SDK tool's structured output to text (``content.render``) without the
  host's secrets. ``render`` cuts a URI at 500 characters and folds whitespace; redacting the
  text afterwards (the host's scrub) no longer finds a secret cut in two there, so the head of a
  caller's secret in a long file URL reached the model and the audit record's output. ``render``
  now gets the secrets the call's context resolver records into (the host's registry), and
  redacts them before it cuts, as the MCP client's rendering does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents import ToolOutputFileContent, ToolOutputText, function_tool
from integration_helpers import audit_records

from amplifier_tools import ToolContext, ToolHost
from amplifier_tools.integrations.openai_agents import host_tool

SECRET = "sk-live-0123456789abcdefghijklmnopqrstuv"


@function_tool
def export() -> list[Any]:
    """A file whose URL carries the caller's token, cut by the rendering right in the token."""
    url = "https://files.example.com/" + "a" * (500 - len("https://files.example.com/") - 10) + SECRET
    return [ToolOutputText(text="exported"), ToolOutputFileContent(file_url=url, filename="export.csv")]


async def test_host_tool_redacts_a_secret_before_its_rendering_cuts_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with ToolHost(plugins=[host_tool(export, effect="Pure")], builtins=["audit"], entry_points=False,
                        discover=False, working_dir=work,
                        config={"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}},
                        ) as host:
        result = await host.call("export", {}, context=ToolContext(secrets={"EXPORT_TOKEN": SECRET}))
        records = audit_records(host)
    assert result.success
    head = SECRET[:10]
    assert head not in result.output, result.output  # before: the token's first 10 characters
    assert head not in result.get_serialized_output()
    assert head not in repr(records)
    assert "[REDACTED]" in result.output
