"""The stdio transport to an imported MCP server: one child process tree, bounded messages.

Why not the SDK's ``stdio_client``: it hides the process (so nothing can
report or check its pid), always merges a default environment into the
child's, and only kills the process group when the leader fails to exit in
time, so children a server started can outlive it. This module spawns the
server with exactly the environment it is given, in a new session (its own
process group) and as a child subreaper (:mod:`.processes`), speaks
newline-delimited JSON-RPC with the SDK's own message types, and on close
pins the server's descendants, closes its stdin, waits the grace (``stop_grace``) for the
server to exit, gives the server and its whole tree (or what it left in its group, if it
exited) SIGTERM and the grace again, then SIGKILL (``termination.kill_group`` with
``processes.ServerTree``), and then SIGKILLs whatever is left of its group and of the pinned tree. A sandboxed
server (``wrap``) runs in a PID namespace whose processes are in a session of their own: after
its stdin closes they get the SIGTERM, the grace and the SIGKILL themselves
(``termination.kill_group`` with ``sandbox.SandboxProcesses``, as bash's commands do), and the
namespace's first process is killed last. It never leaves the group running when the context
exits, even under cancellation, and a cancellation during the spawn waits for the process, to
stop it.

Messages are read into one ``bytearray`` and scanned for newlines only in the
bytes not scanned yet (linear in the message size). A message longer than
``max_message_bytes`` is never buffered whole: once the unfinished line passes
the limit, reading stops, ``StdioServer.oversized`` records it, the session's
stream ends (the calls in flight fail) and the server tree is killed. The same
happens to a server with more than ``MAX_UNANSWERED_REQUESTS`` requests of its
own waiting for our answers (``StdioServer.flooded``). When the server exits, a
child of its group still holding its stdout is killed after ``EXIT_GRACE_S``, so
the stream ends and the calls in flight fail at once. A response whose result carries more
than ``max_content_blocks`` content blocks is answered, in its place, by a JSON-RPC error
(``TOO_MANY_BLOCKS``) before the SDK validates it: validating 600,000 tiny blocks held the
event loop for seconds and took a gigabyte. A byte count of commas is the cheap test (each item
after a list's first follows one, however the items are written); only a message with at least
``max_content_blocks`` of them is parsed (stdlib ``json``) to count the items exactly. A
response to one of our requests that the SDK cannot read (its ``result`` no object, say) is
answered in its place by a JSON-RPC error (``MALFORMED``) too: the SDK drops it, and the call
waited for its timeout.

Limits: if the host process itself is SIGKILLed, nothing here runs; a server
then sees EOF on stdin (well-behaved servers exit) but its children may stay.
What the process-tree kill does not cover is in :mod:`.processes`. POSIX only.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import mcp_types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from .. import termination
from ..sandbox import SandboxProcesses, wait_namespace_gone
from ..spawning import for_loop, retry_racing
from ..termination import signal_group
from .processes import (
    Pinned,
    ServerTree,
    kill_descendants,
    kill_pinned,
    pin_descendants,
    subreaper_argv,
    subreaper_available,
)

#: Seconds a server gets to exit after its stdin closes, then after SIGTERM, unless the stop is given
#: its own grace (``stop_grace``: the server's ``stop_grace_ms``). ``EXIT_GRACE_S`` also bounds the
#: read of what an exited server wrote last; ``TERM_GRACE_S`` the reap of a killed one.
EXIT_GRACE_S: Final = 1.0
TERM_GRACE_S: Final = 1.0
#: Seconds to finish reading the stderr of a stopped server (a process that escaped the kill may hold it).
STDERR_DRAIN_S: Final = 0.2
#: Bytes asked of the server's stdout per read.
READ_CHUNK: Final = 1 << 16
#: Requests from the server (``ping``, ``sampling``, ``roots/list``...) it may have waiting for our
#: answer. Each one is a task in the SDK until its answer is written; a server that keeps asking
#: while it reads none of the answers would grow the host's memory without bound.
MAX_UNANSWERED_REQUESTS: Final = 64
#: Bytes of a server's stderr kept for the message of a failed start (its last lines).
STDERR_TAIL_BYTES: Final = 4096

#: The code of the JSON-RPC error put in place of a result with too many content blocks (``data``
#: names ``TOO_MANY_BLOCKS_MARK``; ``blocks``, ``limit``).
TOO_MANY_BLOCKS: Final = -32099
TOO_MANY_BLOCKS_MARK: Final = "amplifier-tools/too-many-content-blocks"
#: The code of the JSON-RPC error put in place of a response the SDK cannot read (``data`` names
#: ``MALFORMED_MARK``; ``problem`` says what is wrong, never the values).
MALFORMED: Final = -32098
MALFORMED_MARK: Final = "amplifier-tools/malformed-response"

ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
WriteStream = MemoryObjectSendStream[SessionMessage]


class Wrap(Protocol):
    """Turns a server's resolved argv into the argv that runs it in the sandbox, bwrap reporting its
    namespace's first process on ``info_fd`` (``sandbox.command``)."""

    def __call__(self, argv: Sequence[str], *, info_fd: int | None = None) -> list[str]: ...


