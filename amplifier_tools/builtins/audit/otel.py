"""Optional OpenTelemetry for every call: one ``execute_tool {name}`` span and a duration histogram.

Needs the ``otel`` extra (``pip install 'amplifier-tools[otel]'``); the core never
imports OpenTelemetry. Spans follow the GenAI semantic conventions
(``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``error.type`` on failure). The span is recorded when
the call completes, with its start set from the measured duration, so it
never adds a hook to the hot path of calls that are not traced.

Every string put on a span (the tool name, the call id, the status message) is
redacted with the host-wide secret registry first; no arguments or output are
ever put on a span.
"""

from __future__ import annotations

import time
from typing import Any, Final

from ...errors import ConfigError
from ...models import ToolCall, ToolResult
from ...redaction import SecretSet, redact_text
from ...spec import ToolSpec

#: The histogram's ``gen_ai.tool.name`` for a call to an unknown tool (the span keeps the name).
OTHER: Final = "_OTHER"


class ToolTelemetry:
    """Records spans and the duration histogram through the given (or global) providers."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None, *,
                 secrets: SecretSet | None = None, patterns: bool = True) -> None:
        self._secrets = SecretSet() if secrets is None else secrets
        self._patterns = patterns
        try:
            from opentelemetry import metrics, trace
        except ImportError:
            raise ConfigError("OpenTelemetry is not installed (pip install 'amplifier-tools[otel]')",
                              key="plugins.audit.otel",
                              hint="pip install 'amplifier-tools[otel]', or set plugins.audit.otel = false") from None
        self._trace = trace
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("amplifier_tools")
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("amplifier_tools")
        self._duration = meter.create_histogram(
            "amplifier_tools.tool.duration", unit="s", description="Duration of tool calls, by tool and error type")

    def _clean(self, text: Any) -> str:
        return redact_text(str(text), self._secrets, patterns=self._patterns)

    def record(self, call: ToolCall, spec: ToolSpec | None, result: ToolResult) -> None:
        seconds = float(result.metadata.get("duration_ms", 0.0)) / 1000.0
        end = time.time_ns()
        name = self._clean(call.name)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": self._clean(call.id),
            "gen_ai.tool.type": "function",
        }
        if spec is not None:
            attributes["amplifier_tools.tool.version"] = self._clean(spec.version)  # an imported server's string
            attributes["amplifier_tools.tool.effect"] = spec.effect.value
        error = result.error
        if error is not None:
            attributes["error.type"] = self._clean(error.get("type"))
            attributes["amplifier_tools.error.code"] = self._clean(error.get("code"))
        span = self._tracer.start_span(f"execute_tool {name}", start_time=end - int(seconds * 1e9),
                                       kind=self._trace.SpanKind.INTERNAL, attributes=attributes)
        if error is not None:
            message = self._clean(error.get("message", ""))[:200]
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))
        span.end(end_time=end)
        # A name no tool has (whatever a model made up) is "_OTHER" here: found by attack, 2,000 of
        # them filled the SDK's cardinality limit and real tools' durations went to its overflow.
        metric_attributes = {"gen_ai.operation.name": "execute_tool",
                             "gen_ai.tool.name": name if spec is not None else OTHER}
        if error is not None:
            metric_attributes["error.type"] = attributes["error.type"]
        self._duration.record(seconds, attributes=metric_attributes)
