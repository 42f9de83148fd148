"""One fetch's connections, cut at a total deadline or when the call is cancelled.

urllib's ``timeout`` bounds each socket operation, not the request: a server that sends one
byte every (timeout - ε) seconds holds the call for as long as it likes, and the worker thread
keeps reading after the host has given up on the call (found by attack). ``Transfer`` records
the socket of every connection it opens (urllib drops the connection's own reference once
the headers are read; the response keeps reading the socket); ``abort()`` (from the event loop, at the deadline or on
cancellation) shuts their sockets down, which makes the blocked read in the worker return at
once. Limits: name resolution (``getaddrinfo``) cannot be interrupted; a worker stuck there
ends when the resolver gives up.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request
from typing import Any


class Transfer:
    """The connections of one fetch and its deadline (monotonic seconds)."""

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.aborted = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left; ``TimeoutError`` once none are."""
        left = self.deadline - time.monotonic()
        if self.aborted or left <= 0:
            raise TimeoutError("deadline reached")
        return left

    def opened(self, sock: socket.socket) -> None:
        """Record a connected socket; one connected after ``abort()`` is cut at once."""
        with self._lock:
            self._sockets.append(sock)
            aborted = self.aborted
        if aborted:
            _cut(sock)
            raise TimeoutError("deadline reached")

    def abort(self) -> None:
        """Shut down every socket of this fetch (any thread; idempotent)."""
        with self._lock:
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            _cut(sock)

    def opener(self, redirects: urllib.request.HTTPRedirectHandler) -> urllib.request.OpenerDirector:
        """An opener whose connections this transfer records. No proxy: ``HTTP(S)_PROXY`` from
        the environment would route every allowlisted request through another host."""
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), redirects,
                                           _HTTPHandler(self), _HTTPSHandler(self))


def _cut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown: ssl.SSLSocket.shutdown would drop its TLS state under the reader
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


class _Recorded:
    """Mixin: connect within the transfer's remaining time, then let it record the connection."""

    transfer: Transfer
    timeout: float | None

    def connect(self) -> None:
        left = self.transfer.remaining()
        self.timeout = min(self.timeout, left) if isinstance(self.timeout, (int, float)) else left
        super().connect()  # type: ignore[misc]
        self.transfer.opened(self.sock)  # type: ignore[attr-defined]


class _HTTPConnection(_Recorded, http.client.HTTPConnection):
    def __init__(self, host: str, *, transfer: Transfer, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.transfer = transfer


class _HTTPSConnection(_Recorded, http.client.HTTPSConnection):
    def __init__(self, host: str, *, transfer: Transfer, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.transfer = transfer


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, transfer: Transfer) -> None:
        super().__init__()
        self._transfer = transfer

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_factory(_HTTPConnection, self._transfer), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, transfer: Transfer) -> None:
        super().__init__()
        self._transfer = transfer

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context = getattr(self, "_context", None)
        return self.do_open(_factory(_HTTPSConnection, self._transfer), req,
                            context=context)


def _factory(cls: type[http.client.HTTPConnection], transfer: Transfer) -> Any:
    def make(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        return cls(host, transfer=transfer, **kwargs)  # type: ignore[call-arg]
    return make
