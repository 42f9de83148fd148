"""serve-mcp over Streamable HTTP (issue 18): bearer-token clients, driven by the SDK's own HTTP
client. A token decides who a call runs as and which tools it sees; no token or a wrong one is
HTTP 401 and an audit event; an HTTP server without clients does not start."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2
import mcp_types
from mcp.shared.exceptions import MCPError
from mcp_helpers import REPO
from mcp_helpers import http_session as session
from mcp_helpers import served_http as served

from amplifier_tools import ToolHost
from amplifier_tools.errors import ConfigError, PluginLoadError
from amplifier_tools.mcp.http import serve_http
from amplifier_tools.mcp.server import serve_settings

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef-bob"


def config(tmp_path: Path, **serve: Any) -> dict[str, Any]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "hello.txt").write_text("hello over http\n")
    clients = [
        {"token_ref": "alice_token", "principal": "alice", "scopes": ["fs.read"], "tools": ["local::fs.read_file"]},
        {"token_ref": "bob_token", "principal": "bob", "role": "admin"},
    ]
    return {"working_dir": str(root), "state_dir": str(tmp_path / "state"),
            "secrets": {"alice_token": "TEST_ALICE_TOKEN", "bob_token": "TEST_BOB_TOKEN"},
            "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                        "mcp": {"serve": {"transport": "streamable-http", "port": 0, "clients": clients,
                                          "tools": ["local::fs.read_file", "local::fs.list_dir"], **serve}}}}


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ALICE_TOKEN", ALICE)
    monkeypatch.setenv("TEST_BOB_TOKEN", BOB)


def build_http_app(cfg: dict[str, Any]) -> None:
    """Start a host with ``cfg`` and build its HTTP app, as ``serve-mcp`` does before it listens."""
    from amplifier_tools.mcp.http import build_app

    async def build() -> None:
        async with ToolHost(config=cfg, builtins=["filesystem", "audit", "mcp"], entry_points=False,
                            discover=False) as host:
            build_app(host, serve_settings(host))

    asyncio.run(build())


def audit(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


async def test_a_token_decides_who_the_call_runs_as_and_which_tools_it_sees(tmp_path: Path) -> None:
    async with served(config(tmp_path)) as url:
        async with session(url, ALICE) as alice:
            assert [t.name for t in (await alice.list_tools()).tools] == ["fs_read_file"]
            read = await alice.call_tool("fs_read_file", {"path": "hello.txt"})
            assert not read.is_error and "hello over http" in read.content[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError) as hidden:  # bob's tool, not alice's: unknown to her
                await alice.call_tool("fs_list_dir", {"path": "."})
            assert hidden.value.error.code == mcp_types.INVALID_PARAMS
        async with session(url, BOB) as bob:  # no tools of his own: the serve table's
            assert sorted(t.name for t in (await bob.list_tools()).tools) == ["fs_list_dir", "fs_read_file"]
            listed = await bob.call_tool("fs_list_dir", {"path": "."})
            assert not listed.is_error
    calls = audit(tmp_path, "call")
    assert [(r["principal"], r["tool"], r["role"], r["scopes"]) for r in calls] == [
        ("alice", "local::fs.read_file", None, ["fs.read"]), ("bob", "local::fs.list_dir", "admin", [])]


async def test_no_token_or_a_wrong_one_is_401_and_an_audit_event(tmp_path: Path) -> None:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        missing = await http.post(url, json=initialize, headers=headers)
        wrong = await http.post(url, json=initialize, headers={**headers, "Authorization": "Bearer not-a-token-at-all"})
        for response in (missing, wrong):
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")
    events = audit(tmp_path, "event")
    assert [e["event"] for e in events[:2]] == ["mcp.http.unauthorized"] * 2
    assert [e["data"]["bearer_token_sent"] for e in events[:2]] == [False, True]
    assert all(e["data"]["path"] == "/mcp" and e["data"]["status"] == 401 for e in events)
    assert all(e["data"]["client_address"].startswith("127.0.0.1:") for e in events)
    log = (tmp_path / "audit.jsonl").read_text()
    assert "not-a-token-at-all" not in log and ALICE not in log and BOB not in log
    assert audit(tmp_path, "call") == []


@pytest.mark.parametrize("token", [None, "not-a-token-at-all"])
async def test_an_sdk_client_sees_the_401_only_as_an_opaque_internal_error(tmp_path: Path, token: str | None
                                                                           ) -> None:
    """What docs/mcp.md tells a user to expect: the official client turns the 401 into JSON-RPC
    -32603 "Server returned an error response" (no status, no reason); the audit event says why."""
    async with served(config(tmp_path)) as url:
        with pytest.raises(BaseException) as refused:  # inside the SDK's task groups' exception groups
            async with session(url, token):
                pass
    error: BaseException = refused.value
    while getattr(error, "exceptions", None):
        error = error.exceptions[0]  # type: ignore[attr-defined]
    assert isinstance(error, MCPError), repr(refused.value)
    assert error.error.code == mcp_types.INTERNAL_ERROR == -32603
    assert error.error.message == "Server returned an error response"
    events = audit(tmp_path, "event")
    assert events and events[0]["event"] == "mcp.http.unauthorized"
    assert events[0]["data"]["bearer_token_sent"] is (token is not None)


async def test_the_bearer_check_answers_as_the_sdk_did_on_every_path(tmp_path: Path) -> None:
    """The gate replaced the SDK's three bearer middlewares: the same 401 (body and header), the
    scheme read case-insensitively, a token with anything around it refused, every path guarded."""
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        async def post(authorization: str) -> httpx2.Response:
            return await http.post(url, json=initialize, headers={**accept, "Authorization": authorization})

        lower = await post(f"bearer {ALICE}")
        assert lower.status_code == 200 and "mcp-session-id" in lower.headers
        refused = {"basic": await post(f"Basic {ALICE}"), "padded": await post(f"Bearer  {ALICE}"),
                   "prefix": await post(f"Bearer {ALICE[:-1]}"), "no scheme": await post(ALICE),
                   "other path": await http.get(url.replace("/mcp", "/metrics"))}
        for why, response in refused.items():
            assert response.status_code == 401, why
            assert response.json() == {"error": "invalid_token", "error_description": "Authentication required"}, why
            assert response.headers["www-authenticate"] == \
                'Bearer error="invalid_token", error_description="Authentication required"', why
        known_elsewhere = await http.get(url.replace("/mcp", "/metrics"), headers={"Authorization": f"Bearer {BOB}"})
        assert known_elsewhere.status_code == 404  # authenticated: the app answers (no such route)
    events = [e["data"] for e in audit(tmp_path, "event")]
    assert [(e["status"], e["path"], e["bearer_token_sent"]) for e in events] == [
        (401, "/mcp", False), (401, "/mcp", True), (401, "/mcp", True), (401, "/mcp", False), (401, "/metrics", False)]


def test_the_gate_sets_the_sdks_auth_context_for_the_request_only() -> None:
    from mcp.server.auth.middleware.auth_context import get_access_token

    from amplifier_tools.mcp.http import ClientTokens, EventBudget, Gate, _digest

    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        token = get_access_token()
        seen.append((token.client_id if token else None, scope["user"].display_name))
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def ignore(message: Any) -> None:
        return None

    gate = Gate(app, ClientTokens({_digest(ALICE): "alice_token"}), EventBudget(None))
    scope = {"type": "http", "method": "POST", "path": "/mcp",
             "headers": [(b"authorization", f"Bearer {ALICE}".encode())]}

    async def twice() -> None:
        await gate(dict(scope), None, ignore)
        await gate(dict(scope), None, ignore)
        assert get_access_token() is None  # reset once the request is answered

    asyncio.run(twice())
    assert seen == [("alice_token", "alice_token")] * 2


def test_each_401_is_a_message_of_its_own() -> None:
    """Found in review: the 401 start message was one shared constant, so a middleware wrapping the
    gate that adds a header in place (as CORS middleware does) grew it on every refusal."""
    from amplifier_tools.mcp.http import ClientTokens, EventBudget, Gate, _digest

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("an unauthenticated request reached the app")

    gate = Gate(never, ClientTokens({_digest(ALICE): "alice_token"}), EventBudget(None))
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}
    header_counts: list[int] = []

    async def adds_a_header(message: Any) -> None:  # what a wrapping CORS middleware does to each start
        if message["type"] == "http.response.start":
            message.setdefault("headers", []).append((b"access-control-allow-origin", b"*"))
            header_counts.append(len(message["headers"]))

    async def refused_twice() -> None:
        for _ in range(2):
            await gate(dict(scope), None, adds_a_header)

    asyncio.run(refused_twice())
    assert header_counts == [4, 4]

async def test_a_session_opened_with_one_token_cannot_be_used_with_another(tmp_path: Path) -> None:
    headers = {"Accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        opened = await http.post(url, json=initialize, headers={**headers, "Authorization": f"Bearer {ALICE}"})
        assert opened.status_code == 200
        session_id = opened.headers["mcp-session-id"]
        version = {"mcp-protocol-version": "2025-06-18", "mcp-session-id": session_id}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers={**headers, **version, "Authorization": f"Bearer {ALICE}"})
        hijack = await http.post(url, json=listing, headers={**headers, **version, "Authorization": f"Bearer {BOB}"})
        assert hijack.status_code == 404
        own = await http.post(url, json=listing, headers={**headers, **version, "Authorization": f"Bearer {ALICE}"})
        assert own.status_code == 200 and "fs_read_file" in own.text


@pytest.mark.parametrize(("serve", "key", "message"), [
    ({"clients": []}, "plugins.mcp.serve.clients", "needs at least one client"),
    ({"clients": [], "allow_anonymous": True, "host": "0.0.0.0"}, "plugins.mcp.serve.allow_anonymous",
     "not a loopback address"),
    ({"allow_anonymous": True}, "plugins.mcp.serve.allow_anonymous", "exclude each other"),
    ({"clients": [{"token_ref": "nosuch", "principal": "x"}]}, "plugins.mcp.serve.clients[0].token_ref",
     "is not a key of the host's [secrets]"),
    ({"clients": [{"token_ref": "short", "principal": "x"}]}, "plugins.mcp.serve.clients[0].token_ref",
     "at least 16"),
    ({"clients": [{"token_ref": "alice_token"}, {"token_ref": "alice_token"}]},
     "plugins.mcp.serve.clients[1].token_ref", "each client needs its own"),
    ({"clients": [{"token_ref": "alice_token", "tools": ["local::nosuch"]}]},
     "plugins.mcp.serve.clients[0].tools", "names no mounted tool"),
])
async def test_unusable_client_settings_stop_the_start_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      serve: dict[str, Any], key: str,
                                                                      message: str) -> None:
    monkeypatch.setenv("TEST_SHORT", "short-token")
    cfg = config(tmp_path, **serve)
    cfg["secrets"]["short"] = "TEST_SHORT"
    with pytest.raises((ConfigError, PluginLoadError)) as refused:  # checked at mount, or at serve
        async with served(cfg):
            pass
    assert key in str(refused.value) and message in str(refused.value)


async def test_anonymous_on_loopback_runs_as_the_serve_caller(tmp_path: Path) -> None:
    cfg = config(tmp_path, clients=[], allow_anonymous=True, principal="local-user")
    async with served(cfg) as url, session(url, None) as anonymous:
        read = await anonymous.call_tool("fs_read_file", {"path": "hello.txt"})
        assert not read.is_error
    assert [r["principal"] for r in audit(tmp_path, "call")] == ["local-user"]


def _bob_opening() -> tuple[dict[str, str], dict[str, Any]]:
    """Bob's request headers and an ``initialize`` request, for a client speaking raw HTTP."""
    return ({"Authorization": f"Bearer {BOB}", "Accept": "application/json, text/event-stream"},
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})


