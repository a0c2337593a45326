"""Finished spans as plain data, in and out of OTLP/JSON, and read from a trace source.

Why plain data and OTLP/JSON: the waterfall (``stagelens.views.waterfall``), ``stagelens trace``
and ``stagelens report --html`` read spans that some other process received (the demo's
OTLP receiver, a file), so they need a form that crosses a process boundary without the
SDK's span classes. OTLP/JSON is the standard one: the receiver answers in it and
``--trace-file`` reads it, with no protobuf needed on this side.

The JSON is untrusted input (a URL, a file): anything malformed raises
``TraceSourceError`` and nothing else.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeAlias

from stagelens.errors import TraceSourceError

AttributeValue: TypeAlias = str | bool | int | float | tuple[str | bool | int | float, ...]
"""A span attribute value as OTLP carries it (nested maps are kept as their JSON text)."""

DEFAULT_TRACE_SOURCE: Final = "http://127.0.0.1:4318"
"""Where ``stagelens demo`` receives its spans when no OTLP endpoint is configured; the
default source of ``stagelens trace`` and ``stagelens report --html``."""

TRACE_API_PATH: Final = "/api/traces"
"""The receiver's query path: ``/api/traces/<trace id>`` answers one trace in OTLP/JSON,
``/api/traces?order=slowest&limit=N`` lists trace summaries."""

SERVICE_NAME: Final = "service.name"
"""The resource attribute that names the service that sent a span."""

STATUS_ERROR: Final = 2
"""OTLP ``Status.code`` of a span that failed (0 unset, 1 ok)."""

_HEX_ID = re.compile(r"[0-9a-f]+")


@dataclass(frozen=True)
class SpanRecord:
    """One finished span: ids in lowercase hex (``parent_span_id`` empty for a root), times
    in Unix nanoseconds as the exporter sent them."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_ns: int
    end_ns: int
    kind: int = 0
    status_code: int = 0
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    service: str = ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class TraceSummary:
    """One trace in a listing: its root's name and the time from its first span's start to
    its last span's end."""

    trace_id: str
    name: str
    start_ns: int
    duration_ns: int
    span_count: int


def group_by_trace(spans: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Spans by trace id, in the order given."""
    traces: dict[str, list[SpanRecord]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    return traces


def local_roots(spans: Sequence[SpanRecord]) -> list[SpanRecord]:
    """The spans of one trace whose parent is not in it: the root this service started,
    whether it had no parent or continued a caller's ``traceparent`` (whose span lives in
    the caller's process, never here)."""
    ids = {s.span_id for s in spans}
    return [s for s in spans if s.parent_span_id not in ids]


def summarize(spans: Sequence[SpanRecord]) -> TraceSummary:
    """The summary of one non-empty trace. Its name is the root's (``local_roots``; the
    earliest, when several), else the earliest span's."""
    first = min(local_roots(spans) or spans, key=lambda s: (s.start_ns, s.name))
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    return TraceSummary(first.trace_id, first.name, start, end - start, len(spans))


def slowest(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """The spans of the longest trace among ``spans`` (empty when there are none)."""
    traces = group_by_trace(spans)
    if not traces:
        return []
    return max(traces.values(), key=lambda t: (summarize(t).duration_ns, t[0].trace_id))


# -- OTLP/JSON out ------------------------------------------------------------------------
def _any_value(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, tuple):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": value}


def to_otlp_json(spans: Iterable[SpanRecord]) -> dict[str, Any]:
    """An OTLP/JSON ``ExportTraceServiceRequest``: hex ids, 64-bit integers as decimal
    strings, one resource per service, as the OTLP specification's JSON encoding has it."""
    by_service: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        encoded = {
            "traceId": span.trace_id,
            "spanId": span.span_id,
            "parentSpanId": span.parent_span_id,
            "name": span.name,
            "kind": span.kind,
            "startTimeUnixNano": str(span.start_ns),
            "endTimeUnixNano": str(span.end_ns),
            "attributes": [{"key": k, "value": _any_value(v)} for k, v in span.attributes.items()],
            "status": {"code": span.status_code},
        }
        by_service.setdefault(span.service, []).append(encoded)
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": SERVICE_NAME, "value": {"stringValue": service}}]
                },
                "scopeSpans": [{"scope": {}, "spans": encoded_spans}],
            }
            for service, encoded_spans in by_service.items()
        ]
    }


