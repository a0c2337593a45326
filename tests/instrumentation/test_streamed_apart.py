"""Streamed and non-streamed answers told apart: a non-streamed answer's first body byte is
sent once its whole generation is done, so it goes to its own histogram
(``stagelens_non_streamed_response_seconds``), never to the time to first token, the root
span's first-token attribute or the report's TTFT row. Requests go through an ordinary
instrumented relay to a scripted upstream on a real socket; the client's own clock bounds
each figure. Fails on the code before the split (the non-streamed answer was read as a TTFT).
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest

from stagelens import semconv as sc
from stagelens.testing import TelemetryCapture
from stagelens.views.report import parse_metrics, render_table
from tests._scaffold import event
from tests.instrumentation.test_readings import ROLE, _post, _proxy, content

pytestmark = pytest.mark.anyio

SIZE = {"model": "tiny", "prompt_size": "1024"}


def _count(cap: TelemetryCapture, name: str) -> float:
    return cap.value(f"{name}_count", **SIZE) or 0.0


async def test_a_non_streamed_answer_is_no_first_token(cap: TelemetryCapture, scripted_url) -> None:
    app = _proxy(cap, scripted_url)
    started = time.perf_counter()
    answer = await _post(app, {"stream": False})
    whole = time.perf_counter() - started
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"] == "hi"

    assert _count(cap, sc.NON_STREAMED_RESPONSE) == 1
    assert _count(cap, sc.TIME_TO_FIRST_TOKEN) == 0
    assert cap.value(f"{sc.TIME_TO_FIRST_ANSWER_TOKEN}_count", model="tiny") is None
    seconds = cap.value(f"{sc.NON_STREAMED_RESPONSE}_sum", **SIZE)
    assert seconds is not None
    assert 0 < seconds <= whole  # within the client's own wait
    (root,) = [s for s in cap.spans() if s.parent is None]
    assert sc.ATTR_TTFT not in (root.attributes or {})
    assert sc.ATTR_TTFAT not in (root.attributes or {})
    # The TTFT SLI never counted it (streamed requests only), as before.
    assert cap.value(sc.SLI_REQUESTS, sli=sc.SLI_TTFT, **SIZE) is None


async def test_streamed_and_non_streamed_each_reach_their_own(
    cap: TelemetryCapture, scripted_url
) -> None:
    """One streamed answer after 0.3 s of thinking, three non-streamed ones: the TTFT
    histogram, the span and the report read the stream alone; the report's whole-answer row
    counts the other three."""
    app = _proxy(cap, scripted_url)
    script = [[0, event(ROLE)], [0.3, event(content("a"))], [0.01, event(content("b"))]]
    started = time.perf_counter()
    streamed = await _post(app, {"stream": True, "x_script": script})
    client_wait = time.perf_counter() - started
    assert streamed.status_code == 200
    for _ in range(3):
        assert (await _post(app, {"stream": False})).status_code == 200

    assert _count(cap, sc.TIME_TO_FIRST_TOKEN) == 1
    assert _count(cap, sc.NON_STREAMED_RESPONSE) == 3
    ttft = cap.value(f"{sc.TIME_TO_FIRST_TOKEN}_sum", **SIZE)
    assert ttft is not None
    assert 0.3 <= ttft <= client_wait
    roots = [s for s in cap.spans() if s.parent is None]
    firsts = [r.attributes[sc.ATTR_TTFT] for r in roots if sc.ATTR_TTFT in (r.attributes or {})]
    assert firsts == [pytest.approx(ttft)]

    exposition = generate_latest(cap.registry).decode()
    hists, _ = parse_metrics(exposition)
    assert hists[(sc.TIME_TO_FIRST_TOKEN, "")].count == 1
    assert hists[(sc.NON_STREAMED_RESPONSE, "")].count == 3
    text = render_table(exposition)
    (row,) = [line for line in text.splitlines() if line.startswith("whole answer  ")]
    assert row.split()[-2] == "3"
    (ttft_row,) = [line for line in text.splitlines() if line.startswith("TTFT   ")]
    assert ttft_row.split()[-2] == "1"
