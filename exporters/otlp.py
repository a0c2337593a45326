"""OTLP export from ``OTEL_*``: the exporters, the Resource, the tracer provider configure()
uses and the metrics pipeline the vLLM plugin uses.

Why not the SDK's TracerProvider: see ``stagelens.spans.provider``. Spans are recorded on the
request path and built, encoded and exported by one worker thread through a bounded queue;
every dropped span is counted in ``stagelens_spans_dropped_total{reason}`` and each kind of
exporter failure is logged once. Metrics go through the SDK's MeterProvider and periodic
reader (never made global), with failed exports reported instead of logged per interval.
Setup errors raise ``stagelens.errors`` types; nothing here raises once running.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import Sampler

from stagelens._compat import metric_exporter_preferences
from stagelens.errors import ConfigurationError, DependencyMissingError
from stagelens.spans.provider import DeferredTracerProvider, DropCounter

logger = logging.getLogger("stagelens")

ExportFailed = Callable[[BaseException | None], None]
"""Called with each failed metric export: the exception, or None for a FAILURE answer."""


class _OnceFilter(logging.Filter):
    """Let each distinct message template of a noisy logger through once."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[object] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def quiet_loggers(*logger_names: str) -> None:
    """Keep repeated failure messages of these loggers to one line per message template.

    Name the exact loggers that log: a filter on a parent logger does not see records
    propagated up from its children."""
    for name in logger_names:
        target = logging.getLogger(name)
        if not any(isinstance(f, _OnceFilter) for f in target.filters):
            target.addFilter(_OnceFilter())


def span_exporters_from_env() -> list[SpanExporter]:
    """Exporters named by ``OTEL_TRACES_EXPORTER`` (default ``otlp``; ``none`` for none),
    OTLP over ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` (``http/protobuf`` default, ``grpc``).
    The OTLP exporters read their endpoint, headers and timeout from the env themselves."""
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[SpanExporter] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(otlp_exporter("traces"))
        else:
            raise ConfigurationError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r}")
    return exporters


@overload
def otlp_exporter(signal: Literal["traces"]) -> SpanExporter: ...
@overload
def otlp_exporter(signal: Literal["metrics"]) -> MetricExporter: ...
def otlp_exporter(signal: Literal["traces", "metrics"]) -> SpanExporter | MetricExporter:
    """The OTLP exporter of ``signal`` for ``OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL``
    (``http/protobuf`` by default, ``grpc`` with the grpc extra). Each exporter reads its
    endpoint, headers, timeout (and, for metrics, temporality) from the env itself; their
    repeated failure messages are let through once per message template.

    Raises ConfigurationError for an unsupported protocol and DependencyMissingError for
    ``grpc`` without the grpc extra."""
    variable = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    protocol = os.environ.get(variable, os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", ""))
    protocol = protocol.strip() or "http/protobuf"
    span_exporter: type[SpanExporter]
    metric_exporter: type[MetricExporter]
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as metric_exporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as span_exporter,
            )
        except ImportError as exc:
            raise DependencyMissingError(
                "OTLP/gRPC needs the grpc extra: pip install 'stagelens[grpc]'"
            ) from exc
        client_logger = "opentelemetry.exporter.otlp.proto.grpc.exporter"
    elif protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as metric_exporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as span_exporter,
        )

        # The shared HTTP client logs through the exporter's logger when given one (the
        # exporters give theirs), else through its own.
        client_logger = "opentelemetry.exporter.otlp.common.http"
    else:
        raise ConfigurationError(
            f"{variable} or OTEL_EXPORTER_OTLP_PROTOCOL: unsupported {protocol!r}"
        )
    exporter = span_exporter if signal == "traces" else metric_exporter
    quiet_loggers(exporter.__module__, client_logger)
    return exporter()


def _service_name_from_env() -> bool:
    """True when ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names the service."""
    if os.environ.get("OTEL_SERVICE_NAME"):
        return True
    pairs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)


def resource_from_env(service_name: str | None = None, **defaults: str) -> Resource:
    """The SDK's Resource from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` and the
    SDK's detectors, over defaults: ``service_name`` (instead of the SDK's
    ``unknown_service`` placeholder) and the ``defaults`` attributes. The env always wins."""
    from_env = Resource.create({})
    placeholder = bool(service_name) and not _service_name_from_env()
    if placeholder:
        defaults["service.name"] = str(service_name)
    if not defaults:
        return from_env
    kept = {
        k: v for k, v in from_env.attributes.items() if not (placeholder and k == "service.name")
    }
    # Resource.create merges explicit attributes *over* the environment's, so the defaults
    # are merged under what OTEL_* said rather than passed in.
    return Resource(defaults).merge(Resource(kept, from_env.schema_url))