# -- OTLP/JSON in -------------------------------------------------------------------------
def _fail(what: str) -> TraceSourceError:
    return TraceSourceError(f"not OTLP/JSON trace data: {what}")


def _list(node: Mapping[str, Any], key: str) -> list[Any]:
    value = node.get(key, [])
    if not isinstance(value, list):
        raise _fail(f"{key} is not a list")
    return value


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{what} is not an object")
    return value


def _int(value: Any, what: str) -> int:
    """An OTLP/JSON 64-bit integer: a decimal string or a JSON number."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _fail(f"{what} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise _fail(f"{what} is not an integer") from None


def _hex_id(value: Any, length: int, what: str, *, optional: bool = False) -> str:
    if value in (None, "") and optional:
        return ""
    if not isinstance(value, str):
        raise _fail(f"{what} is not a hex string")
    text = value.lower()
    if len(text) != length or not _HEX_ID.fullmatch(text):
        raise _fail(f"{what} is not {length} hex digits")
    return text


def _value(node: Any) -> AttributeValue:
    node = _object(node, "an attribute value")
    if "stringValue" in node:
        return str(node["stringValue"])
    if "boolValue" in node:
        return bool(node["boolValue"])
    if "intValue" in node:
        return _int(node["intValue"], "intValue")
    if "doubleValue" in node:
        raw = node["doubleValue"]
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise _fail("doubleValue is not a number")
        try:
            return float(raw)
        except ValueError:
            raise _fail("doubleValue is not a number") from None
    if "arrayValue" in node:
        values = _list(_object(node["arrayValue"], "arrayValue"), "values")
        items = tuple(_value(v) for v in values)
        return tuple(i for i in items if not isinstance(i, tuple))
    return json.dumps(node, sort_keys=True)


def _attributes(node: Mapping[str, Any]) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {}
    for item in _list(node, "attributes"):
        item = _object(item, "an attribute")
        key = item.get("key")
        if not isinstance(key, str):
            raise _fail("an attribute key is not a string")
        attributes[key] = _value(item.get("value", {}))
    return attributes


def _span(node: Any, service: str) -> SpanRecord:
    node = _object(node, "a span")
    name = node.get("name", "")
    if not isinstance(name, str):
        raise _fail("a span name is not a string")
    status = _object(node.get("status", {}), "status")
    start = _int(node.get("startTimeUnixNano", 0), "startTimeUnixNano")
    end = _int(node.get("endTimeUnixNano", 0), "endTimeUnixNano")
    return SpanRecord(
        trace_id=_hex_id(node.get("traceId"), 32, "traceId"),
        span_id=_hex_id(node.get("spanId"), 16, "spanId"),
        parent_span_id=_hex_id(node.get("parentSpanId"), 16, "parentSpanId", optional=True),
        name=name,
        start_ns=start,
        end_ns=max(start, end),
        kind=_int(node.get("kind", 0), "kind"),
        status_code=_int(status.get("code", 0), "status code"),
        attributes=_attributes(node),
        service=service,
    )


def from_otlp_json(document: Any) -> list[SpanRecord]:
    """The spans of one OTLP/JSON ``ExportTraceServiceRequest`` (``{"resourceSpans": ...}``)."""
    document = _object(document, "the document")
    if "resourceSpans" not in document:
        raise _fail("no resourceSpans")
    spans: list[SpanRecord] = []
    for resource_spans in _list(document, "resourceSpans"):
        resource_spans = _object(resource_spans, "resourceSpans")
        resource = _attributes(_object(resource_spans.get("resource", {}), "resource"))
        service = str(resource.get(SERVICE_NAME, ""))
        for scope_spans in _list(resource_spans, "scopeSpans"):
            scope_spans = _object(scope_spans, "scopeSpans")
            spans.extend(_span(s, service) for s in _list(scope_spans, "spans"))
    return spans


def load_trace_file(path: Path) -> list[SpanRecord]:
    """Spans from a file of OTLP/JSON: one document, or one document per line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceSourceError(f"cannot read {path}: {exc}") from None
    try:
        return from_otlp_json(json.loads(text))
    except json.JSONDecodeError:
        pass
    spans: list[SpanRecord] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                spans.extend(from_otlp_json(json.loads(line)))
            except json.JSONDecodeError:
                raise TraceSourceError(f"{path}:{number}: not JSON") from None
    return spans


