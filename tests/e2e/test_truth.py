"""Truth suite: stagelens' readings against readings it did not produce, request by request.

An ordinary service (a relay: it never looks at the events, like
``examples/existing_service``) is instrumented with stagelens and served on a real
loopback port in front of the session's real vLLM; the client is the official ``openai``
SDK, which times every chunk with its own clock. For each response shape (streamed and
not, chat and completions, several choices, tools), each request is joined to its trace
by vLLM's response id and compared:

- TTFT: stagelens' ``stagelens.time_to_first_token`` within 5 ms of the client's time from
  sending its request (an httpx hook in the SDK's client, ``SendClock``) to its first
  output-bearing chunk;
- ITL: the samples recorded for the request (requests run one at a time) equal, per
  choice, the output-bearing events the client got minus one; their sum is the client's
  (last - first output event) within a few ms; where vLLM sent one token per event, that
  is output tokens - 1;
- tokens: exactly vLLM's usage (the client asks for it and sees it), or, for a stream cut
  early, within the documented estimate (output = events received; input = prompt bytes
  / 4 against vLLM's own count from ``/tokenize``).

"A backend killed mid-stream" is a TCP proxy between the service and vLLM that drops the
connection after a few events (from the service's side the same as a dead backend; the
engine itself is killed in tests/e2e/test_gateway.py::TestFailover).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.trace import StatusCode
from starlette.responses import JSONResponse, Response, StreamingResponse

from stagelens import instrument_app, instrument_httpx_client
from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture, capture_telemetry
from tests._scaffold import Served, relayed

pytestmark = pytest.mark.vllm
openai = pytest.importorskip("openai")

TTFT_BOUND = 0.005
MESSAGES = [{"role": "user", "content": "hello the gateway please explain the budget"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def relay_app(capture: TelemetryCapture, upstream_url: str) -> FastAPI:
    """An ordinary service: passes the client's body to the upstream and relays the
    answer, streamed or whole, without looking at it."""
    client = httpx.AsyncClient(base_url=upstream_url, timeout=120)
    instrument_httpx_client(client, telemetry=capture.telemetry)
    app = FastAPI()

    async def complete(request: Request, path: str) -> Response:
        body = await request.json()
        upstream = await client.send(client.build_request("POST", path, json=body), stream=True)
        if not body.get("stream"):
            raw = await upstream.aread()
            await upstream.aclose()
            return Response(raw, status_code=upstream.status_code, media_type="application/json")

        return relayed(upstream)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await complete(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, "/v1/completions")

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"ok": True})

    instrument_app(app, telemetry=capture.telemetry)
    return app


def reframing_app(capture: TelemetryCapture, upstream_url: str) -> FastAPI:
    """A service that answers in its own format: an opening comment at once, then one
    ``{"t": text}`` event per piece of content the upstream streamed."""
    client = httpx.AsyncClient(base_url=upstream_url, timeout=120)
    instrument_httpx_client(client, telemetry=capture.telemetry)
    app = FastAPI()

    @app.post("/chat")
    async def chat(request: Request) -> Response:
        body = await request.json()
        payload = {"model": "tiny", "stream": True, **body}
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=payload), stream=True
        )

        async def reframe() -> Any:
            yield b": stream opened\n\n"  # a body before any token: no first token
            try:
                async for line in upstream.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    for choice in json.loads(line[6:]).get("choices", []):
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            yield f"data: {json.dumps({'t': text})}\n\n".encode()
            finally:
                await upstream.aclose()

        return StreamingResponse(reframe(), media_type="text/event-stream")

    instrument_app(app, telemetry=capture.telemetry)
    return app


class SeveringProxy:
    """A TCP proxy to the backend that drops both connections once ``cut_after`` SSE
    events of an answer passed through (a backend dying mid-stream, seen from the service)."""

    def __init__(self, target: str, cut_after: int) -> None:
        url = httpx.URL(target)
        self._host, self._port = url.host, url.port
        self.cut_after = cut_after
        self._loop = asyncio.new_event_loop()
        self.url = ""

    def __enter__(self) -> SeveringProxy:
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0)
            )
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)

        async def upward() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        task = asyncio.ensure_future(upward())
        seen = 0
        try:
            while data := await up_reader.read(65536):
                seen += data.count(b"data:")
                writer.write(data)
                await writer.drain()
                if seen >= self.cut_after:
                    break
        finally:
            task.cancel()
            writer.transport.abort()
            up_writer.transport.abort()


@dataclass
class Seen:
    """What the client saw of one request, on its own clock."""

    id: str = ""
    started: float = 0.0
    wall_started: int = field(default_factory=time.time_ns)
    first_output: float | None = None
    outputs: dict[int, list[float]] = field(default_factory=dict)
    usage: Any = None
    finish: list[str] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        assert self.first_output is not None, "the client got no output"
        return self.first_output - self.started

    def output(self, choice: int, at: float) -> None:
        if self.first_output is None:
            self.first_output = at
        self.outputs.setdefault(choice, []).append(at)

    @property
    def samples(self) -> int:
        """ITL samples the client's own events give: per choice, events - 1."""
        return sum(max(len(times) - 1, 0) for times in self.outputs.values())

    @property
    def gap_sum(self) -> float:
        return sum(times[-1] - times[0] for times in self.outputs.values() if len(times) > 1)


