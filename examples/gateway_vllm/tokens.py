"""The tokenizer stage's counts: what vLLM will count, for every form a request takes.

Why the gateway re-does vLLM's rendering: the context check must refuse exactly what vLLM
would refuse, before any engine work, and a stream cut before vLLM's usage is billed the
prompt the gateway counted. So a chat request is turned into the conversation vLLM hands
the chat template (content parts flattened as vLLM flattens them, tool-call arguments as
objects, ``developer`` folded into ``system`` where the template has no such role) and
rendered with the same tools and template arguments; completions and embeddings count each
prompt, text or token ids. The end-to-end tests check every count against vLLM's
``usage.prompt_tokens``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any, Literal

import anyio
from stagelens.reference.schema import ChatRequest, Message, Tool
from stagelens.reference.token_pool import BIG_TEXT_CHARS, TokenPool

from stagelens import Rejected

ContentFormat = Literal["string", "openai"]
"""How vLLM hands message content to the chat template (its ``--chat-template-content-format``
as resolved): one string, parts joined by newlines; or the list of parts."""

_CALL_KWARGS = frozenset(
    {
        "chat_template",
        "tokenize",
        "conversation",
        "tools",
        "documents",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""``apply_chat_template``'s own parameters: never taken from ``chat_template_kwargs``."""


