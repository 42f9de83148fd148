"""Time limits that never lose a cancellation: ``run_with_timeout`` and what it is built on.

A tool's timeout, the caller's deadline and a hook's timeout all go through ``run_with_timeout``:
``TimeLimitExceeded`` only when the limit this module set ran out (never a ``TimeoutError`` the
awaited code raised itself), the timer armed only once a coroutine really suspends
(``first_step``), and a cancellation of the caller never swallowed by the limit. Not
``asyncio.wait_for``: before CPython 3.12 it returns the awaited result when the caller is
cancelled within the few turns of the loop in which that result arrives (bpo-42130), and the
caller's cancellation is lost; the host's own waits with a bound use this module too.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Generator
from typing import Any, Final


class TimeLimitExceeded(TimeoutError):
    """A time limit the host set ran out: a tool's timeout or the caller's deadline
    (``run_with_timeout``), a hook's timeout. Never a ``TimeoutError`` a tool or hook raised
    itself (found by attack: a tool's own "read timed out" was reported as the host's 60 s
    timeout, code ``timeout``)."""


class _Resume:
    """The rest of a coroutine whose first step already ran, as an awaitable.

    Delegates ``send``/``throw``/``close`` exactly as ``await`` would (PEP 380), so cancellation
    and exceptions reach the coroutine unchanged. Once the first suspension ends as asyncio ends
    one (``send(None)``), the rest is delegated by ``yield from`` the coroutine's own iterator,
    in C, with no Python step of this class per suspension; a value sent or an exception thrown
    there is passed on by hand first.
    """

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: types.CoroutineType[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._pending
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task: cancellation, mostly
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                if sent is None:  # how asyncio resumes: the coroutine itself takes over from here
                    return (yield from coro.__await__())
                try:
                    pending = coro.send(sent)
                except StopIteration as done:
                    return done.value


_COROUTINE: Final = types.CoroutineType


def _first_step(awaitable: Any) -> tuple[bool, Any]:
    """Run a coroutine up to its first suspension: ``(True, result)`` if it finished without
    suspending, else ``(False, the rest as an awaitable)``. Other awaitables are left alone.

    A tool or hook that never waits then needs no deadline timer at all (a timer armed and
    cancelled per call costs time, and until the event loop runs again it stays in its heap).
    Only where the rest then runs in the same task (``run_with_timeout``, 3.11+): code that binds
    to the current task must never find itself split across two.
    """
    if type(awaitable) is not _COROUTINE:
        return False, awaitable
    try:
        pending = awaitable.send(None)
    except StopIteration as done:
        return True, done.value
    return False, _Resume(awaitable, pending)


if sys.version_info >= (3, 11):

    #: ``_first_step``: a caller that runs the first step itself and passes the rest to
    #: ``run_with_timeout`` saves a coroutine of its own for a tool that never waits.
    first_step = _first_step

    async def run_with_timeout(awaitable: Any, seconds: float | None) -> Any:
        """Await ``awaitable``, cancelling it after ``seconds`` (``TimeLimitExceeded``, also when
        the awaitable answered that cancellation with another exception, chained to it); the timer
        is armed only once a coroutine actually suspends. A ``TimeoutError`` the awaitable raised
        itself, the limit not run out, passes through as it is. A limit of 0 or less cuts at the
        loop's next turn: a step the awaitable already had scheduled still runs.

        The limit and a cancellation of the caller can reach the task in the same turn of the loop:
        the awaitable is thrown one ``CancelledError`` for both. One that answers it by returning or
        failing has swallowed the caller's too, and the limit withdraws only its own request: the
        caller's still counted (``Task.cancelling``), ``CancelledError`` is raised for it, never the
        value or ``TimeLimitExceeded`` (found by attack: a ``tool_pre`` hook returning a default when
        cut let a cancelled call run its tool). Does not cover: before CPython 3.12.3 a task group
        inside the awaitable whose child failed leaves a cancellation counted that nobody requested
        (gh-116720); cut by the limit as well, that awaitable is taken for cancelled."""
        if seconds is None:
            return await awaitable
        finished, rest = _first_step(awaitable)
        if finished:
            return rest
        task = asyncio.current_task()
        if task is None:  # no task, so no way to cut it: asyncio.timeout says so
            async with asyncio.timeout(seconds):
                return await rest
        requests = task.cancelling()
        # What ``asyncio.timeout`` does, without its object and context manager (≈ 120 bytecodes a
        # call): a timer that cancels the task and says it did; when it did, its request withdrawn.
        expired = False

        def cut() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        timer = task.get_loop().call_later(seconds, cut)
        try:
            out = await rest
        except BaseException as exc:
            timer.cancel()
            if not expired:
                raise
            callers = task.uncancel() > requests  # the caller's request, arrived with the cut
            if isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
                raise
            if isinstance(exc, asyncio.CancelledError):
                if callers:
                    raise
                raise TimeLimitExceeded(seconds) from None
            # The limit ran out, whatever the awaitable answered its cancellation with.
            if callers:
                # also when answered with an exception that is no ``Exception`` (found by attack: a
                # ``SystemExit``, a library's own ``BaseException``, lost it, and after a
                # ``tool_pre`` hook the tool ran)
                raise asyncio.CancelledError from exc
            if isinstance(exc, Exception):
                raise TimeLimitExceeded(seconds) from None if isinstance(exc, TimeoutError) else exc
            raise
        timer.cancel()
        if expired and task.uncancel() > requests:
            raise asyncio.CancelledError  # the caller's, arrived with the cut the awaitable answered
        return out

else:  # pragma: no cover - exercised by the py310 tox env

    def first_step(awaitable: Any) -> tuple[bool, Any]:
        """Takes no step: ``run_with_timeout`` runs the whole coroutine in a task of its own."""
        return False, awaitable

    async def run_with_timeout(awaitable: Any, seconds: float | None) -> Any:
        """Await ``awaitable``, cancelling it after ``seconds`` (``TimeLimitExceeded``, also when
        the awaitable answered that cancellation with another exception, chained to it; a value it
        returned despite the cancellation is returned, as ``asyncio.timeout`` returns it on 3.11).

        The whole coroutine runs in a task of its own (``run``): a first step taken in the caller's
        task would split it across two tasks. Not ``wait_for``: on 3.10 it returns the run's result
        when the run ends just as the caller is cancelled, and the caller's cancellation is lost
        (bpo-42130; found by attack: a call cancelled as its tool finished returned its result).
        ``asyncio.wait`` never swallows one. An ``asyncio.TimeoutError`` the awaitable raised
        itself, the limit not run out, passes through as it is.

        A second cancellation while the cut run is waited for ends that wait, not the run (a tool
        that ignores cancellation): the run is waited for to its end, each further cancellation
        passed on to it, as 3.11's ``asyncio.timeout`` in the caller's own task does (found by
        attack: the call was recorded and its concurrency slot given back while the tool went on
        running)."""
        if seconds is None:
            return await awaitable
        run = asyncio.ensure_future(awaitable)
        try:
            done, _ = await asyncio.wait((run,), timeout=seconds)
        except asyncio.CancelledError:
            await _run_to_end(run)
            raise
        if done:
            return run.result()
        if await _run_to_end(run):  # the caller was cancelled while the cut run ended
            raise asyncio.CancelledError
        try:
            return run.result()
        except asyncio.CancelledError:
            raise TimeLimitExceeded(seconds) from None
        except Exception as exc:
            raise TimeLimitExceeded(seconds) from None if isinstance(exc, asyncio.TimeoutError) else exc

    async def _run_to_end(run: asyncio.Future[Any]) -> bool:
        """Cancel ``run`` and wait until it has ended, passing each cancellation of the caller on
        to it; whether there was one. Its outcome is marked seen (no "exception was never
        retrieved" for a run the caller no longer wants)."""
        run.cancel()
        cancelled = False
        while not run.done():
            try:
                await asyncio.wait((run,))
            except asyncio.CancelledError:
                cancelled = True
                run.cancel()
        if not run.cancelled():
            run.exception()
        return cancelled


