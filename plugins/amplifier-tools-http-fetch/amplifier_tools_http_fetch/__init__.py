"""``local::http.fetch``: HTTP GET of allowlisted hosts, bounded in size and time.

Standard library only (urllib in a worker thread). Every redirect target is
checked against the allowlist before it is followed; ``timeout_ms`` bounds the
whole request (``_transport``), and no proxy from the environment is used.
Limits (README): the allowlist names hosts, not addresses or ports.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import re
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from amplifier_tools import (
    AuthError,
    ConfigError,
    ContractError,
    Effect,
    ExecutionError,
    ToolResult,
    ToolSpec,
    hookimpl,
)

from ._transport import Transfer

PLUGIN = "http-fetch"

SPEC = ToolSpec(
    name="local::http.fetch",
    version="0.2.0",
    title="HTTP fetch",
    description="GET a URL on an allowlisted host and return status, headers and (capped) body. "
                "Does not send cookies, credentials or request bodies.",
    tags=("web", "read"),
    # Not Pure: a GET reaches a service outside the process, which may act on it (GET /logout,
    # webhooks) and learns what the URL carries; the safe default keeps it out of automatic
    # retries and under approval policies. An operator may declare otherwise (``effect``).
    effect="ExternalSideEffects",
    input_schema={
        "type": "object",
        "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 2048,
                               "description": "http(s) URL on an allowlisted host, in printable ASCII "
                                              "(percent-encoded), without user:password@"}},
        "required": ["url"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {"status": {"type": "integer"}, "headers": {"type": "object"}, "body": {"type": "string"},
                       "truncated": {"type": "boolean"}, "url": {"type": "string"}},
        "required": ["status", "headers", "body", "truncated", "url"],
    },
    examples=[{"input": {"url": "http://127.0.0.1:8080/health"}, "description": "a local service"},
              {"input": {"url": "file:///etc/passwd"}, "error_code": "unsupported_scheme"}],
)


class _AllowlistRedirects(urllib.request.HTTPRedirectHandler):
    def __init__(self, check: Any) -> None:
        self._check = check

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        self._check(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


#: Response headers kept in the output, at most (names and values, in characters); http.client
#: alone allows 100 lines of 64 KiB, 6.4 MB, whatever ``max_bytes`` says (found by attack).
MAX_HEADER_CHARS = 64 * 1024
#: What a URL may hold: printable ASCII, no space. ``urlsplit`` drops tabs and newlines that
#: urllib then sends, so the URL checked would not be the URL fetched (found by attack).
_URL_CHARS = re.compile(r"^[!-~]+$")
#: The part between ``//`` and the path, as urllib connects to it: what ``urlsplit`` reads as
#: host ``::1`` in ``[::1]x`` is not what http.client resolves (found by attack).
_NETLOC = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\[\]:@]+)(:[0-9]*)?$")


#: The fetches' threads. Not the loop's default executor, which the filesystem tools share
#: (found by attack: a few slow servers kept every file read waiting). A fetch queued here
#: counts its wait against ``timeout_ms``.
WORKERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="http-fetch")


class HttpFetchTool:
    """The tool; configured by the plugin's section."""

    spec = SPEC
    name = SPEC.name
    description = SPEC.description

    def __init__(self, allowed_hosts: frozenset[str], max_bytes: int, timeout_s: float,
                 effect: Effect = Effect.ExternalSideEffects) -> None:
        self.allowed_hosts = allowed_hosts
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        if effect is not SPEC.effect:
            self.spec = attrs.evolve(SPEC, effect=effect)

    def _check_url(self, url: str) -> None:
        if not _URL_CHARS.match(url):
            raise ContractError("a URL holds printable ASCII only, no spaces or control characters "
                                "(percent-encode the rest; a non-ASCII host name in punycode)", code="invalid_url")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is no number
        except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535"
            raise ContractError(f"not a URL urllib can fetch: {exc}", code="invalid_url") from None
        if parts.scheme not in ("http", "https"):
            raise ContractError(f"only http and https URLs are fetched, not {parts.scheme or 'no scheme'!r}",
                                code="unsupported_scheme")
        if "@" in parts.netloc:
            raise ContractError("a URL with credentials (user:password@) is not fetched: this tool sends none",
                                code="credentials_in_url")
        if not _NETLOC.match(parts.netloc):
            raise ContractError(f"{parts.netloc!r} is not a host name or [IPv6 address] with an optional port",
                                code="invalid_url")
        if (parts.hostname or "") not in self.allowed_hosts:
            raise AuthError(f"host {parts.hostname!r} is not on the allowlist (plugins.{PLUGIN}.allowed_hosts)",
                            code="host_not_allowed")

    def _fetch(self, url: str, transfer: Transfer) -> dict[str, Any]:
        request = urllib.request.Request(url, headers={"User-Agent": "amplifier-tools-http-fetch/0.2"})
        opener = transfer.opener(_AllowlistRedirects(self._check_url))
        try:
            try:
                with opener.open(request, timeout=self.timeout_s) as response:
                    return self._answer(response.status, response.headers, response, response.geturl())
            except urllib.error.HTTPError as exc:
                with exc:
                    if 300 <= exc.code < 400 and exc.headers.get("Location"):
                        raise ExecutionError(f"GET {url}: a redirect was not followed ({exc.msg})",
                                             code="redirect_not_followed") from None
                    return self._answer(exc.code, exc.headers, exc.fp, exc.geturl())
        except (ContractError, AuthError, ExecutionError):
            if transfer.aborted:
                raise _timed_out(url) from None
            raise
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (ContractError, AuthError)):
                raise exc.reason from None
            if transfer.aborted or isinstance(exc.reason, TimeoutError):
                raise _timed_out(url) from None
            raise ExecutionError(f"fetching {url} failed: {exc.reason}", code="unreachable", retryable=True) from None
        except TimeoutError:
            raise _timed_out(url) from None
        except (http.client.HTTPException, OSError) as exc:
            if transfer.aborted:
                raise _timed_out(url) from None
            # Not the exception's text: a bad status line is the server's words (untyped before: tool_raised).
            raise ExecutionError(f"GET {url}: the server's answer is not usable HTTP ({type(exc).__name__})",
                                 code="bad_response", retryable=True) from None

    def _answer(self, status: int, headers: Any, fp: Any, final: str) -> dict[str, Any]:
        kept = _headers(headers)
        body = _read(fp, self.max_bytes + 1) if fp is not None else b""
        if len(body) <= self.max_bytes and getattr(fp, "length", None):
            # http.client returns a short body without complaint when the server closes early.
            raise ExecutionError(f"GET {final}: the connection closed before the body's {len(body) + fp.length} "
                                 f"bytes (Content-Length) arrived; got {len(body)}", code="incomplete_body",
                                 retryable=True)
        return {"status": status, "headers": kept, "body": body[: self.max_bytes].decode("utf-8", "replace"),
                "truncated": len(body) > self.max_bytes, "url": final}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self._check_url(input["url"])
        transfer = Transfer(self.timeout_s)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.timeout_s, transfer.abort)
        try:  # the plugin's own threads: a slow server must not hold the loop's default executor
            data = await loop.run_in_executor(WORKERS, self._fetch, input["url"], transfer)
        finally:  # a cancelled call (the host's deadline) cuts the connection too, ending the worker
            timer.cancel()
            transfer.abort()
        if data["status"] >= 400:
            return ToolResult(success=False, output=data, error={
                "type": "ExecutionError", "code": f"http_{data['status']}",
                "message": f"GET {input['url']} answered {data['status']}", "retryable": data["status"] >= 500})
        return ToolResult(output=data)


