"""An imported stdio server in the one sandbox engine (``amplifier_tools.sandbox``), per server.

``[plugins.mcp.servers.<name>] sandbox = "off" | "auto" | "bubblewrap"`` (default ``"off"``). With
``"auto"`` or ``"bubblewrap"`` the server runs in bubblewrap's minimal view: the system directories
read-only, ``sandbox_read_paths`` read-only, ``sandbox_write_paths`` read-write (host state inside
them stops the start, as for every writable root), its working directory read-only unless
writable, a private ``/tmp``, its own ``/proc`` in a new PID namespace (so the host's
``/proc/<pid>/environ``, where every host secret is, does not exist there), no home directories,
no ``/run`` sockets, the host's protected paths masked, no network unless ``sandbox_network``;
the whole namespace dies with the server. Its stop (``transport``) signals the namespace's
processes themselves (``sandbox.SandboxProcesses``, ``termination.kill_group``): SIGTERM, a grace,
SIGKILL. Where no sandbox works the server does not start (``sandbox_unavailable``, naming the
fixes): it never falls back to running unconfined.

Limits: a server's program, interpreter and libraries must lie in the view — one installed under a
home directory or a virtual environment elsewhere needs its directories in ``sandbox_read_paths``
(the start fails naming the setting when the program itself, or the interpreter its ``#!`` line
names, is not visible; a missing library only shows as the server failing to start, with its
stderr). The rest is the engine's (see ``amplifier_tools/sandbox.py`` and docs/bash.md): a shared
kernel, no CPU or memory limits, system directories readable.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence

import attrs

from .. import sandbox as engine
from ..builtins.filesystem.paths import configured_path
from ..errors import ConfigError
from .settings import ServerSettings
from .transport import Wrap


def _absolute(paths: Iterable[str], working_dir: str) -> tuple[str, ...]:
    """The paths resolved as every configured path is (``configured_path``: relative to the host's
    working directory, ``..`` collapsed first): the check and the bind see one path (found by
    attack: ``build/../w`` was checked as ``w`` and bound as the link's ``../w``)."""
    return tuple(configured_path(working_dir, path, ()) for path in paths)


def server_cwd(settings: ServerSettings, working_dir: str) -> str:
    """The server's working directory: ``cwd`` resolved against the host's working directory (not
    the process's: a relative ``cwd`` was checked against one and bound against the other), or
    the host's working directory."""
    return configured_path(working_dir, settings.cwd, ()) if settings.cwd else os.path.realpath(working_dir)


def view_for(settings: ServerSettings, working_dir: str, protected: Iterable[str], name: str = "") -> engine.View:
    """What the server sees (see the module docstring). ``ConfigError`` for a directory to bind that
    is ``/`` itself: bound over the view's fresh ``/proc``, ``/dev`` and ``/tmp`` it would show the
    host's (its processes' command lines, its home directories) or break the sandbox's start."""
    where = f"plugins.mcp.servers.{name}"
    cwd = server_cwd(settings, working_dir)
    writable = _absolute(settings.sandbox_write_paths, working_dir)
    read_only = (*engine.SYSTEM_PATHS, *_absolute(settings.sandbox_read_paths, working_dir))
    for key, paths in (("cwd", (cwd,)), ("sandbox_write_paths", writable), ("sandbox_read_paths", read_only)):
        if "/" in paths:
            raise ConfigError("the sandbox cannot bind / (the whole host) into the server's view; name the "
                              "directories the server needs" + (" (the host's working directory is /: set cwd)"
                                                                 if key == "cwd" and not settings.cwd else ""),
                              key=f"{where}.{key}")
    view = engine.View(cwd=cwd, writable=writable, read_only=read_only, protected=tuple(protected),
                       network=settings.sandbox_network)
    return view if engine.visible(cwd, view) else attrs.evolve(view, read_only=(*read_only, cwd))


async def sandbox_wrap(name: str, settings: ServerSettings, working_dir: str, protected: Iterable[str],
                       writable: Sequence[str] = ()) -> Wrap | None:
    """The function that turns the server's resolved argv into its sandboxed argv, or None for
    ``sandbox = "off"``. Raises ``ToolSystemError`` (``sandbox_unavailable``) when bubblewrap is
    missing or cannot make a sandbox here. The probe runs once per process, in a thread. No
    ``bwrap`` inside ``writable`` (every path the host's tools and sandboxed processes may write),
    the working directory or the server's own write paths is run (found by attack: one planted
    in another server's write path was)."""
    if settings.sandbox == "off":
        return None
    where = f"[plugins.mcp.servers.{name}]"
    view = view_for(settings, working_dir, protected, name)
    session = (os.path.realpath(working_dir), *writable)

    def check_paths() -> None:
        """At the start and before each (re)start: no configured path through a symlink inside a
        path the host's tools may write (``configured_path``; found by attack: a bash command swapped
        a server's path for a symlink, and the server's next start bound what it named), and none
        the sandbox cannot bind (``view_problem``, with every such path counted as writable: a read
        path or ``cwd`` inside the working directory could be swapped before the bind)."""
        for field, paths in (("sandbox_write_paths", settings.sandbox_write_paths),
                             ("sandbox_read_paths", settings.sandbox_read_paths),
                             ("cwd", (settings.cwd,) if settings.cwd else ())):
            for path in paths:
                configured_path(working_dir, path, session, f"plugins.mcp.servers.{name}.{field}")
        problem = engine.view_problem(attrs.evolve(view, writable=(*view.writable, *session)))
        if problem is not None:
            path, why = problem
            field = "sandbox_read_paths" if path in view.read_only else "sandbox_write_paths"
            if path == view.cwd and path not in _absolute(settings.sandbox_read_paths, working_dir):
                field = "cwd"
                why += (" (the server's working directory: cwd, by default the host's; set cwd to a directory "
                        "no tool may write, or sandbox = \"off\")")
            raise ConfigError(f"the sandbox cannot bind {path}: {why}", key=f"plugins.mcp.servers.{name}.{field}")

    check_paths()
    bwrap, reason = await engine.find_bwrap(exclude=(*session, *view.writable))
    if bwrap is None or reason is not None:
        raise engine.unavailable(reason or "no usable bwrap", where)
    key = f"plugins.mcp.servers.{name}.sandbox_read_paths"

    def wrap(argv: Sequence[str], *, info_fd: int | None = None) -> list[str]:
        program = os.path.realpath(argv[0])
        if not (engine.visible(argv[0], view) and engine.visible(program, view)):
            raise ConfigError(f"the server's program {argv[0]} ({program}) lies outside the sandbox's view; add "
                              "its directories (and those of its interpreter and libraries) to "
                              "sandbox_read_paths", key=key)
        interpreter = _interpreter(program)
        # One that does not exist is no matter of the view (found by attack: "#!/nonexistent/python"
        # was answered "add its directories to sandbox_read_paths"); the start fails as unconfined.
        if interpreter is not None and os.path.exists(interpreter) and not (
                engine.visible(interpreter, view) and engine.visible(os.path.realpath(interpreter), view)):
            # found by a newcomer's trial: a virtual environment's console script was in the view and
            # its interpreter (a link to the base Python) was not: bwrap's "execvp …: No such file
            # or directory" named neither the interpreter nor this setting
            raise ConfigError(f"the interpreter of the server's program {argv[0]} (its #! line), {interpreter} "
                              f"({os.path.realpath(interpreter)}), lies outside the sandbox's view; add its "
                              "directories (and those of its libraries) to sandbox_read_paths", key=key)
        check_paths()
        return engine.command(view, argv, bwrap=bwrap, info_fd=info_fd)

    return wrap


def _interpreter(program: str) -> str | None:
    """The absolute path a script's ``#!`` line names (its first word, within the 256 bytes the
    kernel reads), None for a program without one, one that cannot be read here or is no regular
    file, or a first word the 256 bytes cut (the kernel refuses to run it: found by attack, the cut
    path was named as lying outside the view). The file is opened without blocking and judged by
    its ``fstat``, not by a check before the open: found by attack, a FIFO swapped in after
    ``isfile`` blocked the open, and the host's event loop."""
    try:
        descriptor = os.open(program, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(descriptor, 256) if stat.S_ISREG(os.fstat(descriptor).st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(descriptor)
    line, newline, _ = head[2:].partition(b"\n") if head.startswith(b"#!") else (b"", b"", b"")
    words = line.split()
    if not words or not words[0].startswith(b"/") or (not newline and len(head) == 256 and line.lstrip() == words[0]):
        return None
    return os.fsdecode(words[0])