def flatten(content: Any, content_format: ContentFormat = "string") -> Any:
    """A message's content as vLLM gives it to the template: a string (text parts joined by
    newlines; null is empty), or in ``openai`` format the list of text parts."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = [p.text_value for p in content if p.text_value is not None]
    if content_format == "openai":
        return [{"type": "text", "text": text} for text in parts]
    return "\n".join(parts)


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments as vLLM gives them to the template: a JSON object (a string
    that is not one becomes ``{}``, as vLLM coerces it)."""
    if isinstance(value, dict):
        return value
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _message(message: Message, content_format: ContentFormat) -> dict[str, Any]:
    out: dict[str, Any] = {
        "role": message.role,
        "content": flatten(message.content, content_format),
    }
    if message.role == "assistant" and message.tool_calls:
        out["tool_calls"] = [
            {
                **call.model_dump(exclude_none=True),
                "function": {
                    **call.function.model_dump(),
                    "arguments": _arguments(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.role == "tool" and message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _fold_developer(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's treatment of ``developer`` messages for a template without that role: they
    become ``system`` messages, and several system messages merge into one, first."""
    converted = [{**m, "role": "system"} if m["role"] == "developer" else m for m in conversation]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = [c for m in converted if m["role"] == "system" if (c := _text(m["content"]))]
    rest = [m for m in converted if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return str(content or "")


def tool_dicts(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as vLLM passes them to the template (its serialisation of each)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        function: dict[str, Any] = {
            "name": tool.function.name,
            "description": tool.function.description,
            "parameters": tool.function.parameters,
        }
        if tool.function.strict is not None:
            function["strict"] = tool.function.strict
        out.append({"type": "function", "function": function})
    return out


class TokenCounter:
    """The served model's own tokenizer (loaded once per model directory)."""

    def __init__(self, source: str, content_format: ContentFormat = "string") -> None:
        self.source = source
        transformers: Any = importlib.import_module("transformers")
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(source)
        # We count prompts of any length ourselves; silence the "longer than max" warning.
        self._tokenizer.model_max_length = 10**9
        # Counting goes straight to the Rust tokenizer (see _count), which transformers
        # would set to no truncation and no padding before each call: set once here.
        self._backend = self._tokenizer.backend_tokenizer
        self._backend.no_truncation()
        self._backend.no_padding()
        self.content_format = content_format
        self.pool: TokenPool | None = None  # set on OffLoop's worker copies only
        template = self._tokenizer.chat_template
        self._developer = isinstance(template, str) and (
            '"developer"' in template or "'developer'" in template
        )

    def conversation(self, messages: list[Message]) -> list[dict[str, Any]]:
        """The messages as vLLM hands them to the chat template."""
        conversation = [_message(m, self.content_format) for m in messages]
        if not self._developer and any(m["role"] == "developer" for m in conversation):
            conversation = _fold_developer(conversation)
        return conversation

    def count_chat(self, req: ChatRequest) -> int:
        """Prompt tokens of a chat request: its conversation through the chat template,
        with its tools and template arguments, as vLLM renders it."""
        given = req.chat_template_kwargs or {}
        kwargs = {k: v for k, v in given.items() if k not in _CALL_KWARGS}
        kwargs["add_generation_prompt"] = req.add_generation_prompt is not False
        kwargs["continue_final_message"] = bool(req.continue_final_message)
        try:
            text = self._tokenizer.apply_chat_template(
                self.conversation(req.messages),
                tools=tool_dicts(req.tools),
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # the template refused these messages or arguments
            raise Rejected(
                400,
                f"The chat template could not render this request ({type(exc).__name__}).",
                param="messages",
                code="invalid_request",
            ) from exc
        # What transformers' tokenize=True does: the rendered text, no special tokens added.
        return self._count(text, special=False)

    def count_prompt(self, prompt: str | list[int]) -> int:
        """Tokens of one completions or embeddings input: text tokenized with the special
        tokens vLLM adds, token ids as they are."""
        if isinstance(prompt, list):
            return len(prompt)
        return self._count(prompt, special=True)

    def count_generated(self, text: str) -> int:
        """Tokens in generated ``text`` (no special tokens added). Re-tokenizing decoded
        text can differ from the engine's own ids by a token or so at odd byte boundaries;
        it is used only when the engine's usage never arrived (stream cut short)."""
        return self._count(text, special=False)

    def serialized(self) -> str:
        """The Rust tokenizer as JSON, as set up for counting (no truncation, no padding)."""
        text: str = self._backend.to_str()
        return text

    def _count(self, text: str, *, special: bool) -> int:
        """Tokens in ``text`` (with the special tokens the post-processor adds if
        ``special``), as transformers' ``tokenizer(text)`` counts them.

        Why not through transformers: the Rust tokenizer's ``encode_batch`` releases the
        GIL while it works (``encode`` does not), but transformers then copies every id
        into Python lists (ids, attention mask), which holds the GIL for as long, and as long
        again to free them: for a prompt of megabytes, long enough to stall every other
        request. The ``Encoding``'s length needs no copy. Freeing it still holds the GIL, in
        proportion to its length: so a text over ``BIG_TEXT_CHARS`` is counted in
        the worker process of :attr:`pool` where there is one (``benchmarks/loop_stall.py``
        measures the stall)."""
        if self.pool is not None and len(text) > BIG_TEXT_CHARS:
            tokens = self.pool.count(text, special=special)
            if tokens is not None:
                return tokens
        (encoding,) = self._backend.encode_batch([text], add_special_tokens=special)
        return len(encoding)


class OffLoop:
    """Counts big inputs on a worker thread, so the event loop keeps serving meanwhile (a
    1 MB prompt takes most of a second to tokenize on one core).

    Why a tokenizer copy of its own, one thread at a time: a Hugging Face fast tokenizer
    sets its truncation and padding state on every call and refuses to be used by two
    threads at once ("Already borrowed"); the event loop keeps the original for small
    inputs, the worker its copy, loaded on first use. The copy counts a big text in a
    process of its own (:class:`TokenPool`, one per tokenizer, started on first use), which
    :meth:`close` stops.
    """

    def __init__(self) -> None:
        self._limiter: anyio.CapacityLimiter | None = None
        self._copies: dict[tuple[str, str], TokenCounter] = {}
        self.pools: dict[str, TokenPool] = {}

    async def run(self, counter: TokenCounter, count: Callable[[TokenCounter], int]) -> int:
        """``count`` applied to the worker's copy of ``counter``, on the worker thread."""
        if self._limiter is None:  # created in the event loop that uses it
            self._limiter = anyio.CapacityLimiter(1)

        def work() -> int:
            key = (counter.source, counter.content_format)
            copy = self._copies.get(key)
            if copy is None:
                copy = self._copies[key] = TokenCounter(*key)
                pool = self.pools.get(counter.source)
                if pool is None:
                    pool = self.pools[counter.source] = TokenPool(copy.serialized())
                copy.pool = pool
            return count(copy)

        return await anyio.to_thread.run_sync(work, limiter=self._limiter)

    async def close(self) -> None:
        """Stops the counting processes (at the gateway's shutdown, after the last
        request), waiting for them on a worker thread."""
        pools = list(self.pools.values())
        for pool in pools:
            await anyio.to_thread.run_sync(pool.shutdown)
