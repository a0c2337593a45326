"""One engine's time, split per finished request, as the vLLM plugin records it.

``EngineTime.record`` turns the stats the stat logger has read (``vllm_stats``) into the
ledger's step (``engine_ledger``), and records what the step added: busy, idle and preempted
seconds by engine, each finished request's share by model and tenant (the tenant the
gateway put in its request id, ``stagelens.engine_join``), and, while the middleware that
answers with it is installed (``vllm_join``), the share under the request's key.

Why a ticker thread: idle time passes without a step, so without one the idle counter
would stand still while the engine waits and jump when the next request comes. A daemon
thread counts it ten times a second, up to ``IDLE_MARGIN_S`` before now (the start of the next
step is only known once its first request finishes). The ledger is shared with vLLM's
output loop under a lock held for the ledger's own work only (no I/O under it).

Cost on vLLM's loop: O(1) per step plus O(log N) per finished request (N: the ring, about
the model's context length in steps); sizing in docs/engine-seconds.md.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import Counter
from stagelens.exporters.engine_ledger import EngineLedger, FinishedWork, StepWork
from stagelens.exporters.vllm_join import RECENT, RecentShares
from stagelens.exporters.vllm_metrics import EngineMetrics
from stagelens.exporters.vllm_stats import FinishedRequest, IterationSample, SchedulerSample

from stagelens import semconv as sc
from stagelens.config import load_settings
from stagelens.engine_join import read_id
from stagelens.metrics.series import FastCounter
from stagelens.tenants import TenantLimiter

IDLE_MARGIN_S: Final = 5.0
"""Idle time is counted up to this long before now (longer than any one engine step)."""
TICK_S: Final = 0.1
"""How often idle time is counted (the error of an idle reading, at most)."""
RING_MIN: Final = 1024
RING_MAX: Final = 1 << 20


def engine_gpus(vllm_config: Any) -> int:
    """GPUs one engine holds: its tensor x pipeline parallel workers on a GPU, else 0."""
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", "")
    if str(device) in ("", "cpu"):
        return 0
    size = getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1)
    return int(size) if isinstance(size, int) and size > 0 else 1


def tenant_limiter() -> TenantLimiter:
    """The tenant label's bound, as the gateway's (``STAGELENS_TENANTS``,
    ``STAGELENS_MAX_TENANTS``): any client may send any request id, so the plugin bounds it
    too. Settings that do not load leave the defaults (the other metrics go on)."""
    try:
        settings = load_settings()
    except Exception:  # a bad STAGELENS_* value is the gateway's to report, not vLLM's
        return TenantLimiter()
    return TenantLimiter(settings.tenants, settings.max_tenants)


def step_work(
    now: float, s: SchedulerSample | None, it: IterationSample | None, prefix_caching: bool
) -> StepWork:
    """The ledger's view of one step from the samples the stat logger read.

    Admitted prompt tokens are the prefix-cache lookups' misses (vLLM records a lookup when
    it admits a request); without prefix caching there is no lookup, so none are reported.
    """
    if s is None:
        admitted: int | None = None if not prefix_caching else 0
        resumed, scheduled, idle_after = 0, None, False
    else:
        admitted = s.prefix_queries - s.prefix_hits if prefix_caching else None
        resumed = s.resumed_queries - s.resumed_hits
        scheduled = s.prefill_tokens
        idle_after = s.running + s.waiting <= 0
    if it is None:
        return StepWork(now, 0, 0, 0, admitted, max(resumed, 0), scheduled, idle_after)
    return StepWork(
        now,
        it.decodes,
        it.first_tokens,
        it.prompt_computed,
        admitted,
        max(resumed, 0),
        scheduled,
        idle_after,
    )


def finished_work(request: FinishedRequest) -> FinishedWork:
    """The ledger's view of one finished request."""
    return FinishedWork(
        decode_tokens=max(request.generation_tokens - 1, 0),
        computed_tokens=max(request.prompt_tokens - request.cached_tokens, 0),
        queued=request.queue,
        prefill=request.prefill,
        decode=request.decode,
        preempted=request.preemptions > 0,
        produced=request.generation_tokens > 0,
    )