def _parse(line: bytearray) -> SessionMessage | Exception:
    try:
        text = line.decode("utf-8", errors="replace")
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError as exc:  # the session surfaces it to its message handler
        return _malformed_response(line) or exc


def wire_text(message: mcp_types.JSONRPCMessage) -> str:
    """``message`` as one line of the stdio wire, written as the SDK's own stdio transports write it."""
    return message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"


def error_line(rid: str | int | None, code: int, message: str) -> str:
    """A JSON-RPC error response as a line of the wire; with id null when ``rid`` is a string UTF-8
    cannot carry (a lone surrogate, which JSON's ``\\ud800`` escapes allow: found by review, writing
    the answer raised and ended the serving)."""
    if isinstance(rid, str) and not rid.isascii():
        try:
            rid.encode()
        except UnicodeEncodeError:
            rid = None
    error = mcp_types.ErrorData(code=code, message=message)
    return wire_text(mcp_types.JSONRPCError(jsonrpc="2.0", id=rid, error=error))


def loads_or_none(line: bytes | bytearray | str) -> object:
    """``line`` parsed by the stdlib, or None when it is no JSON it can parse: nested past the
    interpreter's recursion limit, it raises ``RecursionError``, which stopped the reader (and the
    session: the healthy server was taken for dead)."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def request_id(message: object) -> str | int | None:
    """The ``id`` of a JSON-RPC message, when it is one a request of ours could have (else None)."""
    rid = message.get("id") if isinstance(message, dict) else None
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


def _malformed_response(line: bytearray) -> SessionMessage | None:
    """An error response (``MALFORMED``) in place of a response to one of our requests that the
    SDK cannot read — a ``result`` that is no object, an ``error`` whose ``message`` is no string:
    the SDK drops such a message without a word, and the call waited for its whole timeout. None
    for anything else (not JSON, a request, no usable ``id``), which the SDK reports as before."""
    message = loads_or_none(line)
    rid = request_id(message)
    if not isinstance(message, dict) or rid is None or "method" in message \
            or not ("result" in message or "error" in message):
        return None
    error = message.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    if "error" in message and not (isinstance(error, dict) and isinstance(code, int) and not isinstance(code, bool)
                                   and isinstance(error.get("message"), str)):
        problem = "its error is not an object with an integer code and a string message"
    elif "result" in message and not isinstance(message["result"], dict):
        problem = "its result is not an object"
    else:
        problem = "it is not a JSON-RPC 2.0 response"
    data = mcp_types.ErrorData(code=MALFORMED, message=f"malformed response: {problem}",
                               data={"reason": MALFORMED_MARK, "problem": problem})
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=rid, error=data))


def _too_many_blocks(line: bytearray, limit: int) -> SessionMessage | None:
    """An error response in place of ``line`` when it is a response whose ``result.content`` has
    more than ``limit`` items, else None. Every item of a list after its first follows a comma,
    so a line with fewer than ``limit`` commas passes without being parsed. (A count of
    ``"type"`` keys was fooled by the key spelled ``"\\u0074ype"`` and by items that are no
    blocks, which the SDK validates against every block type: 200,000 empty objects held the
    event loop for 14 s; found by attack.)"""
    if line.count(b",") < limit:
        return None
    message = loads_or_none(line)  # None: the SDK reports it
    result = message.get("result") if isinstance(message, dict) else None
    content = result.get("content") if isinstance(result, dict) else None
    rid = request_id(message)  # an id no request has (a list, say) could not be answered: the SDK reports it
    if not isinstance(content, list) or len(content) <= limit or rid is None:
        return None
    error = mcp_types.ErrorData(code=TOO_MANY_BLOCKS, message=f"{len(content)} content blocks",
                                data={"reason": TOO_MANY_BLOCKS_MARK, "blocks": len(content), "limit": limit})
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=rid, error=error))


async def _wait_exit(process: anyio.abc.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await process.wait()  # returns at the exit, even while a child still holds the pipes
    return process.returncode is not None


async def _sweep(pid: int) -> None:
    """Kill the server's descendants (it is a subreaper: that is its whole tree while it lives)."""
    await anyio.to_thread.run_sync(kill_descendants, pid)


