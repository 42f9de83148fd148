"""Serving the host's tools to MCP clients (``amplifier-tools serve-mcp``), over stdio or
Streamable HTTP (``http.py``).

Every ``tools/call`` runs through ``ToolHost.call``: the same input checks,
``tool_pre``/``tool_post`` hooks, policies and audit records as any other
call. A caller is the principal, role, environment and scopes the config gives
it: on stdio those of ``[plugins.mcp.serve]`` (falling back to the host's
``[context]``), over HTTP those of the client whose bearer token came with the
request; an MCP client cannot claim other rights. Every failure of a call —
veto, policy, contract, tool error — reaches the client as an ``isError`` result
whose text is ``{"error": {...}}`` with the typed error dict; a tool the caller
cannot see (not listed in ``tools``, or not mounted) is the JSON-RPC error
-32602 (invalid params), as the MCP spec asks for an unknown tool. No tool is
exposed unless ``tools`` names it (``["*"]``: every mounted tool). Tools are
listed under their model-facing names (``fs_read_file``) with their annotations
(``definitions.mcp_annotations``: an imported tool's as its server gave them,
others derived from their effects). A result's rich content
(``metadata["content"]``) is sent as MCP content blocks; a ``tool:progress``
event of a call in flight reaches its client as ``notifications/progress`` when
the client asked for progress. Progress is lossy: a call keeps at most
``PROGRESS_BACKLOG`` notifications waiting for a client that is not reading (a
newer one replaces the newest waiting), and a message is clipped to
``PROGRESS_MESSAGE_CHARS`` characters, so a client that asks for progress and
never reads cannot make the server buffer without bound.

On stdio, serving ends when the client closes stdin or stdout, or at SIGINT or SIGTERM: the
calls in flight are cancelled, each recorded once.

On stdio a request whose id is that of one of the client's requests in flight is answered -32600
at once and never runs (``request_ids``: the SDK let it take the first's place; not over HTTP).

On stdio a line from the client is bounded by ``max_message_bytes`` of ``[plugins.mcp.serve]``
(a longer one is dropped unparsed and answered -32600), and a line the SDK cannot read is answered
-32700 or -32600 as JSON-RPC 2.0 asks, where the SDK answers nothing (``StdioPipes``), as is a
request whose id is no string or integer, which the SDK took for a notification (``_has_id``).

Limits: on stdio there is no authentication (whoever can start the process is
the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import queue
import re
import signal
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import IO, Any, Final

import attrs

from ..errors import missing_extra

try:  # found by a newcomer's trial: "No module named 'anyio'", naming no extra
    import anyio
    import mcp_types
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.server.lowlevel import Server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import ServerMessageMetadata, SessionMessage
    from pydantic import TypeAdapter, ValidationError
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise missing_extra("mcp", exc, "amplifier_tools.mcp.server") from exc

from .._json import json_text
from ..config import plugin_section
from ..content import mcp_spelling
from ..definitions import META_NAME
from ..errors import ConfigError
from ..host import ContextCaller, ToolHost
from ..models import ContextFieldError, ToolContext, ToolResult, output_text
from ..plugin_settings import structure_settings
from .request_ids import ID_IN_USE, StdioIds
from .sdk_logs import redact_sdk_logs
from .settings import DEFAULT_MAX_MESSAGE_BYTES, PLUGIN, McpSettings, ServeClient, ServeSettings
from .transport import READ_CHUNK, error_line, loads_or_none, request_id, wire_text

log = logging.getLogger("amplifier_tools.mcp")


def serve_settings(host: ToolHost) -> ServeSettings:
    """The ``[plugins.mcp.serve]`` settings of ``host`` (checked; defaults when absent)."""
    plugin = host.plugin_manager.get_plugin(PLUGIN)
    settings = getattr(plugin, "settings", None)
    serve = getattr(settings, "serve", None)
    if isinstance(serve, ServeSettings):
        return serve
    own, _ = plugin_section(host.config, PLUGIN)
    return structure_settings(own, McpSettings, f"plugins.{PLUGIN}").serve


def caller_context(host: ToolHost, settings: ServeSettings, client: ServeClient | None = None,
                   transport: str = "mcp-stdio") -> ToolContext:
    """The context every call of one MCP caller runs with: the ``client``'s fields, else those
    of ``[plugins.mcp.serve]``, else the host's ``[context]``."""
    base = host.default_context

    def pick(field: str) -> Any:
        for source in (client, settings):
            value = getattr(source, field, None) if source is not None else None
            if value is not None:
                return value
        return getattr(base, field)

    attributes = {**base.attributes, "transport": transport}
    if client is not None:
        attributes["mcp_client"] = client.token_ref
    try:
        return attrs.evolve(base, principal=pick("principal"), role=pick("role"), environment=pick("environment"),
                            scopes=frozenset(pick("scopes")), attributes=attributes)
    except ContextFieldError as wrong:  # a client's principal holding a token, say: refused at serve start
        where = f"plugins.{PLUGIN}.serve"
        if client is not None:
            where += f".clients[{settings.clients.index(client)}]" if client in settings.clients else ".clients"
        raise ConfigError(str(wrong), key=f"{where}.{wrong.field}", file=host.config_file,
                          hint="a principal, role or environment is a name, a scope a short token: printable "
                               "characters, no credential (docs/contract.md, 'Identifiers')") from None


