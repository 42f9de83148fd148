"""Secret laundering: a secret the host resolved never comes back out of any tool, error, audit record or span.

A canary is put in the host's environment and in ``[secrets]``; bash gets it as ``$DEPLOY``
(``[plugins.bash] secrets``) and function tools read it from the environment themselves (as a tool
with its own way to a secret would). Every attempt below tries to bring it back through another
tool or another channel; none may show any form of it the redaction promises to catch.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, ToolContext, ToolHost, ToolResult, hookimpl, tool
from amplifier_tools.builtins.audit import AuditPlugin
from amplifier_tools.redaction import PLACEHOLDER, SecretSet, redact

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup

DEPLOY_VAR = "AMP_TEST_LAUNDER_DEPLOY"
IDLE_VAR = "AMP_TEST_LAUNDER_IDLE"  # in [secrets], never asked for by any tool
CORE = uuid.uuid4().hex
# A quote, a backslash and a non-ASCII letter: its JSON text is not the value itself.
CANARY = f'cAnArY-{CORE}-"q\\zé'
IDLE_CORE = uuid.uuid4().hex
IDLE = f"idle-{IDLE_CORE}"


def _env(name: str) -> str:
    return os.environ[name]


@tool(name="leak_return", effect="Pure")
def leak_return() -> str:
    """Returns the secret as its output."""
    return _env(DEPLOY_VAR)


@tool(name="leak_nested", effect="Pure")
def leak_nested() -> Any:
    """Returns the secret deep inside JSON, as a key and twice next to other text."""
    s = _env(DEPLOY_VAR)
    return {"a": [{"b": [s]}], s: "as a key", "adjacent": f"x{s}{s}y", "json": json.dumps({"k": s}),
            "ascii_json": json.dumps({"k": s}, ensure_ascii=True), "n": 3}


@tool(name="leak_long", effect="Pure")
def leak_long() -> str:
    """Returns the secret at an offset of 1 MiB."""
    return "a" * (1 << 20) + _env(DEPLOY_VAR) + "b" * 10


@tool(name="leak_raise", effect="Pure")
def leak_raise() -> str:
    """Raises with the secret in the message."""
    raise RuntimeError(f"could not connect with password={_env(DEPLOY_VAR)}")


@tool(name="leak_details", effect="Pure")
def leak_details() -> str:
    """Raises a typed error with the secret in nested details."""
    raise ExecutionError(f"failed: {_env(DEPLOY_VAR)}", code="boom", stderr={"lines": [_env(DEPLOY_VAR)]})


@tool(name="leak_failed_result", effect="Pure")
def leak_failed_result() -> ToolResult:
    """Reports a failure whose output and metadata hold the secret."""
    s = _env(DEPLOY_VAR)
    return ToolResult(False, {"log": s}, {"code": "x", "message": f"bad {s}"}, {"debug": s})


@tool(name="leak_metadata", effect="Pure")
def leak_metadata() -> ToolResult:
    """Succeeds with the secret in metadata."""
    return ToolResult(True, "ok", None, {"debug": _env(DEPLOY_VAR)})


@tool(name="leak_idle", effect="Pure")
def leak_idle() -> str:
    """Returns a [secrets] value no tool ever resolved."""
    return f"idle={_env(IDLE_VAR)}"


FUNCTION_TOOLS = [leak_return, leak_nested, leak_long, leak_raise, leak_details, leak_failed_result,
                  leak_metadata, leak_idle]

PY = "python3 -c"
BASH_ATTEMPTS = [
    'echo "$DEPLOY"',
    'echo "$DEPLOY" >&2; exit 3',
    'echo "abc${DEPLOY}xyz"',
    'for i in 1 2 3; do printf "%s%s" "$DEPLOY" "$DEPLOY"; done',
    'printf %s "$DEPLOY" > plain.txt',
    f"{PY} 'import json,os; print(json.dumps({{\"k\": os.environ[\"DEPLOY\"]}}))' > j.json",
    f"{PY} 'import json,os; print(json.dumps({{\"k\": os.environ[\"DEPLOY\"]}}, ensure_ascii=False))' > u.json",
    'printf %s "$DEPLOY" | base64 -w0 > b64.txt',
    'printf xy%s "$DEPLOY" | base64 -w0',
    f"{PY} 'import os; print(os.environ[\"DEPLOY\"].encode().hex())'",
    f"{PY} 'import os,urllib.parse; print(urllib.parse.quote(os.environ[\"DEPLOY\"]))'",
    'touch "name-$DEPLOY-file"',
    'echo "$DEPLOY" | cat - /nonexistent',
    'echo "token: $DEPLOY"; kill -9 $$',
]
FS_ATTEMPTS: list[tuple[str, dict[str, Any]]] = [
    ("fs_read_file", {"path": "plain.txt"}),
    ("fs_read_file", {"path": "j.json"}),
    ("fs_read_file", {"path": "u.json"}),
    ("fs_read_file", {"path": "b64.txt"}),
    ("fs_grep", {"pattern": "cAnArY", "path": "."}),
    ("fs_grep", {"pattern": "k", "path": ".", "glob": "*.json"}),
    ("fs_list_dir", {"path": "."}),
    ("fs_glob", {"pattern": "name-*"}),
    ("fs_read_file", {"path": "no-such-dir/../name-*"}),
]


def _forbidden() -> list[str]:
    """What must never be seen: the canaries' unique cores (inside any escaped form) and the
    stable middles of their base64, hex and percent forms, computed here independently."""
    raw = CANARY.encode()
    return [CORE, IDLE_CORE, base64.b64encode(raw).decode()[4:-4], base64.b64encode(b"xy" + raw).decode()[8:-4],
            raw.hex()[8:], urllib.parse.quote(CANARY, safe="")[8:]]


def _leaks(where: str, text: str) -> list[str]:
    return [f"{where}: ...{needle[:12]}..." for needle in _forbidden() if needle in text]


@pytest.fixture
def canary_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEPLOY_VAR, CANARY)
    monkeypatch.setenv(IDLE_VAR, IDLE)


async def test_no_laundering_attempt_shows_the_canary_anywhere(tmp_path: Path, canary_env: None) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    config = {
        "state_dir": str(state),
        "secrets": {"deploy": DEPLOY_VAR, "idle": IDLE_VAR},
        "plugins": {"bash": {"secrets": {"DEPLOY": "deploy"}},
                    "audit": {"otel": True, "record_output": True}},
    }
    results: list[tuple[str, ToolResult]] = []
    async with ToolHost(config=config, plugins=[ToolsPlugin(*FUNCTION_TOOLS), AuditPlugin(tracer_provider=provider)],
                        builtins=["filesystem", "bash"], entry_points=False, working_dir=work,
                        discover=False) as host:
        for command in BASH_ATTEMPTS:
            results.append((command, await host.call("bash", {"command": command})))
        for name, arguments in FS_ATTEMPTS:
            results.append((f"{name} {arguments}", await host.call(name, arguments)))
        for function in FUNCTION_TOOLS:
            results.append((function.spec.name, await host.call(function.spec.name, {})))
        log = Path(host.capabilities["audit.path"])
    assert len(results) >= 20
    # The attempts really carried the secret (else this test proves nothing): the files hold it.
    assert CANARY in (work / "plain.txt").read_text() and any(CORE in p.name for p in work.iterdir())
    assert any(PLACEHOLDER in repr(r) for _, r in results)
    leaks: list[str] = []
    for where, result in results:
        leaks += _leaks(where, repr((result.output, result.error, result.metadata)))
        leaks += _leaks(f"{where} (serialized)", result.get_serialized_output(max_chars=None))
    audit = log.read_bytes()
    assert audit.count(b'"kind":"call"') == len(results)
    leaks += _leaks("the audit log", audit.decode("utf-8"))
    spans = exporter.get_finished_spans()
    assert len(spans) == len(results)
    leaks += _leaks("the spans", repr([(s.name, dict(s.attributes or {}), s.status.description) for s in spans]))
    assert leaks == [], "forms of the canary leaked through:\n" + "\n".join(leaks)


async def test_a_secret_a_plugin_registers_is_redacted_from_every_other_tool(tmp_path: Path) -> None:
    token = f"plugin-token-{uuid.uuid4().hex}"

    @tool(name="echo", effect="Pure")
    def echo(text: str) -> str:
        """Echo."""
        return text

    async with ToolHost(plugins=[ToolsPlugin(echo)], builtins=False, entry_points=False, discover=False,
                        **_places(tmp_path)) as host:
        host.capabilities["session.secrets"].add(token)  # what an MCP client does with a header it resolved
        result = await host.call("echo", {"text": f"a {token} b"})
    assert result.output == f"a {PLACEHOLDER} b"


async def test_a_callers_own_secret_mapping_is_redacted_from_a_tool_that_never_asked(tmp_path: Path) -> None:
    token = f"caller-token-{uuid.uuid4().hex}"

    @tool(name="uses", effect="Pure", security={"secret_refs": ["api"]})
    def uses(context: ToolContext) -> str:
        """Resolves its secret and hides it in a file-like place (a module global)."""
        STASH.append(context.secret("api"))
        return "done"

    @tool(name="reads", effect="Pure")
    def reads() -> str:
        """Returns what the other tool stashed."""
        return STASH[-1]

    async with ToolHost(plugins=[ToolsPlugin(uses, reads)], builtins=False, entry_points=False, discover=False,
                        **_places(tmp_path)) as host:
        ctx = ToolContext(secrets=lambda name: token if name == "api" else None)
        assert (await host.call("uses", {}, context=ctx)).success
        leaked = await host.call("reads", {})
    assert leaked.output == PLACEHOLDER


STASH: list[str] = []


def _places(tmp_path: Path) -> dict[str, Any]:
    """A working directory and a state directory beside it (never inside it)."""
    (tmp_path / "w").mkdir(exist_ok=True)
    return {"working_dir": tmp_path / "w", "config": {"state_dir": str(tmp_path / "state")}}


async def test_config_file_substitutions_are_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"subst-{uuid.uuid4().hex}"
    monkeypatch.setenv("AMP_TEST_SUBST", token)
    config = tmp_path / "amplifier-tools.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[context]\nrole = "${{AMP_TEST_SUBST}}"\n')

    @tool(name="env_reader", effect="Pure")
    def env_reader() -> str:
        """Reads the environment."""
        return os.environ["AMP_TEST_SUBST"]

    (tmp_path / "w").mkdir()
    async with ToolHost(config=config, plugins=[ToolsPlugin(env_reader)], builtins=False, entry_points=False,
                        working_dir=tmp_path / "w") as host:
        result = await host.call("env_reader", {})
    assert result.output == PLACEHOLDER


def test_redaction_rule_keys_match_case_insensitively() -> None:
    arguments = {"Password": "hunter22", "nested": {"API_KEY": "k-123456"}, "other": "kept"}
    out = redact({"arguments": arguments}, paths=["arguments/password", "arguments/nested/api_key"], patterns=False)
    assert out == {"arguments": {"Password": PLACEHOLDER, "nested": {"API_KEY": PLACEHOLDER}, "other": "kept"}}


def test_the_matcher_is_compiled_once_per_change_of_the_secret_set() -> None:
    secrets = SecretSet(["first-secret"])
    first = secrets.matcher
    assert secrets.matcher is first
    secrets.add("first-secret")  # already known: no change
    assert secrets.matcher is first
    secrets.add("second-secret")
    assert secrets.matcher is not first and secrets.matcher is secrets.matcher
    secrets.add("abc")  # too short to search for: ignored
    assert len(secrets) == 2


async def test_a_numeric_secret_returned_as_a_json_number_is_redacted(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: the walk rewrote strings only, so a PIN or account number returned as a
    number passed through every tool (and on into the audit log and spans)."""
    secret = "918273645546372819"
    monkeypatch.setenv("AMP_TEST_NUMERIC_SECRET", secret)

    @tool(name="account", effect="Pure")
    def account() -> dict[str, Any]:
        """Return the account number as a number."""
        return {"number": int(os.environ["AMP_TEST_NUMERIC_SECRET"]), "other": 42}

    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"acct": "AMP_TEST_NUMERIC_SECRET"},
              "plugins": {"audit": {"record_output": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(account)], builtins=["audit"], entry_points=False,
                        discover=False, **places) as host:
        result = await host.call("account", {})
        log = Path(host.capabilities["audit.path"])
    assert result.output == {"number": PLACEHOLDER, "other": 42}
    assert secret not in log.read_text()


