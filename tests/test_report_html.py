"""The HTML page's parts that need no server: escaping, empty figures, trace sources."""

from __future__ import annotations

import argparse
import html.parser

from hypothesis import given, settings
from hypothesis import strategies as st

from stagelens import semconv
from stagelens.views.report_html import read_figures, redact_url, render_page, write_report
from stagelens.views.traces import SpanRecord
from stagelens.views.waterfall import build
from tests._html_page import PageParts

METRICS = """\
# TYPE stagelens_tokens_total counter
stagelens_tokens_total{model="tiny",tenant="<b>acme</b>",type="input"} 10.0
# TYPE stagelens_cost_usd_total counter
stagelens_cost_usd_total{model="tiny",tenant="<b>acme</b>"} 0.5
"""


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _spans(name: str, stage: str) -> list[SpanRecord]:
    root = SpanRecord("a" * 32, "1" * 16, "", name, 0, 1_000_000)
    child = SpanRecord(
        "a" * 32, "2" * 16, "1" * 16, name, 10, 900_000, attributes={semconv.ATTR_STAGE: stage}
    )
    return [root, child]


class TestPage:
    """Untrusted names become text, never markup."""

    @settings(max_examples=200, deadline=None)
    @given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=20))
    def test_span_names_and_labels_are_escaped(self, name, stage) -> None:
        """Whatever a span's name, stage or a tenant label holds, the page has only its own
        tags, and the name is there as text."""
        page = render_page(
            read_figures(METRICS),
            build(_spans(name, stage)),
            metrics_source="http://gw/metrics",
            trace_note="note",
        )
        parsed = _Collect()
        parsed.feed(page)
        allowed = {
            "html",
            "head",
            "meta",
            "title",
            "style",
            "body",
            "h1",
            "h2",
            "p",
            "div",
            "b",
            "span",
            "table",
            "tr",
            "th",
            "td",
            "br",
            "svg",
            "rect",
            "text",
            "line",
        }
        assert set(parsed.tags) <= allowed
        text = "".join(parsed.text)
        assert "<b>acme</b>" in text  # the label value, shown as text
        assert name.replace("\r", "\n").strip() in text.replace("\r", "\n") or not name.strip()

    def test_empty_metrics_and_no_trace(self) -> None:
        """No samples anywhere: the page still renders, saying so."""
        page = render_page(read_figures(""), None, metrics_source="m", trace_note="no trace")
        assert page.count("no samples") >= 2
        assert "no tokens billed yet" in page
        assert "<svg" not in page

    def test_metrics_url_loses_credentials_and_query(self) -> None:
        """A URL with a password or a token in its query is shown without them."""
        assert redact_url("http://u:secret@host:9/metrics?token=x#f") == "http://host:9/metrics"


class TestTraceSources:
    """Where the page's trace comes from."""

    def _args(self, tmp_path, **kw) -> argparse.Namespace:
        base = {
            "html": str(tmp_path / "r.html"),
            "metrics_url": "http://gw/metrics",
            "traces": None,
            "trace_file": None,
            "trace_id": None,
        }
        return argparse.Namespace(**{**base, **kw})

    def test_default_source_not_running_leaves_a_note(
        self, tmp_path, port_factory, monkeypatch
    ) -> None:
        """The demo's receiver not running: the page is written and says why no trace."""
        import stagelens.views.report_html as report_html

        monkeypatch.setattr(
            report_html, "DEFAULT_TRACE_SOURCE", f"http://127.0.0.1:{port_factory()}"
        )
        assert write_report(self._args(tmp_path), METRICS) == 0
        assert "the demo&#x27;s receiver is not running" in (tmp_path / "r.html").read_text()

    def test_explicit_source_that_fails_is_an_error(self, tmp_path, port_factory, capsys) -> None:
        """A --traces URL that does not answer fails the command; no page is written."""
        dead = f"http://127.0.0.1:{port_factory()}"
        assert write_report(self._args(tmp_path, traces=dead), METRICS) == 1
        assert "cannot reach" in capsys.readouterr().err
        assert not (tmp_path / "r.html").exists()

    def test_trace_file_slowest_or_chosen(self, tmp_path) -> None:
        """--trace-file draws its slowest trace, or the one --trace-id names."""
        import json

        from stagelens.views.traces import to_otlp_json

        fast = [SpanRecord("b" * 32, "3" * 16, "", "fast", 0, 10)]
        path = tmp_path / "spans.json"
        path.write_text(json.dumps(to_otlp_json([*_spans("slow", "gateway"), *fast])))
        assert write_report(self._args(tmp_path, trace_file=path), METRICS) == 0
        assert f"trace {'a' * 32}" in (tmp_path / "r.html").read_text()
        args = self._args(tmp_path, trace_file=path, trace_id="b" * 32)
        assert write_report(args, METRICS) == 0
        assert f"trace {'b' * 32}" in (tmp_path / "r.html").read_text()


