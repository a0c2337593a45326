"""stagelens.testing: captures record through the production tracer unless told otherwise,
and read spans deterministically."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from stagelens import semconv
from stagelens.spans.provider import DeferredTracerProvider
from stagelens.testing import TRACERS, capture_telemetry


def test_the_default_capture_runs_the_tracer_configure_builds() -> None:
    """Without options a capture records through the deferred provider; ``tracer="sdk"``
    through the SDK's."""
    with capture_telemetry() as deferred, capture_telemetry(tracer="sdk") as sdk:
        assert isinstance(deferred.telemetry.tracer_provider, DeferredTracerProvider)
        assert isinstance(sdk.telemetry.tracer_provider, TracerProvider)


def test_an_unknown_tracer_is_refused() -> None:
    """A misspelt tracer kind fails loudly instead of silently using a default."""
    misspelt: Any = "otel"
    with pytest.raises(ValueError, match="tracer"), capture_telemetry(tracer=misspelt):
        pass


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_span_is_readable_as_soon_as_it_ended(tracer, monkeypatch) -> None:
    """Spans are read after a flush: a span ended just before the read is there, with the
    SDK's view of its fields, even when the export worker would wait an hour."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    with capture_telemetry(tracer=tracer) as cap:
        tracer_ = cap.telemetry.tracer
        with tracer_.start_as_current_span("outer", kind=SpanKind.SERVER) as outer:
            with tracer_.start_as_current_span("inner") as inner:
                inner.set_attribute("list", ["a", "b"])
                inner.add_event("seen", {"k": [1, 2]})
            outer.set_status(StatusCode.ERROR, "boom")
        assert cap.span_names() == ["inner", "outer"]
        got_inner, got_outer = cap.span("inner"), cap.span("outer")
        assert got_inner.parent.span_id == got_outer.context.span_id
        assert got_outer.parent is None
        assert got_outer.kind is SpanKind.SERVER
        assert got_outer.status.status_code is StatusCode.ERROR
        assert got_inner.attributes["list"] == ("a", "b")
        assert [(e.name, dict(e.attributes)) for e in got_inner.events] == [("seen", {"k": (1, 2)})]
        assert got_inner.start_time <= got_inner.end_time
        cap.clear()
        assert cap.spans() == []


def test_dropped_spans_are_counted_in_the_capture(monkeypatch) -> None:
    """A capture bounds its span queue as configure() does (``span_queue_size``) and counts
    what the bound drops in its own registry."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    with capture_telemetry(span_queue_size=2) as cap:
        for name in "abcde":
            cap.telemetry.tracer.start_span(name).end()
        assert cap.span_names() == ["a", "b"]
        assert cap.value(semconv.SPANS_DROPPED, reason="queue_full") == 3.0
