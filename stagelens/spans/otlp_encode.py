"""OTLP/protobuf encoding of ``RecordedSpan`` batches, for the deferred tracer's worker.

Why hand-written wire encoding: the SDK's ``encode_spans`` takes ``ReadableSpan`` objects
and builds one protobuf object per span, attribute and value, which cost more than
everything the request path records (``benchmarks/overhead.py``). Here the protobuf wire
format is written straight from the recorded fields, a span's fields joined in one call.

The output decodes to the very ``ExportTraceServiceRequest`` that ``encode_spans`` builds
for the equivalent SDK spans (``tests/exporters/test_deferred.py`` compares them field for
field). Attribute values the SDK would refuse (None, nested or mixed sequences of other
types) are skipped, as the SDK skips them.

Wire format reminders: a field's tag is ``(number << 3) | wire_type`` (0 varint, 1 fixed64,
2 length-delimited, 5 fixed32); the field numbers below are those of
``opentelemetry/proto/trace/v1/trace.proto`` and ``common/v1/common.proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, StatusCode

from stagelens._plain import plain

if TYPE_CHECKING:
    from stagelens.spans.recorded import RecordedSpan

_fixed64: Final = struct.Struct("<Q").pack
_double: Final = struct.Struct("<d").pack
_fixed32: Final = struct.Struct("<I").pack

# SpanFlags: the parent's is_remote is known (0x100), and it is remote (0x200).
_FLAGS_LOCAL: Final = b"\x85\x01" + _fixed32(0x100)  # Span.flags = 16, fixed32
_FLAGS_REMOTE: Final = b"\x85\x01" + _fixed32(0x300)
_STATUS_UNSET: Final = b"\x7a\x00"  # Span.status = 15, an empty Status
_CACHE_LIMIT: Final = 4096
_CACHING: Final = not plain("otlp_caches")
_cached_pairs: dict[tuple[str, Any, type, bytes], bytes] = {}


def encode_request(batch: Sequence[RecordedSpan], resource: Resource) -> bytes:
    """One serialized ``ExportTraceServiceRequest`` for ``batch`` under ``resource``."""
    by_scope: dict[InstrumentationScope, list[bytes]] = {}
    last: InstrumentationScope | None = None
    spans: list[bytes] = []
    for span in batch:
        scope = span._scope
        if scope is not last:  # spans of one tracer share its scope: hash it on change only
            found = by_scope.get(scope)
            spans = by_scope[scope] = [] if found is None else found
            last = scope
        spans.append(_span(span))
    scope_spans = []
    for scope, encoded in by_scope.items():
        scope_msg = _ld(b"\x0a", scope.name.encode()) + _str(b"\x12", scope.version)
        scope_msg += _attributes(scope.attributes, b"\x1a")
        body = _ld(b"\x0a", scope_msg) + b"".join(encoded) + _str(b"\x1a", scope.schema_url)
        scope_spans.append(_ld(b"\x12", body))  # ResourceSpans.scope_spans = 2
    resource_msg = _attributes(resource.attributes, b"\x0a")  # Resource.attributes = 1
    resource_spans = (
        _ld(b"\x0a", resource_msg) + b"".join(scope_spans) + _str(b"\x1a", resource.schema_url)
    )
    return _ld(b"\x0a", resource_spans)  # ExportTraceServiceRequest.resource_spans = 1


_KIND: Final = {kind: b"\x30" + bytes((kind.value + 1,)) for kind in SpanKind}
"""Span.kind = 6, per kind (the proto enum starts at UNSPECIFIED)."""
_lengths: dict[int, bytes] = {}
"""Varint lengths of 128 bytes and more, encoded once per length (a trace's spans come in
a few recurring sizes)."""


def _length(n: int) -> bytes:
    """``_varint(n)`` from ``_lengths`` (a cache of the ``otlp_caches`` shortcut)."""
    return _lengths.get(n) or _remember(_lengths, n, _varint(n))


_names: dict[str, bytes] = {}
"""Span.name = 5 fields, encoded once per name (stage names repeat in every trace)."""


def _span(span: RecordedSpan) -> bytes:
    """``ScopeSpans.spans`` (field 2): one Span message.

    Reads the span's slots directly (this module is the span's exporter) and joins the
    fields in one call: a stage span is a handful of C calls, no Python call per field.
    """
    name = span._name
    name_field = _names.get(name) or _remember(_names, name, _ld(b"\x2a", name.encode()))
    parent = span._parent_id
    state = span._trace_state
    attributes = span._attributes
    status = span._status
    code = status.status_code
    if code is StatusCode.UNSET:
        status_field = _STATUS_UNSET
    elif code is StatusCode.ERROR and status.description:
        message = _ld(b"\x12", status.description.encode())  # Status.message = 2
        status_field = _ld(b"\x7a", message + b"\x18\x02")  # Status.code = 3
    else:
        status_field = b"\x7a\x02\x18" + bytes((code.value,))
    body = b"".join(
        (
            b"\x0a\x10",  # trace_id = 1, 16 bytes
            span._trace_id.to_bytes(16, "big"),
            b"\x12\x08",  # span_id = 2, 8 bytes
            span._span_id.to_bytes(8, "big"),
            _ld(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()) if state else b"",
            b"\x22\x08" + parent.to_bytes(8, "big") if parent is not None else b"",  # = 4
            name_field,
            _KIND[span._kind],
            b"\x39",  # start_time_unix_nano = 7
            _fixed64(span._start),
            b"\x41",  # end_time_unix_nano = 8
            _fixed64(span._end if span._end is not None else span._start),
            _attributes(attributes, b"\x4a") if attributes else b"",  # attributes = 9
            _events(span._events) if span._events else b"",  # events = 11
            b"".join(_ld(b"\x6a", _link(link)) for link in span._links)  # links = 13
            if span._links
            else b"",
            status_field,  # status = 15
            _FLAGS_REMOTE if span._parent_remote else _FLAGS_LOCAL,
        )
    )
    n = len(body)
    return b"\x12" + (bytes((n,)) if n < 0x80 else _length(n)) + body


def _events(events: Sequence[tuple[str, Mapping[str, Any], int]]) -> bytes:
    out = []
    for name, attributes, timestamp in events:
        event = b"\x09" + _fixed64(timestamp) + _ld(b"\x12", name.encode())
        out.append(_ld(b"\x5a", event + _attributes(attributes, b"\x1a")))
    return b"".join(out)


def _link(link: Link) -> bytes:
    ctx = link.context
    body = b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08"
    body += ctx.span_id.to_bytes(8, "big")
    body += _attributes(link.attributes, b"\x22")  # Link.attributes = 4
    return body + b"\x35" + _fixed32(0x300 if ctx.is_remote else 0x100)  # Link.flags = 6


_keys: dict[str, bytes] = {}
"""KeyValue.key = 1 fields, encoded once per attribute name."""


def _attributes(attributes: Mapping[str, Any] | None, tag: bytes) -> bytes:
    """Repeated ``KeyValue`` under ``tag``. A string, integer or boolean pair comes from a
    bounded cache (the same few recur in every trace: stage names, the method, the port, a
    status code, the stream flag); a float, nearly always new, is written inline; anything
    else goes through ``_value``."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool:
            cache_key = (key, value, kind, tag)  # the kind: True == 1 as a dict key
            encoded = _cached_pairs.get(cache_key)
            if encoded is None:
                body = _value(value) or b""  # never None for these kinds
                encoded = _remember(_cached_pairs, cache_key, _pair(key, body, tag))
            out.append(encoded)
        elif kind is float:  # AnyValue.double_value = 4: 9 bytes, KeyValue.value = 2
            key_field = _keys.get(key) or _remember(_keys, key, _ld(b"\x0a", key.encode()))
            out.append(_ld(tag, key_field + b"\x12\x09\x21" + _double(value)))
        else:
            other = _value(value)
            if other is not None:
                out.append(_pair(key, other, tag))
    return b"".join(out)


