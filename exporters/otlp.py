"""Build the tracer provider configure() uses: Resource, sampler and span exporters from
``OTEL_*``.

Why not the SDK's TracerProvider: see ``exporters/deferred.py``. Spans are recorded on the
request path and built, encoded and exported by one worker thread through a bounded queue;
every dropped span is counted in ``stagelens_spans_dropped_total{reason}`` and each kind of
exporter failure is logged once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from stagelens.exporters.deferred import DeferredTracerProvider, DropCounter

from stagelens.errors import ConfigurationError, DependencyMissingError

logger = logging.getLogger("stagelens")


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
        quiet_loggers("opentelemetry.exporter.otlp.proto.grpc.exporter")
        return GrpcExporter()
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        quiet_loggers("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        return OTLPSpanExporter()
    raise ConfigurationError(f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported {protocol!r}")


def quiet_loggers(*logger_names: str) -> None:
    """Keep repeated failure messages of these loggers to one line per message template.

    Name the exact loggers that log: a filter on a parent logger does not see records
    propagated up from its children."""
    for name in logger_names:
        target = logging.getLogger(name)
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
) -> DeferredTracerProvider:
    """A deferred tracer provider with the env's Resource and sampler, exporting to
    ``exporters`` through one bounded queue. ``OTEL_SERVICE_NAME`` /
    ``OTEL_RESOURCE_ATTRIBUTES`` win over ``service_name``; ``OTEL_TRACES_SAMPLER[_ARG]`` is
    read as the SDK reads it, and so are the batch processor's ``OTEL_BSP_SCHEDULE_DELAY``
    (ms, default 1000) and ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (default 512)."""
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
    return DeferredTracerProvider(
        exporters,
        count_dropped,
        resource=resource,
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
