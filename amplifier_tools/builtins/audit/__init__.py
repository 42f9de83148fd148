"""The audit plugin: one redacted, hash-chained JSON Lines record per call.

Uses only public hooks: a ``tryfirst`` ``tool_pre`` notes the original
arguments and refuses calls while the log cannot be written (``fail_closed``);
a ``trylast`` ``tool_complete`` writes the record of every call — success,
veto, contract, policy or auth failure, timeout, tool failure — and waits for
it to be written (and fsynced under ``fsync="always"``) before the caller gets
the result. One writer thread per host; several processes may share one file
(a lock keeps one chain).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import hashlib
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Final

from ..._json import dumps
from ..._markers import hookimpl
from ...errors import AuthError, ConfigError, ToolSystemError
from ...models import ToolCall, ToolContext, ToolResult
from ...redaction import redact
from ...spec import ToolSpec
from .chain import encode_body
from .writer import AuditWriter

log = logging.getLogger("amplifier_tools.audit")

PLUGIN: Final = "audit"
SCHEMA_VERSION: Final = 1
DEFAULTS: Final[dict[str, Any]] = {
    "path": None,  # default: <working dir>/.amplifier-tools/audit.jsonl
    "fsync": "always",
    "fsync_every": 100,
    "fsync_interval_ms": 1000,
    "rotate_bytes": None,
    "rotate_seconds": None,
    "mode": "fail_closed",
    "record_output": False,
    "redact_patterns": True,
    "otel": False,
    "checkpoint_key_ref": None,  # a secret ref (host config ``secrets``) holding the HMAC key
    "checkpoint_every": 1000,
}


def parse_settings(config: dict[str, Any]) -> dict[str, Any]:
    """Settings with defaults; ``ConfigError`` naming the key on anything unknown or wrong."""
    settings = dict(DEFAULTS)
    checks = {
        "path": lambda v: isinstance(v, str) and v != "",
        "fsync": lambda v: v in ("always", "interval", "never"),
        "fsync_every": lambda v: type(v) is int and v > 0,
        "fsync_interval_ms": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        "rotate_bytes": lambda v: type(v) is int and v > 0,
        "rotate_seconds": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        "mode": lambda v: v in ("fail_closed", "fail_open"),
        "record_output": lambda v: isinstance(v, bool),
        "redact_patterns": lambda v: isinstance(v, bool),
        "otel": lambda v: isinstance(v, bool),
        "checkpoint_key_ref": lambda v: isinstance(v, str) and v != "",
        "checkpoint_every": lambda v: type(v) is int and v > 0,
    }
    expected = {"path": "a file path", "fsync": "'always', 'interval' or 'never'",
                "mode": "'fail_closed' or 'fail_open'", "record_output": "true or false",
                "redact_patterns": "true or false", "otel": "true or false",
                "checkpoint_key_ref": "the name of a secret reference"}
    for key, value in config.items():
        if key not in DEFAULTS:
            raise ConfigError(f"unknown key (expected one of {sorted(DEFAULTS)})", key=f"plugins.{PLUGIN}.{key}")
        if not checks[key](value):
            raise ConfigError(f"must be {expected.get(key, 'a positive number')}, got {value!r}",
                              key=f"plugins.{PLUGIN}.{key}")
        settings[key] = value
    return settings


def _secret_values(spec: ToolSpec | None, context: ToolContext) -> list[str]:
    values = []
    for ref in spec.security.secret_refs if spec is not None else ():
        try:
            values.append(context.secret(ref))
        except AuthError:
            continue
    return values


def build_record(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext,
                 original: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """The record of one call, redacted, before it is chained."""
    secrets = _secret_values(spec, context)
    rules = spec.security.redaction_rules if spec is not None else ()
    error = result.error or {}
    changed = original != call.arguments
    io = redact({"arguments": call.arguments, "original_arguments": original if changed else None,
                 "output": result.output, "trail": result.metadata.get("trail", []),
                 "error": {"type": error.get("type"), "code": error.get("code"), "message": error.get("message"),
                           "plugin": error.get("plugin")} if error else None},
                secrets=secrets, paths=[*rules, *(r.replace("arguments/", "original_arguments/", 1)
                                                  for r in rules if r.startswith("arguments/"))],
                patterns=settings["redact_patterns"])
    output_bytes = dumps(io["output"]) if result.output is not None else b""
    record: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "kind": "call",
        "ts": dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
        "call_id": call.id,
        "session_id": context.session_id,
        "trace_id": context.trace_id,
        "tool": call.name,
        "tool_version": spec.version if spec is not None else None,
        "effect": spec.effect.value if spec is not None else None,
        "principal": context.principal,
        "role": context.role,
        "environment": context.environment,
        "scopes": sorted(context.scopes),
        "arguments": io["arguments"],
        "original_arguments": io["original_arguments"],
        "trail": io["trail"],
        "status": "ok" if result.success else "error",
        "error": io["error"],
        "output_bytes": len(output_bytes),
        "output_sha256": hashlib.sha256(output_bytes).hexdigest() if output_bytes else None,
        "attempts": result.metadata.get("attempts", 1),
        "duration_ms": round(float(result.metadata.get("duration_ms", 0.0)), 3),
    }
    if settings["record_output"]:
        record["output"] = io["output"]
    return record


class AuditPlugin:
    """Writes the audit log of one host."""

    name = PLUGIN

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._providers = (tracer_provider, meter_provider)
        self.telemetry: Any = None
        self.settings: dict[str, Any] = dict(DEFAULTS)
        self.writer: AuditWriter | None = None
        self._original: dict[str, Any] = {}
        self._warned = False

    @hookimpl
    def mount(self, coordinator: Any, config: dict[str, Any]) -> Any:
        self.settings = parse_settings(config)
        if self.settings["otel"]:
            from .otel import ToolTelemetry

            self.telemetry = ToolTelemetry(*self._providers)
        path = self.settings["path"] or str(
            Path(coordinator.get_capability("session.working_dir")) / ".amplifier-tools" / "audit.jsonl")
        key_ref = self.settings["checkpoint_key_ref"]
        key = None
        if key_ref is not None:
            try:
                key = coordinator.get_capability("session.secret")(key_ref).encode()
            except AuthError as exc:
                raise ConfigError(f"{exc.message}: add it to the host's [secrets] and set the variable",
                                  key=f"plugins.{PLUGIN}.checkpoint_key_ref") from None
        try:
            self.writer = AuditWriter(Path(path).expanduser(), fsync=self.settings["fsync"],
                                      fsync_every=self.settings["fsync_every"],
                                      fsync_interval_ms=self.settings["fsync_interval_ms"],
                                      rotate_bytes=self.settings["rotate_bytes"],
                                      rotate_seconds=self.settings["rotate_seconds"],
                                      checkpoint_key=key, checkpoint_key_ref=key_ref or "",
                                      checkpoint_every=self.settings["checkpoint_every"],
                                      on_error=self._report)
        except OSError as exc:
            if self.settings["mode"] == "fail_closed":
                raise ConfigError(f"cannot open the audit log {path}: {exc.strerror}",
                                  key=f"plugins.{PLUGIN}.path") from None
            log.warning("audit log %s cannot be opened (%s); calls go unrecorded (mode fail_open)", path, exc)
            return None
        coordinator.register_capability("audit.path", str(self.writer.path))
        return self.writer.close

    def _report(self, exc: BaseException) -> None:
        """Called by the writer thread when a batch could not be written."""
        if not self._warned:
            self._warned = True
            log.error("%s; calls are %s", exc,
                      "refused until it can be written" if self.settings["mode"] == "fail_closed"
                      else "not recorded (mode fail_open)")

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: ToolCall) -> None:
        self._original[call.id] = call.arguments
        writer = self.writer
        if self.settings["mode"] == "fail_closed" and (writer is None or not writer.healthy):
            raise ToolSystemError(f"the audit log cannot be written ({writer.error if writer else 'not open'}); "
                                  "refusing to run unrecorded calls", code="audit_unavailable")

    @hookimpl(trylast=True)
    def tool_complete(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult,
                      context: ToolContext) -> Awaitable[None] | None:
        """Queue the call's record; under ``fsync="always"``, an awaitable that waits until it is on disk.

        Synchronous on purpose: a hook that has nothing to wait for returns None,
        and the dispatcher never builds a coroutine or a timeout for it.
        """
        original = self._original.pop(call.id, call.arguments)
        if self.telemetry is not None:
            self.telemetry.record(call, spec, result)
        writer = self.writer
        if writer is None:
            return None
        # Encoded here, on the caller's side: the record is a snapshot even if the caller
        # later mutates its arguments or the tool's output.
        body = encode_body(build_record(call, spec, result, context, original, self.settings))
        if self.settings["fsync"] != "always":
            # Only fsync="always" acknowledges: other modes return at once; a failed write is
            # logged through _report and fails the next call closed in tool_pre.
            writer.append(body, ack=False)
            return None
        future = writer.append(body)
        assert future is not None
        return self._acknowledged(future)

    async def _acknowledged(self, future: concurrent.futures.Future[str]) -> None:
        try:
            await asyncio.wrap_future(future)
        except OSError as exc:
            if self.settings["mode"] == "fail_closed":
                raise
            if not self._warned:
                self._warned = True
                log.warning("%s; continuing without an audit record (mode fail_open)", exc)
