"""The agent APIs' stream readers (the OpenAI Responses API, the Anthropic Messages API),
property-tested: whatever a stream holds and however it is chunked, the app reads every
byte unchanged; a stream as servers write it is read, chunk by chunk, as a parse of its
whole body reads it (the same outputs, each marked with the chunk that completed it, the
same first answer, usage, finish reasons, end and failure); and the reader's shortcuts
(``agent_prefix``, ``agent_names``) read what their plain twin reads, which parses every
event."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from prometheus_client import CollectorRegistry
from stagelens.instrumentation import _messages, _openai, _responses, _sse
from stagelens.instrumentation._api_call import ApiCall
from stagelens.instrumentation._api_facts import ApiReading

from stagelens.request import RequestState
from stagelens.telemetry import Telemetry

TEXT = st.text(
    alphabet=st.sampled_from(["a", '"', "\\", "{", "}", ":", " ", "é", "\n", "\r"]), max_size=4
) | st.sampled_from(['"delta":"', '"text":"x', 'event: error\n\ndata: {"x":1}', ""])
"""Output text, with what looks like the keys and framing the reader looks for."""
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": ")])
APIS = {"responses": _responses.READING, "messages": _messages.READING}


def _responses_event(draw: Any, seq: int, vllm: bool) -> tuple[str, dict[str, Any]]:
    """One Responses API event, its fields in vLLM's order or OpenAI's."""
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        name = draw(
            st.sampled_from(
                [
                    "response.output_text.delta",
                    "response.reasoning_text.delta",
                    "response.reasoning_summary_text.delta",
                    "response.function_call_arguments.delta",
                    "response.refusal.delta",
                ]
            )
        )
        fields = {"content_index": 0, "delta": draw(TEXT), "item_id": "msg_1"}
        fields |= {"logprobs": [], "output_index": 0, "sequence_number": seq}
        if vllm:
            return name, {**fields, "type": name}
        return name, {"type": name, "sequence_number": seq, **fields}
    if kind == 5:
        item = draw(st.sampled_from(["message", "reasoning", "function_call", "web_search_call"]))
        added = {"id": "it_1", "type": item, "name": "get_weather", "arguments": ""}
        event = {"item": added, "output_index": 0, "sequence_number": seq}
        return "response.output_item.added", {**event, "type": "response.output_item.added"}
    if kind == 6:
        name = draw(
            st.sampled_from(
                [
                    "response.created",
                    "response.in_progress",
                    "response.content_part.added",
                    "response.output_text.done",
                    "response.output_item.done",
                ]
            )
        )
        response = {"id": "resp_1", "model": "tiny", "status": "in_progress", "usage": None}
        return name, {"response": response, "text": draw(TEXT), "type": name}
    if kind <= 8:
        name = draw(
            st.sampled_from(["response.completed", "response.incomplete", "response.failed"])
        )
        status = {"response.completed": "completed", "response.incomplete": "incomplete"}
        usage = {
            "input_tokens": draw(st.integers(0, 50)),
            "input_tokens_details": {"cached_tokens": draw(st.integers(0, 9))},
            "output_tokens": draw(st.integers(0, 50)),
            "output_tokens_details": {"reasoning_tokens": draw(st.integers(0, 9))},
        }
        response = {
            "id": "resp_1",
            "model": "tiny",
            "status": status.get(name, "failed"),
            "incomplete_details": {"reason": "max_output_tokens"},
            "error": {"code": "server_error", "message": "the secret prompt"},
            "usage": usage,
            "metrics": {"queue_time_ms": 1.0},
        }
        return name, {"response": response, "sequence_number": seq, "type": name}
    return "error", {"type": "error", "code": "server_error", "message": "the secret prompt"}


def _messages_event(draw: Any, seq: int, vllm: bool) -> tuple[str, dict[str, Any]]:
    """One Messages API event, its fields in vLLM's order or Anthropic's."""
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        delta_type, key = draw(
            st.sampled_from(
                [
                    ("text_delta", "text"),
                    ("thinking_delta", "thinking"),
                    ("input_json_delta", "partial_json"),
                    ("signature_delta", "signature"),
                ]
            )
        )
        delta = {"type": delta_type, key: draw(TEXT)}
        if vllm:
            return "content_block_delta", {
                "type": "content_block_delta",
                "delta": delta,
                "index": 0,
            }
        return "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    if kind == 5:
        block = draw(
            st.sampled_from(
                [
                    {"type": "text", "text": ""},
                    {"type": "thinking", "thinking": ""},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                    {"type": "text", "text": "Hi"},
                ]
            )
        )
        return "content_block_start", {
            "type": "content_block_start",
            "index": 0,
            "content_block": block,
        }
    if kind == 6:
        usage = {"input_tokens": draw(st.integers(0, 50)), "output_tokens": draw(st.integers(0, 2))}
        if draw(st.booleans()):
            usage["cache_read_input_tokens"] = draw(st.integers(0, 9))
        message = {"id": "msg_1", "type": "message", "model": "tiny", "usage": usage}
        return "message_start", {"type": "message_start", "message": message}
    if kind == 7:
        usage = {"output_tokens": draw(st.integers(0, 50))}
        if draw(st.booleans()):
            usage |= {"input_tokens": draw(st.integers(0, 50))}
            usage |= {"cache_creation_input_tokens": draw(st.integers(0, 9))}
        delta = {"stop_reason": draw(st.sampled_from(["end_turn", "max_tokens", "tool_use"]))}
        return "message_delta", {"type": "message_delta", "delta": delta, "usage": usage}
    name = draw(st.sampled_from(["message_stop", "ping", "content_block_stop", "error"]))
    if name == "error":
        error = {"type": draw(st.sampled_from(["overloaded_error", "bad code!"])), "message": "x"}
        return name, {"type": "error", "error": error}
    return name, {"type": name}


@st.composite
def api_streams(draw: Any, api: str) -> list[bytes]:
    """An agent API's stream as servers write it, event by event: fields in vLLM's order
    or the API owner's, compact or spaced, the ``event:`` line written or not (then the
    JSON's ``type`` names it), now and then an event's data on two lines, between
    comments, keep-alives, blank lines, CRLF events and events that are no JSON; maybe cut
    inside its last event."""
    vllm = draw(st.booleans())
    separators = draw(SEPARATORS)
    named = draw(st.booleans())
    make = _responses_event if api == "responses" else _messages_event
    parts = []
    seq = 0
    for _ in range(draw(st.integers(0, 6))):
        noise = draw(st.integers(0, 10))
        if noise == 0:
            parts.append(b": keep-alive\n\n")
        elif noise == 1:
            parts.append(b"event: " + (b"message_delta" if api == "messages" else b"error"))
            parts.append(b"\ndata: {not json\n\n")
        elif noise == 2:
            parts.append(b"\n")  # a blank line more: no event
        elif noise == 3:  # an event written with CRLF line ends
            parts.append(b"event: ping\r\ndata: {}\r\n\r\n")
        name, body = make(draw, seq, vllm)
        # A run of events of this kind, as a server streams its deltas (the same fields
        # before the value, another value each).
        for _ in range(draw(st.integers(1, 4))):
            seq += 1
            if "delta" in body and isinstance(body["delta"], str):
                body = {**body, "delta": draw(TEXT), "sequence_number": seq}
            elif name == "content_block_delta":
                delta = dict(body["delta"])
                key = next(k for k in delta if k != "type")
                body = {**body, "delta": {**delta, key: draw(TEXT)}}
            data = json.dumps(body, separators=separators, ensure_ascii=draw(st.booleans()))
            if draw(st.integers(0, 7)) == 0:  # its data on two lines (SSE joins them: the
                at = draw(st.integers(0, len(data)))  # JSON may then be broken)
                data = f"{data[:at]}\ndata: {data[at:]}"
            line = f"event: {name}\ndata: {data}\n\n" if named else f"data: {data}\n\n"
            parts.append(line.encode())
    if parts and draw(st.booleans()):
        parts[-1] = parts[-1][: draw(st.integers(0, len(parts[-1])))]
    return parts


@st.composite
def chunkings(draw: Any, parts: list[bytes]) -> list[bytes]:
    """How a stream's events arrive: each its own chunk (as a server sends them, read at
    its pace), several together, or cut anywhere."""
    how = draw(st.integers(0, 2))
    if how == 0:
        return parts
    if how == 1:
        chunks, at = [], 0
        while at < len(parts):
            take = draw(st.integers(1, 3))
            chunks.append(b"".join(parts[at : at + take]))
            at += take
        return chunks
    body = b"".join(parts)
    return _chunked(body, draw(st.lists(st.integers(0, len(body)), max_size=8)))


def _chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(stream)})
    return [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]


def _call(telemetry: Telemetry, state: RequestState | None, api: str) -> ApiCall:
    """The agent API's streamed call in ``state``'s request (if any), answered 200."""
    path = "/v1/responses" if api == "responses" else "/v1/messages"
    payload = {"model": "tiny", "stream": True, "input": "hello", "messages": []}
    request = httpx.Request("POST", f"http://up{path}", json=payload)
    call = ApiCall(telemetry, state, payload, "chat", request, APIS[api])
    call.on_response(httpx.Response(200, headers={"content-type": "text/event-stream"}))
    return call


def _read_all(
    chunks: list[bytes], api: str, *, plain: bool, sampled: bool = True, in_request: bool = True
) -> tuple[Any, ...]:
    """Everything the reader tells of ``chunks`` (read by its shortcuts, or by its plain
    twin): the bytes the app reads, the outputs and reasoning outputs, their marks, the
    first output and answer; then what the stream's end tells (usage as metered, finish
    reasons, end, failure, response id and model, the error's reason)."""
    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    telemetry = Telemetry(tracer_provider=provider, registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r")) if in_request else None
    call = _call(telemetry, state, api)
    if plain:
        call.read_plainly()
    out = []
    for chunk in chunks:
        out.append(call.on_chunk(chunk))
        if state is not None:
            state.token_times.append(0.0)  # the app relayed the chunk
    out.append(call.flush())
    metered = None
    call.finish()
    inference = state.inference if state is not None else None
    if state is not None:
        metered = state.upstream_usage
    return (
        b"".join(out),
        call.outputs,
        call._reasoning,
        inference.choices if inference is not None else None,
        inference.first_output if inference is not None else None,
        inference.first_answer if inference is not None else None,
        metered,
        call._usage,
        call._finish_reasons,
        call._ended,
        call._failure,
        call._response_id,
        call._response_model,
        call._error_reason,
    )


TWIN = (st.booleans(), st.booleans())


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), options=st.tuples(*TWIN))
def test_the_reader_and_its_plain_twin_read_the_same(
    api: str, data: Any, options: tuple[bool, bool]
) -> None:
    """A stream as servers write it, however chunked, traced or sampled out, in a request
    or not: the reader with its shortcuts tells everything its plain twin tells."""
    chunks = data.draw(chunkings(data.draw(api_streams(api))))
    sampled, in_request = options
    fast = _read_all(chunks, api, plain=False, sampled=sampled, in_request=in_request)
    assert fast == _read_all(chunks, api, plain=True, sampled=sampled, in_request=in_request)


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_split_reads_as_the_whole_body_does(api: str, data: Any) -> None:
    """A stream as servers write it, split anywhere (or each event a chunk, as a server
    sends them): read chunk by chunk, it tells what it tells read as one body, and each
    output event is marked with the chunk that completed it, as found by parsing each
    event of the whole body with the API's reading."""
    events = data.draw(api_streams(api))
    body = b"".join(events)
    chunks = data.draw(chunkings(events))
    split = _read_all(chunks, api, plain=False)
    one = _read_all([body], api, plain=False)
    assert split[0] == body
    assert split[1:3] == one[1:3]  # outputs and reasoning outputs
    assert split[6:] == one[6:]  # usage, finish reasons, end, failure, id, model, reason
    ends, at = [], 0
    for chunk in chunks:
        at += len(chunk)
        ends.append(at)
    marks, answer = [], None
    found, _ = _sse.split_named(body)
    for _, stop, name, payload in found:
        try:
            facts = APIS[api].read_event(name, json.loads(payload or b"null"))
        except ValueError:
            continue
        for _ in facts.outputs:
            marks.append(next(i for i, e in enumerate(ends) if e >= stop))
        if facts.answers and answer is None:
            answer = marks[-1]
    assert split[3] == ([marks] if marks or split[3] else [])
    assert split[4] == (marks[0] if marks else None)
    assert split[5] == answer


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=8))
def test_the_app_reads_any_bytes_unchanged(api: str, stream: bytes, cuts: list[int]) -> None:
    """Any bytes, any chunking: the app reads the stream byte for byte (nothing is removed
    from an agent API's stream), by the reader and by its plain twin."""
    chunks = _chunked(stream, cuts)
    assert _read_all(chunks, api, plain=False)[0] == stream
    assert _read_all(chunks, api, plain=True)[0] == stream


