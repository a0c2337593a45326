"""The middle stages: tokenizer (context check; the counts are in ``tokens``), router (model
-> pool, admission control) and post-processing (safety check, stop sequences)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from stagelens.reference.balancer import Balancer
from stagelens.reference.config import ModelPool

from stagelens import Rejected


def check_context(prompt_tokens: int, output_tokens: int, window: int, param: str) -> None:
    """400 ``context_length_exceeded`` before any engine work (``param``: the prompt's field)."""
    if prompt_tokens + output_tokens > window:
        raise Rejected(
            400,
            f"This model's maximum context length is {window} tokens; the request has "
            f"{prompt_tokens} prompt tokens and asks for {output_tokens} more.",
            code="context_length_exceeded",
            param=param,
        )


class Pool:
    """A model's backends plus its admission limit."""

    def __init__(self, name: str, config: ModelPool, balancer: Balancer) -> None:
        self.name = name
        self.config = config
        self.balancer = balancer
        self.upstream_model = config.upstream_model or name
        self._slots = asyncio.Semaphore(config.max_inflight)

    async def acquire(self) -> None:
        """Wait (bounded) for an in-flight slot; 503 when the wait times out. Pair with
        :meth:`release`."""
        try:
            if self._slots.locked():  # full: wait, bounded
                await asyncio.wait_for(self._slots.acquire(), self.config.admission_timeout_seconds)
            else:  # a free slot: take it without yielding to the event loop
                await self._slots.acquire()
        except asyncio.TimeoutError as exc:  # on Python 3.10 not the builtin TimeoutError
            raise Rejected(
                503,
                f"Model {self.name!r} is at capacity; try again later.",
                type="server_error",
                code="admission_timeout",
            ) from exc

    def release(self) -> None:
        """Give back the slot taken by :meth:`acquire`."""
        self._slots.release()


class Router:
    """Public model name -> pool."""

    def __init__(self, pools: dict[str, Pool]) -> None:
        self.pools = pools

    def route(self, model: str, task: str) -> Pool:
        """The pool serving ``model`` for ``task`` (``generate`` or ``embed``): 404 for a
        model it does not know, 400 for one served for the other task (an embedding model
        does not chat)."""
        pool = self.pools.get(model)
        if pool is None:
            raise Rejected(
                404, f"The model {model!r} does not exist.", param="model", code="model_not_found"
            )
        if pool.config.task != task:
            what = "embeddings" if task == "embed" else "completions"
            raise Rejected(
                400,
                f"The model {model!r} does not serve {what}.",
                param="model",
                code="model_not_supported",
            )
        return pool


SafetyCheck = Callable[[str], bool]
"""``check(text) -> True`` when the text may be shown."""


def blocklist_classifier(terms: tuple[str, ...]) -> SafetyCheck:
    """The default classifier: withhold text containing a blocked term (case-insensitive)."""
    lowered = tuple(t.lower() for t in terms)
    return lambda text: not any(t in text.lower() for t in lowered)


def apply_stops(text: str, stops: list[str], keep: bool = False) -> tuple[str, bool]:
    """Cut ``text`` at the first stop sequence (after it when ``keep``, as vLLM does with
    ``include_stop_str_in_output``); return (text, stopped)."""
    found = [(i, len(s)) for s in stops if s and (i := text.find(s)) >= 0]
    if not found:
        return text, False
    at, length = min(found)
    return text[: at + length if keep else at], True
