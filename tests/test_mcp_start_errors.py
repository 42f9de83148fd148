"""A server that cannot start says why (issue 18): the cause in words and the last lines of its
stderr, instead of ``ExceptionGroup: unhandled errors in a TaskGroup`` or ``Connection closed``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import HOSTILE_SERVER

from amplifier_tools import PluginLoadError, ToolHost


async def start_error(tmp_path: Path, server: dict[str, Any]) -> str:
    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(config={"plugins": {"mcp": {"servers": {"srv": server}}}}, builtins=["mcp"],
                            entry_points=False, working_dir=tmp_path, discover=False):
            pass
    return str(caught.value)


async def test_a_server_exiting_1_names_its_status_and_its_stderr_tail(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    script = "import sys; print('starting', file=sys.stderr); print('fatal: no token in FOO_TOKEN', " \
             "file=sys.stderr); sys.exit(1)"
    message = await start_error(tmp_path, {"command": sys.executable, "args": ["-c", script]})
    assert "MCP server 'srv' could not start: the server exited with status 1" in message
    assert "its stderr ended with:\n    starting\n    fatal: no token in FOO_TOKEN" in message
    assert "plugins.mcp.servers.srv" in message
    assert "fatal: no token in FOO_TOKEN" in capfd.readouterr().err  # stderr = "inherit": still ours too


async def test_a_program_missing_from_the_servers_path_is_status_127_with_the_hint(tmp_path: Path) -> None:
    """An npx-style server whose interpreter is not on the PATH it gets (``#!/usr/bin/env node``)."""
    server = {"command": "/usr/bin/env", "args": ["no-such-interpreter-xyz", "server.js"],
              "env": {"PATH": str(tmp_path)}}
    message = await start_error(tmp_path, server)
    assert "exited with status 127" in message and "env_passthrough" in message and "PATH and HOME" in message
    assert "no-such-interpreter-xyz" in message.split("its stderr ended with:")[1]


async def test_a_command_not_on_the_path_names_the_path_it_searched(tmp_path: Path) -> None:
    message = await start_error(tmp_path, {"command": "no-such-mcp-server-xyz", "env": {"PATH": str(tmp_path)}})
    assert f"no executable 'no-such-mcp-server-xyz' on the PATH the server gets ('{tmp_path}')" in message
    assert "plugins.mcp.servers.srv.command" in message


async def test_a_schema_without_type_names_where_with_the_stderr_tail(tmp_path: Path) -> None:
    tools = [{"name": "typeless", "inputSchema": {"properties": {}}}]
    script = (f"import sys, runpy; print('hostile server up', file=sys.stderr, flush=True); "
              f"sys.argv = [{HOSTILE_SERVER!r}]; runpy.run_path({HOSTILE_SERVER!r}, run_name='__main__')")
    message = await start_error(tmp_path, {"command": sys.executable, "args": ["-c", script],
                                           "env": {"HOSTILE_TOOLS": json.dumps(tools)}})
    assert "it answered with data that is not valid MCP" in message
    assert ".inputSchema.type: Field required" in message
    assert "TaskGroup" not in message and "hostile server up" in message


async def test_stderr_discard_still_keeps_the_tail_for_the_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]
                                                                 ) -> None:
    script = "import sys; print('only in the error', file=sys.stderr); sys.exit(2)"
    message = await start_error(tmp_path, {"command": sys.executable, "args": ["-c", script], "stderr": "discard"})
    assert "exited with status 2" in message and "only in the error" in message
    assert "only in the error" not in capfd.readouterr().err


def test_the_tail_is_bounded_and_escapes_control_characters() -> None:
    from amplifier_tools.mcp.transport import StderrTail

    tail = StderrTail(forward=False, limit=64)
    for n in range(1000):
        tail.add(f"line {n}\n".encode())
    tail.add(b"\x1b[31mred\x1b[0m\n")
    assert len(tail.tail().encode()) < 200
    assert tail.tail().splitlines()[-1] == "\\x1b[31mred\\x1b[0m"
    assert "line 999" in tail.tail() and "line 1 " not in tail.tail()


# -- a server left out at start (required = false) -----------------------------------------------

def late_server(flag: Path) -> dict[str, Any]:
    """A server that fails to start (exit 1, a line on stderr) until ``flag`` exists."""
    script = (f"import os, sys, runpy\nif not os.path.exists({str(flag)!r}):\n"
              "    print('upstream token expired', file=sys.stderr); sys.exit(1)\n"
              f"sys.argv = [{HOSTILE_SERVER!r}]; runpy.run_path({HOSTILE_SERVER!r}, run_name='__main__')\n")
    return {"command": sys.executable, "args": ["-c", script], "required": False}