async def _retrieve_stdin_failure(process: anyio.abc.Process) -> None:
    """On Python 3.10, asyncio keeps the error of a stdin pipe that broke under a write (the
    server killed while our answers filled its pipe: a request flood) in a future that only
    ``wait_closed()`` retrieves, and logs ``Future exception was never retrieved`` when it is
    collected (3.11 does not log it). Retrieve it here: the error is the server's end, not ours.
    A best effort through anyio's wrapper of the asyncio stream; nothing on other versions.

    The wait is bounded (``STDERR_DRAIN_S``); its task retrieves what it ends with whenever that
    is. Found by attack: the stdin of a server that had stopped reading, closed with our writes
    still buffered (the cancelled calls of ``test_mcp_cancel_attack``), ends only once the server
    is killed, past the bound; ``asyncio.shield`` cut short takes its callback off the wait, whose
    ``BrokenPipeError`` was then logged as "Task exception was never retrieved" at every such close."""
    writer = getattr(process.stdin, "_stream", None)
    if sys.version_info >= (3, 11) or not isinstance(writer, asyncio.StreamWriter):
        return
    waiting = asyncio.ensure_future(writer.wait_closed())
    waiting.add_done_callback(_retrieve)
    # Shielded: cut short, the wait must not cancel asyncio's own future (its later result would
    # then fail to be set).
    with anyio.move_on_after(STDERR_DRAIN_S), suppress(OSError, RuntimeError):
        await asyncio.shield(waiting)


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Mark what ``done`` ended with as retrieved (asyncio logs an exception nobody retrieved)."""
    if not done.cancelled():
        done.exception()


async def _stop(process: anyio.abc.Process, stderr_done: anyio.Event | None = None,
                sandboxed: SandboxProcesses | None = None, grace: float | None = None) -> None:
    """Stop the server's tree: stdin closed, ``grace`` seconds to exit, SIGTERM, ``grace`` again,
    SIGKILL (None: ``EXIT_GRACE_S``, then ``TERM_GRACE_S``). Takes up to twice the grace, plus the
    SIGKILL's wait for the kernel (``termination.KILL_WAIT`` at worst) and ``STDERR_DRAIN_S``."""
    exit_grace, term_grace = (EXIT_GRACE_S, TERM_GRACE_S) if grace is None else (grace, grace)
    # Its children may exit gracefully while the server does (an `npx` server is a child of
    # npx), but they are pinned first: once the server has exited they are no longer under it.
    pinned = await anyio.to_thread.run_sync(pin_descendants, process.pid)
    # Named by pid and start time now, while it has not been asked to exit (its pid is its own).
    tree = ServerTree(process.pid) if sandboxed is None and process.returncode is None and subreaper_available() \
        else None
    try:
        await _end(process, pinned, tree, stderr_done, sandboxed, exit_grace, term_grace)
    except BaseException:
        # Cut (the close's bound, the caller's cancellation: a host close cut by Ctrl-C, a call's
        # deadline): what is left goes at once, from the loop's thread (no await is left to be cut
        # short), the pinned descendants outside the group too (found by review: a daemon the server
        # had ``setsid``, pinned for this end, outlived a cut stop, under init). The transport is
        # closed only when the server was reaped (closed before, asyncio kills it again and warns).
        try:
            if tree is not None:
                tree.sweep()
        finally:
            signal_group(process.pid, signal.SIGKILL)
            kill_pinned(pinned)
            if process.returncode is not None:
                _close_transport(process)
        raise


