"""``serve-mcp`` over Streamable HTTP: the SDK's transport and bearer authentication, with the
clients, their tokens and their rights taken from ``[plugins.mcp.serve]``.

Each ``[[plugins.mcp.serve.clients]]`` entry names a secret reference (``token_ref``, a key of
the host's ``[secrets]``) whose value is that client's bearer token; a request carrying it runs
as that client (its principal, role, environment, scopes) and sees that client's ``tools``. A
request without a token, or with one no client has, is answered HTTP 401 by the SDK's bearer
middleware and written to the audit log as an ``mcp.http.unauthorized`` event (the token itself
never is). A session the SDK opened for one client cannot be used with another's token. An HTTP
server without clients refuses to start, unless ``allow_anonymous = true`` on a loopback address.

Limits, stated plainly: tokens are static shared secrets compared by their SHA-256 digest; there
is no OAuth authorization server, no token expiry or rotation without a restart, and no TLS here.
A deployment reachable beyond this machine puts a TLS-terminating proxy (and, for OAuth, an
authorization server issuing the tokens) in front, and keeps the port off public interfaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from ..errors import AuthError, ConfigError
from ..host import ToolHost
from .server import Caller, build_server, caller_context, exposed_tools
from .settings import PLUGIN, ServeSettings, is_loopback

log = logging.getLogger("amplifier_tools.mcp")

ENDPOINT: Final = "/mcp"
#: Shortest bearer token accepted: a guessable token is no authentication.
MIN_TOKEN_LENGTH: Final = 16
UNAUTHORIZED_EVENT: Final = "mcp.http.unauthorized"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class ClientTokens:
    """The SDK's ``TokenVerifier`` for the configured clients: a token is known or it is not."""

    def __init__(self, by_digest: dict[bytes, str]) -> None:
        self._by_digest = by_digest

    async def verify_token(self, token: str) -> AccessToken | None:
        """The client whose token this is (its ``token_ref`` as the client id), or None."""
        ref = self._by_digest.get(_digest(token))
        if ref is None:
            return None
        return AccessToken(token=token, client_id=ref, scopes=[])


def http_callers(host: ToolHost, settings: ServeSettings) -> tuple[Callable[[], Caller | None], ClientTokens | None]:
    """Who makes the current HTTP request (from the SDK's authenticated token), and the token
    verifier; ``ConfigError`` naming the key when the clients are not usable as configured."""
    key = f"plugins.{PLUGIN}.serve"
    if not settings.clients:
        if not settings.allow_anonymous:
            raise ConfigError("an HTTP server needs at least one client with a bearer token",
                              key=f"{key}.clients",
                              hint=f"add [[{key}.clients]] with token_ref (a [secrets] reference) and principal; "
                                   f"or set {key}.allow_anonymous = true on a loopback host")
        if not is_loopback(settings.host):
            raise ConfigError(f"allow_anonymous serves without authentication; {settings.host!r} is not a "
                              "loopback address", key=f"{key}.allow_anonymous",
                              hint=f"set {key}.host = \"127.0.0.1\", or configure clients with tokens")
        anonymous = Caller(caller_context(host, settings, None, "mcp-http"),
                           exposed_tools(host, settings.tools, f"{key}.tools"))
        return (lambda: anonymous), None
    if settings.allow_anonymous:
        raise ConfigError("allow_anonymous and clients exclude each other: with clients, every request must "
                          "carry a client's token", key=f"{key}.allow_anonymous")
    resolve = host.capabilities["session.secret"]
    by_digest: dict[bytes, str] = {}
    callers: dict[str, Caller] = {}
    for index, client in enumerate(settings.clients):
        where = f"{key}.clients.{index}"
        try:
            token = resolve(client.token_ref)
        except AuthError as exc:
            raise ConfigError(f"{exc.message}: add it to the host's [secrets] and set the variable",
                              key=f"{where}.token_ref") from None
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"the token of {client.token_ref!r} is {len(token)} characters; at least "
                              f"{MIN_TOKEN_LENGTH} are needed", key=f"{where}.token_ref",
                              hint="generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if _digest(token) in by_digest:
            raise ConfigError(f"the token of {client.token_ref!r} is also {by_digest[_digest(token)]!r}'s; each "
                              "client needs its own", key=f"{where}.token_ref")
        by_digest[_digest(token)] = client.token_ref
        tools = client.tools if client.tools is not None else settings.tools
        callers[client.token_ref] = Caller(caller_context(host, settings, client, "mcp-http"),
                                           exposed_tools(host, tools, f"{where}.tools" if client.tools is not None
                                                         else f"{key}.tools"))

    def current() -> Caller | None:
        token = get_access_token()
        return callers.get(token.client_id) if token is not None else None

    return current, ClientTokens(by_digest)


class RefusalAudit:
    """ASGI middleware recording every HTTP 401/403 answer as an audit event (method, path, the
    client's address, whether a bearer token came; never the token)."""

    def __init__(self, app: Any, record: Callable[[str, dict[str, Any]], Any] | None) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.record is None:
            await self.app(scope, receive, send)
            return
        record = self.record

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] in (401, 403):
                headers = dict(scope.get("headers") or ())
                bearer = headers.get(b"authorization", b"").lower().startswith(b"bearer ")
                client = scope.get("client")
                record(UNAUTHORIZED_EVENT, {
                    "status": message["status"], "method": scope.get("method"), "path": scope.get("path"),
                    "client_address": f"{client[0]}:{client[1]}" if client else None,
                    "reason": "a bearer token no client has" if bearer else "no bearer token"})
            await send(message)

        await self.app(scope, receive, watch)


def build_app(host: ToolHost, settings: ServeSettings) -> Any:
    """The ASGI application serving ``host``'s tools at ``/mcp`` (``ConfigError`` as above)."""
    caller, verifier = http_callers(host, settings)
    server = build_server(host, settings, caller)
    auth = None
    if verifier is not None:
        # Resource-server mode without published metadata: there is no authorization server to
        # point clients to (issuer_url is required by the model and otherwise unused).
        auth = AuthSettings(issuer_url=f"http://{settings.host}:{settings.port}",  # type: ignore[arg-type]
                            resource_server_url=None, validate_token_resource=False)
    app = server.streamable_http_app(streamable_http_path=ENDPOINT, host=settings.host, auth=auth,
                                     token_verifier=verifier)
    return RefusalAudit(app, host.capabilities.get("audit.event"))


async def serve_http(host: ToolHost, settings: ServeSettings, ready: Callable[[str], None] | None = None,
                     stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (without one: until SIGINT or SIGTERM) or the task is cancelled,
    then shut down gracefully (open requests finish, sessions close) and return. ``ready`` gets
    the endpoint URL once listening; by default it is printed to stderr."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # signals are ours: they set ``stop``
            yield

    app = build_app(host, settings)
    server = Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", lifespan="on"))
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, stop.set)
                handled.append(signum)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: cancel the task instead
                pass
    task = asyncio.ensure_future(server.serve())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            url = f"http://{settings.host}:{port}{ENDPOINT}"
            if ready is not None:
                ready(url)
            else:
                print(f"amplifier-tools serve-mcp: serving at {url} (Streamable HTTP)", file=sys.stderr, flush=True)
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await asyncio.wait({task}, timeout=10)
        raise
    finally:
        stopping.cancel()
        for signum in handled:
            loop.remove_signal_handler(signum)
    if not server.started:
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}", key=f"plugins.{PLUGIN}.serve.port",
                          hint="the port is in use or the address is not this machine's; choose another")