async def test_a_server_left_out_at_start_is_started_again_by_a_call_of_its_tool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``required = false`` left a server out for the host's whole life; issue 18 asks for it to be
    retried on the first call. The call is not run by the retry (it would skip its checks): it
    fails, retryable, saying to call again."""
    import amplifier_tools.mcp as mcp_plugin

    flag = tmp_path / "up"
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"late": late_server(flag)}}}}, builtins=["mcp"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        assert not [s for s in host.specs if s.name.startswith("mcp::late::")]
        down = await host.call("mcp::late::echo", {"text": "hi"})
        assert down.error is not None and down.error["code"] == "mcp_server_unavailable", down.error
        assert down.error["retryable"] is True and "exited with status 1" in down.error["message"]
        assert "upstream token expired" not in down.error["message"]  # the stderr tail is for the operator
        flag.touch()
        again = await host.call("mcp__late__echo", {"text": "hi"})  # within RETRY_AFTER_S: not tried yet
        assert again.error is not None and again.error["code"] == "mcp_server_unavailable"
        monkeypatch.setattr(mcp_plugin, "RETRY_AFTER_S", 0.0)
        started = await host.call("mcp::late::echo", {"text": "hi"})
        assert started.error is not None and started.error["code"] == "mcp_server_started", started.error
        assert started.error["retryable"] is True
        assert "mcp::late::echo" in {s.name for s in host.specs}
        ok = await host.call("mcp::late::echo", {"text": "hi"})
        assert ok.success and ok.output == {"text": "hi"}
        assert not host.plugin_manager.get_plugin("mcp").unavailable


async def test_a_retry_cut_after_the_server_started_stops_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a retry cut (the host closing, a hook time limit: a caller's own cancellation
    does not reach the ``tool_error`` chain) while it mounted the started server's tools left the
    server running, neither closed nor among the plugin's connections."""
    import asyncio

    import amplifier_tools.mcp.client as mcp_client
    from amplifier_tools.procfs import is_live

    flag = tmp_path / "up"
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"late": late_server(flag)}}}},
                        builtins=["mcp"], entry_points=False, working_dir=tmp_path, discover=False) as host:
        plugin = host.plugin_manager.get_plugin("mcp")
        flag.touch()  # it can start now
        mounting = asyncio.Event()

        async def stuck(tools: list[Any]) -> None:
            mounting.set()
            await asyncio.sleep(60)

        monkeypatch.setattr(type(plugin), "_mount_tools", lambda self, tools: stuck(tools))
        opened: list[Any] = []
        real_import = mcp_client.import_server

        async def remembered(connection: Any) -> Any:
            opened.append(connection)
            return await real_import(connection)

        monkeypatch.setattr(mcp_client, "import_server", remembered)
        retry = asyncio.create_task(plugin._retry("late"))
        await asyncio.wait_for(mounting.wait(), 30)
        pid = opened[0].pid
        assert pid is not None and is_live(pid)
        retry.cancel()
        await asyncio.gather(retry, return_exceptions=True)
        assert opened[0] not in plugin.connections
        assert not is_live(pid)  # stopped by the cut retry, not left running for the host's life


def test_plugins_reports_a_server_left_out(tmp_path: Path) -> None:
    from cli_helpers import cli

    work = tmp_path / "work"
    work.mkdir()
    server = late_server(tmp_path / "never")
    args = ", ".join(f'"{a}"' if "\n" not in a else json.dumps(a) for a in server["args"])
    (work / "amplifier-tools.toml").write_text(
        f'state_dir = "{tmp_path / "state"}"\n[plugins.mcp.servers.late]\ncommand = "{sys.executable}"\n'
        f"args = [{args}]\nrequired = false\n")
    table = cli(work, "plugins")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("mcp::late"))
    assert "UNAVAILABLE" in row and "exited with status 1" in row
    data = json.loads(cli(work, "plugins", "--json").stdout)
    assert [u["name"] for u in data["unavailable"]] == ["mcp::late"]
    assert "upstream token expired" in data["unavailable"][0]["reason"]


