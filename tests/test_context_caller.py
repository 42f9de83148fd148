"""``ToolHost.context_caller``: the calls of one caller with one context (serve-mcp's clients),
whose context is checked once rather than at every call, and again once the host registers a
secret; each call otherwise as ``host.call(..., context=...)`` runs and refuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amplifier_tools import ToolContext, tool

TOKEN = "ghp_" + "a" * 36
SECRET = "hunter2-context-caller-secret"


@tool(name="local::t.echo", effect="Pure")
def echo(text: str) -> str:
    """Echo the text."""
    return text


def _records(host: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(host.capabilities["audit.path"]).read_text().splitlines()]


async def test_its_calls_run_with_its_context_under_ids_the_host_made(tool_host: Any) -> None:
    async with tool_host(echo, builtins=["audit"]) as host:
        caller = host.context_caller(ToolContext(principal="zoë@example.com", role="ci", scopes={"read"}))
        told: list[str] = []
        first = await caller.call("t_echo", {"text": "hi"}, told.append)
        second = await caller.call("t_echo", {"text": "again"})
        records = _records(host)
    assert first.success and first.output == "hi" and second.output == "again"
    assert told == [first.tool_call_id] and first.tool_call_id != second.tool_call_id
    assert [r["call_id"] for r in records] == [first.tool_call_id, second.tool_call_id]
    who = {(r["principal"], r["role"], r["session_id"]) for r in records}
    assert who == {("zoë@example.com", "ci", host.session_id)}


async def test_a_secret_registered_after_it_was_made_is_looked_for_in_its_ids(tool_host: Any) -> None:
    """Checked once, not at every call, but again once the host knows a new secret: an id holding it
    is then refused as ``host.call`` refuses it."""
    async with tool_host(echo, builtins=["audit"]) as host:
        caller = host.context_caller(ToolContext(trace_id=f"trace-{SECRET}"))
        assert (await caller.call("t_echo", {"text": "hi"})).success
        host.secrets.add(SECRET)
        refused = await caller.call("t_echo", {"text": "hi"})
        direct = await host.call("t_echo", {"text": "hi"}, context=ToolContext(trace_id=f"trace-{SECRET}"))
    assert refused.error["code"] == direct.error["code"] == "invalid_context"
    assert refused.error["field"] == "trace_id" and SECRET not in json.dumps(refused.error)


async def test_a_context_refused_when_it_is_made_refuses_every_call(tool_host: Any) -> None:
    context = ToolContext()
    object.__setattr__(context, "session_id", TOKEN)  # around the frozen class's check
    async with tool_host(echo, builtins=["audit"]) as host:
        caller = host.context_caller(context)
        results = [await caller.call("t_echo", {"text": "hi"}) for _ in range(2)]
        audited = Path(host.capabilities["audit.path"]).exists() and _records(host)
    assert [r.error["code"] for r in results] == ["invalid_context"] * 2
    assert results[0].error["field"] == "session_id" and TOKEN not in json.dumps([r.error for r in results])
    assert not audited


async def test_a_call_after_the_host_closed_is_refused_as_host_call_refuses_it(tool_host: Any) -> None:
    async with tool_host(echo) as host:
        caller = host.context_caller(ToolContext())
    result = await caller.call("t_echo", {"text": "hi"})
    assert not result.success and result.error["code"] == "host_closing"


OTHER = "swordfish-added-to-the-table-later"


async def test_a_value_added_to_its_secrets_table_is_redacted_as_host_call_redacts_it(tool_host: Any) -> None:
    """Found by review: ``host.call`` registers every value of a caller's secrets table at each call
    (the table is the caller's: it may grow); the caller kept the table of the context it was given
    and registered its values once, so a value added since reached the client whole."""
    table = {"key": SECRET}
    async with tool_host(echo) as host:
        caller = host.context_caller(ToolContext(secrets=table))
        assert (await caller.call("t_echo", {"text": "hi"})).success
        table["other"] = OTHER
        result = await caller.call("t_echo", {"text": f"it is {OTHER}"})
    assert result.success and OTHER not in json.dumps(result.output)


async def test_a_context_refused_when_made_and_set_right_since_runs_as_host_call_runs_it(tool_host: Any) -> None:
    """Found by review: a context refused when the caller was made was kept as given, and once its
    field was set right again its calls ran with it unwrapped: no session id, and what its own
    secrets table handed out not registered, so not redacted."""
    context = ToolContext(secrets={"key": SECRET})
    object.__setattr__(context, "session_id", TOKEN)  # around the frozen class's check

    @tool(name="local::t.reveal", effect="Pure", security={"secret_refs": ["key"]})
    def reveal(context: ToolContext) -> dict[str, Any]:
        """Say what it was given."""
        return {"key": context.secret("key"), "session": context.session_id}

    async with tool_host(reveal) as host:
        caller = host.context_caller(context)
        assert (await caller.call("t_reveal")).error["code"] == "invalid_context"
        object.__setattr__(context, "session_id", None)
        result = await caller.call("t_reveal")
        direct = await host.call("t_reveal", context=context)
    assert result.success and direct.success
    assert SECRET not in json.dumps(result.output) and SECRET not in json.dumps(direct.output)
    assert result.output["session"] == direct.output["session"] == host.session_id
