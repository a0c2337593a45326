"""Generate the embedded default model: a tiny random-weight Llama with a real BPE tokenizer.

Why: the demo and the end-to-end tests must run real vLLM on a CPU machine with no hub
access. The model is made locally from a fixed seed and cached on disk, so it is built once
per machine and is byte-for-byte the same everywhere. Its outputs are gibberish; its shapes
are chosen to be served by vLLM's CPU attention kernel (head_dim 64; 16 is rejected).

Needs the ``demo`` extra (torch, transformers, tokenizers come with vLLM).
"""

from __future__ import annotations

import importlib
import json
import os
import random
from pathlib import Path
from typing import Any, Final

DEFAULT_CACHE_DIR: Final = Path(
    os.environ.get("STAGELENS_CACHE_DIR", Path.home() / ".cache" / "stagelens")
)
"""Where generated models are cached (override with ``STAGELENS_CACHE_DIR``)."""

MODEL_VERSION: Final = 2
"""Bump when the generated files change, so stale caches are rebuilt (2: the chat template
renders tools and tool calls)."""

REASONING_PARSER: Final = "step3"
"""vLLM's ``--reasoning-parser`` for the reasoning variant (``ensure_tiny_model(reasoning=
True)``, served as ``tiny-think``): everything the model writes before ``</think>`` is
reasoning, the rest is the answer, and ``usage.completion_tokens_details.reasoning_tokens``
counts the tokens before ``</think>``."""
REASONING_CONFIG: Final = '{"reasoning_parser": "step3"}'
"""vLLM's ``--reasoning-config`` for the variant: it turns on the per-request
``thinking_token_budget``, after which vLLM forces ``</think>``. A random-weight model never
writes ``</think>`` on its own, so the budget is what ends its thinking: a request with
``thinking_token_budget=k`` streams ``k`` reasoning tokens, then the answer."""
THINKING_STEPS_KEY: Final = "thinking_token_budget"
"""The request field (``extra_body`` with the OpenAI SDK) that sets how long it thinks."""

TOOL_CALL_PARSER: Final = "hermes"
"""vLLM's ``--tool-call-parser`` that reads what the chat template asks the model to write
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the Hermes format)."""

_CHAT_TEMPLATE: Final = (
    "{%- if tools %}<|system|>\n"
    "You may call these functions. Answer a call as "
    '<tool_call>{"name": <name>, "arguments": <arguments object>}</tool_call>.\n'
    "{% for tool in tools %}"
    "{{ tool['function']['name'] }}"
    "{%- if tool['function']['description'] %}: {{ tool['function']['description'] }}{% endif %}"
    "{%- if tool['function']['parameters'] %} {{ tool['function']['parameters'] | tojson }}"
    "{%- endif %}{{ '\\n' }}"
    "{% endfor %}</s>\n"
    "{% endif %}"
    "{%- for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] or '' }}"
    "{%- for call in message['tool_calls'] or [] %}"
    '<tool_call>{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{{ call['function']['arguments'] | tojson }}}</tool_call>"
    "{%- endfor %}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_THINK_TEMPLATE: Final = _CHAT_TEMPLATE.replace(
    "<|assistant|>\n{% endif %}", "<|assistant|>\n<think>{% endif %}"
)
"""The reasoning variant's template: the generation prompt opens the thinking (as
DeepSeek-R1's and Qwen3's do), so what the model writes first is reasoning."""
"""The tiny model's chat template: the tools it is offered (Hermes format, so vLLM's
``hermes`` parser reads its calls), then one ``<|role|>`` block per message, content as a
string (vLLM's ``string`` content format: a list of text parts arrives joined by newlines)."""

_WORDS: Final = [
    "the",
    "a",
    "an",
    "gateway",
    "load",
    "balancer",
    "tokenizer",
    "router",
    "inference",
    "prefill",
    "decode",
    "queue",
    "billing",
    "token",
    "tokens",
    "cost",
    "latency",
    "budget",
    "request",
    "response",
    "stream",
    "cache",
    "prefix",
    "model",
    "server",
    "engine",
    "span",
    "trace",
    "metric",
    "stage",
    "time",
    "first",
    "second",
    "millisecond",
    "user",
    "assistant",
    "system",
    "hello",
    "world",
    "answer",
    "question",
    "please",
    "explain",
    "why",
    "how",
    "what",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
    "by",
    "from",
    "at",
    "as",
    "and",
    "or",
    "but",
    "not",
    "gpu",
    "cpu",
    "memory",
    "power",
    "energy",
    "kernel",
    "batch",
    "block",
    "page",
    "hit",
    "miss",
    "rate",
    "ratio",
    "alert",
]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def model_dir(name: str = "tiny", seed: int = 0, cache_dir: Path | None = None) -> Path:
    """Return the cache directory of a generated model (it may not exist yet)."""
    base = cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR
    return base / f"{name}-s{seed}-v{MODEL_VERSION}"


def ensure_tiny_model(
    name: str = "tiny",
    seed: int = 0,
    cache_dir: Path | None = None,
    max_position_embeddings: int = 2048,
    *,
    reasoning: bool = False,
) -> Path:
    """Build the tiny model into the cache unless it is already there; return its directory.

    ``reasoning``: the reasoning variant (call it ``tiny-think``): its tokenizer has the
    added tokens ``<think>`` and ``</think>`` and its chat template opens the thinking,
    so that vLLM started with ``--reasoning-parser step3 --reasoning-config
    '{"reasoning_parser": "step3"}'`` streams ``reasoning`` deltas, then, after the
    request's ``thinking_token_budget`` tokens, ``content`` deltas (see
    ``REASONING_CONFIG``). The plain model is left exactly as it was.

    The build takes a few seconds; a marker file written last makes a half-written
    directory (interrupted build) count as missing.
    """
    out = model_dir(name, seed, cache_dir)
    marker = out / ".stagelens-complete"
    if marker.exists():
        return out

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # transformers' annotations are partial (untyped constructors); use it as Any.
    transformers: Any = importlib.import_module("transformers")

    out.mkdir(parents=True, exist_ok=True)
    special = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        model_max_length=max_position_embeddings,
    )
    if reasoning:
        # Added tokens, not special ones (as DeepSeek-R1's and Qwen3's are): vLLM leaves
        # special tokens out of the text, and the parser finds the end of thinking there.
        tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = _THINK_TEMPLATE if reasoning else _CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "stagelens-model.json").write_text(
        json.dumps({"name": name, "seed": seed, "version": MODEL_VERSION}, indent=2) + "\n"
    )
    marker.write_text("ok\n")
    return out


if __name__ == "__main__":
    print(ensure_tiny_model())