async def test_a_secret_in_a_tools_version_stays_out_of_the_audit_log_and_spans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by attack: an imported server's version string (SemVer build metadata may hold any
    text) went into the record's tool_version and the span attributes unredacted."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    secret = "Zq7ucanary9Kx2Tok"
    monkeypatch.setenv("AMP_TEST_VERSION_SECRET", secret)

    class Versioned:
        name, description = "versioned", "A tool whose version carries a secret."
        version = f"1.0.0+{secret}"
        input_schema = {"type": "object"}

        async def execute(self, input: dict[str, Any]) -> ToolResult:
            return ToolResult(output="ok")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    places = _places(tmp_path)
    config = {**places.pop("config"), "secrets": {"v": "AMP_TEST_VERSION_SECRET"}, "plugins": {"audit": {"otel": True}}}
    async with ToolHost(config=config, plugins=[ToolsPlugin(Versioned()), AuditPlugin(tracer_provider=provider)],
                        builtins=False, entry_points=False, discover=False, **places) as host:
        assert (await host.call("versioned", {})).success
        log = Path(host.capabilities["audit.path"])
    assert secret not in log.read_text()
    assert '"tool_version":"1.0.0+[REDACTED]"' in log.read_text()
    spans = exporter.get_finished_spans()
    assert spans and secret not in repr([dict(s.attributes or {}) for s in spans])