REASONING_METRICS = """\
# TYPE stagelens_tokens_total counter
stagelens_tokens_total{model="tiny-think",tenant="acme",type="output"} 200.0
stagelens_tokens_total{model="tiny-think",tenant="acme",type="reasoning"} 150.0
stagelens_tokens_total{model="tiny-think",tenant="beta",type="output"} 100.0
stagelens_tokens_total{model="tiny-think",tenant="beta",type="reasoning"} 10.0
stagelens_tokens_total{model="tiny",tenant="acme",type="output"} 500.0
stagelens_tokens_total{model="tiny",tenant="acme",type="reasoning"} 0.0
# TYPE stagelens_time_to_first_answer_token_seconds histogram
stagelens_time_to_first_answer_token_seconds_bucket{model="tiny-think",le="0.5"} 1.0
stagelens_time_to_first_answer_token_seconds_bucket{model="tiny-think",le="1.0"} 4.0
stagelens_time_to_first_answer_token_seconds_bucket{model="tiny-think",le="+Inf"} 4.0
stagelens_time_to_first_answer_token_seconds_sum{model="tiny-think"} 2.5
stagelens_time_to_first_answer_token_seconds_count{model="tiny-think"} 4.0
"""


class TestReasoningShare:
    """The reasoning share per model and tenant, from stagelens_tokens_total."""

    def test_text_and_html_show_the_share_per_model_and_tenant(self) -> None:
        """75 % of acme's output on tiny-think was thinking, 10 % of beta's; tiny (no
        reasoning) has no line; the time to first answer token has its line and chart."""
        from stagelens.views.report import reasoning_shares, render_table

        rows = [(r.model, r.tenant, r.share) for r in reasoning_shares(REASONING_METRICS)]
        assert rows == [("tiny-think", "acme", 0.75), ("tiny-think", "beta", 0.1)]
        table = render_table(REASONING_METRICS)
        acme = next(
            line for line in table.splitlines() if line.startswith("tiny-think") and "acme" in line
        )
        assert acme.split()[-1] == "75.0%"
        assert any(line.startswith("first answer") for line in table.splitlines())
        page = render_page(
            read_figures(REASONING_METRICS),
            None,
            metrics_source="http://gw/metrics",
            trace_note="note",
        )
        assert "Reasoning share by model and tenant" in page
        assert "<td>tiny-think</td><td>acme</td><td>200</td><td>150</td><td>75.0%" in page
        assert 'Time to first answer token</b> <span class="meta">4 samples' in page


ENGINE_METRICS = """\
# TYPE stagelens_tokens_total counter
stagelens_tokens_total{model="tiny",tenant="acme",type="output"} 100.0
stagelens_tokens_total{model="big",tenant="acme",type="output"} 50.0
stagelens_tokens_total{model="tiny",tenant="beta",type="output"} 10.0
stagelens_tokens_total{model="tiny",tenant="gamma",type="output"} 5.0
# TYPE stagelens_cost_usd_total counter
stagelens_cost_usd_total{model="tiny",tenant="acme",backend="a"} 0.3
stagelens_cost_usd_total{model="tiny",tenant="beta",backend="a"} 0.1
# TYPE stagelens_engine_seconds_total counter
stagelens_engine_seconds_total{model="tiny",tenant="acme"} 1.5
stagelens_engine_seconds_total{model="big",tenant="acme"} 0.5
stagelens_engine_seconds_total{model="tiny",tenant="beta"} 6.0
"""


class TestTenantEngineTime:
    """The tenant table shows the engine seconds beside the price table's cost."""

    def test_engine_seconds_per_tenant_summed_over_models_with_their_share(self) -> None:
        """acme's two models add up (2 s of 8, 25 %), beta holds 75 % and comes first (most
        engine time), gamma's engine sent no figure: '-' (not 0, which would be a claim)."""
        page = render_page(
            read_figures(ENGINE_METRICS), None, metrics_source="http://gw/metrics", trace_note=""
        )
        parsed = PageParts()
        parsed.feed(page)
        head = next(r for r in parsed.rows if r and r[0] == "tenant")
        assert head[-2:] == ["engine s", "share of engine time"]
        rows = [r for r in parsed.rows if r and r[0] in ("acme", "beta", "gamma")]
        assert [r[0] for r in rows] == ["beta", "acme", "gamma"]
        assert [r[-2:] for r in rows] == [["6.000", "75.0%"], ["2.000", "25.0%"], ["-", "-"]]
        assert [r[3] for r in rows] == ["10", "150", "5"]
        assert [r[4] for r in rows] == ["$0.100000", "$0.300000", "$0.000000"]