async def _end(process: anyio.abc.Process, pinned: Sequence[Pinned], tree: ServerTree | None,
               stderr_done: anyio.Event | None, sandboxed: SandboxProcesses | None,
               exit_grace: float, term_grace: float) -> None:
    """``_stop``'s graceful part: stdin closed, the two graces, SIGKILL, the pinned swept, pipes closed."""
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    await _retrieve_stdin_failure(process)
    if await _wait_exit(process, exit_grace):
        if sandboxed is None:
            # What it left in its group gets the SIGTERM and the grace too, not a SIGKILL at once
            # (found by review). Its descendants elsewhere went to init with its exit: the pinned
            # ones are SIGKILLed below. (A sandbox's namespace ended with its first process.)
            await termination.kill_group(process.pid, term_grace)
    elif sandboxed is not None:
        # The server and its children are in the sandbox's PID namespace, in a session of their own:
        # the signals to bwrap's group miss them, and the sweep of bwrap's descendants SIGKILLed them
        # all (found by attack: a sandboxed server's SIGTERM handler never ran). They get the SIGTERM
        # and the grace, then SIGKILL, as a sandboxed bash command does.
        await termination.kill_group(process.pid, term_grace, sandboxed)
        await _wait_exit(process, TERM_GRACE_S)  # killed: only its reap is waited for
    else:
        # The server and everything it started get the SIGTERM and the grace, then SIGKILL (found by
        # review: its descendants were SIGKILLed first, so a server behind a launcher, `sh -c` or
        # `npx`, and a server's children never ran their SIGTERM handlers). It is their subreaper:
        # they are found under it, whatever their group; before the SIGKILL it is stopped and its
        # tree swept, or what it forked during the grace would outlive it (unpinned).
        await termination.kill_group(process.pid, term_grace, tree,
                                     before_kill=tree.sweep if tree is not None else None)
        await _wait_exit(process, TERM_GRACE_S)  # killed: only its reap is waited for
    # Whatever the leader did, no member of its group and nothing it started may survive it.
    signal_group(process.pid, signal.SIGKILL)
    await anyio.to_thread.run_sync(kill_pinned, pinned)
    if sandboxed is not None:  # bwrap is gone: so is its namespace, even one it never reported on its way
        await wait_namespace_gone(sandboxed.first(), termination.KILL_WAIT)
    if stderr_done is not None:  # its last words are read before the pipe closes (a failed start shows them)
        with anyio.move_on_after(STDERR_DRAIN_S):
            await stderr_done.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()
    _close_transport(process)


def _close_transport(process: anyio.abc.Process) -> None:
    """Close the asyncio subprocess transport under anyio's ``process`` (a best effort through
    anyio's wrapper; nothing when it is not there). Closing anyio's streams does not close the
    pipes: a stdout pipe whose reading asyncio had paused (the server wrote faster than the
    session read) was never read to its end once the reader stopped, so its descriptor and the
    transport stayed open after the close until a garbage collection — at interpreter exit, one
    that printed ``Exception ignored … Event loop is closed`` (found by attack). Called once the
    server was killed: the transport's own kill of a live process does not arise."""
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    if isinstance(transport, asyncio.SubprocessTransport):
        with suppress(OSError, RuntimeError):
            transport.close()


