"""Importing an MCP server's tools: one ``ServerConnection`` per configured server,
one ``McpTool`` per tool it lists, mounted as ``mcp::<server>::<tool>``.

A connection runs in its own task for the host's lifetime (the SDK's session
and the transport must be entered and left in one task); calls from any task
send requests through it. A server that dies fails the call in flight with an
``ExecutionError`` and is restarted on the next call, at most
``max_restarts`` times; a restarted server must list the same definitions
(same hashes) and report the same version as at start, or its calls are refused. The SDK is imported
here, so this module is only imported once servers are configured.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from ..errors import missing_extra

try:
    import anyio
    import httpx2
    import mcp_types
    import pydantic
    from mcp.client.session import ClientSession
    from mcp.shared.dispatcher import ProgressFnT, as_request_id, coerce_request_id
    from mcp.shared.exceptions import MCPError
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise missing_extra("mcp", exc, "amplifier_tools.mcp.client") from exc

from .._version import __version__
from ..content import render
from ..errors import ConfigError, ContractError, ExecutionError, PolicyError, ToolError
from ..models import ToolContext, ToolResult, output_text
from ..redaction import SecretSet, redact_text
from ..spec import ToolSpec
from ..timeouts import TimeLimitExceeded, run_with_timeout
from .cancels import LetGoCancels
from .confinement import sandbox_wrap, server_cwd
from .contract import build_spec
from .patterns import compile_pattern, unsupported_patterns
from .pinning import check_pins, definition_hash
from .sdk_logs import redact_sdk_logs
from .settings import ServerSettings
from .transport import (
    MALFORMED,
    MALFORMED_MARK,
    MAX_UNANSWERED_REQUESTS,
    TOO_MANY_BLOCKS,
    TOO_MANY_BLOCKS_MARK,
    StderrTail,
    StdioServer,
    Wrap,
    stdio_process,
)

log = logging.getLogger("amplifier_tools.mcp")

#: The request header that names a Streamable HTTP session (lower case, as httpx2 matches any case).
MCP_SESSION_HEADER: Final = "mcp-session-id"
#: How the SDK's Streamable HTTP client begins the error it puts in place of a body that is no
#: JSON-RPC (the rest of its text is pydantic's, quoting the body).
_SDK_PARSE_FAILURES: Final = ("Failed to parse JSON response:", "Failed to parse SSE message:")
#: The SDK's Streamable HTTP client logger (``BodyQuoteFilter`` is put on it).
SDK_HTTP_CLIENT_LOGGER: Final = "mcp.client.streamable_http"
#: Seconds a ``url`` server gets to answer the DELETE that ends its session when the connection closes.
SESSION_END_TIMEOUT_S: Final = 2.0
#: Seconds a ``url`` server gets to answer a POST that carries no request (a notification, such as
#: a call's ``notifications/cancelled``, or a response): the spec has it answered at once (202), and
#: the SDK writes a session's messages one after another, each waiting for its POST's answer.
NOTIFICATION_READ_TIMEOUT_S: Final = 5.0
#: Bodies larger than this are never taken for a notification (ours are a few hundred bytes).
_NOTIFICATION_MAX_BYTES: Final = 4096
#: Seconds ``close`` waits for a run to end beyond a stdio server's two graces (``stop_grace_ms``
#: after its stdin closes, then after SIGTERM): the SIGKILL, the wait for the kernel to remove the
#: tree, the last words on its stderr, a ``url`` server's session end. Past that the stop is
#: cancelled, which SIGKILLs what is left at once.
CLOSE_MARGIN_S: Final = 8.0
CLIENT_INFO: Final = mcp_types.Implementation(name="amplifier-tools", version=__version__)
#: Host variables every server gets unless ``env`` sets them: where programs are and how text is
#: encoded, nothing secret. ``HOME`` is not among them (it leads to credentials).
BASIC_ENV: Final = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


T = TypeVar("T")

class ServerConnection:
    """A live session with one MCP server (a stdio process, or a Streamable HTTP connection),
    restarted (reconnected) on demand after it dies."""

    def __init__(self, name: str, settings: ServerSettings, working_dir: str,
                 protected: Callable[[], Iterable[str]] = tuple, headers: Mapping[str, str] | None = None,
                 secrets: Collection[str] | SecretSet = (), writable: Callable[[], Iterable[str]] = tuple) -> None:
        #: The server's name: its key in ``[plugins.mcp.servers]``.
        self.name = name
        #: The host-wide secrets (``session.secrets``), redacted from what the server says in a start error.
        self.secrets = secrets
        self.settings = settings
        #: The HTTP headers sent to a ``url`` server, their values resolved from ``[secrets]``.
        self.headers = dict(headers or {})
        #: The last HTTP error status a ``url`` server answered, and the URL (None: none yet).
        self.http_refusal: tuple[int, str] | None = None
        #: Set when a ``url`` server answered HTTP 404 to a request naming its session: it no longer
        #: knows the session (expired, or the server restarted), and a new one must be opened.
        self.session_lost = False
        #: Whether a call succeeded in the current session: only such a session can have expired.
        self.session_served = False
        self.working_dir = working_dir
        #: The host's protected paths as they are now (masked in a sandboxed server's view).
        self.protected = protected
        #: Every path the host's tools and sandboxed processes may write, as it is now (no ``bwrap`` there is run).
        self.writable = writable
        self._wrap: Wrap | None = None
        #: Takes this connection's ``redact_sdk_logs`` registration back (None: not registered).
        self._unredact_logs: Callable[[], None] | None = None
        #: The run the last ``close`` took to end (another ``close`` meanwhile waits for its end).
        self._ending: asyncio.Task[None] | None = None
        #: The last lines the stdio server of the latest run wrote to stderr (None: not started).
        self.stderr: StderrTail | None = None
        self.pid: int | None = None
        self.server_info: mcp_types.Implementation | None = None
        self.definitions: dict[str, dict[str, Any]] = {}
        self.hashes: dict[str, str] = {}
        self.restarts = 0
        self._session: ClientSession | None = None
        self._process: Any = None
        self._server: StdioServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._mounted_hashes: dict[str, str] | None = None
        #: ``serverInfo.version`` when the tools were mounted (their contracts and audit records name it).
        self._mounted_version: str | None = None
        #: Where the server's notifications go as host events (``coordinator.hooks.emit``; set by
        #: the plugin): ``tool:progress`` for a call's progress, ``mcp:message`` for its log messages.
        self.emit: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None

    # -- lifecycle ---------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """The child's whole environment, an allowlist: the non-secret basics
        (``BASIC_ENV``: ``PATH`` — ``os.defpath`` when the host has none — and the locale and
        time zone) and the ``env_passthrough`` names copied from ours, then ``env``."""
        names = (*BASIC_ENV, *self.settings.env_passthrough)
        env = {name: os.environ[name] for name in names if name in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(self.settings.env)
        return env

    async def start(self) -> None:
        """Start the server, initialize the session and list its tools (all pages)."""
        # Before anything starts: a sandbox that cannot be had fails the start (never runs unconfined).
        self._wrap = await sandbox_wrap(self.name, self.settings, self.working_dir, self.protected(),
                                        tuple(self.writable()))
        if self._unredact_logs is None:  # before the SDK can log a message; taken back by close (below too)
            if self.settings.url is not None:
                guard_sdk_client_log()  # first on its logger: it reads the exception redaction would replace
            self._unredact_logs = redact_sdk_logs(self.secrets)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(ready, self._stop), name=f"mcp-server-{self.name}")
        try:
            await run_with_timeout(asyncio.shield(ready), self.settings.startup_timeout_ms / 1000.0)
        except BaseException as exc:
            if not ready.done() and self._task is not None:  # still starting: stop it now (close() would
                self._task.cancel()                             # wait its whole bound for the start to end)
            try:
                await self.close()
            finally:  # also when the close is cut (found by review: cancelled twice, the start's failure
                # was never retrieved, and asyncio logged "Future exception was never retrieved")
                if ready.done() and not ready.cancelled():
                    ready.exception()  # retrieved: the start's own failure is what is raised below
            if isinstance(exc, TimeLimitExceeded):
                raise ExecutionError(
                    f"MCP server {self.name!r} did not start within "
                    f"{self.settings.startup_timeout_ms:g} ms", code="mcp_start_timeout") from None
            raise

    @contextlib.asynccontextmanager
    async def _streams(self) -> AsyncIterator[tuple[Any, Any]]:
        """The message streams of one run: a started stdio process, or an HTTP connection."""
        s = self.settings
        self._server = self._process = self.stderr = None  # a previous run's state must not describe this one
        if s.url is not None:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            async def note(response: httpx2.Response) -> None:  # the SDK reports a refusal without its status
                if response.status_code >= 400:
                    self.http_refusal = (response.status_code, str(response.request.url))
                # a POST only: a server may answer the optional GET stream 404 for "not offered here"
                if response.status_code == 404 and response.request.method == "POST" \
                        and MCP_SESSION_HEADER in response.request.headers:
                    self.session_lost = True
                bound_body(response, s.max_message_bytes)

            async def bound(request: httpx2.Request) -> None:
                # Each bound is on the whole answer (``WholeAnswerTimeout``), not only on each
                # network read: found by attack, a server trickling a header line every 0.7 s held a
                # cancellation's POST (and so the session's writer) for good, and the DELETE until
                # ``close_bound()``.
                if request.method == "DELETE":  # the session's end, sent as the connection closes
                    request.extensions["timeout"] = httpx2.Timeout(SESSION_END_TIMEOUT_S).as_dict()
                    request.extensions[WHOLE_ANSWER_TIMEOUT] = SESSION_END_TIMEOUT_S
                # ``aread``, not ``content``: a redirect's re-sent request has its body as a stream not
                # yet read, and ``content`` raised (found by test: a redirect loop's typed error became
                # ``mcp_server_died``); the SDK's bodies are bytes in memory, read again at no cost.
                elif request.method == "POST" and carries_no_request(await request.aread()):
                    request.extensions["timeout"] = httpx2.Timeout(NOTIFICATION_READ_TIMEOUT_S).as_dict()
                    request.extensions[WHOLE_ANSWER_TIMEOUT] = NOTIFICATION_READ_TIMEOUT_S

            self.http_refusal = None
            self.session_lost = self.session_served = False
            guard_sdk_client_log()
            # No read timeout: every request is bounded by the host (a call by its deadline, the
            # start by startup_timeout_ms); httpx's default 5 s failed every call that took longer.
            # The DELETE that ends the session is bounded here: nothing else bounds it, and a server
            # that never answered it held the host's close 10 s (found by attack). So is a POST with
            # no request in it: a server that never answered a call's ``notifications/cancelled``
            # held the session's writer for good, every later call ending at its deadline (found by
            # attack); past the bound the SDK's writer fails, the session ends, the next call
            # starts a new one.
            # Uncompressed bodies asked for: a body's limit is on the bytes that come (bound_body).
            client = create_mcp_http_client(headers={"Accept-Encoding": "identity", **self.headers},
                                            timeout=httpx2.Timeout(30.0, read=None))
            client.event_hooks["request"] = [bound]
            whole_answer_timeouts(client)
            client.event_hooks["response"] = [note]
            async with client as http, \
                    streamable_http_client(s.url, http_client=http, max_sse_event_size=s.max_message_bytes) as streams:
                yield streams[0], streams[1]
            return
        assert s.command is not None
        self.stderr = StderrTail(forward=s.stderr == "inherit")
        async with stdio_process(s.command, list(s.args), env=self.environment(),
                                 cwd=server_cwd(s, self.working_dir), stderr=self.stderr,
                                 max_message_bytes=s.max_message_bytes, max_content_blocks=s.max_content_blocks,
                                 wrap=self._wrap, stop_grace=s.stop_grace_ms / 1000.0) as server:
            self._server = server
            self._process = server.process
            self.pid = server.process.pid
            yield server.read, server.write

    async def _run(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        s = self.settings
        try:
            async with self._streams() as (read, write), \
                    ClientSession(read, LetGoCancels(write), client_info=CLIENT_INFO, logging_callback=self._on_log,
                                  log_level="debug") as session:  # 2026-07-28: logs are opt-in per request
                init = await session.initialize()
                tools: list[mcp_types.Tool] = []
                cursor: str | None = None
                while True:
                    params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools.extend(page.tools)
                    if len(tools) > s.max_tools:  # each costs memory and mount time: stop reading
                        raise ExecutionError(
                            f"MCP server {self.name!r} lists more than {s.max_tools} tools; raise "
                            f"plugins.mcp.servers.{self.name}.max_tools if that is expected",
                            code="mcp_too_many_tools", setting=f"plugins.mcp.servers.{self.name}.max_tools")
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.server_info = init.server_info
                self.definitions = self._definitions(tools)
                self.hashes = {name: definition_hash(d) for name, d in self.definitions.items()}
                self._session = session
                ready.set_result(None)
                await self._until_stopped(stop)
        except BaseException as caught:
            exc = _single(caught)
            too_large = self._too_large()
            if not ready.done() and too_large is not None:
                ready.set_exception(too_large)
            elif not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ExecutionError(
                    f"MCP server {self.name!r} start was cancelled", code="mcp_start_failed"))
            elif not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self._session = None

    async def _until_stopped(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set, or a stdio server's output has ended: then the run ends and the
        process is stopped as at ``close`` (stdin closed, SIGTERM, its grace, SIGKILL). Found by trial:
        a server that closed its stdout and slept on ran until the next call stopped it (that call
        paid the stop), or for the host's lifetime once ``max_restarts`` was reached."""
        ended = self._server.output_ended if self._server is not None else None
        if ended is None:
            await stop.wait()
            return
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(ended.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _definitions(self, tools: Iterable[mcp_types.Tool]) -> dict[str, dict[str, Any]]:
        """The listed tools' definitions by name; a ``ContractError`` (``mcp_duplicate_tool``) naming the
        server and the tool when one name is listed with two different definitions: the host would
        mount (and pin, and show the model) the last one, while which one a call runs is the
        server's choice. The same definition listed twice (pages that overlap) is one tool."""
        definitions: dict[str, dict[str, Any]] = {}
        for tool in tools:
            definition = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
            if definitions.setdefault(tool.name, definition) != definition:
                raise ContractError(
                    f"MCP server {self.name!r} lists tool {tool.name!r} twice, with different definitions "
                    "(a pin and the model would see only one of them)", code="mcp_duplicate_tool",
                    server=self.name, tool=tool.name)
        return definitions

    def close_bound(self) -> float:
        """Seconds ``close`` lets the stop run before it cancels it: twice ``stop_grace_ms`` (the
        wait after the stdin closes, then after SIGTERM) and ``CLOSE_MARGIN_S`` (10 s by default).
        A bound that did not grow with the grace would SIGKILL a server in the grace it was given."""
        return 2 * self.settings.stop_grace_ms / 1000.0 + CLOSE_MARGIN_S

    async def close(self) -> None:
        """Stop the server; its process group is gone when this returns (within ``close_bound()``).
        A close while another one ends the run waits for that end (found by review: it returned at
        once, the server still running, and took the SDK log redaction off under the ending run)."""
        task, self._task = self._task, None
        if task is not None:
            self._ending = task
        ending = self._ending
        if self._stop is not None:
            self._stop.set()
        try:
            if task is not None:
                await self._end_run(task)
            elif ending is not None and not ending.done():
                await asyncio.wait((ending,))  # bounded by the other close's ``close_bound()``
        finally:
            # After the run has ended: what it logged while closing was redacted. A close cut while it
            # waits leaves a run still ending: taken back at that end (found by review: it stayed on
            # the loggers for good, holding the host's secrets).
            unredact, self._unredact_logs = self._unredact_logs, None
            if unredact is not None:
                if ending is None or ending.done():
                    unredact()
                else:
                    ending.add_done_callback(lambda _: unredact())

    async def _end_run(self, task: asyncio.Task[None]) -> None:
        """Wait up to ``close_bound()`` for the run to end (its stop included), then cancel it (what is
        left is SIGKILLed at once). The caller's own cancellation — the deadline of a call that waits
        here for the stop of a crashed run before its restart — cuts the stop the same way and is
        raised (found by review: ``wait_for`` could not tell it from the run's own cancellation and it
        was swallowed: the call restarted the server and succeeded past its deadline)."""
        try:
            done, _ = await asyncio.wait((task,), timeout=self.close_bound())
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return
        failure = None if task.cancelled() else task.exception()
        if failure is not None and not isinstance(failure, Exception):  # KeyboardInterrupt: not the server's
            raise failure
        if failure is not None:
            log.error("MCP server %r failed while closing", self.name, exc_info=failure)

    @property
    def alive(self) -> bool:
        """Whether a call can be sent: a session, and for a stdio server a running process whose
        output has not ended (a server that closed its stdout but runs on can answer nothing)."""
        if self.settings.url is not None:
            return self._session is not None
        return self._session is not None and self._process is not None and self._process.returncode is None \
            and not (self._server is not None and self._server.output_ended.is_set())

    def freeze_definitions(self, mounted: Mapping[str, str]) -> None:
        """Remember the hashes of the mounted tools and the server's version; a restarted server
        must match them. The version is in every mounted contract (its ``version`` and
        ``mcp-server-version:`` tag) and so in every audit record: a server that came back as another
        version had its calls recorded under the version it no longer was (found by attack)."""
        self._mounted_hashes = dict(mounted)
        self._mounted_version = self.server_info.version if self.server_info is not None else None

    async def _ensure(self) -> ClientSession:
        session = self._session
        if session is not None and self.alive and not self._lock.locked():
            # Running and nobody restarting it: what taking the free lock would find, without it.
            return session
        async with self._lock:
            if self.alive and self._session is not None:
                return self._session
            # A url server that forgot its session is not down: a new session is opened, as the
            # protocol asks, and not counted (an SDK server ends a session idle for 30 minutes:
            # counted, an idle host lost the server's tools for good after max_restarts of them).
            # Only a session that served a call can have expired: one forgotten before its first
            # answer is the server's failure, counted (found by review: a server that forgot every
            # session at once was reopened at every call, with no limit).
            expired = self.settings.url is not None and self.session_lost and self.session_served
            if not expired and self.restarts >= self.settings.max_restarts:
                raise ExecutionError(
                    f"MCP server {self.name!r} is down and was restarted "
                    f"{self.restarts} time(s), the configured maximum", code="mcp_server_unavailable")
            # What is left of the old run is stopped first; a restart is counted only once it starts
            # (found by review: a call whose deadline cut that stop counted one, no server started).
            await self.close()
            if expired:
                log.warning("MCP server %r no longer knows this host's session (HTTP 404); opening a new one",
                            self.name)
            else:
                self.restarts += 1
                log.warning("restarting MCP server %r (restart %d)", self.name, self.restarts)
            try:
                await self.start()
            except asyncio.CancelledError:
                # Cut by its call (the caller, the deadline) before a server was had: no restart, and a
                # session the server forgot is still one to reopen uncounted (found by attack: three
                # callers cancelling a slow reconnect used up max_restarts, the healthy server's tools
                # unavailable for the host's lifetime; the new start had cleared what made a 404 free).
                if expired:
                    self.session_lost = self.session_served = True
                else:
                    self.restarts -= 1
                raise
            except ExecutionError:
                raise
            except Exception as exc:
                raise ExecutionError(f"MCP server {self.name!r} could not be restarted: {exc}",
                                     code="mcp_restart_failed") from exc
            version = self.server_info.version if self.server_info else None
            if self.settings.version is not None and version != self.settings.version:
                await self.close()
                self.restarts = self.settings.max_restarts  # do not keep restarting a changed server
                raise ContractError(
                    f"MCP server {self.name!r} reports version {version!r} on restart, pinned "
                    f"{self.settings.version!r} (plugins.mcp.servers.{self.name}.version)", code="pin_mismatch")
            if self._mounted_hashes is not None and version != self._mounted_version:
                await self.close()
                self.restarts = self.settings.max_restarts
                raise ContractError(
                    f"MCP server {self.name!r} reports version {version!r} on restart, its tools were mounted "
                    f"under version {self._mounted_version!r}; restart the host to mount the new version",
                    code="pin_mismatch", server=self.name)
            changed = [name for name, digest in (self._mounted_hashes or {}).items()
                       if self.hashes.get(name) != digest]
            if changed:
                await self.close()
                self.restarts = self.settings.max_restarts  # do not keep restarting a changed server
                name = changed[0]
                raise ContractError(
                    f"MCP server {self.name!r} tool {name!r} definition changed on restart: "
                    f"mounted {(self._mounted_hashes or {})[name]}, server now sends {self.hashes.get(name)}",
                    code="pin_mismatch")
            assert self._session is not None
            return self._session

    # -- notifications -------------------------------------------------------

    async def _on_log(self, params: mcp_types.LoggingMessageNotificationParams) -> None:
        """A ``notifications/message`` from the server, as the host event ``mcp:message``."""
        if self.emit is not None:
            await self.emit("mcp:message", {"server": self.name, "level": params.level, "logger": params.logger,
                                            "data": params.data})

    # -- calls -------------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float | None,
                        progress: ProgressFnT | None = None) -> mcp_types.CallToolResult:
        """Send ``tools/call``; raise a typed ``ToolError`` on transport failure.

        Cancellation (the host's timeout) cancels the request on the server too. ``progress``
        receives the server's ``notifications/progress`` for this call (a progress token is sent
        with the request only then).
        """
        session = await self._ensure()
        request = mcp_types.CallToolRequest(params=mcp_types.CallToolRequestParams(name=name, arguments=arguments))
        # send_request, not call_tool: the output schema is checked by the host's pipeline (a typed
        # ContractError with a pointer), not by the SDK. Run in the call's own task: cancelled (the
        # host's deadline, the caller), the SDK's courtesy ``notifications/cancelled`` is handed to
        # a task of its own by the session's write stream (``cancels.LetGoCancels``), so the call
        # ends at once even when the transport cannot take it (found by attack).
        try:
            result = await session.send_request(request, mcp_types.CallToolResult,
                                                 request_read_timeout_seconds=timeout, progress_callback=progress)
            self.session_served = True
            return result
        except MCPError as exc:
            if _connection_closed(exc) or not self.alive:
                raise self._died(exc) from None
            if self.settings.url is not None and self.session_lost:
                raise self._session_ended() from None
            data = exc.error.data
            if exc.code == TOO_MANY_BLOCKS and isinstance(data, dict) and data.get("reason") == TOO_MANY_BLOCKS_MARK:
                raise self.too_many_blocks(data.get("blocks")) from None
            if exc.code == MALFORMED and isinstance(data, dict) and data.get("reason") == MALFORMED_MARK:
                raise ExecutionError(f"MCP server {self.name!r} sent a malformed tools/call response: "
                                     f"{data.get('problem')}", code="mcp_protocol_error") from None
            if exc.code == mcp_types.REQUEST_TIMEOUT and timeout is not None:  # else it is the server's own error
                raise PolicyError(f"MCP server {self.name!r} did not answer in time",
                                  code="timeout") from None
            if self.settings.url is not None:
                raise self._http_error(exc) from None
            raise ExecutionError(f"MCP server {self.name!r} returned error {exc.code}: {exc.message}",
                                 code="mcp_protocol_error", mcp_code=exc.code) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise self._died(exc) from None
        except ValueError as exc:  # pydantic's ValidationError: a result that is no CallToolResult
            raise ExecutionError(f"MCP server {self.name!r} sent a malformed tools/call result: "
                                 f"{_malformed(exc, self.secrets)}", code="mcp_protocol_error") from None

    def too_many_blocks(self, blocks: Any) -> ExecutionError:
        """The error for a result with more content blocks than ``max_content_blocks``."""
        limit = self.settings.max_content_blocks
        return ExecutionError(
            f"MCP server {self.name!r} sent a result of {blocks} content blocks, more than {limit} "
            f"(plugins.mcp.servers.{self.name}.max_content_blocks)", code="mcp_too_many_content_blocks",
            retryable=False, limit=limit, blocks=blocks, setting=f"plugins.mcp.servers.{self.name}.max_content_blocks")

    def _died(self, exc: BaseException) -> ExecutionError:
        code = self._process.returncode if self._process is not None else None
        self._session = None
        too_large = self._too_large()
        if too_large is not None:
            return too_large
        if self.settings.url is not None:
            return ExecutionError(
                f"the connection to MCP server {self.name!r} ({self.settings.url}) failed during the call: "
                f"{type(exc).__name__}: {str(exc)[:200]}; it is reconnected on the next call", code="mcp_server_died",
                retryable=True)
        if code is None:  # its output ended while it ran on: stopped now (``_until_stopped``)
            return ExecutionError(
                f"MCP server {self.name!r} closed its output during the call but kept running; it is stopped "
                "and restarted on the next call", code="mcp_server_died", retryable=True, exit_status=None)
        return ExecutionError(
            f"MCP server {self.name!r} died during the call (exit status {code}); "
            "it is restarted on the next call", code="mcp_server_died", retryable=True, exit_status=code)

    def _http_error(self, exc: MCPError) -> ExecutionError:
        """The error for an error answer to a call to a ``url`` server (``http_words``): a body past
        ``max_message_bytes`` is ``mcp_message_too_large``, anything else ``mcp_protocol_error``."""
        received = _body_too_large(exc)
        if received is not None:
            return self.body_too_large(received)
        words, status = self.http_words(exc)
        error = ExecutionError(f"MCP server {self.name!r} {words}", code="mcp_protocol_error", mcp_code=exc.code)
        if status is not None:
            error.details["http_status"] = status
        return error

    def http_words(self, exc: MCPError) -> tuple[str, int | None]:
        """What an error answer from a ``url`` server says (``returned error <code>: …``, redacted),
        and the HTTP status it stands for, if any: it may be the SDK's own words for an HTTP answer
        it could not use. Its stand-in for an error status (``Server returned an error response``,
        -32603) names the status and the URL (found by attack: a 401 or 500 mid-call said neither).
        Its word for a body that is no JSON-RPC keeps only its first line: the rest is pydantic's,
        with the body quoted cut (``b'{not json ...ijklmnop'``), and a secret the server echoed,
        cut, is no longer the secret the redaction finds (found by attack)."""
        message, status = exc.message, None
        if exc.code == mcp_types.INTERNAL_ERROR and message == "Server returned an error response" \
                and exc.error.data is None and self.http_refusal is not None:
            status, url = self.http_refusal
            message = f"HTTP {status} from {url}"
        elif exc.code == mcp_types.PARSE_ERROR and message.startswith(_SDK_PARSE_FAILURES):
            message = message.split("\n", 1)[0] + " (the body is not shown)"
        return redact_text(f"returned error {exc.code}: {message}", self.secrets), status

    def body_too_large(self, received: str) -> ExecutionError:
        """The error for a ``url`` server's answer whose body was past ``max_message_bytes``
        (``received``: its bytes read when reading stopped) or compressed (``"compressed"``)."""
        limit = self.settings.max_message_bytes
        setting = f"plugins.mcp.servers.{self.name}.max_message_bytes"
        if received == "compressed":
            return ExecutionError(
                f"MCP server {self.name!r} sent a compressed response body, not asked for (its size is known only "
                f"once decoded; {setting} bounds a body)", code="mcp_message_too_large", retryable=False,
                limit=limit, setting=setting)
        return ExecutionError(
            f"MCP server {self.name!r} sent a response body larger than {limit} bytes ({setting}); reading "
            "stopped", code="mcp_message_too_large", retryable=False, limit=limit,
            received_bytes=int(received) if received.isdigit() else None, setting=setting)

    def _session_ended(self) -> ExecutionError:
        """The error for a call a ``url`` server answered HTTP 404 on its session: the server no
        longer knows the session (it expired, or the server restarted; the SDK's answer was a bare
        ``Session terminated`` or the server's ``Session not found``, the same for every later call,
        found by attack). The call did not run there: retryable; the next call opens a new session."""
        self._session = None
        return ExecutionError(redact_text(
            f"MCP server {self.name!r} ({self.settings.url}) no longer knows this host's session (HTTP 404: "
            "expired, or the server restarted); the call was not run, and a new session is opened on the "
            "next call", self.secrets), code="mcp_server_died", retryable=True, http_status=404)

    def _too_large(self) -> ExecutionError | None:
        """The error for a server stopped for its messages (one past ``max_message_bytes``, or more
        requests of its own than it lets us answer), else None."""
        if self._server is not None and self._server.flooded:
            return ExecutionError(
                f"MCP server {self.name!r} sent more than {MAX_UNANSWERED_REQUESTS} requests without reading our "
                "answers; it was stopped and is restarted on the next call", code="mcp_request_flood",
                retryable=False, limit=MAX_UNANSWERED_REQUESTS)
        oversized = self._server.oversized if self._server is not None else None
        if oversized is None:
            return None
        limit = self.settings.max_message_bytes
        return ExecutionError(
            f"MCP server {self.name!r} sent a message larger than {limit} bytes "
            f"(plugins.mcp.servers.{self.name}.max_message_bytes); it was stopped "
            "and is restarted on the next call", code="mcp_message_too_large", retryable=False,
            limit=limit, received_bytes=oversized)


