"""Never break the stream: whatever bytes the upstream sends, however they are chunked,
the app reads exactly the bytes it would read without stagelens, apart from the usage
event stagelens asked for (and the engine's comment it asked for with its request id:
tests/instrumentation/test_engine_seconds.py) (property-tested with arbitrary bytes, JSON shapes and
chunkings, at the call and through httpx's transports, sync and async). A reading that
fails is counted and logged once, by type, never with the event's text."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.instrumentation import _openai
from stagelens.instrumentation._upstream import _UpstreamCall

from stagelens import instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import capture_telemetry

if TYPE_CHECKING:
    from stagelens.request import RequestState
    from stagelens.telemetry import Telemetry

SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=4)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=2)
        | st.dictionaries(st.sampled_from(["choices", "usage", "delta", "content"]), inner)
    ),
    max_leaves=6,
)
USAGE = {"prompt_tokens": 3, "completion_tokens": 2}
EVENT_JSON = st.one_of(
    st.builds(lambda t: {"choices": [{"index": 0, "delta": {"content": t}}]}, st.text(max_size=3)),
    st.just({"choices": [], "usage": USAGE}),
    st.just({"usage": USAGE}),
    st.just({"error": {"message": "secret prompt text", "type": "X"}}),
    st.just({"choices": [None]}),
    JSON,
)
LINE_ENDS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def streams(draw: Any, raw: bool = True) -> bytes:
    """An SSE body: well-formed events of any JSON shape, [DONE], comments, not-JSON
    data, raw bytes, any line ends, maybe cut anywhere (not ``raw``: whole events only,
    each with JSON data or none)."""
    parts = []
    for _ in range(draw(st.integers(0, 8))):
        end = draw(LINE_ENDS)
        kind = draw(st.integers(0, 5 if raw else 3))
        if kind <= 2:
            value = json.dumps(
                draw(EVENT_JSON), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
            )
            parts.append(f"data: {value}{end}{end}".encode())
        elif kind == 3:
            parts.append(
                draw(st.sampled_from([b"data: [DONE]", b": ping", b"data: {not json"]))
                + (end * 2).encode()
            )
        elif kind == 4:
            parts.append(draw(st.binary(max_size=12)))
        else:
            parts.append(f"data: {json.dumps({'choices': [], 'usage': USAGE})}".encode())
    return b"".join(parts)


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _usage_events_removed(stream: bytes) -> bytes:
    """``stream`` without its complete usage-only events (a reference reading, line by
    line as the SSE spec says; the event that ends with the stream's final CR counts as
    incomplete, as a CRLF may still follow)."""
    spans: list[tuple[int, int]] = []
    start, lines = 0, []
    at = 0
    for end in _LINE_END.finditer(stream):
        line = stream[at : end.start()]
        at = end.end()
        if line:
            lines.append(line)
            continue
        final_cr = end.group() == b"\r" and end.end() == len(stream)
        if lines and not final_cr:
            data = [
                ln[5:][1:] if ln[5:6] == b" " else ln[5:] for ln in lines if ln.startswith(b"data:")
            ]
            if data and _is_usage_only(b"\n".join(data)):
                spans.append((start, at))
        lines = []
        start = at
    kept, position = [], 0
    for a, b in spans:
        kept.append(stream[position:a])
        position = b
    kept.append(stream[position:])
    return b"".join(kept)


def _is_usage_only(payload: bytes) -> bool:
    """The usage event: a JSON object with a usage object, no choice (``choices`` absent,
    empty or not a list), not an error, no output anywhere."""
    try:
        body = json.loads(payload)
    except ValueError:
        return False
    if not isinstance(body, dict) or not isinstance(body.get("usage"), dict):
        return False
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        return False
    if body.get("error") is not None or body.get("object") == "error":
        return False
    return not _openai.has_output(body)


def _chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


def _sse_call(
    telemetry: Telemetry, state: RequestState | None, payload: dict[str, Any]
) -> _UpstreamCall:
    """The upstream chat call of ``payload`` (in ``state``'s request, if any), answered 200
    with an event stream: what the app's chunks are read by."""
    request = httpx.Request("POST", "http://up/v1/chat/completions", json=payload)
    call = _UpstreamCall(telemetry, state, payload, "chat", request)
    call.on_response(httpx.Response(200, headers={"content-type": "text/event-stream"}))
    return call


def _relay(call: _UpstreamCall, state: RequestState, chunks: list[bytes]) -> None:
    """The app relays each chunk as it reads it: every one read unchanged, then sent."""
    for chunk in chunks:
        assert call.on_chunk(chunk) == chunk
        state.token_times.append(0.0)


def _read_through_a_call(chunks: list[bytes], *, asked: bool, n: int | None = None) -> bytes:
    with capture_telemetry() as cap:
        payload: dict[str, Any] = {"model": "tiny", "stream": True}
        if not asked:
            payload["stream_options"] = {"include_usage": True}  # the app asked itself
        if n is not None:
            payload["n"] = n
        call = _sse_call(cap.telemetry, None, payload)
        out = b"".join(call.on_chunk(chunk) for chunk in chunks) + call.flush()
        call.finish()
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    streams(), st.lists(st.integers(0, 300), max_size=10), st.booleans(), st.sampled_from([None, 2])
)
def test_the_app_reads_every_byte_but_the_usage_event_stagelens_asked_for(
    stream: bytes, cuts: list[int], asked: bool, n: int | None
) -> None:
    """Any bytes, any chunking: the app reads the stream byte for byte, less the usage
    events when (and only when) stagelens asked for them."""
    out = _read_through_a_call(_chunked(stream, cuts), asked=asked, n=n)
    assert out == (_usage_events_removed(stream) if asked else stream)


_CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":"0"}}]}'
_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}'


@pytest.mark.parametrize(
    "chunks",
    [
        # A chunk whose only LF is its last blank line, but a CR ended its first event:
        # two events, the second the usage event (once read as one content event).
        [_CONTENT + b"\r\r" + _USAGE + b"\n\n"],
        # The same after a first content event taught the chunk prefix.
        [_CONTENT + b"\n\n", _CONTENT + b"\r\r" + _USAGE + b"\n\n"],
    ],
    ids=["first-chunk", "after-the-prefix"],
)
def test_a_cr_ends_an_event_inside_a_chunk(chunks: list[bytes]) -> None:
    """SSE lines end at CR too: a chunk that ends with a blank line but holds a CR is not
    one event, and the usage event after the CR is removed like any other (found by the
    property test above; failed on the code before)."""
    stream = b"".join(chunks)
    out = _read_through_a_call(chunks, asked=True)
    assert out == _usage_events_removed(stream)
    assert _USAGE not in out


def _chunks_for(stream: bytes) -> list[bytes]:
    return _chunked(stream, list(range(7, len(stream), 11)))


class _Body(httpx.AsyncByteStream, httpx.SyncByteStream):
    """The upstream's body, chunk by chunk."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks


def _upstream(chunks: list[bytes]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Body(chunks))

    return httpx.MockTransport(answer)


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b": keep-alive\r\n\r\n"
    b"data: {broken\n\n"
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.anyio
class TestAsyncTransport:
    """Through an instrumented ``httpx.AsyncClient``."""

    @pytest.mark.parametrize("asked", [True, False], ids=["stagelens-asked", "app-asked"])
    async def test_the_app_reads_the_stream_through_the_client(self, asked: bool) -> None:
        """The bytes the app reads through the client are the stream's, less the usage
        event only when stagelens asked for it; the span still has the usage."""
        with capture_telemetry() as cap:
            client = httpx.AsyncClient(transport=_upstream(_chunks_for(STREAM)))
            instrument_httpx_client(client, telemetry=cap.telemetry)
            body: dict[str, Any] = {"model": "tiny", "stream": True}
            if not asked:
                body["stream_options"] = {"include_usage": True}
            async with (
                client,
                client.stream("POST", "http://up/v1/chat/completions", json=body) as r,
            ):
                seen = b"".join([chunk async for chunk in r.aiter_raw()])
            assert seen == (_usage_events_removed(STREAM) if asked else STREAM)
            assert cap.span("chat tiny").attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3


class TestSyncTransport:
    """Through an instrumented ``httpx.Client``."""

    @pytest.mark.parametrize("asked", [True, False], ids=["stagelens-asked", "app-asked"])
    def test_the_app_reads_the_stream_through_the_client(self, asked: bool) -> None:
        """The sync client reads the same bytes as the async one."""
        with capture_telemetry() as cap:
            client = httpx.Client(transport=_upstream(_chunks_for(STREAM)))
            instrument_httpx_client(client, telemetry=cap.telemetry)
            body: dict[str, Any] = {"model": "tiny", "stream": True}
            if not asked:
                body["stream_options"] = {"include_usage": True}
            with client, client.stream("POST", "http://up/v1/chat/completions", json=body) as r:
                seen = b"".join(r.iter_raw())
            assert seen == (_usage_events_removed(STREAM) if asked else STREAM)
            assert cap.span("chat tiny").attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 1


def test_unreadable_events_are_counted_and_logged_once_without_their_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Events that are not JSON pass unchanged, are counted each time and logged once,
    by the exception's type: never with the event's text."""
    secret = b"data: {secret prompt text\n\n"
    with capture_telemetry() as cap, caplog.at_level(logging.WARNING, "stagelens"):
        payload = {"model": "tiny", "stream": True}
        call = _sse_call(cap.telemetry, None, payload)
        for _ in range(3):
            assert call.on_chunk(secret) == secret
        call.finish()
        assert cap.value(sc.TELEMETRY_ERRORS, component=sc.COMPONENT_UPSTREAM_EVENT) == 3
    logged = [r.getMessage() for r in caplog.records if "upstream_event" in r.getMessage()]
    assert len(logged) == 1
    assert "secret" not in logged[0]
    assert "JSONDecodeError" in logged[0]


