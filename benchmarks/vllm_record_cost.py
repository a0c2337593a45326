"""Cost of StageLensStatLogger.record() per call, with stats shaped like vLLM 0.32's.

record() runs on vLLM's output-handling event loop, so it must stay O(1) and cheap. This
prints the median cost per call over several batches for: a scheduler step only, a step
with one finished request, and a step with 8 finished requests (a busy batch).

    .venv/bin/python benchmarks/vllm_record_cost.py
"""

from __future__ import annotations

import statistics
import time

from prometheus_client import CollectorRegistry
from stagelens.instrumentation.vllm import StageLensStatLogger
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
        request_id=f"chatcmpl-{i:032x}-{i:016x}",
        e2e_latency=0.35,
        num_prompt_tokens=600,
        num_generation_tokens=64,
        queued_time=0.001,
        prefill_time=0.02,
        decode_time=0.3,
        num_cached_tokens=512,
    )


def _per_call(logger: StageLensStatLogger, sched: SchedulerStats, it: IterationStats) -> float:
    n = 20_000
    best = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            logger.record(sched, it)
        best.append((time.perf_counter() - t0) / n)
    return statistics.median(best)


def main() -> None:
    logger = StageLensStatLogger(_Config(), 0, registry=CollectorRegistry())
    sched = SchedulerStats(
        num_running_reqs=8,
        num_waiting_reqs=2,
        kv_cache_usage=0.4,
        prefix_cache_stats=PrefixCacheStats(requests=1, queries=600, hits=512),
    )
    print(f"{'case':34s} {'us/call':>8s}")
    for label, finished in (
        ("scheduler step, no finished", 0),
        ("1 finished request", 1),
        ("8 finished requests", 8),
    ):
        it = IterationStats()
        it.finished_requests = [_finished(i) for i in range(finished)]
        print(f"{label:34s} {_per_call(logger, sched, it) * 1e6:8.2f}")


if __name__ == "__main__":
    main()
