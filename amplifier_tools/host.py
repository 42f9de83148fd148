"""``ToolHost``: loads plugins, mounts tools, and runs calls through the pipeline.

Start-up order: validate config -> register built-in plugins -> plugins passed
in code -> ``amplifier_tools`` entry points -> seed-style modules
(``amplifier.modules`` entry points and config ``modules``) -> call each
plugin's ``mount`` with its own config section. A plugin that fails to import
or mount is unregistered and reported in ``host.failed_plugins``; if it was
required (a built-in, named in config or in the allowlist) start fails with
``PluginLoadError`` instead, because running without a wanted policy plugin
would fail open. A plugin whose ``mount`` raises ``ConfigError`` stops the start
whatever its source (configure it or disable it); a bad per-tool override in
``tools`` is a ``ConfigError`` naming the key and the file.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from . import config_trust, hookspecs
from ._markers import PROJECT_NAME
from ._version import __version__
from .amplifier_hooks import HookRegistry, ToolHandlerImpls
from .builtins import BUILTIN_PLUGINS
from .builtins.filesystem.paths import configured_path
from .config import (
    DEFAULT_HOOK_TIMEOUT_MS,
    DEFAULT_SHUTDOWN_GRACE_MS,
    DEFAULT_TIMEOUT_MS,
    discover_config_file,
    load_config_file,
    plugin_section,
    validate_config,
)
from .coordinator import Coordinator
from .definitions import model_name, tool_definitions
from .dispatch import (
    HookDispatcher,
    HookWrapperRefused,
    PluginManager,
    PluginSettings,
    being_cancelled,
    counting_from_here,
    finish_despite_cancel,
    requests_before,
    stop_counting,
    thrown_in,
    works_for,
)
from .errors import (
    ConfigError,
    ContractError,
    PluginLoadError,
    ToolError,
    ToolSystemError,
    did_you_mean,
    one_slip_apart,
)
from .hoststate import HostFileError, ProtectedPaths, default_state_dir, ensure_state_dir
from .loader import (
    ENTRY_POINT_GROUP,
    SEED_ENTRY_POINT_GROUP,
    FailedPlugin,
    PluginInfo,
    SeedModule,
    ToolMount,
    as_plugin,
    env_names,
    installed_entry_points,
    instantiate,
    load_target,
    misfit_hooks,
    plugin_name,
    seed_from_config,
    seed_from_entry_point,
)
from .models import (
    ContextFieldError,
    ToolCall,
    ToolContext,
    ToolResult,
    context_problem,
    new_call_id,
)
from .pipeline import CallPipeline, unrecorded_refusal
from .redaction import RecordingResolver, SecretSet, chain_without_secrets, redact_text
from .registry import ToolRegistry
from .secrets_table import EnvironmentSecrets
from .spec import ToolSpec

log = logging.getLogger("amplifier_tools")

#: This process's id, kept current in a child made by ``os.fork`` (``os.register_at_fork``): a call
#: compares it with its host's, where ``os.getpid()`` would be a system call per call. A fork made
#: around Python's ``os.fork`` (through ``ctypes``) is not seen.
_process_id = os.getpid()


#: A plugin that sets no ``hook_timeout_ms`` of its own (in its section or as an attribute).
_NOT_SET: Final = object()


def _forked() -> None:
    global _process_id
    _process_id = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)

__all__ = ["ENTRY_POINT_GROUP", "ENV_CONFIG", "ENV_DISABLE", "ENV_LOAD", "ENV_TRACE", "SEED_ENTRY_POINT_GROUP",
           "FailedPlugin", "PluginInfo", "SeedModule", "ToolHost", "ToolMount"]

ENV_CONFIG = "AMPLIFIER_TOOLS_CONFIG"
ENV_DISABLE = "AMPLIFIER_TOOLS_DISABLE_PLUGINS"
ENV_LOAD = "AMPLIFIER_TOOLS_LOAD_PLUGINS"
ENV_TRACE = "AMPLIFIER_TOOLS_TRACE"


def _refused_context(wrong: Exception) -> ContractError:
    """The error of a call whose ``ToolContext`` ``models.context_problem`` refuses: ``invalid_context``,
    with the field and a hint when an identifier is refused (``models.identifier_problem``)."""
    if not isinstance(wrong, ContextFieldError):
        return ContractError(f"context: {wrong}", code="invalid_context")
    return ContractError(f"context: {wrong}", code="invalid_context", field=wrong.field,
                         hint=f"set ToolContext.{wrong.field} to a short identifier that holds no secret or "
                              "credential (docs/contract.md, 'Identifiers'), or leave it unset")


def _check_working_dir_argument(given: str) -> None:
    """``ToolHost(working_dir=...)`` (``serve-mcp --working-dir``) that names no directory at all:
    ``ConfigError`` naming ``working_dir``. An empty one (found by attack: ``--working-dir "$WD"``
    with ``WD`` unset ran in the current directory without a word) or one with a NUL byte (it ended
    in a bare ``ValueError``)."""
    if not given or "\x00" in given:
        problem = "is empty" if not given else "contains a NUL byte"
        raise ConfigError(f"the working directory given {problem}", key="working_dir",
                          hint="pass the directory to work in (ToolHost(working_dir=...); amplifier-tools "
                               "serve-mcp --working-dir), or leave it out for the current directory")


def _checked_builtins(names: Any) -> tuple[str, ...]:
    """``ToolHost(builtins=[...])``: names of built-in plugins, each one of them. ``ConfigError``
    naming ``builtins`` otherwise (found by attack: ``builtins=["polcy", "audit"]`` or
    ``builtins="policy"``, read as its letters, mounted no policy plugin without a word)."""
    known = sorted(BUILTIN_PLUGINS)
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ConfigError(f"must be True, False or a list of built-in plugin names, got {names!r}", key="builtins",
                          hint=f"e.g. builtins=[{names!r}]" if isinstance(names, str) else
                          f"the built-in plugins: {', '.join(known)}")
    checked = tuple(names)
    for name in checked:
        if name not in BUILTIN_PLUGINS:
            raise ConfigError(f"{name!r} is no built-in plugin (the built-ins: {', '.join(known)})", key="builtins",
                              hint=did_you_mean(name, known) if isinstance(name, str) else None)
    return checked


class ToolHost:
    """The runtime. Use as ``async with ToolHost(config=...) as host:``.

    ``config`` is a mapping or a path to a config file. Without one,
    ``discover=True`` looks for ``$AMPLIFIER_TOOLS_CONFIG``, then
    ``./amplifier-tools.toml``, then ``[tool.amplifier-tools]`` in
    ``./pyproject.toml``; ``discover=False`` (the default for library use is
    True) starts from an empty configuration. ``plugins`` registers plugin
    objects directly (after the built-ins); ``builtins=False`` and
    ``entry_points=False`` skip those sources (useful in tests).
    ``installed_modules=False`` loads an installed Amplifier module (an ``amplifier.modules``
    entry point) only when the configuration's mount plan names it; the reverse direction
    (``amplifier_module``) uses it, since there the Amplifier session mounts its own modules.
    ``plugin_env=False`` ignores ``AMPLIFIER_TOOLS_DISABLE_PLUGINS`` and ``AMPLIFIER_TOOLS_LOAD_PLUGINS``:
    only the arguments and the configuration choose the plugins (a check whose verdict must not
    depend on the shell it runs in: ``validate``'s name-collision check).
    Many calls may run concurrently on one host, on the event loop it runs on (``_elsewhere``).
    """

    def __init__(
        self,
        config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        plugins: Iterable[Any] = (),
        builtins: bool | Iterable[str] = True,
        entry_points: bool = True,
        installed_modules: bool = True,
        working_dir: str | os.PathLike[str] | None = None,
        discover: bool = True,
        plugin_env: bool = True,
    ) -> None:
        if working_dir is not None:
            _check_working_dir_argument(os.fspath(working_dir))
        #: Whether the host looked for its configuration itself (see ``config_trust``).
        self.discovered_config = config is None and discover
        if config is None and discover:
            config = discover_config_file(working_dir)
        #: The file the configuration came from, named in configuration errors (None: from code).
        self.config_file: str | None = None
        #: The SHA-256 of the configuration file's bytes as loaded (what ``config_trust`` judges).
        self.config_sha256: str | None = None
        #: Every secret value resolved in this run (``session.secrets``): redacted from every tool's
        #: output, every error, audit record and span.
        self.secrets = SecretSet()
        if isinstance(config, (str, os.PathLike)):
            self.config_file = os.fspath(config)
            substituted: set[str] = set()
            digests: list[str] = []
            try:
                self.config = load_config_file(config, substituted=substituted, sha256=digests)
            except ConfigError as exc:
                # A file that cannot be loaded is still judged by the trust check first (the working
                # directory the file names is not known: only the one the host was started in).
                root = str(Path(working_dir or os.getcwd()).expanduser().resolve())
                refused = config_trust.unloadable(
                    exc, config_trust.record_dir(root, self.config_file, discovered=self.discovered_config),
                    self.config_file, (root,), sha256=digests[0] if digests else None)
                if refused is exc:
                    raise
                raise refused from None
            self.config_sha256 = digests[0] if digests else None
            self.secrets.update(substituted)
        else:
            self.config = validate_config(config)
        self._extra_plugins = list(plugins)
        #: The built-in plugins to load, each checked to be one (``True``: all of them).
        self._builtins: tuple[str, ...] = tuple(BUILTIN_PLUGINS) if builtins is True else () \
            if builtins is False else _checked_builtins(builtins)
        self._entry_points = entry_points
        self._installed_modules = installed_modules
        self._plugin_env = plugin_env
        #: The working directory the operator started the host in, before the configuration could
        #: name another: a configuration file inside it must be trusted (``config_trust``).
        self.trust_root = str(Path(working_dir or os.getcwd()).expanduser().resolve())
        #: Where the trust record is kept: never a directory the configuration chose.
        self.trust_dir = config_trust.record_dir(self.trust_root, self.config_file, discovered=self.discovered_config)
        wd = working_dir or self.config.get("working_dir") or os.getcwd()
        #: The working directory as given (None: the process's own), checked like a configured path.
        self._working_dir_given = working_dir or self.config.get("working_dir")
        self._working_dir_argument = working_dir
        self.working_dir = str(Path(wd).expanduser().resolve())
        configured_state = self.config.get("state_dir")
        #: Where the host keeps its own state (created 0700 at start); outside the working directory.
        self.state_dir = Path(os.path.abspath(os.path.expanduser(configured_state))) if configured_state \
            else default_state_dir(self.working_dir)
        #: Paths no tool may read or write (``session.protected_paths``); plugins add their host files.
        self.protected_paths = ProtectedPaths()
        self.protected_paths.add(self.state_dir, "the host's state directory", key="state_dir")
        # Every workspace's default state, not only this one's: another host's log, and the trust
        # records, which live there whatever state_dir is configured (``config_trust.record_dir``).
        self.protected_paths.add(self.trust_dir.parent.parent, "the hosts' state directories")
        if self.config_file is not None:
            self.protected_paths.add(self.config_file, "the host's configuration file")
        # Where a config would be discovered next start: a tool must not plant one there.
        self.protected_paths.add(Path(self.working_dir) / "amplifier-tools.toml", "a configuration file location")
        self.session_id = "session_" + uuid.uuid4().hex
        self.plugin_manager = PluginManager(PROJECT_NAME)
        self.plugin_manager.add_hookspecs(hookspecs)
        trace = os.environ.get(ENV_TRACE, "") not in ("", "0")
        self.dispatcher = HookDispatcher(
            self.plugin_manager,
            default_timeout=self.config.get("hook_timeout_ms", DEFAULT_HOOK_TIMEOUT_MS) / 1000.0,
            trace=trace,
        )
        self.dispatcher.secrets = self.secrets
        if trace:  # through pluggy's hook-call monitoring (added after the dispatcher noted the plain executor)
            self.plugin_manager.add_hookcall_monitoring(_trace_before,
                                                        functools.partial(_trace_after, secrets=self.secrets))
        self.tools = ToolRegistry(self.config["tools"] if isinstance(self.config.get("tools"), dict) else None)
        #: Amplifier's hook registry: events, and ``tool:*`` handlers run inside the call chain.
        self.events = HookRegistry(self)
        self.dispatcher.extra_impls = ToolHandlerImpls(self, self.events).impls
        self.mounts: dict[str, dict[str, Any]] = {}
        self.capabilities: dict[str, Any] = {
            "session.working_dir": self.working_dir,
            "session.state_dir": str(self.state_dir),
            "session.protected_paths": self.protected_paths,
            "session.default_timeout_ms": self.config.get("default_timeout_ms", DEFAULT_TIMEOUT_MS),
            # Plugins whose tools write outside the filesystem plugin's roots add those roots here, so a
            # host-state path inside them is refused at start.
            "session.writable_roots": [],
            # Plugins add the paths their configuration names, as written, with the setting's key:
            # once every plugin is mounted, none may lead through a symbolic link that tools may write
            # (``_check_configured_paths``).
            "session.configured_paths": [],
        }
        self.contributors: dict[str, list[tuple[str, Callable[[], Any]]]] = {}
        self.cleanups: list[tuple[str, Callable[[], Any | Awaitable[Any]]]] = []
        self.plugins: list[PluginInfo] = []
        self.failed_plugins: list[FailedPlugin] = []
        self._pending: list[tuple[Any, PluginInfo, bool]] = []
        self._pipeline: CallPipeline | None = None
        self._closed = False
        #: Set once the host's one ``start`` has ended (None: never begun); the task running it.
        self._starting: asyncio.Event | None = None
        #: A ``close()`` awaited while the start was under way was cancelled: the start closes the host.
        self._close_when_started = False
        self._starter: asyncio.Task[Any] | None = None
        #: The event loop the host's calls run on, and the process it was started in (``_elsewhere``).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = _process_id
        #: Set while a ``close()`` runs the cleanups (another one waits for it).
        self._cleaning: asyncio.Event | None = None
        self._cleaner: asyncio.Task[Any] | None = None
        self._default_context = self._make_default_context()
        # Host-level secrets (config ``secrets``) for plugins, e.g. the audit checkpoint key:
        # a callable name -> value that raises AuthError naming an unresolvable reference. What it
        # resolves is registered in ``session.secrets``, as is anything a plugin adds there itself.
        self.capabilities["session.secret"] = self._default_context.secret
        self.capabilities["session.secrets"] = self.secrets

    # -- lifecycle -------------------------------------------------------------

    @property
    def trust_roots(self) -> tuple[str, str]:
        """The directories a configuration file inside which must be trusted (``config_trust``):
        the operator's working directory and the one the configuration names."""
        return self.trust_root, self.working_dir

    async def __aenter__(self) -> ToolHost:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def _check_working_dir(self) -> None:
        """A working directory that does not exist, or is no directory, stops the start (every
        path argument is resolved from it: the calls would all fail, one by one)."""
        if not os.path.isdir(self.working_dir):
            what = "is not a directory" if os.path.exists(self.working_dir) else "does not exist"
            if self._working_dir_argument is None and self.config.get("working_dir"):  # the config's
                raise ConfigError(f"the working directory {self.working_dir} {what}", key="working_dir",
                                  file=self.config_file, hint="create the directory, or set working_dir in "
                                  f"{self.config_file or 'the configuration'} to an existing one")
            raise ConfigError(f"the working directory {self.working_dir} {what}", key="working_dir",
                              hint="create it, or pass an existing directory (ToolHost(working_dir=...); "
                                   "amplifier-tools serve-mcp --working-dir; the other commands work in the "
                                   "current directory)")

    async def start(self) -> None:
        """Load every plugin and mount it; raises ``ConfigError``/``PluginLoadError``.

        A host starts once: a started host's ``start`` returns at once, one awaited while another
        ``start`` of the host is under way waits for it (and raises ``ToolSystemError``
        ``host_closed`` if that one failed), and a host that was closed, or whose start failed,
        raises ``ToolSystemError`` ``host_closed`` (make a new ``ToolHost``). Found by attack: a
        second ``start`` while the first mounted failed with "a plugin with this name is already
        registered" and, closing, ran the first one's cleanups (the audit writer's: calls
        succeeded unrecorded); a start after ``close`` failed with the same misleading error.
        """
        if self._pipeline is not None:
            return
        starting = self._starting
        if starting is not None and not starting.is_set():
            await starting.wait()
            if self.started:  # the other start succeeded
                return
        if self._closed or starting is not None:
            what = "was closed" if self._closed else "failed to start"
            raise ToolSystemError(f"this host {what}; a ToolHost starts once: make a new ToolHost",
                                  code="host_closed")
        self._starting = asyncio.Event()
        self._starter = asyncio.current_task()
        counting = counting_from_here(self._starter)  # a cancellation pending already is not the start's
        try:
            await self._start()
        finally:
            stop_counting(counting)
            self._starting.set()
            self._starter = None
        if self._close_when_started:  # a close() awaited meanwhile was cancelled: it is done here
            await self.close()

    async def _start(self) -> None:
        """``start``'s work, run once."""
        try:
            self._check_working_dir()
            self._make_state_dir()
            first_trust = config_trust.check(self.trust_dir, self.config_file, self.trust_roots,
                                             discovered=self.discovered_config, sha256=self.config_sha256)
            self._collect_plugins()
            self.events.starting()
            for plugin, info, required in self._mount_order():
                await self._mount_plugin(plugin, info, required)
            self._check_config_references()
            self._check_protected_paths()
            self._check_configured_paths()
            if first_trust is not None:
                self._make_state_dir(self.trust_dir)
                config_trust.remember(self.trust_dir, first_trust)
            await self.events.started(mounted=True)
        except (ConfigError, PluginLoadError) as exc:
            await self.events.started(mounted=False)
            await self.close()
            clean = _without_secrets(exc, self.secrets)
            if clean is exc:
                raise
            failed: ConfigError | PluginLoadError | None = clean
        except BaseException:
            await self.events.started(mounted=False)
            await self.close()
            raise
        else:
            failed = None
        if failed is not None:  # raised here, outside the handler: the original (holding the secret) is not its context
            raise failed
        default_timeout = self.config.get("default_timeout_ms", DEFAULT_TIMEOUT_MS) / 1000.0
        self._loop, self._pid = asyncio.get_running_loop(), _process_id
        self._pipeline = CallPipeline(self.tools, self.dispatcher, default_timeout=default_timeout,
                                      secrets=self.secrets)

    async def close(self, *, grace_ms: float | None = None) -> None:
        """Stop admitting calls, let in-flight calls finish, then run cleanups in reverse order.

        New calls end at once in ``SystemError`` ``host_closing`` (recorded like any call).
        In-flight calls get ``shutdown_grace_ms`` (default 5000; ``grace_ms``, when given, instead:
        0 cuts them at once, as a second Ctrl-C does) to finish; a call whose tool had
        not started yet is not started. The rest are cancelled; each ends in ``host_closing``
        and is recorded before the cleanups run (the audit writer's last: it mounts first).
        A cleanup failure (any exception but ``KeyboardInterrupt``) is logged and the next cleanup
        still runs. Two ``close()`` at once: one runs
        the cleanups, the other returns once they have all run. Awaited while ``start`` is
        under way, it waits for that start to end, then closes what it started; cancelled while it
        waits, it raises ``CancelledError`` at once and the start closes the host when it ends.

        Awaited from inside one of this host's own calls (a tool or a hook), it raises
        ``ToolSystemError`` ``close_inside_call`` and changes nothing: it would wait for the call
        awaiting it, then cut it and run the cleanups before the call was recorded (found by attack:
        15 s, and the record lost). ``asyncio.ensure_future(host.close())`` closes the host once
        the call has ended.

        Cancelled while calls use their grace (``task.cancel()``, Ctrl-C under ``asyncio.run``), or
        while the calls it cut record themselves, it still finishes: the grace ends at once (as
        ``grace_ms=0``), the calls are cut and recorded, the cleanups run, then ``CancelledError`` is
        raised (found by attack: it ended where it was, the host half-closed and no cleanup run).
        Cleanups run in the task of ``close()``: a second cancellation while they run stops them, as
        it stops any awaited code. A cancellation already requested when ``close()`` began (``async
        with host:`` left by a cancellation, a close in an ``except CancelledError`` block) is not one
        of this close (CPython 3.11+): a cleanup's own ``CancelledError`` is then its failure, and the
        cleanups after it run.
        """
        counting = counting_from_here(asyncio.current_task())
        try:
            await self._close(grace_ms)
        finally:
            stop_counting(counting)

    async def _close(self, grace_ms: float | None) -> None:
        """``close``'s work."""
        cancelled = False
        current = asyncio.current_task()
        # the cancellation requests not this close()'s (pending as it began, ``requests_before``): those
        # beyond them that reach it while it finishes are withdrawn, every one (``_withdraw``)
        requests = requests_before(current)
        starting = self._starting
        if starting is not None and not starting.is_set() and self._starter is not current:
            try:
                await starting.wait()  # a start under way ends first (found by attack: it mounted on a closed host)
            except asyncio.CancelledError:
                if not starting.is_set():
                    # The start may take long (a slow mount): the cancellation is honoured now and the close
                    # left to the start, which closes the host once it has ended (found by attack: the start
                    # went on and left the host open, its cleanups never run, although close() was awaited).
                    self._close_when_started = True
                    raise
                # The start ended in the turn this close() was cancelled: it no longer looks for a close
                # left to it (found by attack: the host stayed open, its cleanups never run). Closed here,
                # as by a close() cancelled in the grace: the calls are cut, then CancelledError.
                _withdraw(current, requests)
                cancelled = True
        pipeline = self._pipeline
        elsewhere = self._elsewhere("close() was awaited") if pipeline is not None else None
        if elsewhere is not None:
            raise elsewhere
        if pipeline is not None:
            inside = works_for(current) if current is not None else []  # a hook's task of its own too
            if any(task is each for task in pipeline.in_flight.values() for each in inside):
                raise ToolSystemError(
                    "close() was awaited from inside one of this host's own calls; it would wait for that "
                    "call to end. Schedule it instead: asyncio.ensure_future(host.close())",
                    code="close_inside_call")
            pipeline.closing = True
            configured = self.config.get("shutdown_grace_ms", DEFAULT_SHUTDOWN_GRACE_MS)
            grace = 0.0 if cancelled else (configured if grace_ms is None else grace_ms) / 1000.0
            try:
                idle = await pipeline.wait_idle(grace)
            except asyncio.CancelledError:
                # This close() cancelled while calls finish: their grace ends now, as with grace_ms=0;
                # they are cut and recorded and the cleanups run, then the cancellation is raised
                # (found by attack: a cancelled close() left the host half-closed, its calls running
                # on and no cleanup run, the audit writer's among them). Withdrawn while it finishes, as
                # asyncio.timeout withdraws what it handles: a request left standing made a cleanup's own
                # CancelledError read as this close()'s, and the cleanups after it were skipped. Every
                # request is withdrawn: two made in one turn (a Ctrl-C and an asyncio.timeout) reach it
                # as one CancelledError, and withdrawing one left the other standing (found by review).
                _withdraw(current, requests)
                cancelled, idle = True, False
            stuck: frozenset[int] = frozenset()
            if not idle:
                stuck, late = await _finished_withdrawn(self._end_calls(pipeline, cancelled), current, requests)
                cancelled = cancelled or late
            # Calls that entered while this close() woke from its wait (refused as closing, being
            # recorded): none enters now; those are waited for before the cleanups, the audit writer's
            # among them (found by attack: such a call was recorded after the audit log was closed).
            # Not the calls already waited for through the whole bound (a tool that ignores its cut):
            # waited for again, they doubled close()'s time (found by review).
            pipeline.sealed = True
            if pipeline.in_flight.keys() - stuck:
                _, late = await _finished_withdrawn(pipeline.wait_idle(self._recording_bound()), current, requests)
                cancelled = cancelled or late
        self._pipeline = None
        if pipeline is not None or self._starting is None:
            # Closed before any start began, too: a start scheduled before this close() (a task not yet
            # run) is refused, where it mounted every plugin after close() returned and the host stayed
            # open, its cleanups never run (found by review).
            self._closed = True
        # One close() runs the cleanups, one at a time; another waits for it (found by attack: a second
        # close() ran the next cleanups while the first's was still running, the audit writer's among
        # them, and returned before it had ended).
        if self._cleaning is not None and self._cleaner is current:
            return  # a cleanup closing its own host: the close running it goes on with the rest
        while self._cleaning is not None:
            await self._cleaning.wait()
        # In this task, as ever: a cleanup may exit what its mount entered in it (an anyio scope, an
        # exit stack), and a cleanup that hangs can still be cut. Another cancellation arriving while
        # they run stops them, as before.
        await self._run_cleanups()
        if cancelled:
            raise asyncio.CancelledError

    async def _end_calls(self, pipeline: CallPipeline, cancelled: bool) -> frozenset[int]:
        """Cut the calls still in flight and wait while they record themselves; the cut calls (their
        numbers) still in flight once that wait is over (calls that ignore their cut)."""
        count = pipeline.cut_in_flight()
        log.warning("closing: cancelled %d call(s) still running %s", count,
                    "as close() was cancelled" if cancelled else "after shutdown_grace_ms")
        # Cut calls record themselves through their hooks, each bounded by its hook timeout: the wait
        # is bounded by the chains a cut call still runs, every implementation's timeout in turn
        # (found by attack: bounded by one hook timeout, two tool_error hooks that used theirs outlasted
        # it, and the audit writer was closed before the call's record).
        if await pipeline.wait_idle(self._recording_bound()):
            # Idle once: a call in flight now entered since (refused as closing, being recorded) and is
            # waited for by close(), where it was taken for one ignoring its cut and its record lost
            # (found by a fuzz seed: a tool answering its cut by making another call).
            return frozenset()
        stuck = frozenset(number for number in pipeline.in_flight if number in pipeline.cut)
        log.error("closing: %d call(s) did not finish recording; cleanups run anyway", len(stuck))
        return stuck

    def _recording_bound(self) -> float:
        """How long a cut call may take to record itself: the tool_post or tool_error chain, the
        ``tool:post`` or ``tool:error`` event to every ``tool_event`` observer, then tool_complete,
        each implementation within its own hook timeout (found by review: the events were left
        out, and three observers within theirs outlasted the wait: the call was recorded after the
        audit writer's cleanup, so not at all). A synchronous implementation counts as an async one:
        the awaitable it may hand back (a future, as the audit's fsync wait) is awaited within its hook
        timeout too, and which one will cannot be told before it is called (found by review: counted
        only async ones, three such observers within theirs outlasted the wait, and the record was
        lost). A call that ends sooner is not waited for longer: the bound only caps a call that
        ignores its cut."""
        default = self.dispatcher.default_timeout or 10.0

        def chain(hook: str) -> float:
            return sum((impl.timeout if impl.timeout is not None else default)
                       for impl in self.dispatcher.impls(hook))

        ending = max(chain("tool_post"), chain("tool_error")) + chain("tool_event")
        return max(default, ending + chain("tool_complete") + 0.05)

    async def _run_cleanups(self) -> None:
        """Run the cleanups, last registered first; a failure is logged and the next one runs."""
        self._cleaning, self._cleaner = asyncio.Event(), asyncio.current_task()
        try:
            while self.cleanups:
                plugin, cleanup = self.cleanups.pop()
                try:
                    out = cleanup()
                    if inspect.isawaitable(out):
                        await out
                except BaseException as exc:
                    # Any exception but the user's interrupt, this close's own cancellation and a close of
                    # this coroutine is the cleanup's failure (found by attack: a cleanup raising SystemExit,
                    # GeneratorExit or a library's own BaseException ended close(), and the cleanups after
                    # it, the audit writer's last of all, never ran).
                    if isinstance(exc, KeyboardInterrupt) or thrown_in(exc) or (
                            isinstance(exc, asyncio.CancelledError) and being_cancelled()):
                        raise
                    # the traceback with the host's secrets out of its text (found by attack: a cleanup's
                    # error quoting a token went whole to the log)
                    log.error("cleanup of plugin %r failed", plugin,
                              exc_info=chain_without_secrets(exc, self.secrets))
        finally:
            self._cleaning.set()
            self._cleaning = self._cleaner = None

    # -- plugin loading -------------------------------------------------------

    def _disabled(self) -> set[str]:
        return self._env_names(ENV_DISABLE) | set(self.config.get("disable_plugins", [])) | {
            name for name, section in self.config.get("plugins", {}).items() if section.get("enabled") is False
        }

    def _allowlist(self) -> set[str] | None:
        names = self._env_names(ENV_LOAD) | set(self.config.get("load_plugins", []))
        return names or None

    def _env_names(self, variable: str) -> set[str]:
        """The plugin names in the environment variable ``variable``; none with ``plugin_env=False``."""
        return env_names(variable) if self._plugin_env else set()

    def _required(self, name: str) -> bool:
        allow = self._allowlist()
        return name in self.config.get("plugins", {}) or (allow is not None and name in allow)

    def _collect_plugins(self) -> None:
        disabled = self._disabled()
        allow = self._allowlist()
        # One scan of the installed distributions for both groups (each entry_points(group=...) reads them all),
        # none where no distribution declares a plugin (installed_entry_points).
        installed = installed_entry_points() if self._entry_points else None
        if self._builtins:
            wanted = {name: BUILTIN_PLUGINS[name] for name in self._builtins}
            for name, module_path in wanted.items():
                if name in disabled:
                    continue
                self._queue(name, functools.partial(load_target, module_path), "builtin",
                            "amplifier-tools", __version__, required=True)
        for plugin in self._extra_plugins:
            name = plugin_name(plugin)
            if name not in disabled:
                self._queue(name, functools.partial(as_plugin, plugin, name), "code", None, None, required=True)
        if installed is not None:
            for ep in installed[ENTRY_POINT_GROUP]:
                if ep.name in disabled or (allow is not None and ep.name not in allow):
                    continue
                dist = getattr(ep, "dist", None)
                self._queue(ep.name, functools.partial(instantiate, ep.load), "entry_point",
                            dist.name if dist else None,
                            dist.version if dist else None, required=self._required(ep.name))
        planned = self._planned_modules()
        if self._entry_points:  # without the scan, an entry point's name cannot be told from a typo
            self._check_plugin_names({*BUILTIN_PLUGINS, *map(plugin_name, self._extra_plugins), *planned,
                                      *(ep.name for group in (installed or {}).values() for ep in group)})
        if installed is not None:
            for ep in installed[SEED_ENTRY_POINT_GROUP]:
                if ep.value.startswith(f"{__package__}."):
                    continue  # our own module for Amplifier coordinators (amplifier_module), not for us
                if ep.name in disabled or (allow is not None and ep.name not in allow and ep.name not in planned):
                    continue
                if not self._installed_modules and ep.name not in planned:
                    continue
                dist = getattr(ep, "dist", None)
                entry = planned.pop(ep.name, None)
                if entry is not None:  # named in the mount plan: the installed module, with the plan's config
                    self._check_one_config_source(ep.name, entry)
                    load = functools.partial(seed_from_entry_point, ep, entry.get("config", {}))
                else:
                    load = functools.partial(seed_from_entry_point, ep, {})
                self._queue(ep.name, load, "module", dist.name if dist else None, dist.version if dist else None,
                            required=entry is not None or self._required(ep.name))
        for name, entry in planned.items():
            if name in disabled:
                continue
            self._check_one_config_source(name, entry)
            self._queue(name, functools.partial(seed_from_config, entry), "module", None, None, required=True)

    def _check_plugin_names(self, known: set[str]) -> None:
        """A name in ``load_plugins`` must name a plugin there is; one in ``disable_plugins`` that is
        none but close to one is a typo (``bsh`` would have left bash running): ``ConfigError``
        naming the key, or the environment variable, and the plugin meant. A name close to none
        is taken as an optional plugin that is not installed here. A ``[plugins.NAME]`` section with
        ``enabled = false`` disables like ``disable_plugins`` and is checked the same way
        (``[plugins.my_policy]`` for ``my-policy`` left the plugin running, found by a newcomer's pass)."""
        sections = self.config.get("plugins", {})
        switched_off = [(f"plugins.{name}", [name]) for name, section in sections.items()
                        if section.get("enabled") is False]
        sources = (("load_plugins", ENV_LOAD, True), ("disable_plugins", ENV_DISABLE, False))
        for key, variable, strict in sources:
            places = [(key, self.config.get(key, [])), (variable, sorted(self._env_names(variable)))]
            if not strict:
                places += switched_off
            for where, names in places:
                for name in names:
                    if name in known:
                        continue
                    hint = did_you_mean(name, known)
                    if strict or hint is not None:
                        verb = "load" if strict else "disable"
                        raise ConfigError(f"{name!r} names no installed plugin, so there is none to {verb} "
                                          f"(installed: {', '.join(sorted(known))})", key=where,
                                          file=None if where == variable else self.config_file,
                                          hint=hint or "amplifier-tools plugins lists what is installed")

    def _planned_modules(self) -> dict[str, Mapping[str, Any]]:
        """The mount plan's entries (``modules``, and the ``tools``/``hooks`` lists) by module name.
        A module named twice with different settings stops the start (found by attack: the earlier
        entry was dropped without a word, so a deny rule configured there never ran; Amplifier
        mounts each entry, and one plugin name here takes one); an entry repeated as it is mounts once."""
        planned: dict[str, Mapping[str, Any]] = {}
        for entry in self.config.get("modules", []):
            name = entry["module"]
            first = planned.setdefault(name, entry)
            if first is not entry and first != entry:
                raise ConfigError(f"module {name!r} is named twice in the mount plan (modules/tools/hooks), "
                                  "with different settings; only one would be mounted", key="modules",
                                  file=self.config_file,
                                  hint="keep one entry, or merge the two entries' config into it")
        return planned

    def _check_one_config_source(self, name: str, entry: Mapping[str, Any]) -> None:
        """A module's config comes from one place: the mount plan entry or ``[plugins.NAME]``."""
        own, _ = plugin_section(self.config, name)
        if entry.get("config") and own:
            raise ConfigError(f"module {name!r} is configured twice: in the mount plan entry (modules/tools/hooks "
                              f"'config') and in [plugins.{name}]; keep one", key=f"plugins.{name}",
                              file=self.config_file)

    def _queue(self, name: str, load: Callable[[], Any], source: str, dist: str | None,
               version: str | None, *, required: bool) -> None:
        try:
            if self.plugin_manager.has_plugin(name):
                first = next((info.source for _, info, _ in self._pending if info.name == name), "another source")
                raise PluginLoadError(name, f"a plugin with this name is already registered (from {first}; "
                                            f"this one is from {source}): load it from one place")
            plugin = load()
            if self.plugin_manager.is_registered(plugin):  # the same object, under another name
                other = self.plugin_manager.get_name(plugin)
                first = next((info.source for loaded, info, _ in self._pending if loaded is plugin), "another source")
                raise PluginLoadError(name, f"the same plugin is already registered as {other!r} (from {first}; "
                                            f"this one is from {source}): load it from one place",
                                      hint=f"remove one of the two: the {source} entry {name!r} or the "
                                           f"{first} one {other!r}")
            self.plugin_manager.register(plugin, name=name)
        except HookWrapperRefused:
            raise  # never run as written, required or not (as ``misfit_hooks`` below)
        except BaseException as exc:
            if not _plugins_own(exc):
                raise
            if self.plugin_manager.has_plugin(name):
                self.plugin_manager.unregister(name=name)
            reason = exc.reason if isinstance(exc, PluginLoadError) else (
                exc.message if isinstance(exc, ToolError) else _raised_text(exc))
            if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "amplifier_core":
                reason += ("; this Amplifier module needs amplifier-core: pip install amplifier-core "
                           "(or disable it: disable_plugins)")
            self._fail_plugin(name, source, f"failed to load: {reason}", required, exc,
                              exc.hint if isinstance(exc, (PluginLoadError, ConfigError)) else None)
            return
        misfit = misfit_hooks(self.plugin_manager, plugin)
        if misfit is not None:
            # Never run a plugin with a misspelled hook, installed-only or not: a typo in a policy
            # plugin would fail open.
            self.plugin_manager.unregister(plugin)
            raise PluginLoadError(name, misfit)
        _, reserved = plugin_section(self.config, name)
        # A plugin whose hooks wait by policy (and bound the wait themselves) declares its own
        # default, e.g. ``hook_timeout_ms = None``; the plugin's config section still overrides it.
        host_ms = self.config.get("hook_timeout_ms", DEFAULT_HOOK_TIMEOUT_MS)
        own_ms = reserved.get("hook_timeout_ms", getattr(plugin, "hook_timeout_ms", _NOT_SET))
        timeout_ms = host_ms if own_ms is _NOT_SET else own_ms
        # An async mount is bounded too, by the plugin's own timeout when it has one; a host-wide
        # timeout shorter than the default (set for call hooks) does not shorten it: start-up work
        # (the bash plugin probing for bubblewrap) may take longer than a call hook should.
        mount_ms = timeout_ms if own_ms is not _NOT_SET or timeout_ms is None else max(timeout_ms,
                                                                                        DEFAULT_HOOK_TIMEOUT_MS)
        self.dispatcher.configure(name, PluginSettings(
            fail_open=reserved.get("on_error") == "ignore",
            hook_timeout=None if timeout_ms is None else timeout_ms / 1000.0,
            mount_timeout=None if mount_ms is None else mount_ms / 1000.0,
        ))
        hooks = tuple(sorted(
            caller.name for caller in self.plugin_manager.get_hookcallers(plugin) or []
        ))
        self._pending.append((plugin, PluginInfo(name, source, dist, version, hooks), required))

    def _mount_order(self) -> list[tuple[Any, PluginInfo, bool]]:
        """Plugins in registration order (built-ins first), ``tryfirst``/``trylast``
        on a ``mount`` implementation moving it to the front or back."""
        rank: dict[int, int] = {}
        for impl in self.plugin_manager.hook.mount.get_hookimpls():
            rank[id(impl.plugin)] = 0 if impl.tryfirst else 2 if impl.trylast else 1
        return sorted(self._pending, key=lambda entry: rank.get(id(entry[0]), 1))

    def _fail_plugin(self, name: str, source: str, reason: str, required: bool, exc: BaseException,
                     hint: str | None = None) -> None:
        if required:
            raise PluginLoadError(name, reason, hint=hint) from exc
        # Logged and listed (``plugins``) as it is: what the plugin said may quote a secret it
        # resolved (found by attack); a required plugin's error is cleaned by ``start``.
        reason = redact_text(reason, self.secrets, patterns=False)
        # How to silence it: the warning comes back at every start until the plugin is fixed,
        # uninstalled or disabled (found by a newcomer's trial: it said none of these).
        skip = f"{ENV_DISABLE}={name}, or " if self._plugin_env else ""
        log.warning("plugin %r %s; continuing without it (fix or uninstall it, or skip it: %sdisable_plugins = "
                    "[%r] in the configuration)", name, reason, skip, name)
        self.failed_plugins.append(FailedPlugin(name, source, reason))

    def _on_error_note(self, name: str) -> str:
        """What a failed mount adds when the plugin is configured ``on_error = "ignore"``: that setting
        lets its hooks fail open (an observer's opt-in), never its start — a plugin that did not mount
        may be a policy that is missing — so the error says it was not applied, not silently."""
        _, reserved = plugin_section(self.config, name)
        if reserved.get("on_error") != "ignore":
            return ""
        return (f"; [plugins.{name}] on_error = 'ignore' does not apply: it lets the plugin's hooks fail open, "
                "never its start")

    async def _mount_plugin(self, plugin: Any, info: PluginInfo, required: bool) -> None:
        own, _ = plugin_section(self.config, info.name)
        coordinator = Coordinator(self, info.name, seed=isinstance(plugin, SeedModule))
        tools_before = {m.spec.name for m in self.tools}
        capabilities = dict(self.capabilities)
        mounts = {point: dict(objects) for point, objects in self.mounts.items()}
        contributors = {channel: list(entries) for channel, entries in self.contributors.items()}
        try:
            cleanup = await self.dispatcher.mount(plugin, coordinator, own)
            if isinstance(plugin, SeedModule) and plugin.returned_tool is not None \
                    and not any(m.tool is plugin.returned_tool for m in self.tools):
                await coordinator.mount("tools", plugin.returned_tool)  # the seed allows returning the tool
        except BaseException as exc:
            if not _plugins_own(exc):
                raise
            for mounted in list(self.tools):  # take back what the plugin mounted before failing
                if mounted.plugin == info.name and mounted.spec.name not in tools_before:
                    self.tools.remove(mounted.spec.name)
            # ... and the rest of what it offered: its Amplifier handlers, capabilities, mount points
            # and contributions (found by attack: the handler of a plugin reported as failed, "continuing
            # without it", went on denying every call). The cleanups it registered still run at close.
            self.events.forget(info.name)
            self.capabilities.clear()
            self.capabilities.update(capabilities)
            self.mounts.clear()
            self.mounts.update(mounts)
            self.contributors.clear()
            self.contributors.update(contributors)
            self.plugin_manager.unregister(plugin)
            if isinstance(exc, ContractError) and exc.code == "duplicate_tool":
                # Never fall back to another tool of the same name: a call would silently run the wrong one.
                first, second = exc.details.get("plugins", ["?", info.name])
                if first == second:  # one plugin mounting two tools of one name: its own bug
                    raise PluginLoadError(info.name, f"{exc.message}: it mounts two tools of that name; "
                                                     "give each tool its own name") from exc
                sandboxed = "bash" if "bash" in (first, second) and any(
                    p.name == "bash" and p.source == "builtin" for p in self.plugins) else None
                other = second if first == sandboxed else first
                note = (f"; the built-in {sandboxed!r} runs commands in the sandbox, {other!r}'s tool runs them as "
                        "the host's user with its whole filesystem, environment and network (found by a new-user "
                        "trial: following this hint gave the model an unconfined shell)") if sandboxed else ""
                keep = f"disable_plugins = [{other!r}]" if sandboxed else \
                    f"disable_plugins = [{second!r}] (or {first!r})"
                raise ConfigError(f"{exc.message}; keep one: {keep}, or mount it under another name{note}",
                                  key="disable_plugins", file=self.config_file,
                                  hint=f"add {other!r} to disable_plugins in the configuration to keep the sandboxed "
                                  f"{sandboxed!r}" if sandboxed else f"add {second!r} (or {first!r}) to "
                                  "disable_plugins in the configuration") from exc
            if isinstance(exc, ConfigError):
                located = exc.located(self.config_file)
                if exc.key is not None and exc.key.startswith("tools."):
                    raise located from exc  # the host's per-tool overrides: not the mounting plugin's fault
                # A plugin that refuses its configuration never runs silently without it (that would
                # fail open): configure it, or name it in disable_plugins. Its hint is the error's too
                # (found by a newcomer's trial: in a pytest test the PluginLoadError showed none).
                self._fail_plugin(info.name, info.source,
                                  f"failed to mount: ConfigError: {located}{self._on_error_note(info.name)}", True, exc,
                                  located.hint)
            reason = exc.message if isinstance(exc, ToolError) else _raised_text(exc)
            hint = exc.details.get("hint") if isinstance(exc, ToolError) else None
            self._fail_plugin(info.name, info.source, f"failed to mount: {reason}{self._on_error_note(info.name)}",
                              required, exc, hint if isinstance(hint, str) else None)
            return
        if cleanup is not None:
            if not callable(cleanup):
                raise PluginLoadError(info.name, f"mount returned {type(cleanup).__name__}, not a cleanup callable")
            self.cleanups.append((info.name, cleanup))
        self.plugins.append(info)

    def _check_config_references(self) -> None:
        unused = self.tools.unused_overrides()
        if unused:
            raise ConfigError(f"names no mounted tool (mounted: {', '.join(sorted(s.name for s in self.specs))})",
                              key=f"tools.{unused[0]}", file=self.config_file,
                              hint=did_you_mean(unused[0], [s.name for s in self.specs]))
        self._check_rule_tools()
        loaded = {info.name for info in self.plugins} | {f.name for f in self.failed_plugins} | self._disabled()
        for name in self.config.get("plugins", {}):
            if name not in loaded:
                raise ConfigError(f"names no installed plugin (loaded: {', '.join(sorted(loaded))})",
                                  key=f"plugins.{name}", file=self.config_file,
                                  hint=self._unloaded_plugin_hint(name, loaded))

    def _unloaded_plugin_hint(self, name: str, loaded: Collection[str]) -> str:
        """The hint for ``[plugins.<name>]`` naming no loaded plugin: the plugin meant when ``name``
        is one typing slip from it, else how a plugin is mounted, with a did-you-mean when one is
        close (found by a newcomer's trial: ``[plugins.my_policy]``, for a module of one's own not
        in ``[[modules]]``, was answered "did you mean 'policy'?", the built-in)."""
        meant = next((known for known in sorted(loaded) if one_slip_apart(name, known)), None)
        if meant is not None:
            return f"did you mean {meant!r}?"
        hint = (f"no loaded plugin is named {name!r}: a module is mounted by a [[modules]] module = \"...\" "
                "entry in the configuration, or by its distribution's entry point")
        from_code = sorted(info.name for info in self.plugins if info.source == "code")
        if from_code:
            hint += ("; a plugin passed in code goes by its 'name' attribute, else its module's or class's "
                     f"name, not its entry point's (from code: {', '.join(from_code)})")
        close = did_you_mean(name, loaded)
        return f"{hint}; or {close}" if close else hint

    def _check_rule_tools(self) -> None:
        """A built-in policy rule's ``tools`` glob that matches no mounted tool and is a mistaken
        spelling of one (``policy.rules.misnamed_tools``): a look-alike character, a case variant or
        a model-facing name stops the start naming the rule (the rule would read as applying, and
        apply to nothing); a near miss, which may be a tool mounted later, is a warning."""
        if not any(info.name == "policy" and info.source == "builtin" for info in self.plugins):
            return
        rules = getattr(self.plugin_manager.get_plugin("policy"), "rules", ())
        if not rules:
            return
        from .builtins.policy.rules import misnamed_tools

        for rule, glob, why, certain in misnamed_tools(rules, [spec.name for spec in self.specs],
                                                       [model_name(spec.name) for spec in self.specs]):
            if certain:
                raise ConfigError(f"{rule.name!r}: the tools glob {glob!r} {why}", key="plugins.policy.rules",
                                  file=self.config_file,
                                  hint="write the tool's canonical name as 'amplifier-tools list' shows it "
                                       "(e.g. local::fs.write_file), in ASCII")
            log.warning("policy rule %r: the tools glob %r %s (plugins.policy.rules)", rule.name, glob, why)

    def _make_state_dir(self, path: Path | None = None) -> None:
        """Create ``state_dir`` (or ``path``, the trust record's) 0700, or stop the start naming the
        key and what is wrong."""
        path = self.state_dir if path is None else path
        try:
            ensure_state_dir(path)
        except HostFileError as exc:
            raise ConfigError(f"{exc.strerror}; remove it or set another state_dir", key="state_dir",
                              file=self.config_file) from None
        except OSError as exc:
            # Found by a newcomer's trial: a read-only $XDG_STATE_HOME said "check the configuration"
            # when no configuration named the directory (and ``trust`` called it a bug).
            # The trust record stays in the default directory whatever state_dir says (``config_trust``).
            configured = path == self.state_dir and self.config.get("state_dir")
            hint = ("set state_dir to a directory this user can create and write" if configured else
                    "it lies under $XDG_STATE_HOME (~/.local/state when unset): set XDG_STATE_HOME to a "
                    "directory this user can write")
            raise ConfigError(f"cannot create the state directory {path}: {exc.strerror}",
                              key="state_dir", file=self.config_file, hint=hint) from None

    def _writable_now(self) -> list[str]:
        """Every path the host's tools and sandboxed processes may write, as the plugins mounted say."""
        rules = self.capabilities.get("fs.path_rules")
        return [self.working_dir, *getattr(rules, "write_roots", ()),
                *(os.fspath(r) for r in self.capabilities.get("session.writable_roots") or ())]

    def _check_configured_paths(self) -> None:
        """Each plugin checked its paths against the writable paths known when it mounted; plugins
        that mounted later add theirs (bash's and MCP servers' write paths come after the filesystem
        plugin's roots), and a list is checked in order. Found by attack: a filesystem read root
        inside bash's ``sandbox_write_paths``, swapped for a symbolic link by a command, was followed
        at the next start. Checked again here against all of them, with the working directory as
        given (a symbolic link inside a write root, retargeted by a command, moved the next start)."""
        writable = self._writable_now()
        try:
            for path, key in list(self.capabilities.get("session.configured_paths") or ()):
                configured_path(self.working_dir, path, writable, key)
            if self._working_dir_given is not None:
                configured_path(os.getcwd(), os.fspath(self._working_dir_given), writable, "working_dir")
        except ConfigError as exc:
            raise ConfigError(exc.detail, key=exc.key, file=self.config_file, hint=exc.hint) from None

    def _check_protected_paths(self) -> None:
        """A configured host-state path inside a tool's writable roots would be the agent's to rewrite:
        refuse the start, naming the key. Roots: the working directory, the filesystem plugin's, and
        those plugins added to the ``session.writable_roots`` capability (bash's ``allowed_paths``)."""
        for root in sorted(set(self._writable_now())):
            for entry in self.protected_paths.inside(root):
                if entry.key is not None:
                    hint = None
                    if entry.key == "state_dir" and self.config.get("state_dir") is None:
                        hint = ("state_dir is not configured: its default lies under $XDG_STATE_HOME "
                                "(~/.local/state when unset); point XDG_STATE_HOME or state_dir outside "
                                f"{root}, or run from another working directory")
                    raise ConfigError(
                        f"{entry.path} ({entry.reason}) lies inside {root}, which tools may write; "
                        "host state must live outside every writable root", key=entry.key, file=self.config_file,
                        hint=hint)

    def _make_default_context(self) -> ToolContext:
        ctx = self.config.get("context", {})
        table = self.config.get("secrets", {})
        from_env = EnvironmentSecrets(table)
        # The values of the [secrets] variables are secret from the start, whether or not a tool
        # ever asks for them: a tool could read them some other way (a file, a child's environment).
        self.secrets.update(from_env.variables())
        try:  # a configured value found by substitution (``${VAR}``) is a secret, and may be one: not refused
            context = ToolContext(
                principal=ctx.get("principal", "anonymous"),
                role=ctx.get("role"),
                environment=ctx.get("environment"),
                scopes=frozenset(ctx.get("scopes", ())),
                secrets=self.secrets.recording(from_env) if table else None,
                session_id=self.session_id,
            )
        except ContextFieldError as wrong:
            raise ConfigError(str(wrong), key=f"context.{wrong.field}",
                              hint="a principal, role or environment is a name, a scope a short token: printable "
                                   "characters, no credential (docs/contract.md, 'Identifiers')") from None
        return context

    # -- calls -----------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the host is started and not closed: its tools are mounted and it takes calls."""
        return self._pipeline is not None

    @property
    def default_context(self) -> ToolContext:
        """The context used for calls made without one (from config ``context``)."""
        return self._default_context

    async def call(
        self,
        name: str,
        arguments: Any = None,
        *,
        context: ToolContext | None = None,
        call_id: str | None = None,
    ) -> ToolResult:
        """Run one call through the whole pipeline. Never raises on a bad call."""
        given_id = call_id or new_call_id()
        if arguments is None:
            arguments = {}
        pipeline = self._pipeline
        if pipeline is not None and context is None and asyncio.get_running_loop() is self._loop \
                and _process_id == self._pid:
            # the common call: nothing for ``execute`` to check, and no id to check when the host made it
            # (nor a ``ToolCall`` to make: the pipeline makes it once a hook will see it)
            return await pipeline.run(given_id, name, arguments, self._default_context, not call_id, self._loop)
        return await self._execute(ToolCall(given_id, name, arguments), context, not call_id)

    async def execute(self, call: ToolCall, context: ToolContext | None = None) -> ToolResult:
        """Run a ``ToolCall`` through the whole pipeline. Never raises on a bad call."""
        return await self._execute(call, context, False)

    async def _execute(self, call: ToolCall, context: ToolContext | None, own_id: bool) -> ToolResult:
        """``execute``; ``own_id``: the call's id is one the host made (``call`` without ``call_id``),
        which needs no check (``models.identifier_problem``)."""
        pipeline = self._pipeline
        problem: ToolError | None = None
        given_call: object = call  # callers are not type-checked; check at run time
        given_context: object = context
        if pipeline is None and self._closed:
            problem = ToolSystemError("the host is closed", code="host_closing")
        elif pipeline is None:
            problem = ToolSystemError("the host is not started; use 'async with ToolHost() as host'",
                                      code="host_not_started")
        elif (elsewhere := self._elsewhere("the call was made")) is not None:
            problem = elsewhere
        elif not isinstance(given_call, ToolCall):
            problem = ContractError(f"execute() takes a ToolCall, got {type(given_call).__name__}",
                                    code="invalid_call")
        elif given_context is not None and not isinstance(given_context, ToolContext):
            problem = ContractError(f"context must be a ToolContext, got {type(given_context).__name__}",
                                    code="invalid_context")
        elif given_context is not None and (wrong := context_problem(given_context, self.secrets)) is not None:
            # A field set around ToolContext's constructor, which checks them (object.__setattr__), or
            # an identifier holding a secret the host resolved (the constructor knows none).
            problem = _refused_context(wrong)
        if problem is not None or pipeline is None:
            assert problem is not None
            return unrecorded_refusal(problem, getattr(call, "id", None), getattr(call, "name", None), self.secrets)
        return await pipeline.run(call.id, call.name, call.arguments,
                                  self._default_context if context is None else self._own(context), own_id,
                                  self._loop, call)  # the running loop: ``_elsewhere`` found it the host's

    def _own(self, context: ToolContext) -> ToolContext:
        """``context`` as a call of this host runs with it: with the host's session id when it has
        none, and a resolver of its own wrapped so that what it hands out joins the host-wide registry."""
        resolver = context.secrets
        if context.session_id is None or (resolver is not None and not (
                isinstance(resolver, RecordingResolver) and resolver.registry is self.secrets)):
            context = attrs.evolve(context, session_id=context.session_id or self.session_id,
                                   secrets=None if resolver is None else self.secrets.recording(resolver))
        return context

    def context_caller(self, context: ToolContext) -> ContextCaller:
        """A ``ContextCaller`` making this host's calls with ``context``, for a caller that makes many
        calls with one context (``serve-mcp``'s clients). ``context`` is checked here as ``call``
        checks a given one; one ``call`` refuses makes every call refused as ``call`` refuses it
        (``invalid_context``). ``TypeError`` when ``context`` is no ``ToolContext``."""
        if not isinstance(context, ToolContext):
            raise TypeError(f"context must be a ToolContext, got {type(context).__name__}")
        values = self.secrets.values
        if context_problem(context, self.secrets) is not None:  # refused at each call (secrets are only added)
            return ContextCaller(self, context, None)
        table = context.secrets if isinstance(context.secrets, Mapping) else None
        return ContextCaller(self, self._own(attrs.evolve(context)), values, table)

    def _elsewhere(self, what: str) -> ToolSystemError | None:
        """Why the running event loop may not use the host, or None (``what``: ``the call was made``,
        ``close() was awaited``): it may on the loop the host runs on, and on any loop once that one
        has stopped (a host started in one ``asyncio.run`` and used in the next), which the host then
        runs on; never in a child made by ``os.fork``. Found by attack:
        calls from a second thread's loop while the first ran were refused ``concurrency_limited``
        after their whole wait (a slot freed on one loop never woke a waiter on the other), and
        ``close()`` lost their records; in a child made by ``os.fork`` a call waited 10 s for the
        audit writer's thread, which the child does not have, and ``close()`` ran the parent's
        cleanups (its MCP servers', its sandboxes')."""
        loop = asyncio.get_running_loop()
        if _process_id != self._pid:
            return ToolSystemError(f"{what} in a child process (os.fork) of the one the host was "
                                   "started in; its plugins' threads, processes and locks are the parent's: "
                                   "start a new ToolHost in the child", code="wrong_process")
        if loop is self._loop:
            return None
        if self._loop is not None and self._loop.is_running() and not self._loop.is_closed():
            return ToolSystemError(f"{what} on another event loop than the one the host runs on, which is "
                                   "running in another thread; a host serves one event loop at a time: submit it "
                                   "to the host's loop (asyncio.run_coroutine_threadsafe(..., loop))",
                                   code="wrong_event_loop")
        self._loop = loop
        return None

    # -- introspection -----------------------------------------------------------

    @property
    def specs(self) -> list[ToolSpec]:
        """The mounted tools' contracts, in mount order."""
        return [mounted.spec for mounted in self.tools]

    def tool_definitions(self, format: str = "openai") -> list[dict[str, Any]]:
        """The mounted tools as ``"openai"``, ``"anthropic"`` or ``"mcp"`` tool definitions."""
        return tool_definitions(self.specs, format)


class ContextCaller:
    """Calls of one host with one context (made by ``ToolHost.context_caller``): each call is
    ``host.call(name, arguments, context=context)`` — the same pipeline, hooks, policies and audit
    record — without checking the context again at every call. It was checked when this was made
    and is checked again only once the host has registered a secret since (an id of it may hold
    the new one); a call's id is one the host makes (``new_call_id``), which is not checked
    either. Otherwise a call is refused as ``call`` refuses it (the host closed, another loop or
    process, a context the new secrets refuse).

    A caller's secrets table (a mapping) is the one given, not a copy: as ``call`` does, every call
    registers its values first, a value added since included (found by review: registered once, a
    value added to the table later reached the client whole). A context refused when this was
    made is checked, and run, by ``call`` at every call (found by review: set right since around
    its frozen class, it ran unwrapped, without the host's session id, its table's values not
    registered).

    Limits: the context kept is a copy made by ``context_caller``; a field of the copy changed
    around its frozen class (``object.__setattr__`` on ``context``) is not seen before the host
    registers a new secret. Saves ``serve-mcp`` over HTTP ≈ 700 bytecodes a call (docs/performance.md)."""

    __slots__ = ("_checked", "_host", "_table", "context")

    def __init__(self, host: ToolHost, context: ToolContext, checked: frozenset[str] | None,
                 table: Mapping[str, Any] | None = None) -> None:
        self._host = host
        #: The context every call runs with (a copy of the one given).
        self.context = context
        #: The host's secret values the context was last found fine with (``SecretSet.values``; None:
        #: never, and then every call is ``call``'s, which checks it).
        self._checked = checked
        #: The caller's own secrets table, whose values each call registers (None: it has none).
        self._table = table

    async def call(self, name: str, arguments: Any = None, on_id: Callable[[str], None] | None = None) -> ToolResult:
        """Run one call through the whole pipeline (never raises on a bad call); ``on_id`` is told
        its id before it begins (what ``on_id`` raises propagates: the call is then never made)."""
        host = self._host
        call_id = new_call_id()
        if on_id is not None:
            on_id(call_id)
        if arguments is None:
            arguments = {}
        if self._table is not None:  # as ``_own`` does at every call: the table may have grown
            host.secrets.update(value for value in self._table.values() if isinstance(value, str))
        pipeline = host._pipeline
        if self._checked is not None and pipeline is not None and asyncio.get_running_loop() is host._loop \
                and _process_id == host._pid:
            values = host.secrets.values
            if values is self._checked or self._still_fine(values):
                return await pipeline.run(call_id, name, arguments, self.context, True, host._loop)
        # refused there, as by ``call``
        return await host._execute(ToolCall(call_id, name, arguments), self.context, True)

    def _still_fine(self, values: frozenset[str]) -> bool:
        """Whether the context is one ``call`` takes, now that the host's secrets are ``values``."""
        if context_problem(self.context, self._host.secrets) is not None:
            return False
        self._checked = values
        return True


def _withdraw(task: asyncio.Task[Any] | None, requests: int) -> None:
    """Withdraw every cancellation request of ``task`` beyond ``requests`` (CPython 3.11+): two
    ``cancel()`` in one turn of the loop are thrown in as one ``CancelledError`` but counted twice
    (found by review: ``close()`` withdrew one, and the other made a cleanup's own
    ``CancelledError`` read as close()'s, the cleanups after it skipped, the audit writer's last)."""
    if sys.version_info >= (3, 11) and task is not None:
        while task.cancelling() > requests:
            task.uncancel()


async def _finished_withdrawn(awaitable: Awaitable[Any], task: asyncio.Task[Any] | None,
                              requests: int) -> tuple[Any, bool]:
    """``finish_despite_cancel`` for ``close()`` (``task``, ``requests`` pending as it began): the
    cancellations that arrived meanwhile are withdrawn (``_withdraw``), as one arriving in the grace
    is; ``close()`` raises ``CancelledError`` once the cleanups have run. Found by review: left
    standing, a cleanup's own ``CancelledError`` read as this close()'s cancellation and the
    cleanups after it, the audit writer's last, never ran, when close() was cancelled while the
    calls it cut recorded themselves."""
    out, late = await finish_despite_cancel(awaitable)
    if late:
        _withdraw(task, requests)
    return out, late


def _plugins_own(exc: BaseException) -> bool:
    """Whether ``exc``, raised while a plugin was imported or mounted, is that plugin's failure:
    any exception but the user's ``KeyboardInterrupt``, a cancellation of the start and a close of
    the coroutine running it. Found by attack: an installed plugin whose module called
    ``sys.exit()`` at import, or whose ``mount`` raised a library's own ``BaseException``, ended
    every host's start with it, where a plugin that fails to import or mount is reported and
    skipped unless it is required (then ``PluginLoadError`` names it)."""
    if isinstance(exc, KeyboardInterrupt) or thrown_in(exc):
        return False
    return not (isinstance(exc, asyncio.CancelledError) and being_cancelled())


def _raised_text(exc: BaseException) -> str:
    """What a plugin's import or mount raised, as a failure's reason says it."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _without_secrets(exc: ConfigError | PluginLoadError, secrets: SecretSet) -> ConfigError | PluginLoadError:
    """``exc`` with every secret value the host knows (``${VAR}`` substitutions, values resolved
    so far) redacted from its message and hint, and from every exception chained to it (a
    setting's error quotes what it got: ``max_size = "${TOKEN}"`` printed the token; an HTTP
    library's error quotes the header it refused, which ``-v`` prints with the traceback); ``exc``
    itself when none appears."""
    if not secrets:
        return exc
    cause, context = exc.__cause__, exc.__context__
    clean_cause = _without_secrets(cause, secrets) if isinstance(cause, (ConfigError, PluginLoadError)) \
        else chain_without_secrets(cause, secrets)
    clean_context = clean_cause if context is cause else chain_without_secrets(context, secrets)
    chain_clean = clean_cause is cause and clean_context is context
    if isinstance(exc, PluginLoadError):
        reason = redact_text(exc.reason, secrets, patterns=False)
        hint = None if exc.hint is None else redact_text(exc.hint, secrets, patterns=False)
        if reason == exc.reason and hint == exc.hint and chain_clean:
            return exc
        clean: ConfigError | PluginLoadError = PluginLoadError(exc.plugin, reason, hint=hint)
    else:
        detail = redact_text(exc.detail, secrets, patterns=False)
        hint = None if exc.hint is None else redact_text(exc.hint, secrets, patterns=False)
        if detail == exc.detail and hint == exc.hint and chain_clean:
            return exc
        clean = ConfigError(detail, key=exc.key, file=exc.file, hint=hint)
    clean.__cause__, clean.__context__ = clean_cause, clean_context
    clean.__suppress_context__ = exc.__suppress_context__
    clean.__traceback__ = exc.__traceback__
    return clean


def _trace_before(hook: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """``AMPLIFIER_TOOLS_TRACE``: one line per hook call, naming the plugins called."""
    names = ", ".join(repr(impl.plugin_name) for impl in impls)
    print(f"amplifier_tools: calling {hook} of plugin {names}", file=sys.stderr)


def _trace_after(outcome: Any, hook: str, impls: Sequence[Any], kwargs: Mapping[str, Any],
                 secrets: SecretSet | None = None) -> None:
    names = ", ".join(repr(impl.plugin_name) for impl in impls)
    failed = outcome.exception
    done = f"raised {failed!r}" if failed is not None else f"returned {type(outcome.get_result()).__name__}"
    # What a hook raised may quote a secret it resolved (found by attack: printed whole).
    print(redact_text(f"amplifier_tools: {hook} of plugin {names} {done}", secrets or (), patterns=False),
          file=sys.stderr)
