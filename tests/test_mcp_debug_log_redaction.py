"""The MCP SDK's DEBUG log lines carry whole JSON-RPC messages (tool arguments and results, the
events a served host sends): while a host imports or serves MCP, every record of the SDK's
loggers is redacted of the host's secrets and of credential shapes before a handler sees it,
as the host redacts its results, errors and audit records."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2
import pydantic
from mcp_helpers import served_http as served

from amplifier_tools import ToolHost
from amplifier_tools.mcp.sdk_logs import SdkLogRedaction, redact_sdk_logs
from amplifier_tools.redaction import PLACEHOLDER, SecretSet

SECRET = "s3cr3t-value-0123456789abcdef"
OTHER = "other-host-secret-9876543210"
ALICE = "alice-token-0123456789abcdef"
API_KEY = "sk-abcdefghijklmnopqrstuvwxyz0123"  # a credential shape no host registered
SDK_CLIENT = "mcp.client.streamable_http"


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record at DEBUG, as a user who ran ``logging.basicConfig(level=logging.DEBUG)`` gets them."""
    with caplog.at_level(logging.DEBUG):
        yield caplog


def written(record: logging.LogRecord) -> str:
    """What a handler may write of ``record``: its formatted line (with the exception) and its extra fields."""
    extras = {k: v for k, v in vars(record).items() if k not in vars(logging.makeLogRecord({}))}
    return logging.Formatter("%(message)s").format(record) + repr(extras)


def leaked(caplog: pytest.LogCaptureFixture, *values: str) -> list[str]:
    return [f"{r.name}: {written(r)[:200]}" for r in caplog.records if any(v in written(r) for v in values)]


def served_config(tmp_path: Path, content: str) -> dict[str, Any]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "hello.txt").write_text(content)
    return {"working_dir": str(root), "state_dir": str(tmp_path / "state"),
            "secrets": {"alice_token": "TEST_ALICE_TOKEN", "served": "TEST_SERVED_SECRET"},
            "plugins": {"mcp": {"serve": {"transport": "streamable-http", "port": 0, "tools": ["local::fs.read_file"],
                                          "clients": [{"token_ref": "alice_token", "principal": "alice"}]}}}}


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ALICE_TOKEN", ALICE)
    monkeypatch.setenv("TEST_SERVED_SECRET", SECRET)
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")


async def test_an_imported_http_servers_messages_are_redacted_in_the_sdks_debug_log(
        tmp_path: Path, debug_log: pytest.LogCaptureFixture) -> None:
    """Found: at DEBUG ``mcp.client.streamable_http`` logged "Sending client message" and "SSE
    message" whole: a secret of the host passed in an argument or returned by the server, and
    a credential-shaped argument, were in the log as they were."""
    importing = {"secrets": {"inner_auth": "TEST_INNER_AUTH"}, "plugins": {"mcp": {"servers": {"inner": {
        "url": "", "headers": {"Authorization": "inner_auth"}}}}}}
    async with served(served_config(tmp_path, f"hello {OTHER}\n")) as url:
        importing["plugins"]["mcp"]["servers"]["inner"]["url"] = url
        async with ToolHost(config=importing, builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path) as outer:
            outer.capabilities["session.secrets"].add(OTHER)  # a secret the importing host resolved
            read = await outer.call("mcp::inner::fs_read_file", {"path": "hello.txt"})
            assert read.success
            await outer.call("mcp::inner::fs_read_file", {"path": OTHER})
            await outer.call("mcp::inner::fs_read_file", {"path": API_KEY})
    # both hosts closed: the filter is off the SDK's loggers again
    assert not any(isinstance(f, SdkLogRedaction) for f in logging.getLogger(SDK_CLIENT).filters)
    client_lines = [written(r) for r in debug_log.records if r.name == SDK_CLIENT]
    assert any("Sending client message" in line and "tools/call" in line for line in client_lines)  # still logged
    assert any("SSE message" in line and PLACEHOLDER in line for line in client_lines)  # redacted, not dropped
    assert leaked(debug_log, OTHER, ALICE, SECRET, API_KEY) == []


