"""``serve-mcp`` over Streamable HTTP: the SDK's transport and bearer authentication, with the
clients, their tokens and their rights taken from ``[plugins.mcp.serve]``.

Each ``[[plugins.mcp.serve.clients]]`` entry names a secret reference (``token_ref``, a key of
the host's ``[secrets]``) whose value is that client's bearer token; a request carrying it runs
as that client (its principal, role, environment, scopes) and sees that client's ``tools``. A
request without a token, or with one no client has, is answered HTTP 401 (as the SDK's bearer
middleware answers it) and written to the audit log as an ``mcp.http.unauthorized`` event (the
token itself never is); a host without an audit log logs it as a warning line instead. A
session the SDK opened for one client cannot be used with another's token. An HTTP
server without clients refuses to start, unless ``allow_anonymous = true`` on a loopback address.

Limits, stated plainly: tokens are static shared secrets compared by their SHA-256 digest; there
is no OAuth authorization server, no token expiry or rotation without a restart, and no TLS here.
A deployment reachable beyond this machine puts a TLS-terminating proxy (and, for OAuth, an
authorization server issuing the tokens) in front, and keeps the port off public interfaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import hashlib
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from ..errors import AuthError, ConfigError, missing_extra

try:
    from mcp.server.auth.middleware.auth_context import auth_context_var, get_access_token
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken
    from mcp.server.transport_security import TransportSecuritySettings
except ImportError as exc:  # pragma: no cover - exercised in a venv without the extra
    raise missing_extra("mcp", exc, "amplifier_tools.mcp.http") from exc

from ..host import ToolHost
from ..redaction import SecretSet, redact
from ..secrets_table import EnvironmentSecrets
from .http_sessions import SessionQuota, first_headers, single_exchange
from .sdk_logs import redact_sdk_logs
from .server import Caller, build_server, caller_context, exposed_tools, log
from .settings import PLUGIN, ServeSettings, is_loopback

ENDPOINT: Final = "/mcp"
#: Shortest bearer token accepted: a guessable token is no authentication.
MIN_TOKEN_LENGTH: Final = 16
UNAUTHORIZED_EVENT: Final = "mcp.http.unauthorized"
#: An authenticated client called a tool it may not see (answered -32602, as for an unknown tool).
TOOL_REFUSED_EVENT: Final = "mcp.http.tool_refused"
#: Written when serving ends with refusals left out of the log since the last one written (their
#: count in ``suppressed_before``): every refusal is counted, also those of the last second.
SUPPRESSED_EVENT: Final = "mcp.http.refusals_suppressed"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ClientTokens:
    """The configured clients' bearer tokens, known by their SHA-256 digest: a token is one
    client's or nobody's. No expiry, no audience, no scopes: static shared secrets (see the module)."""

    def __init__(self, by_digest: dict[bytes, str]) -> None:
        self._by_digest = by_digest
        #: One ``AuthenticatedUser`` per client, built on its first request and then found by the
        #: token's bytes as they came (at most one entry per client: only a token that matched a
        #: client's digest is kept). Not one per request, and no hashing per request: its
        #: ``AccessToken`` is a pydantic model, whose validation is a measurable part of a call,
        #: and ``hashlib.sha256`` (OpenSSL) measured +20 to +25 µs of a served call's CPU on a
        #: shared VM (cheap in a tight loop, not between the rest of a request).
        self._users: dict[bytes, AuthenticatedUser] = {}

    def user(self, authorization: bytes | None) -> AuthenticatedUser | None:
        """The client an ``Authorization`` header value authenticates (its ``token_ref`` as the
        SDK's client id), or None: no header, not ``Bearer <token>``, or a token no client has.
        Read as the SDK's ``BearerAuthBackend`` reads it (latin-1, scheme case-insensitive)."""
        if authorization is None or authorization[:7].lower() != b"bearer ":
            return None
        sent = authorization[7:]
        user = self._users.get(sent)
        if user is None:
            token = sent.decode("latin-1")
            ref = self._by_digest.get(_digest(token))
            if ref is None:
                return None
            user = self._users[sent] = AuthenticatedUser(AccessToken(token=token, client_id=ref, scopes=[]))
        return user


def http_callers(host: ToolHost, settings: ServeSettings) -> tuple[Callable[[], Caller | None], ClientTokens | None]:
    """Who makes the current HTTP request (from the SDK's auth context, which ``Gate`` sets), and
    the clients' tokens; ``ConfigError`` naming the key when the clients are not usable as configured."""
    key = f"plugins.{PLUGIN}.serve"
    if not settings.clients:
        if not settings.allow_anonymous:
            raise ConfigError("an HTTP server needs at least one client with a bearer token",
                              key=f"{key}.clients", file=host.config_file,
                              hint=f"add [[{key}.clients]] with token_ref (a [secrets] reference) and principal; "
                                   f"or set {key}.allow_anonymous = true on a loopback host")
        if not is_loopback(settings.host):
            raise ConfigError(f"allow_anonymous serves without authentication; {settings.host!r} is not a "
                              "loopback address", key=f"{key}.allow_anonymous", file=host.config_file,
                              hint=f"set {key}.host = \"127.0.0.1\", or configure clients with tokens")
        anonymous = Caller.of(host, caller_context(host, settings, None, "mcp-http"),
                              exposed_tools(host, settings.tools, f"{key}.tools"))
        if not anonymous.tools:
            log.warning("serve-mcp: no tool is exposed; list them in [%s] tools "
                        '(tools = ["*"] exposes every mounted tool)', key)
        return (lambda: anonymous), None
    if settings.allow_anonymous:
        raise ConfigError("allow_anonymous and clients exclude each other: with clients, every request must "
                          "carry a client's token", key=f"{key}.allow_anonymous", file=host.config_file,
                          hint=f"remove {key}.allow_anonymous, or the [[{key}.clients]] entries")
    resolve = host.capabilities["session.secret"]
    by_digest: dict[bytes, str] = {}
    callers: dict[str, Caller] = {}
    for index, client in enumerate(settings.clients):
        where = f"{key}.clients[{index}]"
        try:
            token = resolve(client.token_ref)
        except AuthError:
            raise _unresolved(host, client.token_ref, f"{where}.token_ref") from None
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"the token of {client.token_ref!r} is {len(token)} characters; at least "
                              f"{MIN_TOKEN_LENGTH} are needed", key=f"{where}.token_ref", file=host.config_file,
                              hint="generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if not all("!" <= char <= "~" for char in token):
            raise ConfigError(f"the token of {client.token_ref!r} holds a space, a control character or a "
                              "character beyond ASCII: an Authorization header cannot carry it as it is, so "
                              "no request could ever match it", key=f"{where}.token_ref", file=host.config_file,
                              hint="generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        digest = _digest(token)
        if digest in by_digest:
            raise ConfigError(f"the token of {client.token_ref!r} is also {by_digest[digest]!r}'s; each "
                              "client needs its own", key=f"{where}.token_ref", file=host.config_file,
                              hint="give one of the two variables another token; generate one with: "
                                   "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        by_digest[digest] = client.token_ref
        tools = client.tools if client.tools is not None else settings.tools
        setting = f"{where}.tools" if client.tools is not None else f"{key}.tools"
        callers[client.token_ref] = Caller.of(host, caller_context(host, settings, client, "mcp-http"),
                                              exposed_tools(host, tools, setting))
        if not callers[client.token_ref].tools:
            log.warning("serve-mcp: client %r is exposed no tool; list them in %s "
                        '(tools = ["*"] exposes every mounted tool)', client.token_ref, setting)

    def current() -> Caller | None:
        token = get_access_token()
        return callers.get(token.client_id) if token is not None else None

    return current, ClientTokens(by_digest)


def _unresolved(host: ToolHost, ref: str, key: str) -> ConfigError:
    """The error for a ``token_ref`` that does not resolve: the reason of the host's ``[secrets]``
    table (the key missing, or the variable unset, named), never the reference itself, which may
    be the token, written in by mistake or by a ``${VAR}`` substitution."""
    reason, hint = EnvironmentSecrets(host.config.get("secrets") or {}).why_missing(ref)
    return ConfigError(f"the token_ref {reason}", key=key, hint=hint, file=host.config_file)


#: The answers recorded as refusals, and why (404 only for a request naming a session, on the
#: SDK's session path).
REFUSALS: Final = {401: "no bearer token, one no client has, or more than one Authorization header",
                   403: "refused by the Origin check",
                   404: "a session that does not exist, or was opened with another token",
                   # answered by the server's protocol, not the app (``_read_timed_protocol``)
                   408: "the request body stalled: no byte of it within the body timeout",
                   413: "a request body past max_message_bytes",
                   421: "refused by the Host check (DNS rebinding protection)",
                   # the SDK's; the drain's own 503 is Gate's, not watched (found by attack: a
                   # client shut out by a full max_sessions was refused with nothing in the log)
                   503: "max_sessions sessions are open: no new one"}
#: Most refusal events written per second; the rest are counted in the next one written.
MAX_REFUSAL_EVENTS_PER_S: Final = 10
#: Longest method and path written into a refusal event (both are the client's choice).
MAX_FIELD_CHARS: Final = 64
#: Seconds open requests get to finish once stopping; then they are cancelled.
SHUTDOWN_GRACE_S: Final = 10.0
#: Once stopping, how long no request may have been open before the listener closes: a client's
#: follow-up to a result (the SDK client lists tools after a call) still gets in.
DRAIN_QUIET_S: Final = 0.25


#: How much of a client-sent value ``_clip`` redacts: what it shows, and room for a secret that
#: starts there to end (a secret longer than this that starts in the shown part is not found).
REDACT_WINDOW: Final = MAX_FIELD_CHARS + 4096
#: Characters searched past what is shown, for a secret that starts in the shown part to end.
REDACT_ROOM: Final = REDACT_WINDOW - MAX_FIELD_CHARS


def _redacted_head(text: str, show: int, secrets: SecretSet | None) -> str:
    """``text`` redacted of ``secrets`` and credential shapes, whole when it is at most ``show +
    REDACT_ROOM`` characters; else a head of at most its first ``show`` characters, redacted as
    the whole text would be. (Found by attack: cut after a redaction, a credential-shaped run of
    4,000 characters became ``[REDACTED]`` and brought into view the token that straddled the
    searched window, unfound, whole with the unsearched rest appended, its head otherwise.) The
    head is where the first ``show`` characters and the first ``show + REDACT_ROOM`` redact
    alike: a secret crossing the ``show`` boundary is cut short in the one and redacted in the
    other, and nothing past it is in the first."""
    found = secrets if secrets is not None else ()
    whole = str(redact(text[:show + REDACT_ROOM], secrets=found, patterns=True))
    if len(text) <= show + REDACT_ROOM:
        return whole
    head = str(redact(text[:show], secrets=found, patterns=True))
    same = 0
    for ours, theirs in zip(head, whole, strict=False):
        if ours != theirs:
            break
        same += 1
    return head[:same]


def _clip(value: Any, secrets: SecretSet | None) -> str | None:
    """``value`` as text of at most ``MAX_FIELD_CHARS``, redacted first (the host's secrets, the
    clients' tokens among them, and credential shapes): cut first, a token's head would no longer
    be the token a redaction finds. Only ``REDACT_WINDOW`` characters are searched: a client's
    4 MB tool name costs no more than a short one (the refusal may not even be written)."""
    if value is None:
        return None
    text = str(value)
    shown = _redacted_head(text, MAX_FIELD_CHARS, secrets)
    if len(text) <= MAX_FIELD_CHARS and len(shown) <= MAX_FIELD_CHARS:
        return shown
    return shown[:MAX_FIELD_CHARS] + f"...[{len(text)} chars]"


class EventBudget:
    """At most ``MAX_REFUSAL_EVENTS_PER_S`` refusal events a second, shared by every kind of
    refusal; the next event written counts those left out (``suppressed_before``)."""

    def __init__(self, record: Callable[[str, dict[str, Any]], Any] | None,
                 clock: Callable[[], float] = time.monotonic, secrets: SecretSet | None = None) -> None:
        self.record = record
        self.clock = clock
        #: Redacted from what a client sent before it is clipped into an event (``_clip``).
        self.secrets = secrets
        self._second = -1
        self._written = 0
        self._suppressed = 0

    def _admit(self) -> bool:
        second = int(self.clock())
        if second != self._second:
            self._second, self._written = second, 0
        if self._written >= MAX_REFUSAL_EVENTS_PER_S:
            self._suppressed += 1
            return False
        self._written += 1
        return True

    def take(self) -> int | None:
        """One event's place in this second's budget: None when it is spent (the event is counted
        as left out), else how many were left out since the last one taken."""
        if not self._admit():
            return None
        left_out, self._suppressed = self._suppressed, 0
        return left_out

    def flush(self) -> None:
        """Record how many refusals were left out since the last one written, if any (serving
        ends: found by attack, the refusals of the last second were counted nowhere)."""
        left_out, self._suppressed = self._suppressed, 0
        if left_out and self.record is not None:
            self.record(SUPPRESSED_EVENT, {"suppressed_before": left_out})

    def write(self, event: str, data: dict[str, Any]) -> None:
        """Record ``event`` unless this second's budget is spent."""
        if self.record is None:
            return
        left_out = self.take()
        if left_out is None:
            return
        if left_out:
            data["suppressed_before"] = left_out
        self.record(event, data)

    def tool_refused(self, caller: Caller | None, tool: str) -> None:
        """An authenticated client named a tool outside its ``tools`` (or no tool at all)."""
        if caller is None:
            return
        context = caller.context
        self.write(TOOL_REFUSED_EVENT, {"reason": "a tool this client may not see, or no such tool",
                                        "principal": context.principal,
                                        "client": context.attributes.get("mcp_client"),
                                        "tool": _clip(tool, self.secrets)})


def log_refusal(event: str, data: dict[str, Any], secrets: SecretSet | None = None) -> None:
    """Where refusals go when the host has no audit log (the audit plugin is off): one warning line
    each, under the same budgets as the audit events. The fields are one JSON object (ASCII only:
    every control character and non-ASCII character escaped), so what a client chose (method,
    path, tool name; clipped before) cannot move the cursor or forge a line, and a log reader
    parses it without guessing at quotes; redacted as the audit event would be (the host's
    secrets, among them the clients' tokens, and credential shapes), so a token sent in the path
    is not written out."""
    data = redact(data, secrets=secrets if secrets is not None else (), patterns=True)
    fields = json.dumps(data, ensure_ascii=True, default=repr)
    log.warning("serve-mcp: %s: %s (the host has no audit log to keep it: enable the audit plugin, "
                "[plugins.audit])", event, fields)


#: What a request without a client's token is answered (the body and header the SDK's
#: ``RequireAuthMiddleware`` sends).
_UNAUTHORIZED_BODY: Final = b'{"error": "invalid_token", "error_description": "Authentication required"}'
_UNAUTHORIZED_HEADERS: Final = (
    (b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED_BODY)).encode()),
    (b"www-authenticate", b'Bearer error="invalid_token", error_description="Authentication required"'))


class Gate:
    """The one ASGI middleware in front of the SDK's Streamable HTTP app. One layer, not six:
    the SDK's three bearer-auth middlewares (with Starlette's per-request header parsing) and our
    refusal audit and drain as two more cost ≈ 11 µs of a ≈ 66 µs call overhead (docs/mcp.md); the
    session quota as a sixth, with its own reading of the headers and its own watch of the
    answer, ≈ 175 more bytecodes a call (docs/performance.md, session 40). It reads the headers
    once, for all of them.

    - **Authentication** (with ``tokens``, i.e. clients configured): every HTTP request needs an
      ``Authorization: Bearer <token>`` of one client, else it is answered 401 with the body and
      ``WWW-Authenticate`` header the SDK's ``RequireAuthMiddleware`` sends — on every path, not
      only ``/mcp``. The request then carries the SDK's ``AuthenticatedUser`` in ``scope["user"]``
      (the SDK's session manager binds each session to it: another client's token gets 404) and
      in the SDK's auth context (``get_access_token``), as the SDK's own middlewares set them;
      its ``Authorization`` header is taken out of the headers the SDK's app sees (the token
      goes no further; a header pair that is not a tuple is left in).
    - **Session quota** (``quota``, with clients): each client's share of the SDK's sessions,
      counted as ``SessionQuota`` describes, for authenticated requests to its path.
    - **Refusal audit**: 401, 403 (Origin), 413 (body too long), 421 (Host), 503 (``max_sessions``
      full), 404 for a request naming a session, and 408 (a stalled body, which the server's
      protocol answers and reports to ``body_stalled``) are
      written as ``mcp.http.unauthorized`` events: the status, why, the method and path (clipped
      to ``MAX_FIELD_CHARS``), the peer's address, whether a bearer token came — never the
      token — and, past authentication, the ``client`` (its ``token_ref``). At most
      ``MAX_REFUSAL_EVENTS_PER_S`` a second are written (``EventBudget``), so nobody fills the
      disk through the log; the 401s have a budget of their own, so a flood without a token
      cannot hide a client's refusals. Authentication comes first: a request without a token is
      a 401, recorded, also while draining. Built by ``build_app`` for a host without an audit
      log, the 401s (and ``build_server``'s tool refusals) go to ``log_refusal``, a warning line
      each under the same budgets, and the app's answers are not watched (``watch_answers``):
      the SDK's loggers report a refused Host or Origin and a session used with another token.
    - **Drain**: it counts open requests (not the long-lived GET event streams) and, once
      ``draining``, answers a request that opens a new session (no ``mcp-session-id``) with 503,
      while requests of open sessions still come in — a call in flight gets its result, and the
      client's next request (the SDK client lists tools after a call) its answer. ``idle``
      returns once no request has been open for ``DRAIN_QUIET_S``, or at a deadline.
    """

    def __init__(self, app: Any, tokens: ClientTokens | None, budget: EventBudget,
                 strangers: EventBudget | None = None, clock: Callable[[], float] = time.monotonic, *,
                 watch_answers: bool = True, quota: SessionQuota | None = None) -> None:
        self.app = app
        self.tokens = tokens
        #: Refusals of requests that passed authentication (and the tool refusals of
        #: ``build_server``); ``strangers``: the 401s, under a budget of their own, so a flood
        #: without a token cannot crowd a client's refusals out of the log.
        self.budget = budget
        self.strangers = strangers if strangers is not None else EventBudget(budget.record, budget.clock,
                                                                                        budget.secrets)
        self.clock = clock
        #: Whether the app's answers are watched for refusals (403, 421, 404) to record: with an
        #: audit log; without one, the SDK's own log lines report them.
        self.watch_answers = watch_answers
        #: Each client's share of the sessions, counted here (authenticated requests to its
        #: ``path`` only): one layer with this one, on the headers read once.
        self.quota = quota
        self.draining = False
        self._open = 0
        self._changed = clock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: Any = scope.get("headers") or ()
        if headers.__class__ is not list and headers.__class__ is not tuple:  # any iterable, says ASGI
            headers = scope["headers"] = list(headers)
        # ASGI servers lowercase header names. Read once, for authentication, the drain and the
        # quota, by ``dict`` (in C), not by a loop of our own over every header (≈ 100 bytecodes a
        # request); only when a name came twice are the first of each found by a loop and the
        # Authorization headers counted.
        by_name = dict(headers)
        authorization = by_name.get(b"authorization")
        if len(by_name) == len(headers):
            session, version, repeated = by_name.get(b"mcp-session-id"), by_name.get(b"mcp-protocol-version"), False
        else:
            session, version = first_headers(headers)
            repeated = authorization is not None and sum(name == b"authorization" for name, _ in headers) > 1
        # a 2026-07-28 request has no session, whatever id it names
        single = single_exchange(version)
        reset = user = None
        if self.tokens is not None:
            # Two Authorization headers are no credential: which one a proxy adds, and which one
            # wins, is not for this server to guess.
            user = None if repeated else self.tokens.user(authorization)
            if user is None:
                self._refused(self.strangers, scope, 401, authorization, None)
                # A message of its own each time: middleware wrapping ours may add headers in place.
                await send({"type": "http.response.start", "status": 401, "headers": list(_UNAUTHORIZED_HEADERS)})
                await send({"type": "http.response.body", "body": _UNAUTHORIZED_BODY})
                return
            # The token goes no further than here (one header fewer for each of the SDK's header
            # lookups to pass: found by count, ≈ 80 bytecodes a request).
            try:
                at = headers.index((b"authorization", authorization))
            except ValueError:  # a pair that is no tuple (ASGI allows any iterable): left in
                pass
            else:
                headers = scope["headers"] = headers[:at] + headers[at + 1:]
        counted = scope.get("method") != "GET"
        # found by attack: naming a made-up session on the single-exchange path, a client had new
        # calls started while the server drained
        if counted and self.draining and (session is None or single):
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": b"the server is shutting down\n"})
            return
        entry = None
        client = ""
        quota = self.quota if user is not None and not single else None
        if user is not None:
            scope["user"] = user
            reset = auth_context_var.set(user)
            if quota is not None and (quota.path is None or scope.get("path") == quota.path):
                client = user.access_token.client_id
                if session is not None:
                    entry = quota.enter(client, session)
            else:
                quota = None
        watching = self.watch_answers and self.budget.record is not None
        status = 0
        watch: Callable[[Any], Awaitable[None]] = send
        if watching or entry is not None:
            def watch(message: Any) -> Awaitable[None]:
                # Not a coroutine of its own: the app awaits ``send``'s (one frame fewer per message).
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    # a 404 of the SDK's single-exchange path is an unknown method, no session's
                    if watching and status in REFUSALS and (status != 404 or (session is not None and not single)):
                        self._refused(self.budget, scope, status, authorization, user)
                return send(message)  # type: ignore[no-any-return]
        if counted:
            self._open += 1  # ``_changed`` is set as it ends: ``idle`` waits while any is open
        try:
            if quota is not None and session is None:
                await quota.opening(client, scope, receive, watch)
            else:
                await self.app(scope, receive, watch)
        finally:
            if reset is not None:
                auth_context_var.reset(reset)
            if entry is not None and quota is not None and session is not None:
                quota.leave(client, session, entry, status, scope.get("method"))
            if counted:
                self._open -= 1
                self._changed = self.clock()

    @staticmethod
    def _refused(budget: EventBudget, scope: Any, status: int, authorization: bytes | None,
                 user: AuthenticatedUser | None) -> None:
        if budget.record is None:
            return
        peer = scope.get("client")
        secrets = budget.secrets
        data = {"status": status, "reason": REFUSALS[status], "method": _clip(scope.get("method"), secrets),
                "path": _clip(scope.get("path"), secrets), "client_address": f"{peer[0]}:{peer[1]}" if peer else None,
                "bearer_token_sent": user is not None or (authorization is not None
                                                          and authorization[:7].lower() == b"bearer ")}
        if user is not None:
            data["client"] = user.access_token.client_id  # the token_ref of the client refused
        budget.write(UNAUTHORIZED_EVENT, data)

    def body_stalled(self, scope: Any) -> None:
        """Record that the request of ``scope`` (as this layer saw it) was answered 408 by the
        server's protocol, its body stalled: a refusal like the others, under the budget of its
        client's refusals (the 401s' without a client)."""
        user = scope.get("user")
        self._refused(self.budget if user is not None else self.strangers, scope, 408, None, user)

    def flush(self) -> None:
        """Count, in the log, the refusals of both budgets left out since their last event."""
        for budget in (self.budget, self.strangers):
            try:
                budget.flush()
            except Exception:  # the log may be unwritable by now: the count is what is lost
                log.exception("serve-mcp: could not record the count of refusals left out of the log")

    async def idle(self, deadline: float) -> bool:
        """Return once no request has been open for ``DRAIN_QUIET_S`` (True), or at ``deadline``
        (of ``clock``; False)."""
        while self.clock() < deadline:
            if self._open == 0 and self.clock() - self._changed >= DRAIN_QUIET_S:
                return True
            await asyncio.sleep(0.02)
        return False


#: The SDK's loggers that write a line per refused request (``Invalid Host header: <the header>``,
#: a session used with another token), with what the client sent in it.
REFUSAL_LOGGERS: Final = ("mcp.server.transport_security", "mcp.server.streamable_http_manager",
                          "mcp.server.streamable_http")
#: Longest such log line kept (the rest is cut, saying how much).
MAX_LOG_LINE_CHARS: Final = 200


class RefusalLogFilter(logging.Filter):
    """What the SDK logs about requests, made safe for the operator's console: at most
    ``MAX_REFUSAL_EVENTS_PER_S`` lines a second of each logger and level (the next line kept
    counts those left out; a flood of one kind, say 421s, cannot hide the errors of another),
    clipped to ``MAX_LOG_LINE_CHARS``, every character that is not printable escaped (a client's
    header cannot move the cursor or forge a line), redacted first of ``secrets`` (the clients'
    tokens among them) and credential shapes, as the audit events are: found by attack, a client's
    token sent in its ``Origin`` or ``Host`` header was written to stderr as it came. The audit log
    has the refusals in full."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, secrets: SecretSet | None = None) -> None:
        super().__init__()
        self._clock = clock
        self._secrets = secrets
        #: One budget per (logger, level): a few loggers and levels, so a few budgets.
        self._budgets: dict[tuple[str, int], EventBudget] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno)
        budget = self._budgets.get(kind)
        if budget is None:
            budget = self._budgets[kind] = EventBudget(None, self._clock)
        suppressed = budget.take()
        if suppressed is None:
            return False
        message = record.getMessage()
        # redacted before it is cut (a token cut in two is no longer found), of the part shown only
        shown = _redacted_head(message, MAX_LOG_LINE_CHARS, self._secrets)
        text = "".join(char if char.isprintable() else repr(char)[1:-1] for char in shown)
        if len(text) > MAX_LOG_LINE_CHARS or len(shown) < len(message) > MAX_LOG_LINE_CHARS + REDACT_ROOM:
            text = text[:MAX_LOG_LINE_CHARS] + f"...[{max(len(text), len(message))} chars]"
        if suppressed:
            text += f" ({suppressed} more such lines left out before this one)"
        record.msg, record.args = text, ()
        return True


def filter_refusal_logs(secrets: SecretSet | None = None) -> Callable[[], None]:
    """Put a ``RefusalLogFilter`` (redacting ``secrets``) on the SDK's ``REFUSAL_LOGGERS``; the
    function that takes it off."""
    guard = RefusalLogFilter(secrets=secrets)
    loggers = [logging.getLogger(name) for name in REFUSAL_LOGGERS]
    for logger in loggers:
        logger.addFilter(guard)

    def remove() -> None:
        for logger in loggers:
            logger.removeFilter(guard)

    return remove


def _url_host(host: str) -> str:
    """``host`` as it appears in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def transport_security(host: str) -> TransportSecuritySettings | None:
    """The SDK's DNS-rebinding protection for any loopback ``host`` (the SDK turns it on only for
    ``127.0.0.1``, ``localhost`` and ``::1``): only this host's names in Host and Origin. None
    for other hosts, where every request needs a client's token anyway."""
    if not is_loopback(host):
        return None
    own = _url_host(host)
    names = [own, *sorted({"127.0.0.1", "localhost", "[::1]"} - {own})]
    # With and without a port: a client leaves out the default one (port 80 is ``Host: 127.0.0.1``).
    # The patterns with a port first, this host's first of all: the SDK tries the patterns in this
    # order once no name matched exactly, and a client's Host usually carries the port.
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[*(f"{name}:*" for name in names), *names],
                                     allowed_origins=[*(f"http://{name}" for name in names),
                                                      *(f"http://{name}:*" for name in names)])


