"""Plain data read from vLLM's engine statistics: the one adapter between vLLM and stagelens.

Why one narrow adapter: vLLM's ``SchedulerStats``, ``IterationStats`` and
``FinishedRequestStats`` are explicitly not a stable interface. Everything stagelens needs
from them is read here, by attribute name, with a default when a field is missing; the first
miss of each field logs one warning (naming the vLLM version to check) and never raises, so
an older or newer vLLM degrades to fewer numbers instead of a crashed engine.

No vLLM or exporter import here: the stat logger (``vllm_stat_logger``) consumes these
dataclasses, and tests build them without an engine. It sits with the plugin it serves, not
in the core: no request touches it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("stagelens.vllm")

_warned: set[str] = set()


def _read(obj: Any, name: str, default: Any, where: str) -> Any:
    """``getattr`` that warns once per missing field instead of raising."""
    try:
        return getattr(obj, name)
    except AttributeError:
        key = f"{where}.{name}"
        if key not in _warned:
            _warned.add(key)
            logger.warning(
                "stagelens vLLM plugin: %s has no field %r (vLLM version differs from the "
                "tested 0.32); the metrics that need it are not recorded",
                where,
                name,
            )
        return default


@dataclass(frozen=True, slots=True)
class SchedulerSample:
    """One scheduler step: queue depths, KV-cache use, prefix-cache lookups (of requests
    admitted in the step, and of requests resumed after preemption)."""

    running: int
    waiting: int
    kv_cache_usage: float
    prefix_queries: int
    prefix_hits: int
    resumed_queries: int = 0
    resumed_hits: int = 0
    prefill_tokens: int | None = None
    """Prompt tokens the step ran (vLLM's iteration details, when they are sent)."""


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A finished request's engine phases (seconds) and ids.

    The three engine phases are vLLM's own, on the engine core's clock, and are the same
    figures vLLM serves per response (``queue_time_ms``, ``time_to_first_token_ms``,
    ``generation_time_ms``) and in ``vllm:request_{queue,prefill,decode}_time_seconds``:
    ``queue`` from the engine core queueing the request to its first scheduling,
    ``prefill`` from then to the first token, ``decode`` from the first to the last token.
    ``frontend`` is what vLLM's e2e latency (API-server clock, arrival to the output that
    finished the request) holds beyond those three: prompt rendering and tokenisation,
    the hand-over to the engine core and the last output's way back. ``None`` when the
    stats carry no e2e latency.
    """

    request_id: str | None
    queue: float
    prefill: float
    decode: float
    e2e: float
    frontend: float | None
    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    preemptions: int = 0


@dataclass(slots=True)
class IterationSample:
    """One engine iteration: preemptions, its outputs (decodes, first tokens and the prompt
    tokens of the prefills they complete) and the requests that finished in it."""

    preemptions: int = 0
    finished: list[FinishedRequest] = field(default_factory=list)
    decodes: int = 0
    first_tokens: int = 0
    prompt_computed: int = 0


def read_scheduler(stats: Any) -> SchedulerSample:
    """Read a vLLM ``SchedulerStats``."""
    prefix = _read(stats, "prefix_cache_stats", None, "SchedulerStats")
    details = _read(stats, "iteration_details", None, "SchedulerStats")
    where = "PrefixCacheStats"
    return SchedulerSample(
        running=int(_read(stats, "num_running_reqs", 0, "SchedulerStats")),
        waiting=int(_read(stats, "num_waiting_reqs", 0, "SchedulerStats")),
        kv_cache_usage=float(_read(stats, "kv_cache_usage", 0.0, "SchedulerStats")),
        prefix_queries=int(_read(prefix, "queries", 0, where)) if prefix else 0,
        prefix_hits=int(_read(prefix, "hits", 0, where)) if prefix else 0,
        resumed_queries=int(_read(prefix, "preempted_queries", 0, where)) if prefix else 0,
        resumed_hits=int(_read(prefix, "preempted_hits", 0, where)) if prefix else 0,
        prefill_tokens=(
            None
            if details is None
            else int(_read(details, "num_ctx_tokens", 0, "SchedulerIterationDetails"))
        ),
    )


def read_iteration(stats: Any) -> IterationSample:
    """Read a vLLM ``IterationStats`` and its ``FinishedRequestStats``."""
    prompt = _read(stats, "prompt_token_stats", None, "IterationStats")
    sample = IterationSample(
        preemptions=int(_read(stats, "num_preempted_reqs", 0, "IterationStats")),
        decodes=len(_read(stats, "inter_token_latencies_iter", (), "IterationStats")),
        first_tokens=len(_read(stats, "time_to_first_tokens_iter", (), "IterationStats")),
        prompt_computed=int(_read(prompt, "computed", 0, "PromptTokenStats")) if prompt else 0,
    )
    for finished in _read(stats, "finished_requests", (), "IterationStats"):
        where = "FinishedRequestStats"
        queue = max(float(_read(finished, "queued_time", 0.0, where)), 0.0)
        prefill = max(float(_read(finished, "prefill_time", 0.0, where)), 0.0)
        decode = max(float(_read(finished, "decode_time", 0.0, where)), 0.0)
        e2e = float(_read(finished, "e2e_latency", 0.0, where))
        sample.finished.append(
            FinishedRequest(
                request_id=_read(finished, "request_id", None, where),
                queue=queue,
                prefill=prefill,
                decode=decode,
                e2e=e2e,
                # The two clocks differ (wall vs monotonic), so a step of the wall clock can
                # make the difference slightly negative: clamp rather than record < 0.
                frontend=max(e2e - queue - prefill - decode, 0.0) if e2e > 0 else None,
                prompt_tokens=int(_read(finished, "num_prompt_tokens", 0, where)),
                generation_tokens=int(_read(finished, "num_generation_tokens", 0, where)),
                cached_tokens=int(_read(finished, "num_cached_tokens", 0, where)),
                preemptions=int(_read(finished, "num_preemptions", 0, where)),
            )
        )
    return sample
