"""The HTTP fetch tool against a server on 127.0.0.1 started by the test."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from amplifier_tools_http_fetch import HttpFetchTool, parse_config

from amplifier_tools import ConfigError, Deny, hookimpl
from amplifier_tools.pytest_plugin import assert_conforms


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/hello": (200, b"hello world"),
            "/big": (200, b"x" * 5000),
            "/missing": (404, b"not here"),
            "/boom": (503, b"try later"),
        }
        if self.path == "/redirect-out":
            self.send_response(302)
            self.send_header("Location", "http://evil.example/steal")
            self.end_headers()
            return
        status, body = routes.get(self.path, (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


# Other installed plugins that need config (the approval example) would stop the host: these
# tests are about http-fetch alone, so they say so the way an operator would.
CONFIG = {"plugins": {"http-fetch": {"allowed_hosts": ["127.0.0.1"], "max_bytes": 1000, "timeout_ms": 2000}},
          "disable_plugins": ["approval"]}


async def test_fetch_through_the_pipeline(tool_host: Any, server: str) -> None:
    async with tool_host(config=CONFIG, entry_points=True) as host:
        assert "http-fetch" in {p.name for p in host.plugins}
        ok = await host.call("http_fetch", {"url": f"{server}/hello"})
        big = await host.call("http_fetch", {"url": f"{server}/big"})
        missing = await host.call("http_fetch", {"url": f"{server}/missing"})
        down = await host.call("http_fetch", {"url": f"{server}/boom"})
    assert ok.output["status"] == 200 and ok.output["body"] == "hello world" and not ok.output["truncated"]
    assert big.output["truncated"] is True and len(big.output["body"]) == 1000
    assert missing.error["code"] == "http_404" and missing.error["retryable"] is False
    assert down.error["code"] == "http_503" and down.error["retryable"] is True


@pytest.mark.parametrize(
    ("url", "category", "code"),
    [("http://example.com/", "AuthError", "host_not_allowed"),
     ("file:///etc/passwd", "ContractError", "unsupported_scheme"),
     ("ftp://127.0.0.1/x", "ContractError", "unsupported_scheme"),
     ("http://127.0.0.1:1/", "ExecutionError", "unreachable")],
)
async def test_refusals(tool_host: Any, url: str, category: str, code: str) -> None:
    async with tool_host(config=CONFIG, entry_points=True) as host:
        result = await host.call("http_fetch", {"url": url})
    assert (result.error["type"], result.error["code"]) == (category, code)


async def test_redirect_to_a_host_off_the_allowlist_is_refused(tool_host: Any, server: str) -> None:
    async with tool_host(config=CONFIG, entry_points=True) as host:
        result = await host.call("http_fetch", {"url": f"{server}/redirect-out"})
    assert result.error["code"] == "host_not_allowed" and "evil.example" in result.error["message"]


async def test_a_policy_hook_can_veto_fetches(tool_host: Any, server: str) -> None:
    class NoBoom:
        name = "no-boom"

        @hookimpl
        def tool_pre(self, call: Any) -> Deny | None:
            return Deny("no /boom", code="blocked_path") if call.arguments["url"].endswith("/boom") else None

    async with tool_host(NoBoom(), config=CONFIG, entry_points=True) as host:
        result = await host.call("http_fetch", {"url": f"{server}/boom"})
    assert result.error["code"] == "blocked_path"


@pytest.mark.parametrize(
    ("config", "key"),
    [({}, "allowed_hosts"), ({"allowed_hosts": ["a"], "max_bytes": 0}, "max_bytes"),
     ({"allowed_hosts": ["a"], "timeout_ms": "soon"}, "timeout_ms"), ({"allowed_hosts": ["a"], "proxy": 1}, "proxy"),
     # An entry no URL's host name could match was a silently dead line (found by attack).
     ({"allowed_hosts": ["127.0.0.1:8080"]}, "allowed_hosts"), ({"allowed_hosts": ["http://a"]}, "allowed_hosts"),
     ({"allowed_hosts": ["a.example."]}, "allowed_hosts"), ({"allowed_hosts": ["a"], "effect": "Loud"}, "effect")],
)
def test_bad_config_names_the_key(config: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"plugins\.http-fetch\.{key}"):
        parse_config(config)


async def test_conforms() -> None:
    tool: HttpFetchTool = parse_config({"allowed_hosts": ["127.0.0.1"]})
    await assert_conforms(tool, run_examples=False)