CONTENT = st.text(alphabet=st.sampled_from(["a", '"', "\\", "{", ":", " "]), max_size=3)
SINGLE_CHOICE_EVENT = st.one_of(
    st.builds(lambda t: {"choices": [{"index": 0, "delta": {"content": t}}]}, CONTENT),
    st.builds(
        lambda t: {"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": "stop"}]},
        CONTENT,
    ),
    st.just({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    st.builds(
        lambda k: {"choices": [{"index": 0, "delta": {"content": None, k: [{"index": 0}]}}]},
        st.sampled_from(["tool_calls", "x"]),
    ),
    st.builds(lambda t: {"choices": [{"index": 0, "delta": {"reasoning": t}}]}, CONTENT),
    st.builds(
        lambda k, t: {k: t, "choices": [{"index": 0, "delta": {}}]},
        st.sampled_from(['"content', "content", 'a"content']),
        CONTENT,
    ),
    st.just({"choices": [], "usage": USAGE}),
    EVENT_JSON,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(SINGLE_CHOICE_EVENT, max_size=8),
    st.sampled_from([(",", ":"), (", ", ": ")]),
    st.lists(st.integers(0, 400), max_size=6),
    st.booleans(),
    st.booleans(),
)
def test_output_events_are_counted_as_parsing_each_event_counts(
    stream: list[Any],
    separators: tuple[str, str],
    cuts: list[int],
    sampled: bool,
    in_request: bool,
) -> None:
    """However the events are written and chunked, traced or sampled out, in a request or
    not, the output events counted (most of them from their bytes alone) are those that
    parsing every event finds; in a request each is marked with the sends made before the
    chunk that completed it (the app relays every chunk)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    from prometheus_client import CollectorRegistry

    from stagelens.request import RequestState
    from stagelens.telemetry import Telemetry

    events = [f"data: {json.dumps(e, separators=separators)}\n\n".encode() for e in stream]
    body = b"".join(events)
    chunks = _chunked(body, cuts) if cuts else events
    ends, at = [], 0  # where each chunk ends in the body
    for chunk in chunks:
        at += len(chunk)
        ends.append(at)
    expected_marks, at = [], 0
    for event, raw in zip(stream, events, strict=True):
        at += len(raw)
        if _openai.EventFacts(event).outputs:
            expected_marks.append(next(i for i, end in enumerate(ends) if end >= at))
    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    telemetry = Telemetry(tracer_provider=provider, registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r")) if in_request else None
    payload = {"model": "tiny", "stream": True}
    call = _sse_call(telemetry, state, payload)
    for chunk in chunks:
        call.on_chunk(chunk)
        if state is not None:
            state.token_times.append(0.0)  # the app relayed the chunk
    assert call.outputs == len(expected_marks)
    if state is not None:
        assert state.inference is not None
        assert state.inference.choices == [expected_marks]
        first = state.inference.first_output
        assert first == (expected_marks[0] if expected_marks else None)
    call.finish()


@pytest.mark.parametrize("sampled", [False, True])
def test_a_chunk_that_starts_like_the_content_events_is_read_whole_when_its_event_goes_on(
    sampled: bool,
) -> None:
    """The chunks after the first content event are matched by its bytes up to the value;
    one whose event does not end with it (a second ``data:`` line follows, in the next
    chunk) is parsed as the stream's reader parses it: not JSON, so no output."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    from prometheus_client import CollectorRegistry

    from stagelens.request import RequestState
    from stagelens.telemetry import Telemetry

    def content(text: str) -> bytes:
        event = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}}]}
        return f"data: {json.dumps(event, separators=(',', ':'))}".encode()

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    telemetry = Telemetry(tracer_provider=provider, registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r"))
    payload = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}}
    call = _sse_call(telemetry, state, payload)
    chunks = [
        content("a") + b"\n\n",
        content("b") + b"\n\n",  # read from the prefix the first one taught
        content("c") + b"\nd",  # the event goes on: "data: x" is its second line
        b"ata: x\n\n",
        content("e") + b"\n\n",
    ]
    _relay(call, state, chunks)
    assert call.outputs == 3
    assert state.inference is not None
    assert state.inference.choices == [[0, 1, 4]]
    call.finish()


