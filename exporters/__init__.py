"""``configure()``: wire traces and metrics once, at start-up. The only code touching globals.

Typical use::

    telemetry = stagelens.configure()          # OTLP traces per OTEL_*, Prometheus metrics
    stagelens.instrument_app(app, telemetry=telemetry, metrics_path="/metrics")

GPU metrics: ``configure(gpu=...)`` registers the NVML collector on the registry that
``/metrics`` serves (see ``enable_gpu_metrics``), and the ``hw.*`` OTel gauges when a
meter provider is given or installed globally.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from prometheus_client import CollectorRegistry, start_http_server
from stagelens.exporters.nvml import (
    NvmlCollector,
    gpu_collector_enabled,
    gpu_collector_for,
    register_gpu_collector,
)
from stagelens.exporters.nvml_sampler import GpuReader
from stagelens.exporters.otlp import build_tracer_provider, span_exporters_from_env
from stagelens.exporters.prometheus import (
    exposition_registry,
    metrics_app,
    multiprocess_enabled,
    recording_registry,
    register_collector,
)
from stagelens.exporters.worker_split import watch_workers

from stagelens import semconv
from stagelens.config import Settings, load_settings
from stagelens.pricing import PriceTable
from stagelens.settings_env import report_unknown_variables
from stagelens.spans.provider import DeferredTracerProvider
from stagelens.telemetry import Telemetry, set_default_telemetry

__all__ = ["configure", "enable_gpu_metrics", "metrics_app", "register_collector"]

_log = logging.getLogger(__name__)


def _sdk_meter_provider(given: metrics.MeterProvider | None) -> metrics.MeterProvider | None:
    """The meter provider for OTel GPU gauges: the one given, else a global SDK provider
    (the default global is a no-op proxy: then there is no OTel metrics pipeline)."""
    if given is not None:
        return given
    current = metrics.get_meter_provider()
    return current if isinstance(current, SdkMeterProvider) else None


def enable_gpu_metrics(
    registry: CollectorRegistry | None,
    *,
    gpu: bool | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    telemetry: Telemetry | None = None,
    interval_s: float = 1.0,
) -> NvmlCollector | None:
    """Register the NVML collector on ``registry`` (the one ``/metrics`` serves) and, when
    ``meter_provider`` is given or an SDK provider is global, the ``hw.*`` OTel gauges over
    the same reader. Idempotent per registry; never raises.

    ``gpu``: True = always (without NVML: ``stagelens_gpu_collector_up 0`` and one
    warning), False = never, None = on when nvidia-ml-py imports and
    ``STAGELENS_GPU_COLLECTOR`` is not ``0``. Returns the collector, or None when off.
    """
    if not gpu_collector_enabled(gpu):
        return None
    try:
        existing = gpu_collector_for(registry)
        if existing is not None:
            return existing
        on_error = None
        if telemetry is not None:
            report = telemetry.report_error

            def on_error(exc: BaseException) -> None:
                report(semconv.COMPONENT_NVML, exc)

        reader = GpuReader(interval_s=interval_s, on_error=on_error)
        collector = register_gpu_collector(registry, gpu=True, reader=reader)
        provider = _sdk_meter_provider(meter_provider)
        if provider is not None and collector is not None:
            from stagelens.exporters.gpu_otel import register_gpu_meters

            register_gpu_meters(provider, reader, cost_usd_per_hour=collector.cost_usd_per_hour)
            if telemetry is not None:  # its flush and shutdown export the hw.* gauges too
                telemetry.add_flushed(provider)
        return collector
    except Exception as exc:  # telemetry never breaks start-up of the host
        _log.warning("GPU metrics not enabled: %s: %s", type(exc).__name__, exc)
        return None


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
    gpu: bool | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    sampler: Sampler | None = None,
    **overrides: Any,
) -> Telemetry:
    """Set up tracing and Prometheus metrics; return the Telemetry to instrument apps with.

    - Traces: ``tracer_provider`` if given; else a deferred provider (spans recorded on
      the request path, built and exported by a worker thread: ``stagelens.spans``)
      exporting to ``span_exporters`` or, by default, to what ``OTEL_TRACES_EXPORTER`` /
      ``OTEL_EXPORTER_OTLP_*`` name (OTLP over HTTP/protobuf unless ``grpc``), through a
      bounded queue whose drops are counted. ``OTEL_SERVICE_NAME`` and
      ``OTEL_TRACES_SAMPLER`` are honoured; ``sampler`` overrides the latter
      (``stagelens.TailSampler(ratio)`` is ``OTEL_TRACES_SAMPLER=stagelens_tail`` with
      ``OTEL_TRACES_SAMPLER_ARG=ratio``: traces kept by what happened to their request,
      decided when it ends; see ``stagelens.tail_sampling``).
    - Settings: ``settings`` and ``overrides`` over the ``STAGELENS_*`` environment,
      validated here (``ConfigurationError`` naming the variable and the expected form);
      an unknown ``STAGELENS_*`` variable is warned about once per process, an error with
      ``STAGELENS_STRICT=1`` (``stagelens.settings_env``).
    - Metrics: recorded in ``registry`` (default ``REGISTRY``); served by
      ``telemetry.exposition_registry`` which aggregates worker files when
      ``PROMETHEUS_MULTIPROC_DIR`` is set. Without it, a process that is one of several
      workers of one server (uvicorn ``--workers``, gunicorn) warns once and exposes
      ``stagelens_metrics_split_info`` (``exporters/worker_split.py``). ``metrics_port``
      also starts a separate ``/metrics`` HTTP server.
    - ``set_global``: install the provider globally and make this Telemetry the default for
      ``instrument_app()`` / ``stage()`` calls that name none.
    - GPU: ``gpu=True`` registers the NVML collector on the exposition registry (what
      ``/metrics`` serves, also in multiprocess mode), ``False`` never, ``None`` (default)
      when nvidia-ml-py imports and ``STAGELENS_GPU_COLLECTOR`` is not ``0``. Without a GPU
      it reports ``stagelens_gpu_collector_up 0`` and logs one warning. With
      ``meter_provider`` (or a global SDK MeterProvider) the ``hw.*`` OTel gauges too.
    - GenAI metrics (``genai_metrics=True`` / ``STAGELENS_GENAI_METRICS=1``; off by
      default, and then nothing is created): the ``gen_ai.*`` histograms of the GenAI
      semantic conventions on ``meter_provider`` when given, else exported over OTLP per
      ``OTEL_EXPORTER_OTLP[_METRICS]_*`` (``exporters/genai_metrics.py``).
    """
    resolved = load_settings(settings, **overrides)
    report_unknown_variables(os.environ, strict=resolved.strict)
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
            sampler=sampler,
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
        if isinstance(provider, TracerProvider | DeferredTracerProvider):
            trace.set_tracer_provider(provider)
        set_default_telemetry(telemetry)
    enable_gpu_metrics(exposition, gpu=gpu, meter_provider=meter_provider, telemetry=telemetry)
    if not multiprocess_enabled():  # there the scrape adds every worker's files up
        watch_workers(exposition)
    if resolved.genai_metrics:
        from stagelens.exporters.genai_metrics import enable_genai_metrics

        enable_genai_metrics(telemetry, meter_provider=meter_provider)
    if metrics_port is not None:
        start_http_server(metrics_port, addr=metrics_addr, registry=exposition)
    return telemetry
