"""Attacks by an imported MCP server on the host (issue 14, finding 7), with a hostile fixture
server (tests/mcp_fixtures/hostile_server.py): what it can read, what it leaves running, what
it can make the host spend."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import HOSTILE_SERVER, REPO, alive, hostile, read_pid, wait_dead

from amplifier_tools import ToolHost

CANARY = "canary-7c1e-host-secret"


# -- the environment ---------------------------------------------------------------------------

async def test_server_environment_holds_no_host_secret_and_gets_path_and_locale(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_TOKEN", CANARY)
    monkeypatch.setenv("LANG", "C.UTF-8")
    async with hostile(tmp_path) as host:  # no PATH configured: the server gets the host's
        result = await host.call("mcp::h::environ", {})
    env = json.loads(result.output)
    assert CANARY not in json.dumps(env)
    assert env["PATH"] == os.environ["PATH"] and env["LANG"] == "C.UTF-8"
    assert "HOME" not in env


async def test_configured_env_wins_over_the_basic_variables(tmp_path: Path) -> None:
    async with hostile(tmp_path, env={"PATH": "/usr/bin:/bin"}) as host:
        env = json.loads((await host.call("mcp::h::environ", {})).output)
    assert env["PATH"] == "/usr/bin:/bin"


async def test_bare_command_is_found_on_the_path_the_server_gets(tmp_path: Path) -> None:
    config = {"command": Path(sys.executable).name, "args": [HOSTILE_SERVER],
              "env": {"PATH": str(Path(sys.executable).parent)}}
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"h": config}}}}, builtins=["mcp"],
                        entry_points=False, working_dir=tmp_path, discover=False) as host:
        assert (await host.call("mcp::h::echo", {"text": "hi"})).output == {"text": "hi"}


_HOST_IN_A_PROCESS = """
import asyncio, json, os, sys
from amplifier_tools import ToolHost

async def main():
    section = {"command": sys.executable, "args": [sys.argv[1]], "sandbox": sys.argv[3],
               "sandbox_read_paths": sorted({sys.prefix, sys.base_prefix, os.path.dirname(sys.argv[1])})}
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"h": section}}}}, builtins=["mcp"],
                        entry_points=False, working_dir=sys.argv[2], discover=False) as host:
        print(json.dumps((await host.call("mcp::h::parent_environ", {})).output))

