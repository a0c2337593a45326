"""A finished request's SLI verdicts, inter-token gaps and billing gap
(``stagelens.instrumentation._outcome``), case by case against the interface agreed with
the alert rules: which requests each SLI counts, and which are bad."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stagelens.instrumentation import _outcome

from stagelens import semconv as sc
from stagelens.request import InferenceFacts

AV, TT, IT, GP = sc.SLI_AVAILABILITY, sc.SLI_TTFT, sc.SLI_ITL, sc.SLI_GOODPUT
SMOOTH = 0.03
"""The worst gap of a smooth stream (well under the 1 s stall threshold)."""


def _verdicts(**given: Any) -> dict[str, bool]:
    request: dict[str, Any] = {
        "streamed": True,
        "code": 200,
        "server_failed": False,
        "client_gone": False,
        "ttft": 0.1,
        "waited": 1.0,
        "worst_gap": SMOOTH,
        "ttft_threshold": 0.5,
        "stall_threshold": 1.0,
        "client_left_bad_after": 10.0,
    }
    request.update(given)
    return dict(_outcome.sli_verdicts(**request))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {AV: False, TT: False, IT: False, GP: False}),
        ({"ttft": 0.6}, {AV: False, TT: True, IT: False, GP: True}),
        ({"ttft": 0.5}, {AV: False, TT: False, IT: False, GP: False}),  # at the threshold: good
        ({"ttft": 0.9, "ttft_threshold": 1.0}, {AV: False, TT: False, IT: False, GP: False}),
        ({"worst_gap": 1.2}, {AV: False, TT: False, IT: True, GP: True}),  # one stall
        ({"worst_gap": 1.0}, {AV: False, TT: False, IT: False, GP: False}),  # at: good
        ({"worst_gap": 0.9}, {AV: False, TT: False, IT: False, GP: False}),  # slow, no stall
        ({"worst_gap": None}, {AV: False, TT: False, GP: False}),  # one event: ITL counts as met
        ({"streamed": False, "worst_gap": None}, {AV: False}),
        ({"code": 429, "ttft": None, "worst_gap": None}, {AV: False}),  # the client's fault
        (
            {"code": 503, "server_failed": True, "ttft": None, "worst_gap": None},
            {AV: True, TT: True, GP: True},
        ),
        # Cut after exactly one output event: no gap to judge, and no answer either.
        ({"server_failed": True, "worst_gap": None}, {AV: True, TT: False, GP: True}),
        ({"client_gone": True, "worst_gap": None}, {TT: False, GP: True}),
        ({"server_failed": True}, {AV: True, TT: False, IT: True, GP: True}),
        ({"client_gone": True, "ttft": None, "waited": 0.2, "worst_gap": None}, {}),
        (
            {"client_gone": True, "ttft": None, "waited": 0.9, "worst_gap": None},
            {TT: True, GP: True},
        ),
        ({"client_gone": True}, {TT: False, IT: False, GP: False}),
        ({"client_gone": True, "waited": 10.5}, {AV: True, TT: False, IT: False, GP: False}),
        ({"client_gone": True, "waited": 10.0}, {TT: False, IT: False, GP: False}),  # at: out
        (
            {"streamed": False, "client_gone": True, "waited": 12.0, "worst_gap": None},
            {AV: True},
        ),
        ({"streamed": False, "client_gone": True, "waited": 0.8, "worst_gap": None}, {}),
        ({"ttft": None, "worst_gap": None}, {AV: False}),  # an answer with no output at all
    ],
    ids=[
        "good",
        "slow-first-token",
        "first-token-at-threshold",
        "first-token-within-its-class-threshold",
        "stall",
        "worst-gap-at-stall-threshold",
        "slow-without-stall",
        "one-output-event",
        "not-streamed",
        "rate-limited",
        "unavailable",
        "failed-after-one-event",
        "client-gone-after-one-event",
        "failed-after-first-token",
        "client-gone-early",
        "client-gone-after-waiting",
        "client-gone-mid-stream",
        "client-gone-after-the-timeout",
        "client-gone-at-the-timeout",
        "not-streamed-client-gone-after-the-timeout",
        "not-streamed-client-gone-early",
        "answer-without-output",
    ],
)
def test_sli_verdicts(given: dict[str, Any], expected: dict[str, bool]) -> None:
    """Each SLI counts the requests the interface says, bad as it says."""
    assert _verdicts(**given) == expected


def _answer(**given: Any) -> bool | None:
    """The ``answer`` verdict (None: not counted), threshold 10 s."""
    base = {"ttfat": given.get("ttft", 0.1), "answer_threshold": 10.0}
    return _verdicts(**{**base, **given}).get(sc.SLI_ANSWER)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, False),  # a model that does not reason: its first token answered
        ({"ttfat": 4.0}, False),  # thought 3.9 s, answered within 10 s
        ({"ttfat": 10.0}, False),  # at the threshold: good
        ({"ttfat": 12.0}, True),
        ({"ttfat": None}, True),  # a first token, never an answer: cut while thinking
        ({"ttfat": None, "server_failed": True}, True),
        ({"ttft": None, "ttfat": None, "server_failed": True, "code": 503}, True),
        ({"ttft": None, "ttfat": None, "client_gone": True, "waited": 3.0}, None),
        ({"ttfat": None, "client_gone": True, "waited": 11.0}, True),
        ({"ttft": None, "ttfat": None}, None),  # an answer with no output at all
        ({"streamed": False}, None),
        ({"code": 429, "ttft": None, "ttfat": None}, None),
        ({"answer_threshold": None}, None),  # no threshold: no verdict
    ],
    ids=[
        "no-reasoning",
        "thought-answered-in-time",
        "answer-at-threshold",
        "slow-answer",
        "no-answer-after-thinking",
        "failed-while-thinking",
        "unavailable",
        "client-gone-early",
        "client-gone-after-waiting",
        "answer-without-output",
        "not-streamed",
        "rate-limited",
        "no-threshold",
    ],
)
def test_answer_verdict(given: dict[str, Any], expected: bool | None) -> None:
    """The ``answer`` SLI counts the ``ttft`` requests, bad when the first answer token
    was late or never came while the request was waited for."""
    assert _answer(**given) is expected


def test_a_stall_among_quick_tokens_is_bad_where_the_mean_was_good() -> None:
    """Issue 26's case: 30 tokens 10 ms apart and one 2 s freeze. The mean gap (~75 ms) is
    under the 100 ms symptom threshold, which judged it good; the worst gap is a stall."""
    gaps = [0.01] * 29 + [2.0]
    assert sum(gaps) / len(gaps) < 0.1
    verdicts = _verdicts(worst_gap=max(gaps))
    assert verdicts[IT] is True
    assert verdicts[GP] is True


def test_gaps_are_per_choice_and_per_event() -> None:
    """Marks point at the bodies sent after each event: events of one read share a body
    (gap 0), each choice has its own gaps, events after the last body give none."""
    sends = [1.0, 1.5, 2.0, 2.25]
    facts = InferenceFacts()
    facts.choices = [[0, 0, 1, 3, 4], [1, 2]]  # choice 0's last event came after the sends
    gaps = _outcome.inter_token_gaps(sends, facts)
    assert gaps == [0.0, 0.5, 0.75, 0.5]


@settings(max_examples=300, deadline=None)
@given(
    sends=st.lists(st.floats(min_value=0, max_value=1e6), max_size=12),
    steps=st.lists(st.lists(st.integers(min_value=0, max_value=2), max_size=12), max_size=3),
    starts=st.lists(st.integers(min_value=0, max_value=14), min_size=3, max_size=3),
)
def test_gaps_are_the_sends_after_consecutive_events(
    sends: list[float], steps: list[list[int]], starts: list[int]
) -> None:
    """Whatever the marks (a relay's consecutive ones, events sharing a body, events after
    the last body), each choice's gaps are the send times after its consecutive events,
    subtracted in order: the definition, written out here index by index."""
    facts = InferenceFacts()
    for start, choice_steps in zip(starts, steps, strict=False):
        marks, at = [], start
        for step in choice_steps:
            marks.append(at)
            at += step
        facts.choices.append(marks)
    want = []
    for marks in facts.choices:
        sent = [m for m in marks if m < len(sends)]
        want += [sends[sent[i + 1]] - sends[sent[i]] for i in range(len(sent) - 1)]
    assert _outcome.inter_token_gaps(sends, facts) == want


def test_billing_gap_is_said_unless_the_app_metered() -> None:
    """An estimate or an unbilled call is said, unless the app recorded usage itself."""
    from stagelens.pricing import Usage
    from stagelens.request import RequestState
    from stagelens.testing import capture_telemetry

    with capture_telemetry() as cap:
        state = RequestState(cap.telemetry, cap.telemetry.tracer.start_span("r"))
        assert _outcome.billing_gap(state) is None
        state.inference = InferenceFacts()
        assert _outcome.billing_gap(state) is None
        state.inference.unbilled = True
        assert _outcome.billing_gap(state) == sc.BILLING_UNBILLED
        state.inference.estimated = True
        assert _outcome.billing_gap(state) == sc.BILLING_ESTIMATED
        state.usage = Usage(input_tokens=1)
        assert _outcome.billing_gap(state) is None