class LineSplitter:
    """Newline-delimited messages out of a byte stream, in time linear in its size.

    Bytes are buffered once (one ``bytearray``, appended to) and scanned for a newline once: a
    scan starts where the last one ended, never at the start of the unfinished message (which
    made a 21 MB message take 17 s). Each message is copied out once. ``scanned`` counts the bytes
    examined, so a test can hold this to "each byte once" without a clock. A message longer than
    ``limit`` is not split off: ``pending`` then passes ``limit`` and the reader stops.
    """

    __slots__ = ("_buffer", "limit", "scanned")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()
        #: Bytes examined for a newline so far.
        self.scanned = 0

    @property
    def pending(self) -> int:
        """Bytes of the unfinished message."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> Iterator[bytearray]:
        """Add ``chunk``; yield every message it completes (without its newline)."""
        buffer = self._buffer
        scan_from = len(buffer)  # what is already buffered holds no newline
        buffer += chunk
        start = 0
        while True:
            end = buffer.find(b"\n", scan_from)
            self.scanned += (end + 1 if end >= 0 else len(buffer)) - scan_from
            if end < 0 or end - start > self.limit:
                break
            line = buffer[start:end]  # the one copy of a message
            start = scan_from = end + 1
            yield line
        del buffer[:start]


class StderrTail:
    """The last ``limit`` bytes a server wrote to stderr, kept so a failed start can say why
    (``tail()``), and copied on to the host's stderr unless discarded. Bounded: the server may
    write without end."""

    __slots__ = ("_data", "done", "forward", "limit")

    def __init__(self, *, forward: bool, limit: int = STDERR_TAIL_BYTES) -> None:
        self.forward = forward
        self.limit = limit
        self._data = bytearray()
        #: Set when the server's stderr reached its end (or could no longer be read).
        self.done = anyio.Event()

    def add(self, chunk: bytes) -> None:
        if self.forward:
            with suppress(OSError, ValueError):
                out = getattr(sys.stderr, "buffer", None)
                if out is not None:
                    out.write(chunk)
                else:
                    sys.stderr.write(chunk.decode("utf-8", errors="replace"))
                sys.stderr.flush()
        self._data += chunk
        if len(self._data) > self.limit:
            del self._data[:len(self._data) - self.limit]

    def tail(self, lines: int = 10) -> str:
        """Its last ``lines`` non-empty lines as text (control characters escaped), or ``""``."""
        text = self._data.decode("utf-8", errors="replace")
        kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
        return "\n".join("".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in line)
                         for line in kept)

    async def read(self, stream: anyio.abc.ByteReceiveStream) -> None:
        try:
            while True:
                self.add(await stream.receive(READ_CHUNK))
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            self.done.set()


class StdioServer:
    """A running stdio server: its process, the session's streams, and why reading stopped."""

    __slots__ = ("flooded", "output_ended", "oversized", "process", "read", "unanswered", "write")

    def __init__(self, process: anyio.abc.Process, read: ReadStream, write: WriteStream) -> None:
        self.process = process
        self.read = read
        self.write = write
        #: Set when the server's stdout has ended (it exited, was stopped, or closed fd 1 and runs on):
        #: no answer can come any more, whether or not the process still runs.
        self.output_ended = anyio.Event()
        #: Bytes of the unfinished message when it passed ``max_message_bytes``, else None.
        self.oversized: int | None = None
        #: Requests the server sent that have no answer written yet.
        self.unanswered = 0
        #: Set when ``unanswered`` passed ``MAX_UNANSWERED_REQUESTS`` (the server was stopped).
        self.flooded = False

    async def settled_unanswered(self) -> None:
        """Called by the SDK when a request of the server's settled with no answer written (the
        server cancelled it). Counting down on the server's ``notifications/cancelled`` instead let
        a server hide a flood: each ``ping`` sent with a cancellation of an id that never was kept
        the count at 1 while thousands of answers waited (found by attack)."""
        if self.unanswered:
            self.unanswered -= 1


def _resolve(command: str, env: Mapping[str, str], cwd: str | None) -> str:
    """``command`` as the child would find it (``PATH`` from ``env``), or ``FileNotFoundError``."""
    if "/" in command:
        path = os.path.join(cwd or os.getcwd(), command)
        if os.access(path, os.X_OK) and os.path.isfile(path):
            return os.path.abspath(path)
    else:
        found = shutil.which(command, path=env.get("PATH", os.defpath))
        if found is not None:
            return os.path.abspath(found)
    raise FileNotFoundError(errno.ENOENT, "no such executable", command)


