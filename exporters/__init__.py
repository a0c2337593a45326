"""``configure()``: wire traces and metrics once, at start-up. The only code touching globals.

Typical use::

    telemetry = stagelens.configure()          # OTLP traces per OTEL_*, Prometheus metrics
    stagelens.instrument_app(app, telemetry=telemetry, metrics_path="/metrics")
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from prometheus_client import CollectorRegistry, start_http_server
from stagelens.exporters.otlp import build_tracer_provider, span_exporters_from_env
from stagelens.exporters.prometheus import (
    exposition_registry,
    metrics_app,
    recording_registry,
    register_collector,
)
from stagelens.instrumentation._telemetry import Telemetry, set_default_telemetry

from stagelens.config import Settings, load_settings
from stagelens.pricing import PriceTable

__all__ = ["configure", "metrics_app", "register_collector"]


def configure(
    settings: Settings | None = None,
    *,
    span_exporters: list[SpanExporter] | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    registry: CollectorRegistry | None = None,
    prices: PriceTable | None = None,
    set_global: bool = True,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
    **overrides: Any,
) -> Telemetry:
    """Set up tracing and Prometheus metrics; return the Telemetry to instrument apps with.

    - Traces: ``tracer_provider`` if given; else an SDK provider exporting to
      ``span_exporters`` or, by default, to what ``OTEL_TRACES_EXPORTER`` /
      ``OTEL_EXPORTER_OTLP_*`` name (OTLP over HTTP/protobuf unless ``grpc``), each through
      a bounded queue whose drops are counted. ``OTEL_SERVICE_NAME`` and
      ``OTEL_TRACES_SAMPLER`` are honoured.
    - Metrics: recorded in ``registry`` (default ``REGISTRY``); served by
      ``telemetry.exposition_registry`` which aggregates worker files when
      ``PROMETHEUS_MULTIPROC_DIR`` is set. ``metrics_port`` also starts a separate
      ``/metrics`` HTTP server.
    - ``set_global``: install the provider globally and make this Telemetry the default for
      ``instrument_app()`` / ``stage()`` calls that name none.
    """
    resolved = load_settings(settings, **overrides)
    recording = recording_registry(registry)
    exposition = exposition_registry(registry)
    holder: list[Telemetry] = []

    def count_dropped(reason: str, n: int) -> None:
        if holder:
            holder[0].instruments.spans_dropped.get(reason).inc(n)

    provider: trace.TracerProvider
    if tracer_provider is not None:
        provider = tracer_provider
    else:
        exporters = span_exporters if span_exporters is not None else span_exporters_from_env()
        provider = build_tracer_provider(
            exporters,
            count_dropped,
            max_queue_size=resolved.span_queue_size,
            service_name="stagelens-gateway",
        )
    telemetry = Telemetry(
        resolved,
        tracer_provider=provider,
        registry=recording,
        exposition_registry=exposition,
        prices=prices,
    )
    holder.append(telemetry)
    if set_global:
        if isinstance(provider, TracerProvider):
            trace.set_tracer_provider(provider)
        set_default_telemetry(telemetry)
    if metrics_port is not None:
        start_http_server(metrics_port, addr=metrics_addr, registry=exposition)
    return telemetry
