"""Holder ids (leases, reservations, idempotency claims) are unique across processes.

Found by attack: the id was host name + process id taken once at import, plus a counter, so a
forked worker (gunicorn ``--preload``, multiprocessing's fork) made its parent's ids, and so did
containers that all run as process 1 under one host name. Two processes with one holder id share
a lease (a concurrency cap of 1 admitted both) and, since a resent idempotency claim is its
holder's, both ran the same idempotent call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_forked_child_makes_holder_ids_its_parent_does_not() -> None:
    """The fork happens in a fresh interpreter, as below (on 3.13 forking the test run itself
    warned that it has threads, the hazard that deadlocked the test below)."""
    done = subprocess.run([sys.executable, "-c", _FORKED_HOLDER], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    theirs, mine = done.stdout.split()
    assert theirs.rsplit(":", 1)[0] != mine.rsplit(":", 1)[0]
    assert theirs != mine and theirs.endswith(":1")  # the child's counter starts anew, under its own prefix


_FORKED_HOLDER = """
import multiprocessing
from amplifier_tools.builtins.policy import shared

def child(out):
    out.put(shared.new_holder())

fork = multiprocessing.get_context("fork")
queue = fork.Queue()
worker = fork.Process(target=child, args=(queue,), daemon=True)
worker.start()
try:
    print(queue.get(timeout=60))
    worker.join(30)
finally:
    if worker.is_alive():
        worker.kill()
print(shared.new_holder())
"""


def test_four_forked_workers_get_two_slots_of_a_cap_of_two(tmp_path: Path) -> None:
    """What the user sees: a concurrency cap of 2 shared by four forked workers admits two of them
    (with one holder id among them, each lease replaced the last and all four were admitted).

    The forks happen in a fresh interpreter of their own (``_FORKED_WORKERS``), not in the test
    run: a process forked from one with other threads inherits their locks held, and the run's
    leftover threads (other tests' pools and writers) made a child deadlock, seen twice under load
    (the test then waited out its timeouts, six minutes, and failed)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    done = subprocess.run([sys.executable, "-c", _FORKED_WORKERS, str(state)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True", "True"]


#: Four workers forked from a parent that has made holder ids (as a preloaded app has), each asking
#: for a slot of a cap of 2 in one SQLite store; prints what each was granted, sorted.
_FORKED_WORKERS = """
import asyncio, multiprocessing, sys
from pathlib import Path
from amplifier_tools.builtins.policy import shared
from amplifier_tools.builtins.policy.store import open_store

def lease(path, start, out):
    async def take():
        store = open_store("sqlite", "t:", 2.0, Path(path))
        try:
            start.wait(30)
            return bool(await store.lease("slots:tool", 2, shared.new_holder(), 60.0))
        finally:
            await store.close()
    out.put(asyncio.run(take()))

if __name__ == "__main__":
    fork = multiprocessing.get_context("fork")
    shared.new_holder()
    start, queue = fork.Event(), fork.Queue()
    workers = [fork.Process(target=lease, args=(sys.argv[1], start, queue), daemon=True) for _ in range(4)]
    for worker in workers:
        worker.start()
    start.set()
    granted = sorted(queue.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(30)
    print(*granted)
"""


def test_a_fork_that_skips_pythons_fork_hooks_still_makes_new_holder_ids() -> None:
    """Found by attack: a fork through ``ctypes`` (``libc.fork()``) runs no ``os.register_at_fork``
    hook, and the child made its parent's ids.

    In a fresh interpreter (``_CTYPES_FORK``), not the test run: ``ctypes`` lets go of the GIL
    around the call, so a fork of the run, which has other threads (audit writers, pools), could
    leave the child waiting for a GIL that a thread it does not have held (seen: the whole suite
    hung on the child)."""
    done = subprocess.run([sys.executable, "-c", _CTYPES_FORK], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    theirs, mine = done.stdout.split()
    assert theirs.rsplit(":", 1)[0] != mine.rsplit(":", 1)[0]


#: Prints the holder id a ``libc.fork()`` child made, then one its parent made after.
_CTYPES_FORK = """
import ctypes, os
from amplifier_tools.builtins.policy import shared

shared.new_holder()
read, write = os.pipe()
pid = ctypes.CDLL(None).fork()
if pid == 0:  # the child: one id, then out at once
    try:
        os.write(write, shared.new_holder().encode())
    finally:
        os._exit(0)
os.close(write)
theirs = os.read(read, 4096).decode()
os.close(read)
os.waitpid(pid, 0)
print(theirs, shared.new_holder())
"""
