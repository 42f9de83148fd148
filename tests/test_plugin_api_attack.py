"""Attacks on the plugin API as a third-party plugin author uses it: hostile or careless hooks.

Each test states what a user sees: a typed error naming the plugin, ``host.call`` never raising,
and exactly one ``tool_complete`` and one audit record stating what the caller got.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import EchoTool, ToolsPlugin

from amplifier_tools import Deny, PluginLoadError, ToolHost, ToolResult, hookimpl
from amplifier_tools.pytest_plugin import HookRecorder

CATEGORIES = {"ContractError", "PolicyError", "AuthError", "ExecutionError", "SystemError"}


def _host(tmp_path: Path, *plugins: Any) -> ToolHost:
    (tmp_path / "work").mkdir(exist_ok=True)
    return ToolHost(config={"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}},
                    plugins=[ToolsPlugin(EchoTool()), *plugins], builtins=["audit"], entry_points=False,
                    working_dir=tmp_path / "work", discover=False)


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "state" / "audit.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [record for record in map(json.loads, lines) if record.get("kind") == "call"]


class Wraps:
    """A plugin implementing a call hook as a pluggy hook wrapper."""

    name = "wraps"

    @hookimpl(wrapper=True)
    def tool_pre(self) -> Any:
        return (yield)


async def test_a_hook_wrapper_registered_after_start_is_refused_and_calls_go_on(tmp_path: Path) -> None:
    """hookspecs.py: "the host rejects them at registration with a message naming the plugin".
    Was: ``host.plugin_manager.register`` after start took the wrapper, and from then on every
    ``host.call`` raised ``ToolSystemError`` ("plugin '1403…' implements tool_pre as a hook
    wrapper") with no ``tool_complete`` and no audit record."""
    recorder = HookRecorder()
    async with _host(tmp_path, recorder) as host:
        with pytest.raises(PluginLoadError, match="'wraps'.*tool_pre as a hook wrapper"):
            host.plugin_manager.register(Wraps())
        assert not any(isinstance(p, Wraps) for p in host.plugin_manager.get_plugins())
        result = await host.call("echo", {"path": "a"})
        assert result.success, result.error
    assert len(recorder.results()) == 1
    assert [record["status"] for record in _records(tmp_path)] == ["ok"]


async def test_a_hook_wrapper_named_at_registration_is_refused_under_that_name(tmp_path: Path) -> None:
    async with _host(tmp_path) as host:
        with pytest.raises(PluginLoadError, match="'late-one'.*tool_pre as a hook wrapper"):
            host.plugin_manager.register(Wraps(), name="late-one")
        assert not host.plugin_manager.has_plugin("late-one")
        assert (await host.call("echo", {"path": "a"})).success


def _returns(hook: str, value: ToolResult) -> Any:
    class Returns:
        name = "returns"

    def implementation(self: Any) -> ToolResult:
        return value

    implementation.__name__ = hook
    setattr(Returns, hook, hookimpl(implementation))
    return Returns()


@pytest.mark.parametrize("hook", ["tool_post", "tool_error"])
@pytest.mark.parametrize(
    ("value", "category", "code"),
    [(ToolResult(False, "kept"), "ExecutionError", "execution_failed"),
     (ToolResult(False, None, {"message": "m", "type": "Weird", "code": 5, "retryable": "yes"}),
      "ExecutionError", "execution_failed"),
     (ToolResult(False, None, {"message": "no", "type": "PolicyError", "code": "over_quota"}),
      "PolicyError", "over_quota")],
    ids=["no-error", "untyped-error", "typed-error"],
)
async def test_a_failed_result_a_plugin_returns_carries_a_typed_error_naming_it(
        tmp_path: Path, hook: str, value: ToolResult, category: str, code: str) -> None:
    """docs/contract.md: "``error`` always has ``type`` (one of the five categories), ``code``,
    ``message``, ``retryable``, ``cause``, ``tool``, ``call_id``; ``plugin`` when a plugin is
    responsible". Was: a failed ``tool_post`` replacement or ``tool_error`` recovery reached the
    caller and the audit record with the plugin's error dict as it was: ``type`` None or
    ``"Weird"``, ``code`` 5, ``retryable`` ``"yes"``, no ``tool``, no ``call_id``, no ``plugin``."""
    recorder = HookRecorder()
    async with _host(tmp_path, recorder, _returns(hook, value)) as host:
        result = await host.call("echo", {"path": "a"} if hook == "tool_post" else {"path": 1}, call_id="c-1")
    assert result.success is False
    error = result.error
    assert error["type"] == category and error["type"] in CATEGORIES
    assert error["code"] == code
    assert error["plugin"] == "returns"
    assert error["tool"] == "echo" and error["call_id"] == "c-1"
    assert error["retryable"] in (None, True, False)
    assert isinstance(error["message"], str)
    assert result.output == value.output  # a failure a plugin reports keeps its output, as a tool's does
    result.get_serialized_output()
    assert len(recorder.results()) == 1
    (record,) = _records(tmp_path)
    assert record["status"] == "error"
    assert (record["error"]["type"], record["error"]["code"], record["error"]["plugin"]) == (category, code,
                                                                                            "returns")


TOKEN = "sk-live-0123456789abcdef"


class Structured:
    name = "structured"
    description = "Returns an object its output schema describes."
    input_schema = {"type": "object"}
    output_schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(True, {"a": 1})


class ChangesOutputInPlace:
    """A careless ``tool_post``: changes the result's output object instead of returning a replacement."""

    name = "in-place"

    def __init__(self, change: str) -> None:
        self.change = change

    @hookimpl
    def tool_post(self, result: ToolResult) -> None:
        if self.change == "secret":
            result.output["leak"] = TOKEN
        else:
            result.output["a"] = "not an integer"


@pytest.mark.parametrize("change", ["secret", "schema"])
async def test_an_output_a_tool_post_hook_changed_in_place_is_withheld(tmp_path: Path, change: str) -> None:
    """pipeline.py: every secret value is redacted "once more from the final result ... before the
    tool_complete observers and the caller see it"; plugins.md: tool_post replacements are re-checked
    against the output schema. Was: an output changed in place by a ``tool_post`` hook skipped both
    (the final scrub skips the object scrubbed before ``tool_post``): the caller got the secret, or
    ``{"a": "not an integer"}`` as a success, with nothing in the trail."""
    recorder = HookRecorder()
    (tmp_path / "work").mkdir()
    async with ToolHost(config={"state_dir": str(tmp_path / "state"), "plugins": {"audit": {"fsync": "never"}}},
                        plugins=[ToolsPlugin(Structured()), recorder, ChangesOutputInPlace(change)],
                        builtins=["audit"], entry_points=False, working_dir=tmp_path / "work",
                        discover=False) as host:
        host.capabilities["session.secrets"].add(TOKEN)
        result = await host.call("structured", {})
    assert result.success is False and result.output is None
    assert (result.error["type"], result.error["code"]) == ("SystemError", "hook_changed_output")
    assert "in-place" in result.error["message"] and TOKEN not in repr(result)
    assert ("host", "changed_in_place") in [(d["plugin"], d["action"]) for d in result.metadata["trail"]]
    assert len(recorder.results()) == 1 and recorder.results()[0].output is None
    (record,) = _records(tmp_path)
    assert (record["status"], record["error"]["code"]) == ("error", "hook_changed_output")


async def test_a_replacement_a_later_tool_post_hook_changed_in_place_is_withheld(host_factory: Any) -> None:
    class Replaces:
        name = "replaces"

        @hookimpl(tryfirst=True)
        def tool_post(self) -> ToolResult:
            return ToolResult(True, {"a": 2})

    host = await host_factory(ToolsPlugin(Structured()), ChangesOutputInPlace("schema"), Replaces())
    result = await host.call("structured", {})
    assert (result.success, result.error and result.error["code"]) == (False, "hook_changed_output")


async def test_an_output_a_tool_post_hook_only_reads_is_delivered(host_factory: Any) -> None:
    class Reads:
        name = "reads"

        @hookimpl
        def tool_post(self, result: ToolResult) -> None:
            assert result.output in ({"a": 1}, "p")

    host = await host_factory(ToolsPlugin(Structured(), EchoTool()), Reads())
    assert (await host.call("structured", {})).output == {"a": 1}
    assert (await host.call("echo", {"path": "p"})).output == "p"


def _denies(hook: str, deny: Deny) -> Any:
    class Denies:
        name = "denier"

    def implementation(self: Any) -> Deny:
        return deny

    implementation.__name__ = hook
    setattr(Denies, hook, hookimpl(implementation))
    return Denies()


async def test_a_denials_details_reach_the_result_and_the_audit_record_as_json_data(tmp_path: Path) -> None:
    """Found by the floors env (tox -e floors): with cattrs 23.2, setup.cfg's floor, the trail kept a
    plugin's details as given — a tuple stayed a tuple and a frozenset was no JSON data."""
    details = {"missing": frozenset({"fs:write", "fs:read"}), "limits": (1, 2)}
    async with _host(tmp_path, _denies("tool_pre", Deny("no", code="over", details=details))) as host:
        result = await host.call("echo", {"path": "a"}, call_id="c-1")
    (denial,) = [d for d in result.metadata["trail"] if d["action"] == "deny"]
    assert denial["details"] == {"missing": ["fs:read", "fs:write"], "limits": [1, 2]}
    assert type(denial["details"]["limits"]) is list
    (record,) = _records(tmp_path)
    (logged,) = [d for d in record["trail"] if d["action"] == "deny"]
    assert logged["details"] == {"missing": ["fs:read", "fs:write"], "limits": [1, 2]}


@pytest.mark.parametrize("hook", ["tool_pre", "tool_post", "tool_error"])
@pytest.mark.parametrize("details", [{"plugin": "someone-else"}, {"message": "m"}, {"code": "c"}, {"hook": "h"},
                                     {"action": "a"}, {"reason": "r"}, {1: "one"}, {"retryable": "yes"},
                                     {"cause": 5}, 5],
                         ids=["plugin", "message", "code", "hook", "action", "reason", "int-key", "retryable",
                              "cause", "no-dict"])
async def test_a_deny_whose_details_name_the_hosts_own_fields_is_the_plugins_denial(
        tmp_path: Path, hook: str, details: dict[Any, Any]) -> None:
    """Was: ``Deny(reason, details={"plugin": ...})`` (or ``message``, ``code``, ... the fields the host
    sets itself) ended the call in ``SystemError`` ``internal`` ("TypeError: got multiple values for
    argument 'plugin'") naming no plugin; from ``tool_error``, ``host.call`` raised the ``TypeError``,
    with no ``tool_complete`` and no audit record."""
    recorder = HookRecorder()
    async with _host(tmp_path, recorder, _denies(hook, Deny("no", code="over", details=details))) as host:
        result = await host.call("echo", {"path": 1} if hook == "tool_error" else {"path": "a"}, call_id="c-1")
    error = result.error
    assert (error["type"], error["code"], error["plugin"]) == ("PolicyError", "over", "denier")
    assert error["message"] == "denied by plugin 'denier': no"
    assert (error["tool"], error["call_id"]) == ("echo", "c-1")
    assert error["retryable"] in (True, False) and error["cause"] in (None, "5")
    assert ("denier", hook, "deny") in [(d["plugin"], d["hook"], d["action"]) for d in result.metadata["trail"]]
    assert len(recorder.results()) == 1
    (record,) = _records(tmp_path)
    assert (record["error"]["code"], record["error"]["plugin"]) == ("over", "denier")


class Unusual(BaseException):
    """A library's own exception that is no ``Exception``."""


@pytest.mark.parametrize("raised", [SystemExit, GeneratorExit, Unusual])
async def test_a_cleanup_raising_a_base_exception_does_not_stop_the_others(tmp_path: Path,
                                                                          raised: type[BaseException]) -> None:
    """host.close: "A cleanup failure is logged and the next cleanup still runs." Was: a cleanup raising
    ``SystemExit``, ``GeneratorExit`` or a library's own ``BaseException`` left ``close()`` with it, and
    the cleanups after it — the earlier plugins', the audit writer's last of all — never ran."""
    ran: list[str] = []

    def plugin(name: str, fails: bool) -> Any:
        class Cleans:
            @hookimpl
            def mount(self) -> Any:
                def cleanup() -> None:
                    ran.append(name)
                    if fails:
                        raise raised()
                return cleanup

        cleans = Cleans()
        cleans.name = name  # type: ignore[attr-defined]
        return cleans

    host = _host(tmp_path, plugin("first", False), plugin("second", True))
    await host.start()
    assert (await host.call("echo", {"path": "a"})).success
    await host.close()
    assert ran == ["second", "first"]
    assert not host.cleanups


class Fails:
    name = "fails"
    description = "Raises; its output schema says integer."
    input_schema = {"type": "object"}
    output_schema = {"type": "integer"}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        raise RuntimeError("boom")


def _recovers(name: str, output: Any) -> Any:
    class Recovers:
        @hookimpl
        def tool_error(self) -> ToolResult:
            return ToolResult(True, output)

    recovers = Recovers()
    recovers.name = name  # type: ignore[attr-defined]
    return recovers


async def test_a_recovery_whose_output_breaks_the_output_schema_is_refused(host_factory: Any) -> None:
    """docs/contract.md: ``output_schema`` is "checked on the tool's output and on every ``tool_post``
    replacement"; a ``tool_error`` recovery is a result the caller gets as the tool's. Was: a recovery
    ``ToolResult(True, "not an integer")`` of a tool whose output schema says integer reached the
    caller as a success."""
    recorder = HookRecorder()
    # registered first, so it runs after the one that breaks the schema (LIFO)
    host = await host_factory(ToolsPlugin(Fails()), recorder, _recovers("good", 7), _recovers("bad", "not an integer"))
    result = await host.call("fails", {})
    assert (result.success, result.output) == (True, 7)
    trail = [(d["plugin"], d["action"]) for d in result.metadata["trail"]]
    assert ("bad", "failed") in trail and ("good", "recover") in trail
    assert "violates its output schema" in next(d["reason"] for d in result.metadata["trail"]
                                                 if d["plugin"] == "bad")
    assert len(recorder.results()) == 1


async def test_a_recovery_breaking_the_output_schema_alone_leaves_the_original_error(host_factory: Any) -> None:
    host = await host_factory(ToolsPlugin(Fails()), _recovers("bad", "not an integer"))
    result = await host.call("fails", {})
    assert result.success is False and result.output is None
    assert result.error["type"] == "ExecutionError" and "boom" in result.error["message"]


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution of two entry-point plugins: one calls ``sys.exit`` at import, one
    raises a library's own ``BaseException`` from ``mount``."""
    site = tmp_path / "site"
    info = site / "careless_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: careless-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[amplifier_tools]\nexits-at-import = careless_exits\n"
                                           "unusual-in-mount = careless_unusual\n")
    (site / "careless_exits.py").write_text("import sys\nsys.exit(3)\n")
    (site / "careless_unusual.py").write_text(textwrap.dedent("""
        from amplifier_tools import hookimpl

        class Unusual(BaseException):
            pass

        @hookimpl
        def mount(coordinator, config):
            raise Unusual("a library's own")
    """))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    for variable in ("AMPLIFIER_TOOLS_DISABLE_PLUGINS", "AMPLIFIER_TOOLS_LOAD_PLUGINS"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "work").mkdir()
    yield tmp_path
    for module in ("careless_exits", "careless_unusual"):
        sys.modules.pop(module, None)