@attrs.frozen
class Caller:
    """One MCP caller as the host sees it: the host's calls with its context (checked once, not at
    every call: ``ToolHost.context_caller``) and the contract names of the tools it may list and call."""

    calls: ContextCaller
    tools: frozenset[str]

    @classmethod
    def of(cls, host: ToolHost, context: ToolContext, tools: frozenset[str]) -> Caller:
        """The caller whose calls of ``host`` run with ``context`` (``caller_context``'s, checked there)."""
        return cls(host.context_caller(context), tools)

    @property
    def context(self) -> ToolContext:
        """The context its calls run with."""
        return self.calls.context


def exposed_tools(host: ToolHost, names: tuple[str, ...] | None, key: str) -> frozenset[str]:
    """The contract names ``names`` (a ``tools`` setting) exposes: none for None, every mounted
    tool for ``["*"]``. ``ConfigError`` naming ``key`` (and the host's configuration file) when a
    name is not mounted, with the contract names of the tools closest to it (``ToolRegistry.suggest``)."""
    mounted = {spec.name for spec in host.specs}
    if names is None:
        return frozenset()
    if names == ("*",):
        return frozenset(mounted)
    for name in names:
        if name not in mounted:
            by_model_name = {mounted.model_name: mounted.spec.name for mounted in host.tools}
            if name in by_model_name:
                hint = f"'tools' takes contract names: {by_model_name[name]!r} (clients see it as {name!r})"
            else:
                # found by a newcomer's trial: "read_fiel" had no did-you-mean, where an unknown tool
                # called gets one (the registry's, in the contract names this setting takes)
                close = [by_model_name.get(near, near) for near in host.tools.suggest(name)]
                hint = "'amplifier-tools list' shows the mounted tools' names"
                if close:
                    hint = f"did you mean {', '.join(map(repr, close))}? ({hint})"
            raise ConfigError(f"names no mounted tool {name!r}", key=key, hint=hint, file=host.config_file)
    return frozenset(names)


