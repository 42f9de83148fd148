"""The bash plugin: one tool, ``local::bash``, that runs a command line under ``bash -c``.

A built-in that uses only the public hooks: ``mount`` reads the plugin's
config section and mounts the tool. Paths (the call's ``cwd``, the sandbox's
writable roots and the paths it masks) go through the one path-rule engine:
the filesystem plugin's ``PathRules`` (capability ``fs.path_rules``), or a
``PathRules`` of this plugin's own ``allowed_paths`` when those are configured
or the filesystem plugin is disabled; either holds the host's protected paths.
The spill directory is host state: relative to ``state_dir``, created ``0700``,
and published as a protected path (key ``plugins.bash.spill_dir``), so the host
refuses it inside a writable root. One instance per host.

The sandbox (``sandbox = "auto"``, the default) is probed once per host start, in a thread started
when the plugin is created (a host creates its plugins before it mounts any, so the probe runs
while the others load; one started more than ``PROBE_FRESH_S`` before the mount is not used) and
awaited at mount; where it cannot work, the tool is still mounted and every call fails with
``sandbox_unavailable`` naming the fix. ``sandbox = "off"`` is logged as a warning at mount and
shown in the tool's description and tags (``describe local::bash``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pwd
import shutil
import stat
import time
from typing import Any, Final

from ... import sandbox as engine
from ..._markers import hookimpl
from ...errors import ConfigError
from ...hoststate import ProtectedPaths
from ...plugin_settings import structure_settings
from ..filesystem.paths import PathRules, configured_path
from .process import Limits
from .rules import CommandRules
from .settings import BashSettings
from .tool import BashTool, Settings

PLUGIN: Final = "bash"
#: How long before its mount the probe started with the plugin may have started and still be used.
PROBE_FRESH_S: Final = 10.0
log = logging.getLogger("amplifier_tools.bash")

def _user(value: str | int | None) -> tuple[int, int] | None:
    """``(uid, gid)`` to run commands as, or None for the host's own user."""
    if value is None:
        return None
    where = f"plugins.{PLUGIN}.user"
    try:
        entry = pwd.getpwuid(value) if isinstance(value, int) else pwd.getpwnam(value)
    except KeyError:
        raise ConfigError(f"no such user {value!r}", key=where) from None
    if entry.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise ConfigError(f"running commands as {entry.pw_name!r} needs the host to run as root", key=where)
    return entry.pw_uid, entry.pw_gid


