"""A finished request's readings, worked out once at its end from what was recorded on the
way: inter-token gaps, the service level indicators it counts for, and how it was metered.

Pure functions of the request's facts (no I/O, no telemetry): the middleware calls them
in ``_finish`` and records their results; tests call them directly.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import islice
from operator import sub

from stagelens import semconv as sc
from stagelens.request import InferenceFacts, RequestState


def inter_token_gaps(sends: list[float], inference: InferenceFacts) -> list[float]:
    """The gaps between consecutive output-bearing events of each choice, in seconds.

    Each event is timed by the first body the app sent after it arrived (its mark), so a
    gap is what the client was sent: events coalesced into one read, or into one body the
    app wrote, give a gap of 0 each, and every choice of ``n > 1`` has its own gaps (a
    choice's ``k`` output events give ``k - 1`` samples). Events that arrived after the last
    body was sent (the client left) give none.
    """
    gaps: list[float] = []
    sent = len(sends)
    for marks in inference.choices:
        count = bisect_left(marks, sent)  # marks only grow: those past the end are last
        if count < 2:
            continue
        first = marks[0]
        if marks[count - 1] - first == count - 1 and marks[:count] == [
            *range(first, first + count)
        ]:
            # Each event had a body of its own, in turn (a relay: nearly every stream):
            # the gaps are those between consecutive sends, subtracted in C.
            times = sends[first : first + count]
            gaps += map(sub, islice(times, 1, None), times)
        else:
            # A comprehension, not map() over an index lookup: its list index and float
            # subtraction are specialised bytecode, cheaper than a C call per item.
            later = islice(marks, 1, count)
            gaps += [sends[b] - sends[a] for a, b in zip(marks, later, strict=False)]
    return gaps


def failed_after_headers(state: RequestState, code: int, client_gone: bool) -> str | None:
    """``error.type`` when the request was answered with a success status but its latest
    upstream call failed (died mid-stream, sent an error event, ended before its last
    event, or was refused with a 5xx the app did not pass on); None otherwise."""
    inference = state.inference
    if inference is None or inference.failure is None or code >= 400 or client_gone:
        return None
    return inference.failure


def sli_verdicts(
    *,
    streamed: bool,
    code: int,
    server_failed: bool,
    client_gone: bool,
    ttft: float | None,
    waited: float,
    worst_gap: float | None,
    ttft_threshold: float,
    stall_threshold: float,
    client_left_bad_after: float,
    ttfat: float | None = None,
    answer_threshold: float | None = None,
) -> tuple[tuple[str, bool], ...]:
    """(sli, bad) for each SLI that counts the request (``semconv.SLI_*`` say which).

    ``code``: the status the app answered (or would have: 499 when the client left before
    any, 500 when it failed before any), not the ``code`` label. ``server_failed``:
    answered 5xx, or failed after its 200 headers. ``waited``: seconds from receipt to the
    request's end, which for a client gone is when its departure was noticed (the server
    stops working on it then). ``worst_gap``: the longest inter-token gap of a request with
    two or more output events, else None. ``ttft_threshold``: that of the request's
    prompt-size class. ``ttfat``: the time to first answer token, judged against
    ``answer_threshold`` (no ``answer`` verdict without a threshold).

    The rules, and why:

    - availability: a client gone is left out unless it had waited longer than
      ``client_left_bad_after`` (then bad: clients timing out on a hang are an outage the
      server never answered with a 5xx);
    - itl: bad when the worst gap exceeds ``stall_threshold`` (a user sees a freeze, not a
      mean) or the stream failed after its first token;
    - goodput: bad when TTFT or ITL is, or when the stream was cut (failed, client gone)
      after exactly one output event: with one event there is no gap for the stall rule to
      judge, and a first token followed by nothing is no answer;
    - answer: bad when the first answer token (not reasoning) came later than
      ``answer_threshold``, or a stream with output never reached an answer.
    """
    verdicts: list[tuple[str, bool]] = []
    if not client_gone:
        verdicts.append((sc.SLI_AVAILABILITY, server_failed))
    elif waited > client_left_bad_after:
        verdicts.append((sc.SLI_AVAILABILITY, True))
    if not streamed or 400 <= code < 500:
        return tuple(verdicts)
    if answer_threshold is not None:
        answer = _answer_verdict(ttfat, ttft, client_gone, server_failed, waited, answer_threshold)
        if answer is not None:
            verdicts.append((sc.SLI_ANSWER, answer))
    if ttft is not None:
        ttft_bad = ttft > ttft_threshold
    elif client_gone:
        if waited <= ttft_threshold:
            return tuple(verdicts)  # left before the objective was missed: not counted
        ttft_bad = True
    elif server_failed:
        ttft_bad = True  # no first token because the request failed
    else:
        return tuple(verdicts)  # an answer without output: no first token to judge
    verdicts.append((sc.SLI_TTFT, ttft_bad))
    if worst_gap is not None:  # at least two output-bearing events
        itl_bad = server_failed or worst_gap > stall_threshold
        verdicts.append((sc.SLI_ITL, itl_bad))
        verdicts.append((sc.SLI_GOODPUT, ttft_bad or itl_bad))
    else:
        cut = ttft is not None and (server_failed or client_gone)  # after one event
        verdicts.append((sc.SLI_GOODPUT, ttft_bad or cut))
    return tuple(verdicts)


def _answer_verdict(
    ttfat: float | None,
    ttft: float | None,
    client_gone: bool,
    server_failed: bool,
    waited: float,
    threshold: float,
) -> bool | None:
    """Whether a streamed request was bad for the ``answer`` SLI; None when it does not
    count (as for ``ttft``: a client gone before the threshold, an answer with no output).
    A stream with output but no answer (cut, or ended at its token limit, while the model
    was thinking) is bad: the user never got an answer."""
    if ttfat is not None:
        return ttfat > threshold
    if client_gone:
        return True if waited > threshold else None
    if server_failed or ttft is not None:
        return True
    return None


def billing_gap(state: RequestState) -> str | None:
    """``billing`` label value when the server's usage was missing for some call of the
    request and the app gave none itself (``record_usage``), or gave its own estimate
    (``record_usage(estimated=True)``); None when it was metered."""
    inference = state.inference
    if state.usage is not None:
        return sc.BILLING_ESTIMATED if state.usage_estimated and inference else None
    if inference is None:
        return None
    if inference.estimated:
        return sc.BILLING_ESTIMATED
    if inference.unbilled:
        return sc.BILLING_UNBILLED
    return None
