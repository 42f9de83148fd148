"""Automatic retries of one tool execution (tenacity), where the contract makes them safe.

Retries happen only when the tool's spec declares ``policies.retry``, its
effect is ``Pure``, or ``IdempotentWrite`` *and* the call carries an
idempotency key — and only for errors marked ``retryable``. A
``NonIdempotentWrite`` or ``ExternalSideEffects`` tool is never retried:
a contract asking for it is refused when the tool is mounted.
"""

from __future__ import annotations

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

    ``attempt`` raises ``ToolError`` on failure; the last error is re-raised
    when attempts run out or the error is not retryable.
    """
    if not retry_allowed(spec, context):
        return await attempt(), 1
    import tenacity  # here: most tools have no retry policy, and start-up need not pay for it

    policy = spec.policies.retry
    assert policy is not None
    initial, cap = policy.initial_backoff_ms / 1000.0, policy.max_backoff_ms / 1000.0
    # Equal jitter: retry n waits between half and all of min(cap, initial * multiplier**n), so
    # callers that failed together spread out even at the cap, and no wait exceeds the cap.
    wait: Any = (
        tenacity.wait_exponential(multiplier=initial / 2, max=cap / 2, exp_base=policy.multiplier)
        + tenacity.wait_random_exponential(multiplier=initial / 2, max=cap / 2, exp_base=policy.multiplier)
        if policy.jitter
        else tenacity.wait_exponential(multiplier=initial, max=cap, exp_base=policy.multiplier)
    )
    attempts = 0

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, ToolError):
            on_retry(state.attempt_number, error)

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts),
        wait=wait,
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, ToolError) and exc.retryable),
        before_sleep=before_sleep,
        reraise=True,
    )
    async for state in retrying:
        with state:
            attempts = state.retry_state.attempt_number
            result = await attempt()
    return result, attempts