class McpTool:
    """One imported tool: the contract built from the server's definition, calls sent to it.

    Its schemas came from the server: their regular expressions run on RE2 (``pattern_engine``,
    read by the registry), never on Python's backtracking ``re``.
    """

    pattern_engine = staticmethod(compile_pattern)

    def __init__(self, connection: ServerConnection, remote_name: str, spec: ToolSpec, digest: str) -> None:
        self.connection = connection
        self.remote_name = remote_name
        self.spec = spec
        self.name = spec.name
        self.description = spec.description
        self.definition_hash = digest

    def call_metadata(self) -> dict[str, Any]:
        """``metadata["mcp"]`` of every result of this tool, success or failure: the server, the tool,
        the server's version and the definition hash, so a result can be tied to an exact definition."""
        info = self.connection.server_info
        return {"server": self.connection.name, "tool": self.remote_name,
                "server_version": info.version if info is not None else None,
                "definition_sha256": self.definition_hash}

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolResult:
        emit = self.connection.emit

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            assert emit is not None
            await emit("tool:progress", {"tool_name": self.name, "tool_call_id": context.call_id,
                                         "server": self.connection.name, "progress": progress, "total": total,
                                         "message": message})

        try:
            # No timeout of the SDK's own: the host's deadline (the call's timeout, never later than
            # its context's) already bounds this await, and its cancellation cancels the request on
            # the server. A second timer per call cost 20-40 µs over HTTP (bench_mcp).
            result = await self.connection.call_tool(self.remote_name, input, None,
                                                     progress if emit is not None else None)
            return to_tool_result(result, self)
        except ToolError as error:
            # Returned, not raised: a reported failure keeps its metadata (the host rebuilds the
            # same typed error from it: category, code, retryable and the scalar details).
            payload = {**{k: v for k, v in error.details.items() if _scalar(v)}, "type": error.category,
                       "code": error.code, "message": error.message, "retryable": error.retryable,
                       "cause": error.cause}
            return ToolResult(False, None, payload, {"mcp": self.call_metadata()})


