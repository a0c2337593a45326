"""The demo's extra servers, the embedding server and the reasoning model: started once the
chat backends serve, at a lower CPU priority, so that on a small machine the chat backend
starts as fast as alone and the first table shows without waiting for the extras, which
then start beside the running stack. Each is announced when it comes up, and then gets a
short traffic run of its own.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stagelens.reference.vllm_server import VllmServer

BESIDE_NICENESS = 10
"""The extras' niceness: when both want the CPU, a process at 10 gets about a tenth of what
one at 0 gets, so the chat backend starts (and serves the first traffic) nearly as alone."""

EXTRA_REQUESTS = 6
"""Requests in an extra's own traffic run, once it is up."""


@dataclass
class Extra:
    """One extra server: what to call it in messages and the model name it serves."""

    server: VllmServer
    what: str
    model: str
    up: threading.Event = field(default_factory=threading.Event)


class Beside:
    """Starts the extras (``start``) and watches them from a thread until each is up, saying
    so as it comes; stops them on exit. A server that dies is the Supervisor's to restart;
    this only says when each serves."""

    def __init__(self, extras: Sequence[Extra], say: Callable[[str], None]) -> None:
        self.extras = list(extras)
        self._say = say
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="demo-extras", daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> Beside:
        return self

    def start(self) -> None:
        """Start the extras (returns at once) and watch them until each is up."""
        try:
            for extra in self.extras:
                extra.server.start()
        except BaseException:
            self._stop_servers()
            raise
        self._started = time.monotonic()
        if self.extras:
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._stop_servers()

    def _stop_servers(self) -> None:
        for extra in self.extras:
            extra.server.stop()

    def _watch(self) -> None:
        while not self._stopping.wait(1.0):
            waiting = [e for e in self.extras if not e.up.is_set()]
            if not waiting:
                return
            for extra in waiting:
                if extra.server.is_healthy(timeout=1.0):
                    extra.up.set()
                    elapsed = time.monotonic() - self._started
                    self._say(
                        f"{extra.what} is up on {extra.server.base_url} ({extra.model}, "
                        f"{elapsed:.0f}s after it started)"
                    )

    def ready(self) -> list[Extra]:
        """The extras serving now."""
        return [e for e in self.extras if e.up.is_set()]

    def wait_all(self, timeout: float, stopping: threading.Event) -> list[Extra]:
        """Wait until every extra is up, ``timeout`` passed or ``stopping`` is set; the
        extras still down then."""
        deadline = time.monotonic() + timeout
        while not stopping.is_set() and time.monotonic() < deadline:
            if all(e.up.is_set() for e in self.extras):
                break
            stopping.wait(0.5)
        return [e for e in self.extras if not e.up.is_set()]


async def extra_traffic(
    gateway: str, api_key: str, model: str, *, embeddings: bool, prompts: Sequence[str]
) -> None:
    """A few requests to one extra through the gateway: embeddings, or streamed chat to a
    reasoning model with a thinking budget (it thinks, then answers)."""
    import httpx

    rng = random.Random(1)
    headers = {"authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=120) as client:
        for _ in range(EXTRA_REQUESTS):
            content = rng.choice(prompts)
            if embeddings:
                await client.post("/v1/embeddings", json={"model": model, "input": content})
                continue
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 48,
                "stream": True,
                "thinking_token_budget": rng.choice((8, 16, 24)),
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                async for _ in answer.aiter_raw():
                    pass


def run_extra_traffic(
    gateway: str, api_key: str, extra: Extra, *, embed_model: str, prompts: Sequence[str]
) -> None:
    """:func:`extra_traffic` for ``extra``, from synchronous code."""
    asyncio.run(
        extra_traffic(
            gateway, api_key, extra.model, embeddings=extra.model == embed_model, prompts=prompts
        )
    )
