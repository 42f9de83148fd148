"""Spawning one command and making sure nothing of it outlives the call.

The command runs in a new session (so its process group id is its pid), with
stdin from ``/dev/null``, a given environment and working directory, resource
limits applied by ``prlimit(1)`` before ``bash`` starts, and optionally as
another user. Output arrives through a ``SubprocessProtocol`` straight into
bounded captures (no stream buffers in between).

The end of a call, however it ends (exit, timeout, cancellation), kills the
whole process group: SIGTERM (+SIGCONT for stopped members), a grace period,
then SIGKILL, and waits until no live member is left. Background children
(``sleep 1000 &``) and grandchildren stay in the group and die with it. A
process that leaves the group (``setsid``, a double fork into a new session)
is *not* found without the sandbox; with the sandbox the bash tool kills the
PID namespace's first process, and with it every process in the namespace
(``sandbox.wait_namespace_gone``). The sandbox's processes are outside bwrap's
group (a session of their own): the caller passes ``others`` to find them, and
they get the SIGTERM, the grace and the SIGKILL (``termination.kill_group``, shared with the
MCP stdio servers).

Must never leave a process of the call behind, and never block the event loop
on a child.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import subprocess
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import attrs

from ...spawning import for_loop, retry_racing
from ...termination import KILL_WAIT, Others, kill_group, signal_group, signal_pids
from ...timeouts import run_with_timeout
from .capture import StreamCapture

DRAIN_AFTER_EXIT: Final = 2.0  # how long to wait for pipe EOF once the group is gone


class _Gate:
    """A loop's spawn lock and how many calls wait for it or hold it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


#: One spawn at a time per event loop. A spawn blocks the loop (fork, exec and the wait for it:
#: 10-20 ms on a loaded 2-core machine, sandboxed or not), and calls started together all spawn in
#: one turn of the loop: found by scale test, 300 bash calls started at once froze the loop for 6 s,
#: and an unrelated 0.2 s tool with a 1 s timeout failed as timed out. Taken in turn, each spawn
#: lets the loop run its timers and other calls in between.
_SPAWN_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gate] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def spawn_turn(loop: asyncio.AbstractEventLoop) -> AsyncIterator[None]:
    """Hold ``loop``'s spawn gate; the gate is dropped once no call uses it. Found by attack: kept,
    a lock that a call had waited for (bound to its loop from then on) kept its own weak key
    alive, so every loop that ever had two bash calls at once stayed in memory."""
    gate = _SPAWN_GATES.get(loop)
    if gate is None:
        gate = _SPAWN_GATES[loop] = _Gate()
    gate.users += 1
    try:
        async with gate.lock:
            yield
    finally:
        gate.users -= 1
        if not gate.users:
            _SPAWN_GATES.pop(loop, None)


@attrs.frozen
class Limits:
    """Per-command rlimits; ``None`` leaves the host's limit in place."""

    cpu_seconds: int | None = None
    address_space: int | None = None  # bytes
    processes: int | None = None
    file_size: int | None = None  # bytes

    def items(self) -> list[tuple[str, int, int]]:
        """``(prlimit option, resource constant, value)`` of each limit that is set."""
        table = (("--cpu", resource.RLIMIT_CPU, self.cpu_seconds),
                 ("--as", resource.RLIMIT_AS, self.address_space),
                 ("--nproc", resource.RLIMIT_NPROC, self.processes),
                 ("--fsize", resource.RLIMIT_FSIZE, self.file_size))
        return [(option, res, value) for option, res, value in table if value is not None]

    def prlimit_argv(self, prlimit: str) -> list[str]:
        """The ``prlimit`` prefix that applies these limits and then execs the command."""
        items = self.items()
        return [prlimit, *(f"{option}={value}" for option, _, value in items)] if items else []

    def preexec(self) -> Callable[[], None] | None:
        """A ``preexec_fn`` fallback for systems without ``prlimit(1)`` (not used when it exists)."""
        items = self.items()
        if not items:
            return None

        def apply() -> None:
            for _, res, value in items:
                resource.setrlimit(res, (value, value))

        return apply


@attrs.define
class Outcome:
    """What happened to the command."""

    returncode: int | None = None
    timed_out: bool = False
    duration: float = 0.0
    killed_group: bool = False  # members were still alive at the end and were killed


