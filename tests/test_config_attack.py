"""Host configuration as a user writes it, attacked: values no setting can hold, names that
match nothing, and limits beyond what the system takes. Each is refused at start with a
``ConfigError`` naming the key (and the file), and a hint — never a bare ``ValueError`` or
``TypeError``, never a run that silently does something else.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from helpers import EchoTool, ToolsPlugin
from mcp_helpers import fixture_server

from amplifier_tools import ConfigError, PluginLoadError, ToolHost
from amplifier_tools.builtins.bash.settings import BashSettings
from amplifier_tools.mcp.settings import McpSettings
from amplifier_tools.plugin_settings import MAX_COUNT, structure_settings


def refused(config: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        ToolHost(config=config, entry_points=False, discover=False, **kwargs)
    return info.value


# -- NUL bytes and keys that are not strings ---------------------------------------------------


@pytest.mark.parametrize(("config", "key"), [
    ({"working_dir": "/tmp/a\x00b"}, "working_dir"),
    ({"state_dir": "/tmp/a\x00b"}, "state_dir"),
    ({"plugins": {"filesystem": {"allowed_read_paths": ["a\x00b"]}}}, "plugins.filesystem.allowed_read_paths[0]"),
    ({"plugins": {"bash": {"user": "a\x00b"}}}, "plugins.bash.user"),
    ({"plugins": {"audit": {"path": "/tmp/a\x00b"}}}, "plugins.audit.path"),
    ({"plugins": {"policy": {"store": "unix:///tmp/a\x00b"}}}, "plugins.policy.store"),
])
def test_a_nul_byte_anywhere_in_the_configuration_is_refused_naming_the_key(config: dict[str, Any], key: str) -> None:
    """Found by attack: each of these ended in a bare ``ValueError: embedded null byte`` (exit 1,
    "this is a bug"), naming no key."""
    error = refused(config)
    assert error.key == key
    assert "NUL byte" in error.detail and error.hint


def test_a_nul_byte_in_a_config_file_stops_the_command_naming_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "amplifier-tools.toml").write_text('working_dir = "/tmp/a\\u0000b"\n')
    run = cli(tmp_path, "list", env={"XDG_STATE_HOME": str(tmp_path.parent / "state")})
    assert run.returncode == 2, run.stderr
    assert "amplifier-tools.toml: working_dir: must not contain a NUL byte" in run.stderr
    assert "Traceback" not in run.stderr and "bug" not in run.stderr


def test_a_yaml_key_that_is_not_a_string_is_refused_naming_it(tmp_path: Path) -> None:
    """Found by attack: ``plugins: {1: {}}`` in a mount-plan YAML ended in a bare ``TypeError``."""
    pytest.importorskip("yaml")
    (tmp_path / "plan.yaml").write_text("plugins:\n  1: {}\n")
    run = cli(tmp_path, "--config", "plan.yaml", "list", env={"XDG_STATE_HOME": str(tmp_path.parent / "state")})
    assert run.returncode == 2, run.stderr
    assert "plan.yaml: plugins.1: key 1 is not a string" in run.stderr
    assert "hint: quote the key" in run.stderr and "Traceback" not in run.stderr


# -- an empty working directory ----------------------------------------------------------------


def test_an_empty_working_dir_in_the_configuration_is_refused_not_taken_for_the_current_directory() -> None:
    assert refused({"working_dir": ""}).key == "working_dir"


@pytest.mark.parametrize("given", ["", "a\x00b"])
def test_a_working_dir_argument_naming_no_directory_is_refused(given: str) -> None:
    """Found by attack: ``ToolHost(working_dir="")`` ran in the current directory without a word;
    one with a NUL byte ended in a bare ``ValueError``."""
    error = refused(None, working_dir=given)
    assert error.key == "working_dir" and error.hint and "working_dir" in error.hint


def test_serve_mcp_with_an_empty_working_dir_stops_naming_it(tmp_path: Path) -> None:
    """``serve-mcp --working-dir "$WD"`` with ``WD`` unset served the current directory."""
    run = cli(tmp_path, "serve-mcp", "--working-dir", "", stdin="",
              env={"XDG_STATE_HOME": str(tmp_path.parent / "state")})
    assert run.returncode == 2, run.stderr
    assert "working_dir: the working directory given is empty" in run.stderr and "Traceback" not in run.stderr


# -- [secrets] ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["", "DEPLOY=KEY"])
def test_a_secret_reference_to_a_variable_no_environment_can_hold_is_refused_at_start(variable: str) -> None:
    """Found by attack: ``deploy = ""`` started, and every call that needed the secret failed."""
    error = refused({"secrets": {"deploy": variable}})
    assert error.key == "secrets.deploy"
    assert error.hint is not None and "environment variable" in error.hint


# -- counts beyond what a limit can hold -------------------------------------------------------


@pytest.mark.parametrize("value", [10**23, 2**64 - 1, MAX_COUNT + 1])
def test_a_limit_beyond_what_the_system_takes_is_refused_at_start(value: int) -> None:
    """Found by attack: ``max_memory_bytes = 10**23`` started, and every bash call then failed in
    prlimit ("failed to parse AS limit"); 2**64 - 1 is RLIM_INFINITY, no limit at all."""
    with pytest.raises(ConfigError) as info:
        structure_settings({"max_memory_bytes": value}, BashSettings, "plugins.bash")
    assert info.value.key == "plugins.bash.max_memory_bytes"
    assert f"must be at most {MAX_COUNT}" in info.value.detail


def test_the_largest_count_is_kept_and_the_rule_applies_to_every_count() -> None:
    assert structure_settings({"max_memory_bytes": MAX_COUNT}, BashSettings, "plugins.bash").max_memory_bytes \
        == MAX_COUNT
    with pytest.raises(ConfigError) as info:
        structure_settings({"servers": {"fs": {"command": "x", "max_tools": 2**70}}}, McpSettings, "plugins.mcp")
    assert info.value.key == "plugins.mcp.servers.fs.max_tools"


async def test_a_huge_max_line_chars_still_reads_files(tmp_path: Path) -> None:
    """Found by attack: ``max_line_chars`` above 2**61 failed every ``fs_read_file`` with
    ``OverflowError`` (the line cap, in bytes, overflowed ``readline``)."""
    (tmp_path / "f.txt").write_text("hello\nworld\n")
    host = ToolHost(config={"plugins": {"filesystem": {"max_line_chars": 2**62}}}, builtins=["filesystem"],
                    entry_points=False, discover=False, working_dir=tmp_path)
    async with host:
        result = await host.call("fs_read_file", {"path": "f.txt"})
    assert result.success, result.error
    assert "world" in result.output["content"]


async def test_a_huge_fsync_interval_leaves_the_audit_thread_working(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: ``fsync_interval_ms = 1e300`` made the fsync thread fail ("timestamp out of
    range") and log it every 10 ms for as long as the host ran."""
    caplog.set_level(logging.ERROR)
    host = ToolHost(config={"plugins": {"audit": {"fsync_interval_ms": 1e300}}}, builtins=["audit"],
                    plugins=[ToolsPlugin(EchoTool())], entry_points=False, discover=False, working_dir=tmp_path)
    async with host:
        assert (await host.call("echo", {"path": "x"})).success
    assert not [r for r in caplog.records if "fsync thread" in r.getMessage()]


