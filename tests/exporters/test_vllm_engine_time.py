"""The vLLM plugin's engine time: vLLM's own stats objects through the adapter into the
ledger and the series, and the middleware that answers each request with its share.

The stats are vLLM 0.32's classes (``vllm.v1.metrics.stats``) filled as vLLM's output path
fills them; the clock is the test's. The real engine is in TestRealVllm
(tests/e2e/test_engine_seconds_vllm.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry
from stagelens.exporters.vllm_engine_time import EngineTime, engine_gpus
from stagelens.exporters.vllm_join import EngineSecondsMiddleware, RecentShares
from stagelens.exporters.vllm_metrics import EngineMetrics
from stagelens.exporters.vllm_stats import read_iteration, read_scheduler
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from stagelens import engine_join
from stagelens import semconv as sc
from stagelens.tenants import TenantLimiter

stats = pytest.importorskip("vllm.v1.metrics.stats", reason="vLLM is not installed")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _config(budget: int = 256, caching: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=budget),
        cache_config=SimpleNamespace(enable_prefix_caching=caching),
        model_config=SimpleNamespace(max_model_len=2048),
        device_config=SimpleNamespace(device_type="cpu"),
    )


def _scheduler(running: int, waiting: int = 0, queries: int = 0, hits: int = 0):
    prefix = stats.PrefixCacheStats()
    if queries:
        prefix.record(num_tokens=queries, num_hits=hits, preempted=False)
    return stats.SchedulerStats(
        num_running_reqs=running, num_waiting_reqs=waiting, prefix_cache_stats=prefix
    )


def _iteration(decodes: int = 0, first: tuple[int, ...] = (), finished=()):
    it = stats.IterationStats()
    it.inter_token_latencies_iter.extend([0.01] * decodes)
    for computed in first:
        it.time_to_first_tokens_iter.append(0.05)
        prefill = stats.PrefillStats()
        prefill.set(
            num_prompt_tokens=computed, num_local_cached_tokens=0, num_external_cached_tokens=0
        )
        it.prompt_token_stats.update_from_output(prefill)
    it.finished_requests.extend(finished)
    return it


def _finished(request_id: str, prompt: int, outputs: int, prefill: float, decode: float):
    return stats.FinishedRequestStats(
        finish_reason=None,
        request_id=request_id,
        num_prompt_tokens=prompt,
        num_generation_tokens=outputs,
        queued_time=0.0,
        prefill_time=prefill,
        decode_time=decode,
        e2e_latency=prefill + decode,
    )


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def engine():
    registry = CollectorRegistry()
    clock = Clock()
    recent = RecentShares()
    recent.active = True
    time = EngineTime(
        _config(),
        EngineMetrics(registry),
        "host/engine0",
        "tiny",
        tenants=TenantLimiter(),
        recent=recent,
        clock=clock,
        ticker=False,
    )
    return SimpleNamespace(time=time, clock=clock, registry=registry, recent=recent)


def _step(engine, dt, s, it):
    engine.clock.now += dt
    engine.time.record(
        None if s is None else read_scheduler(s), None if it is None else read_iteration(it)
    )


def test_two_tenants_share_the_engine_by_their_tokens(engine):
    """Two requests, 300 and 100 prompt tokens admitted and computed in one step, then
    decoding side by side: the prompt step splits 3:1, each decode step 1:1; the series by
    tenant hold their shares, busy the steps, idle the wait before, and the shares wait
    under their keys for the middleware."""
    a = engine_join.minted_id(0xA, 0x1, "acme")
    b = engine_join.minted_id(0xB, 0x2, "globex")
    _step(engine, 2.0, _scheduler(2, queries=400), _iteration(first=(300, 100)))
    for _ in range(3):
        _step(engine, 0.02, _scheduler(2), _iteration(decodes=2))
    done = [
        _finished(f"chatcmpl-{a}-1a2b3c4d", 300, 5, prefill=0.2, decode=0.06),
        _finished(f"chatcmpl-{b}-5e6f7a8b", 100, 5, prefill=0.2, decode=0.06),
    ]
    _step(engine, 0.02, _scheduler(0), _iteration(decodes=2, finished=done))
    acme = _value(engine.registry, sc.ENGINE_SECONDS, model="tiny", tenant="acme")
    globex = _value(engine.registry, sc.ENGINE_SECONDS, model="tiny", tenant="globex")
    assert acme == pytest.approx(0.15 + 0.04)
    assert globex == pytest.approx(0.05 + 0.04)
    labels = {"backend": "host/engine0", "model": "tiny"}
    assert _value(engine.registry, sc.ENGINE_BUSY_SECONDS, **labels) == pytest.approx(0.28)
    assert _value(engine.registry, sc.ENGINE_IDLE_SECONDS, **labels) == pytest.approx(1.8)
    assert engine.recent.take(engine_join.read_id(a)[0]) == (pytest.approx(0.19), 0)


def test_idle_time_is_counted_while_the_engine_waits(engine):
    """With no request, ticks count idle time up to a few seconds before now."""
    engine.clock.now += 60
    engine.time.tick()
    labels = {"backend": "host/engine0", "model": "tiny"}
    assert _value(engine.registry, sc.ENGINE_IDLE_SECONDS, **labels) == pytest.approx(55.0)


def test_requests_of_plain_clients_count_as_other(engine):
    """An id stagelens did not mint has no tenant: ``other``; nothing waits for an answer."""
    done = [_finished("chatcmpl-abc", 10, 1, prefill=0.1, decode=0.0)]
    _step(engine, 1.0, _scheduler(0, queries=10), _iteration(first=(10,), finished=done))
    assert _value(
        engine.registry, sc.ENGINE_SECONDS, model="tiny", tenant="other"
    ) == pytest.approx(0.1)
    assert len(engine.recent) == 0


def test_gpus_are_the_engines_workers_on_a_gpu():
    """GPU-seconds need the GPUs an engine holds: tensor x pipeline workers, 0 on CPU."""
    gpu = SimpleNamespace(
        device_config=SimpleNamespace(device_type="cuda"),
        parallel_config=SimpleNamespace(world_size=4),
    )
    assert engine_gpus(gpu) == 4
    assert engine_gpus(_config()) == 0


def _app() -> Starlette:
    async def chat(request):
        if request.query_params.get("stream"):

            async def events():
                yield b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"choices": [{"message": {"content": "hi"}}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def _call(recent: RecentShares, request_id: str | None, stream: bool) -> httpx.Response:
    app = EngineSecondsMiddleware(_app(), recent)
    headers = {} if request_id is None else {"X-Request-Id": request_id}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
        url = "/v1/chat/completions" + ("?stream=1" if stream else "")
        return await client.post(url, json={}, headers=headers)


@pytest.mark.anyio
class TestMiddleware:
    """The answer carries the share of a stagelens request, and nothing else changes."""

    async def test_an_answer_carries_its_share_in_a_header(self):
        recent = RecentShares()
        minted = engine_join.minted_id(1, 2, "acme")
        recent.put(engine_join.read_id(minted)[0], 0.25, 2)
        response = await _call(recent, minted, stream=False)
        assert response.headers[sc.HEADER_ENGINE_SECONDS] == "seconds=0.250000000; gpus=2"
        assert response.json() == {"choices": [{"message": {"content": "hi"}}]}
        assert len(recent) == 0

    async def test_a_stream_carries_its_share_in_a_comment_once_it_finished(self):
        """The comment comes before the first event sent after the share was recorded
        (here: already at the start), between two events."""
        recent = RecentShares()
        minted = engine_join.minted_id(0, 7, None)
        recent.put(engine_join.read_id(minted)[0], 0.5, 0)
        response = await _call(recent, minted, stream=True)
        assert response.content == (
            b": x-stagelens-engine seconds=0.500000000; gpus=0\n\n"
            b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
            b"data: [DONE]\n\n"
        )

    async def test_a_share_recorded_late_still_comes_at_the_end(self):
        """Recorded only when the stream's last event is out (a step whose stats came after
        its outputs): the comment ends the stream."""
        recent = RecentShares()
        minted = engine_join.minted_id(0, 8, None)
        key = engine_join.read_id(minted)[0]

        async def late(scope, receive, send):
            async def sending(message):
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    recent.put(key, 0.75, 1)
                await send(message)

            await _app()(scope, receive, sending)

        transport = httpx.ASGITransport(app=EngineSecondsMiddleware(late, recent))
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
            response = await client.post(
                "/v1/chat/completions?stream=1", json={}, headers={"X-Request-Id": minted}
            )
        assert response.content.endswith(
            b"data: [DONE]\n\n: x-stagelens-engine seconds=0.750000000; gpus=1\n\n"
        )

    @pytest.mark.parametrize("request_id", [None, "my-own-id"])
    @pytest.mark.parametrize("stream", [False, True])
    async def test_other_requests_pass_untouched(self, request_id, stream):
        """No stagelens id, or no figure: the answer is vLLM's, byte for byte."""
        recent = RecentShares()
        plain = await _call(recent, None, stream)
        response = await _call(recent, request_id or engine_join.minted_id(1, 3, None), stream)
        assert response.content == plain.content
        assert sc.HEADER_ENGINE_SECONDS not in response.headers
