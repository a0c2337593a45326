"""The demo shows a trace: the reference gateway over real vLLM, spans over real OTLP, and
the waterfall the demo prints checked against the spans a separate receiver decoded."""

from __future__ import annotations

import asyncio
import json
import math
import re
from fractions import Fraction
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from stagelens.reference import create_app, demo_config
from stagelens.reference.config import DEMO_API_KEY
from stagelens.reference.demo import _traffic
from stagelens.reference.demo_traces import ENDPOINT_ENV, DemoTraces

from stagelens import configure, semconv
from stagelens.cli import main
from stagelens.views.waterfall import DEFAULT_BAR_WIDTH

pytestmark = pytest.mark.vllm

STAGES = ("gateway", "load_balancer", "tokenizer", "router", "inference", "postprocess", "billing")
PHASES = ("queue", "prefill", "decode")
ROW = re.compile(
    r"^(?P<label>.+?)\s+(?P<start>-?\d+\.\d{3})\s+(?P<end>-?\d+\.\d{3})\s+(?P<dur>-?\d+\.\d{3})"
    r"\s+(?P<bar>[\u2588\u00b7]{" + str(DEFAULT_BAR_WIDTH) + r"})(?:\s+(?P<note>.*))?$"
)


def _no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENDPOINT_ENV, "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)


GENERATION_ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
"""The routes of the demo's traffic (``_traffic``: chat and the two agent APIs)."""


def _run_demo_traffic(traces: DemoTraces, vllm_server, tiny_model, serve_app, n: int):
    """The demo's own steps: configure() with the demo's exporters, the reference gateway,
    the demo's traffic run, then the demo's printing; returns (trace id, printed lines)."""
    telemetry = configure(
        span_exporters=traces.exporters,
        registry=CollectorRegistry(),
        set_global=False,
        gpu=False,
    )
    app = create_app(demo_config([vllm_server.base_url], str(tiny_model)), telemetry=telemetry)
    printed: list[str] = []
    try:
        with serve_app(app) as url:
            asyncio.run(_traffic(url, DEMO_API_KEY, n, embeddings=False))
            trace_id = traces.print_slowest(telemetry, n, out=printed.append)
    finally:
        telemetry.shutdown()
    return trace_id, "\n".join(printed).splitlines()


def _parse_rows(lines: list[str]) -> list[dict[str, str]]:
    """The waterfall's rows (after its header and column titles), parsed by one regex."""
    start = next(i for i, line in enumerate(lines) if line.startswith("trace "))
    rows = []
    for line in lines[start + 2 :]:
        match = ROW.match(line)
        if match is None:
            break
        rows.append(match.groupdict())
    return rows


def _stage(span: Any) -> str:
    return next((a.value.string_value for a in span.attributes if a.key == semconv.ATTR_STAGE), "")


def _expected_label(span: Any, spans: list[Any]) -> str:
    """The stage first where a stage's top span has another name (``inference (chat tiny)``)."""
    stage = _stage(span)
    parent = next((p for p in spans if p.span_id == span.parent_span_id), None)
    if stage and stage != span.name and (parent is None or _stage(parent) != stage):
        return f"{stage} ({span.name})"
    return span.name


