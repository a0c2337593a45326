"""Test helpers for users' own tests: in-memory spans and a fresh Prometheus registry.

Why public: a team adding stagelens to its service wants to assert "this endpoint produces
a tokenizer stage span" without a collector. ``capture_telemetry()`` builds an isolated
Telemetry (its own tracer provider with an in-memory exporter, its own CollectorRegistry),
touches no globals, and is what stagelens's own tests use.

The tracer is the one ``configure()`` builds, the deferred provider
(``stagelens.spans``: spans recorded on the request path, built and exported by
a worker thread), so tests exercise what production runs; reading the spans flushes it
first, so every span ended before the read is seen. ``capture_telemetry(tracer="sdk")``
records through the OpenTelemetry SDK's TracerProvider instead (what an app passing its own
``tracer_provider=`` gets).

    with capture_telemetry() as cap:
        instrument_app(app, telemetry=cap.telemetry)
        ...  # drive the app
        assert cap.span_names() == [...]
        assert cap.value("stagelens_requests_total", model="tiny", code="200") == 1
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, Literal

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from stagelens.config import Settings, load_settings
from stagelens.exporters.otlp import build_tracer_provider
from stagelens.pricing import PriceTable
from stagelens.telemetry import Telemetry

TracerKind = Literal["deferred", "sdk"]
"""Which tracer provider a capture records through (see ``capture_telemetry``)."""

TRACERS: Final[tuple[TracerKind, ...]] = ("deferred", "sdk")
"""Every ``TracerKind``, for tests that run against both."""


class TelemetryCapture:
    """Finished spans and metric samples recorded by ``telemetry``."""

    def __init__(self, telemetry: Telemetry, exporter: InMemorySpanExporter) -> None:
        self.telemetry = telemetry
        self.exporter = exporter
        self.registry: CollectorRegistry = telemetry.registry

    def spans(self) -> list[ReadableSpan]:
        """Finished spans, in the order they ended (the tracer is flushed first)."""
        self.telemetry.force_flush()
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
        self.telemetry.force_flush()
        self.exporter.clear()


@contextmanager
def capture_telemetry(
    settings: Settings | None = None,
    *,
    prices: PriceTable | None = None,
    tracer: TracerKind = "deferred",
    **overrides: Any,
) -> Iterator[TelemetryCapture]:
    """An isolated Telemetry recording into memory; nothing global is touched.

    ``tracer``: ``"deferred"`` (default) records through the provider ``configure()``
    builds, with the environment's resource and sampler as there; ``"sdk"`` through the
    OpenTelemetry SDK's TracerProvider and a SimpleSpanProcessor.
    """
    resolved = load_settings(settings, **overrides)
    exporter = InMemorySpanExporter()
    holder: list[Telemetry] = []

    def count_dropped(reason: str, n: int) -> None:
        if holder:
            holder[0].instruments.spans_dropped.get(reason).inc(n)

    provider: trace.TracerProvider
    if tracer == "deferred":
        provider = build_tracer_provider(
            [exporter], count_dropped, max_queue_size=resolved.span_queue_size
        )
    elif tracer == "sdk":
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(exporter))
        provider = sdk
    else:
        raise ValueError(f"tracer: expected one of {TRACERS}, got {tracer!r}")
    try:
        telemetry = Telemetry(
            resolved,
            tracer_provider=provider,
            registry=CollectorRegistry(),
            prices=prices,
        )
        holder.append(telemetry)
        yield TelemetryCapture(telemetry, exporter)
    finally:
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is not None:
            shutdown()
