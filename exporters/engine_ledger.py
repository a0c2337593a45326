"""Each finished request's share of the engine's time, split per engine step by the work it
did in that step, with the engine's idle time and preempted work kept apart.

The rule: every engine step's wall time is divided among the requests it served in
proportion to the tokens each computed in it (a prompt token computed, or one decode
token; a prompt token found in the prefix cache costs nothing), and a request's share is
the sum over its steps. Time with no step running is idle; the time of tokens computed
again for a request resumed after preemption is preempted work. Over any run:

    busy + idle (+ a gap not yet split) = wall time
    busy = shares of finished requests + preempted + unattributed + held

where ``held`` is what the requests still running (or never finished: aborted) occupied.

Why a ledger and not a direct split: vLLM tells its stat loggers each step's totals
(decode outputs, prefills completed with their computed tokens, tokens newly admitted,
whether the engine has work left) but not which requests were in the step; a request's
own facts (its output tokens, computed prompt tokens, engine phase times) come once, when
it finishes. The ledger keeps, per step, the price of one token (the step's time over its
tokens) in a ring, as prefix sums, and when a request finishes reads its share back:

- decode: a running request decodes one token in every step from its first token to its
  last, so its decode steps are the ``decode_tokens`` steps that end with the one it
  finished in, and its decode share is a difference of the prefix sum of prices, O(1);
- prefill: the scheduler computes prompts first come, first served (a partly computed
  prompt goes on before any new one starts), so the prompt tokens computed by the engine
  form one tape, each step pricing its stretch of it; the prefills completed in one step
  own the tape up to where they end, the one among them that began in an earlier step
  (at most one) its first stretch, the others the step's own price: O(log N) to find a
  position on the tape.

Each step's prompt tokens come from vLLM's iteration details when it sends them, else
from the token budget: a step computes the prompt tokens admitted and not yet computed,
up to the budget its decodes leave. Both equal the scheduler's own numbers on any run of
the rules above, and the tests hold the ledger to a split that knows every step's members
(tests/exporters/test_engine_ledger.py). Where vLLM differs from those rules the shares
are approximate: speculative decoding (a decode output counts one token), a request
preempted and resumed (its decode share is spread over its lifetime's steps), a prompt
whose admission was not reported (prefix caching off: prompts are priced in the step that
completes them), and the frontend's clock (the step's stats arrive at the frontend a
little after the step ends; the error moves time between neighbouring steps, never out of
the total).

A step right after idle time has no known start: its gap holds idle time and then the
step. The first request of that step to finish tells how long it ran (its engine queue
and prefill times, on the engine's clock); until then the gap stays pending.

No vLLM or exporter import: the stat logger (``vllm_stat_logger``) reads vLLM's stats into
``StepWork`` / ``FinishedWork`` and hands them here; the work per step is O(1) plus
O(log N) per finished request, with N the ring's size, whatever the history.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

HEAD_FACTOR: Final = 1.5
"""A prefill completed in a step whose prompt was partly computed before is the one whose
engine prefill time exceeds this many times the step's duration (a step that computed an
earlier part ran at least as long as the last one's)."""


class StepWork(NamedTuple):
    """What one engine step did, as the stat logger learns it (totals, no request ids)."""

    now: float
    """When the step's statistics arrived (a monotonic clock, seconds)."""
    decodes: int = 0
    """Decode outputs: the requests that decoded a token in the step."""
    first_tokens: int = 0
    """Prefills completed in the step (requests that got their first token)."""
    prefill_done: int = 0
    """Prompt tokens computed for the prefills completed in the step (their whole prompts,
    earlier steps' parts included; cache hits excluded)."""
    prefill_new: int | None = None
    """Prompt tokens to compute of the requests admitted in the step (prompt minus cache
    hits); None when not reported (prefix caching off)."""
    recompute_new: int = 0
    """Tokens to compute again for requests resumed after preemption, admitted in the step."""
    prefill_scheduled: int | None = None
    """Prompt tokens the scheduler ran in the step (vLLM's iteration details); None when
    not sent."""
    idle_after: bool = False
    """The engine had no request left, running or waiting, after the step."""


class FinishedWork(NamedTuple):
    """One finished request's facts (vLLM's ``FinishedRequestStats``)."""

    decode_tokens: int
    """Output tokens after the first (each one decode step)."""
    computed_tokens: int
    """Prompt tokens computed (prompt minus prefix-cache hits)."""
    queued: float = 0.0
    """Engine seconds from queued to first scheduled."""
    prefill: float = 0.0
    """Engine seconds from first scheduled to the first token."""
    decode: float = 0.0
    """Engine seconds from the first token to the last."""
    preempted: bool = False
    """The request was preempted (and resumed) at least once."""
    produced: bool = True
    """It got at least one token (else it never completed a prefill: nothing to claim)."""