@asynccontextmanager
async def stdio_process(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    stderr: StderrTail | None = None,
    max_message_bytes: int,
    max_content_blocks: int | None = None,
    wrap: Wrap | None = None,
    stop_grace: float | None = None,
) -> AsyncIterator[StdioServer]:
    """Run ``command`` as an MCP stdio server; yield its ``StdioServer``.

    ``env`` is the child's whole environment (its ``PATH`` finds ``command``). Its stderr goes to
    ``stderr`` (kept, and copied on to ours when it forwards), else to ours. ``wrap`` turns the
    resolved argv into the argv to spawn (the sandbox, whose PID namespace holds the whole tree, so
    the subreaper wrapper is not used then). ``stop_grace``: the seconds the server gets to exit once
    its stdin closes, and again after SIGTERM, when it is stopped (None: ``EXIT_GRACE_S`` and
    ``TERM_GRACE_S``). Raises ``OSError`` when the command cannot be started.
    """
    executable = _resolve(command, env, cwd)
    info_r = info_w = -1
    sandboxed: SandboxProcesses | None = None
    try:
        if wrap is None:
            argv = subreaper_argv(executable, args) if subreaper_available() else [executable, *args]
        else:
            info_r, info_w = os.pipe()  # where bwrap reports its namespace's first process
            argv = wrap([executable, *args], info_fd=info_w)
            sandboxed = SandboxProcesses(info_r)
        process = await _spawn(argv, env=env, cwd=cwd, stderr=stderr, info_fd=info_w, sandboxed=sandboxed,
                               stop_grace=stop_grace)
        if info_w != -1:
            os.close(info_w)
            info_w = -1
        async with _serving(process, stderr=stderr, max_message_bytes=max_message_bytes,
                            max_content_blocks=max_content_blocks, sandboxed=sandboxed,
                            stop_grace=stop_grace) as server:
            yield server
    finally:
        for fd in (info_r, info_w):
            if fd != -1:
                os.close(fd)


async def _open_process(argv: Sequence[str], **kwargs: Any) -> anyio.abc.Process:
    """``anyio.open_process`` with stdin and stdout pipes, on a loop that needs a ``preexec_fn``
    (uvloop, ``spawning.for_loop``) through anyio's backend, as ``anyio.open_process`` itself does:
    it takes no ``preexec_fn``. Found by running the host on uvloop: the server inherited copies of
    its own stdout, so one that closed its stdout was not seen to (the call waited out its
    deadline), and a child it left in its group held the output open after its crash (the group
    was SIGKILLed a second after, not given its SIGTERM and ``stop_grace_ms``)."""
    arguments = for_loop(asyncio.get_running_loop(), kwargs)
    if "preexec_fn" not in arguments:
        return await anyio.open_process(argv, **arguments)
    from anyio._core._eventloop import get_async_backend  # anyio's own path (no public one takes preexec_fn)

    stderr = arguments.pop("stderr")
    # Tried again while uvloop reports a race with another thread's loop (found by review: bash
    # was, a server's start failed).
    return await retry_racing(lambda: get_async_backend().open_process(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, **arguments))


