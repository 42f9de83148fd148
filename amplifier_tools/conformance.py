"""Conformance checks of a tool, plugin, module or distribution (``amplifier-tools validate``).

One implementation behind the CLI command and the pytest helper
``assert_conforms``. Each check has a name, a pass/fail verdict and a
message; warnings do not fail the report.

Checks: the target imports; it has a ``mount`` (seed module) or hook
implementations (plugin); mounting it on a fresh host succeeds; every tool's
contract is valid (name, SemVer, input/output schemas are valid JSON Schema);
every example's input validates against the input schema and its output
against the output schema; examples of ``Pure`` tools run and return what they
promise; effects are consistent with policies. Examples of tools with any
other effect are never run.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import inspect
import tempfile
from types import ModuleType
from typing import Any

import attrs

from ._markers import PROJECT_NAME, hookimpl
from .errors import ConfigError, PluginLoadError
from .host import SEED_ENTRY_POINT_GROUP, SeedModule, ToolHost
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


def _resolve(target: Any, report: Report) -> Any | None:
    """The plugin object for ``target``: an object, a module path or a distribution name."""
    if not isinstance(target, str):
        if callable(getattr(target, "execute", None)) and not _has_hooks(target):
            return _wrap_tool(target)
        return target
    for group in (PROJECT_NAME, SEED_ENTRY_POINT_GROUP):
        for ep in importlib.metadata.entry_points(group=group):
            dist = getattr(ep, "dist", None)
            if ep.name == target or (dist is not None and dist.name == target):
                try:
                    loaded = ep.load()
                except Exception as exc:
                    report.add("importable", False, f"entry point {ep.name!r}: {type(exc).__name__}: {exc}")
                    return None
                report.add("importable", True, f"entry point {ep.name!r} ({group})")
                if group == SEED_ENTRY_POINT_GROUP:
                    return SeedModule(ep.name, loaded if not isinstance(loaded, ModuleType) else loaded.mount, {})
                return loaded
    try:
        module = importlib.import_module(target)
    except Exception as exc:
        report.add("importable", False, f"{type(exc).__name__}: {exc}")
        return None
    report.add("importable", True, f"module {target}")
    return module


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


def _check_shape(plugin: Any, report: Report) -> Any:
    """Seed modules (a module-level ``mount`` without hookimpl markers) are adapted."""
    if isinstance(plugin, ModuleType) and not _has_hooks(plugin):
        mount = getattr(plugin, "mount", None)
        if not callable(mount):
            report.add("mount present", False, "module has neither hook implementations nor a mount function")
            return None
        params = list(inspect.signature(mount).parameters)
        well_formed = inspect.iscoroutinefunction(mount) and params[:1] == ["coordinator"]
        report.add("mount well-formed", well_formed,
                   "async def mount(coordinator, config)" if well_formed
                   else f"expected 'async def mount(coordinator, config)', got {mount.__name__}({', '.join(params)})")
        return SeedModule(plugin.__name__, mount, {})
    if not _has_hooks(plugin):
        report.add("hook implementations", False, "no @amplifier_tools.hookimpl functions found")
        return None
    report.add("hook implementations", True)
    return plugin


async def _check_mounted(plugin: Any, report: Report, run_examples: bool) -> None:
    with tempfile.TemporaryDirectory() as workdir:
        host = ToolHost(plugins=[plugin], builtins=False, entry_points=False, working_dir=workdir, discover=False)
        try:
            await host.start()
        except (PluginLoadError, ConfigError) as exc:
            report.add("mounts on a fresh host", False, str(exc))
            return
        try:
            report.add("mounts on a fresh host", True, f"{len(host.specs)} tool(s)")
            for mounted in host.tools:
                await _check_tool(host, mounted, report, run_examples)
        finally:
            await host.close()


async def _check_tool(host: ToolHost, mounted: Any, report: Report, run_examples: bool) -> None:
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
            report.add(label, False, f"input invalid: {describe_errors(mounted.input_validator, example.input)[1]}")
            continue
        if example.output is not None and mounted.output_validator is not None \
                and not mounted.output_validator.is_valid(example.output):
            report.add(label, False,
                       f"output invalid: {describe_errors(mounted.output_validator, example.output)[1]}")
            continue
        if run_examples and spec.effect is Effect.Pure:
            result = await host.call(name, example.input)
            if example.error_code is not None:
                got = (result.error or {}).get("code")
                report.add(label, got == example.error_code, f"expected error {example.error_code!r}, got {got!r}")
            elif not result.success:
                report.add(label, False, f"ran and failed: {(result.error or {}).get('message')}")
            elif example.output is not None and result.output != example.output:
                report.add(label, False, f"ran; output {result.output!r} != example {example.output!r}")
            else:
                report.add(label, True, "valid; ran")
        else:
            note = "" if spec.effect is Effect.Pure else f" (not run: {spec.effect.value})"
            report.add(label, True, "valid" + note)


def check_target(target: Any, *, run_examples: bool = True) -> Report:
    """Run every conformance check on ``target`` (object, module path or distribution name)."""
    result: Report = asyncio.run(check_target_async(target, run_examples=run_examples))
    return result


async def check_target_async(target: Any, *, run_examples: bool = True) -> Report:
    """``check_target`` for code already inside an event loop."""
    report = Report(target if isinstance(target, str) else repr(target))
    plugin = _resolve(target, report)
    if plugin is not None:
        plugin = _check_shape(plugin, report)
    if plugin is not None:
        await _check_mounted(plugin, report, run_examples)
    return report