def build_server(host: ToolHost, settings: ServeSettings | None = None,
                 caller: Callable[[], Caller | None] | None = None,
                 on_refused: Callable[[Caller | None, str], None] | None = None) -> Server[Any]:
    """An SDK low-level ``Server`` exposing ``host``'s tools to MCP callers.

    ``caller`` says who makes the current request (over HTTP, from its bearer token; None: no
    one who may see a tool); without it every request is the ``[plugins.mcp.serve]`` caller,
    who sees ``settings.tools``. ``on_refused`` hears of every ``tools/call`` answered -32602
    (the caller, and the tool name it sent). Raises ``ConfigError`` when ``settings.tools`` names a tool
    that is not mounted.
    """
    settings = settings or serve_settings(host)
    if caller is None:
        single = Caller.of(host, caller_context(host, settings),
                           exposed_tools(host, settings.tools, f"plugins.{PLUGIN}.serve.tools"))
        if not single.tools:
            log.warning("serve-mcp: no tool is exposed; list them in [plugins.%s.serve] tools "
                        '(tools = ["*"] exposes every mounted tool)', PLUGIN)
        caller = lambda: single  # noqa: E731 - stdio: every request is this one caller
    current = caller
    definitions = host.tool_definitions("mcp")
    listed = [(d["_meta"][META_NAME], mcp_types.Tool.model_validate(d, by_name=False)) for d in definitions]
    by_model_name: Mapping[str, str] = {d["name"]: d["_meta"][META_NAME] for d in definitions}

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        who = current()
        visible = who.tools if who is not None else frozenset()
        return mcp_types.ListToolsResult(tools=[tool for name, tool in listed if name in visible])

    # Calls in flight: call id -> the request's session, replaced by a relay to it at the call's first
    # progress (most calls report none, and build none). The session's report_progress reaches the
    # client when it asked for progress (a progressToken; in process, a callback), else is a no-op.
    progress_targets: dict[str, Any] = {}

    async def forward_progress(event: str, data: dict[str, Any]) -> None:
        # Never awaits the client: a client that does not read would hold every emitter (and, for an
        # imported tool, one SDK task per notification) until the call ends.
        call_id = str(data.get("tool_call_id"))
        target = progress_targets.get(call_id)
        progress, total, message = _number(data.get("progress")), _number(data.get("total")), data.get("message")
        if target is None or progress is None:
            return
        if not isinstance(target, ProgressRelay):
            target = progress_targets[call_id] = ProgressRelay(target)
        target.offer(progress, total, message if isinstance(message, str) else None)

    host.events.register("tool:progress", forward_progress, name="serve-mcp progress", owner=PLUGIN)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        who = current()
        name = by_model_name.get(params.name)
        if who is None or name is None or name not in who.tools:
            if on_refused is not None:
                on_refused(who, params.name)
            raise MCPError(code=mcp_types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        session = getattr(ctx, "session", None)
        if session is None:
            return to_call_tool_result(await who.calls.call(name, params.arguments))
        call_id = ""

        def started(made: str) -> None:  # the host's id for the call, before it begins
            nonlocal call_id
            call_id = made
            progress_targets[made] = session

        try:
            result = await who.calls.call(name, params.arguments, started)
        except BaseException:
            relay = progress_targets.pop(call_id, None)
            if isinstance(relay, ProgressRelay):
                relay.abandon()
            raise
        relay = progress_targets.pop(call_id)
        if isinstance(relay, ProgressRelay):  # what still waits (at most PROGRESS_BACKLOG) goes out before the result
            await relay.finish()
        return to_call_tool_result(result)

    return Server(settings.name, version=host_version(), on_list_tools=list_tools, on_call_tool=call_tool)


#: Progress notifications of one call waiting for its client; past it, a newer one replaces the newest.
PROGRESS_BACKLOG: Final = 16
#: A progress message longer than this is clipped (with an ellipsis) before it is sent.
PROGRESS_MESSAGE_CHARS: Final = 1024


class ProgressRelay:
    """The progress of one call in flight on its way to the client: ``offer`` never waits; a task
    started by the first ``offer`` sends in order what waits, one at a time. At most
    ``PROGRESS_BACKLOG`` wait; progress is lossy, so when the client is not keeping up the newest
    waiting one is replaced by a newer. ``build_server`` makes one at a call's first progress: a
    call that reports none (most calls) costs no relay and no task (starting a task per call was
    ≈ 60 µs, more than the rest of serving a call over HTTP)."""

    __slots__ = ("_closed", "_session", "_task", "_waiting", "_wake")

    def __init__(self, session: Any) -> None:
        self._session = session
        self._closed = False
        self._waiting: deque[tuple[float, float | None, str | None]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def offer(self, progress: float, total: float | None, message: str | None) -> None:
        if self._closed:
            return
        if message is not None and len(message) > PROGRESS_MESSAGE_CHARS:
            message = message[:PROGRESS_MESSAGE_CHARS - 1] + "\u2026"
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(self._waiting) >= PROGRESS_BACKLOG:
            self._waiting[-1] = (progress, total, message)
        else:
            self._waiting.append((progress, total, message))
        self._wake.set()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def finish(self) -> None:
        """Send what waits, then return (at once if nothing was ever offered). Cancelled, the
        sending is cancelled too."""
        self._closed = True
        if self._task is not None:
            self._wake.set()
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                self._task.cancel()
                raise

    def abandon(self) -> None:
        """Stop sending: the call ended without a result to follow its progress."""
        self._closed = True
        if self._task is not None:
            self._waiting.clear()
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            while self._waiting:
                try:
                    await self._session.report_progress(*self._waiting.popleft())
                except Exception:  # the client went away: the call goes on without its progress
                    log.debug("serve-mcp: progress not delivered; no more is sent for this call", exc_info=True)
                    self._waiting.clear()
                    self._closed = True
                    return
            if self._closed:
                return
            await self._wake.wait()
            self._wake = asyncio.Event()


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else None (JSON has no NaN, and bool is no number here)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int past the float range (found by attack: it raised here)
            return None
        return number if math.isfinite(number) else None
    return None


def to_call_tool_result(result: ToolResult) -> mcp_types.CallToolResult:
    """A ``ToolResult`` as MCP sees it: text (and ``structuredContent`` for object
    output) on success; ``isError`` with ``{"error": {...}}`` text on failure, JSON a strict parser
    reads (``json_text``; found by attack: an error detail of NaN was written ``NaN``, and one of an
    integer over 4,300 digits made the call a JSON-RPC internal error instead of its typed error)."""
    if not result.success:
        text = json_text({"error": result.error})
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], is_error=True)
    output = result.output
    if type(output) is str and "content" not in result.metadata:  # the common result: its text as it is
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=output)])
    blocks = content_blocks(result.metadata["content"]) if "content" in result.metadata else None
    if isinstance(output, dict):
        # structuredContent is the text's own data, so the two agree and both are JSON (found by
        # attack: NaN was text ``NaN`` and structured ``null``, a set ``"{1, 2}"`` and ``[1, 2]``, a
        # tuple key ``"(1, 2)"`` and ``"1,2"``; an output holding itself was a JSON-RPC internal error).
        text = output_text(output)
        content = blocks or [mcp_types.TextContent(type="text", text=text)]
        return mcp_types.CallToolResult(content=content, structured_content=json.loads(text))
    content = blocks or [mcp_types.TextContent(type="text", text=result.get_serialized_output(max_chars=None))]
    return mcp_types.CallToolResult(content=content)  # not passing structured_content=None: one field less to validate


