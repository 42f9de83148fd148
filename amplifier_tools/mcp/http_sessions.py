"""How many Streamable HTTP sessions each ``serve-mcp`` client may hold open at once.

The SDK's session manager keeps every session a client opened with ``initialize`` (about 38 KB
and two tasks each, measured) until the client sends ``DELETE``, or until it has had no request
in flight for ``session_idle_s``; at ``max_sessions`` open sessions it refuses every new one,
whoever asks. Found by attack: one token holder that opens sessions and never ends them fills
that shared limit (10,000 sessions: ≈ 380 MB) and every other client's ``initialize`` fails
until the first one's sessions expire. ``SessionQuota`` counts each client's open sessions and
answers its ``initialize`` beyond ``max_sessions_per_client`` with HTTP 429 itself, before the
SDK admits it, so one client can take at most its share.

Limits, stated plainly: the count is this module's own view of the SDK's sessions (opened: an
answer below 400 carrying ``mcp-session-id`` to a request without one; ended: a ``DELETE``
answered below 400, any answer 404 to the session's id at the SDK's endpoint, or
``session_idle_s`` without a request in flight, as the SDK expires them). A request names the
session of its first ``mcp-session-id`` header, as the SDK reads it; requests to other paths never
reach the SDK's session manager and are passed on uncounted (found by attack: a 404 from the
router for another path, or one to a request naming an unknown id before the client's own, took
a session the SDK still held off the count, so the limit could be slipped without end). A session
the SDK ends for another reason (its server task crashed) is still counted until the client names
it again (404) or it has been idle that long. A request the SDK serves on its single-exchange
path (an ``mcp-protocol-version`` header naming no handshake version: 2026-07-28) has no session
and is passed on uncounted, whatever ``mcp-session-id`` it names (``single_exchange``).
Without clients (``allow_anonymous``) there is one caller and only the SDK's ``max_sessions``
applies. The tracker holds at most ``max_sessions_per_client`` entries per configured client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from .settings import PLUGIN

#: Written (under the refusal events' budget) when a client's ``initialize`` is refused here.
SESSIONS_REFUSED_EVENT: Final = "mcp.http.sessions_refused"
SETTING: Final = f"plugins.{PLUGIN}.serve.max_sessions_per_client"


def _refusal_body(limit: int) -> bytes:
    # A JSON-RPC error without a request id, as the SDK's own "Too many open sessions" (503).
    return (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"this client already holds '
            + str(limit).encode() + b' open sessions (' + SETTING.encode() + b'); end one with DELETE '
            b'before opening another, or wait for an idle one to expire"}}')


#: The handshake versions as they come in a header (ASCII: the same bytes as latin-1 text).
_HANDSHAKE_VERSIONS: Final = frozenset(version.encode("latin-1") for version in HANDSHAKE_PROTOCOL_VERSIONS)


def single_exchange(version: bytes | None) -> bool:
    """Whether the SDK serves a request whose first ``mcp-protocol-version`` header is ``version``
    (None: no such header) on its single-exchange path (protocol 2026-07-28 and any version it
    does not know): present and naming no handshake version, read as the SDK's session manager
    reads it. That path has no session: it never opens one, never looks one up, and its 404 is a
    JSON-RPC "method not found", not an unknown session."""
    return version is not None and version not in _HANDSHAKE_VERSIONS


def first_headers(headers: Any) -> tuple[bytes | None, bytes | None]:
    """A request's first ``mcp-session-id`` and first ``mcp-protocol-version`` header (ASGI
    headers), as the SDK reads them. (``Gate`` reads them with one ``dict`` in C and comes here
    only when a header name came twice: found by count, this loop over every header was ≈ 100
    bytecodes of each request.)"""
    session = version = None
    for name, value in headers:
        if name == b"mcp-session-id":
            if session is None:
                session = value
        elif name == b"mcp-protocol-version" and version is None:
            version = value
    return session, version


class _Session:
    __slots__ = ("last", "open")

    def __init__(self, now: float) -> None:
        self.open = 0  # requests of this session in flight (a GET event stream among them)
        self.last = now  # when the last of them ended


class SessionQuota:
    """At most ``per_client`` open sessions per authenticated client (see the module for what it
    counts). ``Gate`` runs it inline (``enter``, ``leave``, ``opening``) on the headers it has read
    for authentication; called, it is an ASGI middleware of its own, after a layer that sets
    ``scope["user"]``, in front of the SDK's ``app``."""

    def __init__(self, app: Any, per_client: int, idle_s: float,
                 record: Callable[[str, dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, path: str | None = None) -> None:
        self.app = app
        #: The SDK's endpoint: requests to any other path are not counted (``None``: every path).
        self.path = path
        self.per_client = per_client
        self.idle_s = idle_s
        #: Where a refusal is written (``EventBudget.write``: rate-limited), or nowhere.
        self.record = record
        self.clock = clock
        #: client id -> its open sessions, by session id (bytes, as in the header).
        self._sessions: dict[str, dict[bytes, _Session]] = {}
        #: client id -> its opening requests in flight (counted against the limit: found by
        #: attack, concurrent ``initialize`` requests all passed a check of the open sessions).
        self._opening_now: dict[str, int] = {}

    def open_sessions(self, client: str) -> int:
        """How many sessions ``client`` holds open, as counted here (expired ones dropped)."""
        sessions = self._sessions.get(client)
        if not sessions:
            return 0
        now = self.clock()
        for sid in [sid for sid, entry in sessions.items() if entry.open == 0 and now - entry.last >= self.idle_s]:
            del sessions[sid]
        return len(sessions)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The quota as a middleware of its own (``Gate`` does the same inline, on the headers it
        has read already: one layer, not two)."""
        user = scope.get("user") if scope["type"] == "http" else None
        if user is None or (self.path is not None and scope.get("path") != self.path):
            # anonymous, not HTTP, or not the SDK's endpoint: the SDK's own limit only
            await self.app(scope, receive, send)
            return
        session, version = first_headers(scope.get("headers") or ())
        if single_exchange(version):
            # No session. Found by attack: naming one of its sessions on this path, a client had its
            # 404 (an unknown method) taken for the session's end, took it off the count while the
            # SDK held it, and opened sessions without end, until every client's ``initialize`` was
            # 503; and a client at its share had such requests refused 429.
            await self.app(scope, receive, send)
            return
        client: str = user.access_token.client_id
        if session is None:
            await self.opening(client, scope, receive, send)
            return
        entry = self.enter(client, session)
        if entry is None:  # not a session counted here: nothing to end
            await self.app(scope, receive, send)
            return
        status = 0

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self.leave(client, session, entry, status, scope.get("method"))

    def enter(self, client: str, session: bytes) -> _Session | None:
        """A request of ``client`` naming ``session`` begins (not on the single-exchange path):
        the session's entry, now with this request in flight, or None when it is not counted here."""
        sessions = self._sessions.get(client)
        entry = sessions.get(session) if sessions is not None else None
        if entry is not None:
            entry.open += 1
        return entry

    def leave(self, client: str, session: bytes, entry: _Session, status: int, method: Any) -> None:
        """The request ``enter`` gave ``entry`` for has ended, answered ``status`` (0: none): the
        session is idle from now if nothing else of it is in flight, and no longer counted when
        the answer was 404 or a ``DELETE`` below 400."""
        entry.open -= 1
        entry.last = self.clock()
        if status == 404 or (method == "DELETE" and 0 < status < 400):
            self._sessions.get(client, {}).pop(session, None)

    async def opening(self, client: str, scope: Any, receive: Any, send: Any) -> None:
        """A request of ``client`` without a session id, passed on to ``app`` (answered 429 here
        when the client is at its share): it opens one if the SDK answers it below 400."""
        pending = self._opening_now.get(client, 0)
        if scope.get("method") == "POST" and self.open_sessions(client) + pending >= self.per_client:
            if self.record is not None:
                self.record(SESSIONS_REFUSED_EVENT, {"client": client, "open_sessions": self.per_client,
                                                     "setting": SETTING})
            body = _refusal_body(self.per_client)
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        counted = True  # this request is among the client's openings in flight
        opened: _Session | None = None  # the session it opened, this request in flight in it

        def settle(sid: bytes | None) -> None:
            nonlocal counted, opened
            if counted:
                counted = False
                self._opening_now[client] -= 1
                if sid is not None:  # counted as open before the client can use it
                    opened = self._sessions.setdefault(client, {})[sid] = _Session(self.clock())
                    # Not idle until this request ends, as the SDK counts it (found by attack).
                    opened.open = 1

        async def watch(message: Any) -> None:
            # Settled at the answer's start: an SSE answer's request stays open after the client
            # has the session id (found by test: it held the client's place until then).
            if message["type"] == "http.response.start":
                sid = None
                if message["status"] < 400:
                    for name, value in message.get("headers") or ():
                        if name.lower() == b"mcp-session-id":
                            sid = value
                settle(sid)
            await send(message)

        self._opening_now[client] = pending + 1
        try:
            await self.app(scope, receive, watch)
        finally:
            settle(None)
            if opened is not None:
                opened.open -= 1
                opened.last = self.clock()
