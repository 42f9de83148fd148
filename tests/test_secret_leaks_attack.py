"""Secrets that still came out, found by attack: a number or tuple as a mapping key, a secret a
hook registered after the output was scanned, an exception's notes, the hook trace, the log
lines of a hook's failure, of a cleanup's failure and of an optional plugin that did not mount."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import traceback
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ConfigError, PluginLoadError, ToolContext, ToolHost, hookimpl, tool
from amplifier_tools.redaction import PLACEHOLDER, SecretSet, chain_without_secrets, redact


def _places(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "w").mkdir(exist_ok=True)
    return {"working_dir": tmp_path / "w", "config": {"state_dir": str(tmp_path / "state")}}


def _logged(records: list[logging.LogRecord]) -> str:
    return "\n".join(r.getMessage() + ("\n" + "".join(traceback.format_exception(*r.exc_info)) if r.exc_info else "")
                     for r in records)


@tool(name="echo", effect="Pure")
def echo(text: str) -> str:
    """Echo."""
    return text


async def test_a_numeric_secret_as_a_mapping_key_is_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "918273645546372819"
    monkeypatch.setenv("AMP_TEST_KEY_SECRET", secret)

    @tool(name="balances", effect="Pure")
    def balances() -> Any:
        """Balances by account number."""
        return {int(os.environ["AMP_TEST_KEY_SECRET"]): "balance", "other": {7: "kept"}}

    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"acct": "AMP_TEST_KEY_SECRET"},
              "plugins": {"audit": {"record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(balances)], builtins=["audit"], entry_points=False,
                        discover=False, **places) as host:
        result = await host.call("balances", {})
        log = Path(host.capabilities["audit.path"]).read_text()
    assert result.output == {PLACEHOLDER: "balance", "other": {7: "kept"}}
    assert secret not in result.get_serialized_output(max_chars=None)
    assert secret not in log


def test_a_secret_inside_a_tuple_key_is_redacted() -> None:
    token = f"tuple-{uuid.uuid4().hex}"
    clean = redact({(token, 1): "v", ("plain", 2): "w"}, secrets=[token], patterns=False)
    assert clean == {(PLACEHOLDER, 1): "v", ("plain", 2): "w"}


async def test_a_secret_a_tool_post_hook_registers_is_redacted_from_the_output(tmp_path: Path) -> None:
    token = f"late-{uuid.uuid4().hex}"

    class ResolvesLate:
        @hookimpl
        def tool_post(self, call: Any, spec: Any, result: Any, context: ToolContext) -> None:
            context.secret("late")  # resolving registers the value host-wide, after the output was scanned

    class ObserverResolvesLate:
        @hookimpl
        def tool_complete(self, call: Any, spec: Any, result: Any, context: ToolContext) -> None:
            context.secret("observed")

    observed = f"observed-{uuid.uuid4().hex}"
    values = {"late": token, "observed": observed}
    ctx = ToolContext(secrets=values.get)  # a callable: nothing is known before it is asked for
    async with ToolHost(plugins=[ToolsPlugin(echo), ResolvesLate(), ObserverResolvesLate()], builtins=False,
                        entry_points=False, discover=False, **_places(tmp_path)) as host:
        result = await host.call("echo", {"text": f"a {token} {observed}"}, context=ctx)
    assert result.output == f"a {PLACEHOLDER} {PLACEHOLDER}"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (add_note) are Python 3.11+")
def test_an_exceptions_notes_are_scrubbed() -> None:
    token = f"note-{uuid.uuid4().hex}"
    secrets = SecretSet([token])
    try:
        error = ValueError("bad header")
        error.add_note(f"while sending Authorization: {token}")
        raise error
    except ValueError as exc:
        caught = exc
    clean = chain_without_secrets(caught, secrets)
    assert clean is not None and clean is not caught
    printed = "".join(traceback.format_exception(clean))
    assert token not in printed and f"while sending Authorization: {PLACEHOLDER}" in printed
    plain = ValueError("x")
    plain.add_note("nothing secret")
    assert chain_without_secrets(plain, secrets) is plain


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes (add_note) are Python 3.11+")
async def test_a_start_error_whose_cause_has_a_note_holding_a_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"start-note-{uuid.uuid4().hex}"
    monkeypatch.setenv("AMP_TEST_NOTE_TOKEN", token)

    class Connects:
        @hookimpl
        def mount(self, coordinator: Any) -> None:
            value = coordinator.get_capability("session.secret")("upstream")
            try:
                error = ValueError("bad header")
                error.add_note(f"while sending Authorization: {value}")
                raise error
            except ValueError as exc:
                raise ConnectionError("could not connect") from exc

    places = _places(tmp_path)
    with pytest.raises((ConfigError, PluginLoadError)) as failed:
        async with ToolHost(config={"secrets": {"upstream": "AMP_TEST_NOTE_TOKEN"}, **places["config"]},
                            plugins=[Connects()], builtins=False, entry_points=False, discover=False,
                            working_dir=places["working_dir"]):
            pass
    printed = "".join(traceback.format_exception(failed.value))
    assert "while sending Authorization: [REDACTED]" in printed and token not in printed


class _RaisesWithSecret:
    @hookimpl
    def tool_pre(self, call: Any, spec: Any, context: ToolContext) -> None:
        raise ValueError(f"upstream refused key {context.secret('k')}")

    @hookimpl
    async def tool_complete(self, call: Any, spec: Any, result: Any, context: ToolContext) -> None:
        raise ValueError(f"observer refused key {context.secret('k')}")


async def test_a_hook_failure_is_traced_and_logged_without_the_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    token = f"hook-{uuid.uuid4().hex}"
    monkeypatch.setenv("AMPLIFIER_TOOLS_TRACE", "1")
    caplog.set_level(logging.WARNING)
    async with ToolHost(plugins=[ToolsPlugin(echo), _RaisesWithSecret()], builtins=False, entry_points=False,
                        discover=False, **_places(tmp_path)) as host:
        result = await host.call("echo", {"text": "x"}, context=ToolContext(secrets={"k": token}.get))
    assert token not in repr(result)
    err = capsys.readouterr().err
    assert "raised ValueError" in err and token not in err
    logs = _logged(caplog.records)
    assert "failed in tool_pre" in logs and "failed in tool_complete" in logs and token not in logs


async def test_a_cleanup_failure_is_logged_without_the_secret(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token = f"cleanup-{uuid.uuid4().hex}"

    class LogsOut:
        @hookimpl
        def mount(self, coordinator: Any) -> Any:
            coordinator.get_capability("session.secrets").add(token)

            def cleanup() -> None:
                raise RuntimeError(f"logout failed for session {token}")
            return cleanup

    caplog.set_level(logging.WARNING)
    async with ToolHost(plugins=[LogsOut()], builtins=False, entry_points=False, discover=False, **_places(tmp_path)):
        pass
    logs = _logged(caplog.records)
    assert "cleanup of plugin" in logs and "RuntimeError: logout failed for session [REDACTED]" in logs
    assert token not in logs


async def test_an_optional_plugin_that_did_not_mount_is_reported_without_the_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import amplifier_tools.host as host_module

    token = f"optional-{uuid.uuid4().hex}"
    monkeypatch.setenv("AMP_TEST_OPTIONAL_TOKEN", token)

    class Flaky:
        @hookimpl
        def mount(self, coordinator: Any) -> None:
            raise ConnectionError(f"refused {coordinator.get_capability('session.secret')('upstream')}")

    module = types.ModuleType("amp_test_flaky_plugin")
    module.Flaky = Flaky  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "amp_test_flaky_plugin", module)
    entry = importlib.metadata.EntryPoint("flaky", "amp_test_flaky_plugin:Flaky", "amplifier_tools")
    monkeypatch.setattr(host_module, "installed_entry_points",
                        lambda: {"amplifier_tools": [entry], "amplifier.modules": []})
    caplog.set_level(logging.WARNING)
    places = _places(tmp_path)
    async with ToolHost(config={"secrets": {"upstream": "AMP_TEST_OPTIONAL_TOKEN"}, **places["config"]},
                        builtins=False, discover=False, working_dir=places["working_dir"]) as host:
        reasons = [failed.reason for failed in host.failed_plugins]
    assert reasons == [f"failed to mount: ConnectionError: refused {PLACEHOLDER}"]
    logs = _logged(caplog.records)
    assert "continuing without it" in logs and token not in logs


async def test_an_event_handlers_and_a_contributors_failures_are_logged_without_the_secret(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The same log pattern as a cleanup's failure, in the two other places that logged a failure
    with ``log.exception``: an Amplifier-style event handler, and a coordinator contributor."""
    token = "evt-" + uuid.uuid4().hex
    kept: dict[str, Any] = {}

    class Leaky:
        name = "leaky"

        @hookimpl
        def mount(self, coordinator: Any) -> None:
            kept["coordinator"] = coordinator

            def fail() -> None:
                raise RuntimeError(f"contributor saw {token}")

            coordinator.register_contributor("leaky.channel", "leaky", fail)

    async with ToolHost(plugins=[Leaky()], builtins=False, entry_points=False, discover=False,
                        **_places(tmp_path)) as host:
        host.secrets.add(token)

        async def handler(event: str, data: dict[str, Any]) -> Any:
            raise ValueError(f"handler saw {token}")

        host.events.register("leaky:event", handler, name="leaky-handler")
        with caplog.at_level(logging.ERROR, logger="amplifier_tools"):
            await host.events.emit("leaky:event", {})
            assert await kept["coordinator"].collect_contributions("leaky.channel") == []
    text = _logged(caplog.records)
    assert "handler saw" in text and "contributor saw" in text, text
    assert token not in text
