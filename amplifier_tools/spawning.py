"""The arguments of a spawn on the running event loop, so that it behaves as on asyncio's own.

Used by the bash tool (``builtins.bash.process``) and the MCP stdio transport. asyncio's loops
spawn through ``subprocess.Popen``; uvloop (installed by ``uvicorn[standard]``, chosen by
``uvloop.run``) spawns through libuv, which takes fewer arguments and closes no descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, TypeVar

T = TypeVar("T")

_IDENTITY: Final = ("user", "group", "extra_groups")

#: uvloop refuses a spawn while a uvloop loop of another thread is forking (``RuntimeError: Racing
#: with another loop to spawn a process.``, raised before anything is made): the spawn is tried again.
_RACING: Final = "Racing with another loop to spawn a process"
RACE_RETRY_FOR: Final = 2.0  # seconds; a fork takes milliseconds


async def retry_racing(spawn: Callable[[], Awaitable[T]]) -> T:
    """``spawn()``, tried again while uvloop reports a race with another thread's loop.

    Found by running the host on uvloop: two threads, each running a host on its own uvloop loop,
    spawning at once failed bash calls with ``tool_raised`` ``RuntimeError: Racing with another
    loop to spawn a process`` (uvloop's process-wide fork guard; nothing was started), and, found by
    review, an MCP stdio server's start alike. Raises ``OSError`` (``EAGAIN``) if the race lasts
    ``RACE_RETRY_FOR`` seconds.
    """
    deadline = time.monotonic() + RACE_RETRY_FOR
    pause = 0.001
    while True:
        try:
            return await spawn()
        except RuntimeError as exc:
            if not str(exc).startswith(_RACING):
                raise
            if time.monotonic() >= deadline:
                raise OSError(errno.EAGAIN, f"the event loop kept refusing to spawn for {RACE_RETRY_FOR:g} s: "
                                            f"{exc}") from None
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.05)


def for_loop(loop: asyncio.AbstractEventLoop, popen: dict[str, Any]) -> dict[str, Any]:
    """``popen`` (``subprocess.Popen`` arguments) as ``loop.subprocess_exec`` takes it.

    asyncio's own loops hand these arguments to ``subprocess.Popen``, which closes every descriptor
    but the three and ``pass_fds`` (``close_fds``). Another loop (uvloop, which ``uvicorn[standard]``
    installs) does neither, and two defects followed, found by running the host on uvloop:

    - it refuses ``user``, ``group`` and ``extra_groups`` (``ValueError: unexpected kwargs``), so with
      ``[plugins.bash] user`` set every call failed;
    - it does not close descriptors (no ``close_fds``): a bash command or an MCP server inherited
      every inheritable descriptor of the host (one from its parent, a socket handed over by
      systemd or a process manager) and copies of its own output sockets, so a background child
      with its output redirected (``sleep 100 >/dev/null &``) still held the output open (the bash
      call waited 2 s for an end that never came), and an MCP server that closed its stdout was
      not seen to (its call waited out its deadline).

    For such a loop the switch of user becomes a ``preexec_fn`` doing in the child what ``Popen``
    does, in its order (``chdir`` to ``cwd``, ``setgroups``, ``setregid``, ``setreuid``, then any other ``preexec_fn``;
    its exception fails the spawn: nothing runs as root), and it then marks close-on-exec every
    inheritable descriptor above 2 but ``pass_fds`` (the loop's own end-of-spawn pipe, closed anyway,
    included; the output sockets are copied onto 0, 1 and 2 after it, which clears the mark there).
    Limit: a ``preexec_fn`` is not safe in a process whose threads hold locks it needs; this one
    only makes system calls and lists ``/proc/self/fd``.
    """
    if isinstance(loop, asyncio.BaseEventLoop):
        return popen
    rest = {key: value for key, value in popen.items() if key not in _IDENTITY}
    uid, gid, groups = popen.get("user"), popen.get("group"), popen.get("extra_groups")
    then: Callable[[], None] | None = rest.pop("preexec_fn", None)
    kept = {0, 1, 2, *rest.get("pass_fds", ())}
    # Popen enters ``cwd`` before it switches the user; libuv would enter it after this function, as
    # the user (found by review: a directory only the host may enter failed every spawn on uvloop).
    # One that is no directory is left to libuv, which fails the spawn with ``OSError`` naming it,
    # as Popen does (an exception of this function is uvloop's ``SubprocessError``, saying nothing).
    cwd = popen.get("cwd")
    if cwd is not None and (uid is not None or gid is not None or groups is not None) and os.path.isdir(cwd):
        del rest["cwd"]
    else:
        cwd = None

    def in_child() -> None:
        if cwd is not None:
            os.chdir(cwd)
        if groups is not None:
            os.setgroups(groups)
        if gid is not None:
            os.setregid(gid, gid)
        if uid is not None:
            os.setreuid(uid, uid)
        if then is not None:
            then()
        try:
            fds: Iterable[int] = [int(name) for name in os.listdir("/proc/self/fd")]
        except OSError:  # no /proc: every descriptor number up to the limit (at most 65,536 looked at)
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            fds = range(3, 65536 if soft == resource.RLIM_INFINITY else min(soft, 65536))
        for fd in fds:
            if fd not in kept:
                with contextlib.suppress(OSError):  # the listing's own descriptor, closed since
                    if os.get_inheritable(fd):
                        os.set_inheritable(fd, False)

    rest["preexec_fn"] = in_child
    return rest