# -- names that match nothing ------------------------------------------------------------------


@pytest.mark.parametrize(("override", "key", "hint"), [
    ({"timeout_ms": 5}, "tools.echo.timeout_ms", "it belongs in a table below: tools.echo.policies.timeout_ms"),
    ({"policies": {"timout_ms": 5}}, "tools.echo.policies.timout_ms", "did you mean 'timeout_ms'?"),
])
async def test_an_unknown_key_of_a_tool_override_gets_a_hint(
        tmp_path: Path, override: dict[str, Any], key: str, hint: str) -> None:
    """Found by attack: an unknown key of ``[tools.<name>]`` had no hint (the command line said only
    "fix the configuration"), unlike every other unknown key."""
    host = ToolHost(config={"tools": {"echo": override}}, builtins=False, plugins=[ToolsPlugin(EchoTool())],
                    entry_points=False, discover=False, working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    await host.close()
    assert info.value.key == key
    assert info.value.hint == hint


@pytest.mark.parametrize(("override", "key", "message"), [
    ({"concurrency": {"limit": 4, "extra": 1}}, "tools.echo.policies.concurrency", "extra fields found (extra)"),
    ({"concurrency": {"limit": -4}}, "tools.echo.policies.concurrency.limit", "limit must be positive"),
])
async def test_a_bad_value_below_a_tool_override_is_named_by_its_own_key(
        tmp_path: Path, override: dict[str, Any], key: str, message: str) -> None:
    """Found by a new-user trial: such an error led with the tool's key (``tools.echo: extra fields
    found (extra) @ tools.echo.policies.concurrency``), unlike every other setting's."""
    host = ToolHost(config={"tools": {"echo": {"policies": override}}}, builtins=False,
                    plugins=[ToolsPlugin(EchoTool())], entry_points=False, discover=False, working_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        await host.start()
    await host.close()
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: {message}") and " @ " not in str(info.value)


def test_a_plugin_disabled_in_another_case_is_refused_not_left_running(tmp_path: Path) -> None:
    """Found by attack: ``AMPLIFIER_TOOLS_DISABLE_PLUGINS=BASH`` shares no letter with ``bash``, so it
    was taken for an optional plugin not installed here, and bash ran."""
    state = {"XDG_STATE_HOME": str(tmp_path.parent / "state")}
    run = cli(tmp_path, "list", env={**state, "AMPLIFIER_TOOLS_DISABLE_PLUGINS": "BASH"})
    assert run.returncode == 2, run.stdout
    assert "AMPLIFIER_TOOLS_DISABLE_PLUGINS: 'BASH' names no installed plugin" in run.stderr
    assert "hint: did you mean 'bash'?" in run.stderr


@pytest.mark.parametrize(("builtins", "detail"), [
    (["polcy", "audit"], "'polcy' is no built-in plugin"),
    ("policy", "got 'policy'"),
    (1, "got 1"),
])
def test_builtins_naming_no_built_in_plugin_are_refused(builtins: Any, detail: str) -> None:
    """Found by attack: ``ToolHost(builtins=["polcy", "audit"])``, or ``builtins="policy"`` (read as its
    letters), mounted no policy plugin without a word; ``builtins=1`` ended in a bare ``TypeError``."""
    error = refused(None, builtins=builtins)
    assert error.key == "builtins" and detail in error.detail and error.hint


# -- the file itself ---------------------------------------------------------------------------


def test_a_config_file_with_a_byte_order_mark_says_so(tmp_path: Path) -> None:
    """Found by attack: a file saved with a BOM said only "Invalid statement (at line 1, column 1)"."""
    (tmp_path / "amplifier-tools.toml").write_bytes(b"\xef\xbb\xbfdefault_timeout_ms = 5\n")
    run = cli(tmp_path, "list", env={"XDG_STATE_HOME": str(tmp_path.parent / "state")})
    assert run.returncode == 2, run.stderr
    assert "byte-order mark" in run.stderr
    assert "hint: save the file as UTF-8 without a byte-order mark" in run.stderr


# -- an MCP server's cwd -----------------------------------------------------------------------


def test_an_empty_mcp_server_cwd_is_refused_not_taken_as_unset() -> None:
    """Found by attack: ``cwd = ""`` started the server in the host's working directory."""
    with pytest.raises(ConfigError) as info:
        structure_settings({"servers": {"fs": {"command": "x", "cwd": ""}}}, McpSettings, "plugins.mcp")
    assert info.value.key == "plugins.mcp.servers.fs.cwd"


async def test_an_mcp_server_cwd_that_does_not_exist_is_named_not_its_command(tmp_path: Path) -> None:
    """Found by attack: a ``cwd`` that does not exist was reported as "no executable ... on the PATH
    the server gets; set ...command to its absolute path" — the wrong setting."""
    host = ToolHost(config={"plugins": {"mcp": {"servers": {"fx": fixture_server(cwd="missing")}}}},
                    builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path)
    with pytest.raises(PluginLoadError) as info:
        await host.start()
    await host.close()
    message = str(info.value)
    assert f"its working directory {tmp_path.resolve() / 'missing'} does not exist" in message
    assert "plugins.mcp.servers.fx.cwd" in message and "no executable" not in message
    # found by a newcomer's trial: the message went on "(check plugins.mcp.servers.fx: command and
    # args)", the settings docs/mcp.md says it does not name
    assert "command and args" not in message and "(check plugins.mcp.servers.fx: cwd)" in message
