"""``stagelens report --html``: the page from a real gateway over real vLLM, its figures
against the client's own readings and the spans, then drawn by a real headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from stagelens.reference import GatewayConfig, create_app
from stagelens.reference.app import metrics_app
from stagelens.reference.demo_traces import ENDPOINT_ENV, DemoTraces

from stagelens import configure
from stagelens.cli import main
from stagelens.pricing import PriceTable, Usage
from tests._html_page import PageParts

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".cache" / "test-artifacts"
KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
CANARY = "okapi-canary-91c4"


def _traffic(url: str) -> tuple[dict[str, Usage], int, int, int]:
    """Streamed and plain requests for two tenants; the usage vLLM reported to the client
    per tenant, the number of successful answers, of the streamed ones those carrying
    generated text as the client read them (the tiny model samples: an answer may end
    before any text, and has no first token then), and the number of whole (non-streamed)
    answers."""
    usage = {tenant: Usage() for tenant in KEYS.values()}
    answered = with_text = whole = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(6):
            key = list(KEYS)[i % 2]
            body: dict[str, Any] = {
                "model": "tiny",
                "max_tokens": 8 + 4 * i,
                "messages": [{"role": "user", "content": f"{CANARY} question {i}"}],
            }
            headers = {"authorization": f"Bearer {key}"}
            if i % 3 == 0:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
                text = client.post("/v1/chat/completions", json=body, headers=headers).text
                events = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]
                got = events[-1]["usage"]
                said = "".join(
                    c["delta"].get("content") or "" for e in events for c in e["choices"]
                )
                with_text += bool(said)
            else:
                answer = client.post("/v1/chat/completions", json=body, headers=headers).json()
                got = answer["usage"]
                whole += 1
            answered += 1
            cached = (got.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            before = usage[KEYS[key]]
            usage[KEYS[key]] = Usage(
                before.input_tokens + got["prompt_tokens"],
                before.output_tokens + got["completion_tokens"],
                before.cached_input_tokens + cached,
            )
    return usage, answered, with_text, whole


@pytest.fixture(scope="module")
def report(vllm_server, tiny_model, serve_app, otlp_sink, tmp_path_factory) -> dict[str, Any]:
    """Traffic through the reference gateway, spans to a sink standing for a collector and
    to the demo's receiver, then ``stagelens report --html`` as a user runs it."""
    config = GatewayConfig.model_validate(
        {
            "api_keys": KEYS,
            "models": {"tiny": {"backends": [vllm_server.base_url], "tokenizer": str(tiny_model)}},
        }
    )
    out = tmp_path_factory.mktemp("report") / "report.html"
    with pytest.MonkeyPatch.context() as env:
        for name in (*ENDPOINT_ENV, "OTEL_TRACES_EXPORTER"):
            env.delenv(name, raising=False)
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_sink.endpoint)
        traces = DemoTraces.start(0)
    telemetry = configure(
        span_exporters=traces.exporters, registry=CollectorRegistry(), set_global=False, gpu=False
    )
    try:
        app = create_app(config, telemetry=telemetry)
        with serve_app(app) as url, serve_app(metrics_app(app)) as metrics_url:
            usage, answered, with_text, whole = _traffic(url)
            traces.wait_for(telemetry, answered)
            code = main(
                [
                    "report",
                    "--metrics-url",
                    f"{metrics_url}/metrics",
                    "--html",
                    str(out),
                    "--traces",
                    traces.receiver.url,
                ]
            )
    finally:
        telemetry.shutdown()
        traces.stop()
    assert code == 0
    parsed = PageParts()
    text = out.read_text()
    parsed.feed(text)
    return {
        "path": out,
        "text": text,
        "page": parsed,
        "usage": usage,
        "answered": answered,
        "with_text": with_text,
        "whole": whole,
        "spans": otlp_sink.by_trace(),
    }


