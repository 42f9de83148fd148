"""``SharedStore`` in Redis (redis-py's asyncio client): many hosts on many machines, one set of limits.

Every decision is one Lua script, so it is one atomic round trip: N hosts see
exactly one rate limit, one pool of concurrency leases, one budget and one set
of idempotency records. Windows and lease expiries use the server's clock
(``TIME`` inside the script), so hosts with skewed clocks agree on window edges.
Every key gets a ``PEXPIRE``: counters live two windows, leases their TTL,
idempotency records the idempotency window, breaker records a few cooldowns.

Breaker records change by an optimistic transaction (``WATCH``/``MULTI``,
``RedisLink.update``: two round trips), as they change only on failures and
state changes; a closed breaker admits a call with one ``GET``. Connection
errors and timeouts raise ``StoreUnavailable``; the client reconnects by itself
on the next operation.

Limits: scripts build the window's key from the base key, so a Redis Cluster
would need all of a deployment's keys in one hash slot (give ``store_prefix`` a
``{hash tag}``); a failover to a replica that had not received the last writes
forgets them (a few admitted calls counted twice at most, a lease freed early).
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Coroutine
from typing import Any, Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from ...errors import ConfigError
from .redis_link import DEFAULT_MAX_CONNECTIONS, Fallback, RedisLink, Script, evalsha, pack
from .store import PLUGIN, UNKNOWN_WINDOW, StoreUnavailable, Update, load_record

NOW: Final = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

TAKE: Final = NOW + """
local interval = tonumber(ARGV[1])
local w = math.floor(now / interval)
local k = KEYS[1] .. '@' .. w
local v = redis.call('INCR', k)
if v == 1 then redis.call('PEXPIRE', k, interval * 2) end
if v > tonumber(ARGV[2]) then
  redis.call('DECR', k)
  return -1 - ((w + 1) * interval - now)
end
return w
"""
#: ``TAKE`` answers one integer (the cheapest reply to read): the window (≥ 0) when a unit was
#: taken, else -1 - the milliseconds until the next window.

UNTAKE: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DECR', KEYS[1]) end
return 1
"""

#: A lease sent again after its reply was lost finds its holder's own live lease and keeps it (renewed),
#: not counted against itself (found by attack: refused, and held every host's slot for its TTL).
LEASE: Final = NOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

RENEW: Final = NOW + """
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires or tonumber(expires) <= now then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

#: A reservation sent again after its reply was lost finds its holder's own live reservation and
#: answers it, not "reserved" by itself (found by attack: the call was refused and the seconds held
#: for the reservation's TTL). Its call is not counted again. Every reservation is in ``amounts``
#: (0 seconds for a budget of calls only), so that ``UNRESERVE`` can find it by its holder alone.
RESERVE: Final = NOW + """
local interval = tonumber(ARGV[1])
local max_calls, max_seconds, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local w = math.floor(now / interval)
local base = KEYS[1]
local calls = base .. ':calls@' .. w
local pool, amounts = base .. ':reserved@' .. w, base .. ':amounts@' .. w
if max_seconds >= 0 then
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', pool, '-inf', now)) do redis.call('HDEL', amounts, gone) end
  redis.call('ZREMRANGEBYSCORE', pool, '-inf', now)
end
local mine = redis.call('HGET', amounts, ARGV[5])
if mine then return {'ok', w, mine} end
local ttl = tonumber(ARGV[6])
if max_calls >= 0 and tonumber(redis.call('GET', calls) or '0') >= max_calls then return {'calls', w, '0'} end
local reserve = 0
if max_seconds >= 0 then
  local reserved = 0
  for _, amount in ipairs(redis.call('HVALS', amounts)) do reserved = reserved + tonumber(amount) end
  local spent = tonumber(redis.call('GET', base .. ':seconds@' .. w) or '0')
  local left = max_seconds - spent - reserved
  if left <= 0 then
    if spent >= max_seconds then return {'used', w, '0'} end
    return {'reserved', w, '0'}
  end
  reserve = left
  if want >= 0 and want < left then reserve = want end
  redis.call('ZADD', pool, now + ttl, ARGV[5])
  redis.call('PEXPIRE', pool, interval * 2 + ttl)
