"""Automatic retries of one tool execution (tenacity), where the contract makes them safe.

Retries happen only when the tool's spec declares ``policies.retry``, its
effect is ``Pure``, or ``IdempotentWrite`` *and* the call carries an
idempotency key — and only for errors marked ``retryable``. A
``NonIdempotentWrite`` or ``ExternalSideEffects`` tool is never retried:
a contract asking for it is refused when the tool is mounted. A wait between
attempts that would end at or past the call's deadline is not started.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .errors import ToolError
from .models import ToolContext
from .spec import Effect, ToolSpec

if TYPE_CHECKING:
    import tenacity


def retry_allowed(spec: ToolSpec, context: ToolContext) -> bool:
    """Whether this call of this tool may be retried automatically."""
    if spec.policies.retry is None or spec.policies.retry.max_attempts <= 1:
        return False
    if spec.effect is Effect.Pure:
        return True
    return spec.effect is Effect.IdempotentWrite and context.idempotency_key is not None


async def run_with_retries(
    attempt: Callable[[], Awaitable[Any]],
    spec: ToolSpec,
    context: ToolContext,
    on_retry: Callable[[int, ToolError], None],
) -> tuple[Any, int]:
    """Run ``attempt`` under the spec's retry policy; (its result, attempts made).

    ``attempt`` raises ``ToolError`` on failure; the last error is re-raised, with the attempts
    made as its ``attempts``, when attempts run out, the error is not retryable, or the wait
    before the next attempt would end at or past ``context.deadline`` (found by attack: a 5 s
    backoff was slept with 0.5 s left, and the call then failed ``deadline_exceeded``).
    """
    if not retry_allowed(spec, context):
        return await attempt(), 1
    import tenacity  # here: most tools have no retry policy, and start-up need not pay for it

    policy = spec.policies.retry
    assert policy is not None
    max_attempts = policy.max_attempts
    initial, cap = policy.initial_backoff_ms / 1000.0, policy.max_backoff_ms / 1000.0
    # Equal jitter: retry n waits between half and all of min(cap, initial * multiplier**n), so
    # callers that failed together spread out even at the cap, and no wait exceeds the cap.
    backoff: Any = (
        tenacity.wait_exponential(multiplier=initial / 2, max=cap / 2, exp_base=policy.multiplier)
        + tenacity.wait_random_exponential(multiplier=initial / 2, max=cap / 2, exp_base=policy.multiplier)
        if policy.jitter
        else tenacity.wait_exponential(multiplier=initial, max=cap, exp_base=policy.multiplier)
    )
    attempts = 0
    drawn: dict[int, float] = {}  # the wait after each attempt, drawn once: ``stop`` and ``wait`` both read it

    def wait(state: tenacity.RetryCallState) -> float:
        if state.attempt_number not in drawn:
            drawn[state.attempt_number] = backoff(state)
        return drawn[state.attempt_number]

    def stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= max_attempts:
            return True
        deadline = context.deadline
        return deadline is not None and time.monotonic() + wait(state) >= deadline

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, ToolError):
            on_retry(state.attempt_number, error)

    retrying = tenacity.AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, ToolError) and exc.retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        async for state in retrying:
            with state:
                attempts = state.retry_state.attempt_number
                result = await attempt()
    except ToolError as error:
        error.attempts = attempts
        raise
    return result, attempts
