"""SSE framing (``stagelens.instrumentation._sse``), property-tested: events are found the
same way however the bytes are chunked and whatever line ends they use, exactly as a
plain reading of the SSE specification finds them; the byte check for a content event is
sound against the parsed event, for arbitrary event contents."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from stagelens.instrumentation import _openai, _sse

TEXT = st.lists(
    st.sampled_from(
        [
            *('"', "\\", "{", "}", "[", "]", ":", ",", " ", "\n", "a", "é", "☕", ""),
            *('"content":"', '"content": "', '"text":"', '"usage":{', '"choices":[]'),
            *("data: [DONE]", "\r\n", "\\u0022", '\\"content\\":\\"', "content", "text"),
        ]
    ),
    max_size=6,
).map("".join)
"""String contents that look like the keys and framing the byte checks search for."""

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)

KEYS = st.sampled_from(
    ["content", "text", "reasoning", "tool_calls", "role", "index", '"content', 'a\\"text']
)
"""Keys that matter, and keys that end like them after an escaped quote."""


@st.composite
def events(draw: Any) -> Any:
    """OpenAI-style chunks with arbitrary values under the keys that matter, and any JSON."""
    if draw(st.integers(0, 4)) == 0:
        return draw(JSON)
    delta = draw(st.dictionaries(KEYS, JSON | TEXT, max_size=3))
    choice = {"index": draw(st.integers(0, 2)), "delta": delta, "finish_reason": draw(JSON)}
    event: dict[str, Any] = {"id": draw(TEXT), "choices": [choice] * draw(st.integers(0, 2))}
    event.update(draw(st.dictionaries(KEYS, JSON, max_size=2)))
    return event


def _encode(value: Any, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps(value, separators=separators, ensure_ascii=False).encode()


@settings(max_examples=400, deadline=None)
@given(
    events(), st.booleans(), st.sampled_from([*_sse.content_keys(True), *_sse.content_keys(False)])
)
def test_the_content_byte_check_is_sound(event: Any, spaced: bool, key: bytes) -> None:
    """Whenever the byte check says an event carries output, parsing it says so too."""
    payload = _encode(event, spaced)
    if _sse.output_fast(payload, key):
        assert _openai.has_output(json.loads(payload))


@settings(deadline=None)
@given(st.text(alphabet=st.sampled_from("ab ☕"), min_size=1, max_size=4), st.booleans())
def test_the_content_byte_check_finds_plain_content(text: str, spaced: bool) -> None:
    """A plain content or text event, as vLLM or ``json.dumps`` writes it, is found."""
    form = 1 if spaced else 0
    for chat, body in (
        (True, {"choices": [{"index": 0, "delta": {"content": text}}]}),
        (False, {"choices": [{"index": 0, "text": text}]}),
    ):
        assert _sse.output_fast(_encode(body, spaced), _sse.content_keys(chat)[form])
    empty = _encode({"delta": {"content": ""}}, spaced)
    assert not _sse.output_fast(empty, _sse.content_keys(True)[form])


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _value(line: bytes) -> bytes:
    """A data line's value: after ``data:``, one leading space removed."""
    value = line[5:]
    return value[1:] if value[:1] == b" " else value


def _reference(stream: bytes) -> list[bytes | None]:
    """The events' data of a whole stream, read line by line as the SSE spec says (an
    unterminated last event is not dispatched)."""
    found: list[bytes | None] = []
    lines: list[bytes] = []
    parts = _LINE_END.split(stream)
    for line in parts[:-1]:  # the last part has no line end: incomplete
        if line:
            lines.append(line)
            continue
        if lines:
            values = [
                _value(line) for line in lines if line.startswith(b"data:") or line == b"data"
            ]
            found.append(b"\n".join(values) if values else None)
            lines = []
    return found


FRAMING = st.lists(
    st.sampled_from(
        [
            *(b"data: ", b"data:", b"data", b": ping", b"event: x", b"\n", b"\r\n", b"\r"),
            *(b'{"a":1}', b"[DONE]", b"x", b" ", b"\xff"),
        ]
    ),
    max_size=30,
).map(b"".join)


def _chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


@settings(max_examples=400, deadline=None)
@given(FRAMING, st.lists(st.integers(0, 200), max_size=8))
def test_events_are_found_as_the_spec_reads_them_however_chunked(
    stream: bytes, cuts: list[int]
) -> None:
    """Read chunk by chunk (the incomplete rest carried over), any line ends, the events
    and their data are those of the whole stream read line by line; their spans tile the
    bytes read, so nothing is lost or read twice."""
    found: list[bytes | None] = []
    rest = b""
    for chunk in _chunked(stream, cuts):
        data = rest + chunk
        events, end = _sse.split_events(data)
        at = 0
        for start, stop, payload in events:
            assert start >= at
            assert not data[at:start].strip(b"\r\n")  # only blank lines between events
            found.append(payload)
            at = stop
        assert at <= end
        rest = data[end:]
    # A final CR waits for a possible LF (a CRLF split across chunks).
    expected = _reference(stream[:-1] if stream.endswith(b"\r") else stream)
    assert [p for p in found if p is not None] == [p for p in expected if p is not None]


def test_is_done_accepts_only_the_terminator() -> None:
    """``[DONE]`` with spaces around ends the stream; anything else does not."""
    assert _sse.is_done(b"[DONE]")
    assert _sse.is_done(b" [DONE] ")
    assert not _sse.is_done(b"[DONE]x")
    assert not _sse.is_done(b'{"note": "[DONE]"}')


EVENT_BYTES = st.lists(
    st.sampled_from(
        [b"event:", b"event: ", b"event", b"data: ", b"x", b"\n", b"\r", b"\r\n", b"id: 1", b" "]
    )
    | st.binary(max_size=4),
    max_size=10,
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(EVENT_BYTES)
def test_the_fast_event_name_is_the_plain_one(event: bytes) -> None:
    """``name_fast`` (the first line's name) answers what ``name_of`` (every line read)
    answers, for any bytes."""
    assert _sse.name_fast(event) == _sse.name_of(event)