class BodyQuoteFilter(logging.Filter):
    """What the SDK's Streamable HTTP client logs about a server's answers, made safe for the host's
    log: a body it could not parse is logged with a traceback whose text is pydantic's, quoting the
    body cut in the middle, so a token the server echoed shows its last characters, which no
    redaction finds (found by attack). Such a record keeps its first line and the exception's type,
    without the traceback; a warning or error naming what the server sent (its content type) has
    every character that is not printable escaped (a header cannot forge a log line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if record.exc_info and message.startswith(("Error parsing JSON response", "Error parsing SSE message")):
            exc = record.exc_info[1]
            message = f"{message.splitlines()[0]}: {type(exc).__name__} (the body is not shown)"
            record.exc_info = record.exc_text = None
        record.msg = "".join(char if char.isprintable() else repr(char)[1:-1] for char in message)
        record.args = None
        return True


def guard_sdk_client_log() -> None:
    """Put one ``BodyQuoteFilter`` on the SDK's Streamable HTTP client logger (once a process)."""
    logger = logging.getLogger(SDK_HTTP_CLIENT_LOGGER)
    if not any(isinstance(existing, BodyQuoteFilter) for existing in logger.filters):
        logger.addFilter(BodyQuoteFilter())


#: Marks the error put in place of a body past ``max_message_bytes`` (``BodyTooLarge``).
BODY_TOO_LARGE_MARK: Final = "amplifier-tools/body-too-large"