def _chunk_outputs(chunk: Any) -> list[int]:
    """The choices of an SDK chunk that carry output (content, tool call, text, reasoning)."""
    found = []
    for choice in chunk.choices:
        delta = getattr(choice, "delta", None)
        if delta is not None:
            reasoning = getattr(delta, "reasoning", None) or getattr(
                delta, "reasoning_content", None
            )
            if delta.content or delta.tool_calls or reasoning:
                found.append(choice.index)
        elif getattr(choice, "text", None):
            found.append(choice.index)
    return found


class SendClock:
    """When the SDK's latest request left for the server, on the client's own clocks (an
    httpx request hook: after the SDK built it, as httpx writes it).

    Why the client's readings start there: the SDK's own work before sending (its options,
    its headers) takes milliseconds on a slow or busy machine, which no server can see; the
    gateway's TTFT starts at receipt, and on loopback receipt follows the send at once."""

    def __init__(self) -> None:
        self.at = 0.0
        self.wall = 0

    def __call__(self, request: httpx.Request) -> None:
        self.at, self.wall = time.perf_counter(), time.time_ns()


_CLOCKS: weakref.WeakKeyDictionary[Any, SendClock] = weakref.WeakKeyDictionary()


def sdk_client(url: str) -> Any:
    """The official SDK for ``url``, its requests timed by a ``SendClock`` (``sent_at``)."""
    clock = SendClock()
    http = httpx.Client(event_hooks={"request": [clock]}, timeout=120)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, http_client=http)
    _CLOCKS[client] = clock
    return client


def sent_at(client: Any, seen: Seen) -> None:
    """Start ``seen``'s clocks when the client's request was sent (``SendClock``)."""
    clock = _CLOCKS.get(client)
    if clock is not None and clock.at >= seen.started:
        seen.started, seen.wall_started = clock.at, clock.wall


def stream(client: Any, *, leave_after: int | None = None, **request: Any) -> Seen:
    """One streamed request through the SDK, timed from when it was sent; with
    ``leave_after`` the client closes the stream once it got that many output events."""
    seen = Seen(started=time.perf_counter())
    create = client.completions.create if "prompt" in request else client.chat.completions.create
    events = create(model="tiny", stream=True, **request)
    try:
        for chunk in events:
            now = time.perf_counter()
            seen.id = seen.id or chunk.id
            for choice in _chunk_outputs(chunk):
                seen.output(choice, now)
            seen.finish += [c.finish_reason for c in chunk.choices if c.finish_reason]
            if chunk.usage is not None:
                seen.usage = chunk.usage
            if leave_after is not None and sum(map(len, seen.outputs.values())) >= leave_after:
                break
    finally:
        events.close()
    sent_at(client, seen)
    return seen


