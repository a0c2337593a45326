"""Cost of StageLensStatLogger.record() per call, with stats shaped like vLLM 0.32's.

record() runs on vLLM's output-handling event loop, so it must stay O(1) and cheap. This
prints the median cost per call over several batches for: a scheduler step only, a step
with one finished request, and a step with 8 finished requests (a busy batch), first with
the Prometheus series only (the default), then with the OTel metrics path on as well
(the real OTLP pipeline, STAGELENS_VLLM_OTLP_METRICS=1; its export interval is set beyond
the run, so this measures recording, which is all record() does: export runs in the
SDK's reader thread). The last column is the Prometheus-only logger without its engine-time
split (``vllm_engine_time``), side by side: what the split costs a step is the difference.

    .venv/bin/python benchmarks/vllm_record_cost.py
"""

from __future__ import annotations

import os
import statistics
import time

from prometheus_client import CollectorRegistry
from stagelens.exporters.vllm_stat_logger import StageLensStatLogger
from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    PrefixCacheStats,
    SchedulerStats,
)


class _Config:
    class model_config:
        served_model_name = "tiny"


def _finished(i: int) -> FinishedRequestStats:
    return FinishedRequestStats(
        finish_reason=None,
        request_id=f"chatcmpl-{i + 1:032x}-{i + 1:016x}~tenant{i % 3}-1a2b3c4d",
        e2e_latency=0.35,
        num_prompt_tokens=600,
        num_generation_tokens=64,
        queued_time=0.001,
        prefill_time=0.02,
        decode_time=0.3,
        num_cached_tokens=512,
    )


def _per_call(
    logger: StageLensStatLogger, sched: SchedulerStats, it: IterationStats
) -> tuple[float, float]:
    """Median seconds per record() call, and (OTel path) the drain thread's seconds per
    queued step. Calls run in chunks of 200 steps (about what queues up between two drains
    on a busy server: 0.5 s of steps), the drain held off while record() is timed, so the
    first figure is what vLLM's event loop pays and the second the extra CPU the process
    spends in the drain thread."""
    chunk, chunks = 200, 100
    otel = logger._otel
    on_loop, off_loop = [], []
    for _ in range(7):
        loop_s = drain_s = 0.0
        for _ in range(chunks):
            if otel is None:
                t0 = time.perf_counter()
                for _ in range(chunk):
                    logger.record(sched, it)
                loop_s += time.perf_counter() - t0
                continue
            with otel.m._drain_lock:  # park the drain thread
                t0 = time.perf_counter()
                for _ in range(chunk):
                    logger.record(sched, it)
                loop_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            otel.m.drain()
            drain_s += time.perf_counter() - t0
        on_loop.append(loop_s / (chunk * chunks))
        off_loop.append(drain_s / (chunk * chunks))
    return statistics.median(on_loop), statistics.median(off_loop)


def main() -> None:
    os.environ.pop("OTEL_METRICS_EXPORTER", None)
    os.environ["STAGELENS_VLLM_OTLP_METRICS"] = "0"
    prometheus_only = StageLensStatLogger(_Config(), 0, registry=CollectorRegistry())
    os.environ["STAGELENS_VLLM_OTLP_METRICS"] = "1"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = "3600000"
    os.environ["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"] = "1"
    with_otel = StageLensStatLogger(_Config(), 0, registry=CollectorRegistry())
    assert with_otel._otel is not None
    assert prometheus_only._otel is None
    os.environ["STAGELENS_VLLM_OTLP_METRICS"] = "0"
    no_split = StageLensStatLogger(_Config(), 0, registry=CollectorRegistry())
    assert prometheus_only._engine_time is not None
    no_split._engine_time = None
    sched = SchedulerStats(
        num_running_reqs=8,
        num_waiting_reqs=2,
        kv_cache_usage=0.4,
        prefix_cache_stats=PrefixCacheStats(requests=1, queries=600, hits=512),
    )
    print(
        f"{'us per call':34s} {'prometheus':>11s} {'+otel loop':>11s} {'otel thread':>12s} "
        f"{'no split':>9s}"
    )
    for label, finished in (
        ("scheduler step, no finished", 0),
        ("1 finished request", 1),
        ("8 finished requests", 8),
    ):
        it = IterationStats()
        it.inter_token_latencies_iter = [0.01] * 8  # eight requests decoding
        it.finished_requests = [_finished(i) for i in range(finished)]
        prom, _ = _per_call(prometheus_only, sched, it)
        loop, thread = _per_call(with_otel, sched, it)
        bare, _ = _per_call(no_split, sched, it)
        print(
            f"{label:34s} {prom * 1e6:11.2f} {loop * 1e6:11.2f} {thread * 1e6:12.2f} "
            f"{bare * 1e6:9.2f}"
        )


if __name__ == "__main__":
    main()
