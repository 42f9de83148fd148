"""``amplifier-tools mcp pin`` (issue 18): pinning every configured server is one command that
writes only the ``pins`` keys of the user's file (comments, order and everything else kept), or
prints them, and respects the configuration's trust check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from cli_helpers import cli
from mcp_helpers import FIXTURE_SERVER, HOSTILE_SERVER

from amplifier_tools.mcp.pin import UneditableConfig, edit_pins

CONFIG = f"""\
# the team's tool host
state_dir = "@STATE@"

[plugins.mcp.servers.fx]   # the fixture server
command = "{sys.executable}"
args = ["{FIXTURE_SERVER}"]
# calls may take a while
timeout_ms = 5000

[plugins.mcp.servers.fx.tools.crash]
enabled = false

[plugins.mcp.servers.h]
command = "{sys.executable}"
args = ["{HOSTILE_SERVER}"]
pins = {{ echo = "sha256:00" }}  # stale
require_pins = true
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "amplifier-tools.toml").write_text(CONFIG.replace("@STATE@", str(tmp_path / "state")))
    return work


@pytest.mark.slow
def test_pin_writes_only_the_pins_and_the_host_then_starts_with_them(project: Path) -> None:
    config = project / "amplifier-tools.toml"
    before = config.read_text()
    assert cli(project, "list").returncode == 2  # the stale pin stops the start
    pinned = cli(project, "mcp", "pin")
    assert pinned.returncode == 0, pinned.stderr
    assert "pinned 8 tool(s) of MCP server 'fx'" in pinned.stdout
    after = config.read_text()
    # Every line but the pins is as it was, in order: comments, keys, the stale pin's own comment.
    assert [line for line in after.splitlines() if not line.startswith("pins =")] == \
        [line for line in before.splitlines() if not line.startswith("pins =")]
    fx_pins, h_pins = [line for line in after.splitlines() if line.startswith("pins =")]
    assert after.splitlines().index(fx_pins) == before.splitlines().index("timeout_ms = 5000") + 1
    assert '"issues.create" = "sha256:' in fx_pins and "crash" not in fx_pins  # enabled = false: no pin
    assert h_pins.endswith("}  # stale") and "sha256:00" not in h_pins
    listed = cli(project, "list")  # the trust check takes the operator's own change
    assert listed.returncode == 0, listed.stderr
    assert "mcp::h::echo" in listed.stdout and "mcp::fx::add" in listed.stdout


def test_pin_print_writes_nothing_and_prints_the_toml_to_paste(project: Path) -> None:
    config = project / "amplifier-tools.toml"
    before = config.read_text()
    printed = cli(project, "mcp", "pin", "--print", "--server", "h")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("[plugins.mcp.servers.h]\npins = { big = \"sha256:")
    assert "[plugins.mcp.servers.fx]" not in printed.stdout
    assert config.read_text() == before


@pytest.mark.slow
def test_pin_refuses_a_configuration_the_host_would_not_trust(project: Path) -> None:
    assert cli(project, "mcp", "pin").returncode == 0  # trusted from here on
    config = project / "amplifier-tools.toml"
    tampered = config.read_text().replace("timeout_ms = 5000", "timeout_ms = 6000")
    config.write_text(tampered)
    refused = cli(project, "mcp", "pin")
    assert refused.returncode == 2 and "amplifier-tools trust" in refused.stderr
    assert config.read_text() == tampered  # servers were not started from it, nothing was written


def test_pin_of_an_unknown_server_names_the_key(project: Path) -> None:
    unknown = cli(project, "mcp", "pin", "--server", "nope")
    assert unknown.returncode == 2 and "no MCP server 'nope'" in unknown.stderr
    assert "plugins.mcp.servers" in unknown.stderr


@pytest.mark.slow
def test_a_server_that_cannot_start_is_reported_and_the_others_are_pinned(project: Path) -> None:
    config = project / "amplifier-tools.toml"
    config.write_text(config.read_text() + '\n[plugins.mcp.servers.broken]\ncommand = "no-such-server-xyz"\n')
    out = cli(project, "mcp", "pin")
    assert out.returncode == 1 and "MCP server 'broken' could not start" in out.stderr
    assert "pinned 8 tool(s) of MCP server 'h'" in out.stdout
    assert 'command = "no-such-server-xyz"\n' in config.read_text()


