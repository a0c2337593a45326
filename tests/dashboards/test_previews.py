"""The preview renderer: units as Grafana applies them, heatmap buckets de-accumulated, every
dashboard drawn in its own layout from a Prometheus HTTP API."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stagelens.views import previews


class TestUnits:
    @pytest.mark.parametrize(
        ("value", "unit", "text"),
        [
            (0.0123, "s", "12.3 ms"),
            (2.5, "s", "2.5 s"),
            (0.5, "percentunit", "50%"),
            (3 * 2**30, "bytes", "3 GiB"),
            (0.25, "currencyUSD", "$0.25"),
            (1.5, "suffix: USD/h", "1.5 USD/h"),
            (300, "watt", "300 W"),
            (7, "short", "7"),
        ],
    )
    def test_values_read_as_grafana_shows_them(self, value: float, unit: str, text: str) -> None:
        """Seconds, ratios, bytes, dollars and custom suffixes are formatted with their unit."""
        assert previews.format_value(value, unit) == text


def _series(labels: dict[str, str], start: float, end: float, step: float) -> dict[str, Any]:
    n = int((end - start) / step) + 1
    le = labels.get("le")
    base = 1.0 if le is None else (float(le) if le != "+Inf" else 100.0)
    return {"metric": labels, "values": [[start + i * step, str(base + i)] for i in range(n)]}


@contextmanager
def fake_prometheus() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server answering every query with a few series (heatmap queries with `le`
    buckets); records the queries it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            params = dict(urllib.parse.parse_qsl(url.query))
            expr = params["query"]
            asked.append(expr)
            buckets = "sum by (le)" in expr
            sets = (
                [{"le": le} for le in ("0.1", "0.5", "1.0", "+Inf")]
                if buckets
                else [{"model": "tiny", "stage": "gateway", "tenant": "acme"}]
            )
            if url.path.endswith("query_range"):
                start, end, step = (float(params[k]) for k in ("start", "end", "step"))
                result = [_series(s, start, end, step) for s in sets]
            else:
                result = [{"metric": s, "value": [0, "0.5"]} for s in sets]
            body = json.dumps({"status": "success", "data": {"result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


class TestRender:
    def test_every_dashboard_is_drawn(self, tmp_path: Path) -> None:
        """Each dashboard becomes one PNG, every panel query asked once, variables replaced."""
        pytest.importorskip("matplotlib")
        with fake_prometheus() as (url, asked):
            paths = previews.render_previews(url, tmp_path, minutes=15, end=1_800_000_000.0)
        assert [p.name for p in paths] == [
            f.replace(".json", ".png") for f in previews.DASHBOARD_FILES
        ]
        assert all(p.stat().st_size > 20_000 for p in paths)
        assert asked
        assert not [q for q in asked if "$__" in q or "$model" in q or "$cluster" in q]