class Readings:
    """What stagelens recorded for one request: spans joined by the response id, and the
    metrics' deltas (requests run one at a time)."""

    def __init__(self, cap: TelemetryCapture, before: dict[str, float], response_id: str) -> None:
        inference = [
            s
            for s in cap.spans()
            if s.attributes and s.attributes.get(sc.GEN_AI_RESPONSE_ID) == response_id
        ]
        assert len(inference) == 1, f"no inference span for {response_id}"
        self.inference = inference[0]
        roots = [
            s
            for s in cap.spans()
            if s.parent is None and s.context.trace_id == self.inference.context.trace_id
        ]
        assert len(roots) == 1
        self.root = roots[0]
        after = _metrics(cap)
        self.delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    @property
    def ttft(self) -> float:
        return float(self.root.attributes[sc.ATTR_TTFT])

    @property
    def itl_samples(self) -> int:
        return round(self.delta.get(_key(f"{sc.INTER_TOKEN_LATENCY}_count"), 0.0))

    @property
    def itl_sum(self) -> float:
        return self.delta.get(_key(f"{sc.INTER_TOKEN_LATENCY}_sum"), 0.0)

    def usage(self) -> tuple[int, int]:
        attrs = self.inference.attributes
        return int(attrs[sc.GEN_AI_USAGE_INPUT_TOKENS]), int(attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS])


def _metrics(cap: TelemetryCapture) -> dict[str, float]:
    """Every sample of the capture's registry, by name and labels (see ``_key``)."""
    out: dict[str, float] = {}
    for family in cap.registry.collect():
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                out[_key(sample.name, **sample.labels)] = sample.value
    return out


