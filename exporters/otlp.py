"""Build the SDK TracerProvider: Resource, sampler and span exporters from ``OTEL_*``.

Why a bounded, counting processor around the SDK's BatchSpanProcessor: with a dead
collector the SDK would log a warning for every dropped span (per request) and retry in
its worker thread. We cap the spans waiting for export (memory bounded), count every
dropped span in ``stagelens_spans_dropped_total{reason}``, and log the first failure once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Final

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from stagelens.errors import ConfigurationError, DependencyMissingError

logger = logging.getLogger("stagelens")

REASON_QUEUE_FULL: Final = "queue_full"
"""Dropped before export: more spans waiting than the queue bound."""
REASON_EXPORT_FAILED: Final = "export_failed"
"""Dropped by a failed export (collector down, refused, timed out)."""

DropCounter = Callable[[str, int], None]
"""``count(reason, n)``: called with every batch of dropped spans."""


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


class CountingSpanProcessor(SpanProcessor):
    """Bounded batch export that counts what it drops instead of logging per span."""

    def __init__(
        self,
        exporter: SpanExporter,
        count_dropped: DropCounter,
        max_queue_size: int = 2048,
        schedule_delay_millis: float = 1000,
        export_timeout_millis: float = 10000,
    ) -> None:
        self._count = count_dropped
        self._max = max_queue_size
        self._pending = 0
        self._lock = threading.Lock()
        self._failed_once = False
        self._batch = BatchSpanProcessor(
            _CountingExporter(exporter, self),
            max_queue_size=max_queue_size + 1,
            schedule_delay_millis=schedule_delay_millis,
            export_timeout_millis=export_timeout_millis,
            max_export_batch_size=min(512, max_queue_size),
        )

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at span start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span unless the bound is reached (then count it as dropped)."""
        if not span.context or not span.context.trace_flags.sampled:
            return
        with self._lock:
            if self._pending >= self._max:
                full = True
            else:
                self._pending += 1
                full = False
        if full:
            self._count(REASON_QUEUE_FULL, 1)
            return
        self._batch.on_end(span)

    def _exported(self, n: int, ok: bool, error: BaseException | None = None) -> None:
        with self._lock:
            self._pending = max(self._pending - n, 0)
        if not ok:
            self._count(REASON_EXPORT_FAILED, n)
            if not self._failed_once:
                self._failed_once = True
                logger.warning(
                    "stagelens: span export failed (%s); serving continues, dropped spans are "
                    "counted in stagelens_spans_dropped_total",
                    error or "exporter returned FAILURE",
                )

    def shutdown(self) -> None:
        """Flush and stop the worker."""
        shutdown: Callable[[], None] = self._batch.shutdown  # the SDK method is unannotated
        shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now."""
        return self._batch.force_flush(timeout_millis)


class _CountingExporter(SpanExporter):
    def __init__(self, wrapped: SpanExporter, owner: CountingSpanProcessor) -> None:
        self._wrapped = wrapped
        self._owner = owner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._wrapped.export(spans)
        except Exception as exc:
            self._owner._exported(len(spans), False, exc)
            return SpanExportResult.FAILURE
        self._owner._exported(len(spans), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        shutdown: Callable[[], None] = self._wrapped.shutdown
        shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._wrapped.force_flush(timeout_millis)


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
            exporters.append(_otlp_exporter())
        else:
            raise ConfigurationError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r}")
    return exporters


def _otlp_exporter() -> SpanExporter:
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    )
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise DependencyMissingError(
                "OTLP/gRPC needs the grpc extra: pip install 'stagelens[grpc]'"
            ) from exc
        _quiet("opentelemetry.exporter.otlp.proto.grpc.exporter")
        return GrpcExporter()
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        _quiet("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        return OTLPSpanExporter()
    raise ConfigurationError(f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported {protocol!r}")


def _quiet(logger_name: str) -> None:
    """Keep an exporter's repeated failure messages to one line each.

    ``logger_name`` must be the module logger that emits them: a logger's filters do not
    apply to records that propagate up from its children."""
    target = logging.getLogger(logger_name)
    if not any(isinstance(f, _OnceFilter) for f in target.filters):
        target.addFilter(_OnceFilter())


def _service_name_from_env() -> bool:
    """True when ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names the service."""
    if os.environ.get("OTEL_SERVICE_NAME"):
        return True
    pairs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    return any(pair.split("=", 1)[0].strip() == "service.name" for pair in pairs)


def build_tracer_provider(
    exporters: Sequence[SpanExporter],
    count_dropped: DropCounter,
    max_queue_size: int = 2048,
    service_name: str | None = None,
) -> TracerProvider:
    """A TracerProvider with the env's Resource and sampler and one bounded processor per
    exporter. ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` win over
    ``service_name``; ``OTEL_TRACES_SAMPLER[_ARG]`` is read by the SDK."""
    resource = Resource.create({})
    if service_name and not _service_name_from_env():
        # Resource.create merges explicit attributes over the environment's, so the
        # default name is merged *under* what OTEL_* said rather than passed in.
        resource = Resource({"service.name": service_name}).merge(
            Resource(
                {k: v for k, v in resource.attributes.items() if k != "service.name"},
                resource.schema_url,
            )
        )
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(
            CountingSpanProcessor(exporter, count_dropped, max_queue_size=max_queue_size)
        )
    return provider