class TestDemoTrace:
    """After its traffic run the demo prints the slowest request as a waterfall."""

    def test_bars_equal_the_spans_a_collector_received(
        self, vllm_server, tiny_model, serve_app, otlp_sink, monkeypatch
    ) -> None:
        """Endpoint configured: spans reach it, and every printed row's start, end and bar
        are that span's own times (to the µs) on the trace's axis; the trace is the slowest."""
        _no_endpoint(monkeypatch)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_sink.endpoint)
        traces = DemoTraces.start()
        try:
            assert traces.endpoint == otlp_sink.endpoint
            assert traces.receiver.url != "http://127.0.0.1:4318"  # 4318 is left to collectors
            trace_id, lines = _run_demo_traffic(traces, vllm_server, tiny_model, serve_app, 8)
            where = "\n".join(traces.where(trace_id))
        finally:
            traces.stop()

        by_trace = otlp_sink.by_trace()
        assert len(by_trace) == 8

        def extent(spans: list[Any]) -> int:
            return max(s.end_time_unix_nano for s in spans) - min(
                s.start_time_unix_nano for s in spans
            )

        assert trace_id == max(by_trace, key=lambda t: extent(by_trace[t]))
        spans = by_trace[trace_id]
        origin = min(s.start_time_unix_nano for s in spans)
        total = extent(spans)
        header = next(line for line in lines if line.startswith("trace "))
        # The demo's traffic speaks chat and the agent APIs: the slowest is any of them.
        route = header.split()[3]
        assert route in GENERATION_ROUTES, header
        assert header.startswith(f"trace {trace_id}  POST {route}  200  ")
        assert abs(float(header.split()[-2]) * 1e6 - total) <= 500

        rows = _parse_rows(lines)
        assert len(rows) == len(spans)
        printed = sorted(
            ((r["label"].strip(), float(r["start"]), r) for r in rows), key=lambda x: x[:2]
        )
        expected = sorted(
            (
                (_expected_label(s, spans), (s.start_time_unix_nano - origin) / 1e6, s)
                for s in spans
            ),
            key=lambda x: x[:2],
        )
        for (label, _, row), (want_label, _, span) in zip(printed, expected, strict=True):
            assert label == want_label
            start_ns = span.start_time_unix_nano - origin
            end_ns = span.end_time_unix_nano - origin
            assert abs(float(row["start"]) * 1e6 - start_ns) <= 500, label
            assert abs(float(row["end"]) * 1e6 - end_ns) <= 500, label
            assert abs(float(row["dur"]) * 1e6 - (end_ns - start_ns)) <= 500, label
            cells = [i for i, c in enumerate(row["bar"]) if c == "\u2588"]
            first = min(DEFAULT_BAR_WIDTH - 1, math.floor(Fraction(start_ns * 48, total)))
            last = max(first + 1, math.ceil(Fraction(end_ns * 48, total)))
            assert cells == list(range(first, last)), label
        labels = {r["label"].strip() for r in rows}
        # vLLM's Messages answers carry no engine timings: no phases under their inference.
        phased = route != "/v1/messages"
        wanted = set(STAGES) | (set(PHASES) if phased else set())
        assert {label.split(" ")[0] for label in labels} >= wanted, "\n".join(lines)
        # Engine phases sit under the inference span, by the spans' own parent ids.
        inference = next(s for s in spans if _expected_label(s, spans).startswith("inference"))
        phases = [s for s in spans if s.name in PHASES]
        assert len(phases) == (3 if phased else 0)
        assert all(s.parent_span_id == inference.span_id for s in phases)
        assert all(r["label"].startswith("    ") for r in rows if r["label"].strip() in PHASES)

        assert f"http://127.0.0.1:16686/trace/{trace_id}" in where
        assert f"/api/traces/{trace_id}" in where
        assert "6006" in where

    def test_no_collector_the_demo_receives_and_cli_shows_any_trace(
        self, vllm_server, tiny_model, serve_app, monkeypatch, capsys
    ) -> None:
        """No OTLP endpoint: the demo's receiver alone gets the spans over OTLP, the demo
        prints the slowest waterfall with the seven stages and the engine phases, and
        ``stagelens trace`` prints the same rows, and any other trace, from the receiver."""
        _no_endpoint(monkeypatch)
        traces = DemoTraces.start(0)
        try:
            assert traces.endpoint is None
            assert len(traces.exporters) == 1  # the local receiver, nothing else
            assert "no OTLP endpoint configured" in traces.describe()
            trace_id, lines = _run_demo_traffic(traces, vllm_server, tiny_model, serve_app, 6)
            assert trace_id is not None
            labels = {r["label"].strip().split(" ")[0] for r in _parse_rows(lines)}
            header = next(line for line in lines if line.startswith("trace "))
            # vLLM's Messages answers carry no engine timings: no phases under their inference.
            phased = header.split()[3] != "/v1/messages"
            assert labels >= set(STAGES) | (set(PHASES) if phased else set()), "\n".join(lines)
            assert any("stagelens trace --list --source" in line for line in lines)

            source = traces.receiver.url
            capsys.readouterr()
            assert main(["trace", trace_id, "--source", source]) == 0
            shown = capsys.readouterr().out.splitlines()
            start = lines.index(shown[0])
            assert shown == lines[start : start + len(shown)]

            assert main(["trace", "--list", "--source", source]) == 0
            listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
            assert len(listed) == 6
            assert listed[0] == trace_id
            other = listed[-1]
            assert main(["trace", other, "--source", source]) == 0
            shown = capsys.readouterr().out
            assert shown.startswith(f"trace {other}  POST /v1/"), shown
            assert shown.split()[3] in GENERATION_ROUTES, shown
        finally:
            traces.stop()

    def test_no_prompt_or_completion_text_reaches_the_receiver(
        self, vllm_server, tiny_model, serve_app, monkeypatch
    ) -> None:
        """Content capture off: nothing of the prompt or the answer is in any span the demo
        received; on, it is (so the check can see it)."""
        _no_endpoint(monkeypatch)
        canary = "zebra-canary-5f3a"
        for capture in (False, True):
            traces = DemoTraces.start(0)
            telemetry = configure(
                span_exporters=traces.exporters,
                registry=CollectorRegistry(),
                set_global=False,
                gpu=False,
                capture_message_content=capture,
            )
            app = create_app(
                demo_config([vllm_server.base_url], str(tiny_model)), telemetry=telemetry
            )
            try:
                with serve_app(app) as url:
                    answer = httpx.post(
                        f"{url}/v1/chat/completions",
                        headers={"authorization": f"Bearer {DEMO_API_KEY}"},
                        json={
                            "model": "tiny",
                            "max_tokens": 8,
                            "messages": [{"role": "user", "content": f"say {canary}"}],
                        },
                        timeout=60,
                    ).json()
                    traces.wait_for(telemetry, 1)
                completion = answer["choices"][0]["message"]["content"]
                # The attribute values themselves, not their repr (which doubles the
                # backslash of a JSON-escaped non-ASCII character).
                stored = "\n".join(
                    f"{key}={value}"
                    for t in traces.receiver.store.summaries()
                    for s in traces.receiver.store.get(t.trace_id)
                    for key, value in s.attributes.items()
                )
            finally:
                telemetry.shutdown()
                traces.stop()
            assert (canary in stored) is capture
            if len(completion.strip()) >= 12:
                forms = (completion, json.dumps(completion)[1:-1])  # as said, as JSON-escaped
                assert any(form in stored for form in forms) is capture
