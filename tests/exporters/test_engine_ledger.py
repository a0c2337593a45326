"""The engine-time split (``stagelens.exporters.engine_ledger``) on scripted engines.

The truth to hold the ledger to is a split that knows every step's members (the scripted
engine in ``_engine_sim`` keeps it; the ledger sees only the totals vLLM reports): on any
run of vLLM's scheduling rules each request's share equals it, and the shares, preempted
work, idle time and what nobody can claim add up to the wall time exactly.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.exporters.engine_ledger import EngineLedger, FinishedWork, StepWork

from tests.exporters._engine_sim import Req, Run, simulate

REL = 1e-9


def _replay(
    run: Run, budget: int | None, *, ring: int = 4096
) -> tuple[EngineLedger, dict[int, float]]:
    ledger = EngineLedger(0.0, token_budget=budget, ring=ring)
    shares: dict[int, float] = {}
    for work, finished, whose in run.steps:
        split = ledger.step(work, finished)
        assert len(split.shares) == len(finished)
        shares.update(zip(whose, split.shares, strict=True))
    return ledger, shares


def _linear(base: float, per_token: float):
    return lambda tokens: base + per_token * tokens


@st.composite
def scripts(draw, *, aborts: bool = False) -> tuple[list[Req], int, tuple[float, float]]:
    """Requests arriving over time (bursts and idle gaps), prompts from one token to
    several token budgets, outputs from one token up; a budget above the requests' count
    (vLLM's ``max_num_batched_tokens`` is at least ``max_num_seqs``)."""
    n = draw(st.integers(1, 12))
    budget = draw(st.integers(n + 1, 400))
    clock = 0.0
    requests = []
    for i in range(n):
        gaps = [0.0, 0.001, 0.04] if aborts else [0.0, 0.0, 0.001, 0.05, 0.5, 3.0]
        clock += draw(st.sampled_from(gaps))
        requests.append(
            Req(
                arrival=clock,
                computed=draw(st.integers(1, 3 * budget)),
                outputs=draw(st.integers(1, 40)),
                reported=not (aborts and i > 0 and draw(st.booleans())),
            )
        )
    if aborts:  # one reported request runs throughout (each step takes 1 ms or more)
        requests[0].outputs = 1_000
    cost = (draw(st.floats(0.001, 0.05)), draw(st.floats(1e-5, 1e-3)))
    return requests, budget, cost


class TestAgainstTheTruth:
    """The ledger's shares are the step-by-step split's, request by request."""

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(script=scripts(), mode=st.sampled_from(["budget", "details"]))
    def test_every_request_gets_its_true_share_and_the_time_is_conserved(self, script, mode):
        """On any run of vLLM's rules, with prompts reported either way, every request's
        share is the split that knows each step's members, and shares plus idle time are
        the wall time, exactly (nothing pending, nothing unattributed)."""
        requests, budget, cost = script
        run = simulate(requests, budget, _linear(*cost), mode=mode)
        ledger, shares = _replay(run, budget)
        assert set(shares) == set(run.shares)
        for i, truth in run.shares.items():
            assert shares[i] == pytest.approx(truth, rel=REL, abs=1e-12), i
        assert ledger.busy == pytest.approx(run.busy, rel=REL)
        assert ledger.idle == pytest.approx(run.idle, rel=REL, abs=1e-12)
        assert ledger.pending_gap == 0
        assert ledger.attributed == pytest.approx(ledger.busy, rel=REL)
        assert ledger.unattributed == pytest.approx(0, abs=1e-9)
        assert ledger.wall() == pytest.approx(run.end, rel=REL)

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(script=scripts())
    def test_without_admissions_reported_the_time_is_still_conserved(self, script):
        """Prefix caching off (no admissions reported): prompts are priced in the step
        that completes them, so shares may move between requests, but none is negative or
        more than its lifetime, and shares plus what nobody can claim are the busy time."""
        requests, budget, cost = script
        run = simulate(requests, budget, _linear(*cost), mode="completions")
        ledger, shares = _replay(run, budget)
        for i, share in shares.items():
            start, end = run.lifetimes[i]
            assert 0 <= share <= end - start + 1e-9
        assert ledger.attributed + ledger.unattributed == pytest.approx(ledger.busy, rel=REL)
        assert ledger.wall() == pytest.approx(run.end, rel=REL)

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(script=scripts(aborts=True), mode=st.sampled_from(["budget", "details"]))
    def test_requests_never_reported_hold_their_share(self, script, mode):
        """Requests whose finish is never reported (aborted) leave exactly their true
        share unclaimed: the others' shares are unchanged."""
        requests, budget, cost = script
        run = simulate(requests, budget, _linear(*cost), mode=mode)
        ledger, shares = _replay(run, budget, ring=20_000)
        held = sum(t for i, t in run.shares.items() if i not in shares)
        for i, share in shares.items():
            assert share == pytest.approx(run.shares[i], rel=REL, abs=1e-12)
        assert ledger.attributed + held == pytest.approx(ledger.busy, rel=REL)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(script=scripts(), jitter=st.floats(0.0, 0.002))
    def test_a_late_frontend_moves_time_between_steps_never_out_of_the_total(self, script, jitter):
        """The stats reach the frontend late by a varying amount: the total stays exact,
        each request's share moves by at most the lag around the steps it ran in."""
        requests, budget, cost = script
        run = simulate(
            requests, budget, _linear(*cost), lag=lambda k: jitter * ((k * 7919) % 13) / 13
        )
        ledger, shares = _replay(run, budget)
        assert ledger.attributed == pytest.approx(ledger.busy, rel=1e-6)
        for i, share in shares.items():
            steps = requests[i].outputs + requests[i].computed // max(budget // 2, 1) + 3
            assert share == pytest.approx(run.shares[i], abs=2 * jitter * steps + 1e-9)


class TestExamples:
    """Small runs worked by hand."""

    def test_a_request_alone_gets_the_engine_and_the_idle_time_is_idle(self):
        """One request after 2 s of idle: prefill 0.1 s and three decode steps of 0.02 s;
        it gets all 0.16 s, the 2 s are idle."""
        ledger = EngineLedger(0.0, token_budget=512)
        ledger.step(StepWork(now=2.1, first_tokens=1, prefill_done=100, prefill_new=100))
        ledger.step(StepWork(now=2.12, decodes=1))
        ledger.step(StepWork(now=2.14, decodes=1))
        split = ledger.step(
            StepWork(now=2.16, decodes=1, idle_after=True),
            [
                FinishedWork(
                    decode_tokens=3, computed_tokens=100, queued=0.0, prefill=0.1, decode=0.06
                )
            ],
        )
        assert split.shares == [pytest.approx(0.16)]
        assert ledger.idle == pytest.approx(2.0)
        assert ledger.busy == pytest.approx(0.16)

    def test_a_request_decoded_alone_costs_more_per_token_than_in_a_full_batch(self):
        """Four requests decoding together share each step four ways; alone, one gets the
        whole step: the same tokens cost four times as much."""
        ledger = EngineLedger(0.0, token_budget=512)
        ledger.step(StepWork(now=0.1, first_tokens=4, prefill_done=40, prefill_new=40))
        for k in range(1, 10):
            ledger.step(StepWork(now=0.1 + 0.02 * k, decodes=4))
        split = ledger.step(
            StepWork(now=0.3, decodes=4, idle_after=True),
            [FinishedWork(10, 10, 0.0, 0.1, 0.2)] * 4,
        )
        batched = split.shares[0]
        alone = EngineLedger(0.0, token_budget=512)
        alone.step(StepWork(now=0.1, first_tokens=1, prefill_done=10, prefill_new=10))
        for k in range(1, 10):
            alone.step(StepWork(now=0.1 + 0.02 * k, decodes=1))
        single = alone.step(
            StepWork(now=0.3, decodes=1, idle_after=True), [FinishedWork(10, 10, 0.0, 0.1, 0.2)]
        ).shares[0]
        assert batched == pytest.approx(0.3 / 4)
        assert single == pytest.approx(0.3)

    def test_twice_the_prompt_in_the_same_step_costs_twice(self):
        """Two prompts computed in one step, 200 and 100 tokens: 2/3 and 1/3 of it."""
        ledger = EngineLedger(0.0, token_budget=512)
        split = ledger.step(
            StepWork(now=0.3, first_tokens=2, prefill_done=300, prefill_new=300, idle_after=True),
            [FinishedWork(0, 200, 0.0, 0.3), FinishedWork(0, 100, 0.0, 0.3)],
        )
        assert split.shares == [pytest.approx(0.2), pytest.approx(0.1)]

    def test_recomputed_tokens_of_a_preempted_request_are_their_own_line(self):
        """A request resumed after preemption recomputes 50 tokens beside 50 decodes: half
        the step is preempted work, claimed by nobody; the resumed request's decode share is
        spread over its lifetime."""
        ledger = EngineLedger(0.0, token_budget=512)
        ledger.step(StepWork(now=0.1, first_tokens=1, prefill_done=10, prefill_new=10))
        ledger.step(StepWork(now=0.2, decodes=1))
        split = ledger.step(StepWork(now=0.3, decodes=50, recompute_new=50))
        assert split.preempted == pytest.approx(0.05)
        done = ledger.step(
            StepWork(now=0.4, decodes=1, idle_after=True),
            [FinishedWork(3, 10, 0.0, 0.1, 0.3, preempted=True)],
        )
        assert ledger.preempted == pytest.approx(0.05)
        assert 0 < done.shares[0] <= 0.4

    def test_idle_time_is_counted_while_the_engine_waits(self):
        """Ticks count idle time up to the margin before now; the step that ends the idle
        time splits only the rest, when its first request finishes."""
        ledger = EngineLedger(0.0, token_budget=512)
        assert ledger.tick(10.0, margin=5.0) == pytest.approx(5.0)
        assert ledger.tick(12.0, margin=5.0) == pytest.approx(2.0)
        split = ledger.step(
            StepWork(now=13.0, first_tokens=1, prefill_done=10, prefill_new=10, idle_after=True),
            [FinishedWork(0, 10, queued=0.0, prefill=0.25)],
        )
        assert split.shares == [pytest.approx(0.25)]
        assert ledger.idle == pytest.approx(12.75)
        assert ledger.busy == pytest.approx(0.25)
        assert ledger.tick(13.5, margin=5.0) == 0.0

    def test_a_pending_step_nobody_resolves_counts_busy_and_unattributed(self):
        """The requests of the step after idle time never report their finish: when the
        engine idles again the gap counts busy (nothing says how much was idle) and its
        work is unattributed."""
        ledger = EngineLedger(0.0, token_budget=512)
        ledger.step(StepWork(now=1.0, first_tokens=1, prefill_done=10, prefill_new=10))
        ledger.step(StepWork(now=1.1, decodes=1, idle_after=True))
        assert ledger.pending_gap == 0
        assert ledger.busy == pytest.approx(1.1)
        assert ledger.unattributed == pytest.approx(1.0)

    def test_a_decode_longer_than_the_ring_claims_only_the_ring(self):
        """A request that decoded for more steps than the ring holds is priced over the
        steps the ring still has (a ring of 8 steps spans 7 prices back); never more."""
        ledger = EngineLedger(0.0, token_budget=512, ring=8)
        ledger.step(StepWork(now=0.1, first_tokens=1, prefill_done=10, prefill_new=10))
        for k in range(1, 20):
            ledger.step(StepWork(now=0.1 + 0.01 * k, decodes=1))
        split = ledger.step(StepWork(now=0.3, decodes=1), [FinishedWork(20, 10, 0.0, 0.1, 0.2)])
        assert split.shares[0] == pytest.approx(0.01 * 7)


@st.composite
def garbage(draw) -> list[tuple[StepWork, list[FinishedWork]]]:
    """Step reports no engine would send: inconsistent counts, huge claims, time that
    stands still."""
    now = 0.0
    steps = []
    ints = st.integers(0, 10_000)
    for _ in range(draw(st.integers(1, 25))):
        now += draw(st.sampled_from([0.0, 1e-6, 0.01, 1.0]))
        work = StepWork(
            now=now,
            decodes=draw(ints),
            first_tokens=draw(st.integers(0, 5)),
            prefill_done=draw(ints),
            prefill_new=draw(st.none() | ints),
            recompute_new=draw(ints),
            prefill_scheduled=draw(st.none() | ints),
            idle_after=draw(st.booleans()),
        )
        finished = draw(
            st.lists(
                st.builds(
                    FinishedWork,
                    decode_tokens=ints,
                    computed_tokens=ints,
                    queued=st.floats(0, 10),
                    prefill=st.floats(0, 10),
                    decode=st.floats(0, 10),
                    preempted=st.booleans(),
                    produced=st.booleans(),
                ),
                max_size=4,
            )
        )
        steps.append((work, finished))
    return steps


@settings(max_examples=100, deadline=None)
@given(steps=garbage(), budget=st.none() | st.integers(1, 4096), ring=st.integers(2, 64))
def test_any_report_keeps_the_books_straight(steps, budget, ring):
    """Whatever the reports say, the ledger never raises, no share is negative or more
    than the busy time so far, and busy, idle and the pending gap are the wall time."""
    ledger = EngineLedger(0.0, token_budget=budget, ring=ring)
    for work, finished in steps:
        split = ledger.step(work, finished)
        for share in split.shares:
            assert math.isfinite(share)
            assert 0 <= share <= ledger.busy + 1e-9
        assert ledger.wall() == pytest.approx(work.now, rel=1e-9, abs=1e-9)
        assert min(ledger.busy, ledger.idle, ledger.preempted, ledger.unattributed) >= -1e-9