def serve_mcp_cli(tmp_path: Path, cfg: dict[str, Any], *, drain: bool = False) -> tuple[subprocess.Popen[str], str]:
    """``serve-mcp --transport streamable-http --port 0`` with ``cfg`` as its config file: the
    process and the URL it printed once serving (``drain``: its stderr is read from then on, by a
    thread, so a full pipe never blocks it)."""
    path = tmp_path / "host.toml"
    path.write_text(json_to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": REPO, "TEST_ALICE_TOKEN": ALICE, "TEST_BOB_TOKEN": BOB}
    proc = subprocess.Popen([sys.executable, "-m", "amplifier_tools", "--config", str(path), "serve-mcp",
                             "--transport", "streamable-http", "--port", "0"], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    assert proc.stderr is not None
    line = ""
    while "serving at" not in line:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            pytest.fail(f"serve-mcp exited before serving (status {proc.wait()})")
    if drain:
        threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, line.split("serving at ", 1)[1].split()[0]


def test_the_command_line_serves_over_http_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``serve-mcp --transport streamable-http --port 0`` prints its URL, serves, exits 0 on SIGTERM."""
    proc, url = serve_mcp_cli(tmp_path, config(tmp_path, transport="stdio"))  # the flag, not the file, says HTTP
    try:

        async def read() -> str:
            async with session(url, ALICE) as alice:
                result = await alice.call_tool("fs_read_file", {"path": "hello.txt"})
                return str(result.content[0].text)  # type: ignore[union-attr]

        assert "hello over http" in asyncio.run(read())
        proc.terminate()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def json_to_toml(value: dict[str, Any]) -> str:
    """The test config as TOML (tomli-w is not a dependency): tables and arrays of tables."""
    lines: list[str] = []

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v)

    def table(prefix: str, data: dict[str, Any]) -> None:
        nested: list[tuple[str, Any]] = []
        if prefix:
            lines.append(f"[{prefix}]")
        for key, v in data.items():
            if isinstance(v, dict) or (isinstance(v, list) and v and all(isinstance(x, dict) for x in v)):
                nested.append((key, v))
            else:
                lines.append(f"{key} = {scalar(v)}")
        for key, v in nested:
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(v, dict):
                table(name, v)
            else:
                for item in v:
                    lines.append(f"[[{name}]]")
                    lines.extend(f"{k} = {scalar(x)}" for k, x in item.items())

    table("", value)
    return "\n".join(lines) + "\n"


# -- importing a Streamable HTTP server ---------------------------------------------------------

def importing(url: str, **server: Any) -> dict[str, Any]:
    return {"secrets": {"inner_auth": "TEST_INNER_AUTH"},
            "plugins": {"mcp": {"servers": {"inner": {"url": url, "headers": {"Authorization": "inner_auth"},
                                                      **server}}}}}


async def test_a_host_imports_an_http_server_with_headers_from_its_secrets(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")
    async with served(config(tmp_path)) as url:
        async with ToolHost(config=importing(url), builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path) as outer:
            assert [spec.name for spec in outer.specs] == ["mcp::inner::fs_read_file"]  # alice's tools only
            read = await outer.call("mcp::inner::fs_read_file", {"path": "hello.txt"})
            assert read.success and "hello over http" in json.dumps(read.output)
            assert f"Bearer {ALICE}" in outer.capabilities["session.secrets"]  # redacted like any secret
            assert ALICE in outer.capabilities["session.secrets"]  # and the bare token, which a server may echo
            pinned = outer.specs[0].tags
        digest = next(tag for tag in pinned if tag.startswith("sha256:"))
        async with ToolHost(config=importing(url, pins={"fs_read_file": digest}), builtins=["mcp"],
                            entry_points=False, discover=False, working_dir=tmp_path) as again:
            assert [spec.name for spec in again.specs] == ["mcp::inner::fs_read_file"]
        with pytest.raises(PluginLoadError, match="pin_mismatch|pinned"):
            async with ToolHost(config=importing(url, pins={"fs_read_file": "sha256:" + "0" * 64}),
                                builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path):
                pass
    assert [r["principal"] for r in audit(tmp_path, "call")] == ["alice"]


@pytest.mark.slow
async def test_an_imported_http_call_may_outlast_httpx_default_timeout_and_is_bounded_by_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call taking 6 s failed (httpx's default 5 s read timeout) with mcp_server_died; the host's
    own timeout of the imported tool is what bounds a call."""
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {BOB}")
    inner = config(tmp_path, tools=["local::bash"])
    inner["plugins"]["bash"] = {"sandbox": "off"}
    async with served(inner, builtins=("filesystem", "bash", "audit", "mcp")) as url:
        async with ToolHost(config=importing(url, timeout_ms=3000), builtins=["mcp"], entry_points=False,
                            discover=False, working_dir=tmp_path) as outer:
            capped = await outer.call("mcp::inner::bash", {"command": "sleep 6"})
            assert capped.error is not None and capped.error["code"] == "timeout"
        async with ToolHost(config=importing(url), builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path) as outer:
            slow = await outer.call("mcp::inner::bash", {"command": "sleep 6; echo done"})
            assert slow.success, slow.error
            assert "done" in json.dumps(slow.output)


async def refused_start(tmp_path: Path, url: str) -> str:
    """The message of the ``PluginLoadError`` a host importing ``url`` stops its start with."""
    with pytest.raises(PluginLoadError) as refused:
        async with ToolHost(config=importing(url), builtins=["mcp"], entry_points=False, discover=False,
                            working_dir=tmp_path):
            pass
    return str(refused.value)


async def test_refused_credentials_name_the_status_and_the_setting(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_INNER_AUTH", "Bearer not-a-token-at-all")
    async with served(config(tmp_path)) as url:
        message = await refused_start(tmp_path, url)
    assert "HTTP 401" in message and "credentials in headers were refused" in message
    assert "plugins.mcp.servers.inner: url and headers" in message and "not-a-token-at-all" not in message


async def test_a_refused_authorization_without_a_scheme_says_bearer_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a newcomer's trial: serve-mcp's token variable holds the bare token, and the same
    value in the importing host's variable was refused 401 with no word that 'Bearer ' was missing."""
    monkeypatch.setenv("TEST_INNER_AUTH", ALICE)
    async with served(config(tmp_path)) as url:
        message = await refused_start(tmp_path, url)
    assert "HTTP 401" in message and "'Authorization' has no scheme" in message and "'Bearer <token>'" in message
    assert ALICE not in message


@pytest.mark.parametrize("path", ["", "/prefix/mcp", "/MCP"])
async def test_a_url_without_the_mcp_path_says_where_servers_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   path: str) -> None:
    """Found by a newcomer's trial: url = "http://127.0.0.1:<port>" (no /mcp) stopped the start
    with a bare 'HTTP 404 from http://127.0.0.1:<port>'; by attack: so did ".../prefix/mcp"."""
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")
    async with served(config(tmp_path)) as url:
        message = await refused_start(tmp_path, url.removesuffix("/mcp") + path)
    assert "HTTP 404" in message and "serve MCP at /mcp" in message


async def test_a_url_nothing_listens_at_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a newcomer's trial: the start failed "ConnectError: All connection attempts failed",
    naming no address."""
    import socket

    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")
    with socket.socket() as unused:  # a port bound and not listening: every connection is refused
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/mcp"
        message = await refused_start(tmp_path, url)
    assert f"cannot connect to {url}" in message, message


async def test_a_header_whose_secret_is_missing_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(PluginLoadError, match=r"plugins\.mcp\.servers\.inner\.headers\.Authorization"):
        async with ToolHost(config=importing("http://127.0.0.1:9/mcp"), builtins=["mcp"], entry_points=False,
                            discover=False, working_dir=tmp_path):
            pass


async def test_a_header_whose_secrets_variable_is_unset_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said only that the value "is not a [secrets] reference that resolves", where serve-mcp's
    ``token_ref`` names the unset variable (found by review); still never the value itself."""
    monkeypatch.delenv("TEST_INNER_AUTH", raising=False)
    with pytest.raises(PluginLoadError) as refused:
        async with ToolHost(config=importing("http://127.0.0.1:9/mcp"), builtins=["mcp"], entry_points=False,
                            discover=False, working_dir=tmp_path):
            pass
    cause = refused.value.__cause__
    assert isinstance(cause, ConfigError) and cause.key == "plugins.mcp.servers.inner.headers.Authorization"
    assert "the environment variable 'TEST_INNER_AUTH', which is not set" in str(refused.value)
    assert cause.hint == "set TEST_INNER_AUTH in the environment the host starts in"


@pytest.mark.parametrize(("server", "key", "message"), [
    ({"url": "https://example.com/mcp", "command": "x"}, "url", "not both"),
    ({}, "command", "not both or neither"),
    ({"url": "http://example.com/mcp"}, "url", "use https://"),
    ({"url": "https://example.com/mcp", "args": ["x"]}, "args", "for stdio servers"),
    ({"url": "https://example.com/mcp", "sandbox": "auto"}, "sandbox", "for stdio servers"),
    ({"command": "x", "headers": {"Authorization": "ref"}}, "headers", "url servers only"),
    ({"url": "ftp://example.com/x"}, "url", "http:// or https://"),
])
def test_server_settings_take_a_command_or_a_url(server: dict[str, Any], key: str, message: str) -> None:
    from amplifier_tools.mcp.settings import McpSettings
    from amplifier_tools.plugin_settings import structure_settings

    with pytest.raises(ConfigError) as refused:
        structure_settings({"servers": {"s": server}}, McpSettings, "plugins.mcp")
    assert f"plugins.mcp.servers.s.{key}" in str(refused.value) and message in str(refused.value)


# -- found by attack ---------------------------------------------------------------------------

async def test_refusal_events_are_clipped_rate_limited_and_not_forged(tmp_path: Path) -> None:
    """A 60,000-character method, a flood of 401s and a forged X-Forwarded-For: the log grows by at
    most MAX_REFUSAL_EVENTS_PER_S small events a second, and shows the real peer."""
    import math
    import time

    from amplifier_tools.mcp.http import MAX_FIELD_CHARS, MAX_REFUSAL_EVENTS_PER_S, SUPPRESSED_EVENT

    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        started = time.monotonic()
        await http.request("X" * 60_000, url)
        for _ in range(40):
            await http.post(url, json={}, headers={"X-Forwarded-For": "6.6.6.6"})
        seconds = math.ceil(time.monotonic() - started) + 1  # whole seconds the burst touched, at most
    events = audit(tmp_path, "event")
    refusals = [e for e in events if e["event"] != SUPPRESSED_EVENT]
    # Every refusal is in the log, or counted in the next event written (the last ones when serving ends).
    assert len(refusals) + sum(e["data"].get("suppressed_before", 0) for e in events) == 41
    assert len(refusals) <= min(41, MAX_REFUSAL_EVENTS_PER_S * seconds)
    if seconds <= 3:  # a quiet machine: the limit left requests out
        assert len(refusals) < 41
    assert refusals[0]["data"]["method"].startswith("X" * MAX_FIELD_CHARS)
    assert len(refusals[0]["data"]["method"]) < 100
    assert all(e["data"]["client_address"].startswith("127.0.0.1:") for e in refusals)
    assert (tmp_path / "audit.jsonl").stat().st_size < 600 * len(events)  # small events, whatever was sent


async def test_a_flood_without_a_token_cannot_hide_a_clients_refusal(tmp_path: Path) -> None:
    """Found by attack: 40 requests without a token used up the one budget of refusal events, and
    bob's use of alice's session went unrecorded. The 401s have a budget of their own, and a
    refusal past authentication names the client."""
    headers = {"Accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        opened = await http.post(url, json=initialize, headers={**headers, "Authorization": f"Bearer {ALICE}"})
        version = {"mcp-protocol-version": "2025-06-18", "mcp-session-id": opened.headers["mcp-session-id"]}
        for _ in range(40):
            assert (await http.post(url, json={}, headers=headers)).status_code == 401
        hijack = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                 headers={**headers, **version, "Authorization": f"Bearer {BOB}"})
        assert hijack.status_code == 404
    events = [e["data"] for e in audit(tmp_path, "event") if e["event"] != "mcp.http.refusals_suppressed"]
    assert [(e["status"], e.get("client")) for e in events if e["status"] == 404] == [(404, "bob_token")]
    assert all("client" not in e for e in events if e["status"] == 401)


@pytest.mark.parametrize("token", ["t\u00f6ken-0123456789abcdef", "token with spaces 0123456789",
                                   "tab\tseparated-0123456789"])
def test_a_token_no_authorization_header_can_carry_is_a_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str) -> None:
    """Found by attack: the header is read as latin-1 and the token compared as UTF-8, so a token
    beyond ASCII (or with a space) could never match; the server started and refused its client."""
    monkeypatch.setenv("TEST_ALICE_TOKEN", token)

    with pytest.raises(ConfigError) as refused:
        build_http_app(config(tmp_path))
    assert refused.value.key == "plugins.mcp.serve.clients[0].token_ref"
    assert "token_urlsafe" in (refused.value.hint or "")


def test_a_burst_of_refusals_is_counted_in_the_next_event() -> None:
    from amplifier_tools.mcp.http import MAX_REFUSAL_EVENTS_PER_S, EventBudget, Gate

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})

    async def ignore(message: Any) -> None:
        return None

    now = [100.0]
    written: list[dict[str, Any]] = []
    app = Gate(refuse, None, EventBudget(lambda event, data: written.append(data), clock=lambda: now[0]))
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "client": ("127.0.0.1", 5)}

    async def burst(count: int) -> None:
        for _ in range(count):
            await app(scope, None, ignore)

    asyncio.run(burst(25))
    assert len(written) == MAX_REFUSAL_EVENTS_PER_S
    now[0] += 1
    asyncio.run(burst(1))
    assert written[-1]["suppressed_before"] == 25 - MAX_REFUSAL_EVENTS_PER_S


