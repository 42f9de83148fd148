"""The Redis store's own connections for single commands: one round trip each, little else.

redis-py's ``Redis.execute_command`` costs about as much CPU as the loopback round trip itself
(a pool lock, a health check and a ``can_read`` per borrowed connection, observability events,
a retry wrapper, generic argument encoding). A decision needs none of it, so ``RedisLink`` keeps
its own free list of redis-py ``Connection`` objects (made by the client's pool, so the URL's
host, database, password, TLS or unix socket apply as before), packs the command itself and
calls the connection's ``send_packed_command`` and ``read_response``.

The guarantees are the client's:
- **Bounded.** Each command is bounded by a deadline (the store timeout, cut to the call's wait
  bound) through one shared ``Watchdog`` timer; a command past it is cancelled and raises
  ``StoreUnavailable``. redis-py drops a connection whose command was interrupted, so no late
  reply is ever read as the answer to the next command; only a connection whose reply was read
  in full goes back to the free list.
- **Reconnects.** A connection that failed is dropped; the next command makes a new one. A
  command that fails with a connection error on a connection that had been idle in the list
  (the server restarted meanwhile) is sent once more on a new connection, within the same
  deadline, as redis-py's own retry does — unless its sender says ``resend=False``. A
  ``READONLY`` reply (a failover made the server a replica; the command did not run) drops the
  connection and the idle ones too, and the command is sent once more on a new connection, which
  follows the address to the new primary. The first
  send may have run on the server with only its reply lost (a link dropped between the two), so
  a resent command runs twice: callers resend only commands whose second run refuses more,
  never admits more (a unit taken twice, a lease or reservation added twice under one holder),
  and send give-backs (a ``DECR``) with ``resend=False``: a lost give-back refuses one call too
  many in its window, a doubled one would admit one too many. So a give-back never goes to an
  idle connection whose end the server already sent (its ``timeout``, a restart): it would fail
  there without having run, and not be sent again.
- **Scripts.** ``EVALSHA``; a server that does not know the script (restarted, ``SCRIPT
  FLUSH``) gets it once with ``EVAL`` on the same connection.

- **Read-decide-write.** ``update`` changes one key as a check-and-set transaction (``WATCH``,
  ``GET`` and ``TIME`` sent together, then ``MULTI``, ``SET`` and ``EXEC``): two round trips on a
  connection that is already open, where redis-py's pipeline took four, and a fifth (``UNWATCH``)
  after a cancellation, on a connection of its own pool that the first update had to open
  (found by the flaky test of a slow store: the first breaker outcome took 12 round trips and
  overran its bound by half). A failure drops the connection, so no ``WATCH`` outlives it.
  The updates of one key from one link take turns (an ``asyncio.Lock`` per key, held while
  any wait for it, within each one's own bound): only another host's write makes one decide
  again (found by attack: 400 concurrent breaker outcomes of one tool raced each other through
  ``WATCH``, one write per round, the rest reading again — work growing with the square of
  their number — and 371 of them ran out of a 2 s store timeout).

- **At most ``max_connections``** (the client pool's setting: the URL's ``?max_connections=``,
  else ``DEFAULT_MAX_CONNECTIONS``). A command that finds none idle and the cap reached waits for
  the next one given back, first come first served, within its own bound. Found by test: 3,000
  concurrent calls of a rate-limited tool opened a connection each, and opening them (a connect
  and redis-py's handshake, several round trips) kept the loop so busy that 2,590 of them ran out
  of the 2 s store timeout (``policy_store_unavailable``), where SQLite admitted all 3,000.
- **Idle connections are closed** once they have gone unused for ``IDLE_S`` (the fewest idle at
  any moment of that span, which no command needed, are closed at its end), so a burst's
  connections do not stay open for the host's life.

Limits: no pipelining across decisions (one exchange per connection at a time); replies are
redis-py's (bytes, not decoded).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from collections.abc import Callable, Coroutine
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .store import StoreIncompatible, StoreUnavailable
from .watchdog import Watchdog


def bulk(value: Any) -> bytes:
    """One RESP bulk string: ``bytes`` as they are, ``str`` as UTF-8, numbers as redis-py writes them."""
    data = value if isinstance(value, bytes) else (value if isinstance(value, str) else repr(value)).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def pack(*parts: Any) -> bytes:
    """A command as one RESP array of bulk strings."""
    return b"*%d\r\n%s" % (len(parts), b"".join(map(bulk, parts)))


#: What to do about the replies that retrying does not mend (found by attack: a missing password,
#: a user without the right to run scripts, or a foreign key of another type at one of the
#: deployment's keys failed every call as a retryable ``policy_store_unavailable`` whose hint sent
#: people to check that the server was up).
_CREDENTIALS: Final = ("the password (and user name) in the URL of [plugins.policy] store are refused or missing: "
                       "the URL carries them between its '//' and an '@' before the host (percent-encode an '@', "
                       "':' or '/' in them)")
_PERMISSIONS: Final = ("the Redis user of [plugins.policy] store may not run a command the store needs: grant "
                       "it the commands docs/policy.md lists (EVALSHA and EVAL first) on the keys under "
                       "store_prefix")
_FOREIGN: Final = ("a key under [plugins.policy] store_prefix holds a value of another type, which this "
                   "release did not write (another deployment or program sharing the prefix, a person): give "
                   "each deployment its own store_prefix, or delete the key (`policy status` lists them)")


def unavailable(where: str, exc: BaseException) -> StoreUnavailable:
    """The error for a command of the store at ``where`` that failed with ``exc``: a
    ``StoreIncompatible`` (not retryable) whose hint names the setting for a refused password, a
    missing permission or a key of another type; else a ``StoreUnavailable``."""
    message = f"Redis store {where}: {exc}"
    text = str(exc)
    if isinstance(exc, AuthenticationError):
        return StoreIncompatible(message, hint=_CREDENTIALS)
    if isinstance(exc, NoPermissionError) or (isinstance(exc, ResponseError) and "NOPERM" in text[:200]):
        return StoreIncompatible(message, hint=_PERMISSIONS)  # NOPERM, or a script's command refused
    if isinstance(exc, ResponseError) and text.startswith("WRONGTYPE"):
        return StoreIncompatible(message, hint=_FOREIGN)
    return StoreUnavailable(message)


class Script:
    """A Lua script, sent by its SHA1 (``EVALSHA``); its text goes (``EVAL``) only to a server
    that does not know it."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = bulk(text)
        self.sha = bulk(hashlib.sha1(text.encode()).hexdigest())