async def test_a_secret_a_plugin_quotes_in_its_decision_is_redacted_from_a_plain_results_trail(
        tmp_path: Path) -> None:
    """A result with nothing of its own to scrub (string output, no metadata, no error) still has
    its trail scrubbed: a plugin's decision reason is the part left to scan."""
    token = f"decision-token-{uuid.uuid4().hex}"

    @tool(name="echo", effect="Pure")
    def echo(text: str) -> str:
        """Echo."""
        return text

    class Quoting:
        @hookimpl
        def tool_pre(self, call: Any, spec: Any, context: ToolContext) -> None:
            context.record("quoting", "tool_pre", "note", f"saw {token}", seen=token)

    async with ToolHost(plugins=[ToolsPlugin(echo), Quoting()], builtins=False, entry_points=False,
                        discover=False, **_places(tmp_path)) as host:
        host.capabilities["session.secrets"].add(token)
        result = await host.call("echo", {"text": "plain"})
    assert result.output == "plain"
    assert token not in json.dumps(result.metadata)
    assert result.metadata["trail"][0]["reason"] == f"saw {PLACEHOLDER}"
    assert isinstance(result.metadata["duration_ms"], float)


def _printed(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


def test_an_exception_chain_is_printed_without_a_secret_anywhere_in_it() -> None:
    """Cause, context and exception-group members, to any depth; an exception with nothing to hide
    is the same object."""
    from amplifier_tools.redaction import RedactedError, chain_without_secrets

    token = f"chain-token-{uuid.uuid4().hex}"
    secrets = SecretSet()
    secrets.add(token)
    try:
        try:
            raise ValueError(f"Illegal header value b'Bearer {token}\\r'")
        except ValueError as inner:
            group = ExceptionGroup("unhandled errors in a TaskGroup", [inner, KeyError("clean")])
            raise RuntimeError("the connection failed") from group
    except RuntimeError as outer:
        caught = outer
    assert token in _printed(caught)
    clean = chain_without_secrets(caught, secrets)
    assert clean is not None and token not in _printed(clean)
    assert "ValueError: Illegal header value b'Bearer [REDACTED]\\r'" in _printed(clean)
    assert isinstance(clean.__cause__, ExceptionGroup)
    assert isinstance(clean.__cause__.exceptions[0], RedactedError)
    assert clean.__cause__.exceptions[1] is caught.__cause__.exceptions[1]  # type: ignore[union-attr]
    plain = RuntimeError("nothing secret")
    assert chain_without_secrets(plain, secrets) is plain


async def _start_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, plugin: Any) -> BaseException:
    """What starting a host with ``plugin`` raises, the host's ``[secrets] upstream`` holding ``token``."""
    from amplifier_tools import ConfigError, PluginLoadError

    monkeypatch.setenv("AMP_TEST_START_TOKEN", token)
    places = _places(tmp_path)
    with pytest.raises((ConfigError, PluginLoadError)) as failed:
        async with ToolHost(config={"secrets": {"upstream": "AMP_TEST_START_TOKEN"}, **places["config"]},
                            plugins=[plugin], builtins=False, entry_points=False, discover=False,
                            working_dir=places["working_dir"]):
            pass
    return failed.value