class TestReportPage:
    """The page's figures, each against a reading stagelens did not make."""

    def test_page_is_self_contained(self, report) -> None:
        """No script, no stylesheet link, no image or frame, no attribute naming a URL."""
        tags = report["page"].tags
        assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe", "object")]
        for tag, attrs in tags:
            for name, value in attrs.items():
                if tag == "svg" and name == "xmlns":
                    continue  # a namespace name, never fetched
                assert name not in ("src", "href", "srcset", "action"), (tag, name)
                assert "url(" not in (value or ""), (tag, name)
        assert "url(" not in report["text"]
        assert "@import" not in report["text"]

    def test_tokens_and_cost_by_tenant_equal_vllms_usage(self, report) -> None:
        """Each tenant's row: the tokens vLLM reported to the client, and their price."""
        rows = {r[0]: r for r in report["page"].rows if r and r[0] in KEYS.values()}
        assert set(rows) == set(KEYS.values())
        for tenant, usage in report["usage"].items():
            row = rows[tenant]
            numbers = [int(cell.replace(",", "")) for cell in row[1:4]]
            assert numbers == [usage.input_tokens, usage.cached_input_tokens, usage.output_tokens]
            cost = float(row[4].lstrip("$").replace(",", ""))
            assert cost == pytest.approx(PriceTable.default().cost("tiny", usage), abs=5e-7)

    def test_stage_table_and_ttft_count_every_answer(self, report) -> None:
        """Seven stage rows each counting every request; the TTFT bars add up to the
        streamed answers that carried generated text, as the client read them, and the
        whole-answer bars to the non-streamed answers."""
        rows = {r[0]: r for r in report["page"].rows if r}
        stages = (
            "gateway",
            "load_balancer",
            "tokenizer",
            "router",
            "inference",
            "postprocess",
            "billing",
        )
        count = rows["stage"].index("count")  # the header row names the column
        for stage in stages:
            assert int(rows[stage][count].replace(",", "")) == report["answered"], stage
            # each row says how far its p50/p95 may be from the exact figure
            assert rows[stage][-1] == "exact" or rows[stage][-1].startswith("±"), stage
        ttft_bars = [t for svg, t in report["page"].titles if svg == "TTFT"]
        assert sum(float(t.rsplit(":", 1)[1]) for t in ttft_bars) == report["with_text"]
        whole_bars = [t for svg, t in report["page"].titles if svg == "whole answer"]
        assert sum(float(t.rsplit(":", 1)[1]) for t in whole_bars) == report["whole"] > 0
        assert [t for svg, t in report["page"].titles if svg == "inter-token latency"]

    def test_waterfall_is_the_slowest_trace_with_its_spans_times(self, report) -> None:
        """The drawn trace is the longest the sink received; each bar carries its span's
        own start and end, to the µs, from the trace's first span."""
        traces = report["spans"]

        def extent(spans: list[Any]) -> int:
            return max(s.end_time_unix_nano for s in spans) - min(
                s.start_time_unix_nano for s in spans
            )

        slowest = max(traces, key=lambda t: extent(traces[t]))
        assert f"trace {slowest} " in report["text"]
        spans = traces[slowest]
        origin = min(s.start_time_unix_nano for s in spans)
        bars = sorted(
            (float(a["data-start-ms"]), float(a["data-end-ms"]))
            for tag, a in report["page"].tags
            if tag == "rect" and "data-start-ms" in a
        )
        want = sorted(
            ((s.start_time_unix_nano - origin) / 1e6, (s.end_time_unix_nano - origin) / 1e6)
            for s in spans
        )
        assert len(bars) == len(want) >= 11
        half_a_microsecond = 0.0005 + 1e-9  # printed to the µs; a float's last bit aside
        for (start, end), (want_start, want_end) in zip(bars, want, strict=True):
            assert abs(start - want_start) <= half_a_microsecond
            assert abs(end - want_end) <= half_a_microsecond

    def test_no_prompt_text_on_the_page(self, report) -> None:
        """The prompts' canary is nowhere in the page."""
        assert CANARY not in report["text"]


class TestReportInChromium:
    """The page drawn by a real browser."""

    def test_headless_chromium_draws_the_page(self, report, tmp_path) -> None:
        """Chromium renders the file with no network; the screenshot shows the charts'
        colours (the inference bar's red, the distributions' blue) on a white page."""
        browser = shutil.which("chromium")
        if browser is None:
            pytest.skip("chromium is not installed (scripts/setup.sh installs it as root)")
        from matplotlib import image

        shot = ARTIFACTS / "report.png"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot.unlink(missing_ok=True)
        profile = tmp_path / "profile"
        profile.mkdir()
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--hide-scrollbars",
                f"--screenshot={shot}",
                "--window-size=1100,2200",
                report["path"].as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        pixels = image.imread(str(shot))
        assert pixels.shape[:2] == (2200, 1100)
        rgb = (pixels[..., :3] * 255).round().astype(int)
        white = (rgb == 255).all(axis=-1).mean()
        assert 0.5 < white < 0.98

        def share(colour: str) -> float:
            want = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
            return float((abs(rgb - want) <= 2).all(axis=-1).mean())

        assert share("#e15759") > 0.0005  # the inference bar
        assert share("#4e79a7") > 0.0005  # the distribution bars and the gateway swatch