#: A request extension: seconds its whole answer (status, headers and body) may take to come.
WHOLE_ANSWER_TIMEOUT: Final = "amplifier_tools.whole_answer_timeout"


class _DeadlineBody(httpx2.AsyncByteStream):
    """A response body that fails with ``httpx2.ReadTimeout`` once its deadline (``anyio`` time) passed."""

    def __init__(self, stream: Any, deadline: float, request: httpx2.Request) -> None:
        self._stream = stream
        self._deadline = deadline
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._stream.__aiter__()
        while True:
            try:
                with anyio.fail_after(max(0.0, self._deadline - anyio.current_time())):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise httpx2.ReadTimeout("the answer did not come whole in time", request=self._request) from None
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class WholeAnswerTimeout(httpx2.AsyncBaseTransport):
    """A transport bounding the whole answer of a request carrying ``WHOLE_ANSWER_TIMEOUT``: httpx's
    own timeouts bound each network read, which a server sending a byte at a time restarts."""

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        seconds = request.extensions.get(WHOLE_ANSWER_TIMEOUT)
        if seconds is None:
            return await self._transport.handle_async_request(request)
        deadline = anyio.current_time() + seconds
        try:
            with anyio.fail_after(seconds):
                response = await self._transport.handle_async_request(request)
        except TimeoutError:
            raise httpx2.ReadTimeout("no answer came in time", request=request) from None
        response.stream = _DeadlineBody(response.stream, deadline, request)
        return response

    # The client enters and exits its transports (``async with client``): passed on, so a transport
    # whose ``__aenter__`` sets something up is not skipped (found by review: ``AsyncBaseTransport``'s
    # own ``__aenter__`` does nothing, and its ``__aexit__`` only closes).
    async def __aenter__(self) -> WholeAnswerTimeout:
        await self._transport.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._transport.__aexit__(*exc_info)

    async def aclose(self) -> None:
        await self._transport.aclose()


