"""Engine spans from inside vLLM: ``queue``/``prefill``/``decode`` of each finished request,
as children of the gateway's inference span (``STAGELENS_VLLM_TRACES=1``).

Why only a tracer provider and never ``configure()``: ``configure()`` wires a gateway
(its instruments, on the registry it is given or ``REGISTRY``). Inside vLLM that registry is
the one vLLM serves, where the plugin's ``EngineMetrics`` already own
``stagelens_engine_phase_duration_seconds``: ``configure()`` raised ``DuplicateTimeseries``
half-way and left the gateway's first families on vLLM's ``/metrics``, so engine tracing
never worked. Here the deferred tracer provider is built from ``OTEL_*`` by
``stagelens.exporters.otlp``, with ``service.name=vllm`` unless the environment names one.

``record()`` only appends the finished requests it has already read to a bounded deque; a
daemon thread builds the spans, and the provider's own worker exports them: never on
vLLM's event loop. Whatever is queued at interpreter exit is built and exported then.
"""

from __future__ import annotations

import atexit
import collections
import logging
import re
import threading
import weakref
from typing import Final

from opentelemetry import trace
from prometheus_client import CollectorRegistry
from stagelens.exporters.otlp import build_tracer_provider, span_exporters_from_env
from stagelens.exporters.vllm_metrics import SERVICE_NAME, optional_counter
from stagelens.exporters.vllm_stats import FinishedRequest

from stagelens import semconv as sc
from stagelens._failures import FailureReporter
from stagelens._version import __version__
from stagelens.spans.provider import DeferredTracerProvider

logger = logging.getLogger("stagelens.vllm")

ENV_TRACES: Final = "STAGELENS_VLLM_TRACES"
"""Set to ``1`` to emit engine ``queue``/``prefill``/``decode`` spans from the vLLM process."""

_TRACE_IN_ID: Final = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})")
"""Request ids minted by stagelens's upstream instrumentation carry ``<trace>-<span>``."""


def emit_engine_spans(
    tracer: trace.Tracer, model: str, ended: float, request: FinishedRequest
) -> int:
    """Emit ``queue``/``prefill``/``decode`` for one finished request; returns spans made.

    The parent is the gateway's inference span, recovered from a stagelens-minted request id
    (``<trace-id>-<span-id>``, found anywhere in vLLM's id, which adds its own prefix and
    suffix). Other ids get no spans: ``FinishedRequestStats`` carries no trace headers.
    Phases end where the next begins, the last one at the iteration that finished the request;
    the API server's ``frontend`` time is left as the gap before ``queue`` (most of it is
    prompt rendering and hand-over, before the engine core queues the request).
    """
    match = _TRACE_IN_ID.search(request.request_id or "")
    if match is None:
        return 0  # not a stagelens-minted id: nothing to join
    parent = trace.set_span_in_context(
        trace.NonRecordingSpan(
            trace.SpanContext(
                trace_id=int(match.group(1), 16),
                span_id=int(match.group(2), 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
            )
        )
    )
    end_ns = int(ended * 1e9)
    attributes = {
        sc.ATTR_STAGE: "inference",
        sc.ATTR_VLLM_REQUEST_ID: request.request_id or "",
        sc.GEN_AI_REQUEST_MODEL: model,
    }
    for name, seconds in (
        (sc.SPAN_ENGINE_DECODE, request.decode),
        (sc.SPAN_ENGINE_PREFILL, request.prefill),
        (sc.SPAN_ENGINE_QUEUE, request.queue),
    ):
        start_ns = end_ns - int(seconds * 1e9)
        span = tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)
        end_ns = start_ns
    return 3


class EngineSpans:
    """Builds engine spans in a daemon thread from finished requests queued by ``record()``.

    ``tracer_provider`` makes and exports the spans; ``errors`` counts a span that could
    not be built."""

    def __init__(
        self,
        tracer_provider: DeferredTracerProvider,
        errors: FailureReporter,
        max_pending: int = 10_000,
    ) -> None:
        self.tracer_provider = tracer_provider
        self._tracer = tracer_provider.get_tracer(sc.INSTRUMENTATION_NAME, __version__)
        self._errors = errors
        self._pending: collections.deque[tuple[str, float, list[FinishedRequest]]] = (
            collections.deque(maxlen=max_pending)
        )
        self._wake = threading.Event()
        self._drain_lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._run, name="stagelens-vllm-spans", daemon=True).start()
        atexit.register(self.shutdown)

    def submit(self, model: str, ended: float, finished: list[FinishedRequest]) -> None:
        """Queue one iteration's finished requests (O(1); vLLM's output loop)."""
        self._pending.append((model, ended, finished))
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            self._wake.clear()
            self.drain()

    def drain(self) -> None:
        """Build the spans of everything queued so far (the thread; also at shutdown)."""
        with self._drain_lock:
            pending, tracer = self._pending, self._tracer
            while pending:
                model, ended, finished = pending.popleft()
                for request in finished:
                    try:
                        emit_engine_spans(tracer, model, ended, request)
                    except Exception as exc:
                        self._errors.report(
                            sc.COMPONENT_VLLM_TRACES, exc, "vLLM plugin: an engine span failed"
                        )

    def shutdown(self) -> None:
        """Build what is queued, export it, stop; at interpreter exit too."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self.drain()
        self.tracer_provider.shutdown()


_SPANS: weakref.WeakKeyDictionary[CollectorRegistry, EngineSpans | None] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def engine_spans(registry: CollectorRegistry, errors: FailureReporter) -> EngineSpans | None:
    """The span builder of the engines recording on ``registry`` (one per process in vLLM),
    exporting where ``OTEL_TRACES_EXPORTER`` / ``OTEL_EXPORTER_OTLP_*`` say; None when they
    name no exporter. Dropped spans are counted in ``stagelens_spans_dropped_total{reason}``
    on ``registry``. Raises ConfigurationError / DependencyMissingError for bad settings."""
    with _LOCK:
        if registry in _SPANS:
            return _SPANS[registry]
        exporters = span_exporters_from_env()
        found: EngineSpans | None = None
        if exporters:
            dropped = optional_counter(
                registry, sc.SPANS_DROPPED, "Spans that could not be exported.", [sc.LABEL_REASON]
            )

            def count_dropped(reason: str, n: int) -> None:
                if dropped is not None:
                    dropped.labels(reason).inc(n)

            provider = build_tracer_provider(exporters, count_dropped, service_name=SERVICE_NAME)
            found = EngineSpans(provider, errors)
        else:
            logger.warning(
                "stagelens vLLM plugin: %s=1 but OTEL_TRACES_EXPORTER names no exporter: "
                "no engine spans",
                ENV_TRACES,
            )
        _SPANS[registry] = found
        return found