def _reachable_texts(exc: BaseException | None, seen: set[int] | None = None) -> list[str]:
    """The text of every exception an error reporter walking ``__cause__``, ``__context__`` (shown
    or not) and group members reaches from ``exc``."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return []
    seen.add(id(exc))
    texts = [str(exc), repr(exc.args)]
    for linked in (exc.__cause__, exc.__context__, *getattr(exc, "exceptions", ())):
        texts += _reachable_texts(linked, seen)
    return texts


async def test_a_start_error_printed_with_its_traceback_holds_no_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-v`` printed the HTTP library's 'Illegal header value b'Bearer <token>\\r'' from the cause
    chain of a redacted PluginLoadError."""
    token = f"start-token-{uuid.uuid4().hex}"

    class Connects:
        @hookimpl
        def mount(self, coordinator: Any) -> None:
            value = coordinator.get_capability("session.secret")("upstream")
            try:
                raise ValueError(f"Illegal header value b'Bearer {value}\\r'")
            except ValueError as exc:
                raise ConnectionError(f"could not connect ({exc})") from exc

    failed = await _start_error(tmp_path, monkeypatch, token, Connects())
    assert token not in _printed(failed) and "[REDACTED]" in _printed(failed)
    assert not [text for text in _reachable_texts(failed) if token in text]  # nor in a hidden __context__


async def test_a_start_error_whose_secret_is_only_in_its_implicit_context_is_cleaned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin raising a ConfigError while handling an exception that quoted a secret (no ``from``)."""
    from amplifier_tools import ConfigError

    token = f"context-token-{uuid.uuid4().hex}"

    class Parses:
        @hookimpl
        def mount(self, coordinator: Any) -> None:
            value = coordinator.get_capability("session.secret")("upstream")
            try:
                int(value)
            except ValueError:
                raise ConfigError("the upstream setting is not a number", key="plugins.parses.upstream")  # noqa: B904

    failed = await _start_error(tmp_path, monkeypatch, token, Parses())
    assert token not in _printed(failed)
    assert not [text for text in _reachable_texts(failed) if token in text]
