"""A tracer that only records on the request path; spans are built and exported off it.

Why not the SDK's TracerProvider on the hot path: measured on a 2-core machine, creating a
proxied request's 11 SDK spans costs ~790 us of CPU and the SDK's OTLP encoding of them
~620 us, against ~3.3 ms for the whole request (``benchmarks/overhead.py``): +60 %. Here a
span is a plain object holding its ids, name, clock readings and attribute dict; ending it
appends it to a bounded queue (one ``len`` and one ``deque.append``). A worker thread drains
the queue in batches and hands each batch to every exporter: the SDK's OTLP/HTTP exporter
gets the batch encoded straight to protobuf (``exporters/otlp_encode.py``) and sent through
its own client, so endpoint, headers, TLS, compression, timeout and retries still come from
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
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes, AttributeValue
from stagelens.exporters.otlp_encode import encode_request

from stagelens import _compat, semconv
from stagelens.tail_sampling import (
    COMPLETE,
    DeferredSpan,
    HeldSpan,
    PendingTrace,
    StageRecord,
    TailSampler,
    anchor_in,
    child_parent,
    new_id,
    open_stage,
    sampler_from_env,
)

logger = logging.getLogger("stagelens")

REASON_QUEUE_FULL: Final = semconv.REASON_QUEUE_FULL
"""Dropped before export: more spans waiting than the queue bound."""
REASON_EXPORT_FAILED: Final = semconv.REASON_EXPORT_FAILED
"""Dropped by a failed export (collector down, refused, timed out)."""

DropCounter = Callable[[str, int], None]
"""``count(reason, n)``: called with every batch of dropped spans."""

MAX_ATTRIBUTES: Final = 128
"""Per span, as the SDK's default ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``."""

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
_EMPTY_STATE: Final = TraceState()
_UNSET: Final = Status(StatusCode.UNSET)
_SPAN_KEY: Final = _compat.span_key()
_current_context: Final = _compat.current_context_getter()

Batch = Sequence["RecordedSpan"]
Sink = Callable[[Batch], bool]
"""Exports one batch; True when it was accepted."""


