"""Conformance checks of a tool, plugin, module or distribution (``amplifier-tools validate``).

One implementation behind the CLI command and the pytest helper
``assert_conforms``. Each check has a name, a pass/fail verdict and a
message; warnings do not fail the report.

A target is an object, an import path (``package.module`` or
``package.module:Attribute``; a class, of a plugin or a tool, is instantiated as the host would), a
built-in plugin's name (``filesystem``, ``bash``...), an entry-point name or a
distribution name (each of its entry points is checked; ``amplifier-tools``
itself, whose plugins are built in rather than entry points, means every
built-in).
The plugin is mounted with its own section of the host configuration, so a
plugin that needs configuration can pass; when it fails for want of it, the
report names the key.

Checks: the target imports; it has a ``mount`` (seed module) or hook
implementations (plugin); mounting it on a fresh host succeeds; every tool's
contract is valid (name, SemVer, input/output schemas are valid JSON Schema);
every example's input validates against the input schema and its output
against the output schema; examples of ``Pure`` tools run and return what they
promise (compared as JSON: ``true`` is not ``1``), leave their working directory and the
arguments they were given as they found them (a failure) and, when
the example gives no output, return the same output when run again (a
warning); effects are consistent with policies. Examples of tools with any
other effect are never run. Examples run in a temporary working directory,
with the files an example lists (``Example.files``) written into it first.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.metadata
import inspect
import os
import re
import tempfile
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import attrs

from ._json import same_json
from ._markers import PROJECT_NAME, hookimpl
from .builtins import BUILTIN_PLUGINS
from .config import validate_config
from .errors import ConfigError, ContractError, PluginLoadError, did_you_mean
from .host import ENV_DISABLE, ToolHost
from .loader import SEED_ENTRY_POINT_GROUP, SeedModule, instantiate, load_target, plugin_name
from .schema import describe_errors
from .spec import Effect, IdempotencyKeyRequirement


@attrs.frozen
class Check:
    """One verdict of a conformance report."""

    name: str
    passed: bool
    message: str = ""
    warning: bool = False


@attrs.define
class Report:
    """The checks run against one target; ``ok`` when none failed."""

    target: str
    checks: list[Check] = attrs.field(factory=list)

    @property
    def ok(self) -> bool:
        return all(check.passed or check.warning for check in self.checks)

    def add(self, name: str, passed: bool, message: str = "", *, warning: bool = False) -> None:
        self.checks.append(Check(name, passed, message, warning))

    def render(self) -> str:
        lines = [f"conformance of {self.target}:"]
        for check in self.checks:
            mark = "PASS" if check.passed else ("WARN" if check.warning else "FAIL")
            lines.append(f"  {mark}  {check.name}" + (f": {check.message}" if check.message else ""))
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


@attrs.frozen
class _Candidate:
    """One plugin to check: the name it goes by in config, and the object (or None if it did not load)."""

    name: str
    plugin: Any
    seed_config: dict[str, Any] = attrs.field(factory=dict)


#: What importing, instantiating or mounting a target may raise that is its failed check, not the
#: checker's end: ``SystemExit`` too (found by attack: a module calling ``sys.exit(3)`` at import, a
#: class in ``__init__``, a ``mount``, ended ``validate`` with the target's status, no report and,
#: with ``--json``, no JSON). ``KeyboardInterrupt`` stays the user's Ctrl-C.
_LOAD_FAILURES = (Exception, SystemExit)


def _failure(exc: BaseException) -> str:
    """A failed import, instantiation or mount as a report line says it."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _entry_points(target: str) -> list[tuple[str, importlib.metadata.EntryPoint]]:
    """Entry points named ``target``, else every entry point of the distribution named ``target``."""
    by_name: list[tuple[str, importlib.metadata.EntryPoint]] = []
    by_dist: list[tuple[str, importlib.metadata.EntryPoint]] = []
    for group in (PROJECT_NAME, SEED_ENTRY_POINT_GROUP):
        for ep in importlib.metadata.entry_points(group=group):
            dist = getattr(ep, "dist", None)
            if ep.name == target:
                by_name.append((group, ep))
            elif dist is not None and _normalized(dist.name) == _normalized(target):
                by_dist.append((group, ep))
    return by_name or by_dist


def _known_targets() -> set[str]:
    """The names a target may be besides an import path: the built-in plugins, the installed entry
    points and their distributions. Looked up only for a target that is none of them and no module,
    for its did-you-mean (found by a newcomer's trial: ``validate my-plicy`` named no ``my-policy``)."""
    names = {*BUILTIN_PLUGINS, PROJECT_NAME.replace("_", "-")}
    for group in (PROJECT_NAME, SEED_ENTRY_POINT_GROUP):
        for ep in importlib.metadata.entry_points(group=group):
            names.add(ep.name)
            dist = getattr(ep, "dist", None)
            if dist is not None:
                names.add(dist.name)
    return names