def whole_answer_timeouts(client: httpx2.AsyncClient) -> None:
    """Put ``WholeAnswerTimeout`` in front of ``client``'s transports (its own, and a proxy's).
    httpx has no public way to wrap a client's transports; an httpx2 without these attributes
    leaves the bounds to httpx's per-read timeouts, with a warning (a test fails then)."""
    if not hasattr(client, "_transport") or not isinstance(getattr(client, "_mounts", None), dict):
        log.warning("mcp: this httpx2 (%s) hides its transports: a server trickling its answers can hold a "
                    "cancellation's request longer than %s s", getattr(httpx2, "__version__", "?"),
                    NOTIFICATION_READ_TIMEOUT_S)
        return
    client._transport = WholeAnswerTimeout(client._transport)
    client._mounts = {pattern: None if transport is None else WholeAnswerTimeout(transport)
                      for pattern, transport in client._mounts.items()}


class BodyTooLarge(httpx2.StreamError):
    """A ``url`` server's response body past ``max_message_bytes``, or compressed (its size unknown
    until decoded). A ``StreamError``: the SDK answers the request it was reading the body for with
    a parse error carrying this text (``BODY_TOO_LARGE_MARK``, then the bytes received or
    ``compressed``), which ``ServerConnection`` reports as ``mcp_message_too_large``."""

    def __init__(self, received: int | None) -> None:
        super().__init__(f"{BODY_TOO_LARGE_MARK} {'compressed' if received is None else received}")