@pytest.fixture(scope="module")
def service(vllm_server: Any, port_factory: Any) -> Iterator[tuple[Any, TelemetryCapture, str]]:
    """The relay in front of the session's vLLM, an SDK client for it, its capture."""
    with (
        capture_telemetry() as cap,
        Served(relay_app(cap, vllm_server.base_url), port_factory()) as s,
    ):
        client = sdk_client(f"{s.url}/v1")
        # Warm each shape once (connections, first compile, and the SDK's first parse of
        # a completion's and a tool call's chunk types): the client's clock would otherwise
        # carry its own first-use cost into the first request of that shape.
        stream(client, messages=MESSAGES, max_tokens=2)
        stream(client, prompt="hello", max_tokens=2)
        stream(
            client,
            messages=MESSAGES,
            max_tokens=8,
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        yield client, cap, vllm_server.base_url


def _check_stream(readings: Readings, seen: Seen) -> None:
    """TTFT within 5 ms of the client's; ITL samples per choice = the client's events - 1,
    the gaps' sum the client's within a few ms."""
    assert abs(readings.ttft - seen.ttft) <= TTFT_BOUND, (readings.ttft, seen.ttft)
    assert readings.itl_samples == seen.samples
    assert abs(readings.itl_sum - seen.gap_sum) <= TTFT_BOUND + 0.02 * seen.gap_sum


def _quiet(cap: TelemetryCapture, still: float = 0.5, timeout: float = 30.0) -> None:
    """Wait until the capture's readings stop changing for ``still`` seconds: a request the
    client has finished with may be recorded a little later (its end runs after its last
    byte), and on a loaded machine it would land in the next request's deltas."""
    deadline = time.monotonic() + timeout
    last, since = _metrics(cap), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = _metrics(cap)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= still:
            return


def _one(
    service: Any,
    *,
    vllm_deltas: list[tuple[float, ...]] | None = None,
    settle: float = 0.05,
    **request: Any,
) -> tuple[Readings, Seen]:
    """One request and its readings. Retried (four times at most, waiting longer each
    time: a suite can load this machine for a few seconds) only when the client's clock
    holds more than the bound beyond the service's (``_client_stalled``): TTFT runs from
    receipt to the send of the first output, the client's clock from before sending to
    its read, and on loopback the two ends add a millisecond or two unless this shared
    machine did not schedule the service or the client in between. A reading that is
    wrong is wrong in every attempt."""
    client, cap, vllm_url = service
    for pause in (0.5, 1.0, 2.0, 4.0, None):
        _quiet(cap)
        before = _metrics(cap)
        before_vllm = _vllm_tokens(vllm_url) if vllm_deltas is not None else ()
        seen = stream(client, **request)
        time.sleep(settle)  # the request's end is recorded just after its last byte
        readings = Readings(cap, before, seen.id)
        if vllm_deltas is not None:  # this attempt's alone: a retried one ran too
            after_vllm = _vllm_tokens(vllm_url)
            vllm_deltas[:] = [tuple(a - b for a, b in zip(after_vllm, before_vllm, strict=True))]
        if pause is None or seen.first_output is None or not _client_stalled(readings, seen):
            break
        time.sleep(pause)
    return readings, seen


def _client_stalled(readings: Readings, seen: Seen) -> bool:
    """Whether the client's clock holds more than the bound beyond the service's.

    What the client's TTFT holds beyond the service's is the time before the receipt plus
    the time after the send; what its gaps' sum holds beyond the service's is the time
    between the service's send of the last output and the client's read of it. Only a
    stall there makes either longer than the bound. A service reading longer than the
    client's is never a stall, and never retried."""
    return (
        seen.ttft - readings.ttft > TTFT_BOUND
        or seen.gap_sum - readings.itl_sum > TTFT_BOUND + 0.02 * seen.gap_sum
    )


class TestStreamedShapes:
    """Streamed answers of every shape, each compared with the client and vLLM."""

    @pytest.mark.parametrize(
        "request_",
        [
            {"messages": MESSAGES, "max_tokens": 16},
            {"prompt": "hello the gateway", "max_tokens": 16},
            {"messages": MESSAGES, "max_tokens": 1},
        ],
        ids=["chat", "completions", "max-tokens-1"],
    )
    def test_plain_streams(self, service, request_: dict[str, Any]) -> None:
        """TTFT, ITL and tokens agree with the client and with vLLM's usage; where vLLM
        sent one token per event, ITL samples are output tokens - 1."""
        readings, seen = _one(
            service, temperature=0, stream_options={"include_usage": True}, **request_
        )
        _check_stream(readings, seen)
        assert readings.usage() == (seen.usage.prompt_tokens, seen.usage.completion_tokens)
        if sum(map(len, seen.outputs.values())) == seen.usage.completion_tokens:
            assert readings.itl_samples == seen.usage.completion_tokens - 1

    def test_usage_the_client_did_not_ask_for(self, service) -> None:
        """Without ``include_usage``, the client gets no usage event, and stagelens bills
        what vLLM counted (its own ``/metrics``)."""
        deltas: list[tuple[float, ...]] = []
        readings, seen = _one(
            service, vllm_deltas=deltas, messages=MESSAGES, max_tokens=12, temperature=0
        )
        assert seen.usage is None
        _check_stream(readings, seen)
        ((prompt, generated),) = deltas
        assert readings.usage() == (prompt, generated)

    def test_a_named_tool_call(self, service) -> None:
        """The first token is the first tool-call delta (after vLLM's role-only chunk)."""
        readings, seen = _one(
            service,
            messages=MESSAGES,
            max_tokens=40,
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            stream_options={"include_usage": True},
        )
        _check_stream(readings, seen)
        assert readings.usage() == (seen.usage.prompt_tokens, seen.usage.completion_tokens)

    def test_two_choices(self, service) -> None:
        """n=2: each choice's events give their own samples."""
        readings, seen = _one(
            service,
            messages=MESSAGES,
            max_tokens=8,
            n=2,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},  # both choices run their 8 tokens (no early EOS)
        )
        assert set(seen.outputs) == {0, 1}
        _check_stream(readings, seen)
        assert readings.usage() == (seen.usage.prompt_tokens, seen.usage.completion_tokens)

    def test_a_stop_sequence(self, service) -> None:
        """A stop sequence taken from the greedy answer itself cuts it: tokens exact."""
        client = service[0]
        whole = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=24, temperature=0
        )
        text = whole.choices[0].message.content
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        readings, seen = _one(
            service,
            messages=MESSAGES,
            max_tokens=24,
            temperature=0,
            stop=[stop],
            stream_options={"include_usage": True},
        )
        assert seen.finish == ["stop"]
        _check_stream(readings, seen)
        assert readings.usage() == (seen.usage.prompt_tokens, seen.usage.completion_tokens)

    def test_a_thousand_token_answer(self, service) -> None:
        """A long answer: every event counted, tokens exact."""
        readings, seen = _one(
            service,
            messages=MESSAGES,
            max_tokens=1000,
            temperature=0,
            extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
        assert seen.usage.completion_tokens == 1000
        _check_stream(readings, seen)
        assert readings.usage() == (seen.usage.prompt_tokens, 1000)


class TestEnginePhases:
    """How vLLM's own phases relate to the gateway's TTFT, per request."""

    def test_queue_and_prefill_fall_inside_the_upstream_share_of_ttft(self, service) -> None:
        """queue + prefill (vLLM: queued to scheduled, scheduled to first token) <= the
        upstream TTFT (request sent to first output event received) <= the gateway's
        TTFT; decode (first to last token in the engine) fits in the client's first to
        last output event."""
        readings, seen = _one(
            service, messages=MESSAGES, max_tokens=16, stream_options={"include_usage": True}
        )
        phases = {
            s.name: (s.end_time - s.start_time) / 1e9
            for s in service[1].spans()
            if s.parent is not None and s.parent.span_id == readings.inference.context.span_id
        }
        assert set(phases) == {"queue", "prefill", "decode"}
        upstream = readings.delta[_key(f"{sc.UPSTREAM_TTFT}_sum", prompt_size="1024")]
        assert readings.delta[_key(f"{sc.UPSTREAM_TTFT}_count", prompt_size="1024")] == 1
        assert phases["queue"] + phases["prefill"] <= upstream <= readings.ttft
        assert phases["decode"] <= seen.gap_sum + 0.02


class TestReframingService:
    """A service that re-frames the stream in its own format."""

    def test_ttft_is_the_first_body_after_the_first_output(self, vllm_server, port_factory) -> None:
        """Its opening comment is no first token; the first token is its first body sent
        after vLLM's first content arrived, within 5 ms of the client's first token."""
        with (
            capture_telemetry() as cap,
            Served(reframing_app(cap, vllm_server.base_url), port_factory()) as s,
            httpx.Client(base_url=s.url, timeout=60) as client,
        ):
            for _ in range(2):  # the first one warms up
                cap.clear()
                started = time.perf_counter()
                first = None
                with client.stream(
                    "POST", "/chat", json={"messages": MESSAGES, "max_tokens": 8}
                ) as r:
                    for line in r.iter_lines():
                        if first is None and line.startswith("data: {"):
                            first = time.perf_counter() - started
                time.sleep(0.05)
            assert first is not None
            (root,) = [s for s in cap.spans() if s.parent is None]
            assert abs(root.attributes[sc.ATTR_TTFT] - first) <= TTFT_BOUND


class TestWholeAnswer:
    """A chat completion that is not streamed."""

    def test_the_whole_answer_is_no_first_token(self, service) -> None:
        """Its first byte, sent once the whole answer was generated, is recorded as the
        whole-answer time (stagelens_non_streamed_response_seconds), within 5 ms of the
        client's; no time to first token (histogram or span attribute), no ITL.

        The client's clock stops when the whole answer has been received, before the SDK
        parses it into its objects: that parse happens after any server could send the
        answer (on a slow host it alone took more than the bound)."""
        client, cap, _ = service
        whole_sum = _key(f"{sc.NON_STREAMED_RESPONSE}_sum", prompt_size="1024")
        for _ in range(3):  # retried only on a stall outside the service, as in ``_one``
            _quiet(cap)
            before = _metrics(cap)
            seen = Seen(started=time.perf_counter())
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, max_tokens=16
            )
            # The body is read (not streamed, httpx read it whole): the client's one output.
            seen.output(0, time.perf_counter())
            answer = raw.parse()
            sent_at(client, seen)
            time.sleep(0.05)
            readings = Readings(cap, before, answer.id)
            whole = readings.delta.get(whole_sum, 0.0)
            if seen.ttft - whole <= TTFT_BOUND:
                break
            time.sleep(0.5)
        count = _key(f"{sc.NON_STREAMED_RESPONSE}_count", prompt_size="1024")
        assert readings.delta.get(count) == 1
        first = _key(f"{sc.TIME_TO_FIRST_TOKEN}_count", prompt_size="1024")
        assert not readings.delta.get(first)
        assert sc.ATTR_TTFT not in (readings.root.attributes or {})
        assert abs(whole - seen.ttft) <= TTFT_BOUND
        assert readings.itl_samples == 0
        usage = answer.usage
        assert readings.usage() == (usage.prompt_tokens, usage.completion_tokens)


