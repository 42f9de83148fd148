"""A newcomer's trial of the MCP gateway (session 42): what a new user ran into on the command
line, each pinned by a test (the MCP ones are beside their kind in tests/test_mcp_*.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_helpers import cli


@pytest.mark.parametrize(("words", "hint"), [
    (["list", "--verbose"], "--verbose is an option of amplifier-tools itself: put it before the command "
                            "('amplifier-tools --verbose list …')"),
    (["list", "-v"], "-v is an option of amplifier-tools itself: put it before the command "
                     "('amplifier-tools -v list …')"),
    (["plugins", "--config=x.toml"], "--config is an option of amplifier-tools itself: put it before the "
                                     "command ('amplifier-tools --config=x.toml plugins …')"),
    (["list", "--verbos"], "--verbose is an option of amplifier-tools itself: put it before the command "
                           "('amplifier-tools --verbose list …')"),
    # found by attack: the value given after the command goes before it with its option ('--config
    # list' reads list as the file), a flag's '=value' is dropped, and a word after '--' is no option
    (["list", "--config", "x.toml"], "--config is an option of amplifier-tools itself: put it before the "
                                     "command ('amplifier-tools --config x.toml list …')"),
    (["list", "--config"], "--config is an option of amplifier-tools itself: put it before the command "
                           "('amplifier-tools --config CONFIG list …')"),
    (["list", "--conf=x.toml"], "--config is an option of amplifier-tools itself: put it before the command "
                                "('amplifier-tools --config=x.toml list …')"),
    (["list", "--verbose=1"], "--verbose is an option of amplifier-tools itself: put it before the command "
                              "('amplifier-tools --verbose list …')"),
    (["list", "--", "--verbose"], "see 'amplifier-tools list --help'"),
    # the command's own options still come first
    (["list", "--jsno"], "did you mean '--json'? see 'amplifier-tools list --help'"),
])
def test_a_top_level_option_after_the_command_says_to_put_it_before(tmp_path: Path, words: list[str],
                                                                     hint: str) -> None:
    """Found by a newcomer's trial: errors end "run with --verbose for the traceback", and
    ``amplifier-tools list --verbose`` was answered "did you mean '--verbose'?", the word given."""
    done = cli(tmp_path, *words, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == f"hint: {hint}", done.stderr


def test_an_mcp_servers_stderr_tail_is_printed_as_lines(tmp_path: Path) -> None:
    """Found by a newcomer's trial: docs/mcp.md shows a failed start's stderr tail as indented lines;
    the command line printed it joined by a literal backslash-n. A newline not followed by an
    indented line stays escaped, and so does every control character (a forged ``hint:`` line, a
    terminal escape)."""
    pytest.importorskip("mcp")
    server = ("import sys; sys.stderr.write('starting\\nfatal: no token\\nhint: forged\\x1b]0;t\\x07\\n'); "
              "sys.exit(1)")
    (tmp_path / "amplifier-tools.toml").write_text(
        f"[plugins.mcp.servers.boom]\ncommand = {sys.executable!r}\nargs = ['-c', {server!r}]\n"
        "stderr = 'discard'\n")
    done = cli(tmp_path, "list", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 2, done.stderr
    assert "its stderr ended with:\n    starting\n    fatal: no token\n    hint: forged\\x1b]0;t\\x07\n" \
        in done.stderr, done.stderr
    assert [line for line in done.stderr.splitlines() if not line.startswith("    ")] == \
        [line for line in done.stderr.splitlines() if line.startswith(("error: ", "hint: "))]


@pytest.mark.parametrize(("toml", "shown", "hint"), [
    ('[modules]\nmodule = "x"\ntoken = "sk-live-0123456789abcdef"\n',
     "modules: a table with keys 'module', 'token' is not of type 'array'",
     "head each entry [[modules]] (double brackets: a list of tables); [modules] is one table"),
    ('[plugins.mcp.serve.clients]\ntoken_ref = "t"\ntoken = "sk-live-0123456789abcdef"\n',
     "plugins.mcp.serve.clients: must be a list of tables, got a table with keys 'token_ref', 'token'",
     "head each entry [[plugins.mcp.serve.clients]] (double brackets: a list of tables); "
     "[plugins.mcp.serve.clients] is one table"),
    ('[plugins.mcp.serve]\ntools = [{name = "sk-live-0123456789abcdef"}]\n',
     "got a list of 1 items, tables among them", None),
    ('[plugins.mcp.serve]\ntools = [[{name = "sk-live-0123456789abcdef"}]]\n',  # a table deeper down
     "got a list of 1 items, tables among them", None),
])
def test_a_refused_table_is_shown_by_its_keys_never_its_values(tmp_path: Path, toml: str, shown: str,
                                                              hint: str | None) -> None:
    """Found by a newcomer's trial: ``[plugins.mcp.serve.clients]`` written for ``[[…]]`` (and
    ``[modules]`` for ``[[modules]]``) printed the table's values in the error, a token typed
    there among them; the top-level one's hint said only "fix the configuration"."""
    pytest.importorskip("mcp")
    (tmp_path / "amplifier-tools.toml").write_text(toml)
    done = cli(tmp_path, "plugins", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == 2, done.stderr
    assert shown in done.stderr and "sk-live" not in done.stderr, done.stderr
    if hint is not None:
        assert done.stderr.splitlines()[-1] == f"hint: {hint}", done.stderr
