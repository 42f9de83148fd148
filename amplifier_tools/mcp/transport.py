"""The stdio transport to an imported MCP server: one child process in its own group.

Why not the SDK's ``stdio_client``: it hides the process (so nothing can
report or check its pid), always merges a default environment into the
child's, and only kills the process group when the leader fails to exit in
time, so children a server started can outlive it. This module spawns the
server with exactly the environment it is given, in a new session (its own
process group), speaks newline-delimited JSON-RPC with the SDK's own message
types, and on close ends the server and then SIGKILLs whatever is left of its
group. It never leaves the group running when the context exits, even under
cancellation.

Limits: if the host process itself is SIGKILLed, nothing here runs; a server
then sees EOF on stdin (well-behaved servers exit) but its children may stay.
POSIX only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import IO, Any, Final

import anyio
import anyio.abc
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp.shared.message import SessionMessage

#: Seconds a server gets to exit after its stdin closes, then after SIGTERM.
EXIT_GRACE_S: Final = 1.0
TERM_GRACE_S: Final = 1.0

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


def _parse(line: str) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the session surfaces it to its message handler
        return exc


def kill_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group led by ``pid``; False when no member is left."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _wait_exit(process: anyio.abc.Process, seconds: float) -> bool:
    # Poll returncode rather than process.wait(): wait() also waits for pipe EOF,
    # which a child holding the pipe open would delay.
    with anyio.move_on_after(seconds):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


async def _stop(process: anyio.abc.Process) -> None:
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    if not await _wait_exit(process, EXIT_GRACE_S):
        kill_group(process.pid, signal.SIGTERM)
        if not await _wait_exit(process, TERM_GRACE_S):
            kill_group(process.pid, signal.SIGKILL)
            await _wait_exit(process, TERM_GRACE_S)
    # Whatever the leader did, no member of its group may survive it.
    kill_group(process.pid, signal.SIGKILL)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()


@asynccontextmanager
async def stdio_process(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    stderr: int | IO[Any] | None = None,
) -> AsyncIterator[tuple[anyio.abc.Process, ReadStream, WriteStream]]:
    """Run ``command`` as an MCP stdio server; yield ``(process, read, write)`` streams.

    ``env`` is the child's whole environment. Raises ``OSError`` when the
    command cannot be started.
    """
    process = await anyio.open_process(
        [command, *args], env=dict(env), cwd=cwd, stderr=stderr, start_new_session=True
    )
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def reader() -> None:
        assert process.stdout is not None
        buffer = ""
        try:
            async with read_send:
                async for chunk in TextReceiveStream(process.stdout, errors="replace"):
                    lines = (buffer + chunk).split("\n")
                    buffer = lines.pop()
                    for line in lines:
                        if line.strip():
                            await read_send.send(_parse(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass  # the session or the process went away; the session sees the stream end

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_recv:
                async for message in write_recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()  # a dead server: end the session instead of hanging requests

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            group.start_soon(writer)
            try:
                yield process, read_recv, write_send
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(process)
                    for stream in (read_recv, write_send, read_send, write_recv):
                        await stream.aclose()
                group.cancel_scope.cancel()
    finally:
        kill_group(process.pid)
