"""The HTTP gate's own work per request (issue 18: a served call ≤ +50 µs over a bare SDK server):
authentication, each client's session quota and the refusal watch are one layer in front of the
SDK's app, reading the request's headers once; the client's token goes no further than the gate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp")

from test_mcp_http import ALICE

from amplifier_tools.mcp.http import ClientTokens, EventBudget, Gate, _digest


def _gate(app: Any) -> Gate:
    return Gate(app, ClientTokens({_digest(ALICE): "alice_token"}), EventBudget(None))


async def _ignore(message: Any) -> None:
    return None


@pytest.mark.parametrize("pairs", [list, tuple])
def test_the_token_goes_no_further_than_the_gate(pairs: Any) -> None:
    """The SDK's app gets the request without its Authorization header (the client is in
    ``scope["user"]``); every other header as it came, in order. Found by count: each of the
    SDK's header lookups per request (a dozen, Starlette's loop over the list) passed it."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["headers"], scope["user"].access_token.client_id))
        await send({"type": "http.response.start", "status": 200, "headers": []})

    headers = pairs([(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {ALICE}".encode()),
                     (b"mcp-session-id", b"s1"), (b"content-type", b"application/json")])
    asyncio.run(_gate(app)({"type": "http", "method": "POST", "path": "/mcp", "headers": headers}, None, _ignore))
    assert seen == [(pairs([(b"host", b"127.0.0.1"), (b"mcp-session-id", b"s1"),
                            (b"content-type", b"application/json")]), "alice_token")]