asyncio.run(main())
"""


def _parent_environ_seen_by_the_server(tmp_path: Path, sandbox: str) -> str:
    # /proc/<pid>/environ shows the environment a process started with, so the canary must be
    # in the host process's initial environment: run the host in its own process.
    env = {**os.environ, "DEPLOY_TOKEN": CANARY, "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", _HOST_IN_A_PROCESS, HOSTILE_SERVER, str(tmp_path), sandbox],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "PATH=" in out.stdout or "unreadable" in out.stdout or "No such file" in out.stdout  # the tool ran
    return out.stdout


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (.ci/run installs it)")
def test_a_sandboxed_server_cannot_read_the_host_environment_through_proc(tmp_path: Path) -> None:
    """In its own PID namespace the server's parent is the sandbox's first process, and the
    host's /proc does not exist there: every host secret in the host's environment is out of reach."""
    assert CANARY not in _parent_environ_seen_by_the_server(tmp_path, "auto")


def test_an_unconfined_server_can_read_the_host_environment_as_documented(tmp_path: Path) -> None:
    """``sandbox = "off"`` (the default) is the host's user with the host's /proc: docs/mcp.md says
    so. This holds the documentation to the truth: if it fails, update the docs."""
    assert CANARY in _parent_environ_seen_by_the_server(tmp_path, "off")


# -- the process tree --------------------------------------------------------------------------

async def test_setsid_grandchild_does_not_outlive_close(tmp_path: Path) -> None:
    pid_file, escaped_file = tmp_path / "pid", tmp_path / "escaped"
    async with hostile(tmp_path, env={"HOSTILE_PID_FILE": str(pid_file),
                                      "HOSTILE_ESCAPE_FILE": str(escaped_file)}):
        server, escaped = read_pid(pid_file), read_pid(escaped_file)
        assert alive(server) and alive(escaped)
        # The grandchild left the server's session and process group, and its parent is gone.
        assert os.getsid(escaped) != os.getsid(server) and os.getpgid(escaped) != os.getpgid(server)
    try:
        assert wait_dead(server, 10.0)
        assert wait_dead(escaped, 10.0), "the setsid grandchild survived host.close()"
    finally:
        if alive(escaped):
            os.kill(escaped, 9)


# -- message size ------------------------------------------------------------------------------

async def test_message_over_the_cap_fails_the_call_naming_the_setting_and_restarts(tmp_path: Path) -> None:
    pid_file, escaped_file = tmp_path / "pid", tmp_path / "escaped"
    async with hostile(tmp_path, max_message_bytes=100_000, env={"HOSTILE_PID_FILE": str(pid_file),
                                                                 "HOSTILE_ESCAPE_FILE": str(escaped_file)}) as host:
        first, escaped = read_pid(pid_file), read_pid(escaped_file)
        result = await host.call("mcp::h::big", {"bytes": 5_000_000})
        assert not result.success
        assert result.error is not None and result.error["type"] == "ExecutionError"
        assert result.error["code"] == "mcp_message_too_large"
        assert "plugins.mcp.servers.h.max_message_bytes" in result.error["message"]
        assert result.error["limit"] == 100_000
        # Never buffered whole: reading stopped soon after the limit.
        assert result.error["received_bytes"] < 100_000 + 2 * 65_536
        assert wait_dead(first, 5.0), "a server that broke the limit is stopped"
        assert wait_dead(escaped, 5.0), "with its whole tree"
        again = await host.call("mcp::h::echo", {"text": "ok"})  # restarted, as after a crash
        assert again.success and again.output == {"text": "ok"}
        assert read_pid(pid_file) != first


async def test_message_under_the_cap_is_read_whole(tmp_path: Path) -> None:
    async with hostile(tmp_path, max_message_bytes=100_000) as host:
        result = await host.call("mcp::h::big", {"bytes": 99_000})
    assert result.success and result.output == "x" * 99_000


async def test_a_21_mb_message_is_scanned_once_not_once_per_read(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A 21 MB output took 17 s (issue 18): each read rescanned the unfinished message. Counted,
    not timed: every byte the server sent is examined for a newline once (the bench times it)."""
    from amplifier_tools.mcp import transport

    splitters: list[transport.LineSplitter] = []

    class Counted(transport.LineSplitter):
        def __init__(self, limit: int) -> None:
            super().__init__(limit)
            splitters.append(self)

    monkeypatch.setattr(transport, "LineSplitter", Counted)
    size = 21 * 1000 * 1000
    async with hostile(tmp_path, max_message_bytes=64 * 1024 * 1024) as host:
        before = splitters[-1].scanned
        result = await host.call("mcp::h::big", {"bytes": size})
        scanned = splitters[-1].scanned - before
    assert result.success and len(result.output) == size
    assert size < scanned < size + 1000, f"{scanned} bytes scanned for a {size} byte message"


def test_the_line_splitter_scans_each_byte_once_however_the_stream_is_cut() -> None:
    from amplifier_tools.mcp.transport import LineSplitter

    stream = b"".join([b'{"a": 1}\n', b"x" * 3_000_000, b"\n", b"\n", b'{"b": 2}\n', b"tail"])
    for chunk_size in (7, 65_536, len(stream)):
        splitter = LineSplitter(limit=4_000_000)
        chunks = [stream[i:i + chunk_size] for i in range(0, len(stream), chunk_size)]
        lines = [bytes(line) for chunk in chunks for line in splitter.feed(chunk)]
        assert lines == [b'{"a": 1}', b"x" * 3_000_000, b"", b'{"b": 2}'], chunk_size
        assert splitter.scanned == len(stream) and splitter.pending == len(b"tail")


