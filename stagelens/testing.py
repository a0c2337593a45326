"""Test helpers for users' own tests: in-memory spans and a fresh Prometheus registry.

Why public: a team adding stagelens to its service wants to assert "this endpoint produces
a tokenizer stage span" without a collector. ``capture_telemetry()`` builds an isolated
Telemetry (its own TracerProvider with an in-memory exporter, its own CollectorRegistry),
touches no globals, and is what stagelens's own tests use.

    with capture_telemetry() as cap:
        instrument_app(app, telemetry=cap.telemetry)
        ...  # drive the app
        assert cap.span_names() == [...]
        assert cap.value("stagelens_requests_total", model="tiny", code="200") == 1
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from stagelens.config import Settings, load_settings
from stagelens.pricing import PriceTable
from stagelens.telemetry import Telemetry


class TelemetryCapture:
    """Finished spans and metric samples recorded by ``telemetry``."""

    def __init__(self, telemetry: Telemetry, exporter: InMemorySpanExporter) -> None:
        self.telemetry = telemetry
        self.exporter = exporter
        self.registry: CollectorRegistry = telemetry.registry

    def spans(self) -> list[ReadableSpan]:
        """Finished spans, in the order they ended."""
        return list(self.exporter.get_finished_spans())

    def span_names(self) -> list[str]:
        """Names of the finished spans, in the order they ended."""
        return [s.name for s in self.spans()]

    def span(self, name: str) -> ReadableSpan:
        """The only finished span called ``name`` (AssertionError if not exactly one)."""
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, f"expected one span {name!r}, got {len(found)}: {self.span_names()}"
        return found[0]

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value (``name`` as exposed, e.g. ``..._total`` or ``..._count``)."""
        return self.registry.get_sample_value(name, labels)

    def clear(self) -> None:
        """Forget spans finished so far."""
        self.exporter.clear()


@contextmanager
def capture_telemetry(
    settings: Settings | None = None, *, prices: PriceTable | None = None, **overrides: Any
) -> Iterator[TelemetryCapture]:
    """An isolated Telemetry recording into memory; nothing global is touched."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(
        load_settings(settings, **overrides),
        tracer_provider=provider,
        registry=CollectorRegistry(),
        prices=prices,
    )
    try:
        yield TelemetryCapture(telemetry, exporter)
    finally:
        provider.shutdown()
