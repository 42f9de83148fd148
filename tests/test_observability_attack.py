"""Attacks on the observability surface: the audit plugin's OpenTelemetry export, events emitted
through ``coordinator.hooks.emit`` and the ``tool_event`` hook, and the log lines about them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from amplifier_tools import ToolContext, ToolHost, hookimpl, tool
from amplifier_tools.builtins.audit import AuditPlugin

SECRET = "Zq7uObsCanary9Kx2Tok"
SECRET_VAR = "AMP_TEST_OBSERVABILITY_SECRET"


@tool(name="greet", effect="Pure")
def greet(name: str) -> str:
    """Greet."""
    return f"hi {name}"


class Tools:
    """Mounts the given tools; keeps its coordinator."""

    name = "obs_tools"

    def __init__(self, *tools: Any) -> None:
        self.tools = tools
        self.coordinator: Any = None

    @hookimpl
    async def mount(self, coordinator: Any, config: dict[str, Any]) -> None:
        self.coordinator = coordinator
        for t in self.tools:
            await coordinator.mount("tools", t)


def _places(tmp_path: Path) -> dict[str, Any]:
    work = tmp_path / "work"
    work.mkdir()
    return {"working_dir": work, "builtins": False, "entry_points": False, "discover": False,
            "config": {"state_dir": str(tmp_path / "state"), "secrets": {"s": SECRET_VAR},
                       "plugins": {"audit": {"otel": True, "fsync": "never"}}}}


async def test_a_raising_span_processor_neither_fails_the_call_nor_loses_its_record(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: a span processor (or exporter wrapper, or meter) that raised in ``on_end``
    made the audit plugin's ``tool_complete`` raise before it wrote the record: every call failed
    with ``hook_failed`` and none was recorded."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    class Broken(SpanProcessor):
        def on_end(self, span: Any) -> None:
            raise RuntimeError("collector unreachable")

    provider = TracerProvider()
    provider.add_span_processor(Broken())
    places = _places(tmp_path)
    with caplog.at_level(logging.WARNING, logger="amplifier_tools"):
        async with ToolHost(plugins=[Tools(greet), AuditPlugin(tracer_provider=provider)], **places) as host:
            results = [await host.call("greet", {"name": "x"}) for _ in range(3)]
            log = Path(host.capabilities["audit.path"])
    assert all(r.success for r in results), results[0].error
    assert [r["call_id"] for r in map(_json, log.read_text().splitlines()) if r.get("kind") == "call"] \
        == [r.tool_call_id for r in results]
    warned = [r for r in caplog.records if "collector unreachable" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]  # said once, not per call


def _json(line: str) -> dict[str, Any]:
    import json

    value: dict[str, Any] = json.loads(line)
    return value


async def test_unknown_tool_names_do_not_crowd_real_tools_out_of_the_duration_metric(tmp_path: Path) -> None:
    """Found by attack: the histogram's ``gen_ai.tool.name`` was whatever name the caller (a model)
    asked for, known or not; 2,000 hallucinated names filled the SDK's cardinality limit and every
    real tool's durations went to the ``otel.metric.overflow`` series from then on."""
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    audit = AuditPlugin(tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader]))
    async with ToolHost(plugins=[Tools(greet), audit], **_places(tmp_path)) as host:
        for i in range(2001):
            assert not (await host.call(f"made_up_{i}", {})).success
        assert (await host.call("greet", {"name": "x"})).success
    metrics = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
    points = next(m for m in metrics if m.name == "amplifier_tools.tool.duration").data.data_points
    by_name = {dict(p.attributes or {}).get("gen_ai.tool.name"): p.count for p in points}
    assert by_name.get("greet") == 1, sorted(map(str, by_name))[:5]
    assert by_name.get("_OTHER") == 2001 and len(points) == 2
    spans = exporter.get_finished_spans()  # the span still names what was asked for
    assert dict(spans[0].attributes or {})["gen_ai.tool.name"] == "made_up_0"


async def test_a_secret_in_an_emitted_event_is_redacted_for_handlers_observers_and_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Found by attack: what a tool emitted through ``coordinator.hooks.emit`` reached Amplifier
    handlers (``serve-mcp`` forwards ``tool:progress`` messages to its client) and every
    ``tool_event`` hook with the secret it had resolved in it — an imported MCP server's events
    were scrubbed, a local tool's not; and a failing handler's log line quoted the event name whole."""
    monkeypatch.setenv(SECRET_VAR, SECRET)
    tools = Tools()

    @tool(name="deploy", security={"secret_refs": ["s"]})
    async def deploy(context: ToolContext) -> str:
        """Deploy, reporting progress."""
        token = context.secret("s")
        await tools.coordinator.hooks.emit("tool:progress", {
            "tool_call_id": context.call_id, "progress": 1, "total": 2, "message": f"using {token}",
            "nested": [{"token": token}]})
        await tools.coordinator.hooks.emit(f"deploy:{token}", {"ok": True})
        return "done"

    tools.tools = (deploy,)
    seen: list[tuple[str, Any]] = []

    class Observer:
        name = "obs_observer"

        @hookimpl
        def tool_event(self, event: str, data: dict[str, Any]) -> None:
            if not event.startswith("tool:") or event == "tool:progress":
                seen.append(("tool_event", data))

    def failing(event: str, data: dict[str, Any]) -> None:
        raise ValueError("handler failed")

    places = _places(tmp_path)
    del places["config"]["plugins"]  # no audit plugin here
    with caplog.at_level(logging.ERROR, logger="amplifier_tools"):
        async with ToolHost(plugins=[tools, Observer()], **places) as host:
            host.events.register("tool:progress", lambda event, data: seen.append(("handler", data)), name="relay")
            host.events.register(f"deploy:{SECRET}", failing, name="failing")
            assert (await host.call("deploy", {})).success
    assert len(seen) == 3, seen
    assert SECRET not in repr(seen) and "using [REDACTED]" in repr(seen)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "handler 'failing'" in text and SECRET not in text, text