async def test_installed_plugins_that_exit_at_import_or_raise_a_base_exception_in_mount_are_skipped(
        installed: Path) -> None:
    """plugins.md: "a plugin that fails to import or mount is reported in ``host.failed_plugins`` and
    skipped, unless it is required". Was: ``SystemExit`` from the import, or the ``BaseException`` from
    ``mount``, ended every host's start with it (no host could start while the package was installed)."""
    async with ToolHost(config={"state_dir": str(installed / "state")}, plugins=[ToolsPlugin(EchoTool())],
                        builtins=False, working_dir=installed / "work", discover=False) as host:
        failed = {plugin.name: plugin.reason for plugin in host.failed_plugins}
        assert "SystemExit: it called sys.exit(3)" in failed["exits-at-import"]
        assert "Unusual: a library's own" in failed["unusual-in-mount"]
        assert (await host.call("echo", {"path": "a"})).success


async def test_a_required_plugin_raising_a_base_exception_in_mount_stops_the_start_naming_it(
        tmp_path: Path) -> None:
    class Raises:
        name = "raises-unusual"

        @hookimpl
        def mount(self) -> None:
            raise Unusual("own")

    (tmp_path / "work").mkdir()
    host = ToolHost(config={"state_dir": str(tmp_path / "state")}, plugins=[Raises()], builtins=False,
                    entry_points=False, working_dir=tmp_path / "work", discover=False)
    with pytest.raises(PluginLoadError, match="'raises-unusual': failed to mount: Unusual: own"):
        await host.start()
