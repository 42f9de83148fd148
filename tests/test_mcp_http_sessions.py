"""serve-mcp over Streamable HTTP: open sessions are bounded per client and in all
(``max_sessions_per_client``, ``max_sessions``, ``session_idle_s``). Found by attack: one token
holder that sent ``initialize`` and never ``DELETE`` kept every session (≈ 38 KB and two tasks
each) until the SDK's shared limit of 10,000 refused every other client's ``initialize``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2
from mcp_helpers import served_http as served

from amplifier_tools.errors import ConfigError, PluginLoadError

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef-bob"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
ACCEPT = "application/json, text/event-stream"


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ALICE_TOKEN", ALICE)
    monkeypatch.setenv("TEST_BOB_TOKEN", BOB)


def config(tmp_path: Path, **serve: Any) -> dict[str, Any]:
    clients = [{"token_ref": "alice_token", "principal": "alice"}, {"token_ref": "bob_token", "principal": "bob"}]
    (tmp_path / "root").mkdir(exist_ok=True)
    return {"working_dir": str(tmp_path / "root"), "state_dir": str(tmp_path / "state"),
            "secrets": {"alice_token": "TEST_ALICE_TOKEN", "bob_token": "TEST_BOB_TOKEN"},
            "plugins": {"audit": {"path": str(tmp_path / "audit.jsonl")},
                        "mcp": {"serve": {"transport": "streamable-http", "port": 0, "clients": clients,
                                          "tools": ["local::fs.read_file"], **serve}}}}


async def open_session(http: httpx2.AsyncClient, url: str, token: str) -> httpx2.Response:
    return await http.post(url, json=INITIALIZE, headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT})


async def test_a_client_cannot_hold_more_open_sessions_than_its_share(tmp_path: Path) -> None:
    async with served(config(tmp_path, max_sessions_per_client=2)) as url, httpx2.AsyncClient(timeout=30) as http:
        first, second = [await open_session(http, url, ALICE) for _ in range(2)]
        assert first.status_code == second.status_code == 200
        refused = await open_session(http, url, ALICE)
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert "plugins.mcp.serve.max_sessions_per_client" in error["message"] and "DELETE" in error["message"]
        # another client is not refused: the limit is alice's, not everyone's
        assert (await open_session(http, url, BOB)).status_code == 200
        # a session alice ends makes room for another
        ended = await http.delete(url, headers={"Authorization": f"Bearer {ALICE}", "Accept": ACCEPT,
                                                "mcp-session-id": first.headers["mcp-session-id"],
                                                "mcp-protocol-version": "2025-06-18"})
        assert ended.status_code < 400
        assert (await open_session(http, url, ALICE)).status_code == 200
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refusals = [e for e in events if e.get("event") == "mcp.http.sessions_refused"]
    assert len(refusals) == 1
    assert "alice_token" in json.dumps(refusals[0]) and ALICE not in json.dumps(refusals[0])


async def test_max_sessions_bounds_the_sessions_of_all_clients(tmp_path: Path) -> None:
    async with served(config(tmp_path, max_sessions=2)) as url, httpx2.AsyncClient(timeout=30) as http:
        assert (await open_session(http, url, ALICE)).status_code == 200
        assert (await open_session(http, url, BOB)).status_code == 200
        assert (await open_session(http, url, BOB)).status_code == 503  # the SDK's answer at its limit


async def test_concurrent_openings_are_counted_against_the_share() -> None:
    """Unit: initialize requests in flight at once cannot all pass the check (no server needed)."""
    import asyncio

    from amplifier_tools.mcp.http_sessions import SessionQuota

    release = asyncio.Event()
    sent: list[int] = []

    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"mcp-session-id", str(id(scope)).encode())]})

    async def record(message: Any) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    class User:
        class access_token:  # the SDK's attribute name
            client_id = "alice_token"

    quota = SessionQuota(sdk, per_client=3, idle_s=60)
    scopes = [{"type": "http", "method": "POST", "headers": [], "user": User()} for _ in range(5)]
    tasks = [asyncio.ensure_future(quota(scope, None, record)) for scope in scopes]
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(sent) == [200, 200, 200, 429, 429]
    assert quota.open_sessions("alice_token") == 3


def test_an_idle_session_stops_counting_after_session_idle_s() -> None:
    """Unit: the count drops a session idle for ``session_idle_s``, as the SDK ends it then."""
    import asyncio

    from amplifier_tools.mcp.http_sessions import SessionQuota

    now = [0.0]

    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", b"s1")]})

    async def ignore(message: Any) -> None:
        return None

    class User:
        class access_token:  # the SDK's attribute name
            client_id = "alice_token"

    quota = SessionQuota(sdk, per_client=1, idle_s=10, clock=lambda: now[0])
    asyncio.run(quota({"type": "http", "method": "POST", "headers": [], "user": User()}, None, ignore))
    assert quota.open_sessions("alice_token") == 1
    now[0] = 9.9
    assert quota.open_sessions("alice_token") == 1
    now[0] = 10.0
    assert quota.open_sessions("alice_token") == 0


@pytest.mark.parametrize(("key", "value"), [("session_idle_s", 0), ("session_idle_s", float("inf")),
                                            ("max_sessions", 0), ("max_sessions_per_client", -1)])
def test_a_session_limit_that_is_no_limit_is_refused_naming_it(tmp_path: Path, key: str, value: Any) -> None:
    import asyncio

    async def start() -> None:
        async with served(config(tmp_path, **{key: value})):
            pass

    with pytest.raises((ConfigError, PluginLoadError)) as refused:
        asyncio.run(start())
    assert f"plugins.mcp.serve.{key}" in str(refused.value)
    assert "unknown key" not in str(refused.value)


# Found by attack on the quota: answers that end no session took a session the SDK still held off
# the client's count, so the share could be slipped without end.
def named_by_alice(session: str, *more: tuple[str, str]) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {ALICE}"), ("Accept", ACCEPT), ("mcp-protocol-version", "2025-06-18"),
            ("mcp-session-id", session), *more]


async def test_a_404_to_another_path_does_not_end_a_counted_session(tmp_path: Path) -> None:
    async with served(config(tmp_path, max_sessions_per_client=1)) as url, httpx2.AsyncClient(timeout=30) as http:
        first = await open_session(http, url, ALICE)
        assert first.status_code == 200
        session = first.headers["mcp-session-id"]
        elsewhere = await http.get(url.rstrip("/") + "-not-here", headers=named_by_alice(session))
        assert elsewhere.status_code == 404
        assert (await open_session(http, url, ALICE)).status_code == 429


async def test_a_session_id_named_twice_does_not_end_the_counted_one(tmp_path: Path) -> None:
    async with served(config(tmp_path, max_sessions_per_client=1)) as url, httpx2.AsyncClient(timeout=30) as http:
        first = await open_session(http, url, ALICE)
        assert first.status_code == 200
        headers = named_by_alice("0" * 32, ("mcp-session-id", first.headers["mcp-session-id"]))
        answer = await http.get(url, headers=headers)
        assert answer.status_code >= 400
        assert (await open_session(http, url, ALICE)).status_code == 429


#: A request of the 2026-07-28 protocol: the SDK serves it on its single-exchange path, sessionless.
SINGLE_EXCHANGE = "2026-07-28"
SINGLE_META = {"io.modelcontextprotocol/protocolVersion": SINGLE_EXCHANGE,
               "io.modelcontextprotocol/clientCapabilities": {}}


def single_exchange(method: str, session: str | None = None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A 2026-07-28 request of ``method`` by alice (naming ``session``), and its headers."""
    headers = [("Authorization", f"Bearer {ALICE}"), ("Accept", ACCEPT), ("Content-Type", "application/json"),
               ("mcp-protocol-version", SINGLE_EXCHANGE), ("mcp-method", method)]
    if session is not None:
        headers.append(("mcp-session-id", session))
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"_meta": SINGLE_META}}, headers