class _Chunk(bytes):
    """A chunk of a ``bytes`` subclass (no httpx transport yields one; a custom stream may)."""


@pytest.mark.parametrize("kind", [_Chunk, bytearray])
def test_a_chunk_of_another_type_than_bytes_is_read_by_parsing(kind: type) -> None:
    """After a content event taught the prefix, a chunk of another type is read as any
    other chunk: for such a type ``removeprefix`` answers a copy even without the prefix,
    which would make a usage event after a learned prefix an output."""
    from prometheus_client import CollectorRegistry

    from stagelens.request import RequestState
    from stagelens.telemetry import Telemetry

    telemetry = Telemetry(registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r"))
    payload = {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}}
    call = _sse_call(telemetry, state, payload)
    chunks = [
        _CONTENT + b"\n\n",
        kind(_CONTENT + b"\n\n"),
        kind(_USAGE + b"\n\n"),  # not an output, whatever its type
    ]
    _relay(call, state, chunks)
    assert call.outputs == 2
    assert state.inference is not None
    assert state.inference.choices == [[0, 1]]
    call.finish()


@st.composite
def one_choice_streams(draw: Any) -> bytes:
    """One choice's stream as OpenAI-compatible servers write it: content events of one
    id, the finish reason on the last only, the running usage on every one or none (vLLM's
    continuous usage stats), spaced or compact, between anything else ``streams`` draws
    but other content events (keep-alives, not-JSON, role and tool-call events, the usage
    event, [DONE], raw bytes)."""
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    running = draw(st.booleans())
    texts = draw(st.lists(CONTENT, max_size=8))
    finish = draw(st.sampled_from([None, "stop", "length"]))
    parts = []
    for i, text in enumerate(texts):
        if draw(st.booleans()):
            parts.append(
                draw(
                    st.sampled_from(
                        [
                            b": ping\n\n",
                            b"data: {not json\n\n",
                            b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n',
                            b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{}]}}]}\n\n',
                        ]
                    )
                )
            )
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
        choice["finish_reason"] = finish if i == len(texts) - 1 else None
        body: dict[str, Any] = {"id": "c1", "choices": [choice]}
        if running:
            body["usage"] = {"prompt_tokens": 3, "completion_tokens": i + 1}
        space = draw(st.sampled_from(["", " "]))
        parts.append(f"data:{space}{json.dumps(body, separators=separators)}\n\n".encode())
    if draw(st.booleans()):
        parts.append(f"data: {json.dumps({'choices': [], 'usage': USAGE})}\n\n".encode())
    if draw(st.booleans()):
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _read_all(
    chunks: list[bytes], *, plain: bool, asked: bool, sampled: bool, in_request: bool
) -> tuple[Any, ...]:
    """Everything the reader tells of ``chunks``, read by the fast reader or its plain
    twin (every event parsed): the bytes the app reads, the outputs, their marks and the
    first output; then what the stream's end tells (usage, finish reasons, end, failure,
    response id)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    from prometheus_client import CollectorRegistry

    from stagelens.request import RequestState
    from stagelens.telemetry import Telemetry

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    telemetry = Telemetry(tracer_provider=provider, registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r")) if in_request else None
    payload: dict[str, Any] = {"model": "tiny", "stream": True}
    if not asked:
        payload["stream_options"] = {"include_usage": True}
    call = _sse_call(telemetry, state, payload)
    if plain:
        call.read_plainly()
    out = []
    for chunk in chunks:
        out.append(call.on_chunk(chunk))
        if state is not None:
            state.token_times.append(0.0)  # the app relayed the chunk
    out.append(call.flush())
    call.finish()  # the stream ended: what only its end tells is read (``settle``)
    inference = state.inference if state is not None else None
    return (
        b"".join(out),
        call.outputs,
        inference.choices if inference is not None else None,
        inference.first_output if inference is not None else None,
        call._usage,
        call._finish_reasons,
        call._ended,
        call._failure,
        call._response_id,
    )


TWIN_OPTIONS = (st.booleans(), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.lists(st.integers(0, 400), max_size=8), *TWIN_OPTIONS)
def test_the_reader_and_its_plain_twin_pass_the_same_bytes(
    stream: bytes, cuts: list[int], asked: bool, sampled: bool, in_request: bool
) -> None:
    """Any bytes, any chunking, traced or not, in a request or not: the reader with its
    shortcuts hands the app the same bytes as its plain twin, which parses every event."""
    chunks = _chunked(stream, cuts)
    options = {"asked": asked, "sampled": sampled, "in_request": in_request}
    assert (
        _read_all(chunks, plain=False, **options)[0] == _read_all(chunks, plain=True, **options)[0]
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(raw=False), st.lists(st.integers(0, 400), max_size=8), *TWIN_OPTIONS)
def test_the_reader_and_its_plain_twin_count_the_same_outputs(
    stream: bytes, cuts: list[int], asked: bool, sampled: bool, in_request: bool
) -> None:
    """Events of any JSON shape (the data an encoder writes: the shortcuts find an output
    key from the bytes, which is sound for JSON only), any line ends, any chunking: the
    reader counts and marks the same outputs, and the same first output, as its plain
    twin."""
    chunks = _chunked(stream, cuts)
    options = {"asked": asked, "sampled": sampled, "in_request": in_request}
    fast = _read_all(chunks, plain=False, **options)
    assert fast[:4] == _read_all(chunks, plain=True, **options)[:4]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_choice_streams(), st.lists(st.integers(0, 400), max_size=8), *TWIN_OPTIONS)
def test_the_reader_and_its_plain_twin_read_the_same_from_one_choices_stream(
    stream: bytes, cuts: list[int], asked: bool, sampled: bool, in_request: bool
) -> None:
    """One choice's stream as servers write it (``one_choice_streams``), however chunked:
    the reader tells everything its plain twin tells, the facts a content event carries
    beyond its output included (usage, finish reason, response id: the shortcuts read
    them from the latest content event when the stream ends)."""
    chunks = _chunked(stream, cuts)
    options = {"asked": asked, "sampled": sampled, "in_request": in_request}
    assert _read_all(chunks, plain=False, **options) == _read_all(chunks, plain=True, **options)