class BoundedBody(httpx2.AsyncByteStream):
    """A response body that fails with ``BodyTooLarge`` once more than ``limit`` bytes came (read
    no further: at most one network read past the limit is held), or at once when ``compressed``."""

    def __init__(self, stream: httpx2.AsyncByteStream, limit: int, *, compressed: bool) -> None:
        self._stream = stream
        self._limit = limit
        self._compressed = compressed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._compressed:
            raise BodyTooLarge(None)
        received = 0
        async for chunk in self._stream:
            received += len(chunk)
            if received > self._limit:
                raise BodyTooLarge(received)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def bound_body(response: httpx2.Response, limit: int) -> None:
    """Bound the body of ``response`` (an event hook's, not read yet) to ``limit`` bytes, unless it
    is an event stream (the SDK bounds each event; the stream may last). The SDK reads a JSON body
    whole with no limit: found by attack, a 200 MB answer with ``max_message_bytes`` at 1 MiB took
    16 s and 1.3 GB, and was a success. Compressed bodies are refused: ``Accept-Encoding: identity``
    is asked, and a gzip body of a few hundred kilobytes decodes to gigabytes. A JSON body is also
    made the answer to its POST's request (``answer_its_own_request``)."""
    content_type = response.headers.get("content-type", "").lower()
    if content_type.startswith("text/event-stream"):
        return
    if not isinstance(response.stream, httpx2.AsyncByteStream):  # an async client's always is
        return
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    response.stream = BoundedBody(response.stream, limit, compressed=encoding not in ("", "identity"))
    if content_type.startswith("application/json"):
        answer_its_own_request(response)


#: JSON as the SDK parses a message (pydantic's parser, its limits: 200 levels, 4,300 digits).
_JSON: Final = pydantic.TypeAdapter(Any)


class _OwnAnswer(httpx2.AsyncByteStream):
    """A JSON body answering a POST that carried a request, handed on whole as the answer to that
    request (``answered_as``)."""

    def __init__(self, stream: httpx2.AsyncByteStream, request: bytes) -> None:
        self._stream = stream
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield answered_as(b"".join([chunk async for chunk in self._stream]), self._request)

    async def aclose(self) -> None:
        await self._stream.aclose()


def answer_its_own_request(response: httpx2.Response) -> None:
    """Make the JSON body of a successful answer to a POST that carried a request the answer to that
    request, whatever id it names, as the SDK does for an event stream's answer (it puts the
    request's id in). Found by attack: the SDK routes a JSON body by the id in it, so a server that
    answered one call's POST with the id of another call in flight gave that other call — another
    caller's, perhaps — the first call's result, and the first call waited for its deadline. The
    body is read whole, as the SDK reads it (bounded already: ``bound_body`` calls this for a JSON
    body, whose content type it has read; an event stream's answers never come here)."""
    if response.request.method != "POST" or not 200 <= response.status_code < 300 or response.status_code == 202 \
            or not isinstance(response.stream, httpx2.AsyncByteStream):
        return
    try:
        request = response.request.content
    except httpx2.RequestNotRead:  # pragma: no cover - the request hook reads every POST's body
        return
    response.stream = _OwnAnswer(response.stream, request)


def answered_as(body: bytes, request: bytes) -> bytes:
    """``body`` (a JSON-RPC response) as the answer to ``request`` (the JSON-RPC request of its
    POST): its id replaced by the request's when the two differ (compared as the SDK correlates
    ids, ``7`` and ``"7"`` being one, ``true`` no id); anything else (no JSON, not a response, a
    POST carrying no request) as it is, for the SDK to judge. The body is parsed by the SDK's
    parser (``_JSON``): found by attack, ``json`` is laxer (a byte order mark, UTF-16 and UTF-32,
    numbers of any length), and a body the SDK refused naming its request's id was a success
    naming another's."""
    try:
        sent, answer = json.loads(request), _JSON.validate_json(body)
    except (ValueError, RecursionError):  # pydantic's ValidationError is a ValueError; json's request
        return body
    if not (isinstance(sent, dict) and "method" in sent and "id" in sent and isinstance(answer, dict)
            and ("result" in answer or "error" in answer)):
        return body
    theirs = as_request_id(answer.get("id"))  # not ``true``, which the SDK refuses (found by attack: as 1)
    if theirs is not None and coerce_request_id(theirs) == coerce_request_id(sent["id"]):
        return body
    answer["id"] = sent["id"]
    return json.dumps(answer).encode()


def _body_too_large(exc: MCPError) -> str | None:
    """The bytes received (or ``"compressed"``) when ``exc`` is the SDK's parse error for a body
    ``BoundedBody`` refused, else None."""
    prefix = _SDK_PARSE_FAILURES[0]
    if exc.code != mcp_types.PARSE_ERROR or not exc.message.startswith(prefix):
        return None
    words = exc.message[len(prefix):].split()
    return words[1] if len(words) == 2 and words[0] == BODY_TOO_LARGE_MARK else None


def _connection_closed(exc: MCPError) -> bool:
    """Whether ``exc`` is the SDK's own word that the connection ended under the request
    (``CONNECTION_CLOSED``, exactly ``Connection closed``, no data). A server's error answer may
    carry the same code, -32000 — the first of JSON-RPC's "server error" codes, which servers use
    for any failure — and was taken for a death: the healthy server was stopped and restarted, and
    after ``max_restarts`` such answers its tools were unavailable for the host's lifetime (found
    by attack). A server answering exactly the SDK's words is still taken for dead, no worse than
    a server that exits."""
    return exc.code == mcp_types.CONNECTION_CLOSED and exc.message == "Connection closed" and exc.error.data is None


def _malformed(exc: ValueError, secrets: Collection[str] | SecretSet) -> str:
    """What is wrong with a result the SDK could not read: where, and what pydantic expected there,
    never the values it found — its text shows them cut (``...et-0123456789abcdefXYZ'``), and a
    secret the server echoed, cut, is no longer the secret the result's redaction finds (found by
    attack)."""
    if isinstance(exc, pydantic.ValidationError):
        problems = exc.errors(include_input=False, include_url=False)
        text = "; ".join(f"{_location(error['loc'])}: {error['msg']}" for error in problems[:3])
        if len(problems) > 3:
            text += f" (and {len(problems) - 3} more)"
    else:
        text = str(exc)
    text = redact_text(text, secrets, patterns=False)
    return text if len(text) <= 500 else text[:500] + "..."


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


#: A media type as RFC 6838 spells one (``type/subtype``, parameters allowed), at most 255 characters.
_MEDIA_TYPE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
                                r"(?:\s*;[\x20-\x7e]*)?")


def carries_no_request(body: bytes) -> bool:
    """Whether an outgoing POST's JSON-RPC ``body`` is a notification or a response (no answer but
    an acknowledgement is due), not a request. A cheap search first: a request's body (a call's
    arguments) is parsed only when it holds the words a notification or a response would; a body
    that is not one JSON object, or larger than ``_NOTIFICATION_MAX_BYTES``, is taken for a request."""
    if len(body) > _NOTIFICATION_MAX_BYTES or not (
            b"notifications/" in body or b'"result"' in body or b'"error"' in body):
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and not ("id" in message and "method" in message)


def _content_json(result: mcp_types.CallToolResult) -> list[dict[str, Any]]:
    """The result's blocks as MCP spells them (JSON, aliases, no ``None`` fields)."""
    return [_block_json(block) for block in result.content]


def _block_json(block: Any) -> dict[str, Any]:
    # A bare text block (most results) without the pydantic dump, which is ≈ 3 µs a block.
    if type(block) is mcp_types.TextContent and block.annotations is None and block.meta is None \
            and not block.__pydantic_extra__:
        return {"type": "text", "text": block.text}
    dumped: dict[str, Any] = block.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _text(result: mcp_types.CallToolResult) -> str | None:
    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    return "\n".join(texts) if len(texts) == len(result.content) and texts else None


