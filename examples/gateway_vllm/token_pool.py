"""Counting a big text in a process of its own, so the event loop never waits for the GIL.

Why a process: the Rust tokenizer's ``encode_batch`` releases the GIL while it encodes, but
freeing its result (the ``Encoding``: ids, offsets, masks for every token) holds it, the
longer the bigger the prompt, and the gateway's event loop waits that long: longer than the
50 ms a stall may last for a prompt of a few MiB (``benchmarks/loop_stall.py`` measures
it). A spawned process that loads only the Rust tokenizer frees the ``Encoding`` under its
own GIL and sends back one int.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

BIG_TEXT_CHARS = 256 * 1024
"""Texts longer than this are counted in the pool. Why 256 Ki characters: freeing the
``Encoding`` of one holds the GIL well under the 50 ms a stall may last (the time grows in
proportion to the text; ``benchmarks/loop_stall.py`` measures it); below it the hop to the
process (pickling the text) would cost more than it saves."""

_log = logging.getLogger(__name__)

_TOKENIZER: Any = None
"""The worker process's Rust tokenizer (set once by :func:`_load`)."""


def _load(serialized: str) -> None:
    """Pool initializer: the Rust tokenizer, from the gateway's own serialisation of it (so
    the same normalizer, pre-tokenizer, post-processor, no truncation, no padding)."""
    global _TOKENIZER
    from tokenizers import Tokenizer

    _TOKENIZER = Tokenizer.from_str(serialized)


def _count(text: str, special: bool) -> int:
    (encoding,) = _TOKENIZER.encode_batch([text], add_special_tokens=special)
    return len(encoding)


class TokenPool:
    """One spawned worker process counting with one tokenizer (started on first use).

    Why a pool can break and serving must not: the worker can be killed (out of memory, a
    signal); the caller then counts on its own thread, as before, and the break is logged
    once (its type only: the exception may carry the prompt)."""

    def __init__(self, serialized: str) -> None:
        self._serialized = serialized
        self._executor: ProcessPoolExecutor | None = None
        self.broken = False

    def count(self, text: str, *, special: bool) -> int | None:
        """Tokens in ``text`` counted in the worker process (blocks the calling thread, which
        must not be the event loop's); None once the pool is broken."""
        if self.broken:
            return None
        if self._executor is None:
            self._executor = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_load,
                initargs=(self._serialized,),
            )
        try:
            return self._executor.submit(_count, text, special).result()
        except BrokenProcessPool as exc:
            self.broken = True
            _log.warning("token counting pool broken (%s): counting in-thread", type(exc).__name__)
            self.shutdown()
            return None

    def shutdown(self) -> None:
        """Stops the worker process (waits for it to exit)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
