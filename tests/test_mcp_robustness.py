"""An imported server that misbehaves at start or in a result (found by review): typed errors,
in the time the settings promise."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import HOSTILE_SERVER, Kept, hostile

from amplifier_tools import PluginLoadError, ToolHost


async def test_a_server_that_never_initializes_fails_the_start_within_its_startup_timeout(tmp_path: Path) -> None:
    """The start waited for its own cleanup 10 s past ``startup_timeout_ms`` (12 s for 1 s)."""
    host = hostile(tmp_path, env={"HOSTILE_HANG_INIT": "1"}, startup_timeout_ms=1000)
    start = time.monotonic()
    with pytest.raises(PluginLoadError) as caught:
        await host.start()
    elapsed = time.monotonic() - start
    await host.close()
    assert "did not start within 1000 ms" in str(caught.value)
    assert elapsed < 4.0, f"the start failed after {elapsed:.1f} s"


async def _failed_start(host: ToolHost) -> tuple[str, float]:
    """The start error's message and how long the start took; nothing of the error is kept (its
    traceback's frames would hold the start's futures past a collection)."""
    start = time.monotonic()
    try:
        await host.start()
    except PluginLoadError as exc:
        return str(exc), time.monotonic() - start
    finally:
        await host.close()
    raise AssertionError("the host started")


async def test_the_issues_500_ms_start_timeout_leaves_no_unretrieved_exception(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 18, finding 1, as reported: 500 ms held the start for 13.5 s, and asyncio then logged
    "Future exception was never retrieved" when the start's orphaned future was collected. asyncio
    logs that (and "Task exception was never retrieved") through its own logger at collection time,
    so the test collects and listens there and on stderr."""
    import gc

    kept = Kept()
    logging.getLogger("asyncio").addHandler(kept)
    try:
        message, elapsed = await _failed_start(hostile(tmp_path, env={"HOSTILE_HANG_INIT": "1"},
                                                       startup_timeout_ms=500))
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        logging.getLogger("asyncio").removeHandler(kept)
    assert "did not start within 500 ms" in message
    assert elapsed < 3.5, f"the start failed after {elapsed:.1f} s"
    said = "\n".join(kept.lines) + capfd.readouterr().err
    assert "exception was never retrieved" not in said, said