def _check_content(blocks: list[dict[str, Any]], tool: McpTool) -> None:
    """Refuse content a client could not use as what it claims to be: binary data that is not
    base64, a media type that is not ``type/subtype`` (``ExecutionError`` ``mcp_invalid_content``
    naming the block)."""
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            continue  # a text block has no data or media type (the SDK's model keeps no others)
        holder = block.get("resource") if kind == "resource" else block
        if not isinstance(holder, dict):
            continue
        data = holder.get("blob") if kind == "resource" else holder.get("data")
        mime = holder.get("mimeType")
        problem = None
        if mime is not None and not (isinstance(mime, str) and len(mime) <= 255 and _MEDIA_TYPE.fullmatch(mime)):
            # redacted before it is cut: cut first, a secret the server echoed would pass half
            shown = redact_text(str(mime)[:4096], tool.connection.secrets, patterns=False)[:80]
            problem = f"mimeType {shown!r} is not a media type (type/subtype)"
        elif isinstance(data, str):
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                problem = "its data is not valid base64"
        if problem is not None:
            raise ExecutionError(f"MCP server {tool.connection.name!r} tool {tool.remote_name!r} returned "
                                 f"content block {index} ({kind}) that cannot be used: {problem}",
                                 code="mcp_invalid_content", block=index)


def _faithful(blocks: list[dict[str, Any]], output: Any) -> bool:
    """Whether ``output`` alone carries ``blocks`` (one bare text block, the output's own text)."""
    if not blocks:
        return True
    return len(blocks) == 1 and blocks[0].keys() == {"type", "text"} and blocks[0]["text"] == output_text(output)


def to_tool_result(result: mcp_types.CallToolResult, tool: McpTool) -> ToolResult:
    """Map a ``CallToolResult`` onto a ``ToolResult``.

    Success: ``structuredContent`` when present (the host checks it against the
    output schema), else the content rendered as text for a model (text as it is,
    other blocks as a line naming them: ``amplifier_tools.content.render``). The
    blocks themselves, unchanged, are ``metadata["content"]`` unless the output
    alone carries them (one plain text block), so a re-serve passes them on.
    ``isError``: a failed result with an ``ExecutionError``
    (``mcp_tool_error``); when the text is an amplifier-tools error (a server
    run by ``serve-mcp``), its type, code and message are kept as
    ``remote_type``/``remote_code``/``remote_message``. Binary data that is not
    base64 or a malformed media type is ``ExecutionError`` ``mcp_invalid_content``.
    """
    content = result.content
    if len(content) == 1 and not result.is_error and result.structured_content is None:
        # Most results: one bare text block, the output as it is (what the general path below
        # makes of it, without its dump, checks, rendering and comparison).
        block = content[0]
        if type(block) is mcp_types.TextContent and type(block.text) is str and block.annotations is None \
                and block.meta is None and not block.__pydantic_extra__ \
                and tool.connection.settings.max_content_blocks >= 1:
            return ToolResult(True, block.text, None, {"mcp": tool.call_metadata()})
    return _general_result(result, tool)


def _general_result(result: mcp_types.CallToolResult, tool: McpTool) -> ToolResult:
    """``to_tool_result`` for any result, without its short path for one bare text block (the
    tests compare the two: the short path must give what this gives, for every result)."""
    content = result.content
    metadata: dict[str, Any] = {"mcp": tool.call_metadata()}
    if len(content) > tool.connection.settings.max_content_blocks:  # a url server's (stdio: refused unparsed)
        raise tool.connection.too_many_blocks(len(result.content))
    blocks = _content_json(result)
    _check_content(blocks, tool)
    text = _text(result)
    if result.is_error:
        error: dict[str, Any] = {"type": "ExecutionError", "code": "mcp_tool_error",
                                 "message": f"MCP tool {tool.name!r} reported an error: {text or 'no text'}"}
        remote = _remote_error(text)
        if remote is not None:
            error.update(remote_type=str(remote.get("type")), remote_code=str(remote.get("code")),
                         remote_message=str(remote.get("message")))
            error["message"] = f"MCP tool {tool.name!r} failed remotely: {remote.get('type')}: {remote.get('message')}"
        output: Any = text if text is not None else render(blocks, tool.connection.secrets)
        if not _faithful(blocks, output):
            metadata["content"] = blocks
        return ToolResult(False, output, error, metadata)
    output = result.structured_content if result.structured_content is not None else \
        render(blocks, tool.connection.secrets)
    if not _faithful(blocks, output):
        metadata["content"] = blocks
    return ToolResult(True, output, None, metadata)