# -- the text edit ------------------------------------------------------------------------------

PINS = {"s": {"a": "sha256:1", "b.c": "sha256:2"}}


def test_a_missing_pins_line_goes_after_the_tables_last_key() -> None:
    text = "[plugins.mcp.servers.s]\ncommand = \"x\"\n# trailing note\n\n[other]\nk = 1\n"
    assert edit_pins(text, PINS) == ('[plugins.mcp.servers.s]\ncommand = "x"\n'
                                     'pins = { a = "sha256:1", "b.c" = "sha256:2" }\n'
                                     '# trailing note\n\n[other]\nk = 1\n')


def test_pyproject_tables_and_crlf_lines_are_edited_in_place() -> None:
    text = "[tool.amplifier-tools.plugins.mcp.servers.s]\r\ncommand = \"x\"\r\npins = {}\r\n"
    edited = edit_pins(text, PINS, "tool.amplifier-tools.")
    assert edited == ('[tool.amplifier-tools.plugins.mcp.servers.s]\r\ncommand = "x"\r\n'
                      'pins = { a = "sha256:1", "b.c" = "sha256:2" }\r\n')


@pytest.mark.parametrize("header", ['[ plugins . mcp . servers . "s" ]', '[plugins.mcp.servers."s"]  # quoted'])
def test_a_table_header_spelled_otherwise_is_refused_naming_the_spelling(header: str) -> None:
    with pytest.raises(UneditableConfig) as refused:
        edit_pins(f'{header}\ncommand = "x"\n', PINS)
    assert f"spelled {header.split('  #')[0]}, which this command cannot edit" in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_a_linked_configuration_is_not_edited_and_the_pins_are_printed_to_paste(project: Path, link: str) -> None:
    import os

    config = project / "amplifier-tools.toml"
    elsewhere = project.parent / "shared.toml"
    if link == "hard":
        os.link(config, elsewhere)
    else:
        config.rename(elsewhere)
        config.symlink_to(elsewhere)
    before = elsewhere.read_text()
    out = cli(project, "mcp", "pin")
    assert out.returncode == 1, out.stderr
    assert f"{config} was not changed" in out.stderr
    assert ("hard links" if link == "hard" else "symbolic link") in out.stderr
    assert "could write elsewhere" in out.stderr and "this is a bug" not in out.stderr
    assert "[plugins.mcp.servers.h]\npins = { big = \"sha256:" in out.stdout
    assert elsewhere.read_text() == before


@pytest.mark.parametrize("text", [
    'plugins.mcp.servers.s.command = "x"\n',                                      # dotted keys, no table
    '[plugins.mcp]\nservers = { s = { command = "x" } }\n',                      # inline table
    '[plugins.mcp.servers.s]\ncommand = "x"\n[plugins.mcp.servers.s.pins]\na = "sha256:0"\n',  # pins table
    '[plugins.mcp.servers.s]\ncommand = """\npins = 1\n"""\n',                  # "pins =" inside a string
])
def test_layouts_that_cannot_be_edited_exactly_are_refused(text: str) -> None:
    with pytest.raises(UneditableConfig):
        edit_pins(text, PINS)


def test_pin_without_servers_says_so_even_where_the_sdk_is_missing(tmp_path: Path) -> None:
    """It said "MCP servers are configured but the 'mcp' extra is not installed" with no server
    configured at all (found by a newcomer's pass, in an environment without the extra)."""
    import os
    import subprocess

    code = ("import runpy, sys\nsys.modules['mcp'] = None  # as where the extra is not installed\n"
            "sys.argv = ['amplifier-tools', 'mcp', 'pin']\n"
            "runpy.run_module('amplifier_tools', run_name='__main__', alter_sys=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPLIFIER_TOOLS_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**env, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no MCP server is configured" in out.stderr and "extra is not installed" not in out.stderr