def test_refusals_left_out_in_the_last_second_are_counted_when_serving_ends() -> None:
    """Found by attack: 50 requests without a token, then SIGTERM: 10 events were written and the
    other 40 counted nowhere (the count waited for a next event that never came)."""
    from amplifier_tools.mcp.http import MAX_REFUSAL_EVENTS_PER_S, SUPPRESSED_EVENT, EventBudget, Gate

    async def refuse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 401, "headers": []})

    async def ignore(message: Any) -> None:
        return None

    written: list[tuple[str, dict[str, Any]]] = []
    app = Gate(refuse, None, EventBudget(lambda event, data: written.append((event, data)), clock=lambda: 100.0))
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "client": ("127.0.0.1", 5)}

    async def burst(count: int) -> None:
        for _ in range(count):
            await app(scope, None, ignore)

    asyncio.run(burst(50))
    app.flush()
    assert written[-1] == (SUPPRESSED_EVENT, {"suppressed_before": 50 - MAX_REFUSAL_EVENTS_PER_S})
    assert len(written) == MAX_REFUSAL_EVENTS_PER_S + 1
    app.flush()  # nothing left out since: nothing written
    assert len(written) == MAX_REFUSAL_EVENTS_PER_S + 1


async def test_dns_rebinding_protection_covers_every_loopback_address(tmp_path: Path) -> None:
    """allow_anonymous on 127.0.0.2: a page rebound to it sends another Host: refused (421) and audited."""
    cfg = config(tmp_path, clients=[], allow_anonymous=True, host="127.0.0.2")
    headers = {"Accept": "application/json, text/event-stream", "Host": "attacker.example:8765",
               "Origin": "http://attacker.example:8765"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with served(cfg) as url, httpx2.AsyncClient() as http:
        rebound = await http.post(url, json=initialize, headers=headers)
        assert rebound.status_code in (403, 421)
        own = await http.post(url, json=initialize, headers={"Accept": headers["Accept"]})
        assert own.status_code == 200
    assert [e["data"]["status"] for e in audit(tmp_path, "event")] == [rebound.status_code]


async def test_a_port_in_use_is_a_config_error_naming_the_port(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"plugins\.mcp\.serve\.port: cannot listen on 127\.0\.0\.1:{port}"):
            async with served(config(tmp_path, port=port)):
                pass


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_stops_a_server_held_open_by_an_event_stream(tmp_path: Path, signals: int) -> None:
    """A client holding the GET event stream kept SIGTERM waiting forever; then open requests got
    a bounded grace, and a second SIGTERM stopped at once. Found by attack since: with no call in
    flight, one SIGTERM still waited the whole 10 s for the stream (an idle SDK client 5-6 s);
    once no request has been open for a moment, streams get a second. Exit 0, the host closed."""
    import signal
    import time

    proc, url = serve_mcp_cli(tmp_path, config(tmp_path), drain=True)
    try:
        auth, initialize = _bob_opening()

        async def hold_stream() -> float:
            async with httpx2.AsyncClient(timeout=30) as http:
                opened = await http.post(url, json=initialize, headers=auth)
                get = {**auth, "Accept": "text/event-stream", "mcp-session-id": opened.headers["mcp-session-id"],
                       "mcp-protocol-version": "2025-06-18"}
                async with http.stream("GET", url, headers=get) as stream:
                    assert stream.status_code == 200
                    for sent in range(signals):
                        if sent:
                            await asyncio.sleep(0.5)
                        started = time.monotonic()
                        proc.send_signal(signal.SIGTERM)
                    while proc.poll() is None and time.monotonic() - started < 12:
                        await asyncio.sleep(0.05)
                    return time.monotonic() - started

        took = asyncio.run(hold_stream())
        assert proc.wait(5) == 0
        assert took < 5, took  # one signal: 10.4 s before
    finally:
        proc.kill()
        proc.wait()


def test_a_second_sigint_with_a_call_in_flight_stops_at_once_and_records_the_call(tmp_path: Path) -> None:
    """Found by attack: with a call in flight, the second Ctrl-C still waited out the 10 s drain,
    then the host's 5 s shutdown grace (15 s in all). The call is now cut at once, recorded as
    ``host_closing``, and the process exits 0."""
    import signal
    import time

    cfg = config(tmp_path, tools=["local::bash"])
    cfg["plugins"]["bash"] = {"sandbox": "off"}
    proc, url = serve_mcp_cli(tmp_path, cfg, drain=True)
    try:
        auth, initialize = _bob_opening()
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": "sleep 60"}}}

        async def interrupt_twice() -> float:
            async with httpx2.AsyncClient(timeout=60) as http:
                opened = await http.post(url, json=initialize, headers=auth)
                ids = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
                await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                headers={**auth, **ids})
                calling = asyncio.ensure_future(http.post(url, json=call, headers={**auth, **ids}))
                await asyncio.sleep(1.0)  # the call is running
                proc.send_signal(signal.SIGINT)
                await asyncio.sleep(0.3)
                started = time.monotonic()
                proc.send_signal(signal.SIGINT)
                while proc.poll() is None and time.monotonic() - started < 12:
                    await asyncio.sleep(0.05)
                calling.cancel()
                await asyncio.gather(calling, return_exceptions=True)
                return time.monotonic() - started

        took = asyncio.run(interrupt_twice())
        assert proc.wait(5) == 0
        assert took < 5, took  # 15 s before
        records = audit(tmp_path, "call")
        assert [(r["tool"], r["error"]["code"]) for r in records] == [("local::bash", "host_closing")]
    finally:
        proc.kill()
        proc.wait()


