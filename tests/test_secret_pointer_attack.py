"""Secrets that still came out, found by attack (session 40): a secret holding ``/`` or ``~`` (base64
often holds a ``/``) used as a mapping key is written by the host itself, in a schema violation's
message and ``pointer``, as a JSON pointer spells it (``~1``, ``~0``), which no searched form
matched; a disallowed property's pointer did not escape the name at all; a password in a URL with
an empty user name (``redis://:password@host``, the form Redis documents) was no credential shape;
a ``SyntaxError`` in an exception chain (``ast.literal_eval`` of a text holding a secret) kept its
source line, which a traceback prints beside its message, whole in ``-v``'s "traceback of tool"."""

from __future__ import annotations

import ast
import json
import logging
import os
import traceback
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ToolHost, ToolResult, tool
from amplifier_tools.redaction import PLACEHOLDER, SecretSet, chain_without_secrets, redact, redact_text

VAR = "AMP_TEST_POINTER_SECRET"
# A ``/`` and a ``~``: a JSON pointer writes them ``~1`` and ``~0``.
SECRET = f"Zq9/{uuid.uuid4().hex[:10]}~Tok+en"
POINTER_FORM = SECRET.replace("~", "~0").replace("/", "~1")


class MapsByToken:
    """Returns a mapping keyed by the host's secret, which its output schema refuses (a number
    where it wants a string): the violation names the key in its pointer."""

    name = "sessions"
    description = "Sessions by token."
    input_schema: dict[str, Any] = {"type": "object"}
    output_schema: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

    def __init__(self, secret: str) -> None:
        self.secret = secret

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(success=True, output={self.secret: 5})


class Counts:
    name = "counts"
    description = "Counts by name."
    input_schema: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "integer"}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(success=True, output="ok")


class Strict:
    name = "strict"
    description = "Takes a only."
    input_schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}},
                                    "additionalProperties": False}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(success=True, output="ok")


async def test_a_secret_in_a_schema_violations_pointer_is_redacted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, SECRET)
    (tmp_path / "w").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "secrets": {"k": VAR},
              "plugins": {"audit": {"record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(MapsByToken(SECRET), Counts())], builtins=["audit"],
                        entry_points=False, discover=False, working_dir=tmp_path / "w") as host:
        output_violation = await host.call("sessions", {})
        input_violation = await host.call("counts", {SECRET: "many"})
        log = Path(host.capabilities["audit.path"]).read_text()
    for result in (output_violation, input_violation):
        assert result.error is not None and result.error["code"] in ("invalid_output", "invalid_input")
        assert result.error["pointer"] == f"/{PLACEHOLDER}"
        text = json.dumps(result.error)
        assert POINTER_FORM not in text and SECRET not in text, text
    assert POINTER_FORM not in log and SECRET not in log


async def test_a_disallowed_propertys_pointer_escapes_its_name(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    async with ToolHost(config={"state_dir": str(tmp_path / "state")}, plugins=[ToolsPlugin(Strict())],
                        builtins=False, entry_points=False, discover=False, working_dir=tmp_path / "w") as host:
        result = await host.call("strict", {"x/y~z": "v"})
    assert result.error is not None and result.error["pointer"] == "/x~1y~0z", result.error


def test_redact_finds_a_secret_spelled_as_a_json_pointer() -> None:
    assert redact({"at": f"/a/{POINTER_FORM}/0"}, secrets=SecretSet([SECRET]), patterns=False) \
        == {"at": f"/a/{PLACEHOLDER}/0"}


@pytest.mark.parametrize("url", ["redis://:hunter2-password@10.0.0.5:6379/0",
                                 "rediss://:p%40ss-word@cache.internal/1"])
def test_a_password_in_a_url_with_no_user_name_is_redacted(url: str) -> None:
    clean = redact_text(f"connecting to {url}")
    assert "hunter2" not in clean and "p%40ss" not in clean and f"://{PLACEHOLDER}@" in clean, clean


def _printed(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def test_a_syntax_errors_source_line_is_scrubbed_from_the_chain() -> None:
    token = f"tok-{uuid.uuid4().hex}"
    try:
        try:
            ast.literal_eval("{" + token)
        except SyntaxError as exc:
            raise ValueError("the setting is no Python literal") from exc
    except ValueError as exc:
        caught = exc
    assert token in _printed(caught)  # what a traceback shows of a SyntaxError: its source line
    clean = chain_without_secrets(caught, SecretSet([token]))
    assert clean is not None
    printed = _printed(clean)
    assert token not in printed and "no Python literal" in printed and PLACEHOLDER in printed, printed
    harmless = SyntaxError("invalid syntax", ("<unknown>", 1, 1, "{nothing secret", 1, 2))
    assert chain_without_secrets(harmless, SecretSet([token])) is harmless


async def test_a_tools_syntax_error_is_logged_without_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    token = f"lit-{uuid.uuid4().hex}"
    monkeypatch.setenv(VAR, token)

    @tool(name="parse_setting", effect="Pure")
    def parse_setting() -> str:
        """Parses a setting kept in the environment as a Python literal."""
        return repr(ast.literal_eval("{" + os.environ[VAR]))

    caplog.set_level(logging.INFO)
    (tmp_path / "w").mkdir()
    config = {"state_dir": str(tmp_path / "state"), "secrets": {"k": VAR}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(parse_setting)], builtins=False, entry_points=False,
                        discover=False, working_dir=tmp_path / "w") as host:
        result = await host.call("parse_setting", {})
    assert result.error is not None and token not in json.dumps(result.error)
    logs = "\n".join(r.getMessage() + ("\n" + _printed(r.exc_info[1]) if r.exc_info and r.exc_info[1] else "")
                     for r in caplog.records)
    assert "traceback of tool 'parse_setting'" in logs and token not in logs, logs[-600:]