def _timed_out(url: str) -> ExecutionError:
    return ExecutionError(f"fetching {url} timed out (plugins.{PLUGIN}.timeout_ms bounds the whole request)",
                          code="upstream_timeout", retryable=True)


def _headers(message: Any) -> dict[str, str]:
    """The response's headers, a repeated one's values joined with ", "; ``ExecutionError`` past
    ``MAX_HEADER_CHARS``."""
    kept: dict[str, str] = {}
    size = 0
    for name, value in message.items():
        size += len(name) + len(value)
        if size > MAX_HEADER_CHARS:
            raise ExecutionError(f"the response's headers exceed {MAX_HEADER_CHARS} characters",
                                 code="headers_too_large")
        kept[name] = f"{kept[name]}, {value}" if name in kept else value
    return kept


def _read(fp: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = fp.read(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def parse_config(config: dict[str, Any]) -> HttpFetchTool:
    """Build the tool from the ``[plugins.http-fetch]`` section; ``ConfigError`` naming the key."""
    known = {"allowed_hosts", "max_bytes", "timeout_ms", "effect"}
    for key in config:
        if key not in known:
            raise ConfigError(f"unknown key (expected one of {sorted(known)})", key=f"plugins.{PLUGIN}.{key}")
    hosts = config.get("allowed_hosts")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ConfigError("must be a non-empty list of host names", key=f"plugins.{PLUGIN}.allowed_hosts")
    max_bytes = config.get("max_bytes", 1 << 20)
    if type(max_bytes) is not int or max_bytes <= 0:
        raise ConfigError("must be a positive integer", key=f"plugins.{PLUGIN}.max_bytes")
    timeout_ms = config.get("timeout_ms", 10_000)
    if not isinstance(timeout_ms, (int, float)) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
        raise ConfigError("must be a positive number", key=f"plugins.{PLUGIN}.timeout_ms")
    try:
        effect = Effect(config.get("effect", Effect.ExternalSideEffects.value))
    except ValueError:
        raise ConfigError(f"must be one of {[e.value for e in Effect]}", key=f"plugins.{PLUGIN}.effect") from None
    return HttpFetchTool(frozenset(map(_host_entry, hosts)), max_bytes, timeout_ms / 1000.0, effect)


def _host_entry(entry: str) -> str:
    """An ``allowed_hosts`` entry as URLs' host names are compared with it: lower case, an IPv6
    address without brackets. An entry no URL could match (a port, a scheme, a trailing dot) is
    a ``ConfigError``, not a silently dead line."""
    host = entry.lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{entry!r} is no host name: list names or addresses, without scheme or port "
                              "(any port of a listed host is reachable)",
                              key=f"plugins.{PLUGIN}.allowed_hosts") from None
    elif not _URL_CHARS.match(host) or any(c in host for c in "/@?#%\\") or host.endswith("."):
        raise ConfigError(f"{entry!r} is no host name: list names such as 'api.example.com' (no scheme, path "
                          "or trailing dot; a non-ASCII name in punycode, 'xn--...')",
                          key=f"plugins.{PLUGIN}.allowed_hosts")
    return host


class HttpFetchPlugin:
    """Mounts ``local::http.fetch``; one instance per host."""

    name = PLUGIN

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        await coordinator.mount("tools", parse_config(config))