async def test_a_client_that_disconnects_mid_call_still_leaves_exactly_one_record(tmp_path: Path) -> None:
    """Exactly-once at the HTTP edge: the client gives up while its call runs; the call finishes or
    is cancelled, and either way the log holds one record of it."""
    inner = config(tmp_path, tools=["local::bash"])
    inner["plugins"]["bash"] = {"sandbox": "off"}
    ran = tmp_path / "ran"
    auth = {"Authorization": f"Bearer {BOB}", "Accept": "application/json, text/event-stream"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": f"sleep 2; echo x > {ran}"}}}
    async with served(inner, builtins=("filesystem", "bash", "audit", "mcp")) as url, httpx2.AsyncClient() as http:
        opened = await http.post(url, json=initialize, headers=auth)
        session_id = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers={**auth, **session_id})
        with pytest.raises(httpx2.ReadTimeout):
            await http.post(url, json=call, headers={**auth, **session_id}, timeout=0.5)
    # The server has shut down (and the host closed): whatever became of the call, it is recorded.
    assert [(r["principal"], r["tool"]) for r in audit(tmp_path, "call")] == [("bob", "local::bash")]


async def test_a_call_in_flight_at_shutdown_still_gets_its_result_over_the_sdk_client(tmp_path: Path) -> None:
    """Stopping (SIGTERM's path) while a call runs: the call finishes within the grace and the SDK
    client gets its result on the open response stream, GET event stream and all."""
    from amplifier_tools import ToolResult, ToolSpec, hookimpl

    running, release = asyncio.Event(), asyncio.Event()

    class Slow:
        name = "slow"
        description = "Waits to be released."
        spec = ToolSpec(name="slow", effect="Pure")

        async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
            running.set()
            await release.wait()
            return ToolResult(output="finished")

    class Plugin:
        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", Slow())

    cfg = config(tmp_path, tools=["slow"])
    async with ToolHost(config=cfg, builtins=["filesystem", "audit", "mcp"], entry_points=False, discover=False,
                        plugins=[Plugin()]) as host:
        url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(serve_http(host, serve_settings(host), ready=url.set_result, stop=stop))
        await asyncio.wait({url, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        async with session(url.result(), BOB) as bob:
            call = asyncio.create_task(bob.call_tool("slow", {}))
            await running.wait()
            stop.set()
            await asyncio.sleep(0.5)  # uvicorn has closed its listener and idle connections by now
            release.set()
            result = await asyncio.wait_for(call, 30)
        assert not result.is_error and result.content[0].text == "finished"  # type: ignore[union-attr]
        await asyncio.wait_for(task, 30)
    assert [r["status"] for r in audit(tmp_path, "call")] == ["ok"]


async def test_while_draining_a_new_session_gets_503_and_the_open_one_its_result(tmp_path: Path) -> None:
    """Stopping with a call in flight: the server still listens (the open session's next request
    must get through) but a client opening a new session is told 503, not served and not hung."""
    from amplifier_tools import ToolResult, ToolSpec, hookimpl

    running, release = asyncio.Event(), asyncio.Event()

    class Slow:
        name = "slow"
        description = "Waits to be released."
        spec = ToolSpec(name="slow", effect="Pure")

        async def execute(self, input: dict[str, Any], context: Any) -> ToolResult:
            running.set()
            await release.wait()
            return ToolResult(output="finished")

    class Plugin:
        @hookimpl
        async def mount(self, coordinator: Any) -> None:
            await coordinator.mount("tools", Slow())

    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "late", "version": "1"}}}
    headers = {"Authorization": f"Bearer {ALICE}", "Accept": "application/json, text/event-stream"}
    cfg = config(tmp_path, tools=["slow"])
    async with ToolHost(config=cfg, builtins=["filesystem", "audit", "mcp"], entry_points=False, discover=False,
                        plugins=[Plugin()]) as host:
        url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(serve_http(host, serve_settings(host), ready=url.set_result, stop=stop))
        await asyncio.wait({url, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        async with session(url.result(), BOB) as bob, httpx2.AsyncClient() as late:
            before = await late.post(url.result(), json=initialize, headers=headers, timeout=10)
            assert before.status_code == 200  # the same request is served before the stop
            call = asyncio.create_task(bob.call_tool("slow", {}))
            await running.wait()
            stop.set()
            await asyncio.sleep(0.2)
            refused = await late.post(url.result(), json=initialize, headers=headers, timeout=10)
            assert refused.status_code == 503 and "shutting down" in refused.text
            # a 2026-07-28 call opens no session, whatever session id it names: refused alike
            # (found by attack: naming a made-up id, it started a new call while draining)
            meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}}
            single = await late.post(url.result(), timeout=10, json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "slow", "arguments": {}, "_meta": meta}}, headers={
                **headers, "Authorization": f"Bearer {BOB}", "mcp-session-id": "0" * 32,
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call", "mcp-name": "slow"})
            assert single.status_code == 503, single.text
            stranger = await late.post(url.result(), json=initialize, timeout=10,
                                       headers={**headers, "Authorization": "Bearer not-a-token-at-all"})
            assert stranger.status_code == 401  # authentication first: refused and recorded, draining or not
            assert not task.done()  # still draining for bob
            release.set()
            result = await asyncio.wait_for(call, 30)
        assert not result.is_error and result.content[0].text == "finished"  # type: ignore[union-attr]
        await asyncio.wait_for(task, 30)
    assert [r["status"] for r in audit(tmp_path, "call")] == ["ok"]
    assert [(e["data"]["status"], e["data"]["bearer_token_sent"]) for e in audit(tmp_path, "event")] == [(401, True)]


async def test_a_client_calling_a_tool_outside_its_tools_is_an_audit_event_naming_it(tmp_path: Path) -> None:
    async with served(config(tmp_path)) as url, session(url, ALICE) as alice:
        for name in ("fs_list_dir", "no_such_tool", "x" * 500):
            with pytest.raises(MCPError) as hidden:
                await alice.call_tool(name, {"path": "."})
            assert hidden.value.error.code == mcp_types.INVALID_PARAMS
    events = [e for e in audit(tmp_path, "event") if e["event"] == "mcp.http.tool_refused"]
    assert [(e["data"]["principal"], e["data"]["client"]) for e in events] == [("alice", "alice_token")] * 3
    assert [e["data"]["tool"] for e in events][:2] == ["fs_list_dir", "no_such_tool"]
    assert events[2]["data"]["tool"].startswith("x" * 64 + "...")  # clipped like the refusal events
    assert audit(tmp_path, "call") == []


async def test_a_header_value_that_is_no_secrets_reference_is_refused_without_showing_it(tmp_path: Path) -> None:
    inline = f"Bearer {ALICE}"  # the token written into the config instead of a reference
    cfg = {"plugins": {"mcp": {"servers": {"inner": {"url": "http://127.0.0.1:9/mcp",
                                                     "headers": {"Authorization": inline}}}}}}
    with pytest.raises((ConfigError, PluginLoadError)) as refused:
        async with ToolHost(config=cfg, builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path):
            pass
    message = str(refused.value)
    assert "plugins.mcp.servers.inner.headers.Authorization" in message and "must be references" in message
    assert ALICE not in message


async def test_freeze_heap_freezes_what_start_up_left_while_serving(tmp_path: Path) -> None:
    # Full collections over the server's start-up heap (≈ 95,000 objects) took 35-69 ms of a request.
    import gc

    gc.unfreeze()  # some builds start with objects frozen (pyenv's 3.12.1: 375); this is a heap nobody froze
    async with served(config(tmp_path), freeze_heap=True) as url:
        assert gc.get_freeze_count() > 10_000
        async with session(url, BOB) as bob:
            assert not (await bob.call_tool("fs_list_dir", {"path": "."})).is_error
    assert gc.get_freeze_count() == 0  # unfrozen when serving ends: a process that goes on collects it again


def test_serve_mcp_freezes_the_heap_and_the_library_calls_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from amplifier_tools.mcp import __main__ as program
    from amplifier_tools.mcp import server

    for function in (serve_http, server.serve, server.serve_configured):  # a process that goes on: left alone
        assert inspect.signature(function).parameters["freeze_heap"].default is False
    seen: dict[str, Any] = {}

    async def fake(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(server, "serve_configured", fake)
    assert program.run_serve(None) == 0
    assert seen["freeze_heap"] is True


async def test_freeze_heap_leaves_a_heap_frozen_before_it_frozen(tmp_path: Path) -> None:
    # gc.unfreeze() thaws everything: a process that froze its own objects before serving keeps them frozen.
    import gc

    gc.freeze()
    try:
        before = gc.get_freeze_count()
        async with served(config(tmp_path), freeze_heap=True):
            pass
        assert gc.get_freeze_count() >= before > 0
    finally:
        gc.unfreeze()


# -- found by a newcomer's pass -----------------------------------------------------------------

def test_a_token_written_where_its_reference_belongs_is_not_printed(tmp_path: Path) -> None:
    """``token_ref = "${MCP_TOKEN}"`` (or the token pasted in) used to be echoed in the error."""
    cfg = config(tmp_path)
    cfg["plugins"]["mcp"]["serve"]["clients"][0]["token_ref"] = ALICE

    with pytest.raises(ConfigError) as refused:
        build_http_app(cfg)
    assert ALICE not in str(refused.value) and ALICE not in (refused.value.hint or "")
    assert refused.value.key == "plugins.mcp.serve.clients[0].token_ref"
    assert "'alice_token'" in str(refused.value)  # the [secrets] keys there are


def test_a_reference_whose_variable_is_unset_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_BOB_TOKEN")

    with pytest.raises(ConfigError) as refused:
        build_http_app(config(tmp_path))
    assert "TEST_BOB_TOKEN" in str(refused.value)
    assert refused.value.hint == "set TEST_BOB_TOKEN in the environment the host starts in"
    assert refused.value.key == "plugins.mcp.serve.clients[1].token_ref"


def test_a_client_that_sees_no_tool_is_warned_about_naming_the_setting(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tmp_path)
    del cfg["plugins"]["mcp"]["serve"]["tools"]  # bob has no tools of his own: he sees none

    with caplog.at_level("WARNING", logger="amplifier_tools.mcp"):
        build_http_app(cfg)
    warnings = [r.getMessage() for r in caplog.records if "exposed no tool" in r.getMessage()]
    assert warnings == ["serve-mcp: client 'bob_token' is exposed no tool; list them in plugins.mcp.serve.tools "
                        '(tools = ["*"] exposes every mounted tool)']


def test_serve_mcp_reports_a_config_error_as_every_command_does(tmp_path: Path) -> None:
    """The hint line (here the did-you-mean of a misspelt key) used to be dropped by serve-mcp."""
    from cli_helpers import cli

    (tmp_path / "cfg.toml").write_text('[plugins.mcp.serve]\ntransport = "streamable-http"\nallow_anonymus = true\n')
    done = cli(tmp_path, "--config", str(tmp_path / "cfg.toml"), "serve-mcp", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "allow_anonymus" in done.stderr
    assert "hint:" in done.stderr and "allow_anonymous" in done.stderr.split("hint:", 1)[1], done.stderr


def test_serving_beyond_loopback_warns_that_tokens_travel_unencrypted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="amplifier_tools.mcp"):
        build_http_app(config(tmp_path, host="127.0.0.1"))
        assert not [r for r in caplog.records if "unencrypted" in r.getMessage()]
        build_http_app(config(tmp_path, host="0.0.0.0"))
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records if "unencrypted" in r.getMessage()] == \
        ["serving plain HTTP on 0.0.0.0"]


def test_a_port_given_to_a_stdio_server_is_refused_not_ignored(tmp_path: Path) -> None:
    """``serve-mcp --port 8765`` without ``--transport streamable-http`` used to serve stdio,
    silently, while the user waited for an HTTP server."""
    from cli_helpers import cli

    (tmp_path / "cfg.toml").write_text('[plugins.mcp.serve]\ntools = ["*"]\n')
    done = cli(tmp_path, "--config", str(tmp_path / "cfg.toml"), "serve-mcp", "--port", "8765")
    assert done.returncode == 2, done.stderr
    assert "--port set where to listen for HTTP, but the transport is stdio" in done.stderr
    assert "hint: add --transport streamable-http" in done.stderr


# -- found by an attacker's pass (2026-11-25) ---------------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.mark.parametrize("order", ["valid first", "valid last"])
async def test_two_authorization_headers_are_refused_whichever_comes_first(tmp_path: Path, order: str) -> None:
    """The first header used to win: a proxy appending its own lost to what the client sent."""
    pair = [("authorization", f"Bearer {ALICE}"), ("authorization", "Bearer not-a-client-token-at-all")]
    if order == "valid last":
        pair.reverse()
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        refused = await http.post(url, json=INITIALIZE, headers=[*ACCEPT.items(), *pair])
        one = await http.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {ALICE}"})
    assert refused.status_code == 401 and one.status_code == 200
    assert [e["data"]["status"] for e in audit(tmp_path, "event")] == [401]


async def test_one_authorization_header_among_other_repeated_headers_is_taken(tmp_path: Path) -> None:
    """Gate reads the headers with ``dict`` and counts the Authorization ones only when some name came
    twice: another header sent twice leaves one token a client's."""
    repeated = [("x-forwarded-for", "10.0.0.1"), ("x-forwarded-for", "10.0.0.2")]
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        taken = await http.post(url, json=INITIALIZE,
                                headers=[*ACCEPT.items(), *repeated, ("authorization", f"Bearer {ALICE}")])
    assert taken.status_code == 200


async def test_a_host_header_without_a_port_is_this_server(tmp_path: Path) -> None:
    """Served on port 80, clients send ``Host: 127.0.0.1``: every request was refused 421."""
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        bare = await http.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {ALICE}",
                                                               "Host": "127.0.0.1", "Origin": "http://127.0.0.1"})
        other = await http.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {ALICE}",
                                                                "Host": "127.0.0.1.evil.example"})
    assert bare.status_code == 200
    assert other.status_code == 421


