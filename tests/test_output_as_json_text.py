"""A tool's output written as JSON text for a model, a terminal or an MCP client (``_json.json_text``):
what JSON cannot hold is written by the audit record's rule, and every such text is one a strict
JSON parser reads.

Found by attack: a tool returning NaN was shown to the model as ``{"x": NaN}``, which JSON parsers
refuse; ``amplifier-tools call --json`` failed as "a bug" (exit 1) on an output holding a long
integer or itself, after the call had succeeded and was recorded; serve-mcp's text and
``structuredContent`` disagreed (NaN as ``NaN`` and ``null``, a set as ``"{1, 2}"`` and
``[1, 2]``), and an output holding itself was a JSON-RPC internal error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import ToolsPlugin

from amplifier_tools import ToolResult


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def strict_loads(text: str) -> Any:
    """``json.loads`` as a strict parser reads JSON: ``NaN`` and ``Infinity`` are refused."""
    return json.loads(text, parse_constant=_refuse_constant)


def _cycle() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


#: Outputs JSON cannot hold as they are, and what the text says of the value under "x".
ODD_OUTPUTS: dict[str, tuple[Any, Any]] = {
    "nan": ({"x": math.nan}, "NaN"),
    "infinity": ({"x": -math.inf}, "-Infinity"),
    "long-int": ({"x": 10**5000}, "<integer of 16610 bits>"),
    "set": ({"x": {1, 2}}, "{1, 2}"),
    "tuple-key": ({"x": {(1, 2): "a"}}, {"(1, 2)": "a"}),
}


@pytest.mark.parametrize("case", ODD_OUTPUTS, ids=list(ODD_OUTPUTS))
def test_serialized_output_is_strict_json_whatever_the_output_holds(case: str) -> None:
    output, shown = ODD_OUTPUTS[case]
    assert strict_loads(ToolResult(True, output).get_serialized_output())["x"] == shown


def test_an_output_holding_itself_is_cut_and_still_strict_json() -> None:
    text = ToolResult(True, {"x": _cycle()}).get_serialized_output(max_chars=None)
    assert "nested too deep" in text and strict_loads(text)


def test_plain_output_is_written_as_before() -> None:
    assert ToolResult(True, {"a": [1, 2.5, None, True], "é": "ü"}).get_serialized_output() == \
        '{"a": [1, 2.5, null, true], "é": "ü"}'


class OddTool:
    """Returns the output named by ``case``."""

    name = "odd"
    description = "Returns output JSON cannot hold as it is."
    input_schema = {"type": "object", "properties": {"case": {"type": "string"}}, "required": ["case"]}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        if input["case"] == "cycle":
            return ToolResult(True, {"x": _cycle()})
        return ToolResult(True, ODD_OUTPUTS[input["case"]][0])


@pytest.mark.parametrize("case", [*ODD_OUTPUTS, "cycle"])
async def test_serve_mcp_text_and_structured_content_agree_and_are_json(host_factory: Any, case: str) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from amplifier_tools.mcp.server import build_server
    from amplifier_tools.mcp.settings import ServeSettings

    host = await host_factory(ToolsPlugin(OddTool()))
    async with Client(build_server(host, ServeSettings(tools=("odd",)))) as client:
        served = await client.call_tool("odd", {"case": case})
    assert not served.is_error
    text = served.content[0].text  # type: ignore[union-attr]
    assert strict_loads(text) == served.structured_content
    if case != "cycle":
        assert served.structured_content == {"x": ODD_OUTPUTS[case][1]}


CLI_MODULE = '''
import math
from amplifier_tools import ToolResult

class Odd:
    name = "local::demo.odd"
    description = "Returns output JSON cannot hold as it is."
    input_schema = {"type": "object"}

    async def execute(self, input):
        cycle = []
        cycle.append(cycle)
        outputs = {"nan": {"x": math.nan}, "long": {"x": 10**5000}, "cycle": {"x": cycle}}
        return ToolResult(output=outputs[input["case"]])

async def mount(coordinator, config):
    await coordinator.mount("tools", Odd())
'''


@pytest.mark.parametrize("case", ["nan", "long", "cycle"])
def test_call_prints_strict_json_with_and_without_json_flag(tmp_path: Path, case: str) -> None:
    (tmp_path / "odd_tools.py").write_text(CLI_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "odd_tools"\n')
    arguments = json.dumps({"case": case})
    plain = cli(tmp_path, "call", "local::demo.odd", arguments)
    whole = cli(tmp_path, "call", "local::demo.odd", arguments, "--json")
    assert (plain.returncode, whole.returncode) == (0, 0), whole.stderr
    printed, shown = strict_loads(whole.stdout), strict_loads(plain.stdout)
    assert printed["success"] is True
    if case == "cycle":  # cut at the same depth of the text printed, one level deeper in --json's
        assert "nested too deep" in plain.stdout and "nested too deep" in whole.stdout
    else:
        assert printed["output"] == shown
    if case == "nan":
        assert printed["output"] == {"x": "NaN"}
    elif case == "long":
        assert printed["output"] == {"x": "<integer of 16610 bits>"}


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
    """Found by review: ``call --json`` wrote its JSON escaped to ASCII (the stdlib's default); writing it through
    ``json_text`` (``ensure_ascii=False``) made it fail as "a bug", exit 1, on a stdout that cannot
    encode the output (``PYTHONIOENCODING=ascii``, a Latin-1 locale, a Windows console) after the
    call had succeeded and was recorded."""
    (tmp_path / "greet_tools.py").write_text(UNICODE_MODULE)
    (tmp_path / "amplifier-tools.toml").write_text('[[modules]]\nmodule = "greet_tools"\n')
    done = cli(tmp_path, "call", "local::demo.greet", "{}", "--json", env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == {"greeting": "h\u00e9llo \u2713"}