async def test_a_start_cancelled_twice_leaves_no_unretrieved_exception(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Found by review: the close of a start cut by a cancellation now raises a second cancellation
    (it used to swallow it); the start's own failure was then never retrieved, and asyncio logged
    "Future exception was never retrieved" (an ERROR) when it was collected."""
    import gc

    from amplifier_tools.mcp.client import ServerConnection
    from amplifier_tools.mcp.settings import McpSettings
    from amplifier_tools.plugin_settings import structure_settings

    section = {"command": sys.executable, "args": [HOSTILE_SERVER], "env": {"HOSTILE_HANG_INIT": "1"}}
    settings = structure_settings({"servers": {"h": section}}, McpSettings, "plugins.mcp").servers["h"]
    kept = Kept()
    logging.getLogger("asyncio").addHandler(kept)
    try:
        connection = ServerConnection("h", settings, str(tmp_path))
        starting = asyncio.ensure_future(connection.start())
        while connection.pid is None:  # started; it never answers initialize
            await asyncio.sleep(0.01)
        starting.cancel()
        while connection._task is not None:  # until the start's close is under way
            await asyncio.sleep(0)
        starting.cancel()  # a second one (a task group's, then an outer timeout's)
        with pytest.raises(asyncio.CancelledError):
            await starting
        del starting
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0)
    finally:
        logging.getLogger("asyncio").removeHandler(kept)
    said = "\n".join(kept.lines) + capfd.readouterr().err
    assert "exception was never retrieved" not in said, said


async def test_a_malformed_call_result_is_a_protocol_error(tmp_path: Path) -> None:
    """It was a bare pydantic ValidationError, reported as an internal error."""
    async with hostile(tmp_path) as host:
        result = await host.call("mcp::h::malformed", {})
        assert not result.success and result.error is not None
        assert result.error["code"] == "mcp_protocol_error", result.error
        assert "malformed tools/call result" in result.error["message"]
        assert (await host.call("mcp::h::echo", {"text": "still here"})).success


@pytest.mark.parametrize("command", ["true", "no-such-mcp-server-xyz"])
async def test_a_server_that_cannot_start_is_named_in_the_error(tmp_path: Path, command: str) -> None:
    """'MCPError: Connection closed' and a bare FileNotFoundError named no server (new-user trial)."""
    from amplifier_tools import ToolHost

    config = {"plugins": {"mcp": {"servers": {"github": {"command": command, "sandbox": "off"}}}}}
    with pytest.raises(PluginLoadError) as caught:
        async with ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=tmp_path,
                            discover=False):
            pass
    assert "MCP server 'github'" in str(caught.value) and "plugins.mcp.servers.github" in str(caught.value)


@pytest.mark.parametrize("server", [{"cwd": "/"}, {"sandbox_read_paths": ["/"]}, {"sandbox_write_paths": ["/"]}])
async def test_a_sandboxed_server_cannot_bind_the_whole_host(tmp_path: Path, server: dict[str, str]) -> None:
    """``/`` bound over the fresh /proc, /dev and /tmp showed the host's processes and homes, or broke
    the sandbox's start ("Can't make symlink at /bin"); found by review."""
    from amplifier_tools import ConfigError
    from amplifier_tools.mcp.confinement import view_for
    from amplifier_tools.mcp.settings import ServerSettings

    settings = ServerSettings(command="server", sandbox="auto", **server)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        view_for(settings, str(tmp_path), (), "fs")
    key = next(iter(server))
    assert caught.value.key == f"plugins.mcp.servers.fs.{key}" and "cannot bind /" in str(caught.value)
    assert view_for(ServerSettings(command="server"), str(tmp_path), (), "fs").cwd == str(tmp_path.resolve())


def test_the_subreaper_wrapper_refuses_to_run_a_server_it_cannot_hold() -> None:
    """A failed prctl (seccomp, an old kernel) ran the server anyway, its tree unheld (found by review).
    Here the call fails by an unknown option number, as a refused prctl would."""
    import subprocess
    import sys

    from amplifier_tools.mcp import processes

    wrapper = processes._WRAPPER.replace(f"prctl({processes.PR_SET_CHILD_SUBREAPER},", "prctl(99999,")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", wrapper, "/bin/echo", "ran"], capture_output=True,
                         text=True, timeout=30, check=False)
    assert out.returncode == 125 and "ran" not in out.stdout
    assert "cannot make the MCP server a child subreaper" in out.stderr


async def test_a_server_flooding_requests_it_never_lets_us_answer_is_stopped(tmp_path: Path) -> None:
    """Each server request is a task in the SDK until its answer is written: a server sending pings
    while reading nothing grew the host's memory by ~15 MB/s until the call's timeout (found by review)."""
    async with hostile(tmp_path) as host:
        start = time.monotonic()
        result = await host.call("mcp::h::flood", {})
        elapsed = time.monotonic() - start
        assert result.error is not None and result.error["code"] == "mcp_request_flood", result.error
        assert elapsed < 10.0, f"the flood was stopped after {elapsed:.1f} s"
        assert (await host.call("mcp::h::echo", {"text": "restarted"})).success


def _running(marker: str) -> list[int]:
    """Pids of live processes whose command line is ``sleep <marker>``."""
    from amplifier_tools.procfs import is_live

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[:2] == [b"sleep", marker.encode()] and is_live(name):
                        found.append(int(name))
            except OSError:
                continue
    return found


