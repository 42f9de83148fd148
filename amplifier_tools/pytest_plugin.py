"""pytest plugin for tool and plugin authors (entry point ``pytest11``).

Fixtures:

- ``tool_host`` — a factory of fresh hosts in a temporary working directory:
  ``async with tool_host(MyPlugin(), config={...}) as host: ...`` (no built-in
  or entry-point plugins unless asked: ``builtins=True`` or a list of names,
  ``entry_points=True`` or a list of entry-point names — only those load).
- ``hook_recorder`` — a plugin recording every hook call and decision; pass it
  to ``tool_host`` and inspect ``hook_recorder.calls`` / ``.hooks()``.

Helpers importable from this module: ``MockTool`` and ``assert_conforms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import missing_extra

try:
    import pytest
except ImportError as exc:  # found by a newcomer's trial: a bare "No module named 'pytest'"
    raise missing_extra("test", exc, "amplifier_tools.pytest_plugin") from exc

from ._markers import hookimpl
from .conformance import Report, check_target_async
from .copies import copy_of
from .host import ENV_DISABLE, ENV_LOAD, ToolHost
from .models import ToolResult
from .spec import ToolSpec


class MockTool:
    """A tool that records its calls and returns ``return_value`` (or raises ``side_effect``: an
    exception, instance or class; anything else is refused here, found by attack: a callable, as
    ``unittest.mock`` takes, became a TypeError at call time, a failure the test had not asked for).

    Each call returns a deep copy of ``return_value`` (a ``ToolResult``'s output, error and metadata
    likewise), so a test that changes one call's result changes neither ``return_value`` nor the
    next call's (found by attack: every call returned the one shared object). What
    ``copy.deepcopy`` cannot copy is copied as ``copies.copy_of`` does it: its dicts and lists
    copied, an object holding a lock or a socket shared."""

    def __init__(self, name: str = "mock_tool", description: str = "A mock tool.", return_value: Any = None,
                 *, input_schema: dict[str, Any] | None = None,
                 side_effect: BaseException | type[BaseException] | None = None, **spec_fields: Any) -> None:
        if not (side_effect is None or isinstance(side_effect, BaseException)
                or (isinstance(side_effect, type) and issubclass(side_effect, BaseException))):
            raise TypeError(f"MockTool side_effect must be an exception (instance or class), got "
                            f"{type(side_effect).__name__} {side_effect!r}")
        self.spec = ToolSpec(name=name, description=description,
                             input_schema=input_schema or {"type": "object"}, **spec_fields)
        self.name = name
        self.description = description
        self.input_schema = self.spec.input_schema
        self.return_value = return_value
        self.side_effect = side_effect
        self.calls: list[dict[str, Any]] = []

    @property
    def call_count(self) -> int:
        return len(self.calls)

    @property
    def last_input(self) -> dict[str, Any] | None:
        return self.calls[-1] if self.calls else None

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self.calls.append(dict(input))
        if self.side_effect is not None:
            raise self.side_effect
        value = copy_of(self.return_value)
        if isinstance(value, ToolResult):
            return value
        return ToolResult(success=True, output=value)


class HookRecorder:
    """A plugin that records (hook, tool name, payload) for every call hook, and
    ``(event, data)`` for every event in ``events``; runs last."""

    name = "hook-recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def hooks(self) -> list[str]:
        return [hook for hook, _, _ in self.calls]

    def results(self) -> list[ToolResult]:
        """The final result of every call, in order (from ``tool_complete``)."""
        return [payload for hook, _, payload in self.calls if hook == "tool_complete"]

    @hookimpl(trylast=True)
    def tool_pre(self, call: Any) -> None:
        self.calls.append(("tool_pre", call.name, dict(call.arguments)))

    @hookimpl(trylast=True)
    def tool_post(self, call: Any, result: ToolResult) -> None:
        self.calls.append(("tool_post", call.name, result))

    @hookimpl(trylast=True)
    def tool_error(self, call: Any, error: Any) -> None:
        self.calls.append(("tool_error", call.name, error))

    @hookimpl(trylast=True)
    def tool_complete(self, call: Any, result: ToolResult) -> None:
        self.calls.append(("tool_complete", call.name, result))

    @hookimpl
    def tool_event(self, event: str, data: dict[str, Any]) -> None:
        self.events.append((event, data))


async def assert_conforms(target: Any, *, run_examples: bool = True, config: Mapping[str, Any] | None = None) -> Report:
    """Run the ``amplifier-tools validate`` checks on a tool, plugin or module; fail the test if any fails.

    ``config`` is a host configuration, as ``validate --config`` loads one: the plugin is mounted
    with its own ``[plugins.<name>]`` section (found by trial: a plugin that needs a setting
    could not pass here, the helper had no way to give it one).
    """
    report = await check_target_async(target, run_examples=run_examples, config=config)
    if not report.ok:
        pytest.fail(report.render(), pytrace=False)
    return report


@pytest.fixture
def tool_host(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A factory of unstarted hosts in ``tmp_path``; use as ``async with tool_host(*plugins) as host``.

    Each host keeps its state (the audit log, policy state) in a temporary directory of its own,
    outside the working directory (host state must not be writable by tools), unless ``config``
    names a ``state_dir``: a test never writes into the user's own state directory
    (``~/.local/state/amplifier-tools``), as the conformance checks do not either.

    The plugins are the ones asked for: ``AMPLIFIER_TOOLS_DISABLE_PLUGINS`` and
    ``AMPLIFIER_TOOLS_LOAD_PLUGINS`` inherited from the shell pytest runs in are unset for the
    test (found by attack: a developer's ``AMPLIFIER_TOOLS_DISABLE_PLUGINS=my-policy`` silently
    left the plugin under test out, and its tests saw calls it denies succeed). A test that sets
    them itself (``monkeypatch.setenv``) gets what it set.
    """
    for variable in (ENV_DISABLE, ENV_LOAD):
        monkeypatch.delenv(variable, raising=False)

    def make(*plugins: Any, config: dict[str, Any] | None = None, builtins: Any = False,
             entry_points: bool | str | Iterable[str] = False) -> ToolHost:
        config = dict(config or {})
        if not isinstance(entry_points, bool):
            # Names: only those entry points (``load_plugins``). Found by trial: the documented
            # ``entry_points=["my-policy"]`` went to ToolHost as a true value and loaded every
            # installed plugin and Amplifier module beside the one named.
            names = [entry_points] if isinstance(entry_points, str) else list(entry_points)
            if names:
                config["load_plugins"] = [*config.get("load_plugins", []), *names]
            entry_points = bool(names)
        if "state_dir" not in config:
            config["state_dir"] = str(tmp_path_factory.mktemp("tool-host-state"))
        return ToolHost(config=config, plugins=plugins, builtins=builtins, entry_points=entry_points,
                        working_dir=tmp_path, discover=False)

    return make


