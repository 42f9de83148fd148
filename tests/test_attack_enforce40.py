"""Attacks on the enforcement layer (session 40): limits past a float's range; events at close.

A policy or host setting is a length in milliseconds or a count; an integer too large for a float
(YAML, JSON and code can write one; TOML's readers may too) was accepted, and then every call of
the tool failed with a traceback (``internal`` / ``hook_failed``), or ``close()`` raised
``OverflowError``. Each must be refused where it is written, naming the setting.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from helpers import ToolsPlugin

from amplifier_tools import ExecutionError, ToolHost, ToolResult, ToolSpec, hookimpl
from amplifier_tools.errors import ConfigError
from amplifier_tools.spec import Budget, CircuitBreakerPolicy, Policies, RateLimit, RetryPolicy

#: An integer no float can hold (``float(HUGE)`` raises ``OverflowError``).
HUGE = 10**400


@pytest.mark.parametrize(("make", "field"), [
    (lambda: Policies(timeout_ms=HUGE), "timeout_ms"),
    (lambda: RateLimit(limit=1, interval_ms=HUGE), "interval_ms"),
    (lambda: Budget(per="principal", max_seconds=HUGE), "max_seconds"),
    (lambda: Budget(per="principal", max_calls=1, window_ms=HUGE), "window_ms"),
    (lambda: CircuitBreakerPolicy(cooldown_ms=HUGE), "cooldown_ms"),
    (lambda: CircuitBreakerPolicy(window_ms=HUGE), "window_ms"),
    (lambda: RetryPolicy(initial_backoff_ms=HUGE), "initial_backoff_ms"),
    (lambda: RetryPolicy(max_backoff_ms=HUGE), "max_backoff_ms"),
    (lambda: RetryPolicy(multiplier=HUGE), "multiplier"),
])
def test_a_policy_length_past_a_floats_range_is_refused_naming_the_field(make: Any, field: str) -> None:
    # found by attack: accepted, then every call failed (OverflowError: internal, hook_failed)
    with pytest.raises(ValueError, match=f"^{field} must"):
        make()


@pytest.mark.parametrize("config", [
    {"shutdown_grace_ms": HUGE},
    {"default_timeout_ms": HUGE},
    {"hook_timeout_ms": HUGE},
    {"plugins": {"policy": {"hook_timeout_ms": HUGE}}},
])
def test_a_host_setting_past_a_floats_range_is_a_config_error_naming_it(config: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    # found by attack: shutdown_grace_ms started and close() raised OverflowError; the others raised it
    # (bare, or as the policy plugin's mount failure) at start
    key = "plugins.policy.hook_timeout_ms" if "plugins" in config else next(iter(config))
    with pytest.raises(ConfigError) as raised:
        ToolHost(config=config, builtins=False, entry_points=False, discover=False, working_dir=tmp_path)
    assert raised.value.key == key and "finite" in raised.value.detail


def test_a_spec_with_a_float_sized_integer_still_mounts() -> None:
    # the edge: the largest integer a float holds stays a valid (huge) limit
    assert ToolSpec(name="t", policies=Policies(timeout_ms=int(1.7e308))).policies.timeout_ms == int(1.7e308)


class SlowObserver:
    """Sees every event after a short wait (an exporter's round trip)."""

    name = "slow_observer"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    async def tool_event(self, event: str, data: dict[str, Any]) -> None:
        await asyncio.sleep(0.05)
        self.seen.append(event)


class Down:
    name = "down"
    description = "Always fails."
    effect = "Pure"
    policies = {"circuit_breaker": {"failure_threshold": 1}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        raise ExecutionError("backend down", code="backend_down")


async def test_a_circuit_event_emitted_just_before_close_reaches_its_observers(tmp_path: Path) -> None:
    # found by attack: with the memory store nothing waited for the delivery of ``circuit:open``;
    # close() returned with it pending, the loop's end cut it, and no observer saw the breaker open
    # (a shared store's close already waited for it)
    observer = SlowObserver()
    (tmp_path / "work").mkdir()
    host = ToolHost(plugins=[ToolsPlugin(Down()), observer], builtins=["policy"], entry_points=False,
                    discover=False, working_dir=tmp_path / "work", config={"state_dir": str(tmp_path / "state")})
    await host.start()
    assert (await host.call("down", {})).error["code"] == "backend_down"
    await host.close()
    assert "circuit:open" in observer.seen


class Retried:
    name = "retried"
    description = "A Pure tool that declares retries."
    effect = "Pure"
    policies = {"retry": {"max_attempts": 3}}

    async def execute(self, input: dict[str, Any]) -> ToolResult:
        return ToolResult(True, "ok")


async def test_an_effect_override_that_forbids_the_tools_retries_is_a_config_error_naming_it(tmp_path: Path) -> None:
    # found by attack: refused as the tool's own invalid contract (the tools plugin failed to mount),
    # naming no key, though the tool is fine and the configuration made it NonIdempotentWrite
    host = ToolHost(config={"tools": {"retried": {"effect": "NonIdempotentWrite"}}},
                    plugins=[ToolsPlugin(Retried())], builtins=False, entry_points=False, discover=False,
                    working_dir=tmp_path)
    with pytest.raises(Exception) as raised:
        await host.start()
    error: BaseException | None = raised.value
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__
    assert isinstance(error, ConfigError), raised.value
    assert error.key == "tools.retried.effect" and error.hint is not None and "effect" in error.hint
    await host.close()