async def _subprocess_exec(loop: asyncio.AbstractEventLoop, protocol: asyncio.SubprocessProtocol,
                           argv: Sequence[str], kwargs: dict[str, Any]) -> asyncio.SubprocessTransport:
    """``loop.subprocess_exec``, tried again while uvloop reports a race with another thread's loop
    (``spawning.retry_racing``)."""

    async def spawn() -> asyncio.SubprocessTransport:
        transport, _ = await loop.subprocess_exec(lambda: protocol, *argv, **kwargs)
        return transport

    return await retry_racing(spawn)


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, stdout: StreamCapture, stderr: StreamCapture) -> None:
        self.captures = {1: stdout, 2: stderr}
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()
        self.open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        self.captures[fd].feed(bytes(data) if isinstance(data, bytearray) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.open_pipes.discard(fd)
        if not self.open_pipes:
            self.closed.set()

    def process_exited(self) -> None:
        self.exited.set()


async def run(argv: Sequence[str], *, env: dict[str, str], cwd: str, timeout: float, grace: float,
              stdout: StreamCapture, stderr: StreamCapture, popen: dict[str, Any],
              others: Others | None = None) -> Outcome:
    """Run ``argv`` to its end, a timeout or a cancellation; the group is dead when this returns or raises.

    ``popen`` holds extra ``subprocess.Popen`` arguments (``user``, ``pass_fds``, ``preexec_fn``),
    passed as the running loop takes them (``for_loop``);
    ``others`` finds the command's processes outside the group, killed with it (``kill_group``).
    Raises ``OSError`` when the program cannot be started.
    """
    loop = asyncio.get_running_loop()
    protocol = _Protocol(stdout, stderr)
    spawned = time.monotonic()
    async with spawn_turn(loop):
        spawn = asyncio.ensure_future(_subprocess_exec(loop, protocol, argv, dict(
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, start_new_session=True, **for_loop(loop, {"cwd": cwd, **popen}))))
        # A cancellation waits until the process exists, and then kills its group like any other.
        # Found by attack: delivered inside ``subprocess_exec``, asyncio SIGKILLed bash alone, then
        # waited for its pipes to close, which a background child held: the call hung as long as
        # the child lived (which outlived it), holding the gate, so every later call hung too.
        cancelled = False
        while not spawn.done():
            try:
                await asyncio.wait((spawn,))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled and (spawn.cancelled() or spawn.exception() is not None):
            raise asyncio.CancelledError
        transport = spawn.result()  # OSError when the program cannot be started
    pgid = transport.get_pid()
    outcome = Outcome()
    try:
        if cancelled:
            raise asyncio.CancelledError
        try:  # the deadline starts once the process exists, not before the spawn
            await run_with_timeout(protocol.exited.wait(), timeout)
        except (asyncio.TimeoutError, TimeoutError):
            outcome.timed_out = True
        # Whatever is left of the group (background children, or everything on timeout) goes now.
        outcome.killed_group = await kill_group(pgid, 0.0 if not outcome.timed_out else grace, others)
        await protocol.exited.wait()
        try:  # writers are dead; what is still in the pipes arrives now (unless an escapee holds them)
            await run_with_timeout(protocol.closed.wait(), DRAIN_AFTER_EXIT)
        except (asyncio.TimeoutError, TimeoutError):
            pass
    except BaseException:  # cancellation: nothing may survive the call
        await _cancelled_cleanup(pgid, grace, protocol, others)
        raise
    finally:
        transport.close()
    outcome.duration = time.monotonic() - spawned
    outcome.returncode = transport.get_returncode()
    return outcome


async def _cancelled_cleanup(pgid: int, grace: float, protocol: _Protocol, others: Others | None) -> None:
    try:
        await kill_group(pgid, grace, others)
        await run_with_timeout(protocol.exited.wait(), KILL_WAIT)
    except BaseException:  # cancelled again, or the wait ran out: kill without further waiting
        signal_group(pgid, signal.SIGKILL)
        if others is not None:
            signal_pids(others(), signal.SIGKILL)


def describe_returncode(returncode: int | None) -> tuple[int | None, str | None]:
    """``(exit code, signal name)`` from a Popen-style return code (negative: killed by a signal)."""
    if returncode is None:
        return None, None
    if returncode < 0:
        try:
            return None, signal.Signals(-returncode).name
        except ValueError:
            return None, f"signal {-returncode}"
    return returncode, None