DELTAS = {
    "responses": [
        ("response.output_text.delta", "delta", _openai.ANSWER),
        ("response.reasoning_text.delta", "delta", _openai.REASONING),
    ],
    "messages": [("content_block_delta", "text", _openai.ANSWER)],
}


@pytest.mark.parametrize("api", list(APIS))
@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    before=st.dictionaries(st.sampled_from(["type", "a", "index", "delta"]), TEXT, max_size=2),
    after=st.dictionaries(st.sampled_from(["usage", "type", "error", "b"]), TEXT, max_size=2),
    separators=SEPARATORS,
)
def test_a_learned_prefix_decides_what_any_event_beginning_with_it_reads(
    api: str,
    data: Any,
    before: dict[str, Any],
    after: dict[str, Any],
    separators: tuple[str, str],
) -> None:
    """Whatever fields come before the output value (then proved) and after it (never
    seen): when ``prefix_of`` learns a prefix from one event, every event beginning with
    it and a non-empty value is read as output of that kind (and as nothing else)."""
    reading: ApiReading = APIS[api]
    name, key, kind = data.draw(st.sampled_from(DELTAS[api]))

    def event(value: str, tail: dict[str, Any]) -> bytes:
        inner: dict[str, Any] = {"type": "text_delta", key: value} if api == "messages" else {}
        body: dict[str, Any] = {k: v for k, v in before.items() if k != key}
        if api == "messages":
            body["delta"] = {**inner, **{k: v for k, v in tail.items() if k != key}}
        else:
            body[key] = value
            body.update((k, v) for k, v in tail.items() if k not in body)
        return f"event: {name}\ndata: {json.dumps(body, separators=separators)}\n\n".encode()

    first = event(data.draw(TEXT.filter(bool)), {})
    prefix = reading.prefix_of(first, kind) if b"\r" not in first else None
    if prefix is None:
        return
    second = event(data.draw(TEXT.filter(bool)), after)
    if not second.startswith(prefix) or b"\r" in second:
        return
    facts = reading.read_event(name.encode(), json.loads(second.split(b"data: ", 1)[1]))
    assert facts.outputs == [0]
    assert (kind == _openai.REASONING) == bool(facts.reasoning)
    assert facts.says_only_output