def test_the_sdks_refusal_lines_on_stderr_are_few_clipped_and_escaped() -> None:
    """A 60 KB Host header was a 60 KB warning line, ESC bytes reached the terminal, and a flood
    was a line per request."""
    import logging

    from amplifier_tools.mcp.http import MAX_LOG_LINE_CHARS, MAX_REFUSAL_EVENTS_PER_S, RefusalLogFilter

    now = [1000.0]
    guard = RefusalLogFilter(clock=lambda: now[0])

    def line(host: str) -> str | None:
        record = logging.LogRecord("mcp.server.transport_security", logging.WARNING, __file__, 1,
                                   "Invalid Host header: %s", (host,), None)
        return record.getMessage() if guard.filter(record) else None

    kept = [line("x\x1b[2J\x1b[31mFAKE LOG LINE\x1b[0m" + "h" * 60_000) for _ in range(25)]
    written = [text for text in kept if text is not None]
    assert len(written) == MAX_REFUSAL_EVENTS_PER_S
    assert all("\x1b" not in text and "\\x1b[2J" in text for text in written)
    assert all(len(text) < MAX_LOG_LINE_CHARS + 40 for text in written)
    now[0] += 1
    assert (line("evil.example") or "").endswith("(15 more such lines left out before this one)")


async def test_serve_http_filters_the_sdks_refusal_lines_while_serving(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    async with served(config(tmp_path)) as url, httpx2.AsyncClient() as http:
        with caplog.at_level("WARNING", logger="mcp.server.transport_security"):
            for _ in range(30):
                await http.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {ALICE}",
                                                                "Host": "evil\x1b[31m.example"})
    lines = [r.getMessage() for r in caplog.records if r.name == "mcp.server.transport_security"]
    assert 1 <= len(lines) < 30 and all("\x1b" not in text for text in lines)  # 10 a second
    import logging

    assert not logging.getLogger("mcp.server.transport_security").filters  # removed when serving ended


