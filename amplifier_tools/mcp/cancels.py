"""A session's write stream on which ``notifications/cancelled`` never holds its sender.

When an MCP call is cancelled (the host's deadline, the caller), the SDK's ``send_request`` sends
the server a courtesy ``notifications/cancelled`` before it lets the cancellation go on, shielded,
for up to 5 s. A server that has stopped reading its stdin (a full pipe), or an HTTP server that
holds the transport's writer, made every cancelled call end up to 5 s past its deadline (found by
attack). ``LetGoCancels`` sits between the ``ClientSession`` and its transport: it hands each
cancellation to a task of its own and returns at once, so the call ends at its deadline, and every
other message goes straight through. The call's request then runs in the call's own task: no task
per request, and no extra turns of the event loop per call (bench_mcp's HTTP import row).

Limits: a cancellation may reach the server after a later message of the same session (the
server ignores a cancellation of an id it has answered or never saw); one that cannot be written
within ``CANCEL_WRITE_TIMEOUT_S`` (the SDK's own bound) or before the session closes is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any, Final

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

log = logging.getLogger(__name__)

#: How long a courtesy cancellation may wait for the transport (the SDK's bound for its own).
CANCEL_WRITE_TIMEOUT_S: Final = 5.0

#: Cancellations being written: referenced until they end (asyncio holds tasks weakly).
PENDING: set[asyncio.Task[None]] = set()


class LetGoCancels:
    """The ``WriteStream`` given to a ``ClientSession``: ``inner`` (the transport's write stream),
    except that a ``notifications/cancelled`` is written by a task of its own."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        message = item.message
        if type(message) is mcp_types.JSONRPCNotification and message.method == "notifications/cancelled":
            task = asyncio.get_running_loop().create_task(self._write_cancel(item))
            PENDING.add(task)
            task.add_done_callback(PENDING.discard)
            return
        await self._inner.send(item)

    async def _write_cancel(self, item: SessionMessage) -> None:
        try:
            with anyio.fail_after(CANCEL_WRITE_TIMEOUT_S):
                await self._inner.send(item)
        except (TimeoutError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.debug("a courtesy notifications/cancelled was dropped: the transport did not take it")

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> LetGoCancels:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result