class _Chunk(bytes):
    """A chunk of a ``bytes`` subclass (no httpx transport yields one; a custom stream may)."""


@pytest.mark.parametrize("api", list(APIS))
@pytest.mark.parametrize("kind", [_Chunk, bytearray])
def test_a_chunk_of_another_type_than_bytes_is_read_by_parsing(api: str, kind: type) -> None:
    """After an output event taught the prefix, a chunk of another type than ``bytes``
    (alone, or holding several events) is read by parsing: ``removeprefix`` answers such a
    type a copy even without the prefix, which would count any event as output."""
    name, delta = (
        ("response.output_text.delta", {"delta": "a"})
        if api == "responses"
        else ("content_block_delta", {"delta": {"type": "text_delta", "text": "a"}})
    )
    output = f"event: {name}\ndata: {json.dumps(delta, separators=(',', ':'))}\n\n".encode()
    other = b"event: " + name.encode() + b'\ndata: {"x":1}\n\n'  # no output
    telemetry = Telemetry(registry=CollectorRegistry())
    state = RequestState(telemetry, telemetry.tracer.start_span("r"))
    call = _call(telemetry, state, api)
    for chunk in (output, kind(output), kind(other), kind(other + other)):
        assert call.on_chunk(chunk) == chunk
        state.token_times.append(0.0)
    assert call.outputs == 2
    call.finish()
