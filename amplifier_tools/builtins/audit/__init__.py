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
import datetime as dt
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Final

from ..._markers import hookimpl
from ...errors import AuthError, ConfigError, ToolSystemError
from ...models import ToolCall, ToolContext, ToolResult
from ...redaction import redact
from ...spec import ToolSpec
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
    "mode": "fail_closed",
    "record_output": False,
    "redact_patterns": True,
    "otel": False,
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
        "mode": lambda v: v in ("fail_closed", "fail_open"),
        "record_output": lambda v: isinstance(v, bool),
        "redact_patterns": lambda v: isinstance(v, bool),
        "otel": lambda v: isinstance(v, bool),
    }
    expected = {"path": "a file path", "fsync": "'always', 'interval' or 'never'",
                "mode": "'fail_closed' or 'fail_open'", "record_output": "true or false",
                "redact_patterns": "true or false", "otel": "true or false"}
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
    """The (unsealed) record of one call, redacted."""
    secrets = _secret_values(spec, context)
    rules = spec.security.redaction_rules if spec is not None else ()
    patterns = settings["redact_patterns"]
    io = redact({"arguments": call.arguments, "original_arguments": original, "output": result.output},
                secrets=secrets, paths=[*rules, *(r.replace("arguments/", "original_arguments/", 1)
                                                  for r in rules if r.startswith("arguments/"))],
                patterns=patterns)
    output_bytes = json.dumps(io["output"], sort_keys=True, default=str).encode() if result.output is not None \
        else b""
    error = result.error or {}
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
        "original_arguments": io["original_arguments"] if original != call.arguments else None,
        "trail": redact(result.metadata.get("trail", []), secrets=secrets, patterns=patterns),
        "status": "ok" if result.success else "error",
        "error": redact({"type": error.get("type"), "code": error.get("code"), "message": error.get("message"),
                         "plugin": error.get("plugin")}, secrets=secrets, patterns=patterns) if error else None,
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
        try:
            self.writer = AuditWriter(Path(path).expanduser(), fsync=self.settings["fsync"],
                                      fsync_every=self.settings["fsync_every"],
                                      fsync_interval_ms=self.settings["fsync_interval_ms"],
                                      rotate_bytes=self.settings["rotate_bytes"])
        except OSError as exc:
            if self.settings["mode"] == "fail_closed":
                raise ConfigError(f"cannot open the audit log {path}: {exc.strerror}",
                                  key=f"plugins.{PLUGIN}.path") from None
            log.warning("audit log %s cannot be opened (%s); calls go unrecorded (mode fail_open)", path, exc)
            return None
        coordinator.register_capability("audit.path", str(self.writer.path))
        return self.writer.close

    def _report(self, future: Any) -> None:
        exc = future.exception()
        if exc is not None and not self._warned:
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
    async def tool_complete(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult,
                            context: ToolContext) -> None:
        original = self._original.pop(call.id, call.arguments)
        if self.telemetry is not None:
            self.telemetry.record(call, spec, result)
        writer = self.writer
        if writer is None:
            return
        record = build_record(call, spec, result, context, original, self.settings)
        future = writer.append(record)
        if self.settings["fsync"] != "always":
            # Only fsync="always" acknowledges: other modes return at once; a failed write is
            # logged by the writer and fails the next call closed in tool_pre.
            future.add_done_callback(self._report)
            return
        try:
            await asyncio.wrap_future(future)
        except OSError as exc:
            if self.settings["mode"] == "fail_closed":
                raise
            if not self._warned:
                self._warned = True
                log.warning("%s; continuing without an audit record (mode fail_open)", exc)
