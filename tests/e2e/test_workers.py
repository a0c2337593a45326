"""A service run the usual way, ``uvicorn svc:app --workers 2`` and gunicorn with two
uvicorn workers, instrumented with the README's lines and nothing else: N requests, then
scrape after scrape of ``/metrics``. With ``PROMETHEUS_MULTIPROC_DIR`` every scrape reads N;
without it, every worker warns and shows ``stagelens_metrics_split_info``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv
from tests._scaffold import free_port

SERVICE = textwrap.dedent(
    """
    import os

    from fastapi import FastAPI
    from prometheus_client import Gauge

    import stagelens

    app = FastAPI()
    telemetry = stagelens.configure()  # the README's lines
    stagelens.instrument_app(app, telemetry=telemetry, metrics_path="/metrics")

    # Test scaffolding: which worker answered a scrape (single-process mode only).
    Gauge("svc_worker_pid", "pid of the worker that answered").set(os.getpid())


    @app.get("/hello")
    async def hello() -> dict:
        return {"pid": os.getpid()}
    """
)

GUNICORN_CONF = textwrap.dedent(
    """
    # As docs/instrumenting.md shows it: prometheus-client forgets a dead worker's live
    # gauges only when told.
    from prometheus_client import multiprocess


    def child_exit(server, worker):
        multiprocess.mark_process_dead(worker.pid)
    """
)

REQUESTS = 40
SCRAPES = 6
START_TIMEOUT = 180.0


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        options = ["--workers", "2", "--host", "127.0.0.1", "--port", str(port)]
    else:
        options = ["-w", "2", "-k", "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{port}"]
        options += ["-c", "gunicorn_conf.py"]
    return [sys.executable, "-m", server, "svc:app", *options, "--log-level", "warning"]


@contextmanager
def serving(server: str, workdir: Path, multiproc: Path | None) -> Iterator[str]:
    """The service under ``server`` with two workers; yields its URL once both answer."""
    (workdir / "svc.py").write_text(SERVICE)
    (workdir / "gunicorn_conf.py").write_text(GUNICORN_CONF)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("STAGELENS_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    env["STAGELENS_GPU_COLLECTOR"] = "0"
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if multiproc is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    port = free_port()
    with (workdir / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            _command(server, port),
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)


def _get(url: str) -> httpx.Response:
    """One request on a connection of its own, so that either worker may accept it."""
    with httpx.Client(timeout=30, headers={"Connection": "close"}) as client:
        return client.get(url)


def _both_workers_answer(url: str) -> list[int]:
    """Ask until two distinct workers have answered; every answer's pid, in order."""
    pids: list[int] = []
    deadline = time.monotonic() + START_TIMEOUT
    while len(set(pids)) < 2:
        assert time.monotonic() < deadline, f"two workers did not answer: {pids}"
        try:
            pids.append(_get(f"{url}/hello").json()["pid"])
        except httpx.TransportError:
            time.sleep(0.2)
    return pids


def _scrape(url: str) -> tuple[float, dict[str, float], dict[str, str] | None]:
    """(requests counted, ``svc_worker_pid`` samples, the split series' labels or None)."""
    text = _get(f"{url}/metrics").text
    counted, pids, split = 0.0, {}, None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == semconv.REQUESTS:
                counted += sample.value
            elif sample.name == "svc_worker_pid":
                pids[str(int(sample.value))] = sample.value
            elif sample.name == semconv.METRICS_SPLIT:
                assert sample.value == 1.0
                split = dict(sample.labels)
    return counted, pids, split


SERVERS = [
    "uvicorn",
    pytest.param(
        "gunicorn",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("gunicorn") is None
            or importlib.util.find_spec("uvicorn_worker") is None,
            reason="gunicorn and uvicorn-worker are not installed (pip install -e .[dev])",
        ),
    ),
]


@pytest.mark.parametrize("server", SERVERS)
def test_with_the_multiprocess_dir_every_scrape_reads_every_request(server, tmp_path) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set (empty) before the start: both workers answer the
    requests, and each of six scrapes reads all of them; nothing is warned."""
    multiproc = tmp_path / "metrics"
    multiproc.mkdir()
    with serving(server, tmp_path, multiproc) as url:
        pids = _both_workers_answer(url)
        pids += [_get(f"{url}/hello").json()["pid"] for _ in range(REQUESTS)]
        scrapes = [_scrape(url) for _ in range(SCRAPES)]
    log = (tmp_path / "server.log").read_text()
    assert len(set(pids)) == 2
    assert [counted for counted, _, _ in scrapes] == [float(len(pids))] * SCRAPES, log
    assert all(split is None for _, _, split in scrapes)
    assert "PROMETHEUS_MULTIPROC_DIR is not set" not in log


@pytest.mark.parametrize("server", SERVERS)
def test_without_it_every_worker_warns_and_shows_the_split(server, tmp_path) -> None:
    """No ``PROMETHEUS_MULTIPROC_DIR``: scrapes answered by each worker read only that
    worker's requests (the two add up to all of them), each carries
    ``stagelens_metrics_split_info{server, workers="2"}``, and each worker logged the
    warning naming the fix once."""
    with serving(server, tmp_path, None) as url:
        pids = _both_workers_answer(url)
        pids += [_get(f"{url}/hello").json()["pid"] for _ in range(REQUESTS)]
        by_worker: dict[str, float] = {}
        splits = []
        deadline = time.monotonic() + 60
        while len(by_worker) < 2 or len(splits) < SCRAPES:
            assert time.monotonic() < deadline, by_worker
            counted, worker, split = _scrape(url)
            (pid,) = worker
            by_worker[pid] = counted
            splits.append(split)
        deadline = time.monotonic() + 30  # a worker alone at start looks again within 10 s
        warned: set[str] = set()
        while len(warned) < 2 and time.monotonic() < deadline:
            log = (tmp_path / "server.log").read_text()
            warned = set(re.findall(r"this process \(pid (\d+)\) is one of 2 workers", log))
            time.sleep(0.5)
    assert set(by_worker) == {str(p) for p in pids}
    assert sum(by_worker.values()) == len(pids)  # each counted only what it answered
    assert all(counted < len(pids) for counted in by_worker.values())
    assert splits == [{semconv.LABEL_SERVER: server, semconv.LABEL_WORKERS: "2"}] * len(splits)
    assert warned == set(by_worker), log
    assert log.count("PROMETHEUS_MULTIPROC_DIR is not set") == 2
