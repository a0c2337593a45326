"""A scripted engine for the ledger's tests: it schedules requests by vLLM's rules and
reports each step as vLLM's stats would (totals only), while it keeps what the stats do
not say: which request computed how many tokens in which step, and so each request's true
share (the step's time split by tokens among its members).

vLLM's rules kept here (``vllm/v1/core/sched/scheduler.py``, 0.32): each step first serves
the running requests in the order they were admitted (a decode takes one token, a prompt
not yet computed takes what is left of it, up to the token budget), then admits waiting
requests first come, first served while budget is left (the last one admitted may get only
a part of its prompt); a request gets its first token in the step that computes the end of
its prompt, one more in every later step, and finishes with its last. The step's stats
come when it ends; the engine idles while no request has arrived.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stagelens.exporters.engine_ledger import FinishedWork, StepWork


@dataclass
class Req:
    """One scripted request."""

    arrival: float
    computed: int
    """Prompt tokens to compute (cache hits already taken off)."""
    outputs: int
    """Tokens generated (the first comes from the prefill)."""
    reported: bool = True
    """False: it runs, but its finish is never reported (an abort after its last step)."""
    left: int = 0
    produced: int = 0
    scheduled: float | None = None
    first: float | None = None


@dataclass
class Run:
    """What the scripted engine did: the steps as reported, and the truth."""

    steps: list[tuple[StepWork, list[FinishedWork], list[int]]] = field(default_factory=list)
    """Each step's report, the finishes reported in it, and whose they are (indices)."""
    shares: dict[int, float] = field(default_factory=dict)
    """Each request's true share."""
    busy: float = 0.0
    idle: float = 0.0
    end: float = 0.0
    lifetimes: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Each request's first scheduling and finish times."""


def simulate(
    requests: list[Req],
    budget: int,
    cost: Callable[[int], float],
    *,
    mode: str = "budget",
    lag: Callable[[int], float] = lambda k: 0.0,
) -> Run:
    """Run ``requests`` (sorted by arrival). ``mode``: ``details`` reports each step's
    prompt tokens (vLLM's iteration details), ``budget`` reports admissions (prefix
    caching on), ``completions`` neither. ``lag(k)``: how late step ``k``'s stats arrive."""
    run = Run()
    clock = 0.0
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    waiting: list[int] = []
    running: list[int] = []
    for r in requests:
        r.left = r.computed
    k = 0
    while arrivals or waiting or running:
        while arrivals and requests[arrivals[0]].arrival <= clock:
            waiting.append(arrivals.pop(0))
        if not waiting and not running:
            gap = requests[arrivals[0]].arrival - clock
            run.idle += gap
            clock += gap
            continue
        room = budget
        scheduled: list[tuple[int, int, bool]] = []  # (request, tokens, prefill?)
        for i in running:
            if room <= 0:
                break
            r = requests[i]
            if r.left > 0:
                take = min(r.left, room)
                scheduled.append((i, take, True))
            else:
                take = 1
                scheduled.append((i, take, False))
            room -= take
        admitted = 0
        while waiting and room > 0:
            i = waiting.pop(0)
            r = requests[i]
            r.scheduled = clock
            take = min(r.left, room)
            admitted += r.computed
            scheduled.append((i, take, True))
            running.append(i)
            room -= take
        tokens = sum(take for _, take, _ in scheduled)
        duration = cost(tokens)
        for i, take, _ in scheduled:
            run.shares[i] = run.shares.get(i, 0.0) + duration * take / tokens
        clock += duration
        run.busy += duration
        decodes = first_tokens = prefill_done = prefill_tokens = 0
        finished: list[FinishedWork] = []
        whose: list[int] = []
        for i, take, prefill in scheduled:
            r = requests[i]
            if prefill:
                prefill_tokens += take
                r.left -= take
                if r.left > 0:
                    continue
                r.first = clock
                first_tokens += 1
                prefill_done += r.computed
            else:
                decodes += 1
            r.produced += 1
            if r.produced == r.outputs:
                running.remove(i)
                run.lifetimes[i] = (r.scheduled or 0.0, clock)
                if r.reported:
                    assert r.scheduled is not None
                    assert r.first is not None
                    finished.append(
                        FinishedWork(
                            decode_tokens=r.outputs - 1,
                            computed_tokens=r.computed,
                            queued=r.scheduled - r.arrival,
                            prefill=r.first - r.scheduled,
                            decode=clock - r.first,
                        )
                    )
                    whose.append(i)
        work = StepWork(
            now=clock + lag(k),
            decodes=decodes,
            first_tokens=first_tokens,
            prefill_done=prefill_done,
            prefill_new=None if mode == "completions" else admitted,
            prefill_scheduled=prefill_tokens if mode == "details" else None,
            idle_after=not running and not waiting,
        )
        run.steps.append((work, finished, whose))
        k += 1
    run.end = clock
    return run