_CONTENT_BLOCK: Final = TypeAdapter(mcp_types.ContentBlock)


def content_blocks(blocks: Any) -> list[mcp_types.ContentBlock]:
    """A result's rich content (``metadata["content"]``: text, image, audio, resource link and
    embedded resource blocks in MCP's spelling, as an imported tool's result carries them, or
    image blocks in Amplifier's ``{"type": "image", "source": {"media_type", "data"}}``) as MCP
    content blocks; ``[]`` when there are none or one cannot be carried, so the caller falls back
    to the text rendering rather than sending part of the content. One that cannot even be read
    (a ``dict`` whose ``get`` raises, a list whose iteration raises) cannot be carried either
    (found by attack: the call was a JSON-RPC internal error)."""
    if not isinstance(blocks, list) or not blocks:
        return []
    converted: list[mcp_types.ContentBlock] = []
    try:
        for block in blocks:
            if not isinstance(block, dict):
                return []
            converted.append(_CONTENT_BLOCK.validate_python(mcp_spelling(block), by_name=False))
    except Exception:  # ValidationError, or whatever reading the block raised
        return []
    return converted


def host_version() -> str:
    from .._version import __version__

    return __version__


async def serve(host: ToolHost, settings: ServeSettings | None = None, *, freeze_heap: bool = False) -> None:
    """Serve ``host``'s tools over the configured transport: stdio until the client closes stdin
    (or stdout) or the process is interrupted (``serve_stdio_until_signalled``), Streamable HTTP
    until the process is interrupted (``freeze_heap``: see ``serve_http``)."""
    settings = settings or serve_settings(host)
    if settings.transport == "streamable-http":
        from .http import serve_http

        await serve_http(host, settings, freeze_heap=freeze_heap)
        return
    server = build_server(host, settings)
    secrets = host.capabilities.get("session.secrets")
    unredact_logs = redact_sdk_logs(secrets if secrets is not None else ())  # the SDK's records: exceptions it logs
    try:
        await serve_stdio_until_signalled(server, settings.max_message_bytes)
    finally:
        unredact_logs()


