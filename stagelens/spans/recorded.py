"""``RecordedSpan``: a span as data, what the API calls set, kept until the export
worker encodes it.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes, AttributeValue

from stagelens.spans.pending import PendingTrace, new_id

if TYPE_CHECKING:
    from stagelens.spans.provider import DeferredTracerProvider

MAX_ATTRIBUTES: Final = 128
"""Per span, as the SDK's default ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``."""

_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED: Final = TraceFlags(TraceFlags.DEFAULT)
_UNSET: Final = Status(StatusCode.UNSET)


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


def pending_of(span: trace.Span) -> PendingTrace | None:
    """The keep decision ``span``'s trace waits for under the tail sampler; None for a span
    of a trace under any other sampler, or one the deferred tracer did not make."""
    return span._pending if isinstance(span, RecordedSpan) else None
