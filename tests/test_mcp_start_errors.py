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