async def serve_stdio_until_signalled(server: Server[Any], max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
    """Run ``server`` on this process's stdin and stdout (a line is at most ``max_message_bytes``:
    ``StdioPipes``) until the client closes either, or until
    SIGINT or SIGTERM (in the main thread; elsewhere the caller stops it by cancelling): a signal
    cancels the calls in flight — each is recorded, as ``cancelled``, and its processes end — and
    it returns. Found by attack: SIGTERM killed the process outright (no audit record of the call in
    flight, a ``bash`` command's processes left running), and SIGINT cancelled the calls but then
    waited for the SDK's stdin reader, a thread blocked reading until the client wrote a line or
    closed stdin — forever for a client that sent the signal and waited. Stdin is read by
    ``StdioPipes`` instead, which a cancellation does not wait for (nor, a client that stopped
    reading stdout, for a write)."""
    loop = asyncio.get_running_loop()
    serving = asyncio.ensure_future(_run_stdio(server, max_message_bytes))
    signalled = False

    def on_signal() -> None:
        nonlocal signalled
        signalled = True
        serving.cancel()

    handled: list[tuple[signal.Signals, Any]] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous = signal.getsignal(signum)
            loop.add_signal_handler(signum, on_signal)
            handled.append((signum, previous))
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # only the main thread takes signals
    try:
        await serving
    except asyncio.CancelledError:
        if not signalled:
            raise
    finally:
        for signum, previous in handled:
            loop.remove_signal_handler(signum)
            if _restorable(previous):
                # what was there before: an embedding application's handler, or asyncio.run's SIGINT
                # handler (found by review: removing ours left SIG_DFL in their place)
                signal.signal(signum, previous)


def _restorable(handler: Any) -> bool:
    """Whether a signal handler found before serving can be put back as it was: not one another
    ``loop.add_signal_handler`` set (asyncio's no-op stand-in, whose loop no longer dispatches it:
    put back, the signal would be swallowed), and not unknown (None: set outside Python)."""
    return handler is not None and getattr(handler, "__module__", None) != "asyncio.unix_events"


async def _run_stdio(server: Server[Any], max_message_bytes: int) -> None:
    with StdioPipes.claim(max_message_bytes) as pipes:
        async with pipes.session_streams() as (read, write):
            await server.run(read, write, server.create_initialization_options())


@attrs.frozen
class Overlong:
    """A line of the client's longer than ``max_message_bytes``, read and dropped: its length in
    bytes, its request's id when the line's first bytes tell it (``id_in_head``), and whether they
    tell a response (``response_in_head``: not answered)."""

    size: int
    id: str | int | None
    response: bool = False


#: Bytes at the start of an over-long line searched for its request's id.
ID_HEAD_BYTES: Final = 4096
_OBJECT_START: Final = re.compile(rb"\s*\{")
_STRING: Final = rb'"(?:[^"\\]|\\.)*"'
#: One member of a JSON object whose value is a string, a number or a literal, and what follows it.
_SCALAR_MEMBER: Final = re.compile(rb"\s*(" + _STRING + rb")\s*:\s*(" + _STRING
                                   + rb"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)\s*([,}])")


_KEY: Final = re.compile(rb"\s*(" + _STRING + rb")\s*:")
#: The value ``head_members`` gives a member whose value is an object or an array (not read).
NESTED: Final = object()


def head_members(head: bytes) -> Iterator[tuple[object, object]]:
    """The members of the JSON object ``head`` starts, in order, while their values are strings,
    numbers or literals; then the key of the first member with another value, with ``NESTED``."""
    start = _OBJECT_START.match(head)
    if start is None:
        return
    position = start.end()
    while member := _SCALAR_MEMBER.match(head, position):
        try:
            key, value = json.loads(member[1]), json.loads(member[2])
        except ValueError:
            return
        yield key, value
        if member[3] == b"}":
            return
        position = member.end()
    if (nested := _KEY.match(head, position)) is not None:
        with contextlib.suppress(ValueError):
            yield json.loads(nested[1]), NESTED


def id_in_head(head: bytes) -> str | int | None:
    """The ``id`` of the JSON object ``head`` starts, when only members with a string, number or
    literal value come before it in ``head`` (the SDK's clients write ``jsonrpc`` and then ``id``
    first; a client that writes ``params`` first leaves it unknown): else None."""
    for key, value in head_members(head):
        if key == "id":
            return None if value is NESTED else request_id({"id": value})
    return None


def response_in_head(head: bytes) -> bool:
    """Whether the JSON object ``head`` starts is a response: a ``result`` or ``error`` member comes
    before any ``method`` among its first members (as the SDK's clients write them)."""
    for key, _ in head_members(head):
        if key == "method":
            return False
        if key in ("result", "error"):
            return True
    return False


#: The answer's message to a request whose id is no string or integer (answered with id null).
BAD_ID: Final = "Invalid Request: an id must be a string or an integer (MCP); this request has another"


def _has_id(line: str) -> bool:
    """Whether the JSON object ``line`` (which the SDK read as a notification) has an ``id``
    member: a request whose id is no string or integer (``true``, ``1.0``, ``null``, an array).
    Found by attack: the SDK's notification takes any extra member, so such a request ran nothing
    and was answered nothing, and its client waited forever. Parsed (a notification is rare: the
    key may be escaped), never trusted to a substring."""
    message = loads_or_none(line)
    return isinstance(message, dict) and "id" in message


def refusal(line: str, exc: Exception) -> str | None:
    """The answer to a ``line`` the SDK cannot read as a JSON-RPC message (``exc``: why), as JSON-RPC
    2.0 asks: -32700 (id null) when it is no JSON; -32600 when it is JSON but no request or
    notification — with the request's ``id`` when it has a usable one, else id null (a batch: MCP
    has had none since 2025-06-18). None for what looks like a response (``result`` or ``error``
    without ``method``): a response is never answered, and an error with its id could be taken
    for the answer to the client's own request of that id. The SDK leaves all of them unanswered,
    so a client waited forever for the answer to a request it had sent malformed."""
    if isinstance(exc, ValidationError) and any(e["type"] == "json_invalid" for e in exc.errors()):
        return error_line(None, mcp_types.PARSE_ERROR, "Parse error")
    message = loads_or_none(line)
    if isinstance(message, list):
        return error_line(None, mcp_types.INVALID_REQUEST,
                          "Invalid Request: a batch (MCP has no batches since 2025-06-18)")
    if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
        return None
    return error_line(request_id(message), mcp_types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request "
                  "or notification MCP reads")


class StdioPipes:
    """The client's end of a stdio server: lines are read from a private duplicate of stdin by one
    daemon thread and handed to the event loop one at a time (the next line is read once the one
    before was taken), decoded as UTF-8 with bad bytes replaced, as the SDK's reader does; messages
    are written to a private duplicate of stdout by another, one at a time. ``session_streams``
    turns them into the SDK's message streams, as the SDK's ``stdio_server`` does, and answers
    what the SDK would leave unanswered (``refusal``). Unlike the SDK's streams
    (worker threads a cancellation waits for), a cancelled server does not wait for a client that
    neither writes nor reads, and a blocked thread does not keep the process from exiting. A write
    that fails (the client closed its end of stdout) ends the lines as the end of stdin does, so the
    server stops as when the client closes stdin (found by attack: the SDK's writer raised, and
    serve-mcp exited 1 with "this is a bug").

    A line is read in pieces of at most ``max_message_bytes``: a longer one is never held whole (at
    most ``max_message_bytes`` of it, then 64 KiB at a time up to its newline, are read and
    dropped); it is answered -32600, with its request's id when its first bytes tell it
    (``id_in_head``) — not at all when they tell a response (``response_in_head``) — and a warning
    names the setting. Found by attack: a 30 MB line was read
    whole, and a client could make the server hold as much memory as it sent in one line.
    A request whose id is in use by one in flight is answered -32600 here and not passed on
    (``request_ids.StdioIds``: an id is taken as a request is read, freed as its answer is written
    or when the SDK settles it unanswered).
    Limits: once serving ends, the reading thread may still take one more line, which is dropped.
    A blank line is no message and is not answered."""

    def __init__(self, stdin: int, stdout: int, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._loop = asyncio.get_running_loop()
        self.max_message_bytes = max_message_bytes
        self._lines: asyncio.Queue[str | Overlong] = asyncio.Queue()  # "" ends them
        self._taken = threading.Semaphore()  # the reader reads a line once the one before was taken
        self._gone = False  # a write failed: the client is gone
        self._out: queue.SimpleQueue[tuple[str, asyncio.Future[None]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, args=(stdin,), name="serve-mcp stdin", daemon=True).start()
        threading.Thread(target=self._write, args=(stdout,), name="serve-mcp stdout", daemon=True).start()

    @classmethod
    @contextlib.contextmanager
    def claim(cls, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Iterator[StdioPipes]:
        """Serve through private duplicates of stdin and stdout, with fd 0 on the null device and
        fd 1 on stderr meanwhile (as the SDK's ``stdio_server`` does: a tool's process reading stdin
        sees end of file, and what it prints cannot break the protocol); both are put back when
        serving ends. Each thread owns (and closes when it ends) a duplicate of its own; the reader
        ends at the end of stdin, the writer when serving does."""
        saved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (0, 1)]
        try:
            private = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (0, 1)]
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                os.dup2(null, 0)
                os.dup2(2, 1)
            finally:
                os.close(null)
            pipes = cls(private[0], private[1], max_message_bytes)
            try:
                yield pipes
            finally:
                pipes._out.put(None)  # the writer ends
        finally:
            for fd, copy in enumerate(saved):
                os.dup2(copy, fd)
                os.close(copy)

    @contextlib.asynccontextmanager
    async def session_streams(self) -> AsyncIterator[tuple[MemoryObjectReceiveStream[SessionMessage | Exception],
                                                           MemoryObjectSendStream[SessionMessage]]]:
        """The read and write streams ``Server.run`` takes: each line parsed once, as the SDK's
        ``stdio_server`` parses it, and each message written as it writes it; a line it cannot
        read, or one past ``max_message_bytes``, is answered here, through the same writer."""
        read_send, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
        ids = StdioIds()

        async def receive() -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async with read_send:
                    async for line in self:
                        message = self._message(line)
                        if isinstance(message, SessionMessage) and type(message.message) is mcp_types.JSONRPCRequest:
                            rid = message.message.id
                            if ids.claim(rid):  # freed when answered, or when the SDK settles it unanswered
                                message.metadata = ServerMessageMetadata(on_request_unanswered=ids.on_unanswered(rid))
                            else:  # its id is in use: answered here, never run (``request_ids``)
                                message = error_line(rid, mcp_types.INVALID_REQUEST, ID_IN_USE)
                        if isinstance(message, SessionMessage):
                            await read_send.send(message)
                        elif message is not None:
                            await self.write(message)

        async def send() -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async with write_receive:
                    async for message in write_receive:
                        answer = message.message
                        if isinstance(answer, _ANSWERS) and answer.id is not None:
                            ids.free(answer.id)
                        await self.write(wire_text(answer))

        async with anyio.create_task_group() as group:
            group.start_soon(receive)
            group.start_soon(send)
            yield read, write

    def _message(self, line: str | Overlong) -> SessionMessage | str | None:
        """What to do with one line: the message for the server, else the answer to write here
        (or None: nothing)."""
        if isinstance(line, Overlong):
            log.warning("serve-mcp: a message of %d bytes from the client is longer than plugins.%s.serve."
                        "max_message_bytes (%d); it was dropped unparsed%s", line.size, PLUGIN, self.max_message_bytes,
                        " (a response: not answered)" if line.response else " and answered -32600")
            if line.response:  # as ``refusal``: a response is never answered
                return None
            return error_line(line.id, mcp_types.INVALID_REQUEST,
                          f"Invalid Request: message longer than {self.max_message_bytes} bytes")
        if line.isspace():
            return None
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as exc:  # as the SDK's reader: whatever the line makes the parser raise
            log.debug("serve-mcp: the client sent a line that is no JSON-RPC message", exc_info=True)
            return refusal(line, exc)
        if type(message) is mcp_types.JSONRPCNotification and _has_id(line):
            return error_line(None, mcp_types.INVALID_REQUEST, BAD_ID)
        return SessionMessage(message)

    def _read(self, fd: int) -> None:
        with open(fd, "rb", buffering=READ_CHUNK) as stdin:
            while True:
                self._taken.acquire()
                try:
                    line = self._read_line(stdin)
                except (OSError, ValueError):
                    line = ""
                try:
                    self._loop.call_soon_threadsafe(self._lines.put_nowait, line)
                except RuntimeError:  # the loop closed: nobody reads on
                    return
                if line == "":
                    return

    def _read_line(self, stdin: IO[bytes]) -> str | Overlong:
        """The next line ("" at the end of stdin), or, when it is longer than
        ``max_message_bytes``, its size and id: the rest of it is read and dropped."""
        line = stdin.readline(self.max_message_bytes + 1)
        if len(line) <= self.max_message_bytes or line.endswith(b"\n"):
            return line.decode("utf-8", errors="replace")
        head, size = line[:ID_HEAD_BYTES], len(line)
        del line
        response = response_in_head(head)
        rid = None if response else id_in_head(head)
        while rest := stdin.readline(READ_CHUNK):
            if rest.endswith(b"\n"):
                size += len(rest) - 1
                break
            size += len(rest)
        return Overlong(size, rid, response)

    def _write(self, fd: int) -> None:
        with open(fd, "wb") as out:
            while (message := self._out.get()) is not None:
                text, done = message
                try:
                    out.write(text.encode("utf-8"))  # buffered: a write cut short (by a signal) goes on
                    out.flush()
                    outcome: BaseException | None = None
                except OSError as exc:  # the client closed its end: the write fails in the server
                    outcome = exc
                try:
                    self._loop.call_soon_threadsafe(_settle, done, outcome)
                except RuntimeError:  # the loop closed
                    return

    def __aiter__(self) -> StdioPipes:
        return self

    async def __anext__(self) -> str | Overlong:
        line = await self._lines.get()
        self._taken.release()
        if line == "":
            self._lines.put_nowait("")  # and so for every later read
            raise StopAsyncIteration
        return line

    async def write(self, text: str) -> None:
        """Write one message; once a write failed (the client is gone), drop it."""
        if self._gone:
            return
        done: asyncio.Future[None] = self._loop.create_future()
        self._out.put((text, done))
        try:
            await done
        except OSError:
            log.debug("serve-mcp: the client closed stdout; serving ends", exc_info=True)
            self._gone = True
            self._lines.put_nowait("")


#: The messages that answer a request (and free its id).
_ANSWERS: Final = (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)


def _settle(done: asyncio.Future[None], outcome: BaseException | None) -> None:
    if done.done():  # the writer was cancelled
        return
    if outcome is None:
        done.set_result(None)
    else:
        done.set_exception(outcome)


async def serve_configured(
    host_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    working_dir: str | os.PathLike[str] | None = None,
    builtins: bool = True,
    entry_points: bool = True,
    overrides: Mapping[str, Any] | None = None,
    freeze_heap: bool = False,
) -> None:
    """Start a ``ToolHost`` from ``host_config`` (a mapping, a file, or discovered) and serve its
    tools, ``[plugins.mcp.serve]`` changed by ``overrides`` (the command line's ``--transport``,
    ``--host``, ``--port``); the host closes when serving ends. ``freeze_heap``: see ``serve_http``
    (``serve-mcp`` sets it)."""
    async with ToolHost(config=host_config, working_dir=working_dir, builtins=builtins,
                        entry_points=entry_points) as host:
        settings = serve_settings(host)
        if overrides:
            settings = attrs.evolve(settings, **overrides)
            listening = sorted(f"--{name}" for name in ("host", "port") if name in overrides)
            if listening and settings.transport == "stdio":
                # The transport is the setting at fault: named with its file (found by a newcomer's
                # trial: the error named neither), and the flags are named by the message.
                raise ConfigError(f"{' and '.join(listening)} set where to listen for HTTP, but the transport is "
                                  "stdio", key=f"plugins.{PLUGIN}.serve.transport", file=host.config_file,
                                  hint="add --transport streamable-http (or set transport = \"streamable-http\" "
                                       f"in [plugins.{PLUGIN}.serve]"
                                       + (f" of {host.config_file})" if host.config_file else ")"))
        try:
            await serve(host, settings, freeze_heap=freeze_heap)
        except ConfigError as exc:
            given = overrides or {}
            flag = _flag_at_fault(exc, given)
            if flag is None:
                raise
            # The value came from the command line, not from the file: the option is named, not the
            # file's key (found by a newcomer's trial: "--port 8765" in use named neither).
            raise ConfigError(exc.detail, key=f"--{flag} {given[flag]}", hint=exc.hint) from None


def _flag_at_fault(exc: ConfigError, overrides: Mapping[str, Any]) -> str | None:
    """The command-line option (``port``, ``host``) whose value ``exc`` refuses, when it set that
    ``[plugins.mcp.serve]`` field; else None."""
    prefix = f"plugins.{PLUGIN}.serve."
    field = exc.key[len(prefix):] if exc.key and exc.key.startswith(prefix) else None
    return field if field in ("host", "port") and field in overrides else None


async def serve_stdio(
    host_config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    working_dir: str | os.PathLike[str] | None = None,
    builtins: bool = True,
    entry_points: bool = True,
) -> None:
    """``serve_configured`` over stdio, whatever ``[plugins.mcp.serve] transport`` says."""
    await serve_configured(host_config, working_dir=working_dir, builtins=builtins, entry_points=entry_points,
                           overrides={"transport": "stdio"})