end
redis.call('HSET', amounts, ARGV[5], tostring(reserve))
redis.call('PEXPIRE', amounts, interval * 2 + ttl)
redis.call('INCR', calls)
redis.call('PEXPIRE', calls, interval * 2)
return {'ok', w, tostring(reserve)}
"""

SETTLE: Final = """
local base, w, holder = KEYS[1], ARGV[1], ARGV[2]
redis.call('ZREM', base .. ':reserved@' .. w, holder)
redis.call('HDEL', base .. ':amounts@' .. w, holder)
local elapsed = tonumber(ARGV[3])
if elapsed < 0 then
  local calls = base .. ':calls@' .. w
  if redis.call('EXISTS', calls) == 1 then redis.call('DECR', calls) end
else
  local seconds = base .. ':seconds@' .. w
  redis.call('INCRBYFLOAT', seconds, elapsed)
  redis.call('PEXPIRE', seconds, tonumber(ARGV[4]))
end
return 1
"""

#: The give-back of a reservation whose reply never came (``UNKNOWN_WINDOW``): its window is the
#: server's now or the one before (the give-back follows the reservation within a store timeout or
#: two); found by the holder's entry in ``amounts``, which is there only if the reservation ran,
#: and still live. Run twice, it finds nothing the second time: it may be resent.
UNRESERVE: Final = NOW + """
local interval, holder = tonumber(ARGV[1]), ARGV[2]
local w = math.floor(now / interval)
for _, at in ipairs({w, w - 1}) do
  if redis.call('HDEL', KEYS[1] .. ':amounts@' .. at, holder) == 1 then
    redis.call('ZREM', KEYS[1] .. ':reserved@' .. at, holder)
    local calls = KEYS[1] .. ':calls@' .. at
    if redis.call('EXISTS', calls) == 1 then redis.call('DECR', calls) end
    return 1
  end
end
return 0
"""

#: A claim sent again after its reply was lost (``RedisLink`` resends on a dropped idle connection)
#: finds its own holder and is claimed, not "running" against itself until its deadline.
CLAIM: Final = """
local v = redis.call('HMGET', KEYS[1], 'value', 'digest', 'holder')
if v[2] then
  if v[1] then return {'stored', v[2], v[1]} end
  if v[3] == ARGV[1] and v[2] == ARGV[2] then return {'claimed'} end
  return {'running', v[2]}
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'digest', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'claimed'}
"""

RESOLVE: Final = """
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  if not redis.call('HGET', KEYS[1], 'value') then redis.call('DEL', KEYS[1]) end
  return 1
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'digest', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


PING: Final = pack("PING")
TAKES_PACKED: Final = 4096  # rate-limit commands kept packed (one per tool, or per tool and principal)


def read_url(url: str) -> tuple[str, str | None]:
    """Where ``url`` connects, as it may be shown (``policy status``, errors, the audit trail: no
    user name, password or other query), and the socket's real path for ``unix://`` (symlinks and
    ``..`` resolved as the kernel will, ``%xx`` decoded, ``?path=`` read: as redis-py reads the URL,
    since that is what it connects to). ``ConfigError`` naming ``plugins.policy.store`` when redis-py
    cannot read it, or would silently read something else (a database that is no number, a socket
    path that is not absolute); the message never repeats the URL, which may hold a password."""
    from redis.connection import parse_url

    key = f"plugins.{PLUGIN}.store"
    try:
        parts = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        raise ConfigError("the Redis URL cannot be read: its host, port or database is malformed", key=key,
                          hint="redis://[:password@]host:port/db, rediss://… for TLS, unix:///path/redis.sock; "
                               "percent-encode a '#', '?', '/' or '@' in a password") from None
    scheme = url.partition("://")[0].lower()
    database = urllib.parse.unquote(urllib.parse.urlsplit(url).path if scheme != "unix" else "").replace("/", "")
    if (database and "db" not in parts) or parts.get("db", 0) < 0:
        raise ConfigError("the Redis URL's database must be a number, 0 or more (redis-py read it as 0)", key=key,
                          hint="redis://host:port/0 (databases are numbered)")
    if parts.get("max_connections", 1) < 1:  # redis-py reads 0 as 100, and fails on less with a bare ValueError
        raise ConfigError("the Redis URL's max_connections must be a number, 1 or more", key=key,
                          hint="redis://host:port/0?max_connections=8 (default 32)")
    db = parts.get("db")
    if scheme == "unix":
        path = parts.get("path")
        if not path or not os.path.isabs(path):
            raise ConfigError("a unix:// Redis store needs the socket's absolute path", key=key,
                              hint="unix:///path/to/redis.sock")
        return f"unix://{path}" + (f"?db={db}" if db else ""), os.path.realpath(path)
    host = parts.get("host") or "localhost"
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{parts.get('port') or 6379}/{db or 0}", None