class RecordedSpan(trace.Span):
    """A span as data: what the API calls set, kept until the worker exports it."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end",
        "_events",
        "_kind",
        "_links",
        "_name",
        "_parent_id",
        "_parent_remote",
        "_pending",
        "_provider",
        "_scope",
        "_span_id",
        "_start",
        "_status",
        "_trace_id",
        "_trace_state",
    )

    def __init__(
        self,
        provider: DeferredTracerProvider,
        scope: InstrumentationScope,
        name: str,
        trace_id: int,
        parent_id: int | None,
        parent_remote: bool,
        trace_state: TraceState,
        kind: SpanKind,
        start: int,
        attributes: dict[str, Any],
        links: list[Link] | None,
        pending: PendingTrace | None = None,
    ) -> None:
        self._provider = provider
        self._scope = scope
        self._name = name
        self._trace_id = trace_id
        self._span_id = new_id(64)
        self._parent_id = parent_id
        self._parent_remote = parent_remote
        self._trace_state = trace_state
        self._kind = kind
        self._start = start
        self._end: int | None = None
        self._attributes = attributes
        self._events: list[tuple[str, dict[str, Any], int]] | None = None
        self._links = links
        self._status = _UNSET
        self._context: SpanContext | None = None
        self._pending = pending

    @property
    def pending_trace(self) -> PendingTrace | None:
        """The trace's keep decision under the tail sampler, None under any other."""
        return self._pending

    # -- the Span API --------------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        """Built on first use: stage spans never need one. Sampled unless the trace's
        keep decision is still pending (the tail sampler): then the ``traceparent`` sent
        upstream says what is decided so far, not sampled."""
        ctx = self._context
        if ctx is None:
            pending = self._pending
            flags = _SAMPLED if pending is None or pending.kept else _NOT_SAMPLED
            ctx = self._context = SpanContext(
                self._trace_id, self._span_id, False, flags, self._trace_state
            )
        return ctx

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        attributes = self._attributes
        if (
            self._end is None
            and value is not None
            and (len(attributes) < MAX_ATTRIBUTES or key in attributes)
        ):
            attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self._end is not None:
            return
        mine = self._attributes
        for key, value in attributes.items():  # set_attribute's checks, without a call each
            if value is not None and (len(mine) < MAX_ATTRIBUTES or key in mine):
                mine[key] = value

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self._end is not None:
            return
        if self._events is None:
            self._events = []
        event = (name, dict(attributes or {}), timestamp if timestamp else time.time_ns())
        self._events.append(event)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self._end is not None or not context.is_valid:
            return
        if self._links is None:
            self._links = []
        self._links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end is not None or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}"
            if module and module != "builtins"
            else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end is not None:
            return
        self._end = end_time if end_time is not None else time.time_ns()
        pending = self._pending
        if pending is None:
            self._provider._enqueue(self)
            return
        if pending.owner is self:
            pending.owner = None
            if pending.kept is None:
                # A local root nobody decided for (a trace begun outside the middleware):
                # an error keeps it, as the middleware's first rule would.
                pending.settle(self._status.status_code is StatusCode.ERROR)
        pending.add(self)

    # -- read by the exporters (worker thread, after end) ---------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> SpanKind:
        return self._kind

    @property
    def scope(self) -> InstrumentationScope:
        return self._scope

    @property
    def trace_id(self) -> int:
        return self._trace_id

    @property
    def span_id(self) -> int:
        return self._span_id

    @property
    def parent_id(self) -> int | None:
        return self._parent_id

    @property
    def parent_remote(self) -> bool:
        return self._parent_remote

    @property
    def trace_state(self) -> TraceState:
        return self._trace_state

    @property
    def start_time(self) -> int:
        return self._start

    @property
    def end_time(self) -> int:
        return self._end if self._end is not None else self._start

    @property
    def attributes(self) -> Mapping[str, Any]:
        return self._attributes

    @property
    def events(self) -> Sequence[tuple[str, Mapping[str, Any], int]]:
        return self._events or ()

    @property
    def links(self) -> Sequence[Link]:
        return self._links or ()

    @property
    def status(self) -> Status:
        return self._status

    def readable(self, resource: Resource) -> ReadableSpan:
        """The SDK's view of this span, for exporters that take ``ReadableSpan``.

        Attributes (the span's and its events') are cleaned as the SDK's span cleans them
        when they are set (``BoundedAttributes``: sequences become tuples, values of other
        types are dropped), here in the worker, so an exporter sees what the SDK gives it.
        """
        parent = (
            SpanContext(self._trace_id, self._parent_id, self._parent_remote, _SAMPLED)
            if self._parent_id is not None
            else None
        )
        return ReadableSpan(
            name=self._name,
            # Exported, so sampled (a tail-kept span's own context said pending).
            context=SpanContext(self._trace_id, self._span_id, False, _SAMPLED, self._trace_state),
            parent=parent,
            resource=resource,
            attributes=BoundedAttributes(MAX_ATTRIBUTES, self._attributes),
            events=[
                Event(name, BoundedAttributes(MAX_ATTRIBUTES, attrs), ts)
                for name, attrs, ts in self.events
            ],
            links=list(self.links),
            kind=self._kind,
            instrumentation_scope=self._scope,
            status=self._status,
            start_time=self._start,
            end_time=self.end_time,
        )


class DeferredTracer(trace.Tracer):
    """Starts ``RecordedSpan`` objects; sampling decided once per local root."""

    def __init__(self, provider: DeferredTracerProvider, scope: InstrumentationScope) -> None:
        self._provider = provider
        self._scope = scope

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        provider = self._provider
        ctx = context if context is not None else _current_context()
        found = ctx.get(_SPAN_KEY) if _SPAN_KEY is not None else None
        # A local parent is found with one lookup; anything else as the API finds it.
        parent = found if type(found) is RecordedSpan else trace.get_current_span(ctx)
        if open_stage() is not None:  # inside a stage of a pending trace, its child
            parent = child_parent(parent)
        extra: Attributes = None
        if isinstance(parent, RecordedSpan):
            # A local parent that was sampled: its children are, as with parent-based
            # sampling, and no sampler call is needed.
            trace_id = parent._trace_id
            parent_id: int | None = parent._span_id
            parent_remote = False
            trace_state = parent._trace_state
            pending = parent._pending
            local_root = False
        elif type(parent) is DeferredSpan:
            # A stage of a pending trace (tail sampler): the same, its id drawn now.
            parent_ctx = parent.get_span_context()
            trace_id, parent_id = parent_ctx.trace_id, parent_ctx.span_id
            parent_remote = False
            trace_state = parent_ctx.trace_state
            pending = parent.pending
            local_root = False
        else:
            local_root = True
            parent_ctx = parent.get_span_context()
            if parent_ctx.is_valid:
                trace_id, parent_id = parent_ctx.trace_id, parent_ctx.span_id
                parent_remote = parent_ctx.is_remote
            else:
                trace_id, parent_id, parent_remote = new_id(128), None, False
            decision = provider.sampler.should_sample(
                context, trace_id, name, kind, attributes, links
            )
            trace_state = decision.trace_state or _EMPTY_STATE
            tail = provider.tail
            if tail is not None:
                # Every trace is recorded; its spans wait for the request's end unless the
                # start already decided (RECORD_AND_SAMPLE: a sampled parent or the ratio).
                pending = PendingTrace(
                    provider._release,
                    trace_id,
                    trace_state,
                    tail.head_reason(parent_ctx.trace_flags.sampled)
                    if decision.decision is Decision.RECORD_AND_SAMPLE
                    else None,
                )
            elif decision.decision is not Decision.RECORD_AND_SAMPLE:
                # RECORD_ONLY is treated as DROP: a span that is never exported is not
                # worth recording here.
                return NonRecordingSpan(
                    SpanContext(trace_id, new_id(64), False, _NOT_SAMPLED, trace_state)
                )
            else:
                pending = None
            extra = decision.attributes
        attrs: dict[str, Any] = dict(attributes) if attributes else {}
        if extra:
            attrs.update(extra)
        span = RecordedSpan(
            provider,
            self._scope,
            name,
            trace_id,
            parent_id,
            parent_remote,
            trace_state,
            kind,
            start_time if start_time is not None else time.time_ns(),
            attrs,
            list(links) if links else None,
            pending,
        )
        if pending is not None and local_root:
            pending.owner = span
        return span

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


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
                built = _built_stage(span)
            elif not isinstance(span, RecordedSpan):
                built = _built(span.as_deferred())  # a DeferredSpan is its own
            else:
                built = span
        except Exception as exc:  # by type only: a message may quote content
            self._failed(1, RuntimeError(f"building a kept span: {type(exc).__qualname__}"))
            return
        self._enqueue(built)

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
            # spans that arrived meanwhile for the next one. Draining them too made every
            # other request a handful of spans (4 POSTs per full batch, measured), and each
            # POST costs ~0.65 ms of CPU in the exporter's HTTP client.
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


def _built(stage: DeferredSpan) -> RecordedSpan:
    """The span a ``DeferredSpan`` stands for, as ``start_span`` would have made it under
    its parent, with its ids, clock readings, attributes and calls replayed in order."""
    tracer = stage.tracer
    if not isinstance(tracer, DeferredTracer):
        raise TypeError(f"a DeferredSpan of {type(tracer).__name__}, not of a DeferredTracer")
    pending = stage.pending  # its trace, as its own context says (get_span_context)
    span = RecordedSpan(
        tracer._provider,
        tracer._scope,
        stage.name,
        pending.trace_id,
        stage.parent.get_span_context().span_id,
        False,
        pending.trace_state,
        stage.kind,
        stage.start_time,
        {},
        None,
    )
    if stage.span_id:  # drawn for a child or a context: the span keeps it
        span._span_id = stage.span_id
    span.set_attributes(stage.attributes)
    for method, args in stage.calls:
        if method == COMPLETE:
            args[0](span)
        else:
            getattr(span, method)(*args)
    span._end = stage.end_time if stage.end_time is not None else stage.start_time
    return span


def _built_stage(record: StageRecord) -> RecordedSpan:
    """The span of a stage held as a ``StageRecord``, as ``stage()`` makes it when the
    trace is sampled from its start: its name as ``stagelens.stage``, then the attributes
    given to ``stage()``."""
    tracer, name, given, parent, start, end = record
    if not isinstance(tracer, DeferredTracer):
        raise TypeError(f"a stage of {type(tracer).__name__}, not of a DeferredTracer")
    if isinstance(parent, otel_context.Context):
        parent = anchor_in(parent)
    parent_ctx = parent.get_span_context()
    span = RecordedSpan(
        tracer._provider,
        tracer._scope,
        name,
        parent_ctx.trace_id,
        parent_ctx.span_id,
        False,
        parent_ctx.trace_state,
        SpanKind.INTERNAL,
        start,
        {semconv.ATTR_STAGE: name},
        None,
    )
    if given:
        span.set_attributes(given)
    span._end = end
    return span


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
