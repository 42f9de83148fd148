"""``ToolContext``'s identifiers are checked as a caller's call id is (``models.identifier_problem``):
found by attack, ``ToolContext(session_id="ghp_" + "a" * 36)`` reached ``tool_event`` observers whole
while the audit record wrote ``[REDACTED]`` (the id no longer matched across the two), and a trace id
of 100 KB or holding control characters went into the audit log as it was."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ConfigError, ToolContext, ToolHost, hookimpl, tool
from amplifier_tools.models import ContextFieldError

TOKEN = "ghp_" + "a" * 36
SECRET = "hunter2-context-secret"


@tool(name="local::t.echo", effect="Pure")
def echo(text: str) -> str:
    """Echo the text."""
    return text


class Events:
    name = "events"

    def __init__(self) -> None:
        self.data: list[dict[str, Any]] = []

    @hookimpl
    def tool_event(self, event: str, data: dict[str, Any]) -> None:
        self.data.append(dict(data))


def _records(host: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(host.capabilities["audit.path"]).read_text().splitlines()]


@pytest.mark.parametrize("field", ["session_id", "trace_id", "principal", "role", "environment", "idempotency_key",
                                   "call_id", "scopes"])
def test_a_context_identifier_holding_a_credential_is_refused_naming_the_field(field: str) -> None:
    value: Any = {TOKEN} if field == "scopes" else TOKEN
    with pytest.raises(ContextFieldError) as info:
        ToolContext(**{field: value})
    assert info.value.field == field and str(info.value).startswith(f"ToolContext.{field} ")
    assert "credential" in str(info.value) and TOKEN not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("trace_id", "a" * 257, "more than 256"),
    ("session_id", "a" * 100_000, "more than 256"),
    ("trace_id", "x\x1b[31mred", "control"),
    ("session_id", "s\n2026-11-30 forged line", "control"),
    ("trace_id", "trace-é", "printable ASCII"),
    ("session_id", "", "empty"),
    ("principal", "p" * 257, "more than 256"),
    ("principal", "admin\u202egnp.exe", "format"),  # a right-to-left override
    ("principal", "ali\u200bce", "format"),  # a zero-width space
    ("role", "dev\u2028ops", "line-separating"),
    ("environment", "", "empty"),
    ("principal", "   ", "white space"),  # no name at all, read as blank in a log
    ("principal", "alice ", "white space"),  # a principal of its own, its own rate limits and budgets
    ("role", "\tadmin", "control"),
    ("idempotency_key", " key-1", "white space"),
    ("scopes", {"fs:read fs:write"}, "space"),
    ("scopes", {"fs:réad"}, "printable ASCII"),
    ("scopes", {""}, "empty"),
])
def test_an_identifier_of_no_safe_shape_is_refused(field: str, value: Any, reason: str) -> None:
    with pytest.raises(ContextFieldError, match=reason) as info:
        ToolContext(**{field: value})
    assert info.value.field == field


LEGITIMATE: dict[str, Any] = {
    "principal": "zoë.müller@exämple.com", "role": "Administrateur général", "environment": "prod-eu-west-1",
    "trace_id": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "session_id": f"{uuid.uuid4()}-0000000000000001_explorer", "idempotency_key": "commande-été-42 #7",
    "scopes": frozenset({"fs:read", "mcp:github/*", "https://graph.example.com/User.Read"}),
}


async def test_legitimate_identifiers_are_taken_and_are_the_same_in_events_and_the_audit_record(
        tool_host: Any) -> None:
    """A principal may be an e-mail address with non-ASCII letters, a role free words, a trace id a W3C
    traceparent, a scope a URL; each is taken as it is and is the same everywhere."""
    events = Events()
    longest = ToolContext(principal="p" * 256, trace_id="t" * 256, session_id="s" * 256)
    async with tool_host(echo, events, builtins=["audit"]) as host:
        result = await host.call("t_echo", {"text": "hi"}, context=ToolContext(**LEGITIMATE))
        assert (await host.call("t_echo", {"text": "hi"}, context=longest)).success
        record = _records(host)[0]
    assert result.success
    assert record["principal"] == LEGITIMATE["principal"] and record["role"] == LEGITIMATE["role"]
    assert record["trace_id"] == LEGITIMATE["trace_id"] and record["session_id"] == LEGITIMATE["session_id"]
    assert sorted(record["scopes"]) == sorted(LEGITIMATE["scopes"])
    assert {data.get("session_id") for data in events.data[:1]} == {LEGITIMATE["session_id"]}


async def test_a_context_changed_around_the_constructor_to_hold_a_token_is_refused_before_any_event(
        tool_host: Any) -> None:
    events = Events()
    context = ToolContext()
    object.__setattr__(context, "session_id", TOKEN)
    async with tool_host(echo, events, builtins=["audit"]) as host:
        result = await host.call("t_echo", {"text": "hi"}, context=context)
        records = _records(host) if Path(host.capabilities["audit.path"]).exists() else []
    assert not result.success
    assert result.error["type"] == "ContractError" and result.error["code"] == "invalid_context"
    assert result.error["field"] == "session_id" and "ToolContext.session_id" in result.error["hint"]
    assert TOKEN not in json.dumps([events.data, records, result.error], default=str)
    assert events.data == []


@pytest.mark.parametrize("field", ["session_id", "trace_id"])
async def test_an_id_holding_a_secret_the_host_resolved_is_refused_by_the_host(
        tool_host: Any, monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    """The constructor knows no secret; ``host.call`` looks for the host's registered ones in the ids."""
    monkeypatch.setenv("AMP_TEST_CONTEXT_SECRET", SECRET)
    events = Events()
    context = ToolContext(**{field: f"id-{SECRET}"})  # no credential shape: the constructor takes it
    async with tool_host(echo, events, builtins=["audit"],
                         config={"secrets": {"key": "AMP_TEST_CONTEXT_SECRET"}}) as host:
        host.default_context.secret("key")
        result = await host.call("t_echo", {"text": "hi"}, context=context)
    assert result.error["code"] == "invalid_context" and result.error["field"] == field
    assert SECRET not in json.dumps([events.data, result.error], default=str)


