"""What the real-stack benchmarks share: a free loopback port and the tiny vLLM they run on
(``fuzz_gateway``, ``disconnect_storm``, ``sizing``)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def tiny_vllm(url: str | None) -> Iterator[tuple[str, str]]:
    """(base URL, tokenizer directory) of a running vLLM: the given one, or a fresh tiny one
    (generated locally, served as ``tiny`` and ``tiny-chat``), stopped on exit."""
    from stagelens.reference.tinymodel import ensure_tiny_model

    model = str(ensure_tiny_model())
    if url is not None:
        yield url, model
        return
    from stagelens.reference.vllm_server import VllmServer

    server = VllmServer(model=model, port=free_port(), served_model_names=("tiny", "tiny-chat"))
    server.start()
    try:
        server.wait_ready(timeout=900)
        yield server.base_url, model
    finally:
        server.stop()