async def test_the_stderr_tail_has_every_host_secret_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A server given a secret (env_passthrough) that prints it: not in the error, the log or ``unavailable``."""
    monkeypatch.setenv("LEAKED_TOKEN", "leaked-token-0123456789")
    script = "import os, sys; sys.stderr.write('token is ' + os.environ['LEAKED_TOKEN'] + '\\n'); sys.exit(1)"
    server = {"command": sys.executable, "args": ["-c", script], "env_passthrough": ["LEAKED_TOKEN"],
              "stderr": "discard"}
    config = {"secrets": {"leaked": "LEAKED_TOKEN"}, "plugins": {"mcp": {"servers": {"srv": server}}}}
    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass
    assert "token is [REDACTED]" in str(caught.value) and "leaked-token" not in str(caught.value)
    config["plugins"]["mcp"]["servers"]["srv"]["required"] = False  # type: ignore[index]
    async with ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=tmp_path,
                        discover=False) as host:
        reason = host.plugin_manager.get_plugin("mcp").unavailable["srv"]
    assert "token is [REDACTED]" in reason
    assert "token is [REDACTED]" in caplog.text and "leaked-token" not in caplog.text


# -- on_error is no way to start without a server ------------------------------------------------

async def test_a_required_servers_start_error_names_required_false_and_says_on_error_does_not_apply(
        tmp_path: Path) -> None:
    """Issue 18, finding 3: a broken server stopped the host "even with on_error = 'ignore'". That
    setting governs the plugin's hooks (fail open for observers), not a server's start, and stays
    so; the error says so, and its hint names the setting that does let the host start without it."""
    config = {"plugins": {"mcp": {"on_error": "ignore",
                                  "servers": {"broken": {"command": "no-such-mcp-server-xyz"}}}}}
    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass
    assert "[plugins.mcp] on_error = 'ignore' does not apply" in str(caught.value)
    assert caught.value.hint is not None and "[plugins.mcp.servers.broken] required = false" in caught.value.hint


def test_the_command_lines_hint_for_a_broken_server_is_required_false(tmp_path: Path) -> None:
    from cli_helpers import cli

    work = tmp_path / "work"
    work.mkdir()
    (work / "amplifier-tools.toml").write_text(
        '[plugins.mcp]\non_error = "ignore"\n\n[plugins.mcp.servers.broken]\ncommand = "no-such-mcp-server-xyz"\n')
    out = cli(work, "list", env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert out.returncode != 0
    error, hint = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: ") and "MCP server 'broken' could not start" in error
    assert "on_error = 'ignore' does not apply" in error and "never its start" in error
    assert hint.startswith("hint: ") and "[plugins.mcp.servers.broken] required = false" in hint


# -- a server listing a tool the host refuses ------------------------------------------------------

def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP_TOOL = {"name": "deep", "description": "nested past the host's bound", "inputSchema": deep_schema(40)}


async def test_a_server_with_a_refused_tool_is_left_out_when_not_required(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: one tool whose schema the host refuses (nested past ``MAX_SCHEMA_DEPTH``)
    stopped the whole host although its server was ``required = false``; none of the server's
    tools stays half-mounted."""
    server = {"command": sys.executable, "args": [HOSTILE_SERVER], "env": {"HOSTILE_TOOLS": json.dumps([DEEP_TOOL])},
              "required": False}
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"h": server}}}}, builtins=["mcp"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        assert not [s for s in host.specs if s.name.startswith("mcp::h::")]
        reason = host.plugin_manager.get_plugin("mcp").unavailable["h"]
        assert "'mcp::h::deep'" in reason and "nests objects and arrays" in reason
        down = await host.call("mcp::h::echo", {"text": "hi"})
        assert down.error is not None and down.error["code"] == "mcp_server_unavailable", down.error
    assert "'h' is not mounted (required = false)" in caplog.text


async def test_a_required_server_with_a_refused_tool_stops_the_start_naming_the_tool(tmp_path: Path) -> None:
    server = {"command": sys.executable, "args": [HOSTILE_SERVER], "env": {"HOSTILE_TOOLS": json.dumps([DEEP_TOOL])}}
    message = await start_error(tmp_path, server)
    assert "'mcp::h::deep'" not in message  # the server is named srv here
    assert "'mcp::srv::deep'" in message and "nests objects and arrays" in message


async def test_a_retried_server_with_a_refused_tool_stays_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry on a later call (``required = false``) raised the refusal out of the plugin's
    ``tool_error`` hook (logged; the call ended as a bare ``unknown_tool``, saying nothing of the
    server) and left the server connected with no tools."""
    import amplifier_tools.mcp as mcp_plugin

    flag = tmp_path / "up"
    server = late_server(flag)
    server["env"] = {"HOSTILE_TOOLS": json.dumps([DEEP_TOOL])}
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"late": server}}}}, builtins=["mcp"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        plugin = host.plugin_manager.get_plugin("mcp")
        flag.touch()
        monkeypatch.setattr(mcp_plugin, "RETRY_AFTER_S", 0.0)
        again = await host.call("mcp::late::echo", {"text": "hi"})
        assert again.error is not None and again.error["code"] == "mcp_server_unavailable", again.error
        assert "nests objects and arrays" in again.error["message"]
        assert not [s for s in host.specs if s.name.startswith("mcp::late::")]
        assert not plugin.connections