async def _spawn(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, stderr: StderrTail | None,
                 info_fd: int, sandboxed: SandboxProcesses | None, stop_grace: float | None) -> anyio.abc.Process:
    """The server's process, started in a session of its own (``info_fd``, unless -1, passed on).

    A cancellation waits until the process exists, stops it as the close does, and is raised then
    (found by attack: delivered inside the spawn, asyncio SIGKILLed bwrap alone while it was setting
    up the sandbox, which lived on under init, its server and the server's children running for
    good; and the start failed at the close's bound, not at ``startup_timeout_ms``). The wait for the
    spawn is asyncio's: the host runs on asyncio."""
    spawn = asyncio.ensure_future(_open_process(
        argv, env=dict(env), cwd=cwd, stderr=subprocess.PIPE if stderr is not None else None,
        start_new_session=True, pass_fds=() if info_fd == -1 else (info_fd,)))
    cancelled: asyncio.CancelledError | None = None
    while not spawn.done():
        try:
            await asyncio.wait((spawn,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None and (spawn.cancelled() or spawn.exception() is not None):
        raise cancelled
    process = spawn.result()  # OSError when the command cannot be started
    if cancelled is not None:
        with anyio.CancelScope(shield=True):
            await _stop(process, None, sandboxed, stop_grace)
        raise cancelled
    return process


@asynccontextmanager
async def _serving(process: anyio.abc.Process, *, stderr: StderrTail | None, max_message_bytes: int,
                   max_content_blocks: int | None, sandboxed: SandboxProcesses | None,
                   stop_grace: float | None) -> AsyncIterator[StdioServer]:
    """The session's streams to the started ``process``; stopped (``_stop``) when the block ends."""
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    server = StdioServer(process, read_recv, write_send)
    reader_done = server.output_ended

    async def reader() -> None:
        try:
            await read_messages()
        finally:
            reader_done.set()

    async def read_messages() -> None:
        assert process.stdout is not None
        splitter = LineSplitter(max_message_bytes)
        try:
            async with read_send:
                while True:
                    try:
                        chunk = await process.stdout.receive(READ_CHUNK)
                    except anyio.EndOfStream:
                        return
                    for line in splitter.feed(chunk):
                        if line and not line.isspace():
                            refused = None if max_content_blocks is None else _too_many_blocks(line, max_content_blocks)
                            message = refused or _parse(line)
                            inner = message.message if isinstance(message, SessionMessage) else None
                            if isinstance(inner, mcp_types.JSONRPCRequest):
                                server.unanswered += 1
                                if server.unanswered > MAX_UNANSWERED_REQUESTS:
                                    server.flooded = True
                                    break
                                # Not counted down for a notifications/cancelled, which may name any id:
                                # the SDK says when a request settles with no answer written.
                                message = SessionMessage(inner, ServerMessageMetadata(
                                    on_request_unanswered=server.settled_unanswered))
                            await read_send.send(message)
                    if server.flooded:  # broken like an oversized message: its tree goes, the stream ends
                        await _sweep(process.pid)
                        signal_group(process.pid, signal.SIGKILL)
                        break
                    if splitter.pending > max_message_bytes:
                        # The server is broken: its tree goes before the calls in flight fail
                        # (when the stream ends here), not at the next call.
                        server.oversized = splitter.pending
                        await _sweep(process.pid)  # a /proc walk: off the event loop
                        signal_group(process.pid, signal.SIGKILL)
                        break
            # Drain to EOF (discarding) so the pipe, paused while unread, can close.
            with anyio.move_on_after(TERM_GRACE_S):
                while await process.stdout.receive(READ_CHUNK):
                    pass
        except anyio.EndOfStream:
            pass
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass  # the session or the process went away; the session sees the stream end

    async def writer() -> None:
        assert process.stdin is not None
        try:
            async with write_recv:
                async for message in write_recv:
                    await process.stdin.send(wire_text(message.message).encode())
                    if isinstance(message.message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)) \
                            and server.unanswered:
                        server.unanswered -= 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()  # a dead server: end the session instead of hanging requests

    stopping = anyio.Event()

    async def watcher() -> None:
        """Once the server has exited, end its output: a child that inherited its stdout would hold
        the stream open, and a call in flight would wait for its timeout instead of failing now.
        Not once the stop has begun: it gives the group its SIGTERM and grace (found by review: this
        SIGKILL cut the grace of a server behind a launcher, whose exit at the SIGTERM came first)."""
        await process.wait()  # returns at the exit, whoever still holds the pipes
        with anyio.move_on_after(EXIT_GRACE_S):  # what it wrote before exiting is read first
            await reader_done.wait()
        if not reader_done.is_set() and not stopping.is_set():  # a member holds stdout (its pgid is live)
            signal_group(process.pid, signal.SIGKILL)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            group.start_soon(writer)
            group.start_soon(watcher)
            if stderr is not None and process.stderr is not None:
                group.start_soon(stderr.read, process.stderr)
            try:
                yield server
            finally:
                stopping.set()
                with anyio.CancelScope(shield=True):
                    await _stop(process, stderr.done if stderr is not None else None, sandboxed, stop_grace)
                    for stream in (read_recv, write_send, read_send, write_recv):
                        await stream.aclose()
                group.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # once the leader is reaped its pid may be another process's
            kill_descendants(process.pid)
            signal_group(process.pid, signal.SIGKILL)
