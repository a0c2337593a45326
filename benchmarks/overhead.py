"""Overhead of stagelens on a FastAPI + httpx streaming proxy, side by side in one run.

Variants (each its own uvicorn process, one worker, same proxy code):
  bare       the proxy alone
  stagelens  instrument_app + instrument_httpx_client + 3 stage() blocks; every stage span
             and metric on, 100 % sampling, spans exported over OTLP/HTTP to a local sink
  metrics    stagelens with tracing sampled out (OTEL_TRACES_SAMPLER=always_off)
  tail       (only with --variants) stagelens with the tail sampler
             (OTEL_TRACES_SAMPLER=stagelens_tail at its default base ratio, 0.01)
  sdk        stagelens as ``stagelens`` but on the OTel SDK's TracerProvider (spans built on
             the request path, BatchSpanProcessor, SDK OTLP encoding): what the deferred
             tracer that configure() builds saves
  otel       opentelemetry-instrumentation-fastapi + -httpx (the generic peer), same sink
  floor      (only with --variants) capture_floor.py: the least work that captures the
             figures of the metrics, nothing recorded; the yardstick for the targets

The upstream streams 16 SSE chunks per response (vLLM's shape, no engine). Variants are run
in interleaved rounds (A B C D A B C D ...) so machine drift hits all alike; each round
measures p50 latency with one client in flight, then throughput with ``--concurrency``.
Medians over rounds are printed, with ratios against ``bare``.

    .venv/bin/python benchmarks/overhead.py [--rounds 3] [--seconds 4] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx

CHUNKS = 16
VARIANTS = ("bare", "stagelens", "metrics", "sdk", "otel")

UPSTREAM = textwrap.dedent(
    """
    import asyncio, json, os
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    USAGE = {"prompt_tokens": 300, "completion_tokens": CHUNKS, "total_tokens": 300 + CHUNKS,
             "prompt_tokens_details": {"cached_tokens": 128}}
    METRICS = {"time_to_first_token_ms": 5.0, "generation_time_ms": 20.0, "queue_time_ms": 0.1}
    MIX_SLOW = float(os.environ.get("BENCH_MIX_SLOW") or 0)  # see mix_of
    PACE = float(os.environ.get("BENCH_PACE") or 0)  # seconds between events (--pace)

    async def chat(request):
        body = await request.json()
        kind = str(body.get("user") or "") if MIX_SLOW else ""  # what mix_of made it
        if kind == "bench-failed":  # refused, as an overloaded engine
            return JSONResponse({"error": {"message": "overloaded", "code": 503}}, 503)
        slow = kind == "bench-slow"  # its first event late
        def lines():
            for i in range(CHUNKS):
                chunk = {"id": "chatcmpl-1", "model": body["model"], "choices": [
                    {"index": 0, "delta": {"content": f"tok{i} "},
                     "finish_reason": "length" if i == CHUNKS - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\\n\\n"
            if (body.get("stream_options") or {}).get("include_usage"):  # as vLLM
                final = {"id": "chatcmpl-1", "model": body["model"], "choices": [],
                         "usage": USAGE, "metrics": METRICS}
                yield f"data: {json.dumps(final)}\\n\\n"
            yield "data: [DONE]\\n\\n"
        async def events():
            if slow:
                await asyncio.sleep(MIX_SLOW)
            for i, line in enumerate(lines()):
                if PACE and i:
                    await asyncio.sleep(PACE)
                yield line
        return StreamingResponse(events(), media_type="text/event-stream")

    def sse(name, body):  # as vLLM writes the agent APIs' events (compact JSON)
        return f"event: {name}\\ndata: {json.dumps(body, separators=(',', ':'))}\\n\\n"

    RESPONSE = {"id": "resp_1", "created_at": 1, "incomplete_details": None,
                "instructions": None, "metadata": None, "model": "tiny", "object": "response",
                "output": [], "parallel_tool_calls": True, "temperature": 1.0,
                "tool_choice": "none", "tools": [], "top_p": 1.0, "background": False,
                "max_output_tokens": None, "max_tool_calls": None,
                "previous_response_id": None, "prompt": None, "reasoning": None,
                "service_tier": "auto", "status": "in_progress", "text": None,
                "top_logprobs": None, "truncation": "disabled", "usage": None, "user": None}
    RESPONSES_USAGE = {"input_tokens": 300, "output_tokens": CHUNKS, "total_tokens": 300 + CHUNKS,
                       "input_tokens_details": {"cached_tokens": 128, "cache_write_tokens": 0},
                       "output_tokens_details": {"reasoning_tokens": 0}}

    def responses_events():  # the Responses API's stream, as vLLM writes it
        texts = [f"tok{i} " for i in range(CHUNKS)]
        part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
        item = {"id": "msg_1", "content": [], "role": "assistant", "status": "in_progress",
                "type": "message", "phase": None}
        seq = iter(range(10_000))
        yield sse("response.created", {"response": RESPONSE, "sequence_number": next(seq),
                                       "type": "response.created"})
        yield sse("response.in_progress", {"response": RESPONSE, "sequence_number": next(seq),
                                           "type": "response.in_progress"})
        yield sse("response.output_item.added", {"item": item, "output_index": 0,
            "sequence_number": next(seq), "type": "response.output_item.added"})
        yield sse("response.content_part.added", {"content_index": 0, "item_id": "msg_1",
            "output_index": 0, "part": part, "sequence_number": next(seq),
            "type": "response.content_part.added"})
        for text in texts:
            yield sse("response.output_text.delta", {"content_index": 0, "delta": text,
                "item_id": "msg_1", "logprobs": [], "output_index": 0,
                "sequence_number": next(seq), "type": "response.output_text.delta"})
        whole = "".join(texts)
        done = {**part, "text": whole, "logprobs": None}
        yield sse("response.output_text.done", {"content_index": 0, "item_id": "msg_1",
            "logprobs": [], "output_index": 0, "sequence_number": next(seq), "text": whole,
            "type": "response.output_text.done"})
        yield sse("response.content_part.done", {"content_index": 0, "item_id": "msg_1",
            "output_index": 0, "part": done, "sequence_number": next(seq),
            "type": "response.content_part.done"})
        item = {**item, "content": [done], "status": "completed"}
        yield sse("response.output_item.done", {"item": item, "output_index": 0,
            "sequence_number": next(seq), "type": "response.output_item.done"})
        final = {**RESPONSE, "output": [item], "status": "completed", "usage": RESPONSES_USAGE,
                 "metrics": METRICS}
        yield sse("response.completed", {"response": final, "sequence_number": next(seq),
                                         "type": "response.completed"})

    def messages_events():  # the Messages API's stream, as vLLM writes it
        start = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                 "model": "tiny", "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 300, "output_tokens": 0}}
        yield sse("message_start", {"type": "message_start", "message": start})
        yield sse("content_block_start", {"type": "content_block_start",
            "content_block": {"type": "text", "text": ""}, "index": 0})
        for i in range(CHUNKS):
            yield sse("content_block_delta", {"type": "content_block_delta",
                "delta": {"type": "text_delta", "text": f"tok{i} "}, "index": 0})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        usage = {"input_tokens": 172, "output_tokens": CHUNKS,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 128}
        yield sse("message_delta", {"type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None}, "usage": usage})
        yield sse("message_stop", {"type": "message_stop"})

    def agent(lines):
        async def endpoint(request):
            await request.body()
            async def events():
                for i, line in enumerate(lines()):
                    if PACE and i:
                        await asyncio.sleep(PACE)
                    yield line
            return StreamingResponse(events(), media_type="text/event-stream")
        return endpoint

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", agent(responses_events), methods=["POST"]),
        Route("/v1/messages", agent(messages_events), methods=["POST"]),
    ])
    """
)

SINK = textwrap.dedent(
    """
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def traces(request):
        await request.body()
        return Response(b"", media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    """
)

PROXY = textwrap.dedent(
    """
    import os
    import httpx
    from fastapi import FastAPI, Request
    from starlette.responses import StreamingResponse

    VARIANT = os.environ["BENCH_VARIANT"]
    ASK_USAGE = not os.environ.get("BENCH_NO_USAGE")
    if os.environ.get("BENCH_NO_GC"):  # code-path instructions alone (overhead_instructions)
        import gc
        gc.disable()
    UPSTREAM = os.environ["BENCH_UPSTREAM"]
    client = httpx.AsyncClient(base_url=UPSTREAM, timeout=30)
    app = FastAPI()

    if VARIANT in ("stagelens", "metrics", "sdk", "tail"):
        import stagelens
        from stagelens import Stage, stage
        sdk_provider = None
        if VARIANT == "sdk":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            sdk_provider = TracerProvider()
            sdk_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        telemetry = stagelens.configure(tracer_provider=sdk_provider)
        slots = telemetry.instruments.exemplar_slots
        if os.environ.get("BENCH_NO_EXEMPLAR_KEEPS") and slots is not None:
            # overhead_instructions.py: the exemplar rule runs as on a proxy that has been
            # serving a while (its cost is counted) but keeps nothing by itself (see there
            # why): every bucket of each model label the bench's requests get is filled
            # and each window's slowest unbeatable, which the refresh interval that
            # overhead_instructions.py sets (STAGELENS_TAIL_EXEMPLAR_REFRESH_SECONDS) never
            # lets go stale. Nothing wraps the rule's calls.
            import time
            from stagelens.semconv import MODEL_OTHER

            now = time.monotonic()
            for model in ("tiny", MODEL_OTHER, telemetry.settings.default_model):
                slots._slowest[model] = (now, float("inf"))
                for bucket in range(len(slots._bounds) + 1):
                    slots._filled[(model, bucket)] = now
        if not os.environ.get("BENCH_NO_HTTPX"):
            stagelens.instrument_httpx_client(client, telemetry=telemetry)
    elif VARIANT == "floor":
        import capture_floor
        stage = capture_floor.stage

        class Stage:
            TOKENIZER, ROUTER, POSTPROCESS = "tokenizer", "router", "postprocess"

        client._transport = capture_floor.Transport(client._transport)
    else:
        from contextlib import nullcontext as _null

        class Stage:
            TOKENIZER = ROUTER = POSTPROCESS = None

        def stage(_name):
            return _null()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if ASK_USAGE:  # as a gateway that bills does (the upstream sends it only if asked)
            body["stream_options"] = {"include_usage": True}
        with stage(Stage.TOKENIZER):
            n = len(str(body.get("messages")))
        with stage(Stage.ROUTER):
            pass
        upstream = await client.send(
            client.build_request("POST", "/v1/chat/completions", json=body), stream=True
        )

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    with stage(Stage.POSTPROCESS) if chunk.startswith(b"data: [DONE]") else _noop:
                        pass
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    async def agent(request: Request, path: str):
        # The agent APIs' relay: the chat relay's stages; their streams need no usage
        # option (they always end with their usage) and end with their final event.
        body = await request.json()
        with stage(Stage.TOKENIZER):
            n = len(str(body.get("input") or body.get("messages")))
        with stage(Stage.ROUTER):
            pass
        upstream = await client.send(client.build_request("POST", path, json=body), stream=True)
        final = (b"event: response.completed", b"event: message_stop")

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    with stage(Stage.POSTPROCESS) if chunk.startswith(final) else _noop:
                        pass
                    yield chunk
            finally:
                await upstream.aclose()

        return StreamingResponse(relay(), media_type="text/event-stream")

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await agent(request, "/v1/responses")

    @app.post("/v1/messages")
    async def messages(request: Request):
        return await agent(request, "/v1/messages")

    class _Noop:
        def __enter__(self):
            return self
        def __exit__(self, *a):
            return None

    _noop = _Noop()

    if VARIANT == "floor":
        app = capture_floor.middleware(app)
    elif VARIANT in ("stagelens", "metrics", "sdk", "tail") and not os.environ.get("BENCH_NO_APP"):
        stagelens.instrument_app(app, telemetry=telemetry, metrics_path="/metrics")
    elif VARIANT == "otel":
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    """
)


SLOW_TICK = textwrap.dedent(
    """
    \"\"\"uvicorn serving ``sys.argv[1]`` (``module:app``) on 127.0.0.1, port ``sys.argv[2]``,
    as ``python -m uvicorn`` does with the bench's options, its server's housekeeping tick
    every ``sys.argv[3]`` seconds rather than every 0.1 s (see ``serve``).\"\"\"
    import asyncio, sys

    import uvicorn

    TICK = float(sys.argv[3])


    class Server(uvicorn.Server):
        async def main_loop(self):
            # uvicorn's loop, its sleep longer; the counter advances by the ticks it stands
            # for, so what on_tick does once a second (the Date header) is done each tick.
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 10) % 864000
                await asyncio.sleep(TICK)
                should_exit = await self.on_tick(counter)


    config = uvicorn.Config(
        sys.argv[1], host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
        access_log=False,
    )
    Server(config).run()
    """
)


def write_programs(work: Path, chunks: int = CHUNKS) -> Path:
    """Write the upstream (streaming ``chunks`` content events), sink and proxy programs
    (and the floor's module) into ``work``."""
    (work / "bench_upstream.py").write_text(UPSTREAM.replace("CHUNKS", str(chunks)))
    (work / "bench_sink.py").write_text(SINK)
    (work / "bench_proxy.py").write_text(PROXY)
    (work / "bench_slow_tick.py").write_text(SLOW_TICK)
    shutil.copy(Path(__file__).with_name("capture_floor.py"), work / "capture_floor.py")
    return work


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proxy_env(variant: str, upstream_port: int, sink_port: int) -> dict[str, str]:
    """The environment of the proxy process for ``variant``."""
    return {
        "BENCH_VARIANT": variant,
        "BENCH_UPSTREAM": f"http://127.0.0.1:{upstream_port}",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{sink_port}/v1/traces",
        "OTEL_TRACES_SAMPLER": {"metrics": "always_off", "tail": "stagelens_tail"}.get(
            variant, "always_on"
        ),
        "OTEL_SERVICE_NAME": "bench-proxy",
    }


def serve(
    module_dir: Path,
    module: str,
    port: int,
    env: dict[str, str],
    *,
    prefix: tuple[str, ...] = (),
    stderr: int | None = None,
    tick: float | None = None,
) -> subprocess.Popen[bytes]:
    """``module:app`` under uvicorn on ``port`` (``prefix``: a wrapper such as valgrind).

    ``tick``: uvicorn's housekeeping tick (a timer every 0.1 s, about 20 k instructions
    each) every ``tick`` seconds instead (``bench_slow_tick.py``). Why: its cost grows with
    wall time, not with requests; under valgrind, ~50x slower, each request paid ~50x its
    real-speed share of it, more on a busier host (an idle proxy under valgrind spent
    225 k instructions a second on it, 11 k with a 5 s tick)."""
    if tick is None:
        server = [sys.executable, "-m", "uvicorn", f"{module}:app", "--host", "127.0.0.1"]
        server += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
        server += ["--app-dir", str(module_dir)]
    else:
        launcher = str(module_dir / "bench_slow_tick.py")
        server = [sys.executable, launcher, f"{module}:app", str(port), str(tick)]
    cmd = [*prefix, *server]
    # Run from the programs' folder: ``python -m`` puts the working directory first on
    # sys.path, and a checkout's own ``stagelens/`` there would shadow PYTHONPATH.
    return subprocess.Popen(cmd, env={**os.environ, **env}, stderr=stderr, cwd=module_dir)


def wait_up(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


BODY = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
APIS = {
    "chat": ("/v1/chat/completions", BODY),
    "responses": ("/v1/responses", {"model": "tiny", "stream": True, "input": "hi"}),
    "messages": ("/v1/messages", {**BODY, "max_tokens": 16}),
}
"""What the client asks, per API (``--api``): the path and the body."""
REQUEST = APIS["chat"]
"""The client's (path, body): chat unless ``use_api`` picked another API."""


def use_api(api: str) -> None:
    """Make ``one`` ask the ``api`` (``chat``, ``responses``, ``messages``)."""
    global REQUEST
    REQUEST = APIS[api]


def mix_of(seq: int) -> str | None:
    """What request ``seq`` is in the tail sampler's traffic mix, deterministic per request:
    ``failed`` (1 %: the upstream, started with ``BENCH_MIX_SLOW`` set, answers 503),
    ``slow`` (2 %: its first event ``BENCH_MIX_SLOW`` seconds late), ``sampled`` (1 %: the
    client's ``traceparent`` says sampled, which the tail sampler keeps at the start, as it
    keeps the traces its base ratio picks), or None. The request names what it is in its
    ``user`` field (``bench-failed``...), which the proxy passes on to the upstream: the
    rule lives here alone."""
    if seq % 100 == 50:
        return "failed"
    if seq % 100 == 10:
        return "sampled"
    return "slow" if seq % 50 == 25 else None


async def one(client: httpx.AsyncClient, seq: int | None = None, kind: str | None = None) -> float:
    """One streamed request, ``seq`` in the traffic mix (``mix_of``; None: outside it);
    ``kind``: what it is, whatever its number (``sampled`` for a warm-up kept in every
    variant that keeps any)."""
    t0 = time.perf_counter()
    kind = kind or (mix_of(seq) if seq is not None else None)
    path, body = REQUEST
    body = body if seq is None else {**body, "user": f"bench-{kind}"}
    headers = None
    if kind == "sampled":
        headers = {"traceparent": f"00-{seq + 1:032x}-{seq + 1:016x}-01"}
    async with client.stream("POST", path, json=body, headers=headers) as r:
        async for _ in r.aiter_raw():
            pass
        if r.status_code != 200:
            raise SystemExit(f"proxy answered {r.status_code}")
    return time.perf_counter() - t0


def cpu_seconds(pid: int, *, user_only: bool = False) -> float:
    """user+system (``user_only``: user) CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + (0 if user_only else int(fields[12]))
    return ticks / os.sysconf("SC_CLK_TCK")


async def measure(
    url: str, seconds: float, concurrency: int, pid: int
) -> tuple[float, float, float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        for _ in range(20):  # warm-up
            await one(client)
        latencies = []
        end = time.perf_counter() + seconds / 3
        while time.perf_counter() < end:
            latencies.append(await one(client))
        p50 = statistics.median(latencies)
        done = 0
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await one(client)
                done += 1

        t0 = time.perf_counter()
        cpu0 = cpu_seconds(pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu_per_request = (cpu_seconds(pid) - cpu0) / max(done, 1)
        return done / (time.perf_counter() - t0), p50, cpu_per_request


def check_full_work(metrics_url: str) -> None:
    """Refuse a flattering figure: the instrumented proxy must really have parsed usage,
    billed it and recorded engine phases for the requests it served."""
    problem = full_work_problem(httpx.get(metrics_url, timeout=10).text)
    if problem is not None:
        raise SystemExit(problem)


def full_work_problem(
    text: str, served: int | None = None, failed: int = 0, phases_per: int = 3
) -> str | None:
    """What an instrumented proxy's ``/metrics`` text says it failed to do (None: every
    request counted, its output tokens billed and its engine phases recorded);
    ``served``: the number of requests it must have counted, ``failed`` of them refused
    by the upstream (the proxy relays the error body under its own 200: counted, with
    nothing to bill and no engine phases); ``phases_per``: the engine phases each answer
    gives (none on the Messages API: vLLM's answers there carry no timings)."""

    def total(prefix: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix) and not line.startswith("#")
        )

    output_tokens = total('stagelens_tokens_total{model="tiny",tenant="other",type="output"}')
    phases = total("stagelens_engine_phase_duration_seconds_count")
    requests = total('stagelens_requests_total{code="200",model="tiny"}')  # not /docs
    answered = requests - failed
    if not (output_tokens >= 16 * answered > 0 and phases >= phases_per * answered) or (
        served is not None and requests != served
    ):
        return (
            f"instrumented proxy did not do the full work: {requests} requests"
            f"{'' if served is None else f' of {served}'}, "
            f"{output_tokens} output tokens billed, {phases} engine phases"
        )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]

    import tempfile

    work = write_programs(Path(tempfile.mkdtemp(prefix="stagelens-bench-")))
    up_port, sink_port = free_port(), free_port()
    procs = [serve(work, "bench_upstream", up_port, {}), serve(work, "bench_sink", sink_port, {})]
    results: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    try:
        wait_up(f"http://127.0.0.1:{up_port}/")
        wait_up(f"http://127.0.0.1:{sink_port}/")
        for r in range(args.rounds):
            for variant in variants:
                port = free_port()
                proxy = serve(work, "bench_proxy", port, proxy_env(variant, up_port, sink_port))
                try:
                    wait_up(f"http://127.0.0.1:{port}/docs")
                    rps, p50, cpu = asyncio.run(
                        measure(
                            f"http://127.0.0.1:{port}", args.seconds, args.concurrency, proxy.pid
                        )
                    )
                    if variant in ("stagelens", "metrics", "sdk", "tail"):
                        check_full_work(f"http://127.0.0.1:{port}/metrics")
                finally:
                    proxy.terminate()
                    proxy.wait(10)
                results[variant].append((rps, p50, cpu))
                print(
                    f"round {r + 1}/{args.rounds} {variant:10s} {rps:7.1f} req/s  "
                    f"p50 {p50 * 1000:6.2f} ms  proxy cpu {cpu * 1000:5.2f} ms/req",
                    flush=True,
                )
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)

    base = results.get("bare") or [(1.0, 0.0, 1.0)]
    base_rps = statistics.median(x[0] for x in base)
    base_p50 = statistics.median(x[1] for x in base)
    base_cpu = statistics.median(x[2] for x in base)
    print()
    print(
        f"{'variant':10s} {'req/s':>8s} {'vs bare':>8s} {'p50 ms':>8s} {'added p50':>10s} "
        f"{'cpu ms/req':>11s} {'cpu vs bare':>12s}"
    )
    summary = {}
    for variant in variants:
        rps = statistics.median(x[0] for x in results[variant])
        p50 = statistics.median(x[1] for x in results[variant])
        cpu = statistics.median(x[2] for x in results[variant])
        summary[variant] = {
            "rps": rps,
            "p50_ms": p50 * 1000,
            "ratio": rps / base_rps,
            "added_p50_ms": (p50 - base_p50) * 1000,
            "cpu_ms_per_request": cpu * 1000,
            "cpu_ratio": cpu / base_cpu,
        }
        print(
            f"{variant:10s} {rps:8.1f} {rps / base_rps:8.3f} {p50 * 1000:8.2f} "
            f"{(p50 - base_p50) * 1000:+9.2f} {cpu * 1000:11.3f} {cpu / base_cpu:12.3f}"
        )
    print()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