def build_tracer_provider(
    exporters: Sequence[SpanExporter],
    count_dropped: DropCounter,
    max_queue_size: int = 2048,
    service_name: str | None = None,
    sampler: Sampler | None = None,
) -> DeferredTracerProvider:
    """A deferred tracer provider with the env's Resource and sampler, exporting to
    ``exporters`` through one bounded queue. ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES`` win over ``service_name``; ``OTEL_TRACES_SAMPLER[_ARG]`` is
    read as the SDK reads it (``stagelens_tail`` too: ``stagelens.tail_sampling``) unless
    ``sampler`` is given, and so are the batch processor's ``OTEL_BSP_SCHEDULE_DELAY``
    (ms, default 1000) and ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (default 512)."""
    return DeferredTracerProvider(
        exporters,
        count_dropped,
        resource=resource_from_env(service_name),
        sampler=sampler,
        max_queue_size=max_queue_size,
        max_export_batch_size=_env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        schedule_delay_seconds=_env_int("OTEL_BSP_SCHEDULE_DELAY", 1000) / 1000,
    )


def _env_int(name: str, default: int) -> int:
    """A positive integer from the environment; ConfigurationError names a bad one."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}: expected a positive integer, got {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"{name}: expected a positive integer, got {raw!r}")
    return value


class _CountingMetricExporter(MetricExporter):
    """Wraps the OTLP exporter so that a failed export is reported, never raised.

    The SDK reader would log every failed export (one line per interval for as long as the
    collector is down) and the HTTP exporter one line per retry; with an ``on_failure`` that
    counts and logs once, a dead collector is one warning and a rising counter."""

    def __init__(self, wrapped: MetricExporter, on_failure: ExportFailed) -> None:
        temporality, aggregation = metric_exporter_preferences(wrapped)
        super().__init__(preferred_temporality=temporality, preferred_aggregation=aggregation)
        self._wrapped = wrapped
        self._on_failure = on_failure

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self._wrapped.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as exc:
            self._on_failure(exc)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._on_failure(None)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._wrapped.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._wrapped.shutdown(timeout_millis=timeout_millis)


class OtlpMetricsPipeline:
    """SDK MeterProvider + PeriodicExportingMetricReader + the OTLP metric exporter, whose
    failures go to ``on_failure``.

    The reader exports from its own thread every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (SDK
    default 60000), so recording only updates in-memory aggregations. The provider is never
    made global: the host process (vLLM) or the user may have their own. Whoever records
    through a queue of its own appends its drain to ``before_flush``, so that a flush, and
    the final export at exit, send everything recorded so far."""

    def __init__(
        self,
        on_failure: ExportFailed,
        *,
        service_name: str,
        exporter: MetricExporter | None = None,
        views: Sequence[View] = (),
    ) -> None:
        """Raises ConfigurationError / DependencyMissingError for bad ``OTEL_*`` settings.

        ``views`` go to the MeterProvider (e.g. exponential aggregation for histograms)."""
        self.reader = PeriodicExportingMetricReader(
            _CountingMetricExporter(exporter or otlp_exporter("metrics"), on_failure)
        )
        quiet_loggers(PeriodicExportingMetricReader.__module__)
        # Each process exports its own cumulative series (several API servers of one vLLM
        # engine do), so each needs its own service.instance.id: recent SDKs set a random
        # one, host:pid is the fallback for older ones.
        resource = resource_from_env(
            service_name, **{"service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
        )
        # Exemplars off: a queue drained in a thread has no span context, so the trace-based
        # filter could never keep one and would only cost time.
        self.provider = SdkMeterProvider(
            resource=resource,
            metric_readers=[self.reader],
            views=list(views),
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,  # our atexit hook drains the queues first
        )
        self.before_flush: list[Callable[[], None]] = []
        self._closed = False
        atexit.register(self.shutdown)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Record what is queued, then export now (tests, shutdown)."""
        for drain in self.before_flush:
            drain()
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Record what is queued, final export, stop; at interpreter exit too. Bounded by the
        exporter's timeout (``OTEL_EXPORTER_OTLP[_METRICS]_TIMEOUT``, 10 s by default) when
        the collector is down."""
        if self._closed:
            return
        self._closed = True
        try:
            for drain in self.before_flush:
                drain()
            self.provider.shutdown()
        except Exception as exc:
            logger.debug("stagelens: OTLP metrics shutdown failed (%s)", type(exc).__name__)
