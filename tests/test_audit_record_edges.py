"""A record's less travelled members, as a caller, a tool or a plugin can fill them: keys noted in
``altered``, scopes that do not sort, NaN outside the arguments and output. Found by a review
(2026-11-28); each test failed before its fix."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from amplifier_tools import ToolContext, ToolResult, ToolSpec, _json
from amplifier_tools.builtins import audit
from amplifier_tools.builtins.audit.settings import AuditSettings
from amplifier_tools.models import ToolCall
from amplifier_tools.redaction import SecretSet

SECRET = "hunter2-secret-value"
CREDENTIAL = "ghp_" + "A" * 36  # a GitHub token's shape: a default credential pattern
SPEC = ToolSpec(name="third::tool", version="1.0.0", description="d", effect="Pure", input_schema={"type": "object"})


def _strict(body: bytes) -> dict[str, Any]:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)  # type: ignore[no-any-return]


def _body(call: ToolCall, result: ToolResult, context: ToolContext | None = None) -> bytes:
    settings = AuditSettings(redact_patterns=True)  # record_output is off: the output is only hashed
    return audit.record_body(call, SPEC, result, context or ToolContext(session_id="s"), call.arguments, settings,
                             SecretSet([SECRET]))


# --- 1. ``altered`` notes name keys as they were: a secret or credential in a key is written out ---


@pytest.mark.parametrize("key", [SECRET, CREDENTIAL])
def test_an_altered_note_does_not_write_a_key_that_redaction_scrubs(key: str) -> None:
    """A tool's output ``{<credential-shaped key>: NaN}`` (no output schema) is not even recorded
    (record_output is off) yet its key reached the log through ``altered``:
    ``"/output/ghp_AAAA...: nan written as a string"``. Redaction scrubs keys everywhere else."""
    call = ToolCall("c", SPEC.name, {"a": 1})
    body = _body(call, ToolResult(True, {key: math.nan}, None, {"trail": []}))
    assert key.encode() not in body


def test_an_altered_note_does_not_write_a_secret_in_an_argument_key() -> None:
    """A lone surrogate in an argument key (plain JSON to ``is_plain_json``: a ``str``) gets a note
    with the key's repr; the argument itself is written ``[REDACTED]\\ud800``, the note in full."""
    call = ToolCall("c", SPEC.name, {SECRET + "\ud800": 1})
    body = _body(call, ToolResult(True, "ok", None, {"trail": []}))
    assert b"[REDACTED]" in body and SECRET.encode() not in body


async def test_through_a_host_a_credential_key_in_the_output_stays_out_of_the_log(tmp_path: Path) -> None:
    from helpers import ToolsPlugin

    from amplifier_tools import ToolHost

    class Scores:
        spec = ToolSpec(name="local::scores", version="1.0.0", description="d", effect="Pure",
                        input_schema={"type": "object"})
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output={CREDENTIAL: math.nan})

    (tmp_path / "work").mkdir()
    path = tmp_path / "audit" / "log.jsonl"
    async with ToolHost(config={"plugins": {"audit": {"path": str(path)}}}, plugins=[ToolsPlugin(Scores())],
                        builtins=["audit"], entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        assert (await host.call("scores", {})).success
    assert CREDENTIAL not in path.read_text()


# --- 2. a caller's scopes of mixed types: the audit hook raises, the call (which ran) is never recorded ---


async def test_a_call_with_scopes_of_mixed_types_is_still_recorded(tmp_path: Path) -> None:
    """``sorted(context.scopes)`` in ``_raw_parts`` raises TypeError outside any guard: the tool has
    run (side effects and all), the caller gets hook_failed, and the log has no line for it.
    build_record's docstring: "Never raises for what a caller or tool passed"."""
    from helpers import ToolsPlugin

    from amplifier_tools import ToolHost

    ran: list[bool] = []

    class Effect:
        spec = ToolSpec(name="local::effect", version="1.0.0", description="d", effect="ExternalSideEffects",
                        input_schema={"type": "object"})
        name, description = spec.name, spec.description

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            ran.append(True)
            return ToolResult(output="done")

    (tmp_path / "work").mkdir()
    path = tmp_path / "audit" / "log.jsonl"
    async with ToolHost(config={"plugins": {"audit": {"path": str(path)}}}, plugins=[ToolsPlugin(Effect())],
                        builtins=["audit"], entry_points=False, working_dir=tmp_path / "work", discover=False) as host:
        with pytest.raises(TypeError, match="ToolContext.scopes must hold strings"):
            ToolContext(principal="p", scopes=frozenset({"read", 1}))  # type: ignore[arg-type]
        mixed = ToolContext(principal="p")  # set around the constructor: refused by the host, tool not run
        object.__setattr__(mixed, "scopes", frozenset({"read", 1}))
        refused = await host.call("effect", {}, context=mixed)
        assert refused.error["code"] == "invalid_context" and "ToolContext.scopes" in refused.error["message"]
        await host.call("effect", {}, context=ToolContext(principal="p", scopes={"read"}))
    assert ran == [True]
    lines = path.read_text().splitlines() if path.exists() else []
    assert len(lines) == 1 and json.loads(lines[0])["tool"] == "local::effect"


# --- 3. NaN outside arguments/output (attempts, trail details): no note, and bare NaN with the stdlib ---


@pytest.mark.parametrize("stdlib", [True, False])
@pytest.mark.parametrize("where", ["attempts", "trail"])
def test_nan_in_a_tool_or_plugin_member_is_escaped_and_noted(stdlib: bool, where: str) -> None:
    """Only ``arguments`` and ``output`` are looked at for NaN (``may_hold_nonfinite``). A tool's
    ``metadata["attempts"]`` (no retry) or a plugin's decision details holding NaN are written
    ``NaN`` by the stdlib encoder (not JSON: the line fails a strict parser, jq...) or ``null`` by
    orjson, with no ``altered`` note either way; docs/audit.md promises ``"NaN"`` and a note."""
    metadata: dict[str, Any] = {"trail": []}
    if where == "attempts":
        metadata["attempts"] = math.nan
    else:
        metadata["trail"] = [{"plugin": "p", "hook": "tool_pre", "action": "allow", "details": {"score": math.nan}}]
    call = ToolCall("c", SPEC.name, {"a": 1})
    with mock.patch.object(_json, "orjson", None if stdlib else _json._fast()):
        body = _body(call, ToolResult(True, "ok", None, metadata))
    record = _strict(body)
    assert record.get("altered"), body