def build_app(host: ToolHost, settings: ServeSettings) -> Gate:
    """The ASGI application serving ``host``'s tools at ``/mcp`` (``ConfigError`` as above):
    the SDK's Streamable HTTP app behind ``Gate``."""
    caller, tokens = http_callers(host, settings)
    if not is_loopback(settings.host):
        log.warning("serve-mcp: serving plain HTTP on %s: bearer tokens cross the network unencrypted; put a "
                    "TLS-terminating reverse proxy in front and keep this port off public interfaces "
                    "(docs/mcp.md, limits of the authentication)", settings.host)
    record = host.capabilities.get("audit.event")
    # Without an audit log, the 401s and tool refusals (which nothing else reports) are logged; the
    # SDK's own answers are not watched: its loggers report a refused Host or Origin and a session
    # used with another token (an unknown session's 404 only at INFO).
    watch = record is not None
    secrets = host.capabilities.get("session.secrets")
    if record is None:
        record = functools.partial(log_refusal, secrets=secrets)
    budget = EventBudget(record, secrets=secrets)
    server = build_server(host, settings, caller, on_refused=budget.tool_refused)
    # One bound for a client's message on both transports (the SDK's own default here was 4 MiB).
    app = server.streamable_http_app(streamable_http_path=ENDPOINT, host=settings.host,
                                     transport_security=transport_security(settings.host),
                                     max_request_body_size=settings.max_message_bytes,
                                     session_idle_timeout=settings.session_idle_s,
                                     max_sessions=settings.max_sessions)
    quota = SessionQuota(app, settings.max_sessions_per_client, settings.session_idle_s, budget.write, path=ENDPOINT)
    return Gate(app, tokens, budget, EventBudget(record, secrets=secrets), watch_answers=watch, quota=quota)


