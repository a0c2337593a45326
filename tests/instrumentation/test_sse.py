"""The pure SSE/JSON parsing functions (``stagelens.instrumentation._sse``), property-tested:
each byte-level shortcut gives what parsing the JSON gives, for arbitrary event contents
(quotes, keys and brackets inside strings included), spacings and chunkings."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from stagelens.instrumentation import _sse

TEXT = st.lists(
    st.sampled_from(
        [
            *('"', "\\", "{", "}", "[", "]", ":", ",", " ", "\n", "a", "é", "☕"),
            *('"usage":{', '"choices":[]', '"finish_reason":"', "data: [DONE]"),
        ]
    ),
    max_size=6,
).map("".join)
"""String contents that look like the keys the byte checks search for."""

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def events(draw: Any) -> dict[str, Any]:
    """An OpenAI-style chunk: id, model, choices (finish reason null or a string), and
    maybe usage, with arbitrary strings everywhere."""
    event: dict[str, Any] = {"id": draw(TEXT), "model": draw(TEXT)}
    event["choices"] = [
        {
            "index": i,
            "delta": {"content": draw(TEXT)},
            "finish_reason": draw(st.none() | TEXT.filter(bool)),
        }
        for i in range(draw(st.integers(0, 2)))
    ]
    if draw(st.booleans()):
        event["usage"] = draw(
            st.none()
            | st.fixed_dictionaries(
                {"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)}
            )
        )
    return event


def _encode(event: Any, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(event, separators=separators, ensure_ascii=False).encode()


@settings(max_examples=300)
@given(events(), st.booleans())
def test_byte_checks_agree_with_the_parsed_event(event: dict[str, Any], spaced: bool) -> None:
    """has_usage, has_no_choices and is_final_choice answer what the parsed event says."""
    payload = _encode(event, spaced)
    assert _sse.has_usage(payload) is isinstance(event.get("usage"), dict)
    assert _sse.has_no_choices(payload) is (event["choices"] == [])
    finishes = any(c["finish_reason"] for c in event["choices"])
    assert _sse.is_final_choice(payload) is finishes


@settings(max_examples=300)
@given(JSON, st.booleans())
def test_loads_is_json_loads_for_any_value(value: Any, spaced: bool) -> None:
    """The one-call path parses any JSON value as json.loads does."""
    raw = _encode(value, spaced)
    assert repr(_sse.loads(raw)) == repr(json.loads(raw))


@given(st.binary(max_size=40))
def test_loads_fails_as_json_loads_does(raw: bytes) -> None:
    """Arbitrary bytes give json.loads' value, or the same kind of error."""
    outcomes = []
    for parse in (json.loads, _sse.loads):
        try:
            outcomes.append(repr(parse(raw)))
        except ValueError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]


@given(st.lists(events(), max_size=5), st.data())
def test_data_lines_are_the_same_however_the_body_is_chunked(
    stream: list[dict[str, Any]], data: Any
) -> None:
    """Splitting a body anywhere gives the same data payloads as reading it whole."""
    body = b"".join(b"data: " + _encode(e, False) + b"\n\n" for e in stream) + b"data: [DONE]\n\n"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    buffer, found = bytearray(), []
    for chunk in chunks:
        payloads, buffer = _sse.data_lines(buffer, chunk)
        found += payloads
    whole, rest = _sse.data_lines(bytearray(), body)
    assert found == whole
    assert not buffer
    assert not rest
    assert whole[-1] == _sse.DONE
    assert [json.loads(p) for p in whole[:-1]] == stream


@given(st.lists(events(), min_size=1, max_size=6), st.booleans())
def test_final_events_find_the_last_usage_of_a_stream(
    stream: list[dict[str, Any]], spaced: bool
) -> None:
    """Read back from the end, the tail gives the last usage object the stream carried,
    and says the stream ended when a finish reason or a usage-only event is in it."""
    body = bytearray(
        b"".join(b"data: " + _encode(e, spaced) + b"\n\n" for e in stream) + b"data: [DONE]\n\n"
    )
    ended, payloads = _sse.final_events(body, 0, recording=True)
    assert ended
    usages = [e["usage"] for e in stream if isinstance(e.get("usage"), dict)]
    found = [u for p in payloads if (u := _sse.usage_of(json.loads(p))) is not None]
    if usages:
        assert found[-1].input_tokens == usages[-1]["prompt_tokens"]
        assert found[-1].output_tokens == usages[-1]["completion_tokens"]
    else:
        assert not found
