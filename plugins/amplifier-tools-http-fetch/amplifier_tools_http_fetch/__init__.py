"""``local::http.fetch``: HTTP GET of allowlisted hosts, bounded in size and time.

Standard library only (urllib in a worker thread). Every redirect target is
checked against the allowlist before it is followed.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from amplifier_tools import AuthError, ConfigError, ContractError, ExecutionError, ToolResult, ToolSpec, hookimpl

PLUGIN = "http-fetch"

SPEC = ToolSpec(
    name="local::http.fetch",
    version="0.1.0",
    title="HTTP fetch",
    description="GET a URL on an allowlisted host and return status, headers and (capped) body. "
                "Does not send cookies, credentials or request bodies.",
    tags=("web", "read"),
    effect="Pure",  # type: ignore[arg-type]
    input_schema={
        "type": "object",
        "properties": {"url": {"type": "string", "minLength": 1, "maxLength": 2048,
                               "description": "http(s) URL on an allowlisted host"}},
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
              {"input": {"url": "file:///etc/passwd"}, "error_code": "unsupported_scheme"}],  # type: ignore[list-item]
)


class _AllowlistRedirects(urllib.request.HTTPRedirectHandler):
    def __init__(self, check: Any) -> None:
        self._check = check

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        self._check(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class HttpFetchTool:
    """The tool; configured by the plugin's section."""

    spec = SPEC
    name = SPEC.name
    description = SPEC.description

    def __init__(self, allowed_hosts: frozenset[str], max_bytes: int, timeout_s: float) -> None:
        self.allowed_hosts = allowed_hosts
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(_AllowlistRedirects(self._check_url))

    def _check_url(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ContractError(f"only http and https URLs are fetched, not {parts.scheme or 'no scheme'!r}",
                                code="unsupported_scheme")
        if (parts.hostname or "") not in self.allowed_hosts:
            raise AuthError(f"host {parts.hostname!r} is not on the allowlist (plugins.{PLUGIN}.allowed_hosts)",
                            code="host_not_allowed")

    def _fetch(self, url: str) -> dict[str, Any]:
        request = urllib.request.Request(url, headers={"User-Agent": "amplifier-tools-http-fetch/0.1"})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                body = response.read(self.max_bytes + 1)
                status, headers, final = response.status, dict(response.headers), response.geturl()
        except urllib.error.HTTPError as exc:
            body = exc.read(self.max_bytes + 1)
            status, headers, final = exc.code, dict(exc.headers), url
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (ContractError, AuthError)):
                raise exc.reason from None
            raise ExecutionError(f"fetching {url} failed: {exc.reason}", code="unreachable", retryable=True) from None
        except TimeoutError:
            raise ExecutionError(f"fetching {url} timed out", code="upstream_timeout", retryable=True) from None
        return {"status": status, "headers": headers, "body": body[: self.max_bytes].decode("utf-8", "replace"),
                "truncated": len(body) > self.max_bytes, "url": final}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        self._check_url(input["url"])
        data = await asyncio.to_thread(self._fetch, input["url"])
        if data["status"] >= 400:
            return ToolResult(success=False, output=data, error={
                "type": "ExecutionError", "code": f"http_{data['status']}",
                "message": f"GET {input['url']} answered {data['status']}", "retryable": data["status"] >= 500})
        return ToolResult(output=data)


def parse_config(config: dict[str, Any]) -> HttpFetchTool:
    known = {"allowed_hosts", "max_bytes", "timeout_ms"}
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
    return HttpFetchTool(frozenset(h.lower() for h in hosts), max_bytes, timeout_ms / 1000.0)


class HttpFetchPlugin:
    """Mounts ``local::http.fetch``; one instance per host."""

    name = PLUGIN

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        await coordinator.mount("tools", parse_config(config))
