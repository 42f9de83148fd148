"""Approval policy: side-effecting tools need a named approver, optionally within a time window.

Uses only the public hooks (``mount`` to read and check its config, ``tool_pre``
to decide). State is per host: the entry point names the class, and the host
makes one instance per host.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from amplifier_tools import ConfigError, Deny, Effect, ToolCall, ToolContext, ToolSpec, hookimpl

PLUGIN = "approval"
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


class ApprovalPolicy:
    """The decision logic, separate from config parsing so tests can inject a clock."""

    def __init__(self, approvers: frozenset[str], effects: frozenset[Effect],
                 window: tuple[dt.time, dt.time] | None,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> None:
        self.approvers = approvers
        self.effects = effects
        self.window = window
        self.now = now

    def decide(self, spec: ToolSpec, context: ToolContext) -> Deny | None:
        """``None`` to let the call go on, else the ``Deny``. Never raises: a failure while deciding
        is a denial, whatever the section's ``on_error`` (with ``on_error = "ignore"`` the host
        would let the call of a raising hook go on; found by attack: ``approved_by=["alice"]``
        raised ``TypeError`` and the tool ran unapproved)."""
        try:
            return self._decide(spec, context)
        except Exception as exc:  # any failure is a denial, never an allow
            return Deny(f"approval could not be decided ({type(exc).__name__}): denied", code="approval_failed")

    def _decide(self, spec: ToolSpec, context: ToolContext) -> Deny | None:
        if spec.effect not in self.effects:
            return None
        if self.window is not None:
            start, end = self.window
            current = self.now().time().replace(second=0, microsecond=0)
            inside = start <= current < end if start <= end else (current >= start or current < end)
            if not inside:
                return Deny(f"{spec.effect.value} tools may run only between {start:%H:%M} and {end:%H:%M} UTC",
                            code="outside_window")
        approver = context.attributes.get("approved_by")
        # Exactly a str: a subclass can compare equal to any name (found by attack).
        if type(approver) is not str or approver not in self.approvers:
            shown = ("no approver" if approver is None else f"approver {approver!r} is not allowed"
                     if type(approver) is str else f"approved_by is a {type(approver).__name__}, not a name")
            return Deny(f"{spec.effect.value} tool {spec.name!r} needs approval ({shown})", code="approval_required")
        context.record(PLUGIN, "tool_pre", "allow", f"approved by {approver}")
        return None


def parse_config(config: dict[str, Any]) -> ApprovalPolicy:
    """Build the policy from the ``[plugins.approval]`` section; ``ConfigError`` naming the key."""
    known = {"approvers", "effects", "window"}
    for key in config:
        if key not in known:
            raise ConfigError(f"unknown key (expected one of {sorted(known)})", key=f"plugins.{PLUGIN}.{key}")
    approvers = config.get("approvers", [])
    if not isinstance(approvers, list) or not approvers or not all(isinstance(a, str) and a for a in approvers):
        raise ConfigError("must be a non-empty list of names", key=f"plugins.{PLUGIN}.approvers")
    raw_effects = config.get("effects", ["NonIdempotentWrite", "ExternalSideEffects"])
    try:  # a list, not empty: `effects = []` would approve everything without a word (found by attack)
        if not isinstance(raw_effects, list) or not raw_effects:
            raise TypeError
        effects = frozenset(Effect(e) for e in raw_effects)
    except (ValueError, TypeError):
        raise ConfigError(f"must be a non-empty list of effects from {[e.value for e in Effect]} "
                          "(to turn approval off, list the plugin in disable_plugins)",
                          key=f"plugins.{PLUGIN}.effects") from None
    window = None
    if "window" in config:
        match = _WINDOW.match(str(config["window"]))
        if not match:
            raise ConfigError("must look like '08:00-18:00' (UTC)", key=f"plugins.{PLUGIN}.window")
        h1, m1, h2, m2 = map(int, match.groups())
        if (h1, m1) == (h2, m2):
            raise ConfigError("is empty: start and end are the same minute, so nothing could ever run",
                              key=f"plugins.{PLUGIN}.window")
        window = (dt.time(h1, m1), dt.time(h2, m2))
    return ApprovalPolicy(frozenset(approvers), effects, window)


class ApprovalPlugin:
    """The plugin; the entry point names this class, so every host gets its own instance."""

    name = PLUGIN

    def __init__(self) -> None:
        self.policy: ApprovalPolicy | None = None

    @hookimpl
    def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        self.policy = parse_config(config)

    @hookimpl
    def tool_pre(self, call: ToolCall, spec: ToolSpec, context: ToolContext) -> Deny | None:
        if self.policy is None:  # mount failed; the host does not run calls then
            return Deny("approval plugin is not configured", code="approval_unconfigured")
        return self.policy.decide(spec, context)