@pytest.fixture
def hook_recorder() -> HookRecorder:
    """A fresh ``HookRecorder`` plugin."""
    return HookRecorder()


#: The fixtures of this plugin that an ``async`` test uses.
_FIXTURES = frozenset({"tool_host", "hook_recorder"})


def _ours(item: pytest.Function) -> bool:
    """Whether the test uses this plugin: one of its fixtures, or calls ``assert_conforms``."""
    code = getattr(item.obj, "__code__", None)
    return bool(_FIXTURES & set(item.fixturenames)) or (code is not None and "assert_conforms" in code.co_names)


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """Fail an ``async`` test using this plugin that no async plugin ran, saying what runs
    it (found by a newcomer's trial: with pytest-asyncio installed but ``asyncio_mode`` unset, the
    docs' own example failed with pytest's "async def functions are not natively supported ...
    install pytest-asyncio"). Runs after the async plugins' own ``tryfirst`` implementations (a test
    they ran never gets here as a coroutine function), before pytest's; it runs no test itself."""
    import importlib.util
    import inspect

    if not (inspect.iscoroutinefunction(pyfuncitem.obj) and _ours(pyfuncitem)):
        return
    if importlib.util.find_spec("pytest_asyncio") is None:
        needs = "needs pytest-asyncio (pip install 'amplifier-tools[test]'), with"
    else:
        needs = "needs"
    pytest.fail(f"{pyfuncitem.name} is async: it {needs} asyncio_mode = \"auto\" in the pytest configuration "
                "(and asyncio_default_fixture_loop_scope = \"function\"), or @pytest.mark.asyncio on the test "
                "(docs/plugins.md, Testing tools and plugins)", pytrace=False)


__all__ = ["HookRecorder", "MockTool", "assert_conforms", "hook_recorder", "tool_host"]