#: The longest TTL sent to Redis (ms, about 31,700 years): Redis refuses a ``PX``/``PEXPIRE`` past
#: ``LLONG_MAX`` less its clock. Found by attack: a breaker with ``cooldown_ms = 1e19`` ("open until
#: reset") had a record TTL of 2e19 ms, its ``SET`` failed inside ``EXEC``, and it never opened; a
#: lease or window of such a length failed its scripts with ``policy_store_unavailable``.
MAX_TTL_MS: Final = 10**15


def _ms(seconds: float) -> int:
    # Compared before ``int``: a TTL past a float's range (twice a window or cooldown of 1e308 ms)
    # is infinite, and ``int`` of it raised in every release (found by attack: a time budget's
    # reservations were never settled, a breaker's failures never recorded).
    milliseconds = seconds * 1000
    return MAX_TTL_MS if not milliseconds < MAX_TTL_MS else max(int(milliseconds), 1)


class RedisStore:
    """Policy state in the Redis server at ``url``; keys are stored under ``prefix``."""

    kind = "redis"

    def __init__(self, url: str, prefix: str, timeout: float) -> None:
        self.where, self.socket = read_url(url)
        self.prefix = prefix
        # No socket_timeout: redis-py would then run every send in a task of its own (wait_for), and
        # every operation is bounded here (``RedisLink``: the store timeout, cut to the call's wait
        # bound). A cancelled command makes redis-py drop its connection, so no late reply is read
        # by the next one.
        self.client = aioredis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=timeout,
                                              health_check_interval=30, max_connections=DEFAULT_MAX_CONNECTIONS)
        self.link = RedisLink(self.client, self.where, timeout)
        self._takes: dict[str, tuple[float, int, bytes, Fallback]] = {}  # key -> (interval, limit, EVALSHA, EVAL)
        self._scripts = {name: Script(text) for name, text in (
            ("take", TAKE), ("untake", UNTAKE), ("lease", LEASE), ("renew", RENEW), ("reserve", RESERVE),
            ("settle", SETTLE), ("unreserve", UNRESERVE), ("claim", CLAIM), ("resolve", RESOLVE))}

    def _script(self, name: str, keys: list[str], args: list[Any], *,
                resend: bool = True) -> Coroutine[Any, Any, Any]:
        return self.link.script(self._scripts[name], [self.prefix + key for key in keys], args, resend=resend)

    async def ping(self) -> None:
        """One ``PING`` round trip on the store's own connections: the reference of the bench."""
        await self.link.command(PING)

    def take(self, key: str, interval: float, limit: int) -> Coroutine[Any, Any, int]:
        """The command's own coroutine (no frame of this method's in between): ``TAKE`` answers
        the one integer ``take`` does."""
        packed = self._takes.get(key)
        if packed is None or packed[0] != interval or packed[1] != limit:
            # the same bytes for every call of a tool (and principal): packed once
            if len(self._takes) >= TAKES_PACKED:
                self._takes.clear()
            packed = self._takes[key] = (interval, limit, *evalsha(self._scripts["take"], [self.prefix + key],
                                                                    [_ms(interval), limit]))
        return self.link.command(packed[2], packed[3])

    async def untake(self, key: str, interval: float, window: int) -> None:
        # A give-back is never resent: run twice (its first reply lost), it would admit one call too many.
        await self._script("untake", [f"{key}@{window}"], [], resend=False)

    async def lease(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        return bool(await self._script("lease", [key], [limit, holder, _ms(ttl)]))

    async def renew(self, key: str, holder: str, ttl: float) -> bool:
        return bool(await self._script("renew", [key], [holder, _ms(ttl)]))

    async def release(self, key: str, holder: str) -> None:
        await self.link.command(pack("ZREM", self.prefix + key, holder))

    async def reserve(self, key: str, interval: float, max_calls: int | None, max_seconds: float | None,
                      want: float | None, holder: str, ttl: float) -> tuple[str, int, float]:
        outcome, window, reserved = await self._script("reserve", [key], [
            _ms(interval), -1 if max_calls is None else max_calls, -1 if max_seconds is None else max_seconds,
            -1 if want is None else want, holder, _ms(ttl)])
        return outcome.decode(), int(window), float(reserved)

    async def settle(self, key: str, interval: float, window: int, holder: str, elapsed: float | None) -> None:
        if window == UNKNOWN_WINDOW:
            await self._script("unreserve", [key], [_ms(interval), holder])
            return
        # A give-back (elapsed None: the call's unit is returned) is never resent (see ``untake``);
        # settling time spent, run twice, counts the time twice: it refuses more, never admits more.
        await self._script("settle", [key], [window, holder, -1 if elapsed is None else elapsed, _ms(2 * interval)],
                           resend=elapsed is not None)

    async def claim(self, key: str, digest: str, holder: str, ttl: float) -> tuple[str, str | None, str | None]:
        out = await self._script("claim", [key], [holder, digest, _ms(ttl)])
        state = out[0].decode()
        return state, out[1].decode() if len(out) > 1 else None, out[2].decode() if len(out) > 2 else None

    async def resolve(self, key: str, holder: str, digest: str, value: str | None, ttl: float) -> bool:
        return bool(await self._script("resolve", [key], [holder, value or "", digest, _ms(ttl)]))

    async def get(self, key: str) -> Any:
        try:
            raw = await self.link.command(pack("GET", self.prefix + key))
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, ResponseError) and str(exc.__cause__).startswith("WRONGTYPE"):
                return str(exc.__cause__)  # a key of another type: no record ``update`` wrote (it replaces it)
            raise
        return None if raw is None else load_record(raw)

    def update(self, key: str, step: Update, ttl: float) -> Coroutine[Any, Any, Any]:
        def decide(raw: bytes | None, now: float) -> tuple[bytes, int, Any]:
            new, result = step(None if raw is None else load_record(raw), now)
            return json.dumps(new).encode(), _ms(ttl), result

        return self.link.update(self.prefix + key, decide)

    def limit_wait(self, seconds: float) -> None:
        """Bound the next operation (started right after, no await between) by ``seconds``."""
        self.link.wait = seconds

    async def status(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        client: Any = self.client  # replies are bytes (no decode_responses)
        try:
            # Every glob character of the prefix escaped (found by attack: only '*' was, so a prefix with
            # '?' or '[' listed other deployments' keys, or none of its own).
            pattern = "".join("\\" + c if c in "\\*?[]" else c for c in self.prefix) + "*"
            async for raw_key in client.scan_iter(match=pattern, count=500):
                full = raw_key.decode()
                kind = (await client.type(full)).decode()
                value: Any
                if kind == "string":
                    text = (await client.get(full) or b"").decode()
                    try:
                        value = json.loads(text) if text.startswith("{") else float(text)
                    except ValueError:  # not one of ours (a hostile or foreign key under the prefix): shown as text
                        value = text[:80]
                elif kind == "zset":
                    value = {m.decode(): s for m, s in await client.zrange(full, 0, -1, withscores=True)}
                elif kind == "hash":
                    fields = await client.hgetall(full)
                    value = {k.decode(): v.decode()[:80] for k, v in fields.items()}
                else:
                    continue
                # PTTL -1: a key without an expiry (never ours: every key we write has one) is shown
                # as never expiring, not as expiring now (found by attack: "0 s").
                left = await client.pttl(full)
                rows.append({"key": full[len(self.prefix):], "kind": kind, "value": value,
                             "expires_in": None if left == -1 else round(max(left, 0) / 1000.0, 3)})
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"Redis store {self.where}: {exc}") from exc
        return sorted(rows, key=lambda row: row["key"])

    async def close(self) -> None:
        await self.link.close()
        await self.client.aclose()