async def test_a_served_hosts_secret_in_what_the_sdk_sends_is_redacted_in_the_debug_log(
        tmp_path: Path, debug_log: pytest.LogCaptureFixture) -> None:
    """Found: serving over HTTP, ``sse_starlette.sse`` (under the SDK's server) logs each event it
    sends at DEBUG; the SDK's "Method not found" error echoes the method a client named, so a
    client's request holding one of the served host's secrets put it in the server's log."""
    accept = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {ALICE}"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with served(served_config(tmp_path, "hello\n")) as url, httpx2.AsyncClient() as http:
        opened = await http.post(url, json=init, headers=accept)
        session = {**accept, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        answer = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": SECRET, "params": {}}, headers=session)
        assert SECRET in answer.text  # the SDK's answer to the client (its own request) names the method
    assert any(r.name == "sse_starlette.sse" and PLACEHOLDER in r.getMessage() for r in debug_log.records)
    assert leaked(debug_log, SECRET, ALICE) == []


def test_several_hosts_each_add_their_secrets_until_each_takes_them_back(debug_log: pytest.LogCaptureFixture
                                                                        ) -> None:
    """Loggers are process-wide and a record names no host: while two hosts use MCP a record is
    redacted of both hosts' secrets, of the remaining one's after the first closes, and left
    alone after both have. One host importing and serving registers twice: both must end."""
    sdk = logging.getLogger("mcp.shared.jsonrpc_dispatcher")
    one, two = SecretSet([SECRET]), SecretSet()
    unregister_one = redact_sdk_logs(one)
    importing, serving = redact_sdk_logs(two), redact_sdk_logs(two)
    two.add(OTHER)  # resolved after the mount: read at each record
    sdk.debug("both: %s %s", SECRET, OTHER)
    unregister_one()
    unregister_one()  # a second call takes nothing back
    sdk.debug("one left: %s %s", SECRET, OTHER)
    importing()
    sdk.debug("still serving: %s", OTHER)
    serving()
    sdk.debug("none left: %s", OTHER)
    assert [r.getMessage() for r in debug_log.records if r.name == sdk.name] == [
        f"both: {PLACEHOLDER} {PLACEHOLDER}", f"one left: {SECRET} {PLACEHOLDER}", f"still serving: {PLACEHOLDER}",
        f"none left: {OTHER}"]
    assert not any(isinstance(f, SdkLogRedaction) for f in sdk.filters)


class Message(pydantic.BaseModel):
    method: str
    params: dict[str, Any]


def test_a_records_arguments_exception_and_extra_fields_are_redacted(debug_log: pytest.LogCaptureFixture) -> None:
    """Arguments are formatted lazily (a dict or a pydantic model's text holds the secret only
    once formatted); an exception's message and an ``extra=`` field are written by handlers too."""
    sdk = logging.getLogger("mcp.server.streamable_http")
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        sdk.debug("model: %s", Message(method="tools/call", params={"token": SECRET}))
        sdk.debug("mapping: %(token)s", {"token": SECRET})
        sdk.debug("shape: %r", {"Authorization": f"Bearer {API_KEY}"})
        try:
            raise ValueError(f"input_value={SECRET!r}")
        except ValueError:
            sdk.exception("parse failed")
        sdk.debug("with extra", extra={"body": {"arguments": {"key": SECRET}}})
        sdk.debug("bad template %d", SECRET)
    finally:
        remove()
    mine = [r for r in debug_log.records if r.name == sdk.name]
    assert len(mine) == 6  # none dropped
    assert leaked(debug_log, SECRET, API_KEY) == []
    assert "ValueError" in written(mine[3]) and PLACEHOLDER in written(mine[3])
    assert mine[4].body == {"arguments": {"key": PLACEHOLDER}}


class Hostile:
    def __str__(self) -> str:
        raise RuntimeError(SECRET)

    __repr__ = __str__


def test_a_record_that_cannot_be_formatted_is_kept_without_raising_into_the_sdk(
        debug_log: pytest.LogCaptureFixture) -> None:
    """A filter that raises raises into the SDK's own code (its ``logger.debug`` call): an argument
    whose text cannot be had ends in a record saying so, the SDK's call returning normally."""
    sdk = logging.getLogger("mcp.client.streamable_http")
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        sdk.debug("SSE message: %s", Hostile())
    finally:
        remove()
    record = next(r for r in debug_log.records if r.name == sdk.name)
    assert record.getMessage() == "(a log record that could not be redacted, not shown: RuntimeError)"


def test_a_record_with_nothing_to_redact_keeps_its_template_and_arguments(debug_log: pytest.LogCaptureFixture
                                                                          ) -> None:
    """Handlers that group by template (structured logging) see what the SDK logged."""
    sdk = logging.getLogger("mcp.client.streamable_http")
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        sdk.debug("Received %s for request %r", "202 Accepted", 7)
    finally:
        remove()
    record = next(r for r in debug_log.records if r.name == sdk.name)
    assert (record.msg, record.args) == ("Received %s for request %r", ("202 Accepted", 7))


def test_with_debug_off_the_sdks_debug_lines_never_reach_the_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost when DEBUG is off: the logger makes no record, so the filter does no work."""
    calls: list[str] = []
    original = SdkLogRedaction.filter

    def counting(self: SdkLogRedaction, record: logging.LogRecord) -> bool:
        calls.append(record.getMessage())
        return original(self, record)

    monkeypatch.setattr(SdkLogRedaction, "filter", counting)
    sdk = logging.getLogger(SDK_CLIENT)
    monkeypatch.setattr(sdk, "level", logging.INFO)
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        for _ in range(100):
            sdk.debug("SSE message: %s", SECRET)
    finally:
        remove()
    assert calls == []


def test_the_sdk_loggers_are_guarded_from_registration_even_before_the_sdk_creates_them() -> None:
    """``mcp.client.streamable_http`` is imported at a ``url`` server's first connection, after the
    mount: its logger is guarded already. An unknown SDK logger that appears later is guarded from
    the next registration on (docs/mcp.md)."""
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        assert any(isinstance(f, SdkLogRedaction) for f in logging.getLogger(SDK_CLIENT).filters)
        later = logging.getLogger(f"mcp.created_later_{os.getpid()}")
        assert not any(isinstance(f, SdkLogRedaction) for f in later.filters)
        again = redact_sdk_logs(SecretSet([OTHER]))
        assert any(isinstance(f, SdkLogRedaction) for f in later.filters)
        again()
    finally:
        remove()
    assert not any(isinstance(f, SdkLogRedaction) for f in later.filters)


async def test_a_server_that_fails_to_start_takes_its_registration_back(tmp_path: Path) -> None:
    """The filter must not stay on the loggers (holding the host's secrets) for a start that failed."""
    missing = {"command": str(tmp_path / "no-such-server"), "required": False}
    async with ToolHost(config={"plugins": {"mcp": {"servers": {"gone": missing}}}}, builtins=["mcp"],
                        entry_points=False, discover=False, working_dir=tmp_path) as host:
        assert [s.name for s in host.specs] == []
        assert not any(isinstance(f, SdkLogRedaction) for f in logging.getLogger(SDK_CLIENT).filters)


async def test_serving_on_stdio_redacts_the_sdks_records_while_it_serves(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path,
                                                                         debug_log: pytest.LogCaptureFixture) -> None:
    """``serve-mcp`` on stdio: the SDK logs a failing handler's exception (its text may quote what
    the client sent) — redacted while serving, and the filter taken off when serving ends."""
    from amplifier_tools.mcp import server as serving

    sdk = logging.getLogger("mcp.server.lowlevel.server")
    seen: list[bool] = []

    async def serve_stdio(server: Any, max_message_bytes: int) -> None:
        seen.append(any(isinstance(f, SdkLogRedaction) for f in sdk.filters))
        sdk.error("handler failed: %s", SECRET)

    monkeypatch.setattr(serving, "serve_stdio_until_signalled", serve_stdio)
    monkeypatch.setenv("TEST_SERVED_SECRET", SECRET)
    (tmp_path / "root").mkdir()
    config = {"working_dir": str(tmp_path / "root"), "state_dir": str(tmp_path / "state"),
              "secrets": {"served": "TEST_SERVED_SECRET"},
              "plugins": {"mcp": {"serve": {"tools": ["local::fs.read_file"]}}}}
    async with ToolHost(config=config, entry_points=False, discover=False) as host:
        host.capabilities["session.secrets"].add(SECRET)
        await serving.serve(host)
    assert seen == [True]
    assert leaked(debug_log, SECRET) == []
    assert not any(isinstance(f, SdkLogRedaction) for f in sdk.filters)


async def test_a_close_cancelled_twice_still_takes_its_registration_back(tmp_path: Path) -> None:
    """Found by review: ``close`` took the registration back only after its waits; a close cut again
    while it waited for the run it had cancelled (a shutdown cut more than once; on 3.11 the close
    then raises) left the filter on the loggers for good, holding the host's secrets. It is taken
    back once the run has ended, not before: what the run logs while ending is still redacted."""
    import asyncio
    import contextlib

    from amplifier_tools.mcp.client import ServerConnection
    from amplifier_tools.mcp.settings import ServerSettings

    connection = ServerConnection("slow", ServerSettings(command="unused"), str(tmp_path), secrets=SecretSet({SECRET}))
    connection._unredact_logs = redact_sdk_logs(connection.secrets)  # as ``start`` does
    closing = asyncio.Event()

    async def run() -> None:  # a run that takes its time to end once cancelled
        try:
            await asyncio.sleep(30)
        finally:  # its own cleanup, which takes 0.2 s whatever cuts it
            closing.set()
            end = asyncio.get_running_loop().time() + 0.2
            while asyncio.get_running_loop().time() < end:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)

    connection._task = run_task = asyncio.create_task(run())
    await asyncio.sleep(0)
    close = asyncio.create_task(connection.close())
    await asyncio.sleep(0.01)  # waiting for the run to end
    while not close.done():  # cut again and again while it waits for the run (a shutdown cut more than once)
        close.cancel()
        await asyncio.sleep(0.01)
    assert closing.is_set()
    try:
        with contextlib.suppress(asyncio.CancelledError):  # raised on 3.11; later ones' wait_for end it otherwise
            await close
        guarded = any(isinstance(f, SdkLogRedaction) for f in logging.getLogger(SDK_CLIENT).filters)
        assert guarded == (not run_task.done())  # what the run logs while it still ends is redacted
        await asyncio.wait_for(asyncio.gather(run_task, return_exceptions=True), 5)
        await asyncio.sleep(0)  # its done callbacks
        assert not any(isinstance(f, SdkLogRedaction) for f in logging.getLogger(SDK_CLIENT).filters)
    finally:
        if connection._unredact_logs is not None:  # not left on the loggers for the next tests
            connection._unredact_logs()


async def test_a_serve_cut_twice_while_uvicorn_ends_keeps_redacting_until_it_has(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: ``serve_http`` cut again while it waited for uvicorn to shut down took the
    filter off at once; the SDK's records of the shutdown still under way were no longer redacted."""
    import asyncio
    import contextlib

    import uvicorn

    from amplifier_tools.mcp.http import RefusalLogFilter, serve_http
    from amplifier_tools.mcp.server import serve_settings

    async def slow_serve(self: Any, sockets: Any = None) -> None:  # uvicorn that takes 0.3 s to end
        self.started = True
        while not self.should_exit:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        end = asyncio.get_running_loop().time() + 0.3
        while asyncio.get_running_loop().time() < end:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    monkeypatch.setattr(uvicorn.Server, "serve", slow_serve)
    sdk = logging.getLogger("sse_starlette.sse")
    async with ToolHost(config=served_config(tmp_path, "x"), entry_points=False, discover=False) as host:
        ready = asyncio.Event()
        serving = asyncio.create_task(serve_http(host, serve_settings(host), ready=lambda url: ready.set(),
                                                 stop=asyncio.Event()))
        await asyncio.wait_for(ready.wait(), 10)
        serving.cancel()
        await asyncio.sleep(0.05)  # uvicorn is ending
        serving.cancel()  # and the wait for it is cut
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        still_ending = any(isinstance(f, SdkLogRedaction) for f in sdk.filters)
        # The refusal lines' filter (clipped, escaped, rate-limited) stays on as long (found by review)
        refusals = logging.getLogger("mcp.server.streamable_http")
        assert any(isinstance(f, RefusalLogFilter) for f in refusals.filters) == still_ending
        deadline = asyncio.get_running_loop().time() + 5
        while any(isinstance(f, SdkLogRedaction) for f in sdk.filters):
            assert asyncio.get_running_loop().time() < deadline, "the filter was never taken off"
            await asyncio.sleep(0.02)
    assert still_ending  # taken off only when uvicorn had ended
    assert not any(isinstance(f, RefusalLogFilter) for f in logging.getLogger("mcp.server.streamable_http").filters)


def test_a_record_whose_template_cuts_a_secret_keeps_no_argument_holding_it(
        debug_log: pytest.LogCaptureFixture) -> None:
    """Found by review: only a changed message dropped the arguments; a template that shows part of
    one (``%.5s``) kept the whole secret in ``record.args``, which a handler may send on by itself."""
    sdk = logging.getLogger("mcp.shared.session")
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        sdk.debug("head: %.5s", SECRET)
    finally:
        remove()
    record = next(r for r in debug_log.records if r.name == sdk.name and r.getMessage().startswith("head"))
    assert SECRET not in repr(record.args) and SECRET not in record.getMessage()


def test_an_argument_whose_str_holds_a_secret_its_repr_does_not_is_not_kept(
        debug_log: pytest.LogCaptureFixture) -> None:
    """Found by review: the arguments were judged by their ``repr`` alone; an object whose ``str``
    shows a secret (what the template formats) and whose ``repr`` does not kept it in
    ``record.args`` when the template cut it."""
    class Token:
        def __str__(self) -> str:
            return SECRET

    sdk = logging.getLogger("mcp.shared.session")
    remove = redact_sdk_logs(SecretSet([SECRET]))
    try:
        sdk.debug("token: %.5s", Token())
    finally:
        remove()
    record = next(r for r in debug_log.records if r.name == sdk.name and r.getMessage().startswith("token"))
    assert record.args == () and SECRET not in record.getMessage()