def _resolve(target: Any, report: Report, config: Mapping[str, Any]) -> list[_Candidate]:
    """The plugin objects for ``target``: an object, ``module``, ``module:Attribute``, an
    entry-point name or a distribution name. Classes are instantiated the way the host does it."""
    if not isinstance(target, str):
        # A tool class too, as ``validate module:ToolClass`` instantiates it (found by attack:
        # ``assert_conforms(MyTool)`` mounted the class, and each example failed with
        # "execute() missing 1 required positional argument: 'input'").
        if isinstance(target, type) and (_has_hooks(target) or callable(getattr(target, "execute", None))):
            cls = target
            try:
                target = instantiate(lambda: cls)
            except _LOAD_FAILURES as exc:
                report.add("importable", False, f"instantiating {cls.__qualname__}: {_failure(exc)}")
                return []
        if callable(getattr(target, "execute", None)) and not _has_hooks(target):
            return [_Candidate("tool-under-test", _wrap_tool(target))]
        return [_Candidate(plugin_name(target), target)]
    if target in BUILTIN_PLUGINS or _normalized(target) == _normalized(PROJECT_NAME):
        names = [target] if target in BUILTIN_PLUGINS else list(BUILTIN_PLUGINS)
        for name in names:
            report.add(f"{name}: importable" if len(names) > 1 else "importable", True,
                       f"built-in plugin {name!r} ({BUILTIN_PLUGINS[name]})")
        return [_Candidate(name, load_target(BUILTIN_PLUGINS[name])) for name in names]
    found = _entry_points(target)
    if found:
        candidates = []
        for group, ep in found:
            label = f"{ep.name}: " if len(found) > 1 else ""
            dist = getattr(ep, "dist", None)
            origin = f"entry point {ep.name!r} = {ep.value!r} ({group}"
            origin += f", distribution {dist.name} {dist.version})" if dist is not None else ")"
            try:
                # One implementation of "what an entry point yields" with the host: a class is instantiated.
                loaded = instantiate(ep.load) if group == PROJECT_NAME else ep.load()
            except _LOAD_FAILURES as exc:
                report.add(f"{label}importable", False, f"{origin}: {_failure(exc)}")
                continue
            report.add(f"{label}importable", True, origin)
            candidates.append(_Candidate(ep.name, loaded))
        return candidates
    module_name, _, attribute = target.partition(":")
    try:
        loaded = load_target(target)
    except _LOAD_FAILURES as exc:
        note = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name and not attribute:
            close = did_you_mean(target, _known_targets())
            note = (" (nor is it the name of a built-in plugin, an installed entry point or distribution"
                    f"{'; ' + close if close else ''})")
        report.add("importable", False, f"{_failure(exc)}{note}")
        return []
    report.add("importable", True, f"{'object' if attribute else 'module'} {target}")
    if callable(getattr(loaded, "execute", None)) and not _has_hooks(loaded) and not isinstance(loaded, ModuleType):
        return [_Candidate("tool-under-test", _wrap_tool(loaded))]
    name = plugin_name(loaded) if attribute else module_name
    seed_config: dict[str, Any] = {}
    for entry in config.get("modules", []):
        if entry.get("module") in (target, module_name):
            seed_config = dict(entry.get("config", {}))
    return [_Candidate(name, loaded, seed_config)]


def _wrap_tool(tool: Any) -> Any:
    """A plugin that mounts a bare tool object, so it is checked like any plugin."""

    class ToolUnderTest:
        name = "tool-under-test"

        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", tool)

    return ToolUnderTest()


def _has_hooks(obj: Any) -> bool:
    return any(
        hasattr(getattr(obj, attr, None), f"{PROJECT_NAME}_impl") for attr in dir(obj) if not attr.startswith("__")
    )


