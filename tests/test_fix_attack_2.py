"""Attacks on the same day's fixes of the policy store and of the audit log's rotation: what was found.

- ``breaker.is_record`` let a foreign record through whose numbers Python cannot handle: an
  integer ``opened_at`` (or outcome time) past a float's range made ``math.isfinite`` raise
  ``OverflowError`` inside ``is_record`` itself, and a ``tokens`` of 4,300 digits (the most
  ``json.loads`` takes) made the next probe's ``json.dumps`` raise ``ValueError``: both failed every
  call of the tool with ``hook_failed``, and nothing replaced the record — what the check was made
  to prevent. Numbers now must lie within the range a JSON reader anywhere keeps exactly
  (± 2**53), or they are no record.
- ``RedisLink._update`` took any non-nil ``EXEC`` reply for "written"; an ``EXEC`` whose ``SET``
  failed at run time answers an array holding the error (nothing written), so the update answered
  as if it had been recorded. A breaker whose ``window_ms`` + ``cooldown_ms`` made its record's
  TTL past what Redis takes (``PX`` out of range) never opened, silently: every failure was
  "recorded" and none was written. The error in the array is now raised (``StoreUnavailable``),
  and every TTL the Redis store sends is cut to what Redis takes (``MAX_TTL_MS``).
- A file planted in the audit log's directory named ``<stem>.<n>.jsonl`` with a number of 240
  digits made every rotation's target name longer than a file name may be: each append then
  raised ``AuditWriteError`` (ENAMETOOLONG) although its record had been written, so every audited
  call failed for good. Numbers no rotation reaches (more than 18 digits) no longer set the next
  target, and a rotation that fails is logged and retried at the next append; the record it
  followed is not reported as lost.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import redis
from redis_server import RedisServer
from test_policy_redis_attack import Failing, _host

from amplifier_tools import ToolSpec
from amplifier_tools.builtins.policy.breaker import is_record
from amplifier_tools.builtins.policy.store import StoreUnavailable, open_store


def _record(**fields: Any) -> bytes:
    record = {"state": "open", "opened_at": 0, "probe": None, "tokens": 0, "outcomes": []}
    record.update(fields)
    return json.dumps(record).encode()


HUGE = {
    "opened_at past a float": _record(opened_at=10**400),
    "an outcome time past a float": _record(state="closed", outcomes=[[10**400, True]]),
    # Parsed (4,300 digits is json.loads's limit), but one more probe token cannot be written back.
    "tokens at the digit limit": _record(tokens=10**4300 - 1),
}


@pytest.mark.parametrize("foreign", HUGE.values(), ids=HUGE.keys())
async def test_a_foreign_breaker_record_with_huge_numbers_is_replaced_not_fatal(
        redis_server: RedisServer, tmp_path: Path, foreign: bytes, caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis(port=redis_server.port)
    client.set("amplifier-tools:breaker:failing", foreign)
    try:
        with caplog.at_level(logging.WARNING, "amplifier_tools.policy"):
            async with _host(tmp_path, redis_server.url, Failing()) as host:
                codes = [(await host.call("failing", {})).error["code"] for _ in range(3)]  # type: ignore[index]
        assert "hook_failed" not in codes and codes[2] == "circuit_open", codes
        assert json.loads(client.get("amplifier-tools:breaker:failing") or b"null")["state"] == "open"
        assert "not a breaker record" in caplog.text
    finally:
        client.close()


def test_is_record_refuses_numbers_no_json_reader_keeps_exactly_and_never_raises() -> None:
    good = json.loads(_record(opened_at=1.5e9, tokens=3, probe=3, outcomes=[[1.5e9, True], [1.5e9, 0]]))
    assert is_record(good)
    for bad in ({"opened_at": 10**400}, {"opened_at": 2**53 + 1}, {"tokens": 2**63}, {"probe": -(2**60)},
                {"outcomes": [[10**400, True]]}, {"outcomes": [[0, 10**400]]}):
        assert not is_record({**good, **bad}), bad


async def test_an_exec_whose_set_failed_is_not_taken_for_written(redis_server: RedisServer,
                                                                 tmp_path: Path) -> None:
    store = open_store(redis_server.url, "t:", 2.0, tmp_path / "state")
    try:
        with pytest.raises(StoreUnavailable, match="out of range|invalid expire"):
            await store.link.update("t:breaker:x", lambda raw, now: (b"{}", 2**64, "written"))
        assert await store.get("breaker:x") is None
        assert await store.update("breaker:x", lambda data, now: ({"n": 1}, 1), 60.0) == 1  # the link still works
    finally:
        await store.close()


class FailingForAges(Failing):
    spec = ToolSpec(name="failing", description="failing", effect="Pure",
                    policies={"timeout_ms": 10_000,
                              "circuit_breaker": {"failure_threshold": 2, "cooldown_ms": 1e19}})


async def test_a_breaker_with_a_ttl_past_what_redis_takes_still_opens(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    """``cooldown_ms = 1e19`` (open until someone resets it): its record's TTL, 2e19 ms, is past
    ``PX``'s range. Before, both failures were "recorded" and nothing was written: it never opened."""
    client = redis.Redis(port=redis_server.port)
    try:
        async with _host(tmp_path, redis_server.url, FailingForAges()) as host:
            codes = [(await host.call("failing", {})).error["code"] for _ in range(3)]  # type: ignore[index]
        assert codes[2] == "circuit_open", codes
        assert client.pttl("amplifier-tools:breaker:failing") > 0
    finally:
        client.close()


