"""Wiring the GenAI sink (``stagelens.metrics.genai``) to OpenTelemetry: its OTLP metrics
pipeline, its exponential-histogram views, and its place on a Telemetry's fold.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Final

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from stagelens.exporters.otlp import OtlpMetricsPipeline

from stagelens import semconv as sc
from stagelens.metrics.fold import Fold
from stagelens.metrics.genai import GEN_AI_HISTOGRAMS, GenAIMetrics, latest_experimental
from stagelens.telemetry import Telemetry

__all__ = [
    "GEN_AI_HISTOGRAMS",
    "GenAIMetrics",
    "enable_genai_metrics",
    "exponential_views",
    "latest_experimental",
]

SERVICE_NAME: Final = "stagelens-gateway"
"""Default ``service.name`` of the metrics exported (``OTEL_SERVICE_NAME`` wins), the one
``configure()`` gives the gateway's spans."""


def exponential_views() -> list[View]:
    """Views aggregating the GenAI histograms as base-2 exponential histograms (SDK
    defaults: 160 buckets, scale down from 20), for a MeterProvider's ``views``. They
    replace the semconv's explicit bucket advice."""
    return [
        View(instrument_name=name, aggregation=ExponentialBucketHistogramAggregation())
        for name in GEN_AI_HISTOGRAMS
    ]


_ENABLED: weakref.WeakKeyDictionary[Fold, GenAIMetrics] = weakref.WeakKeyDictionary()
_ENABLED_LOCK = threading.Lock()


def enable_genai_metrics(
    telemetry: Telemetry,
    *,
    meter_provider: MeterProvider | None = None,
    exporter: MetricExporter | None = None,
    views: Sequence[View] | None = None,
) -> GenAIMetrics:
    """Create the GenAI histograms and hand them every folded batch of ``telemetry``'s
    requests. Idempotent per set of instruments (a derived Telemetry shares them).

    On ``meter_provider`` when given (its views and readers are the caller's), else on an
    OTLP pipeline of its own: exporter per ``OTEL_EXPORTER_OTLP[_METRICS]_*`` (or
    ``exporter``), interval per ``OTEL_METRIC_EXPORT_INTERVAL``, exponential histograms
    when ``settings.genai_metrics_exponential`` (or ``views``). Either way the requests
    still queued are folded at the start of every collection. Raises ConfigurationError /
    DependencyMissingError for bad ``OTEL_*`` settings (at start-up, never on a request).

    ``telemetry.force_flush()`` and ``shutdown()`` then cover the GenAI metrics too: the
    pipeline built here is flushed and shut down with the spans; a given meter provider
    is flushed (its owner shuts it down)."""
    fold = telemetry.fold
    with _ENABLED_LOCK:
        found = _ENABLED.get(fold)
        if found is not None:
            _flushed_with(telemetry, found)
            return found
        report = telemetry.report_error

        def on_error(exc: BaseException) -> None:
            report(sc.COMPONENT_GENAI_METRICS, exc)

        pipeline = None
        if meter_provider is None:
            if views is None:
                views = exponential_views() if telemetry.settings.genai_metrics_exponential else []

            def on_failure(exc: BaseException | None) -> None:
                on_error(exc if exc is not None else RuntimeError("OTLP export refused"))

            pipeline = OtlpMetricsPipeline(
                on_failure, service_name=SERVICE_NAME, exporter=exporter, views=views
            )
            meter_provider = pipeline.provider
        metrics = GenAIMetrics(
            meter_provider,
            max_response_models=telemetry.settings.max_models,
            on_error=on_error,
            before_collect=fold.fold,
        )
        metrics.pipeline = pipeline
        fold.add_sink(metrics)
        _ENABLED[fold] = metrics
        _flushed_with(telemetry, metrics)
        return metrics


def _flushed_with(telemetry: Telemetry, metrics: GenAIMetrics) -> None:
    """Register the GenAI metrics' pipeline with ``telemetry``'s flush and shutdown."""
    if metrics.pipeline is not None:
        telemetry.add_pipeline(metrics.pipeline)
    else:
        telemetry.add_flushed(metrics.meter_provider)
