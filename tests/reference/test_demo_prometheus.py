"""The Prometheus the demo describes: the command it prints, run as printed on the
configuration it wrote, is a real Prometheus with exemplar storage on, scraping the
gateway's metrics port and every vLLM backend."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from stagelens.reference.demo_urls import print_prometheus

from tests._promstack import PROMETHEUS, get_json, wait_http

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus missing"),
]

METRICS = "http://127.0.0.1:19464/metrics"
BACKENDS = ["http://127.0.0.1:18000", "http://127.0.0.1:18001"]


def _printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


class TestPrintedPrometheus:
    def test_printed_command_runs_prometheus_with_exemplar_storage_on_this_stack(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], port_factory: Any
    ) -> None:
        """Prometheus started with the printed command line reports exemplar storage among
        its enabled features and scrapes exactly the gateway's metrics and the backends."""
        print_prometheus(tmp_path / "prometheus.yml", METRICS, BACKENDS, workers=1)
        line = next(row for row in _printed(capsys) if row.strip().startswith("Prometheus"))
        argv = shlex.split(line.strip().removeprefix("Prometheus"))
        assert argv[0] == "prometheus"
        port = port_factory()
        url = f"http://127.0.0.1:{port}"
        log = (tmp_path / "prom.log").open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                *argv[1:],
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"{url}/-/ready")
            flags = get_json(f"{url}/api/v1/status/flags")["data"]
            deadline = time.monotonic() + 30
            while not (targets := get_json(f"{url}/api/v1/targets")["data"]["activeTargets"]):
                assert time.monotonic() < deadline, "no target discovered"
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()
        assert "exemplar-storage" in flags["enable-feature"].split(",")
        scraped = {(t["labels"]["job"], t["scrapeUrl"]) for t in targets}
        assert scraped == {
            ("stagelens-gateway", METRICS),
            *(("vllm", f"{backend}/metrics") for backend in BACKENDS),
        }

    def test_several_workers_are_told_exemplars_do_not_come(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """With several workers (prometheus-client's multiprocess mode) the demo says no
        exemplars come; with one it says they do."""
        print_prometheus(tmp_path / "prometheus.yml", METRICS, BACKENDS, workers=2)
        several = "\n".join(_printed(capsys))
        print_prometheus(tmp_path / "prometheus.yml", METRICS, BACKENDS, workers=1)
        one = "\n".join(_printed(capsys))
        assert "no exemplars" in several
        assert "no exemplars" not in one
        assert "exemplars" in one