def test_a_line_past_the_limit_is_never_split_off() -> None:
    from amplifier_tools.mcp.transport import LineSplitter

    splitter = LineSplitter(limit=10)
    assert list(splitter.feed(b"0123456789abc")) == [] and splitter.pending > splitter.limit
    splitter = LineSplitter(limit=10)
    assert list(splitter.feed(b"ok\n0123456789abc\nmore\n")) == [b"ok"] and splitter.pending > splitter.limit


@pytest.mark.parametrize("value", [0, 100, "16MiB", True, 1.5e6])
async def test_bad_max_message_bytes_is_a_config_error_naming_the_key(tmp_path: Path, value: Any) -> None:
    from amplifier_tools import PluginLoadError

    with pytest.raises(PluginLoadError, match=r"plugins\.mcp\.servers\.h\.max_message_bytes"):
        async with hostile(tmp_path, max_message_bytes=value):
            pass


async def test_tool_list_over_the_cap_fails_start_naming_the_setting(tmp_path: Path) -> None:
    from amplifier_tools import PluginLoadError

    long_tool = {"name": "long", "description": "d" * 5000, "inputSchema": {"type": "object"}}
    with pytest.raises(PluginLoadError, match=r"plugins\.mcp\.servers\.h\.max_message_bytes"):
        async with hostile(tmp_path, tools=[long_tool], max_message_bytes=1024):
            pass


# -- the sandbox's settings --------------------------------------------------------------------

SANDBOX_READ = sorted({sys.prefix, sys.base_prefix, os.path.dirname(HOSTILE_SERVER)})


async def test_a_sandboxed_server_answers_and_its_parent_is_not_the_host(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    async with hostile(tmp_path, sandbox="auto", sandbox_read_paths=SANDBOX_READ) as host:
        assert (await host.call("mcp::h::echo", {"text": "hi"})).output == {"text": "hi"}
        parent = (await host.call("mcp::h::parent_environ", {})).output
    assert CANARY not in json.dumps(parent)


async def test_sandbox_auto_without_bubblewrap_refuses_to_start_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from amplifier_tools import PluginLoadError

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else "/bin/" + name)
    with pytest.raises(PluginLoadError) as caught:
        async with hostile(tmp_path, sandbox="auto", sandbox_read_paths=SANDBOX_READ):
            pass
    cause = caught.value.__cause__
    assert cause is not None and getattr(cause, "code", None) == "sandbox_unavailable"
    assert "[plugins.mcp.servers.h]" in str(cause) and 'sandbox = "off"' in str(cause)


async def test_a_program_outside_the_view_names_sandbox_read_paths(tmp_path: Path) -> None:
    from amplifier_tools import PluginLoadError

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (.ci/run installs it)")
    if os.path.realpath(sys.executable).startswith(("/usr/", "/bin/", "/opt/")):
        pytest.skip("this interpreter lies in a system directory, which the sandbox shows")
    with pytest.raises(PluginLoadError, match=r"plugins\.mcp\.servers\.h\.sandbox_read_paths: the server's program"):
        async with hostile(tmp_path, sandbox="auto"):  # the interpreter is not under a system directory
            pass


async def test_a_server_listing_too_many_tools_fails_start_naming_max_tools(tmp_path: Path) -> None:
    """Found by attack: 100,000 listed tools (a 5 MB message, under the size cap) drove the host
    to about a gigabyte and minutes of CPU while mounting them."""
    from amplifier_tools import PluginLoadError

    many = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(30)]
    with pytest.raises(PluginLoadError, match=r"lists more than 25 tools.*plugins\.mcp\.servers\.h\.max_tools"):
        async with hostile(tmp_path, tools=many, max_tools=25):
            pass
    async with hostile(tmp_path, tools=many, max_tools=40) as host:  # room for them and the fixture's own
        assert (await host.call("mcp::h::t29", {"text": "x"})).success