#: Seconds a connection gets to send a whole request head, from its start or from the end of its
#: last answer; then it is closed.
REQUEST_HEAD_TIMEOUT_S: Final = 10.0
#: Seconds a request's body may go without a byte read (nginx's ``client_body_timeout``: between
#: two reads, not for the whole body, so a slow but steady upload is not cut); then it is answered
#: 408 and its connection closed.
REQUEST_BODY_TIMEOUT_S: Final = 10.0
_TIMEOUT_BODY: Final = b"no byte of the request body came for a while: the request is dropped\n"
_TIMEOUT_HEADERS: Final = ((b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                           (b"content-length", str(len(_TIMEOUT_BODY)).encode()))


def _read_timed_protocol(on_stalled: Callable[[Any], None] | None = None) -> type:
    """uvicorn's h11 protocol with one read timer: a connection that has not sent a whole request
    head within ``REQUEST_HEAD_TIMEOUT_S`` is closed, and a request whose body has had no byte for
    ``REQUEST_BODY_TIMEOUT_S`` is answered 408 (``on_stalled`` gets its ASGI scope, to record it)
    and its connection closed. Found by attack, before any token is checked: uvicorn has no such
    timeout (its keep-alive timer runs only between requests, and any byte received stops it), so
    connections that sent half a request head were held for ever; under ``ulimit -n 256``, 300 of
    them from a client without a token made the accept loop fail (``EMFILE``) and a client with a
    valid token got no answer until the attacker let go. Found by attack, past the token: a client
    that sent a head and then stopped sending its body (or sent a byte now and then) held its
    connection, and the SDK's request buffer, for ever.

    Its cost on a request: what the head's timer cost before, one ``cancel`` (the head's timer
    becomes the body's when a body is to come) and a state read as the head is in; a body in
    several reads notes the time of each, and the timer, not re-armed per read, looks at that
    time when it fires. Time the server is not reading (its buffer full while the app has
    not taken it, or a ``100-continue`` not yet sent) does not count against the client."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ReadTimedH11Protocol(H11Protocol):
        _read_timer: asyncio.TimerHandle | None = None
        #: The loop's time of the body's last read while one is awaited, else None.
        _body_read_at: float | None = None

        def _arm_read_timer(self, seconds: float) -> None:
            self._disarm_read_timer()
            self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

        def _disarm_read_timer(self) -> None:
            self._body_read_at = None
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _await_body(self) -> None:
            now = self.loop.time()
            timer = self._read_timer
            # The head's timer, armed already, serves when it fires no later than the body's would:
            # a request whose body comes in the read after its head makes no timer of its own, and
            # costs one ``cancel``, as before there was a body timer.
            if timer is None or timer.when() > now + REQUEST_BODY_TIMEOUT_S:
                self._arm_read_timer(REQUEST_BODY_TIMEOUT_S)
            self._body_read_at = now

        def _request_began(self) -> None:
            """A whole request head came (its request runs): the body's timer, if a body is to come."""
            if self.conn.their_state is h11.SEND_BODY:
                self._await_body()
            else:
                self._disarm_read_timer()

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if self.transport.is_closing():
                return
            read_at, cycle = self._body_read_at, self.cycle
            if read_at is not None:
                if self.flow.read_paused or cycle.waiting_for_100_continue:  # the server is not reading
                    self._await_body()
                    return
                waited = self.loop.time() - read_at
                if waited < REQUEST_BODY_TIMEOUT_S:  # read since: wait from that read
                    self._read_timer = self.loop.call_later(REQUEST_BODY_TIMEOUT_S - waited, self._read_timed_out)
                    return
                if not cycle.response_started and self.conn.our_state is h11.SEND_RESPONSE:
                    if on_stalled is not None:
                        on_stalled(cycle.scope)
                    for event in (h11.Response(status_code=408, headers=list(_TIMEOUT_HEADERS),
                                               reason=b"Request Timeout"),
                                  h11.Data(data=_TIMEOUT_BODY), h11.EndOfMessage()):
                        self.transport.write(self.conn.send(event))
                # the app reading the body gets ``http.disconnect``; its answer, if any, is dropped
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_read_timer(REQUEST_HEAD_TIMEOUT_S)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_read_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:
                self._request_began()
            elif self._body_read_at is not None:
                if self.conn.their_state is h11.SEND_BODY:
                    self._body_read_at = self.loop.time()
                else:  # the body is in
                    self._disarm_read_timer()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.transport.is_closing():
                return
            if self.cycle is cycle:  # waiting for the next head (or the rest of a body nobody reads)
                self._arm_read_timer(REQUEST_HEAD_TIMEOUT_S)
            else:  # a pipelined request's head was waiting: it runs
                self._request_began()

    return ReadTimedH11Protocol


def _listen(settings: ServeSettings, file: str | None = None) -> socket.socket:
    """The listening socket (bound here, so a port in use is a ``ConfigError``, not uvicorn's exit),
    the error naming the configuration ``file`` and the key (``serve_configured`` names the
    command-line option instead when the value came from there)."""
    try:
        family = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((settings.host, settings.port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {_url_host(settings.host)}:{settings.port}: {exc.strerror or exc}",
                          key=f"plugins.{PLUGIN}.serve.port" if isinstance(exc, PermissionError)
                          or exc.errno == errno.EADDRINUSE else f"plugins.{PLUGIN}.serve.host", file=file,
                          hint=f"choose a free port (--port, or port in [plugins.{PLUGIN}.serve]; 0 for any), and "
                               f"an address of this machine (--host, or host in [plugins.{PLUGIN}.serve])") from None


async def serve_http(host: ToolHost, settings: ServeSettings, ready: Callable[[str], None] | None = None,
                     stop: asyncio.Event | None = None, *, freeze_heap: bool = False) -> None:
    """Serve until ``stop`` is set (without one: until SIGINT or SIGTERM; a second one stops at
    once) or the task is cancelled, then shut down: open requests get ``SHUTDOWN_GRACE_S`` to
    finish, sessions close, and it returns. ``ready`` gets the endpoint URL once listening; by
    default it is printed to stderr. ``ConfigError`` when the address cannot be listened on.

    ``freeze_heap`` (``serve-mcp`` sets it: the process is the server's): once listening, collect
    and ``gc.freeze()`` what start-up left (the host, its plugins, the SDK, uvicorn: ≈ 95,000
    tracked objects), so the cyclic collector's full collections no longer walk it on a request;
    unfrozen when serving ends, unless the process had frozen objects of its own before (they
    cannot be told apart, so they all stay frozen). Measured (one process serving 6,000 calls): without it each full
    collection took 35-69 ms of one request, 27-43 µs a call on average (docs/mcp.md)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # signals are ours: they set ``stop``
            yield

    app = build_app(host, settings)
    sock = _listen(settings, host.config_file)
    # proxy_headers off: X-Forwarded-For from any local client would otherwise set the address
    # the audit events show.
    server = Server(uvicorn.Config(app, http=_read_timed_protocol(app.body_stalled), log_level="warning",
                                   lifespan="on", proxy_headers=False,
                                   timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S)))
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    forced = asyncio.Event()  # a second signal: stop waiting for anything
    if stop is None:
        stop = asyncio.Event()
        signalled = stop

        def on_signal() -> None:
            if signalled.is_set():
                server.force_exit = True  # the second signal: do not wait for open requests
                forced.set()
            signalled.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, on_signal)
                handled.append(signum)
            except (ValueError, RuntimeError, NotImplementedError):
                pass  # only the main thread takes signals; elsewhere a caller stops us by cancelling the task
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    stopping = asyncio.ensure_future(stop.wait())
    forcing = asyncio.ensure_future(forced.wait())
    frozen = False
    secrets = host.capabilities.get("session.secrets")
    unfilter_logs = filter_refusal_logs(secrets)
    unredact_logs = redact_sdk_logs(secrets if secrets is not None else ())  # the SDK's DEBUG lines: whole messages
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            if freeze_heap:
                # gc.unfreeze() thaws everything: only a heap nobody froze before is thawed after
                frozen = gc.get_freeze_count() == 0
                gc.collect()
                gc.freeze()
            port = sock.getsockname()[1]
            url = f"http://{_url_host(settings.host)}:{port}{ENDPOINT}"
            if ready is not None:
                ready(url)
            else:
                print(f"amplifier-tools serve-mcp: serving at {url} (Streamable HTTP)", file=sys.stderr, flush=True)
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            # Still listening while open requests finish: closing the listener first (uvicorn's
            # shutdown) left a client unable to send the request that follows a result.
            started = app.clock()
            app.draining = True
            idle = asyncio.ensure_future(app.idle(started + SHUTDOWN_GRACE_S))
            # found by attack: a second signal during this drain waited it out (10 s), then the host's grace
            await asyncio.wait({task, idle, forcing}, return_when=asyncio.FIRST_COMPLETED)
            idle.cancel()
            # Quiet: what is still connected is event streams and idle keep-alives, with no call to
            # wait for; a second is enough to end them (found by attack: an idle SDK client kept
            # the server up 5-6 s, a held event stream the whole 10 s).
            quiet = idle.done() and not idle.cancelled() and idle.result()
            server.config.timeout_graceful_shutdown = 1 if quiet else \
                max(1, int(SHUTDOWN_GRACE_S - (app.clock() - started)))
        server.should_exit = True
        await asyncio.wait({task, forcing}, return_when=asyncio.FIRST_COMPLETED)
        app.flush()
        if forced.is_set():
            # Calls still running are cut now (each recorded), not after shutdown_grace_ms; and
            # before uvicorn is waited for: on 3.12 its listener's wait_closed() waits for their
            # connections, so a forced stop still took the rest of the 10 s (found on CI, py312).
            await host.close(grace_ms=0)
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await asyncio.wait({task}, timeout=SHUTDOWN_GRACE_S + 5)
        app.flush()
        raise
    finally:
        def unguard_logs(_: object = None) -> None:
            unredact_logs()
            unfilter_logs()

        if task.done():
            unguard_logs()
        else:  # uvicorn still shutting down (cut by a second cancellation): its last records guarded too
            task.add_done_callback(unguard_logs)  # both filters (found by review: the refusal one went at once)
        if frozen:
            gc.unfreeze()
        stopping.cancel()
        forcing.cancel()
        sock.close()
        for signum in handled:
            loop.remove_signal_handler(signum)
