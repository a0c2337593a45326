"""``DeferredTracerProvider``: a tracer provider that only records on the request path;
spans are built and exported off it.

Why not the SDK's TracerProvider on the hot path: its span objects and its OTLP encoding
cost more than everything else stagelens does per request (``benchmarks/overhead.py`` runs
it as a peer). Here a span is a plain object (``RecordedSpan``); ending it appends it to a
bounded queue (one ``len`` and one ``deque.append``). A worker thread drains the queue in
batches and hands each batch to every exporter: the SDK's OTLP/HTTP exporter gets the batch
encoded straight to protobuf (``otlp_encode``) and sent through its own client, so
endpoint, headers, TLS, compression, timeout and retries still come from
``OTEL_EXPORTER_OTLP_*``; any other ``SpanExporter`` (console, gRPC, in-memory) gets SDK
``ReadableSpan`` objects, built in the worker.

Semantics follow the SDK where the instrumentation relies on them: W3C ids from
``random.getrandbits``, ``time.time_ns`` clocks, the SDK sampler chosen by
``OTEL_TRACES_SAMPLER`` for spans without a local parent (children of a local span follow
it, as with the default ``parentbased_always_on``), ``set_status`` keeping OK final,
``record_exception`` events with the SDK's attributes, at most 128 attributes per span.
Dropped spans are counted (``queue_full`` when the queue is at its bound, reported by the
worker at its next wake so that a dead collector does not slow the request path;
``export_failed`` per failed batch and exporter) and the first failure is logged once.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

from stagelens import _compat, semconv
from stagelens.spans.build import built, built_stage
from stagelens.spans.otlp_encode import encode_request
from stagelens.spans.pending import DeferredSpan, HeldSpan, StageRecord
from stagelens.spans.recorded import RecordedSpan
from stagelens.spans.tracer import DeferredTracer
from stagelens.tail_sampling import TailSampler, sampler_from_env

logger = logging.getLogger("stagelens")

REASON_QUEUE_FULL: Final = semconv.REASON_QUEUE_FULL
"""Dropped before export: more spans waiting than the queue bound."""
REASON_EXPORT_FAILED: Final = semconv.REASON_EXPORT_FAILED
"""Dropped by a failed export (collector down, refused, timed out)."""

DropCounter = Callable[[str, int], None]
"""``count(reason, n)``: called with every batch of dropped spans."""

Batch = Sequence["RecordedSpan"]
Sink = Callable[[Batch], bool]
"""Exports one batch; True when it was accepted."""


class DeferredTracerProvider(trace.TracerProvider):
    """Owns the span queue, the export worker and the exporters."""

    def __init__(
        self,
        exporters: Sequence[SpanExporter],
        count_dropped: DropCounter,
        *,
        resource: Resource | None = None,
        sampler: Sampler | None = None,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_seconds: float = 1.0,
    ) -> None:
        self.resource = resource if resource is not None else Resource.create({})
        self.sampler = sampler if sampler is not None else _sampler_from_env()
        self.tail = self.sampler if isinstance(self.sampler, TailSampler) else None
        """The tail sampler when it is the sampler: traces then wait for their end."""
        self._exporters = list(exporters)
        self._sinks = [_sink_for(e, self.resource) for e in self._exporters]
        self._count = count_dropped
        self._full_drops = 0
        """Spans refused by a full queue, not yet counted (see ``_report_full_drops``)."""
        self._drops_lock = threading.Lock()
        self._max = max_queue_size
        self._batch_size = max(1, min(max_export_batch_size, max_queue_size))
        self._delay = schedule_delay_seconds
        self._queue: deque[RecordedSpan] = deque()
        self._wake = threading.Event()
        self._flushes: list[threading.Event] = []
        self._flush_lock = threading.Lock()
        self._stopping = False
        self._failed_once = False
        self._tracers: dict[tuple[str, str | None, str | None], DeferredTracer] = {}
        self._worker = self._start_worker()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _restart(ref))

    # -- TracerProvider -----------------------------------------------------------------
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        tracer = self._tracers.get(key)
        if tracer is None:
            scope = InstrumentationScope(
                instrumenting_module_name, instrumenting_library_version, schema_url, attributes
            )
            tracer = self._tracers.setdefault(key, DeferredTracer(self, scope))
        return tracer

    # -- hot path -----------------------------------------------------------------------
    def _release(self, span: RecordedSpan | DeferredSpan | StageRecord | HeldSpan) -> None:
        """A span of a kept trace (tail sampler), to the queue: one recorded as data
        (a stage's tuple, a ``DeferredSpan``, a ``HeldSpan``) is built into a span first.
        Building runs where the trace is decided or the span ends (the middleware, a
        stage's exit): a failure there (its ``when_built`` functions included) drops that
        span only, counted as a failed export and logged once, and never reaches the
        request."""
        try:
            # A stage's record is told first: a failed isinstance against the Span ABC
            # (which a tuple fails) is a Python call; one of the exact type is not.
            if isinstance(span, tuple):
                recorded = built_stage(span)
            elif not isinstance(span, RecordedSpan):
                recorded = built(span.as_deferred())  # a DeferredSpan is its own
            else:
                recorded = span
        except Exception as exc:  # by type only: a message may quote content
            self._failed(1, RuntimeError(f"building a kept span: {type(exc).__qualname__}"))
            return
        self._enqueue(recorded)

    def _enqueue(self, span: RecordedSpan) -> None:
        queue = self._queue
        if self._stopping:
            return
        if len(queue) >= self._max:
            # A dead collector fills the queue and every later span lands here: keep it
            # as cheap as the append it replaces; the worker counts the drops in bulk.
            with self._drops_lock:
                self._full_drops += 1
            return
        queue.append(span)
        if len(queue) == self._batch_size:
            self._wake.set()

    # -- worker -------------------------------------------------------------------------
    def _start_worker(self) -> threading.Thread:
        worker = threading.Thread(target=self._run, name="stagelens-span-export", daemon=True)
        worker.start()
        return worker

    def _run(self) -> None:
        while True:
            by_size = self._wake.wait(self._delay)
            self._wake.clear()
            with self._flush_lock:
                flushes, self._flushes = self._flushes, []
            # Woken because a batch filled up: send full batches only, and leave the few
            # spans that arrived meanwhile for the next one. Draining them too would send
            # a handful of spans in many POSTs, and each POST has a fixed CPU cost in the
            # exporter's HTTP client whatever its size.
            self._drain(full_only=by_size and not flushes and not self._stopping)
            self._report_full_drops()
            for done in flushes:
                done.set()
            if self._stopping:
                return

    def _drain(self, *, full_only: bool = False) -> None:
        queue, size = self._queue, self._batch_size
        while queue and (len(queue) >= size or not full_only):
            batch: list[RecordedSpan] = []
            while queue and len(batch) < size:
                batch.append(queue.popleft())
            for sink in self._sinks:
                try:
                    ok, error = sink(batch), None
                except Exception as exc:  # an exporter must never stop the worker
                    ok, error = False, exc
                if not ok:
                    self._failed(len(batch), error)

    def _report_full_drops(self) -> None:
        with self._drops_lock:
            n, self._full_drops = self._full_drops, 0
        if n:
            with suppress(Exception):
                self._count(REASON_QUEUE_FULL, n)

    def _failed(self, n: int, error: BaseException | None) -> None:
        with suppress(Exception):
            self._count(REASON_EXPORT_FAILED, n)
        if not self._failed_once:
            self._failed_once = True
            logger.warning(
                "stagelens: span export failed (%s); serving continues, dropped spans are "
                "counted in stagelens_spans_dropped_total",
                error or "exporter returned FAILURE",
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export everything queued now; True when done within the timeout."""
        if not self._worker.is_alive():
            return not self._queue
        done = threading.Event()
        with self._flush_lock:
            self._flushes.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000)

    def shutdown(self) -> None:
        """Export what is queued, stop the worker, shut the exporters down."""
        if self._stopping:
            return
        self.force_flush()
        self._stopping = True
        self._wake.set()
        self._worker.join(timeout=30)
        for exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception as exc:
                logger.warning("stagelens: span exporter shutdown failed: %r", exc)


def _sampler_from_env() -> Sampler:
    """The sampler ``OTEL_TRACES_SAMPLER[_ARG]`` names: ``stagelens_tail``, or one of the
    SDK's, as the SDK's provider picks it (read through a throwaway SDK provider: the SDK's
    own reader is private)."""
    tail = sampler_from_env()
    if tail is not None:
        return tail
    return SdkTracerProvider(shutdown_on_exit=False).sampler


def _restart(ref: weakref.ref[DeferredTracerProvider]) -> None:
    """In a forked child (a pre-fork server's worker): the parent's thread is gone."""
    provider = ref()
    if provider is not None and not provider._stopping:
        provider._queue.clear()
        provider._wake = threading.Event()
        provider._flushes = []
        provider._flush_lock = threading.Lock()
        provider._drops_lock = threading.Lock()  # might have been held at fork time
        provider._full_drops = 0
        provider._worker = provider._start_worker()


def _sink_for(exporter: SpanExporter, resource: Resource) -> Sink:
    """Encode straight to OTLP protobuf for the SDK's OTLP/HTTP exporter; SDK spans else."""
    client = _compat.otlp_http_span_client(exporter)
    if client is not None:

        def send(batch: Batch) -> bool:
            return bool(client.export(encode_request(batch, resource)).success)

        return send

    def export(batch: Batch) -> bool:
        spans = [span.readable(resource) for span in batch]
        return exporter.export(spans) is SpanExportResult.SUCCESS

    return export