class TestCutStreams:
    """Streams that end before their usage event."""

    def test_the_client_leaving_mid_stream(self, service) -> None:
        """Billed from what was received and marked estimated; not counted against
        availability; TTFT still the client's."""
        _, _, vllm_url = service
        readings, seen = _one(
            service, settle=0.3, messages=MESSAGES, max_tokens=200, temperature=0, leave_after=3
        )
        assert abs(readings.ttft - seen.ttft) <= TTFT_BOUND
        assert readings.inference.attributes[sc.ATTR_USAGE_ESTIMATED] is True
        prompt_tokens, output_tokens = readings.usage()
        assert 3 <= output_tokens < 200
        assert _within_estimate(prompt_tokens, _vllm_prompt_tokens(vllm_url))
        assert readings.delta.get(_key(sc.UNMETERED_REQUESTS, billing="estimated")) == 1
        assert readings.delta.get(_key(sc.REQUESTS, code="499")) == 1  # never the 200
        # Left after a few tokens, well before client_left_bad_after_seconds: not counted.
        assert not readings.delta.get(_key(sc.SLI_REQUESTS, sli="availability", prompt_size="1024"))

    def test_the_backend_dying_mid_stream(self, service, port_factory) -> None:
        """The connection to the backend drops after a few events: a failure under 200,
        counted as one (spans in error, rejection at inference, availability bad), billed
        as estimated."""
        _, _, vllm_url = service
        with (
            SeveringProxy(vllm_url, cut_after=4) as proxy,
            capture_telemetry() as cap,
            Served(relay_app(cap, proxy.url), port_factory()) as s,
        ):
            client = sdk_client(f"{s.url}/v1")
            before = _metrics(cap)
            seen = Seen(started=time.perf_counter())
            with pytest.raises(openai.APIError):
                _read_all(client, seen)
            time.sleep(0.3)
            readings = Readings(cap, before, seen.id)
        for span in (readings.root, readings.inference):
            assert span.status.status_code is StatusCode.ERROR
            assert span.attributes[sc.ERROR_TYPE] in ("RemoteProtocolError", "ReadError")
        assert readings.root.attributes["http.response.status_code"] == 200
        assert readings.delta.get(_key(sc.REJECTIONS, code="200", stage="inference")) == 1
        assert readings.delta.get(_key(sc.SLI_ERRORS, sli="availability", prompt_size="1024")) == 1
        assert readings.inference.attributes[sc.ATTR_USAGE_ESTIMATED] is True
        _, output_tokens = readings.usage()
        assert output_tokens >= sum(map(len, seen.outputs.values()))