async def test_a_role_found_by_config_substitution_may_be_passed_on_by_a_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A substituted configuration value is a registered secret (``${VAR}``); names are looked at for
    credential shapes only, so the configured role passed on in a caller's context still runs."""
    monkeypatch.setenv("AMP_TEST_ROLE", "maintainer")
    config = tmp_path / "amplifier-tools.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[context]\nrole = "${{AMP_TEST_ROLE}}"\n')
    (tmp_path / "w").mkdir()
    async with ToolHost(config=config, plugins=[echo], builtins=False, entry_points=False,
                        working_dir=tmp_path / "w") as host:
        assert host.default_context.role == "maintainer"
        result = await host.call("t_echo", {"text": "hi"}, context=ToolContext(role=host.default_context.role))
    assert result.success, result.error


@pytest.mark.parametrize(("field", "value"), [("principal", TOKEN), ("role", "Bearer abcdefgh12345678"),
                                              ("scopes", ["fs:read fs:write"])])
def test_a_configured_context_identifier_of_no_safe_shape_is_a_config_error(
        tmp_path: Path, field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        ToolHost(config={"state_dir": str(tmp_path), "context": {field: value}}, builtins=False, entry_points=False)
    assert info.value.key == f"context.{field}" and "Identifiers" in (info.value.hint or "")
    assert TOKEN not in str(info.value) and "abcdefgh12345678" not in str(info.value)


async def test_a_served_mcp_callers_principal_of_no_safe_shape_is_a_config_error(tool_host: Any) -> None:
    pytest.importorskip("mcp")
    from amplifier_tools.mcp.server import caller_context
    from amplifier_tools.mcp.settings import ServeClient, ServeSettings

    async with tool_host(echo) as host:
        with pytest.raises(ConfigError) as info:
            caller_context(host, ServeSettings(principal=TOKEN))
        assert info.value.key == "plugins.mcp.serve.principal" and TOKEN not in str(info.value)
        client = ServeClient(token_ref="ci", scopes=("fs:read fs:write",))
        with pytest.raises(ConfigError) as info:
            caller_context(host, ServeSettings(clients=(client,)), client)
        assert info.value.key == "plugins.mcp.serve.clients[0].scopes"
        assert caller_context(host, ServeSettings(principal="zoë@example.com")).principal == "zoë@example.com"


def test_the_verdicts_kept_for_repeated_names_are_bounded() -> None:
    from amplifier_tools import models

    for number in range(models._MAX_FINE + 100):
        ToolContext(principal=f"agent-{number}")
    assert 0 < len(models._fine) <= models._MAX_FINE
    with pytest.raises(ContextFieldError):  # a refused value is never kept as fine
        ToolContext(principal=TOKEN)
    with pytest.raises(ContextFieldError):
        ToolContext(principal=TOKEN)