def _check_shape(candidate: _Candidate, report: Report, label: str) -> Any:
    """Seed modules and seed ``mount`` functions (no hookimpl markers) are checked and adapted."""
    plugin = candidate.plugin
    seed_mount: Any = None
    if isinstance(plugin, ModuleType) and not _has_hooks(plugin):
        seed_mount = getattr(plugin, "mount", None)
        if not callable(seed_mount):
            message = "module has neither hook implementations nor a mount function"
            # Found by trial: ``validate mytools`` on a module of ``@tool`` functions said only that.
            tools = [attr for attr, value in vars(plugin).items()
                     if callable(getattr(value, "execute", None)) and hasattr(value, "spec")]
            if tools:
                listed = ", ".join(f"{plugin.__name__}:{attr}" for attr in tools[:5])
                message += f"; it holds tools: validate each ({listed}), or mount them from a plugin's mount"
            report.add(f"{label}mount present", False, message)
            return None
    elif inspect.isfunction(plugin) and not _has_hooks(plugin):
        seed_mount = plugin
    if seed_mount is not None:
        params = list(inspect.signature(seed_mount).parameters)
        well_formed = inspect.iscoroutinefunction(seed_mount) and params[:1] == ["coordinator"]
        got = f"{seed_mount.__name__}({', '.join(params)})"
        report.add(f"{label}mount well-formed", well_formed,
                   "async def mount(coordinator, config)" if well_formed
                   else f"expected 'async def mount(coordinator, config)', got {got}")
        return SeedModule(candidate.name, seed_mount, candidate.seed_config)
    if not _has_hooks(plugin):
        report.add(f"{label}hook implementations", False, "no @amplifier_tools.hookimpl functions found")
        return None
    report.add(f"{label}hook implementations", True)
    return plugin