def _read_all(client: Any, seen: Seen) -> None:
    """Read a streamed chat answer to its end (or until it fails), noting outputs."""
    for chunk in client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=200, stream=True
    ):
        seen.id = seen.id or chunk.id
        for choice in _chunk_outputs(chunk):
            seen.output(choice, time.perf_counter())


def _key(name: str, **labels: str) -> str:
    """``name{k=v,...}``, labels sorted, ``model=tiny`` unless given."""
    labels = {"model": "tiny", **labels}
    return f"{name}{{{','.join(f'{k}={v}' for k, v in sorted(labels.items()))}}}"


def _within_estimate(estimate: int, truth: int) -> bool:
    """The documented input estimate (prompt bytes / 4): within a factor of 2."""
    return truth / 2 <= estimate <= truth * 2


def _vllm_prompt_tokens(vllm_url: str) -> int:
    answer = httpx.post(f"{vllm_url}/tokenize", json={"model": "tiny", "messages": MESSAGES})
    return int(answer.json()["count"])


def _vllm_tokens(vllm_url: str) -> tuple[float, float]:
    """vLLM's own prompt and generation token counters (finished requests)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{vllm_url}/metrics", timeout=10).text
    totals = {"vllm:prompt_tokens": 0.0, "vllm:generation_tokens": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals["vllm:prompt_tokens"], totals["vllm:generation_tokens"]
