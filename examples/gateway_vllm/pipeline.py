"""The middle stages: tokenizer (real token counts, context check), router (model -> pool,
admission control) and post-processing (safety check, stop sequences)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Any

from stagelens.reference.balancer import Balancer
from stagelens.reference.config import ModelPool

from stagelens import Rejected


class TokenCounter:
    """The served model's own tokenizer (loaded once per model directory)."""

    def __init__(self, source: str) -> None:
        transformers: Any = importlib.import_module("transformers")
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        # We count prompts of any length ourselves; silence the "longer than max" warning.
        self._tokenizer.model_max_length = 10**9

    def count_chat(self, messages: list[dict[str, Any]]) -> int:
        ids = self._tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True
        )
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return len(ids)

    def count_text(self, text: str) -> int:
        return len(self._tokenizer(text)["input_ids"])

    def count_generated(self, text: str) -> int:
        """Tokens in generated ``text`` (no special tokens added). Re-tokenizing decoded
        text can differ from the engine's own ids by a token or so at odd byte boundaries;
        it is used only when the engine's usage never arrived (stream cut short)."""
        return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])


def check_context(prompt_tokens: int, output_tokens: int, window: int) -> None:
    """400 ``context_length_exceeded`` before any engine work."""
    if prompt_tokens + output_tokens > window:
        raise Rejected(
            400,
            f"This model's maximum context length is {window} tokens; the request has "
            f"{prompt_tokens} prompt tokens and asks for {output_tokens} more.",
            code="context_length_exceeded",
            param="messages",
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

    def route(self, model: str) -> Pool:
        pool = self.pools.get(model)
        if pool is None:
            raise Rejected(
                404, f"The model {model!r} does not exist.", param="model", code="model_not_found"
            )
        return pool


SafetyCheck = Callable[[str], bool]
"""``check(text) -> True`` when the text may be shown."""


def blocklist_classifier(terms: tuple[str, ...]) -> SafetyCheck:
    """The default classifier: withhold text containing a blocked term (case-insensitive)."""
    lowered = tuple(t.lower() for t in terms)
    return lambda text: not any(t in text.lower() for t in lowered)


def apply_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the first stop sequence; return (text, stopped)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
