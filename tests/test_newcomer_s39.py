"""A newcomer's first hour (session 39): what a new user ran into, each pinned by a test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli


def run_cli(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return cli(cwd, *args, env={"XDG_STATE_HOME": str(tmp_path / "state")})


async def test_serve_mcp_lists_a_tool_whose_output_schema_is_not_an_object(host_factory: Any) -> None:
    """docs/plugins.md's own WordCount declares ``output_schema={"type": "integer"}``; MCP before
    2026-07-28 allows only an object root there, and one such tool made every ``tools/list`` fail
    ("Handler returned an invalid result"): the client saw no tool at all."""
    pytest.importorskip("mcp")
    from mcp import Client

    from amplifier_tools import tool
    from amplifier_tools.mcp.server import build_server
    from amplifier_tools.mcp.settings import ServeSettings

    @tool(name="local::text.count", effect="Pure", output_schema={"type": "integer"})
    def count(text: str) -> int:
        """Count words."""
        return len(text.split())

    host = await host_factory(count)
    server = build_server(host, ServeSettings(tools=("*",)))
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
        assert [t.name for t in tools] == ["text_count"]
        result = await client.call_tool("text_count", {"text": "a b c"})
        assert not result.is_error and result.content[0].text == "3"  # type: ignore[union-attr]


async def test_mcp_definitions_keep_an_object_output_schema(host_factory: Any) -> None:
    from amplifier_tools import tool

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    @tool(name="local::text.stats", effect="Pure", output_schema=schema)
    def stats(text: str) -> dict[str, int]:
        """Count words."""
        return {"n": len(text.split())}

    host = await host_factory(stats)
    assert host.tool_definitions("mcp")[0]["outputSchema"] == schema


@pytest.mark.parametrize(("words", "meant", "command"), [
    (["call", "local::fs.read_file", "{}", "--principle", "bob"], "--principal", "call"),
    (["list", "--jsno"], "--json", "list"),
    (["call", "local::fs.read_file", "{}", "--idempotency_key", "k"], "--idempotency-key", "call"),
])
def test_a_misspelled_option_gets_a_did_you_mean_and_the_commands_own_help(
        tmp_path: Path, words: list[str], meant: str, command: str) -> None:
    """``call TOOL --principle bob`` said only "see 'amplifier-tools --help'", whose page lists no
    option of ``call``."""
    done = run_cli(words, tmp_path, tmp_path)
    assert done.returncode == 2, done.stderr
    hint = done.stderr.splitlines()[-1]
    assert hint == f"hint: did you mean {meant!r}? see 'amplifier-tools {command} --help'", done.stderr


def test_an_unrecognized_word_points_at_the_commands_help_in_json_too(tmp_path: Path) -> None:
    done = run_cli(["call", "local::fs.read_file", "{}", "--json", "--bogus"], tmp_path, tmp_path)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["hint"] == "see 'amplifier-tools call --help'"


def test_trust_on_a_file_that_cannot_be_loaded_does_not_tell_to_run_trust(tmp_path: Path) -> None:
    """``amplifier-tools trust`` on a config with a typo answered "... then accept it with:
    amplifier-tools trust": the command just run, which refuses that file every time."""
    project = tmp_path / "project"
    project.mkdir()
    assert run_cli(["trust"], project, tmp_path).returncode == 0  # the first start: no file
    (project / "amplifier-tools.toml").write_text("default_timout_ms = 3\n")
    done = run_cli(["trust"], project, tmp_path)
    assert done.returncode == 2
    error, hint = done.stderr.splitlines()[-2:]
    assert error.startswith(f"error: {project / 'amplifier-tools.toml'}: not trusted: it cannot be loaded: "
                            "default_timout_ms: ") and "accept it with" not in error, error
    assert "did you mean 'default_timeout_ms'?" in hint and hint.endswith("then run amplifier-tools trust again")
    # a host started there still says first that the file is new (docs/configuration.md)
    listed = run_cli(["list"], project, tmp_path)
    assert listed.returncode == 2 and "will not take it on trust" in listed.stderr
    (project / "amplifier-tools.toml").write_text("default_timeout_ms = 3000\n")
    assert run_cli(["trust"], project, tmp_path).returncode == 0
    assert run_cli(["list"], project, tmp_path).returncode == 0


@pytest.mark.parametrize(("keywords", "said"), [
    ({"secret_refs": ["api"]}, "write @tool(security={'secret_refs': ...})"),
    ({"timeout_ms": 500}, "write @tool(policies={'timeout_ms': ...})"),
    ({"verison": "1.0.0"}, "'verison' is no ToolSpec field; did you mean 'version'?"),
    ({"input_schema": {"type": "object"}}, "derived from the function's signature"),
])
def test_a_tool_keyword_that_is_no_contract_field_says_where_it_belongs(keywords: dict[str, Any], said: str) -> None:
    """``@tool(secret_refs=[...])`` raised ``ToolSpec.__init__() got an unexpected keyword argument
    'secret_refs'`` (and ``input_schema=`` "got multiple values"): neither said what to write."""
    from amplifier_tools import tool

    with pytest.raises(TypeError) as refused:
        tool(name="local::nb.t", **keywords)
    assert said in str(refused.value) and str(refused.value).startswith(f"@tool({next(iter(keywords))}=...)")


def test_the_nested_spelling_of_those_fields_is_taken() -> None:
    from amplifier_tools import tool

    @tool(name="local::nb.t", security={"secret_refs": ["api"]}, policies={"timeout_ms": 500})
    def t(x: int) -> int:
        """T."""
        return x

    assert t.spec.security.secret_refs == ("api",) and t.spec.policies.timeout_ms == 500


def test_validate_of_a_module_that_raises_on_import_does_not_blame_the_target_syntax(tmp_path: Path) -> None:
    """A module whose ``@tool`` refused a parameter type failed ``importable`` with that TypeError,
    then hinted "TARGET is an import path (package.module ...)": the name was right all along."""
    (tmp_path / "dc_tools.py").write_text(
        "from dataclasses import dataclass\n"
        "from amplifier_tools import tool\n"
        "@dataclass\n"
        "class P:\n"
        "    x: int\n"
        "@tool(name='local::dc.f')\n"
        "def f(p: P) -> int:\n"
        "    '''F.'''\n"
        "    return 1\n")
    done = run_cli(["validate", "dc_tools"], tmp_path, tmp_path)
    assert done.returncode == 1
    assert "FAIL  importable: TypeError: f(p): type" in done.stdout
    assert done.stderr.splitlines()[-1] == ("hint: dc_tools was found, and loading it raised: fix what the FAIL "
                                            "line says (python -c 'import dc_tools' shows where)"), done.stderr
    misspelled = run_cli(["validate", "dc_tool"], tmp_path, tmp_path)  # a wrong name keeps its hint
    assert misspelled.returncode == 1 and "hint: TARGET is an import path" in misspelled.stderr
