"""examples/existing_service: the five-line instrumentation works as its README says."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "existing_service"


def test_five_added_lines_give_traces_and_metrics(upstream, port_factory, tmp_path) -> None:
    """Run the example under uvicorn: streamed answer, stage metrics, spans on the console."""
    port = port_factory()
    log = tmp_path / "service.log"
    env = {
        **os.environ,
        "UPSTREAM_URL": upstream.state.url,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "existing-service",
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "app:app",
                "--app-dir",
                str(EXAMPLE),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny", "stream": True})
        assert r.status_code == 200
        assert r.text.rstrip().endswith("data: [DONE]")
        metrics = httpx.get(f"{base}/metrics").text
        for stage_name in ("gateway", "tokenizer", "inference", "billing"):
            assert (
                f'stagelens_stage_duration_seconds_count{{model="tiny",stage="{stage_name}"}} 1.0'
                in metrics
            ), stage_name
        ttft = 'stagelens_time_to_first_token_seconds_count{model="tiny",prompt_size="1024"} 1.0'
        assert ttft in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    for name in (
        '"name": "chat tiny"',
        '"name": "tokenizer"',
        '"name": "decode"',
        '"name": "POST /v1/chat/completions"',
    ):
        assert name in text, name
    assert '"service.name": "existing-service"' in text


def _code(path: Path) -> list[str]:
    """The file's lines after its module docstring (the docstrings differ on purpose)."""
    text = path.read_text()
    end = text.index('"""', text.index('"""') + 3) + 3
    return text[end:].splitlines()


def test_the_instrumentation_is_five_added_lines_and_nothing_else() -> None:
    """app.py is app_before.py plus at most five added lines, each marked; the README's
    diff shows exactly those lines."""
    before, after = _code(EXAMPLE / "app_before.py"), _code(EXAMPLE / "app.py")
    diff = list(difflib.unified_diff(before, after, lineterm="", n=0))
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    assert removed == []
    assert 1 <= len(added) <= 5
    assert all(line.rstrip().endswith("# stagelens") for line in added)
    readme = (EXAMPLE / "README.md").read_text()
    shown = [
        line[1:].strip()
        for line in readme.split("```diff", 1)[1].split("```", 1)[0].splitlines()
        if line.startswith("+")
    ]
    assert shown == [line.split("  # stagelens")[0].strip() for line in added]


RUNNER = """
import sys, threading
import uvicorn
sys.path.insert(0, sys.argv[1])
from app import app

@app.get("/threads")
async def threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def test_one_trace_per_request_with_fastapis_own_telemetry_asked_for(
    upstream, port_factory, tmp_path
) -> None:
    """The example served as a user would with an OTLP endpoint set and FastAPI's automatic
    telemetry asked for (``FASTAPI_OTEL_AUTO_CONFIGURE=true``): a real OTLP receiver gets
    one trace per request, one SERVER span each with the stage spans under it, no span and
    no metric of FastAPI's, and the service runs no exporter thread beside stagelens' own."""
    from tests._otlp_receiver import otlp_receiver

    (tmp_path / "runner.py").write_text(RUNNER)
    port = port_factory()
    log = tmp_path / "service.log"
    n = 3
    with otlp_receiver() as receiver:
        env = {
            **os.environ,
            "UPSTREAM_URL": upstream.state.url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "FASTAPI_OTEL_AUTO_CONFIGURE": "true",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "existing-service",
            "PYTHONUNBUFFERED": "1",
        }
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, str(tmp_path / "runner.py"), str(EXAMPLE), str(port)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    threads = httpx.get(f"{base}/threads", timeout=1).json()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            for i in range(n):
                body = {"model": "tiny", "stream": i % 2 == 0}
                r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
                assert r.status_code == 200
            time.sleep(0.5)  # FastAPI's metric reader, were there one, exports every 200 ms
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        spans = receiver.spans()
        metric_posts = [p for p, _ in receiver.received if p == "/v1/metrics"]
    assert not [t for t in threads if t.startswith("Otel")], threads  # FastAPI's would be
    assert metric_posts == [], "FastAPI's HTTP metrics were exported"
    traces: dict[str, list[dict]] = {}
    for span in spans:
        traces.setdefault(span["trace_id"], []).append(span)
    chat = [t for t in traces.values() if any(s["name"].startswith("POST") for s in t)]
    assert len(chat) == n, [[s["name"] for s in t] for t in traces.values()]
    for t in traces.values():
        roots = [s for s in t if not s["parent_span_id"]]
        assert len(roots) == 1, [s["name"] for s in t]  # one SERVER span, the root
    for t in chat:
        names = sorted(s["name"] for s in t)
        assert names.count("POST /v1/chat/completions") == 1, names
        for name in ("gateway", "tokenizer", "chat tiny", "billing"):
            assert name in names, names
