"""Real Prometheus and Alertmanager on loopback for the end-to-end tests, plus a webhook sink.

Why real binaries: the dashboards' PromQL and the alert rules must be proven on the engine
that will run them; Debian's /usr/bin/prometheus and /usr/bin/prometheus-alertmanager start
in about a second with temp storage and one-second scrape/evaluation intervals.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from stagelens.slo import prometheus_server

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def get_json(url: str, timeout: float = 10.0) -> Any:
    """GET ``url`` and decode its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Wait until ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(url)
        time.sleep(0.2)


@dataclass
class WebhookSink:
    """An HTTP server that stores every Alertmanager webhook payload it receives."""

    port: int
    payloads: list[dict[str, Any]] = field(default_factory=list)

    @contextmanager
    def running(self) -> Iterator[WebhookSink]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                sink.payloads.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """Firing alerts named ``name`` received so far."""
        return [
            alert
            for payload in self.payloads
            for alert in payload.get("alerts", [])
            if alert["labels"].get("alertname") == name and alert["status"] == "firing"
        ]


@dataclass
class PromStack:
    """Prometheus (+ Alertmanager) processes and their URLs."""

    prometheus_url: str
    alertmanager_url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises on a PromQL error."""
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = get_json(url)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Range query; raises on a PromQL error."""
        params = {"query": expr, "start": start, "end": end, "step": step}
        url = f"{self.prometheus_url}/api/v1/query_range?" + urllib.parse.urlencode(params)
        try:
            body = get_json(url)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars``: per series, its labels and the exemplars stored
        between ``start`` and ``end``; raises on a PromQL error."""
        params = {"query": expr, "start": start, "end": end}
        url = f"{self.prometheus_url}/api/v1/query_exemplars?" + urllib.parse.urlencode(params)
        try:
            body = get_json(url)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]
        return result


@contextmanager
def prom_stack(
    ports: Sequence[int],
    targets: dict[str, str],
    rule_files: Sequence[Path],
    webhook_url: str,
) -> Iterator[PromStack]:
    """Start Alertmanager and Prometheus (1 s scrape and evaluation, exemplar storage on, as
    ``stagelens.slo.prometheus_server`` says) scraping ``targets``.

    ``ports`` = (prometheus, alertmanager, alertmanager cluster); ``targets`` maps job name to
    ``host:port``. Both processes are killed on exit.
    """
    prom_port, am_port, _ = ports
    with tempfile.TemporaryDirectory(prefix="stagelens-prom-") as tmp:
        root = Path(tmp)
        am_config = {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "severity"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url}]}],
        }
        (root / "am.yml").write_text(yaml.safe_dump(am_config))
        prom_config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in targets.items()
            ],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        am_log = (root / "am.log").open("wb")
        prom_log = (root / "prom.log").open("wb")
        am = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={root / 'am.yml'}",
                f"--storage.path={root / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            stdout=am_log,
            stderr=subprocess.STDOUT,
        )
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                *prometheus_server.FLAGS,
            ],
            stdout=prom_log,
            stderr=subprocess.STDOUT,
        )
        try:
            stack = PromStack(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}")
            wait_http(f"{stack.prometheus_url}/-/ready")
            wait_http(f"{stack.alertmanager_url}/-/ready")
            yield stack
        finally:
            for proc in (prom, am):
                proc.terminate()
            for proc in (prom, am):
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            am_log.close()
            prom_log.close()