class EngineTime:
    """One engine's split: the ledger, its series, and the idle ticker."""

    def __init__(
        self,
        vllm_config: Any,
        metrics: EngineMetrics,
        backend: str,
        model: str,
        *,
        tenants: TenantLimiter | None = None,
        recent: RecentShares = RECENT,
        clock: Callable[[], float] = time.monotonic,
        ticker: bool = True,
    ) -> None:
        scheduler = getattr(vllm_config, "scheduler_config", None)
        budget = getattr(scheduler, "max_num_batched_tokens", None)
        cache = getattr(vllm_config, "cache_config", None)
        self.prefix_caching = bool(getattr(cache, "enable_prefix_caching", False))
        length = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
        ring = length + 64 if isinstance(length, int) and length > 0 else RING_MIN
        self.gpus = engine_gpus(vllm_config)
        self.model = model
        self._clock = clock
        self.ledger = EngineLedger(
            clock(),
            token_budget=budget if isinstance(budget, int) and budget > 0 else None,
            ring=min(max(ring, RING_MIN), RING_MAX),
        )
        self._lock = threading.Lock()
        key = (backend, model)
        # Written through their value (no checks per call): a step writes one or two.
        self._busy = FastCounter(metrics.busy.labels(*key))
        self._idle = FastCounter(metrics.idle.labels(*key))
        self._preempted = FastCounter(metrics.preempted.labels(*key))
        self._by_tenant: Counter | None = metrics.engine_seconds
        self._tenant_series: dict[str, Any] = {}
        self._tenants = tenants if tenants is not None else tenant_limiter()
        self._recent = recent
        self._errors = metrics.errors
        if ticker:
            _start_ticker(self)

    def record(self, s: SchedulerSample | None, it: IterationSample | None) -> None:
        """Account one step (vLLM's output loop)."""
        work = step_work(self._clock(), s, it, self.prefix_caching)
        requests = it.finished if it is not None else []
        finished = [finished_work(r) for r in requests]
        with self._lock:
            split = self.ledger.step(work, finished)
        self._busy.inc(split.busy)  # (a FastCounter drops a zero)
        self._idle.inc(split.idle)
        self._preempted.inc(split.preempted)
        recent = self._recent
        for request, share in zip(requests, split.shares, strict=True):
            found = read_id(request.request_id)
            self._series(found[1] if found is not None else None).inc(share)
            if found is not None and recent.active:
                recent.put(found[0], share, self.gpus)

    def tick(self) -> None:
        """Count idle time while the engine waits (the ticker thread); a failure is counted."""
        try:
            with self._lock:
                credited = self.ledger.tick(self._clock(), IDLE_MARGIN_S)
            if credited:
                self._idle.inc(credited)
        except Exception as exc:
            self._errors.report(sc.COMPONENT_VLLM_PLUGIN, exc, "vLLM plugin: idle time failed")

    def _series(self, tenant: str | None) -> Any:
        label = self._tenants.label(tenant)
        series = self._tenant_series.get(label)
        if series is None:
            series = _NOWHERE
            if self._by_tenant is not None:
                series = FastCounter(self._by_tenant.labels(self.model, label))
            self._tenant_series[label] = series
        return series


class _Nowhere:
    """A series for a counter this registry's gateway owns (the plugin records none)."""

    def inc(self, amount: float = 1.0) -> None:
        return None


_NOWHERE: Final = _Nowhere()

_TICKED: weakref.WeakSet[EngineTime] = weakref.WeakSet()
_TICKER: list[threading.Thread] = []
_TICKER_LOCK = threading.Lock()


def _start_ticker(engine: EngineTime) -> None:
    """One daemon thread ticks every engine of the process (held weakly)."""
    with _TICKER_LOCK:
        _TICKED.add(engine)
        if not _TICKER:
            thread = threading.Thread(target=_tick_forever, name="stagelens-vllm-idle", daemon=True)
            _TICKER.append(thread)
            thread.start()


def _tick_forever() -> None:
    while True:
        time.sleep(TICK_S)
        for engine in list(_TICKED):
            engine.tick()
