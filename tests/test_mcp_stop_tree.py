"""How an UNSANDBOXED stdio MCP server's whole tree is stopped (``transport._stop``): the server
and the processes it started get SIGTERM and the grace before anything is SIGKILLed, as a bash
command's group does (``termination.kill_group``). Witnesses are processes that trap SIGTERM and
write a marker file (``ready``, then ``term`` and ``done`` when their handler ran to its end).

Found by review: a server started through a launcher (``sh -c``, ``npx``: the launcher leads the
group, the server is its child) or a server's own child were SIGKILLed by the subreaper sweep
before the group got its SIGTERM: their SIGTERM handlers never ran."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_helpers import FIXTURES, until, words

from amplifier_tools.mcp import transport
from amplifier_tools.mcp.transport import stdio_process

WITNESS = str(FIXTURES / "term_witness.py")




@pytest.fixture
def short_graces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Graces short enough for a fast test, long enough for a witness's handler on a loaded machine."""
    monkeypatch.setattr(transport, "EXIT_GRACE_S", 0.2)
    monkeypatch.setattr(transport, "TERM_GRACE_S", 1.5)


@pytest.mark.usefixtures("short_graces")
async def test_a_server_behind_a_launcher_gets_sigterm_and_its_grace(tmp_path: Path) -> None:
    """``sh -c 'server; exit'``: the launcher leads the group and the server is its child (so it is
    with ``npx``). The server's SIGTERM handler must run to its end, though the launcher exits at
    once on SIGTERM and the server holds its stdout on (its handler works longer than the 0.2 s the
    transport waits for the output of a server that exited)."""
    marker = tmp_path / "server"
    env = {"PATH": "/usr/bin:/bin"}
    async with stdio_process("/bin/sh", ["-c", '"$0" "$1" "$2" 0.5; exit $?', sys.executable,
                                         WITNESS, str(marker)],
                             env=env, max_message_bytes=1 << 20):
        await until(lambda: words(marker) == ["ready"])
    assert words(marker) == ["ready", "term", "done"], "the server was SIGKILLed without its SIGTERM grace"


@pytest.mark.usefixtures("short_graces")
async def test_a_servers_child_gets_sigterm_and_its_grace(tmp_path: Path) -> None:
    marker = tmp_path / "server"
    child = tmp_path / "server.child"
    async with stdio_process(sys.executable, [WITNESS, str(marker), "0.1", "child"],
                             env={}, max_message_bytes=1 << 20):
        await until(lambda: words(marker) == ["ready"] and words(child) == ["ready"])
    assert words(marker) == ["ready", "term", "done"]
    assert words(child) == ["ready", "term", "done"], "the server's child was SIGKILLed without its SIGTERM grace"


@pytest.mark.usefixtures("short_graces")
async def test_what_a_server_leaves_when_it_exits_at_the_end_of_its_stdin_gets_sigterm_and_its_grace(
        tmp_path: Path) -> None:
    """A server that exits when its stdin closes, leaving a child in its group: the child gets the
    SIGTERM and the grace too, not a SIGKILL at once."""
    marker = tmp_path / "child"
    script = '"$0" "$1" "$2" 0.1 >/dev/null & read -r line; exit 0'
    async with stdio_process("/bin/sh", ["-c", script, sys.executable, WITNESS, str(marker)],
                             env={"PATH": "/usr/bin:/bin"}, max_message_bytes=1 << 20):
        await until(lambda: words(marker) == ["ready"])
    assert words(marker) == ["ready", "term", "done"], "the child was SIGKILLed without its SIGTERM grace"