@pytest.mark.parametrize(("value", "problem"), [
    (f"Bearer {ALICE}\r", "holds a control character"),
    (f"Bearer {ALICE} ", "begins or ends with a space"),
    (f"Bearer {ALICE}é", "beyond ASCII"),
])
async def test_an_import_header_value_no_request_can_carry_names_its_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, problem: str) -> None:
    """A CRLF .env file's CR used to fail at the first request, as httpx's 'Illegal header value'."""
    monkeypatch.setenv("TEST_INNER_AUTH", value)
    with pytest.raises(PluginLoadError) as refused:
        async with ToolHost(config=importing("http://127.0.0.1:9/mcp"), builtins=["mcp"], entry_points=False,
                            discover=False, working_dir=tmp_path):
            pass
    text = str(refused.value)
    assert "plugins.mcp.servers.inner.headers.Authorization" in text and problem in text
    assert ALICE not in text


async def test_an_import_header_name_that_is_no_http_token_names_its_key(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")
    cfg = importing("http://127.0.0.1:9/mcp")
    cfg["plugins"]["mcp"]["servers"]["inner"]["headers"] = {"Author ization": "inner_auth"}
    with pytest.raises(PluginLoadError, match=r"headers\.Author ization.*is not an HTTP header name"):
        async with ToolHost(config=cfg, builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path):
            pass


async def test_a_server_asking_for_credentials_none_were_sent_for_says_so(tmp_path: Path) -> None:
    """It used to say 'the credentials in headers were refused' with no headers configured."""
    async with served(config(tmp_path)) as url:
        with pytest.raises(PluginLoadError) as refused:
            async with ToolHost(config={"plugins": {"mcp": {"servers": {"inner": {"url": url}}}}},
                                builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path):
                pass
    assert "HTTP 401" in str(refused.value) and "none were sent: configure headers" in str(refused.value)


def test_a_flood_of_one_kind_of_sdk_line_does_not_hide_another() -> None:
    """One budget for every SDK line let a token holder's 421 flood drop the SDK's error lines."""
    import logging

    from amplifier_tools.mcp.http import RefusalLogFilter

    guard = RefusalLogFilter(clock=lambda: 1000.0)

    def kept(name: str, level: int) -> bool:
        return guard.filter(logging.LogRecord(name, level, __file__, 1, "line", (), None))

    assert sum(kept("mcp.server.transport_security", logging.WARNING) for _ in range(100)) == 10
    assert kept("mcp.server.streamable_http", logging.ERROR)
    assert kept("mcp.server.streamable_http_manager", logging.WARNING)


async def test_one_import_header_spelt_twice_names_the_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Authorization`` and ``authorization`` were both sent, and the server's 401 blamed the credentials."""
    monkeypatch.setenv("TEST_INNER_AUTH", f"Bearer {ALICE}")
    cfg = importing("http://127.0.0.1:9/mcp")
    cfg["plugins"]["mcp"]["servers"]["inner"]["headers"] = {"Authorization": "inner_auth",
                                                             "authorization": "inner_auth"}
    with pytest.raises(PluginLoadError, match=r"headers\.authorization.*are one HTTP header"):
        async with ToolHost(config=cfg, builtins=["mcp"], entry_points=False, discover=False, working_dir=tmp_path):
            pass


async def test_without_an_audit_log_a_refusal_is_a_warning_line_few_and_escaped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a review: with the audit plugin off, a 401 (and a tool refused) left no trace at
    all. Now each is one warning line naming the event and the setting, under the same budget as
    the events (a flood gives at most MAX_REFUSAL_EVENTS_PER_S lines a second), with what the
    client chose escaped, never the token."""
    import math
    import time

    from amplifier_tools.mcp.http import MAX_REFUSAL_EVENTS_PER_S, UNAUTHORIZED_EVENT

    caplog.set_level("WARNING", logger="amplifier_tools.mcp")
    cfg = config(tmp_path)
    del cfg["plugins"]["audit"]
    async with served(cfg, builtins=("filesystem", "mcp")) as url, httpx2.AsyncClient() as http:
        started = time.monotonic()
        wrong = await http.post(url + "/%1b[2J%0aforged", json={},
                                headers={"Authorization": "Bearer not-a-token-at-all"})
        assert wrong.status_code == 401
        for _ in range(30):
            assert (await http.post(url, json={})).status_code == 401
        seconds = math.ceil(time.monotonic() - started) + 1
        async with session(url, ALICE) as alice:
            with pytest.raises(MCPError):
                await alice.call_tool("fs_list_dir", {"path": "."})  # outside alice's tools
    lines = [r.getMessage() for r in caplog.records if r.name == "amplifier_tools.mcp"]
    refusals = [line for line in lines if UNAUTHORIZED_EVENT in line]
    assert refusals and len(refusals) <= min(31, MAX_REFUSAL_EVENTS_PER_S * seconds)
    assert "[plugins.audit]" in refusals[0]
    assert all("\x1b" not in line and "\n" not in line and line.isascii() for line in lines)
    first = _fields(refusals[0])  # one JSON object: a reader parses it without guessing at quotes
    assert first["status"] == 401 and first["path"].endswith("/\x1b[2J\nforged")
    assert not any("not-a-token-at-all" in line or ALICE in line for line in lines)
    refused_tool = [_fields(line) for line in lines if "mcp.http.tool_refused" in line]
    assert len(refused_tool) == 1 and refused_tool[0]["tool"] == "fs_list_dir"
    assert refused_tool[0]["principal"] == "alice"
    assert not (tmp_path / "audit.jsonl").exists()



LONG_TOKEN = "bob-token-0123456789abcdef-bob" * 2  # 60 characters: cut at 64 in a path past /mcp/x/


@pytest.mark.parametrize("audit", [True, False])
async def test_a_token_cut_by_the_clip_is_not_logged_in_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, audit: bool) -> None:
    """Found by an attack (older): a refusal's path was clipped to MAX_FIELD_CHARS before it was
    redacted, so a token straddling the cut no longer matched and its head (57 of 60 characters)
    was written, to the audit event and to the no-audit warning line alike. Redacted, then cut."""
    monkeypatch.setenv("TEST_BOB_TOKEN", LONG_TOKEN)
    caplog.set_level("WARNING", logger="amplifier_tools.mcp")
    cfg = config(tmp_path)
    if not audit:
        del cfg["plugins"]["audit"]
    async with served(cfg, builtins=("filesystem", "mcp", *(("audit",) if audit else ()))) as url, \
            httpx2.AsyncClient() as http:
        assert (await http.post(f"{url}/x/{LONG_TOKEN}", json={})).status_code == 401
    written = (tmp_path / "audit.jsonl").read_text() if audit else \
        "\n".join(r.getMessage() for r in caplog.records if r.name == "amplifier_tools.mcp")
    assert "mcp.http.unauthorized" in written
    assert LONG_TOKEN[:20] not in written  # before: "/mcp/x/bob-token-0123456789abcdef-bobbob-token-..."


def _fields(line: str) -> dict[str, Any]:
    """The JSON object of a no-audit refusal line (``serve-mcp: <event>: {...} (the host has ...)``)."""
    start = line.index("{")
    fields, _ = json.JSONDecoder().raw_decode(line, start)
    assert isinstance(fields, dict)
    return fields


async def test_without_an_audit_log_a_quote_in_a_value_is_read_back_as_sent(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Noticed and left by a review: the line wrote each value with ``repr``, which switches to
    double quotes for a value holding ``'``, so a ``key='value'`` reader misread such a line
    (a path with ``' principal='admin``). The fields are one JSON object now."""
    caplog.set_level("WARNING", logger="amplifier_tools.mcp")
    cfg = config(tmp_path)
    del cfg["plugins"]["audit"]
    async with served(cfg, builtins=("filesystem", "mcp")) as url, httpx2.AsyncClient() as http:
        assert (await http.post(url + "/x'%20principal='admin", json={})).status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "amplifier_tools.mcp"]
    fields = _fields(next(line for line in lines if "mcp.http.unauthorized" in line))
    assert fields["path"].endswith("/x' principal='admin") and "principal" not in fields