def _missing_config(exc: BaseException) -> ConfigError | None:
    """The ``ConfigError`` a plugin raised from ``mount``, if that is why it failed."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConfigError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _check_mounted(candidate: _Candidate, plugin: Any, report: Report, run_examples: bool,
                         config: Mapping[str, Any], label: str) -> None:
    section = {k: v for k, v in config.get("plugins", {}).get(candidate.name, {}).items() if k != "enabled"}
    registered = plugin_name(plugin)
    fresh: dict[str, Any] = {"plugins": {registered: section}} if section else {}
    if config.get("secrets"):
        fresh["secrets"] = dict(config["secrets"])
    check = f"{label}mounts on a fresh host"
    with tempfile.TemporaryDirectory() as scratch:
        # A state directory of its own beside the working one: the check leaves nothing in the
        # user's state directory (~/.local/state/amplifier-tools).
        workdir = os.path.join(scratch, "work")
        os.mkdir(workdir)
        fresh["state_dir"] = os.path.join(scratch, "state")
        try:
            host = ToolHost(config=fresh, plugins=[plugin], builtins=False, entry_points=False,
                            working_dir=workdir, discover=False)
            await host.start()
        except (PluginLoadError, ConfigError) as exc:
            cause = _missing_config(exc)
            message = str(exc)
            own_hint = exc.hint or (cause.hint if cause is not None else None)
            if own_hint:  # the plugin's own hint (hooks.md: ``hint=`` on the typed error raised)
                message += f" (hint: {own_hint})"
            if cause is not None and cause.key:
                where = f"[plugins.{candidate.name}]"
                if section or candidate.seed_config:
                    message += f" -- fix config key '{cause.key}' in its {where} section"
                else:
                    message += (f" -- the plugin needs config key '{cause.key}', and no {where} section was "
                                "found (pass a config file with --config)")
            report.add(check, False, message)
            return
        except SystemExit as exc:  # the host closed itself before re-raising it
            report.add(check, False, f"plugin {registered!r}: failed to mount: {_failure(exc)}")
            return
        try:
            if registered not in {info.name for info in host.plugins}:
                report.add(check, False, f"plugin {registered!r} was not mounted: {ENV_DISABLE} disables it")
                return
            report.add(check, True, f"{len(host.specs)} tool(s)" + (" with its config section" if section else ""))
            builtin_names = {} if candidate.name in BUILTIN_PLUGINS else await _builtin_tool_names()
            for mounted in host.tools:
                await _check_tool(host, mounted, report, run_examples, workdir)
                _check_collision(mounted, builtin_names, report)
        finally:
            await host.close()


async def _builtin_tool_names() -> dict[str, tuple[str, str]]:
    """Canonical and model-facing names of the built-in tools -> (tool, plugin): of every built-in,
    whatever ``AMPLIFIER_TOOLS_DISABLE_PLUGINS`` says in the shell the check runs in (found by
    attack: a developer's ``AMPLIFIER_TOOLS_DISABLE_PLUGINS=filesystem`` let a tool named
    ``local::fs.read_file`` pass here and stop every default host elsewhere)."""
    with tempfile.TemporaryDirectory() as workdir:
        os.mkdir(os.path.join(workdir, "work"))
        async with ToolHost(config={"state_dir": os.path.join(workdir, "state")}, entry_points=False,
                            working_dir=os.path.join(workdir, "work"), discover=False, plugin_env=False) as host:
            names: dict[str, tuple[str, str]] = {}
            for mounted in host.tools:
                names[mounted.spec.name] = names[mounted.model_name] = (mounted.spec.name, mounted.plugin)
            return names


def _check_collision(mounted: Any, builtin_names: Mapping[str, tuple[str, str]], report: Report) -> None:
    """A tool named like a built-in one stops every default host from starting: say so here."""
    name = mounted.spec.name
    clash = builtin_names.get(name) or builtin_names.get(mounted.model_name)
    if clash is None:
        report.add(f"{name}: name free beside the built-ins", True)
        return
    tool, plugin = clash
    report.add(f"{name}: name free beside the built-ins", False,
               f"collides with built-in tool {tool!r} of plugin {plugin!r} (model name {mounted.model_name!r}): a "
               f"host with both refuses to start; rename the tool, or run it with disable_plugins = [{plugin!r}]")


def _write_example_files(workdir: str, files: Mapping[str, str]) -> None:
    """The files an example expects, written into the temporary working directory."""
    for relative, content in files.items():
        path = os.path.join(workdir, *relative.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)


async def _check_tool(host: ToolHost, mounted: Any, report: Report, run_examples: bool, workdir: str) -> None:
    spec = mounted.spec
    name = spec.name
    report.add(f"{name}: contract", True, f"version {spec.version}, effect {spec.effect.value}")
    report.add(f"{name}: description", bool(spec.description.strip()),
               "" if spec.description.strip() else "empty description: a model cannot know what the tool does")
    if "::" not in name:
        report.add(f"{name}: namespaced name", False, "not namespaced (e.g. 'local::area.verb')", warning=True)
    if spec.policies.retry is not None and not spec.effect.retry_safe:
        report.add(f"{name}: effect vs policies", False,
                   f"retry policy on a {spec.effect.value} tool: it must never be retried automatically")
    elif spec.effect is Effect.IdempotentWrite and spec.idempotency_key is IdempotencyKeyRequirement.none:
        report.add(f"{name}: effect vs policies", False,
                   "IdempotentWrite without an idempotency key requirement", warning=True)
    else:
        report.add(f"{name}: effect vs policies", True)
    for index, example in enumerate(spec.examples):
        label = f"{name}: example {index + 1}"
        if not mounted.input_validator.is_valid(example.input):
            _check_refused_example(mounted, example, label, report)
            continue
        if example.output is not None and mounted.output_validator is not None \
                and not mounted.output_validator.is_valid(example.output):
            report.add(label, False,
                       f"output invalid: {describe_errors(mounted.output_validator, example.output)[1]}")
            continue
        if run_examples and spec.effect is Effect.Pure:
            _write_example_files(workdir, example.files)
            before = _snapshot(workdir)
            # A copy: the host copies only the top level of a call's arguments; the example stays as written.
            sent = copy.deepcopy(example.input)
            result = await host.call(name, sent)
            changed = _changes(before, _snapshot(workdir))
            altered = _altered_keys(example.input, sent)
            if example.error_code is not None:
                got = (result.error or {}).get("code")
                report.add(label, got == example.error_code, f"expected error {example.error_code!r}, got {got!r}")
            elif not result.success:
                report.add(label, False, f"ran and failed: {(result.error or {}).get('message')}")
            elif example.output is not None and not _equal_as_json(result.output, example.output):
                report.add(label, False, f"ran; output {result.output!r} != example {example.output!r}")
            else:
                report.add(label, True, "valid; ran")
            if altered:
                report.add(f"{label}: arguments", False,
                           f"the tool changed the arguments it was given ({altered}): the audit record and a "
                           "retry see the changed ones; work on a copy")
            if changed:
                report.add(f"{label}: Pure", False,
                           f"a Pure tool changed its working directory ({changed}): declare its real effect")
            elif result.success and example.output is None:
                again = await host.call(name, copy.deepcopy(example.input))
                if again.success and not _equal_as_json(again.output, result.output):
                    report.add(f"{label}: Pure", False,
                               f"two runs returned different outputs ({result.output!r}, then {again.output!r}): "
                               "is it Pure?", warning=True)
        else:
            note = "" if spec.effect is Effect.Pure else f" (not run: {spec.effect.value})"
            report.add(label, True, "valid" + note)


def _check_refused_example(mounted: Any, example: Any, label: str, report: Report) -> None:
    """An example whose input the input schema refuses: right when it states the error the host
    refuses it with (``error_code``: ``invalid_input``, ``invalid_json``), by the host's own argument
    check, which runs before any hook and the tool, so such an example is checked whatever the
    tool's effect (found by attack: an example documenting a refused call failed ``validate``).
    Without an ``error_code`` the input is the example's mistake."""
    problem = describe_errors(mounted.input_validator, example.input)[1]
    if example.error_code is None:
        report.add(label, False, f"input invalid: {problem} (an example of a refused call states "
                                 "error_code = \"invalid_input\")")
        return
    try:
        mounted.check_arguments(example.input)
    except ContractError as refused:
        got: str | None = refused.code
    else:  # pragma: no cover - the schema refused it above; the host's check is the same schema
        got = None
    report.add(label, got == example.error_code,
               f"refused as it states ({got}: {problem})" if got == example.error_code
               else f"input invalid ({problem}): the host refuses it with error {got!r}, the example states "
                    f"{example.error_code!r}")


