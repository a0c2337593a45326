"""The token counting process: a big text's count equals the tokenizer's own, the process
stops with the gateway, and a broken process falls back to counting in-thread."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from stagelens.reference import create_app, demo_config
from stagelens.reference.schema import ChatRequest, parse
from stagelens.reference.token_pool import BIG_TEXT_CHARS
from stagelens.reference.tokens import OffLoop, TokenCounter

pytestmark = pytest.mark.anyio

WORDS = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as",
    "by", "at", "from", "it", "an", "be", "this", "are",
]  # fmt: skip


def _big_text() -> str:
    """About 1.5 times ``BIG_TEXT_CHARS`` of common words (some repeated differently, so a
    count off by a token shows)."""
    words = [WORDS[(i * 7) % len(WORDS)] for i in range(BIG_TEXT_CHARS * 3 // 8)]
    return " ".join(words) + " résumé 東京 🙂"


def _chat(text: str) -> ChatRequest:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}]}
    req, _ = parse(json.dumps(body).encode(), ChatRequest)
    assert isinstance(req, ChatRequest)
    return req


def _reference(tiny_model: Path) -> Any:
    """The model's tokenizer through transformers, as vLLM uses it (not the gateway's)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(tiny_model))


def _workers() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.is_alive()]


class TestPoolCounts:
    async def test_big_texts_count_as_the_tokenizer_does(self, tiny_model: Path) -> None:
        """A big chat and a big plain prompt, counted in the pool, have the tokenizer's own
        counts (chat: rendered, no special tokens added; prompt: special tokens added)."""
        text = _big_text()
        assert len(text) > BIG_TEXT_CHARS
        counter = TokenCounter(str(tiny_model))
        off_loop = OffLoop()
        try:
            chat = await off_loop.run(counter, lambda c: c.count_chat(_chat(text)))
            prompt = await off_loop.run(counter, lambda c: c.count_prompt(text))
            pools = list(off_loop.pools.values())
            assert len(pools) == 1
            assert not pools[0].broken
            assert _workers(), "the big texts were not counted in a worker process"
        finally:
            await off_loop.close()
        reference = _reference(tiny_model)
        messages = [{"role": "user", "content": text}]
        expected_chat = reference.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True
        )
        if not isinstance(expected_chat, list):  # transformers 5 returns a BatchEncoding
            expected_chat = expected_chat["input_ids"]
        assert chat == len(expected_chat)
        assert prompt == len(reference(text).input_ids)
        assert prompt != chat  # the special tokens and the template made a difference

    async def test_gateway_shutdown_stops_the_process(self, tiny_model: Path) -> None:
        """The counting process a big body started exits when the gateway's lifespan ends."""
        app = create_app(demo_config(["http://127.0.0.1:9"], str(tiny_model)))
        gateway = app.state.gateway
        before = {p.pid for p in _workers()}
        async with app.router.lifespan_context(app):
            counter = gateway.tokenizer_for("tiny")
            await gateway.off_loop.run(counter, lambda c: c.count_prompt(_big_text()))
            started = [p for p in _workers() if p.pid not in before]
            assert started, "no counting process started"
        for process in started:
            process.join(timeout=10)
            assert not process.is_alive()

    async def test_broken_pool_falls_back(
        self, tiny_model: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With its process killed, counting goes on in-thread with the same counts, and the
        break is logged once, by type only."""
        text = _big_text()
        counter = TokenCounter(str(tiny_model))
        off_loop = OffLoop()
        try:
            before = {p.pid for p in _workers()}
            first = await off_loop.run(counter, lambda c: c.count_prompt(text))
            (worker,) = [p for p in _workers() if p.pid not in before]
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(timeout=10)
            with caplog.at_level(logging.WARNING, logger="stagelens.reference.token_pool"):
                again = await off_loop.run(counter, lambda c: c.count_prompt(text))
                third = await off_loop.run(counter, lambda c: c.count_prompt(text))
            assert first == again == third
            (pool,) = off_loop.pools.values()
            assert pool.broken
            records = [r for r in caplog.records if r.name == "stagelens.reference.token_pool"]
            assert len(records) == 1
            assert "BrokenProcessPool" in records[0].getMessage()
            assert "résumé" not in records[0].getMessage()
        finally:
            await off_loop.close()
