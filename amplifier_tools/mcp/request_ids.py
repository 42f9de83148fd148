"""One request per id in flight over ``serve-mcp``'s stdio: a request whose id is already in use by
one of the client's requests in flight is answered at once, -32600 with its id, and never reaches
the SDK (it does not run).

Found by attack: the SDK keys a session's requests in flight by their id, so a second request with
the id of one in flight took its place: over stdio both ran and both answers came under the one id,
so the client could not tell them apart, and ``notifications/cancelled`` for that id cancelled the
second call only. JSON-RPC (and MCP: "MUST NOT match the ID of any other request the sender has
issued and not yet received a response for") puts the uniqueness on the client, but a gateway must
not mix up two calls' outcomes because a client broke it; the SDKs' own fixes (python-sdk
#3060/#3063, ruby-sdk #521) refuse the second request the same way.

Ids are compared as the SDK correlates them (``coerce_request_id``: ``7`` and ``"7"`` are one id,
as are ``5`` and ``"05"``, which JSON-RPC tells apart); an id is free again once its request is
answered (a client that sends every request with id 1, one after the other, is never refused) or
settled without an answer (cancelled, and its cancellation finished). A notification names no id
and is never refused. Each check is a set lookup.

Not covered: Streamable HTTP. There the SDK's transport keys its response streams by id before a
request reaches its session, so the check would have to parse every POST's body in front of the
SDK (measured ≈ 4 µs a POST, against issue 18's overhead target) and rely on the SDK's provisional
``Server.middleware``; a client that reuses an id in flight there loses the first POST's answer
(the call itself runs, ends and is audited). Left to the SDK's own fix (python-sdk #3063).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from mcp.shared.dispatcher import coerce_request_id

log = logging.getLogger("amplifier_tools.mcp")

#: The message of the answer to a request whose id is in use.
ID_IN_USE: Final = ("Invalid Request: id already in use by a request of this session in flight; a request id "
                    "must differ from those of the requests still waiting for their answer")


class StdioIds:
    """The ids of the stdio client's requests in flight (``StdioPipes``)."""

    __slots__ = ("_ids", "_warned")

    def __init__(self) -> None:
        self._ids: set[Any] = set()
        self._warned = False

    def claim(self, rid: str | int) -> bool:
        """Take ``rid`` for a request now in flight; False (and nothing taken) when it is in use."""
        key = coerce_request_id(rid)
        if key in self._ids:
            if not self._warned:
                self._warned = True
                log.warning("serve-mcp: the client sent a request with the id of one still in flight; it was "
                            "answered -32600 and not run (later ones are answered so without a warning)")
            return False
        self._ids.add(key)
        return True

    def free(self, rid: str | int) -> None:
        """``rid``'s request is answered or settled: the id may be used again."""
        self._ids.discard(coerce_request_id(rid))

    def on_unanswered(self, rid: str | int) -> Callable[[], Awaitable[None]]:
        """What the SDK calls when ``rid``'s request settles without an answer (it was cancelled)."""
        async def settled() -> None:
            self.free(rid)

        return settled