def attributes_plain(attributes: Mapping[str, Any] | None, tag: bytes) -> bytes:
    """``_attributes`` without its caches: each pair encoded as it comes, a value the SDK
    would refuse skipped. The plain twin the cached encoding is property-tested against
    (tests/exporters/test_deferred.py)."""
    out = []
    for key, value in (attributes or {}).items():
        body = _value(value)
        if body is not None:
            out.append(_pair(key, body, tag))
    return b"".join(out)


def _pair(key: str, value: bytes, tag: bytes) -> bytes:
    """One ``KeyValue`` field under ``tag``: the key and the ``AnyValue`` body ``value``."""
    return _ld(tag, _ld(b"\x0a", key.encode()) + _ld(b"\x12", value))


def _remember(cache: dict[Any, bytes], key: Any, encoded: bytes) -> bytes:
    """Store ``encoded`` under ``key`` in a bounded cache (cleared when full); return it."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    if _CACHING:
        cache[key] = encoded
    return encoded


def _value(value: Any) -> bytes | None:
    """An ``AnyValue`` message body, or None for a value the SDK would refuse."""
    # Order matters: bool is an int subclass.
    if isinstance(value, str):
        return _ld(b"\x0a", value.encode())  # string_value = 1
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"  # bool_value = 2
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int_value = 3 (two's complement)
    if isinstance(value, float):
        return b"\x21" + _double(value)  # double_value = 4
    if isinstance(value, bytes):
        return _ld(b"\x3a", value)  # bytes_value = 7
    if isinstance(value, list | tuple):
        items = []
        for item in value:
            if isinstance(item, list | tuple):
                return None  # the SDK accepts flat sequences only
            encoded = _value(item) if item is not None else b""
            if encoded is None:
                return None
            items.append(_ld(b"\x0a", encoded))  # ArrayValue.values = 1
        return _ld(b"\x2a", b"".join(items))  # array_value = 5
    return None


def _str(tag: bytes, text: str | None) -> bytes:
    """An optional string field: absent when empty, as proto3 writes it."""
    return _ld(tag, text.encode()) if text else b""


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _length(n)) + payload


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