def test_a_planted_rotated_name_with_a_huge_number_does_not_stop_the_log(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from amplifier_tools.builtins.audit.writer import AuditWriter

    path = tmp_path / "audit.jsonl"
    (tmp_path / ("audit." + "9" * 243 + ".jsonl")).write_bytes(b"")  # 255 bytes: its successor's name is too long
    writer = AuditWriter(path, fsync="never", rotate_bytes=300)
    try:
        for number in range(8):
            writer.append(b'{"kind":"call","n":%d}' % number)  # raised ENAMETOOLONG from the second on
        assert (tmp_path / "audit.1.jsonl").exists()  # rotated, numbered after its own files
        assert writer.tampered is None
    finally:
        writer.close()
    names = sorted(os.listdir(tmp_path))
    assert "audit.jsonl" in names


def test_a_rotation_that_fails_does_not_report_its_written_record_lost(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    from amplifier_tools.builtins.audit import writer as writer_module

    path = tmp_path / "audit.jsonl"
    writer = writer_module.AuditWriter(path, fsync="never", rotate_bytes=300)
    real_rename, failing = os.rename, [True]

    def rename(*args: Any, **kwargs: Any) -> None:
        if failing[0] and writer_module.ROTATED.match(str(args[1])):  # the rotation's rename alone
            raise OSError(28, "No space left on device")
        real_rename(*args, **kwargs)

    try:
        monkeypatch.setattr(os, "rename", rename)
        with caplog.at_level(logging.WARNING, "amplifier_tools"):
            for number in range(4):
                writer.append(b'{"kind":"call","n":%d}' % number)
        assert "not rotated" in caplog.text
        assert len([line for line in path.read_bytes().splitlines() if b'"kind":"call"' in line]) == 4
        failing[0] = False
        writer.append(b'{"kind":"call","n":4}')  # the next append rotates
        assert (tmp_path / "audit.1.jsonl").exists()
    finally:
        monkeypatch.setattr(os, "rename", real_rename)
        writer.close()


@pytest.fixture(params=["sqlite", "redis"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = "sqlite" if request.param == "sqlite" else request.getfixturevalue("redis_server").url
    store = open_store(url, "t:", 2.0, tmp_path / "state")
    try:
        yield store
    finally:
        await store.close()


async def test_a_holders_own_lease_and_reservation_are_its_own_in_every_shared_store(any_store: Any) -> None:
    """4b2c522 made the Redis store answer a holder's second lease or reservation (a command sent
    again) with its own entry; the SQLite store still counted it against itself: the stores
    answered one sequence of operations differently."""
    assert await any_store.lease("slots:x", 1, "h1", 30.0)
    assert await any_store.lease("slots:x", 1, "h1", 30.0)  # its own slot, renewed
    assert not await any_store.lease("slots:x", 1, "h2", 30.0)  # still one slot, held once
    first = await any_store.reserve("budget:b", 3600.0, 1, 10.0, 4.0, "h1", 60.0)
    assert await any_store.reserve("budget:b", 3600.0, 1, 10.0, 4.0, "h1", 60.0) == first  # not counted again
    assert first[0] == "ok" and first[2] == 4.0
    assert (await any_store.reserve("budget:b", 3600.0, 1, 10.0, 4.0, "h2", 60.0))[0] == "calls"