async def test_children_started_during_a_forced_stop_do_not_outlive_close(tmp_path: Path) -> None:
    """A server ignoring EOF and SIGTERM kept starting setsid children through the grace periods;
    those were not pinned and outlived the final SIGKILL (found by review: 6 left)."""
    marker = str(700_000 + random.randrange(99_999))
    host = hostile(tmp_path, env={"HOSTILE_SPAWN_FOREVER": marker})
    await host.start()
    try:
        await asyncio.sleep(0.5)
        assert _running(marker), "the server started no children"
    finally:
        await host.close()
    await asyncio.sleep(0.3)
    left = _running(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} children outlived close"


async def test_a_server_dying_while_its_child_holds_stdout_fails_the_call_now(tmp_path: Path) -> None:
    """The stream stayed open while the orphan lived, and the call waited for its timeout (found by review)."""
    marker = str(800_000 + random.randrange(99_999))
    async with hostile(tmp_path, timeout_ms=30_000) as host:
        start = time.monotonic()
        result = await host.call("mcp::h::die_orphaned", {"marker": marker})
        elapsed = time.monotonic() - start
        assert result.error is not None and result.error["code"] == "mcp_server_died", result.error
        assert elapsed < 5.0, f"the call failed after {elapsed:.1f} s"
        assert (await host.call("mcp::h::echo", {"text": "restarted"})).success
    left = _running(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the orphan outlived the host"


def test_killing_many_pinned_survivors_takes_one_set_of_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """kill_pinned walked /proc once per survivor: 400 survivors took 5 s (found by review)."""
    import subprocess

    from amplifier_tools.mcp import processes

    marker = str(900_000 + random.randrange(99_999))
    shell = subprocess.Popen(["sh", "-c", f"i=0; while [ $i -lt 300 ]; do setsid sleep {marker} </dev/null "
                                          ">/dev/null 2>&1 & i=$((i+1)); done; read x"],
                             stdin=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(_running(marker)) < 300 and time.monotonic() < deadline:
            time.sleep(0.05)
        pinned = processes.pin_descendants(shell.pid)
        assert len(pinned) >= 300
    finally:
        assert shell.stdin is not None
        shell.stdin.close()
        shell.wait(10)
    walks: list[int] = []
    walk = processes.descendants
    monkeypatch.setattr(processes, "descendants", lambda *roots: walks.append(1) or walk(*roots))
    assert processes.kill_pinned(pinned) >= 300
    time.sleep(0.2)
    left = _running(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left
    assert len(walks) <= 3, f"{len(walks)} walks of /proc for {len(pinned)} survivors"


async def test_servers_start_at_once_and_an_optional_broken_one_is_left_out(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18: three servers that each take over 2 s to start start together (well under 6 s), and a
    server with ``required = false`` that cannot start is logged and left out; the host starts."""
    slow = {"command": sys.executable, "args": ["-c", "import time, runpy, sys; time.sleep(2); "
                                                      f"sys.argv = [{HOSTILE_SERVER!r}]; "
                                                      f"runpy.run_path({HOSTILE_SERVER!r}, run_name='__main__')"]}
    servers = {f"s{i}": dict(slow) for i in range(3)}
    servers["broken"] = {"command": str(tmp_path / "no-such-server"), "required": False}
    started = time.monotonic()
    async with ToolHost(config={"plugins": {"mcp": {"servers": servers}}}, builtins=["mcp"], entry_points=False,
                        working_dir=tmp_path, discover=False) as host:
        took = time.monotonic() - started
        assert {spec.name.split("::")[1] for spec in host.specs} == {"s0", "s1", "s2"}
        plugin = host.plugin_manager.get_plugin("mcp")
        assert list(plugin.unavailable) == ["broken"] and "no-such-server" in plugin.unavailable["broken"]
    assert took < 5.0, f"started one after another? {took:.1f} s"
    assert "'broken' is not mounted (required = false)" in caplog.text


async def test_a_required_server_that_cannot_start_still_stops_the_host(tmp_path: Path) -> None:
    servers = {"ok": {"command": sys.executable, "args": [HOSTILE_SERVER]},
               "broken": {"command": str(tmp_path / "no-such-server")}}
    with pytest.raises(PluginLoadError, match="no-such-server"):
        async with ToolHost(config={"plugins": {"mcp": {"servers": servers}}}, builtins=["mcp"],
                            entry_points=False, working_dir=tmp_path, discover=False):
            pass


async def test_tools_that_require_tasks_are_not_mounted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tasked = {"name": "tasked", "description": "needs tasks", "inputSchema": {"type": "object"},
              "execution": {"taskSupport": "required"}}
    optional = {**tasked, "name": "maybe", "execution": {"taskSupport": "optional"}}
    async with hostile(tmp_path, tools=[tasked, optional]) as host:
        names = {spec.name for spec in host.specs}
        assert "mcp::h::maybe" in names and "mcp::h::tasked" not in names
    assert "'tasked' requires tasks" in caplog.text


async def test_a_result_with_more_content_blocks_than_the_limit_is_refused_before_the_sdk_parses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """600,000 tiny blocks (under max_message_bytes) held the loop 13 s and took 1.2 GB in the SDK's
    validation; past ``max_content_blocks`` the response is refused from its raw bytes."""
    from amplifier_tools.mcp import transport

    parsed: list[int] = []
    real_parse = transport._parse

    def counting_parse(line: bytearray) -> Any:
        parsed.append(line.count(b'"type"'))
        return real_parse(line)

    monkeypatch.setattr(transport, "_parse", counting_parse)
    async with hostile(tmp_path, max_content_blocks=100) as host:
        fits = await host.call("mcp::h::blocks", {"count": 100})
        assert fits.success and len(fits.metadata["content"]) == 100
        refused = await host.call("mcp::h::blocks", {"count": 50_000})
        assert not refused.success
        assert refused.error["code"] == "mcp_too_many_content_blocks"
        assert refused.error["limit"] == 100 and refused.error["blocks"] == 50_000
        assert "plugins.mcp.servers.h.max_content_blocks" in refused.error["message"]
        assert max(parsed) < 1000  # the 50,000-block response never reached the SDK
        again = await host.call("mcp::h::echo", {"text": "still here"})  # the server is not stopped for it
        assert again.success


@pytest.mark.parametrize("server", [{"sandbox_read_paths": ["/proc"]}, {"sandbox_read_paths": ["/dev"]},
                                    {"sandbox_write_paths": ["/usr"]},
                                    {"sandbox_write_paths": ["{tmp}/w"], "sandbox_read_paths": ["{tmp}/w/docs"]}])
async def test_a_sandboxed_server_cannot_bind_the_hosts_proc_or_dev(tmp_path: Path, server: dict[str, list[str]]
                                                                   ) -> None:
    """Found by attack: ``sandbox_read_paths = ["/proc"]`` was bound over the sandbox's own /proc,
    and the server's /proc/<pid>/root was the host's whole filesystem, writable; a read path inside
    a write path could be swapped before the bind."""
    from amplifier_tools import ConfigError
    from amplifier_tools.mcp.confinement import sandbox_wrap
    from amplifier_tools.mcp.settings import ServerSettings

    paths = {key: [p.format(tmp=tmp_path) for p in value] for key, value in server.items()}
    settings = ServerSettings(command="server", sandbox="auto", **paths)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        await sandbox_wrap("fs", settings, str(tmp_path), ())
    assert caught.value.key is not None and caught.value.key.startswith("plugins.mcp.servers.fs.sandbox_")
    assert "the sandbox cannot bind" in str(caught.value)


@pytest.mark.parametrize("field", ["sandbox_read_paths", "cwd", "symlinked-write-path"])
async def test_a_sandboxed_servers_path_the_agent_may_swap_is_refused(tmp_path: Path, field: str) -> None:
    """Found by attack: a server's read path (or cwd) inside the host's working directory was bound
    by name at each (re)start, after a bash command had swapped it for a symlink to a host
    directory; a write path configured through such a symlink was followed."""
    from amplifier_tools import ConfigError
    from amplifier_tools.mcp.confinement import sandbox_wrap
    from amplifier_tools.mcp.settings import ServerSettings

    work = tmp_path / "work"
    (work / "server").mkdir(parents=True)
    (tmp_path / "victim").mkdir()
    if field == "symlinked-write-path":
        (work / "out").symlink_to(tmp_path / "victim")
        settings = ServerSettings(command="server", sandbox="auto", sandbox_write_paths=[str(work / "out")])
        key = "plugins.mcp.servers.fs.sandbox_write_paths"
    elif field == "cwd":
        settings = ServerSettings(command="server", sandbox="auto", cwd=str(work / "server"))
        key = "plugins.mcp.servers.fs.cwd"
    else:
        settings = ServerSettings(command="server", sandbox="auto", sandbox_read_paths=[str(work / "server")])
        key = f"plugins.mcp.servers.fs.{field}"
    with pytest.raises(ConfigError) as caught:
        await sandbox_wrap("fs", settings, str(work), ())
    assert caught.value.key == key, caught.value


def test_a_servers_paths_are_resolved_against_the_hosts_working_directory_as_checked(tmp_path: Path) -> None:
    """Found by attack: ``build/../w`` was checked as ``w`` (``..`` collapsed first) and bound as the
    link's ``../w``; a relative ``cwd`` was checked against the host's working directory and bound
    against the process's."""
    from amplifier_tools.mcp.confinement import server_cwd, view_for
    from amplifier_tools.mcp.settings import ServerSettings

    work = tmp_path / "work"
    (work / "srv").mkdir(parents=True)
    (tmp_path / "victim" / "sub").mkdir(parents=True)
    (work / "build").symlink_to(tmp_path / "victim" / "sub")
    settings = ServerSettings(command="server", sandbox="auto", sandbox_write_paths=["build/../w"], cwd="srv")
    view = view_for(settings, str(work), (), "fs")
    assert view.writable == (str(work / "w"),) and view.cwd == str(work / "srv")
    assert server_cwd(settings, str(work)) == str(work / "srv")


async def test_a_default_cwd_under_a_write_root_is_refused_naming_cwd(tmp_path: Path) -> None:
    from amplifier_tools import ConfigError
    from amplifier_tools.mcp.confinement import sandbox_wrap
    from amplifier_tools.mcp.settings import ServerSettings

    work = tmp_path / "work"
    work.mkdir()
    settings = ServerSettings(command="server", sandbox="auto")
    with pytest.raises(ConfigError) as caught:
        await sandbox_wrap("fs", settings, str(work), (), (str(tmp_path),))  # a write root holding the project
    assert caught.value.key == "plugins.mcp.servers.fs.cwd" and "set cwd" in str(caught.value)


async def test_a_sandbox_refusal_reaches_the_user_as_it_is(tmp_path: Path) -> None:
    """Found by a new-user check: the refusal of a project-local virtual environment as a read path
    ended "(check plugins.mcp.servers.s: command and args)", contradicting the key it named."""
    from amplifier_tools import ConfigError, ToolHost

    (tmp_path / ".venv").mkdir()
    config = {"plugins": {"mcp": {"servers": {"s": {"command": "server", "sandbox": "auto",
                                                    "sandbox_read_paths": [str(tmp_path / ".venv")]}}}}}
    host = ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=tmp_path, discover=False)
    with pytest.raises((ConfigError, PluginLoadError)) as caught:
        await host.start()
    await host.close()
    message = str(caught.value)
    assert "plugins.mcp.servers.s.sandbox_read_paths" in message and "command and args" not in message
    assert "name a directory outside the paths tools may write" in message


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed (.ci/run installs it)")
async def test_a_sandboxed_scripts_interpreter_outside_the_view_names_sandbox_read_paths(tmp_path: Path) -> None:
    """Found by a newcomer's trial: a virtual environment's console script (``mcp-server-time``) was
    in ``sandbox_read_paths`` and the interpreter its ``#!`` line names (a link to the base Python)
    was not; the start failed "the server exited with status 1 ... (check ...: command and args)"
    with bwrap's "execvp ...: No such file or directory", naming neither."""
    from amplifier_tools import ConfigError

    work, srv, interp = tmp_path / "work", tmp_path / "srv", tmp_path / "interp"
    for directory in (work, srv, interp):
        directory.mkdir()
    (interp / "python").symlink_to(os.path.realpath(sys.executable))
    script = srv / "server"
    script.write_text(f"#!{interp / 'python'}\nimport sys\n")
    script.chmod(0o755)
    config = {"plugins": {"mcp": {"servers": {"s": {"command": str(script), "sandbox": "auto",
                                                    "sandbox_read_paths": [str(srv)]}}}}}
    host = ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=work, discover=False)
    with pytest.raises((ConfigError, PluginLoadError)) as caught:
        await host.start()
    await host.close()
    message = str(caught.value)
    assert "plugins.mcp.servers.s.sandbox_read_paths" in message and "its #! line" in message, message
    assert str(interp / "python") in message and "command and args" not in message


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed (.ci/run installs it)")
async def test_a_sandboxed_scripts_missing_interpreter_is_no_matter_of_sandbox_read_paths(tmp_path: Path) -> None:
    """Found by attack: a ``#!`` line naming an interpreter that exists nowhere was answered "lies
    outside the sandbox's view; add its directories to sandbox_read_paths": no path added helps."""
    work, srv = tmp_path / "work", tmp_path / "srv"
    for directory in (work, srv):
        directory.mkdir()
    script = srv / "server"
    script.write_text("#!/nonexistent/python3\nimport sys\n")
    script.chmod(0o755)
    config = {"plugins": {"mcp": {"servers": {"s": {"command": str(script), "sandbox": "auto",
                                                    "sandbox_read_paths": [str(srv)]}}}}}
    host = ToolHost(config=config, builtins=["mcp"], entry_points=False, working_dir=work, discover=False)
    with pytest.raises(PluginLoadError) as caught:
        await host.start()
    await host.close()
    message = str(caught.value)
    assert "its #! line" not in message and "sandbox_read_paths" not in message, message


def test_a_shebang_cut_by_the_kernels_256_bytes_names_no_interpreter(tmp_path: Path) -> None:
    """Found by attack: a ``#!`` path longer than the 256 bytes the kernel reads (which then refuses
    to run the script) was named, cut, as the interpreter lying outside the view."""
    from amplifier_tools.mcp.confinement import _interpreter

    script = tmp_path / "server"
    script.write_bytes(b"#!/opt/" + b"x" * 300 + b"\nimport sys\n")
    assert _interpreter(str(script)) is None
    script.write_bytes(b"#!/opt/python " + b"-X" * 200 + b"\n")  # only the arguments are cut: it runs
    assert _interpreter(str(script)) == "/opt/python"


def test_a_script_swapped_for_a_fifo_does_not_block(tmp_path: Path) -> None:
    """Found by attack: ``isfile`` then ``open``: a FIFO put in the script's place between the two
    blocked the open (and the host's event loop) until something wrote to it. The open itself now
    does not block, and the file is judged by its ``fstat``."""
    import threading

    from amplifier_tools.mcp.confinement import _interpreter

    fifo = tmp_path / "server"
    os.mkfifo(fifo)
    found: list[str | None] = []
    reader = threading.Thread(target=lambda: found.append(_interpreter(str(fifo))), daemon=True)
    reader.start()
    reader.join(5)
    blocked = reader.is_alive()
    if blocked:  # let the blocked open go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not blocked and found == [None]