async def test_without_an_audit_log_a_token_in_the_path_is_not_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a review: a client that puts its token in the URL (``.../mcp/<token>``) and no Authorization header
    gets a 401. The audit event's path is redacted (the token is in session.secrets); the warning
    line written instead when the audit plugin is off carries it in clear (64 chars fit a token)."""
    caplog.set_level("WARNING", logger="amplifier_tools.mcp")
    cfg = config(tmp_path)
    del cfg["plugins"]["audit"]
    async with served(cfg, builtins=("filesystem", "mcp")) as url, httpx2.AsyncClient() as http:
        assert (await http.post(f"{url}/{BOB}", json={})).status_code == 401
    lines = [r.getMessage() for r in caplog.records if r.name == "amplifier_tools.mcp"]
    assert any("mcp.http.unauthorized" in line for line in lines)
    assert not any(BOB in line for line in lines), lines


async def test_a_token_ref_error_names_the_configuration_file(tmp_path: Path) -> None:
    """Found by a new-user trial: the error for a ``token_ref`` that is no ``[secrets]`` key named
    the key but not the file (every other configuration error does). The reference itself is still
    not quoted: it may be the token, written in by mistake."""
    cfg = config(tmp_path, clients=[{"token_ref": "ci_token", "principal": "ci"}])
    file = tmp_path / "amplifier-tools.toml"
    file.write_text(f"working_dir = {cfg['working_dir']!r}\nstate_dir = {cfg['state_dir']!r}\n"
                    "[secrets]\nGITHUB_TOKEN = 'GITHUB_TOKEN'\n"
                    "[plugins.mcp.serve]\ntransport = 'streamable-http'\nport = 0\ntools = ['local::fs.read_file']\n"
                    "[[plugins.mcp.serve.clients]]\ntoken_ref = 'ci_token'\nprincipal = 'ci'\n")
    with pytest.raises((ConfigError, PluginLoadError)) as refused:
        async with ToolHost(config=file, builtins=["filesystem", "mcp"], entry_points=False, discover=False) as host:
            await serve_http(host, serve_settings(host), ready=lambda url: None)
    message = str(refused.value)
    assert message.startswith(f"{file}: plugins.mcp.serve.clients[0].token_ref: the token_ref is not a key"), message
    assert "ci_token" not in message


# -- found by a newcomer's trial (2026-12-02): serve-mcp errors that named no file --------------


@pytest.mark.parametrize(("client", "key", "message"), [
    ({"token_ref": "alice_token", "principal": "a", "tools": ["fs_raed_file"]},
     "plugins.mcp.serve.clients[0].tools", "names no mounted tool 'fs_raed_file'"),
    ({"token_ref": "short", "principal": "a"}, "plugins.mcp.serve.clients[0].token_ref",
     "the token of 'short' is 11 characters; at least 16 are needed"),
])
async def test_a_client_error_names_the_configuration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           client: dict[str, Any], key: str, message: str) -> None:
    """A client's ``tools`` typo or a too-short token named the key but not the file."""
    monkeypatch.setenv("TEST_SHORT", "short-token")
    cfg = config(tmp_path, clients=[client])
    cfg["secrets"]["short"] = "TEST_SHORT"
    del cfg["plugins"]["audit"]
    file = tmp_path / "host.toml"
    file.write_text(json_to_toml(cfg))
    with pytest.raises((ConfigError, PluginLoadError)) as refused:
        async with ToolHost(config=file, builtins=["filesystem", "mcp"], entry_points=False, discover=False) as host:
            await serve_http(host, serve_settings(host), ready=lambda url: None)
    assert str(refused.value) == f"{file}: {key}: {message}"
    assert refused.value.hint  # type: ignore[union-attr]