def _remote_error(text: str | None) -> dict[str, Any] | None:
    if not text or not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) and "type" in error else None


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one, as anyio's task groups wrap a
    failure, so a start failure says what happened instead of 'unhandled errors in a TaskGroup'."""
    while True:
        inner = getattr(exc, "exceptions", None)
        if not isinstance(inner, (list, tuple)) or len(inner) != 1 or not isinstance(inner[0], BaseException):
            return exc
        exc = inner[0]


async def import_server(connection: ServerConnection) -> list[McpTool]:
    """Start the server, check its pins, and build one ``McpTool`` per tool to mount.

    Raises ``ContractError`` (code ``pin_mismatch``) naming the tool and both
    hashes when a pin is not met and ``on_pin_mismatch = "refuse"``.
    """
    s, server = connection.settings, connection.name
    try:
        await connection.start()
    except Exception as exc:
        error = start_error(connection, exc)
        if error is exc:
            raise
        raise error from exc
    version = connection.server_info.version if connection.server_info else None
    problems = check_pins(version=version, pinned_version=s.version, hashes=connection.hashes, pins=s.pins)
    skipped: set[str] = set()
    for problem in problems:
        message = problem.describe(server)
        if s.on_pin_mismatch == "refuse" or problem.tool is None:
            raise ContractError(message + " (refused: on_pin_mismatch = 'refuse')", code="pin_mismatch",
                                server=server, tool=problem.tool, pinned=problem.pinned, actual=problem.actual)
        log.warning("%s; not mounted", message)
        skipped.add(problem.tool)
    unknown = sorted(set(s.tools) - set(connection.definitions))
    if unknown:
        raise ContractError(f"MCP server {server!r} lists no tool {unknown[0]!r} named in "
                            f"plugins.mcp.servers.{server}.tools", code="unknown_tool")
    tools = []
    for name, definition in connection.definitions.items():
        override = s.tools.get(name)
        if name in skipped or (override is not None and not override.enabled):
            continue
        if (definition.get("execution") or {}).get("taskSupport") == "required":
            log.warning("MCP server %r tool %r requires tasks (execution.taskSupport = 'required'), which the "
                        "host does not support yet; not mounted", server, name)
            continue
        if s.require_pins and name not in s.pins:
            log.warning("MCP server %r tool %r has no pin and require_pins is set; not mounted", server, name)
            continue
        refusal = _pattern_refusal(server, name, definition)
        if refusal is not None:
            if s.on_unsupported_pattern == "refuse":
                raise refusal
            log.warning("%s; not mounted (on_unsupported_pattern = 'skip')", refusal.message)
            continue
        digest = connection.hashes[name]
        try:
            spec = build_spec(server=server, definition=definition, digest=digest,
                              server_name=connection.server_info.name if connection.server_info else None,
                              server_version=version, effect=override.effect if override else None,
                              timeout_ms=s.timeout_ms)
        except (ValueError, TypeError) as exc:
            raise ContractError(f"MCP server {server!r} tool {name!r} has an unusable definition: {exc}",
                                code="invalid_contract") from exc
        tools.append(McpTool(connection, name, spec, digest))
    connection.freeze_definitions({tool.remote_name: tool.definition_hash for tool in tools})
    return tools


def start_error(connection: ServerConnection, exc: Exception) -> Exception:
    """The error to raise for a failed ``connection.start()``: the cause in words, where it is set,
    and the server's stderr tail; a typed error of the start (a pin, a timeout) kept as it is.
    What the server said (its stderr, its answer, the SDK's words for it) has every secret of
    ``connection.secrets`` redacted: the error reaches logs, ``list`` and ``plugins --json``."""
    if isinstance(exc, ConfigError):  # the sandbox's refusal of a setting: it names its key and what to do
        return exc
    if isinstance(exc, ToolError):
        if exc.code != "mcp_start_timeout" or not _stderr_tail(connection):
            return exc
        return ExecutionError(redact_text(exc.message + _stderr_tail(connection), connection.secrets), code=exc.code)
    # The SDK's or the OS's own error: say which server, and where it is set.
    server = connection.name
    where = ("url and headers" if connection.settings.url is not None
             else "cwd" if _missing_cwd(connection, exc) is not None else "command and args")
    message = (f"MCP server {server!r} could not start: {_start_failure(connection, exc)} "
               f"(check plugins.mcp.servers.{server}: {where}){_stderr_tail(connection)}")
    return ExecutionError(redact_text(message, connection.secrets), code="mcp_start_failed",
                          setting=f"plugins.mcp.servers.{server}")


def _start_failure(connection: ServerConnection, exc: BaseException) -> str:
    """What stopped a start: the HTTP status a ``url`` server answered (401 or 403: the headers'
    credentials were refused) rather than the SDK's generic error; for a stdio server, an
    executable not on the ``PATH`` it gets, its exit status, or the part of its answer that is not
    valid MCP — then the last lines it wrote to stderr, which usually say why."""
    if connection.http_refusal is not None:
        status, url = connection.http_refusal
        if status == 404 and urlsplit(url).path.rstrip("/") != "/mcp":
            # found by a newcomer's trial: url = "http://127.0.0.1:8765" answered a bare 404 (and by
            # attack: ".../prefix/mcp" too, the docs saying "a url whose path is not /mcp")
            why = " (nothing is served at this path: serve-mcp and the SDK's servers serve MCP at /mcp)"
        elif status not in (401, 403):
            why = ""
        elif connection.settings.headers:
            why = " (the credentials in headers were refused" + _unschemed_authorization(connection) + ")"
        else:
            why = (" (the server wants credentials, and none were sent: configure headers, e.g. "
                   "Authorization, with a [secrets] reference)")
        return f"HTTP {status} from {url}{why}"
    s = connection.settings
    process = connection._process
    cwd = _missing_cwd(connection, exc)
    if cwd is not None:
        # found by attack: a cwd that does not exist was reported as the command missing from PATH
        what = (f"its working directory {cwd} does not exist; set plugins.mcp.servers.{connection.name}.cwd "
                "to an existing directory (relative to the host's working directory)")
    elif isinstance(exc, FileNotFoundError) and process is None:
        path = connection.environment().get("PATH", "")
        what = (f"no executable {s.command!r} on the PATH the server gets ({path!r}); set "
                f"plugins.mcp.servers.{connection.name}.command to its absolute path, or pass PATH "
                "(env or env_passthrough)")
    elif isinstance(exc, MCPError) and s.url is not None:
        received = _body_too_large(exc)
        what = connection.body_too_large(received).message if received is not None else \
            f"it {connection.http_words(exc)[0]}"
    elif isinstance(exc, httpx2.ConnectError) and s.url is not None:
        # found by a newcomer's trial: "ConnectError: All connection attempts failed" named no address
        what = f"cannot connect to {s.url} ({type(exc).__name__}: {exc}): is the server running there?"
    elif isinstance(exc, pydantic.ValidationError):
        problems = "; ".join(f"{_location(error['loc'])}: {error['msg']}" for error in exc.errors()[:3])
        what = f"it answered with data that is not valid MCP ({problems})"
    elif process is not None and process.returncode is not None:
        status = process.returncode
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        what = f"the server {how} before it was ready ({type(exc).__name__}: {exc})"
        if status == 127:  # a shell's or env's "command not found": what it runs is not on its PATH
            what += ("; status 127 means a program it runs was not found: the server gets only the "
                     f"environment in plugins.mcp.servers.{connection.name}.env and env_passthrough "
                     "(npx-style servers need PATH and HOME)")
    else:
        what = f"{type(exc).__name__}: {exc}"
    return what


def _missing_cwd(connection: ServerConnection, exc: BaseException) -> str | None:
    """The working directory a stdio server could not be started in because it does not exist
    (the spawn's ``FileNotFoundError``), or None when that is not what stopped it."""
    s = connection.settings
    if not isinstance(exc, FileNotFoundError) or connection._process is not None or s.command is None:
        return None
    cwd = server_cwd(s, connection.working_dir)
    return None if os.path.isdir(cwd) else cwd


def _stderr_tail(connection: ServerConnection) -> str:
    """``"; its stderr ended with:"`` and its last lines, indented, or ``""``."""
    from . import STDERR_TAIL_MARK

    tail = connection.stderr.tail() if connection.stderr is not None else ""
    return STDERR_TAIL_MARK + "\n    " + tail.replace("\n", "\n    ") if tail else ""


def _unschemed_authorization(connection: ServerConnection) -> str:
    """Words for a refused ``Authorization`` header whose value has no auth scheme (a bare token):
    the header is sent as it is, and a bearer token must be ``Bearer <token>``. Found by a newcomer's
    trial: serve-mcp's ``token_ref`` variable holds the bare token, and the same value put in the
    importing host's variable was refused with no word why. Never shows the value."""
    from . import _SCHEMED

    for header, value in connection.headers.items():
        if header.lower() == "authorization" and _SCHEMED.fullmatch(value) is None:
            return (f"; the value of header {header!r} has no scheme: a bearer token is sent as "
                    "'Bearer <token>', so the variable its [secrets] reference names must hold that")
    return ""


def _location(loc: Iterable[Any]) -> str:
    """A pydantic error location as a path: ``tools[7].inputSchema.type``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _pattern_refusal(server: str, tool: str, definition: Mapping[str, Any]) -> ContractError | None:
    """A ``ContractError`` (``unsupported_pattern``) for the first schema part RE2 cannot run."""
    for which in ("inputSchema", "outputSchema"):
        problems = unsupported_patterns(definition.get(which))
        if problems:
            pointer, reason = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return ContractError(
                f"MCP server {server!r} tool {tool!r}: {which} at {pointer}: {reason}{more}; refused by "
                f"plugins.mcp.servers.{server}.on_unsupported_pattern (set it to 'skip' to start without "
                "this tool)", code="unsupported_pattern", server=server, tool=tool, schema=which,
                pointer=pointer)
    return None