def _equal_as_json(first: Any, second: Any) -> bool:
    """Whether two outputs are the same JSON value, as an example written in JSON promises one:
    ``==``, except that a boolean equals only a boolean (found by attack: with Python's
    ``True == 1``, a tool returning ``true`` where its example promised ``1`` passed). Numbers
    compare by value (``2.0`` is the JSON number ``2``), objects without regard to key order;
    ``nan`` equals nothing. Iterative: no depth limit. Looser than ``_json.same_json``, which tells
    ``2`` from ``2.0`` as a tool can, and which ``_altered_keys`` uses."""
    pending = [(first, second)]
    while pending:
        a, b = pending.pop()
        if isinstance(a, bool) or isinstance(b, bool):
            if not (isinstance(a, bool) and isinstance(b, bool) and a == b):
                return False
        elif isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif a != b:
            return False
    return True


def _altered_keys(given: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The top-level arguments a run added, removed or changed in place, or "" (found by attack:
    a tool that wrote into its ``input`` passed, with the example's own input rewritten, while the
    host's audit record of such a call shows the arguments as the tool left them)."""
    parts = []
    for verb, names in (("added", sorted(set(after) - set(given))),
                        ("removed", sorted(set(given) - set(after))),
                        ("changed", sorted(k for k in set(given) & set(after) if not same_json(given[k], after[k])))):
        if names:
            parts.append(f"{verb} {', '.join(map(repr, names))}")
    return "; ".join(parts)


def _snapshot(root: str) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` (relative path -> size, modification time)."""
    seen: dict[str, tuple[int, int]] = {}
    for directory, dirs, files in os.walk(root):
        for entry in dirs + files:
            path = os.path.join(directory, entry)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            seen[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
    return seen


def _changes(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> str:
    """What a ``Pure`` example did to its working directory, or "" (found by trial: a tool that
    declared ``Pure`` and wrote files passed every check; a lie that lets the host retry it)."""
    parts = []
    for verb, names in (("created", sorted(set(after) - set(before))),
                        ("removed", sorted(set(before) - set(after))),
                        ("modified", sorted(k for k in set(before) & set(after) if before[k] != after[k]))):
        if names:
            parts.append(f"{verb} {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
    return "; ".join(parts)


def _label(target: Any) -> str:
    """What a report calls an object target: a tool by its contract's name, a plugin by its
    name, else its repr (found by trial: ``<...FunctionTool object at 0x7f...>`` headed the
    report of a failing ``assert_conforms``)."""
    name = getattr(getattr(target, "spec", None), "name", None)
    if isinstance(name, str):
        return f"tool {name!r}"
    if _has_hooks(target):
        return f"plugin {plugin_name(target)!r}"
    return repr(target)


def check_target(target: Any, *, run_examples: bool = True, config: Mapping[str, Any] | None = None) -> Report:
    """Run every conformance check on ``target`` (object, module path, ``module:Class``,
    entry-point or distribution name). ``config`` is a host configuration (validated, as from
    a config file); the plugin is mounted with its own section of it."""
    result: Report = asyncio.run(check_target_async(target, run_examples=run_examples, config=config))
    return result


async def check_target_async(target: Any, *, run_examples: bool = True,
                             config: Mapping[str, Any] | None = None) -> Report:
    """``check_target`` for code already inside an event loop."""
    report = Report(target if isinstance(target, str) else _label(target))
    config = validate_config(config) if config is not None else {}
    candidates = _resolve(target, report, config)
    for candidate in candidates:
        label = f"{candidate.name}: " if len(candidates) > 1 else ""
        plugin = _check_shape(candidate, report, label)
        if plugin is not None:
            await _check_mounted(candidate, plugin, report, run_examples, config, label)
    return report