# -- a receiver's query API ---------------------------------------------------------------
def _get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise TraceSourceError(f"not found: {url}") from None
        raise TraceSourceError(f"{url} answered {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise TraceSourceError(f"cannot reach {url}: {exc}") from None
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise TraceSourceError(f"{url} did not answer JSON") from None


def normalize_trace_id(trace_id: str) -> str:
    """A trace id as 32 lowercase hex digits (a shorter one is left-padded, as W3C ids are)."""
    text = trace_id.strip().lower()
    if not text or len(text) > 32 or not _HEX_ID.fullmatch(text):
        raise TraceSourceError(f"not a trace id (up to 32 hex digits): {trace_id!r}")
    return text.rjust(32, "0")


def fetch_trace(source: str, trace_id: str, timeout: float = 10.0) -> list[SpanRecord]:
    """The spans of one trace from a receiver's query API (the demo's receiver)."""
    trace_id = normalize_trace_id(trace_id)
    url = f"{source.rstrip('/')}{TRACE_API_PATH}/{trace_id}"
    spans = [s for s in from_otlp_json(_get_json(url, timeout)) if s.trace_id == trace_id]
    if not spans:
        raise TraceSourceError(f"no spans of trace {trace_id} at {source}")
    return spans


def fetch_traces(source: str, limit: int, timeout: float = 10.0) -> list[SpanRecord]:
    """The spans of up to ``limit`` most recent traces at a receiver's query API: one
    listing, then one query per trace."""
    spans: list[SpanRecord] = []
    for summary in list_traces(source, order="recent", limit=limit, timeout=timeout):
        spans.extend(fetch_trace(source, summary.trace_id, timeout))
    return spans


def list_traces(
    source: str, *, order: str = "slowest", limit: int = 20, timeout: float = 10.0
) -> list[TraceSummary]:
    """Trace summaries from a receiver's query API, ``slowest`` or most ``recent`` first."""
    query = urllib.parse.urlencode({"order": order, "limit": limit})
    document = _object(
        _get_json(f"{source.rstrip('/')}{TRACE_API_PATH}?{query}", timeout), "the listing"
    )
    summaries: list[TraceSummary] = []
    for item in _list(document, "traces"):
        item = _object(item, "a trace summary")
        name = item.get("name", "")
        summaries.append(
            TraceSummary(
                trace_id=_hex_id(item.get("traceId"), 32, "traceId"),
                name=name if isinstance(name, str) else "",
                start_ns=_int(item.get("startTimeUnixNano", 0), "startTimeUnixNano"),
                duration_ns=_int(item.get("durationNano", 0), "durationNano"),
                span_count=_int(item.get("spanCount", 0), "spanCount"),
            )
        )
    return summaries


def summary_json(summary: TraceSummary) -> dict[str, Any]:
    """A summary as the receiver's listing carries it (read back by ``list_traces``)."""
    return {
        "traceId": summary.trace_id,
        "name": summary.name,
        "startTimeUnixNano": str(summary.start_ns),
        "durationNano": str(summary.duration_ns),
        "spanCount": summary.span_count,
    }