async def test_a_single_exchange_404_naming_a_session_does_not_end_its_count(tmp_path: Path) -> None:
    """Found by attack: the SDK answers a 2026-07-28 request with an unknown method 404 (its
    "method not found"); naming one of its sessions in it, a client had the session taken off its
    count while the SDK held it, opened sessions past its share until ``max_sessions`` was full,
    and every other client's ``initialize`` was 503 (for ``session_idle_s``, 30 minutes); the audit
    log called each 404 a session that does not exist."""
    async with served(config(tmp_path, max_sessions_per_client=2, max_sessions=4)) as url, \
            httpx2.AsyncClient(timeout=30) as http:
        for _ in range(2):
            opened = await open_session(http, url, ALICE)
            assert opened.status_code == 200
            body, headers = single_exchange("no/such", opened.headers["mcp-session-id"])
            assert (await http.post(url, json=body, headers=headers)).status_code == 404
        assert (await open_session(http, url, ALICE)).status_code == 429
        assert (await open_session(http, url, BOB)).status_code == 200
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("event") == "mcp.http.unauthorized"] == []


async def test_a_client_at_its_share_still_gets_its_single_exchange_requests_answered(tmp_path: Path) -> None:
    """A 2026-07-28 request opens no session: it was refused 429 ("already holds 1 open
    sessions") to a client at its share, and written as a refused session."""
    async with served(config(tmp_path, max_sessions_per_client=1)) as url, httpx2.AsyncClient(timeout=30) as http:
        assert (await open_session(http, url, ALICE)).status_code == 200
        body, headers = single_exchange("tools/list")
        answer = await http.post(url, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert [tool["name"] for tool in answer.json()["result"]["tools"]] == ["fs_read_file"]
        assert (await open_session(http, url, ALICE)).status_code == 429  # the share still holds
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert len([e for e in events if e.get("event") == "mcp.http.sessions_refused"]) == 1


async def test_a_client_shut_out_by_a_full_max_sessions_is_an_audit_event(tmp_path: Path) -> None:
    """Found by attack: the SDK's 503 at ``max_sessions`` refused a client with nothing in the
    audit log (only the SDK's warning line, without the client)."""
    async with served(config(tmp_path, max_sessions=1)) as url, httpx2.AsyncClient(timeout=30) as http:
        assert (await open_session(http, url, ALICE)).status_code == 200
        assert (await open_session(http, url, BOB)).status_code == 503
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    refused = [e["data"] for e in events if e.get("event") == "mcp.http.unauthorized"]
    assert [(e["status"], e["client"]) for e in refused] == [(503, "bob_token")]
    assert "max_sessions" in refused[0]["reason"]


def test_a_session_is_not_idle_while_its_opening_request_is_in_flight() -> None:
    """Unit: the SDK counts the opening request among the session's requests in flight (no idle
    expiry until it ends); the count here did not, and dropped a session the SDK still held."""
    import asyncio

    from amplifier_tools.mcp.http_sessions import SessionQuota

    now = [0.0]
    release = asyncio.Event()

    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", b"s1")]})
        await release.wait()  # the answer's event stream still open

    async def ignore(message: Any) -> None:
        return None

    class User:
        class access_token:  # the SDK's attribute name
            client_id = "alice_token"

    async def run() -> None:
        quota = SessionQuota(sdk, per_client=1, idle_s=10, clock=lambda: now[0])
        opening = asyncio.ensure_future(
            quota({"type": "http", "method": "POST", "headers": [], "user": User()}, None, ignore))
        await asyncio.sleep(0.01)
        now[0] = 60.0
        assert quota.open_sessions("alice_token") == 1
        release.set()
        await opening
        now[0] = 69.9
        assert quota.open_sessions("alice_token") == 1  # idle from the end of the opening request
        now[0] = 70.0
        assert quota.open_sessions("alice_token") == 0

    asyncio.run(run())