#: The cap on a store's connections when its URL sets no ``max_connections``.
DEFAULT_MAX_CONNECTIONS: Final = 32
#: How long an idle connection may stay unused before it is closed (seconds).
IDLE_S: Final = 30.0

#: The first exchange of ``update`` after its ``WATCH`` and ``GET``: the server's clock.
TIME: Final = b"*1\r\n$4\r\nTIME\r\n"
#: What ``update``'s ``decide`` answers: the key's new value, its expiry (ms), and what to return.
Decision = tuple[bytes, int, Any]

Fallback = tuple[bytes, int, bytes, bytes]
"""What ``EVAL`` needs: its format, the number of parts, the script's text and the rest, packed."""


def evalsha(script: Script, keys: list[str], args: list[Any]) -> tuple[bytes, Fallback]:
    """The packed ``EVALSHA`` of ``script`` with ``keys`` and ``args``, and its ``EVAL`` fallback."""
    rest = b"".join(map(bulk, (len(keys), *keys, *args)))
    count = 3 + len(keys) + len(args)
    return (b"*%d\r\n$7\r\nEVALSHA\r\n%s%s" % (count, script.sha, rest),
            (b"*%d\r\n$4\r\nEVAL\r\n%s%s", count, script.text, rest))


class RedisLink:
    """Single commands on connections of ``client``'s pool, each bounded by a deadline."""

    def __init__(self, client: aioredis.Redis, where: str, timeout: float) -> None:
        self.client = client
        self.where = where
        self.timeout = timeout
        #: The bound of the next command instead of the store timeout (seconds). It is read as that
        #: command starts, so set it right before (no await in between); later ones are back to the
        #: store timeout. An attribute, not a method: it is set before every decision.
        self.wait = timeout
        self._idle: list[Any] = []  # connected, nothing unread: ready for a command (the last used last)
        self._all: set[Any] = set()
        #: At most this many connections at once (the client pool's ``max_connections``).
        self.max_connections: int = client.connection_pool.max_connections
        #: Commands waiting for a connection, first come first served: each future gets a
        #: connection given back, or None for room to make a new one.
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        #: The fewest idle connections since the last trim: those at the bottom of ``_idle`` went unused.
        self._fewest_idle = 0
        self._trimmer: asyncio.TimerHandle | None = None
        #: Set by ``close``: a command still in flight then connects nothing, and keeps nothing idle.
        self._closed = False
        self._closing: set[asyncio.Task[Any]] = set()
        self._updating: dict[str, _Turn] = {}  # key -> the updates of it under way here, in turn
        self.watchdog = Watchdog()

    def script(self, script: Script, keys: list[str], args: list[Any], *,
               resend: bool = True) -> Coroutine[Any, Any, Any]:
        """``EVALSHA`` of ``script`` (``EVAL`` if the server lacks it): one round trip. (A plain
        function returning the command's coroutine: every frame between a decision and its socket
        is paid for twice per round trip, on the way out and on the way back.)"""
        return self.command(*evalsha(script, keys, args), resend=resend)

    async def command(self, packed: bytes, fallback: Fallback | None = None, *, resend: bool = True) -> Any:
        """Send the packed command, return its reply (``fallback``: the ``EVAL`` to send instead
        when the server answers ``NOSCRIPT``; ``resend``: whether a connection error on an idle
        connection sends it once more, which runs it twice if only its reply was lost)."""
        wait, self.wait = self.wait, self.timeout
        task = asyncio.current_task()
        assert task is not None
        self.watchdog.enter(task, asyncio.get_running_loop().time() + wait)
        expired = False
        try:
            try:
                idle = self._idle
                if idle:
                    connection = idle.pop()
                    if len(idle) < self._fewest_idle:
                        self._fewest_idle = len(idle)
                    if not resend and _closed_by_server(connection):
                        connection = await self._open_one(connection)
                elif len(self._all) < self.max_connections:
                    return await self._on(self._new(), packed, fallback)
                else:
                    connection = await self._wait_for_connection()
                try:
                    return await self._on(connection, packed, fallback)
                except (RedisConnectionError, ReadOnlyError) as exc:
                    # It idled through a server restart, a dropped link or a failover (a replica now:
                    # nothing ran), and so did the others: once more, on a new connection (redis-py's
                    # client retries likewise), unless it may have run and must not run twice.
                    if not resend and not isinstance(exc, ReadOnlyError):
                        raise
                    self._drop_idle()
                    return await self._on(await self._fresh(), packed, fallback)
            finally:
                expired = self.watchdog.leave(task)
        except asyncio.CancelledError:
            if expired:
                raise StoreUnavailable(f"Redis store {self.where} did not answer within {wait:.3g} s",
                                       timed_out=True) from None
            raise
        except (RedisError, OSError) as exc:
            raise unavailable(self.where, exc) from exc

    async def _on(self, connection: Any, packed: bytes, fallback: Fallback | None) -> Any:
        """One command on ``connection``, which goes back to the free list only once its reply
        was read in full (an error reply included); on anything else it is dropped."""
        try:
            if not connection.is_connected:
                if self._closed:
                    raise RedisConnectionError("the store was closed")
                await connection.connect()
            await connection.send_packed_command(packed, check_health=False)
            try:
                reply = await connection.read_response()
            except NoScriptError:
                if fallback is None:
                    raise
                form, count, text, rest = fallback
                await connection.send_packed_command(form % (count, text, rest), check_health=False)
                reply = await connection.read_response()
        except ReadOnlyError:
            # A replica (found by attack: after a failover behind the same address, every command
            # went to the old primary, now a replica, for as long as its connections lived).
            self._discard(connection)
            raise
        except ResponseError:
            self._give_back(connection)
            raise
        except BaseException:
            self._discard(connection)
            raise
        self._give_back(connection)
        return reply

    def update(self, key: str, decide: Callable[[bytes | None, float], Decision]) -> Coroutine[Any, Any, Any]:
        """Change ``key`` by ``decide(current value or None, the server's time in seconds)`` and
        return what it answers third (a key of another type is read as the server's error, as
        text: no record ``decide`` wrote). Another writer that changed the key between the read and
        the write (``EXEC`` answers nil) makes it decide again on that writer's value. Bounded as
        ``command`` is, by the bound set before it. A connection error on a connection that had
        been idle is tried once more on a new one, as ``command`` does, but only before the write
        was sent (after, the write may have run: deciding again would count it twice)."""
        return self.bounded(self._in_turn(key, decide))

    async def _in_turn(self, key: str, decide: Callable[[bytes | None, float], Decision]) -> Any:
        """``update`` once the updates of ``key`` before it on this link are done."""
        turn = self._updating.get(key)
        if turn is None:
            turn = self._updating[key] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:  # one at a time per key and link: see the module's docstring
                if self._idle:
                    connection, idle = self._idle.pop(), True
                    self._fewest_idle = min(self._fewest_idle, len(self._idle))
                elif len(self._all) < self.max_connections:
                    connection, idle = self._new(), False
                else:
                    connection, idle = await self._wait_for_connection(), True
                try:
                    return await self._update(connection, key, decide)
                except _NotWritten as failed:
                    if not idle:
                        raise failed.error from None
                    self._drop_idle()
                    try:
                        return await self._update(await self._fresh(), key, decide)
                    except _NotWritten as again:
                        raise again.error from None
        finally:
            turn.users -= 1
            if not turn.users:
                del self._updating[key]

    async def _update(self, connection: Any, key: str, decide: Callable[[bytes | None, float], Decision]) -> Any:
        """``update`` on ``connection``: back to the free list only after ``EXEC`` was read."""
        watch = pack("WATCH", key) + pack("GET", key) + TIME
        try:
            while True:
                try:
                    if not connection.is_connected:
                        if self._closed:
                            raise RedisConnectionError("the store was closed")
                        await connection.connect()
                    await connection.send_packed_command(watch, check_health=False)
                    await connection.read_response()  # OK
                    try:
                        current = await connection.read_response()
                    except ResponseError as exc:  # WRONGTYPE: a key of another type, not ours; ``SET`` replaces it
                        current = str(exc).encode()
                    seconds, micros = await connection.read_response()
                except RedisConnectionError as exc:
                    raise _NotWritten(exc) from exc
                value, ttl_ms, answer = decide(current, int(seconds) + int(micros) / 1e6)
                await connection.send_packed_command(pack("MULTI") + pack("SET", key, value, "PX", ttl_ms)
                                                     + pack("EXEC"), check_health=False)
                await connection.read_response()  # OK
                try:
                    await connection.read_response()  # QUEUED
                except ReadOnlyError as exc:  # a replica: the transaction is refused, nothing written
                    raise _NotWritten(exc) from exc
                done = await connection.read_response()
                if done is not None:
                    # ``EXEC`` ran the transaction, but a ``SET`` failing as it ran (an expiry out of
                    # range) is an error in its array, and nothing was written (found by attack: the
                    # update answered as if written, and a breaker never opened). The reply was read
                    # in full: the connection is kept; the error is not resent (it would fail again).
                    failed = [reply for reply in done if isinstance(reply, Exception)]
                    if failed:
                        self._give_back(connection)
                        connection = None
                        raise failed[0]
                    break
        except BaseException:
            if connection is not None:
                self._discard(connection)
            raise
        self._give_back(connection)
        return answer

    async def _wait_for_connection(self) -> Any:
        """Wait (the caller's bound applies) for a connection given back, or a new one made when
        another was dropped, in turn with the other waiters."""
        if self._closed:
            raise RedisConnectionError("the store was closed")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back(waiter.result())  # handed over as this one was cancelled: the next gets it
            raise

    async def _open_one(self, closed: Any) -> Any:
        """Instead of ``closed`` (an idle connection the server closed), an idle one it has not
        closed, else a new one (or the next given back): for a command that is never resent, which
        would otherwise fail on it though it certainly did not run (found by attack: a give-back
        after the server's idle ``timeout`` or a restart was lost, its unit counted all window)."""
        self._discard(closed)
        while self._idle:
            connection = self._idle.pop()
            self._fewest_idle = min(self._fewest_idle, len(self._idle))
            if not _closed_by_server(connection):
                return connection
            self._discard(connection)
        return await self._fresh()

    async def _fresh(self) -> Any:
        """A new connection if the cap leaves room, else the next one given back (after a failure)."""
        if len(self._all) < self.max_connections:
            return self._new()
        return await self._wait_for_connection()

    def _give_back(self, connection: Any) -> None:
        """A connection whose reply was read in full: to the first waiter, else to the idle list."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        if self._trimmer is None:
            if self._closed:  # its command was in flight as the store closed: it is not kept open
                self._discard(connection)
                return
            self._fewest_idle = len(self._idle) + 1
            self._trimmer = asyncio.get_running_loop().call_later(IDLE_S, self._trim)
        self._idle.append(connection)

    def _room(self) -> None:
        """A connection was dropped: the first waiter gets a new one (made now, so that the count
        of connections never passes the cap; it connects on its first command)."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._new())
                return

    def _trim(self) -> None:
        """Close the connections that stayed idle since the last trim (the bottom of ``_idle``:
        each command takes the last one given back); again in ``IDLE_S`` while any stay idle."""
        self._trimmer = None
        unused, self._idle[:self._fewest_idle] = self._idle[:self._fewest_idle], []
        for connection in unused:
            self._discard(connection)
        if self._idle:
            self._fewest_idle = len(self._idle)
            self._trimmer = asyncio.get_running_loop().call_later(IDLE_S, self._trim)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        self._fewest_idle = 0
        for connection in idle:
            self._discard(connection)

    def _new(self) -> Any:
        connection = self.client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        self._all.add(connection)
        return connection

    def _discard(self, connection: Any) -> None:
        if connection in self._all:
            self._all.discard(connection)
            if self._waiters:
                self._room()
        if connection.is_connected:  # redis-py disconnects on the failures it sees; a backstop
            closing = asyncio.get_running_loop().create_task(connection.disconnect(nowait=True))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def bounded(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Await ``work`` (a coroutine, not started yet) within the next command's bound, as
        ``command`` does inline (its own copy: the decisions' path pays for every frame)."""
        wait, self.wait = self.wait, self.timeout
        task = asyncio.current_task()
        assert task is not None
        self.watchdog.enter(task, asyncio.get_running_loop().time() + wait)
        expired = False
        try:
            try:
                return await work
            finally:
                expired = self.watchdog.leave(task)
        except asyncio.CancelledError:
            if expired:
                raise StoreUnavailable(f"Redis store {self.where} did not answer within {wait:.3g} s",
                                       timed_out=True) from None
            raise
        except (RedisError, OSError) as exc:
            raise unavailable(self.where, exc) from exc

    async def close(self) -> None:
        self._closed = True
        self.watchdog.close()
        if self._trimmer is not None:
            self._trimmer.cancel()
            self._trimmer = None
        waiters, self._waiters = self._waiters, collections.deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(RedisConnectionError("the store was closed"))
        connections, self._all, self._idle = self._all, set(), []
        for connection in connections:
            try:
                await connection.disconnect()
            except (RedisError, OSError):
                pass
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _closed_by_server(connection: Any) -> bool:
    """Whether the server closed idle ``connection`` (its stream has read the end): no command
    sent on it can run. A close still on its way is not seen."""
    reader = getattr(connection, "_reader", None)  # redis-py's asyncio.StreamReader, None when not connected
    return reader is not None and reader.at_eof()


class _Turn:
    """The updates of one key under way on one link: they take turns (``lock``); ``users`` counts
    those holding or waiting for it, so the entry goes once the last one ends."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class _NotWritten(Exception):
    """``update`` lost its connection before it sent its write, or its server is a replica that
    refused the write: trying again runs it once."""

    def __init__(self, error: RedisConnectionError | ReadOnlyError) -> None:
        super().__init__(str(error))
        self.error = error