class BashPlugin:
    """Mounts ``local::bash``; one instance per host."""

    name = PLUGIN

    def __init__(self) -> None:
        self.tool: BashTool | None = None
        # The probe's answer for the first mount (not used with sandbox = "off").
        self._probe_started = time.monotonic()
        self._sandbox_probe: concurrent.futures.Future[tuple[str | None, str | None]] | None = \
            engine.start_find_bwrap()

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        settings = structure_settings(config, BashSettings, f"plugins.{PLUGIN}")
        working_dir = coordinator.get_capability("session.working_dir")
        found = coordinator.get_capability("session.protected_paths")
        protected = found if isinstance(found, ProtectedPaths) else ProtectedPaths()
        own_rules: PathRules | None = None
        if settings.allowed_paths is not None:
            roots = settings.allowed_paths
            own_rules = PathRules(working_dir, read_roots=roots, write_roots=roots, write_denied=(),
                                  protected=protected, keys=(f"plugins.{PLUGIN}.allowed_paths",) * 2)
            writable = coordinator.get_capability("session.writable_roots")
            if isinstance(writable, list):  # the host refuses host state inside these at start
                writable.extend(own_rules.write_roots)
        fallback = PathRules(working_dir, read_roots=[working_dir], write_roots=[working_dir], write_denied=(),
                             protected=protected)

        def path_rules() -> PathRules:
            # Looked up per call: the filesystem plugin may mount after this one.
            rules = own_rules or coordinator.get_capability("fs.path_rules")
            return rules if isinstance(rules, PathRules) else fallback

        confining = settings.sandbox not in ("off", "none")  # unconfined, the sandbox's paths are never bound
        write_paths = self._sandbox_write_paths(settings.sandbox_write_paths, working_dir, protected,
                                                path_rules().write_roots) if confining else ()
        writable = coordinator.get_capability("session.writable_roots")
        if isinstance(writable, list):  # the host refuses host state inside these at start
            writable.extend(write_paths)
        writable_now = (os.path.realpath(working_dir), *path_rules().write_roots, *write_paths)
        read_paths = tuple(configured_path(working_dir, path, writable_now, f"plugins.{PLUGIN}.sandbox_read_paths")
                           for path in settings.sandbox_read_paths) if confining else ()
        configured = coordinator.get_capability("session.configured_paths")
        if isinstance(configured, list):  # checked again once every plugin is mounted
            for key, paths in (("allowed_paths", settings.allowed_paths or ()),
                               ("sandbox_read_paths", settings.sandbox_read_paths if confining else ()),
                               ("sandbox_write_paths", settings.sandbox_write_paths if confining else ())):
                configured.extend((path, f"plugins.{PLUGIN}.{key}") for path in paths)
        probed, self._sandbox_probe = self._sandbox_probe, None
        if time.monotonic() - self._probe_started > PROBE_FRESH_S:
            probed = None  # the plugin was made long before this mount: probe now
        # Every path a command may write, as far as known now (the filesystem plugin mounts first).
        commands_write = (*(writable if isinstance(writable, list) else ()), working_dir, *write_paths,
                          *path_rules().write_roots)
        if confining:
            roots_key = f"plugins.{PLUGIN}.allowed_paths" if own_rules is not None else \
                "plugins.filesystem.allowed_write_paths"
            self._check_view(read_paths, write_paths, path_rules().write_roots, roots_key)
        user = _user(settings.user)
        if confining and user is not None:
            self._check_reachable(user, settings.user, working_dir, read_paths, write_paths,
                                  path_rules().write_roots, roots_key, protected)
        confined, bwrap, unavailable = await self._sandbox(settings.sandbox, probed, commands_write)
        spill_dir = settings.spill_dir
        if spill_dir is not None:
            spill_dir = self._spill_dir(spill_dir, coordinator, own_rules, protected)
        limits = Limits(settings.max_cpu_seconds, settings.max_memory_bytes, settings.max_processes,
                        settings.max_file_size_bytes)
        # The registry itself, not ``registry or ()``: it is empty until a secret is resolved, often
        # after this mount (a caller's resolver), and it is read at each call.
        registry = coordinator.get_capability("session.secrets")
        self.tool = BashTool(Settings(
            default_timeout=settings.default_timeout,
            max_timeout=settings.max_timeout,
            kill_grace=settings.kill_grace,
            max_output_bytes=settings.max_output_bytes,
            spill_dir=spill_dir,
            env_allowlist=settings.env_allowlist,
            env=dict(settings.env),
            secrets=dict(settings.secrets),
            rules=CommandRules(settings.allow, settings.deny),
            sandbox=confined,
            sandbox_unavailable=unavailable,
            sandbox_network=settings.sandbox_network,
            sandbox_read_paths=read_paths,
            sandbox_write_paths=write_paths,
            user=user,
            limits=limits,
            bash=shutil.which("bash") or "/bin/bash",
            prlimit=shutil.which("prlimit"),
            bwrap=bwrap,
            session_writable=writable if isinstance(writable, list) else (),
        ), path_rules, secrets=() if registry is None else registry)
        await coordinator.mount("tools", self.tool)

    @staticmethod
    async def _sandbox(mode: str, probed: concurrent.futures.Future[tuple[str | None, str | None]] | None,
                       commands_write: tuple[str, ...]) -> tuple[bool, str | None, str | None]:
        """(confined, bwrap, why no sandbox works here or None); ``off`` is logged as a warning.
        ``probed``: the probe started with the plugin, or None to probe now (a second mount, or
        a bwrap outside the system directories); never a bwrap inside ``commands_write``."""
        if mode in ("off", "none"):
            alias = " ('none' is a deprecated alias of 'off')" if mode == "none" else ""
            log.warning("bash runs UNCONFINED: [plugins.%s] sandbox = %r%s; commands run as the host's user with "
                        "its whole filesystem, processes and network", PLUGIN, mode, alias)
            return False, None, None
        if probed is not None:
            bwrap, reason = await asyncio.wrap_future(probed)
            if bwrap is None or engine.writable_by_commands(bwrap, commands_write) is None:
                return True, bwrap, reason
        bwrap, reason = await engine.find_bwrap(exclude=commands_write)  # never one a command may have planted
        return True, bwrap, reason

    @staticmethod
    def _check_view(read_paths: tuple[str, ...], write_paths: tuple[str, ...], roots: tuple[str, ...],
                    roots_key: str) -> None:
        """``ConfigError`` naming the key for a read or write path the sandbox cannot bind safely
        (``sandbox.view_problem``): ``/``, ``/proc``, ``/dev``, a writable path holding the system
        directories, a read path inside a writable root. ``roots``: the write roots, set by
        ``roots_key``."""
        problem = engine.view_problem(engine.View(cwd="/", writable=(*roots, *write_paths), read_only=read_paths))
        if problem is not None:
            path, reason = problem
            key = f"plugins.{PLUGIN}.sandbox_read_paths" if path in read_paths else \
                f"plugins.{PLUGIN}.sandbox_write_paths" if path in write_paths else roots_key
            raise ConfigError(f"the sandbox cannot bind {path}: {reason}", key=key)

    @staticmethod
    def _check_reachable(user: tuple[int, int], name: str | int | None, working_dir: str,
                         read_paths: tuple[str, ...], write_paths: tuple[str, ...], roots: tuple[str, ...],
                         roots_key: str, protected: ProtectedPaths | None = None) -> None:
        """``ConfigError`` naming the key for a path the sandbox binds that the configured ``user``
        cannot reach (``sandbox.closed_to``): bwrap runs as that user, and every command would end
        in ``sandbox_failed`` ("Can't find source path ...: Permission denied"). The working
        directory must also let the user in: the commands start there."""
        checks = [(os.path.realpath(working_dir), "working_dir", True),
                  *((path, f"plugins.{PLUGIN}.sandbox_read_paths", False) for path in read_paths),
                  *((path, f"plugins.{PLUGIN}.sandbox_write_paths", False) for path in write_paths),
                  *((root, roots_key, False) for root in roots)]
        for path, key, enter in checks:
            closed = engine.closed_to(path, *user, enter=enter)
            if closed is not None:
                directory, info = closed
                raise ConfigError(
                    f"{path} is out of reach of the user {name!r} the sandboxed commands run as: {directory} "
                    f"(mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}) does not let it in, "
                    "so every command would fail to start", key=key,
                    hint=f"use a path that user can reach, let it into {directory} (chmod o+x, or its group), "
                         f"or remove plugins.{PLUGIN}.user")
        # The sandbox hides each protected path it shows by mounting over it, which looks it up as that
        # user too (found by attack: a configuration file in a 0700 directory inside the working
        # directory ended every command with "Can't create file at ...: Permission denied").
        view = engine.View(cwd="/", writable=(os.path.realpath(working_dir), *roots, *write_paths),
                           read_only=(*engine.SYSTEM_PATHS, *read_paths))
        for entry in protected or ():
            if entry.alias or not engine.visible(entry.path, view) or not os.path.lexists(entry.path):
                continue
            closed = engine.closed_to(entry.path, *user)
            if closed is not None:
                directory, info = closed
                raise ConfigError(
                    f"{entry.path} ({entry.reason}), which the sandbox hides from commands, is out of reach of the "
                    f"user {name!r} they run as: {directory} (mode {stat.S_IMODE(info.st_mode):04o}, owner uid "
                    f"{info.st_uid}) does not let it in, so every command would fail to start",
                    key=entry.key or f"plugins.{PLUGIN}.user",
                    hint=f"move it out of {directory}, let that user into {directory}, or remove plugins.{PLUGIN}.user")

    @staticmethod
    def _sandbox_write_paths(paths: tuple[str, ...], working_dir: str, protected: ProtectedPaths,
                             roots: tuple[str, ...]) -> tuple[str, ...]:
        """The extra writable paths, resolved like writable roots (``configured_path``: none through a
        symlink inside the working directory, the write ``roots`` or an earlier one); one inside host
        state is refused."""
        writable = [os.path.realpath(working_dir), *roots]
        resolved: list[str] = []
        for path in paths:
            resolved.append(configured_path(working_dir, path, writable, f"plugins.{PLUGIN}.sandbox_write_paths"))
            writable.append(resolved[-1])
        for root in resolved:
            entry = protected.protects(root)
            if entry is not None:
                raise ConfigError(f"{root} lies inside {entry.path} ({entry.reason}), which the host keeps out of "
                                  "every tool's reach", key=f"plugins.{PLUGIN}.sandbox_write_paths")
        return tuple(resolved)

    @staticmethod
    def _spill_dir(configured: str, coordinator: Any, own_rules: PathRules | None,
                   protected: ProtectedPaths) -> str:
        """The spill directory (relative to ``state_dir``), published as protected; created (0700) at
        the first spill, so a directory the host refuses at start is never made.

        The host refuses it inside the working directory or the filesystem plugin's write roots;
        this plugin's own ``allowed_paths`` are checked here.
        """
        where = f"plugins.{PLUGIN}.spill_dir"
        state_dir = coordinator.get_capability("session.state_dir")
        configured = os.path.expanduser(configured)
        if state_dir is None and not os.path.isabs(configured):
            raise ConfigError("must be an absolute path: this host has no state_dir", key=where)
        path = os.path.abspath(os.path.join(state_dir or "/", configured))
        protected.add(path, "the bash plugin's spill directory", key=where)
        for root in own_rules.write_roots if own_rules is not None else ():
            if any(entry.key == where for entry in protected.inside(root)):
                raise ConfigError(f"{path} lies inside {root}, which commands may write; host state must live "
                                  "outside every writable root", key=where)
        return path
