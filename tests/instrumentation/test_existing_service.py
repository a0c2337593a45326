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