@dataclass(slots=True)
class StepSplit:
    """What one step added to the accounts (seconds)."""

    busy: float = 0.0
    idle: float = 0.0
    preempted: float = 0.0
    shares: list[float] = field(default_factory=list)
    """Each finished request's share, in the order given."""


@dataclass(slots=True)
class _Pending:
    """A step right after idle time: its gap is idle time, then the step."""

    gap: float
    work: float
    recompute: float
    decodes: float
    tape: tuple[float, float]
    """Its stretch of the prompt tape."""
    price: float | None = None
    """Seconds per token, once its duration is known."""


class EngineLedger:
    """The split of one engine's time (see the module docstring). Not thread-safe: one
    caller at a time (the stat logger on vLLM's output loop, its idle ticker under a lock).
    """

    def __init__(self, now: float, *, token_budget: int | None = None, ring: int = 65536) -> None:
        """``now``: the clock when the engine starts (idle until its first step);
        ``token_budget``: vLLM's ``max_num_batched_tokens`` (None: unlimited); ``ring``:
        how many steps back a finishing request may reach (at least its output length)."""
        if ring < 2:
            raise ValueError("ring must hold at least 2 steps")
        self._n = ring
        self._budget = token_budget
        self._k = 0
        """The next step's index."""
        # Per step (ring, by index modulo N): end time, price per token (0 while pending),
        # prefix sum of prices, tape before and after it, tape cost after it (pending
        # steps excluded), completed tape before and after it, prefills completed, and
        # whether the one that began earlier (the group's head) has claimed.
        # Arrays, not lists: 8 bytes a value, not a pointer and a float object each.
        self._t = array("d", bytes(8 * ring))
        self._price = array("d", bytes(8 * ring))
        self._p_sum = array("d", bytes(8 * ring))
        self._tape0 = array("d", bytes(8 * ring))
        self._tape1 = array("d", bytes(8 * ring))
        self._cost1 = array("d", bytes(8 * ring))
        self._done0 = array("d", bytes(8 * ring))
        self._groups = array("q", bytes(8 * ring))
        self._head = bytearray(ring)
        self._pending: dict[int, _Pending] = {}
        self._clock = now
        """Wall time accounted up to here (busy, idle, or a pending gap)."""
        self._idle = True
        self._p_total = 0.0
        self._tape = 0.0
        self._cost = 0.0
        self._done = 0.0
        self._owed = 0.0
        """Prompt tokens admitted, not yet computed."""
        self._owed_again = 0.0
        """Tokens to compute again (preempted requests), admitted, not yet computed."""
        self._carry = 0.0
        """Time of steps with no visible work, given to the next step that has some."""
        self.busy = 0.0
        self.idle = 0.0
        self.preempted = 0.0
        self.attributed = 0.0
        self.unattributed = 0.0
        """Time no finished request can claim any more: steps with no visible work before
        idle time, prompt tokens of requests that never completed their prefill."""

    # -- reading ---------------------------------------------------------------------------
    @property
    def pending_gap(self) -> float:
        """Wall time after idle not yet split into idle and busy (steps awaiting their
        first request's finish)."""
        return sum(p.gap for p in self._pending.values() if p.price is None)

    def wall(self) -> float:
        """Wall time accounted so far: ``busy + idle + pending_gap``."""
        return self.busy + self.idle + self.pending_gap

    def _oldest(self) -> int:
        return max(self._k - self._n, 0)

    # -- idle time -------------------------------------------------------------------------
    def tick(self, now: float, margin: float) -> float:
        """Count idle time up to ``now - margin`` while the engine has no request; return
        the seconds counted. ``margin`` must exceed any one step: a request may already
        be running when the tick comes, and the part of the gap after the last tick is
        split when its step arrives."""
        if not self._idle:
            return 0.0
        upto = now - margin
        if upto <= self._clock:
            return 0.0
        credited = upto - self._clock
        self._clock = upto
        self.idle += credited
        return credited

    # -- a step ----------------------------------------------------------------------------
    def step(self, work: StepWork, finished: Sequence[FinishedWork] = ()) -> StepSplit:
        """Account one step and the requests that finished in it; return what it added.

        The hot path of the split (once per engine step, on vLLM's output loop): plain
        comparisons rather than ``max``, the ring written once per field."""
        out = StepSplit()
        k = self._k
        self._k = k + 1
        slot = k % self._n
        pending_steps = self._pending
        if pending_steps and k - self._n in pending_steps:
            self._expire(pending_steps.pop(k - self._n), out)
        now = work.now
        clock = self._clock
        gap = now - clock if now > clock else 0.0
        if now > clock:
            self._clock = now
        after_idle = self._idle

        decodes = work.decodes if work.decodes > 0 else 0
        budget = self._budget
        room = math.inf if budget is None else (budget - decodes if budget > decodes else 0)
        admitted = work.prefill_new
        if admitted is not None and admitted > 0:
            self._owed += admitted
        again = 0.0
        if work.recompute_new > 0 or self._owed_again:
            self._owed_again += work.recompute_new if work.recompute_new > 0 else 0
            again = self._owed_again if self._owed_again < room else room
            self._owed_again -= again
        scheduled = work.prefill_scheduled
        tape = self._tape
        if scheduled is not None:
            prefill = float(scheduled) if scheduled > 0 else 0.0
        elif admitted is not None:
            left = room - again
            prefill = self._owed if self._owed < left else (left if left > 0 else 0.0)
        else:
            prefill = 0.0
        done0 = self._done
        if work.prefill_done > 0:
            self._done = done0 + work.prefill_done
            if self._done > tape + prefill:  # completions prove the tokens were computed
                prefill = self._done - tape
        if prefill:
            owed = self._owed - prefill
            self._owed = owed if owed > 0 else 0.0
        tokens = decodes + prefill + again

        price = 0.0
        if after_idle:
            if tokens > 0:
                pending_steps[k] = _Pending(gap, tokens, again, decodes, (tape, tape + prefill))
            else:  # nothing visible ran: the gap was idle
                self.idle += gap
                out.idle = gap
        else:
            self.busy += gap
            out.busy = gap
            if tokens > 0:
                price = (gap + self._carry) / tokens
                self._carry = 0.0
                if again:
                    spent = again * price
                    self.preempted += spent
                    out.preempted = spent
            else:
                self._carry += gap

        self._t[slot] = now
        self._price[slot] = price
        self._p_total += price
        self._p_sum[slot] = self._p_total
        self._tape0[slot] = tape
        self._tape = tape + prefill
        self._cost += prefill * price
        self._tape1[slot] = self._tape
        self._cost1[slot] = self._cost
        self._done0[slot] = done0
        self._groups[slot] = work.first_tokens if work.first_tokens > 0 else 0
        self._head[slot] = 0

        if finished:
            shares = out.shares
            for request in finished:
                share = self._claim(k, request, out)
                shares.append(share)
                self.attributed += share

        self._idle = work.idle_after
        if work.idle_after:
            self._settle_idle(out)
        return out

    # -- claims ----------------------------------------------------------------------------
    def _claim(self, e: int, request: FinishedWork, out: StepSplit) -> float:
        """The share of ``request``, finished in step ``e``."""
        if not request.produced:
            return 0.0
        oldest = self._oldest()
        n = self._n
        decodes = max(request.decode_tokens, 0)
        if request.preempted:
            f = max(self._step_at(self._t[e % n] - max(request.decode, 0.0)), oldest)
            span = e - f
            decode = 0.0
            if span > 0:
                whole = self._p_sum[e % n] - self._p_sum[f % n]
                decode = whole * min(decodes, span) / span
        else:
            f = e - decodes
            if f < oldest:  # longer than the ring: its oldest steps are not priced
                f = oldest
            decode = self._p_sum[e % n] - self._p_sum[f % n]
        return max(decode, 0.0) + self._prefill_claim(f, e, request, out)

    def _prefill_claim(self, f: int, e: int, request: FinishedWork, out: StepSplit) -> float:
        """The prompt's share: the request completed its prefill in step ``f``."""
        n = self._n
        slot = f % n
        computed = float(max(request.computed_tokens, 0))
        if computed <= 0 or self._groups[slot] <= 0:
            return 0.0
        before = self._tape0[slot] - self._done0[slot]  # the group's tape before step f
        head = False
        if before > 0 and not self._head[slot]:
            duration = self._duration(f)
            head = self._groups[slot] == 1 or (
                duration is not None and request.prefill > HEAD_FACTOR * duration
            )
        if head:
            self._head[slot] = 1
            start = self._done0[slot]
            return self._tape_cost(start, start + computed, f, request, out)
        start = max(self._tape0[slot], self._done0[slot])
        ours = min(computed, max(self._tape1[slot] - start, 0.0))
        return self._tape_cost(start, start + ours, f, request, out)

    def _duration(self, k: int) -> float | None:
        """Busy seconds of step ``k`` (None: pending, not yet split)."""
        pending = self._pending.get(k)
        if pending is not None:
            return None if pending.price is None else pending.price * pending.work
        if k - 1 < self._oldest():
            return None
        return self._t[k % self._n] - self._t[(k - 1) % self._n]

    def _tape_cost(
        self, a: float, b: float, f: int, request: FinishedWork, out: StepSplit
    ) -> float:
        """The cost of the tape from ``a`` to ``b`` (within the ring), resolving a pending
        step on it with ``request``'s timings: it ran in that step, and its engine queue
        and prefill times run from the step's start to step ``f``'s end."""
        if b <= a:
            return 0.0
        cost = self._cost_at(b) - self._cost_at(a)
        for k, pending in self._pending.items():
            lo, hi = pending.tape
            overlap = min(b, hi) - max(a, lo)
            if overlap <= 0:
                continue
            if pending.price is None:
                ran = (
                    request.queued + request.prefill - (self._t[f % self._n] - self._t[k % self._n])
                )
                self._resolve(pending, min(max(ran, 0.0), pending.gap), out)
            cost += overlap * (pending.price or 0.0)
        return max(cost, 0.0)

    def _cost_at(self, x: float) -> float:
        """Tape cost up to position ``x`` (pending steps excluded), within the ring."""
        lo, hi = self._oldest(), self._k - 1
        if hi < lo:
            return 0.0
        n = self._n
        if x <= self._tape0[lo % n]:
            return self._cost1[lo % n] - self._tape_len(lo) * self._price[lo % n]
        # The last step whose stretch begins before x.
        index = _last_below(self._tape0, n, lo, hi, x, strict=True)
        slot = index % n
        into = min(x, self._tape1[slot]) - self._tape0[slot]
        return self._cost1[slot] - (self._tape_len(index) - into) * self._price[slot]

    def _tape_len(self, k: int) -> float:
        slot = k % self._n
        return self._tape1[slot] - self._tape0[slot]

    def _step_at(self, t: float) -> int:
        """The last step in the ring that ended at or before ``t``."""
        lo, hi = self._oldest(), self._k - 1
        return _last_below(self._t, self._n, lo, hi, t, strict=False)

    # -- pending steps, eviction, idle -----------------------------------------------------
    def _resolve(self, pending: _Pending, ran: float, out: StepSplit) -> None:
        """Split a pending step's gap: ``ran`` seconds busy, the rest idle."""
        pending.price = ran / pending.work if pending.work else 0.0
        self.busy += ran
        self.idle += pending.gap - ran
        out.busy += ran
        out.idle += pending.gap - ran
        spent = pending.recompute * pending.price
        self.preempted += spent
        out.preempted += spent
        # No decode claim reads a pending step's price (nothing decodes right after idle
        # time in vLLM): should one have run, its time is nobody's.
        self.unattributed += pending.decodes * pending.price

    def _expire(self, pending: _Pending, out: StepSplit) -> None:
        """A pending step no request can resolve any more (they never finished): its whole
        gap counts as busy, unattributed (nothing tells how much of it was idle)."""
        if pending.price is None:
            self._resolve(pending, pending.gap, out)
            lo, hi = pending.tape
            self.unattributed += (hi - lo) * (pending.price or 0.0)

    def _settle_idle(self, out: StepSplit) -> None:
        """The engine has no request left: whatever was not claimed can no longer be."""
        for pending in self._pending.values():
            self._expire(pending, out)
        # Every request of the busy period has ended: no claim reaches back past here, so
        # at most one pending step (each busy period's first) is ever kept.
        self._pending.clear()
        if self._tape > self._done:  # prompt tokens of requests that never completed
            self.unattributed += self._cost - self._cost_at(self._done)
            self._done = self._tape
        self.unattributed += self._carry
        self._carry = 0.0
        self._owed = 0.0
        self._owed_again = 0.0


def _last_below(values: array[float], n: int, lo: int, hi: int, x: float, *, strict: bool) -> int:
    """The last index in ``lo..hi`` (``lo`` at least) whose ring value ``values[i % n]`` is
    below ``x`` (``strict``) or at most ``x``; the values are sorted over ``lo..hi``."""
    found = lo
    while lo <= hi:
        mid = (lo + hi) // 2
        value = values[mid % n]
        if value < x or (not strict and value == x):
            found = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return found