def test_a_port_without_transport_names_the_configuration_file(tmp_path: Path) -> None:
    from cli_helpers import cli

    file = tmp_path / "cfg.toml"
    file.write_text('[plugins.mcp.serve]\ntools = ["*"]\n')
    done = cli(tmp_path, "--config", str(file), "serve-mcp", "--port", "8765")
    assert done.returncode == 2, done.stderr
    assert f"error: {file}: plugins.mcp.serve.transport: --port set where to listen for HTTP" in done.stderr
    assert f'hint: add --transport streamable-http (or set transport = "streamable-http" in [plugins.mcp.serve] ' \
           f"of {file})" in done.stderr


@pytest.mark.parametrize("where", ["flag", "file"])
def test_a_port_in_use_names_the_option_or_the_file_that_set_it(tmp_path: Path, where: str) -> None:
    """A port in use named ``plugins.mcp.serve.port`` alone: neither the file that set it, nor
    ``--port`` when the command line had."""
    import socket

    from cli_helpers import cli

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        file = tmp_path / "cfg.toml"
        file.write_text('[plugins.mcp.serve]\ntools = ["*"]\nallow_anonymous = true\ntransport = "streamable-http"\n'
                        + (f"port = {port}\n" if where == "file" else ""))
        done = cli(tmp_path, "--config", str(file), "serve-mcp", *(["--port", str(port)] if where == "flag" else []))
    assert done.returncode == 2, done.stderr
    named = f"--port {port}" if where == "flag" else f"{file}: plugins.mcp.serve.port"
    assert f"error: {named}: cannot listen on 127.0.0.1:{port}: " in done.stderr, done.stderr
    assert "hint: choose a free port (--port, or port in [plugins.mcp.serve]; 0 for any)" in done.stderr
