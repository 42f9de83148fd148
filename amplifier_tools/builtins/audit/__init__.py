"""The audit plugin: one redacted, hash-chained JSON Lines record per call.

Uses only public hooks: a ``tryfirst`` ``mount`` (so its cleanup, the writer's
close, runs last); a ``tryfirst`` ``tool_pre`` notes the original arguments and
refuses calls while the log cannot be written or was tampered with
(``fail_closed``); a ``trylast`` ``tool_complete`` writes the record of every
call — success, veto, contract, policy or auth failure, timeout, tool failure,
cancellation — synchronously, before the hook returns (so a cancelled caller
cannot lose it), and under ``fsync="always"`` returns an awaitable for the
shared fsync. Every call gets a record: what cannot be encoded as it is
(lone surrogates, huge integers, non-string keys, NaN, deep nesting) is
escaped or summarized, and the record's ``altered`` field says where.
The log lives in the host's ``state_dir`` by default and is registered as a
protected path; see ``writer`` for how it is opened and checked.

Records and spans are redacted with the host-wide ``session.secrets`` registry
(every secret resolved in the run, not only the called tool's), the tool's
``redaction_rules`` and, unless ``redact_patterns = false``, credential shapes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import os
import sys
import time
from collections.abc import Awaitable
from typing import Any, Final

from ..._json import dumps, encodable, same_json
from ..._markers import hookimpl
from ...content import blocks_of
from ...content import summary as content_summary
from ...errors import AuthError, ConfigError, ToolSystemError
from ...models import ToolCall, ToolContext, ToolResult
from ...plugin_settings import structure_settings
from ...redaction import SecretSet, redact, redact_text
from ...spec import ToolSpec
from .chain import SCHEMA_VERSION, anchor_path, definition_of, encode_body, log_location
from .settings import AuditSettings
from .spliced import has_nonfinite, may_hold_nonfinite, spliced_body
from .writer import AuditWriteError, AuditWriter

log = logging.getLogger("amplifier_tools.audit")

PLUGIN: Final = "audit"
def _register_secrets(spec: ToolSpec | None, context: ToolContext, secrets: SecretSet) -> None:
    """The tool's own secret values join the registry (a context from outside the host may carry
    a resolver that does not register what it resolves)."""
    for ref in spec.security.secret_refs if spec is not None else ():
        try:
            secrets.add(context.secret(ref))
        except AuthError:
            continue


def build_record(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext,
                 original: Any, settings: AuditSettings, secrets: SecretSet | None = None) -> dict[str, Any]:
    """The record of one call, redacted, before it is chained.

    ``secrets`` is the host-wide registry (``session.secrets``); without one, only the called
    tool's own secret values are redacted. Never raises for what a caller or tool passed: values
    that cannot be encoded as they are are escaped or summarized by ``_json.encodable`` and
    listed in the record's ``altered``.
    """
    if secrets is None:
        secrets = SecretSet()
    _register_secrets(spec, context, secrets)
    rules = spec.security.redaction_rules if spec is not None else ()
    error = result.error or {}
    raw = _raw_parts(call, spec, result, context, original, error)
    blocks = blocks_of(result.metadata)
    if blocks:  # rich content: each block's type, media type, URI, size and digest, never its bytes
        raw["content"] = content_summary(blocks)
    paths = [*rules, *(r.replace("arguments/", "original_arguments/", 1) for r in rules if r.startswith("arguments/"))]
    altered: list[str] = []
    try:
        io = redact(raw, secrets=secrets, paths=paths, patterns=settings.redact_patterns)
        output_bytes = dumps(io["output"]) if result.output is not None else b""
        # NaN and infinities encode, but not as themselves (orjson: null; json: a non-JSON token):
        # look for them only when the encoded values could hold one.
        suspect = may_hold_nonfinite(output_bytes) or may_hold_nonfinite(dumps(io["arguments"])) \
            or has_nonfinite((io["about"], io["trail"], io["error"]))
    except Exception:  # not encodable as it is (a hostile __str__ too): escaped or summarized below
        suspect = failed = True
    else:
        failed = False
    if suspect:
        clean = encodable(raw, altered)
        if altered or failed:
            io = redact(clean, secrets=secrets, paths=paths, patterns=settings.redact_patterns)
            output_bytes = dumps(io["output"]) if result.output is not None else b""
    record = _assemble(io, spec, result, context, output_bytes, timestamp())
    if settings.record_output:
        record["output"] = io["output"]
    if "content" in io:
        record["content"] = io["content"]
    if altered:
        # The notes name paths as they were (a key holding a secret or a credential included):
        # redacted like the values they point at.
        record["altered"] = redact(altered, secrets=secrets, patterns=settings.redact_patterns)
    return record


def record_body(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext,
                original: Any, settings: AuditSettings, secrets: SecretSet) -> bytes:
    """The encoded record of one call: the bytes of ``encode_record(build_record(...))``, for less.

    The common record — no redaction rules, no rich content, no value JSON cannot say, nothing
    to redact — is spliced from encoded pieces (``spliced``: the tool's and caller's members
    encoded once, the call's own values where they sort), after the same search for secrets and
    credential shapes that ``redact``'s pre-scan makes; anything else takes ``build_record``,
    which redacts and escapes. Tested against it: ``tests/test_audit_record_fastpath.py``.
    """
    if spec is None:
        plain = True
    else:
        security = spec.security
        if security.secret_refs:
            _register_secrets(spec, context, secrets)
        plain = not security.redaction_rules
    metadata = result.metadata
    if plain and (metadata.get("content") is None or not blocks_of(metadata)):  # no content: no blocks
        body = spliced_body(call, spec, result, context, original, settings.record_output, settings.redact_patterns,
                            secrets, timestamp())
        if body is not None:
            return body
    return encode_record(build_record(call, spec, result, context, original, settings, secrets))


def _raw_parts(call: ToolCall, spec: ToolSpec | None, result: ToolResult, context: ToolContext, original: Any,
               error: dict[str, Any]) -> dict[str, Any]:
    """What a record holds from the caller, the tool and the plugins: what redaction scrubs."""
    try:
        changed = original is not call.arguments and not same_json(original, call.arguments)
    except RecursionError:
        changed = True
    # Who and what: the tool name and call id come from the caller, the version from the tool (an
    # imported server's own string), so they are redacted like the rest.
    # The session id is the caller's too (a ToolContext it built), and ``attempts`` the tool's when
    # the host did not retry (whatever its result's metadata said).
    about = {"tool": call.name, "tool_version": spec.version if spec is not None else None,
             "definition": definition_of(spec), "call_id": call.id, "session_id": context.session_id,
             "trace_id": context.trace_id, "principal": context.principal, "role": context.role,
             "environment": context.environment, "scopes": _sorted_scopes(context.scopes),
             "attempts": result.metadata.get("attempts", 1)}
    return {"about": about, "arguments": call.arguments, "original_arguments": original if changed else None,
            "output": result.output, "trail": result.metadata.get("trail", []),
            "error": {"type": error.get("type"), "code": error.get("code"), "message": error.get("message"),
                      "plugin": error.get("plugin")} if error else None}


def _sorted_scopes(scopes: Any) -> list[Any]:
    """``sorted(scopes)``, or, for scopes that do not compare (a caller's ``{"read", 1}``), an
    order by type and repr: the record is written whatever a caller built (the splice, whose
    ``sorted`` raises, hands such a record here)."""
    try:
        return sorted(scopes)
    except Exception:
        try:
            return sorted(scopes, key=lambda scope: (type(scope).__name__, repr(scope)))
        except Exception:
            return [f"<{type(scopes).__name__}>"]


def _assemble(io: dict[str, Any], spec: ToolSpec | None, result: ToolResult, context: ToolContext,
              output_bytes: bytes, ts: str) -> dict[str, Any]:
    """The record's members from its (redacted) parts."""
    about = io["about"]
    return {
        "v": SCHEMA_VERSION,
        "kind": "call",
        "ts": ts,
        "call_id": about["call_id"],
        "session_id": about["session_id"],
        "trace_id": about["trace_id"],
        "tool": about["tool"],
        "tool_version": about["tool_version"],
        **({"definition": about["definition"]} if about["definition"] is not None else {}),
        "effect": spec.effect.value if spec is not None else None,
        "principal": about["principal"],
        "role": about["role"],
        "environment": about["environment"],
        "scopes": about["scopes"],
        "arguments": io["arguments"],
        "original_arguments": io["original_arguments"],
        "trail": io["trail"],
        "status": "ok" if result.success else "error",
        "error": io["error"],
        "output_bytes": len(output_bytes),
        "output_sha256": hashlib.sha256(output_bytes).hexdigest() if output_bytes else None,
        "attempts": about["attempts"],
        "duration_ms": round(float(result.metadata.get("duration_ms", 0.0)), 3),
    }


_stamp: tuple[int, str] = (-1, "")  # the last whole second stamped, and its ISO 8601 prefix


def timestamp() -> str:
    """Now in UTC as ISO 8601 with microseconds: ``datetime.now(timezone.utc).isoformat(
    timespec="microseconds")``, the date and time formatted once per second."""
    global _stamp
    second, fraction = divmod(time.time_ns() // 1000, 1_000_000)
    stamp = _stamp  # one read: another thread may replace it meanwhile, never half of it
    if stamp[0] != second:
        stamp = _stamp = (second, dt.datetime.fromtimestamp(second, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S."))
    # Six digits as the tail of a seven-digit number: 3.8 k instructions against 4.5 k for ``:06d``.
    return f"{stamp[1]}{str(fraction + 1_000_000)[1:]}+00:00"


def encode_record(record: dict[str, Any]) -> bytes:
    """The record's canonical bytes; whatever still cannot be encoded (the tool name, a principal
    of an unexpected type...) is escaped, and ``altered`` says so."""
    try:
        return encode_body(record)
    except Exception:  # whatever does not encode as it is, a hostile __str__ included
        altered = list(record.get("altered", ()))
        clean = encodable({k: v for k, v in record.items() if k != "altered"}, altered)
        clean["altered"] = altered
        return encode_body(clean)


class AuditPlugin:
    """Writes the audit log of one host."""

    name = PLUGIN

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._providers = (tracer_provider, meter_provider)
        self.telemetry: Any = None
        self.settings = AuditSettings()
        self.writer: AuditWriter | None = None
        #: The log's path as the writer opens it: what ``audit:tamper`` names, found at start too.
        self._log_path: str | None = None
        self._original: dict[int, Any] = {}
        self._warned = False
        self._telemetry_warned = False
        self._coordinator: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: The host-wide secret registry; a private one under a host that does not provide it.
        self.secrets = SecretSet()

    @hookimpl(tryfirst=True)
    def mount(self, coordinator: Any, config: dict[str, Any]) -> Any:
        """First to mount, so that its cleanup (closing the log) runs last."""
        self.settings = structure_settings(config, AuditSettings, f"plugins.{PLUGIN}")
        self._coordinator = coordinator
        registry = coordinator.get_capability("session.secrets")
        if isinstance(registry, SecretSet):
            self.secrets = registry
        if self.settings.otel:
            from .otel import ToolTelemetry

            self.telemetry = ToolTelemetry(*self._providers, secrets=self.secrets,
                                           patterns=self.settings.redact_patterns)
        configured = self.settings.path
        state_dir = coordinator.get_capability("session.state_dir")
        if configured is None and state_dir is None:
            raise ConfigError("no path configured and the host provides no session.state_dir",
                              key=f"plugins.{PLUGIN}.path")
        path = log_location(configured, state_dir)
        protected = coordinator.get_capability("session.protected_paths")
        if protected is not None:
            # With a key the host refuses to start when a configured path lies where tools may write.
            key = f"plugins.{PLUGIN}.path" if configured else None
            protected.add(path, "the audit log", key=key)
            protected.add(anchor_path(path), "the audit log's anchor", key=key)
        key_ref = self.settings.checkpoint_key_ref
        secret = None
        if key_ref is not None:
            try:
                secret = coordinator.get_capability("session.secret")(key_ref).encode()
            except AuthError as exc:
                raise ConfigError(f"{exc.message}: add it to the host's [secrets] and set the variable",
                                  key=f"plugins.{PLUGIN}.checkpoint_key_ref") from None
        self._log_path = os.path.abspath(os.fspath(path))
        try:
            self.writer = AuditWriter(path, fsync=self.settings.fsync, fsync_every=self.settings.fsync_every,
                                      fsync_interval_ms=self.settings.fsync_interval_ms,
                                      rotate_bytes=self.settings.rotate_bytes,
                                      rotate_seconds=self.settings.rotate_seconds,
                                      checkpoint_key=secret, checkpoint_key_ref=key_ref or "",
                                      checkpoint_every=self.settings.checkpoint_every,
                                      on_tamper=self._tampered)
            self.writer.judge_failure = self._judge_failure
        except OSError as exc:
            if self.settings.mode == "fail_closed":
                raise ConfigError(f"cannot open the audit log {path}: {exc.strerror or exc}",
                                  key=f"plugins.{PLUGIN}.path") from None
            log.warning("audit log %s cannot be opened (%s); calls go unrecorded (mode fail_open)", path, exc)
            return None
        coordinator.register_capability("audit.path", str(self.writer.path))
        coordinator.register_capability("audit.event", self.record_event)
        return self.writer.close

    def record_event(self, event: str, data: dict[str, Any]) -> bool:
        """Write one ``{"kind": "event", "event": ..., "data": ...}`` record (redacted like a call's)
        for something that is not a call but belongs in the log, such as a refused HTTP client of
        ``serve-mcp``. The ``audit.event`` capability. False when it could not be written (logged;
        never raises: the caller is refusing something already)."""
        writer = self.writer
        if writer is None:
            return False
        altered: list[str] = []
        record = {"v": SCHEMA_VERSION, "kind": "event", "ts": timestamp(), "event": event,
                  "data": redact(encodable(data, altered), secrets=self.secrets,
                                 patterns=self.settings.redact_patterns)}
        if altered:  # as a call's record says it (found by attack: the notes were dropped)
            record["altered"] = redact([note.replace("/", "/data/", 1) if note.startswith("/") else note
                                        for note in altered],
                                       secrets=self.secrets, patterns=self.settings.redact_patterns)
        try:
            writer.append(encode_record(record))
        except AuditWriteError as exc:
            log.error("audit log: the event %s was not recorded: %s", event, exc)
            return False
        return True

    def _tampered(self, reason: str, moved_to: str | None) -> None:
        """The writer found the log not as it left it: say so where it cannot be rewritten."""
        print(f"amplifier-tools audit: TAMPERING: {reason}"
              + (f"; the untrusted file was kept as {moved_to}" if moved_to else "")
              + ("; refusing further calls (mode fail_closed)" if self.settings.mode == "fail_closed" else ""),
              file=sys.stderr)
        # The writer's own path once it is made; found at start, the writer is being made (found by
        # attack: the event said ``path: None``).
        data = {"reason": reason, "moved_to": moved_to,
                "path": str(self.writer.path) if self.writer is not None else self._log_path}
        coordinator = self._coordinator
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if coordinator is not None:
            task = loop.create_task(coordinator.hooks.emit("audit:tamper", data))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _unavailable(self) -> str | None:
        writer = self.writer
        if writer is None:
            return "the audit log is not open"
        if writer.tampered is not None:
            return f"the audit log was tampered with ({writer.tampered})"
        if not writer.healthy:
            return f"the audit log cannot be written ({writer.error or writer.sync_error})"
        return None

    @hookimpl(tryfirst=True)
    def tool_pre(self, call: ToolCall, context: ToolContext) -> None:
        # By the call's own context object: a caller-chosen call id need not be unique.
        self._original[id(context)] = call.arguments
        if self.settings.mode == "fail_closed":
            problem = self._unavailable()
            if problem is not None:
                raise ToolSystemError(f"{problem}; refusing to run unrecorded calls",
                                      code="audit_tampered" if self.writer is not None and self.writer.tampered
                                      else "audit_unavailable")

    @hookimpl(trylast=True)
    def tool_complete(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult,
                      context: ToolContext) -> Awaitable[None] | None:
        """Write the call's record now; under ``fsync="always"``, an awaitable for its fsync.

        Synchronous on purpose: the record is in the file before the hook returns, even when
        the calling task was cancelled, and a hook with nothing to wait for creates no coroutine.
        """
        original = self._original.pop(id(context), call.arguments)
        if self.telemetry is not None:
            self._record_telemetry(call, spec, result)
        writer = self.writer
        if writer is None:
            return None
        # Encoded here, on the caller's side: the record is a snapshot even if the caller
        # later mutates its arguments or the tool's output.
        body = record_body(call, spec, result, context, original, self.settings, self.secrets)
        try:
            seq = writer.append(body)
        except AuditWriteError as exc:
            self._write_failed(exc)
            return None
        if self.settings.fsync != "always":
            return None
        # A future, not a coroutine: the host only waits for it, with no task of its own. A failed
        # fsync settles it with ``_judge_failure``'s verdict.
        return writer.wait_synced(seq)

    def _record_telemetry(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult) -> None:
        """The call's span and duration, never at the cost of its record or its result (found by
        attack: a span processor raising in ``on_end`` failed every call with ``hook_failed`` and
        left it unrecorded). A failure is logged once."""
        try:
            self.telemetry.record(call, spec, result)
        except Exception as exc:
            if not self._telemetry_warned:
                self._telemetry_warned = True
                log.warning("%s", redact_text(f"OpenTelemetry export failed ({type(exc).__name__}: {exc}); "
                                              "calls are still recorded in the audit log; further failures "
                                              "are not logged", self.secrets, patterns=self.settings.redact_patterns))

    def _write_failed(self, exc: AuditWriteError) -> None:
        if self.settings.mode == "fail_closed":  # typed: the caller sees audit_unavailable from the first call
            raise ToolSystemError(f"{exc}; the call's result is withheld", code="audit_unavailable") from exc
        if not self._warned:
            self._warned = True
            log.warning("%s; continuing without an audit record (mode fail_open)", exc)

    def _judge_failure(self, error: AuditWriteError) -> BaseException | None:
        """What the calls waiting for a failed fsync get: ``_write_failed``'s verdict (fail
        closed: the typed error; fail open: logged once, nothing)."""
        try:
            self._write_failed(error)
        except ToolSystemError as failed:
            return failed
        return None
