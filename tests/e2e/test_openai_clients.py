"""Every OpenAI client sees vLLM through the reference gateway: the official SDK (sync and
async, streamed and not) gets the same answer as straight from vLLM, field by field with a
fixed seed, and is billed exactly vLLM's usage; the tokenizer stage counts what vLLM
counts; vLLM's own benchmark client completes all its requests."""

from __future__ import annotations

import time
import uuid
from typing import Any

import openai
import pytest
from stagelens.reference.schema import ChatRequest, CompletionRequest, EmbeddingRequest

from stagelens import semconv
from stagelens.config import prompt_size_classes

pytestmark = pytest.mark.vllm

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]

CONVERSATION = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "developer", "content": "Use the tools."},
    {
        "role": "user",
        "name": "ana",
        "content": [
            {"type": "text", "text": "What is the weather"},
            {"type": "text", "text": "in Paris?"},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"},
]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}

CHAT_CASES: dict[str, dict[str, Any]] = {
    "parts": {"messages": CONVERSATION},
    "tool_named": {
        "messages": CONVERSATION,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "tool_required": {"messages": CONVERSATION, "tools": TOOLS, "tool_choice": "required"},
    "tool_auto": {
        "messages": CONVERSATION,
        "tools": TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    },
    "n2": {"messages": CONVERSATION[-1:], "n": 2, "temperature": 1.0},
    "json_schema": {
        "messages": CONVERSATION[-1:],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
    },
    "logprobs": {
        "messages": CONVERSATION[-1:],
        "logprobs": True,
        "top_logprobs": 2,
        "presence_penalty": 0.5,
        "extra_body": {"top_k": 20, "min_p": 0.01, "repetition_penalty": 1.1},
    },
}

COMPLETION_CASES: dict[str, dict[str, Any]] = {
    "text": {"prompt": "the gateway sends", "logprobs": 2},
    "texts": {"prompt": ["the gateway sends", "a request to"], "echo": True},
    "tokens": {"prompt": [10, 20, 30, 40], "echo": True, "logprobs": 1},
    "token_lists": {"prompt": [[10, 20, 30], [40, 50]]},
}

EMBEDDING_CASES: dict[str, dict[str, Any]] = {
    "text": {"input": "the gateway sends a request"},
    "texts": {"input": ["the gateway", "sends a request"], "encoding_format": "float"},
    "tokens": {"input": [[10, 20, 30], [40, 50]], "encoding_format": "base64"},
}

MAX_TOKENS = 8
"""Short generations keep the suite fast; long enough to show every field."""


def _clients(stack: Any, upstream: str, asynchronous: bool) -> tuple[Any, Any]:
    kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return (
        kind(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0),
        kind(base_url=f"{upstream}/v1", api_key="unused", max_retries=0),
    )


def _salted(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A fresh prefix-cache salt (a vLLM extra, passed through): both calls start cold, so
    their ``cached_tokens`` agree."""
    extra = {**kwargs.get("extra_body", {}), "cache_salt": uuid.uuid4().hex}
    return {**kwargs, "extra_body": extra}


def _plain(obj: Any) -> dict[str, Any]:
    """An SDK object as data, without what differs between any two calls (id, created)
    and vLLM's timings (the gateway asks for them and answers them null)."""
    data: dict[str, Any] = obj.model_dump()
    for key in ("id", "created", "metrics"):
        data.pop(key, None)
    return data


def _streamed(chunks: list[Any]) -> dict[str, Any]:
    """A stream as comparable data: each choice's text, tool calls, logprobs and finish
    reason put together, the keys every chunk and choice carried, and the usage. (How the
    engine groups tokens into chunks depends on timing, not on the request.)"""
    choices: dict[int, dict[str, Any]] = {}
    keys: set[str] = set()
    choice_keys: set[str] = set()
    usage = None
    fingerprint = None
    for chunk in chunks:
        data = chunk.model_dump()
        keys |= set(data) - {"id", "created", "metrics"}
        usage = data.get("usage") or usage
        fingerprint = data.get("system_fingerprint") or fingerprint
        for choice in data["choices"]:
            choice_keys |= set(choice)
            out = choices.setdefault(
                choice["index"], {"text": "", "tools": {}, "logprobs": [], "finish": None}
            )
            delta = choice.get("delta") or {}
            out["text"] += (delta.get("content") if delta else choice.get("text")) or ""
            for call in delta.get("tool_calls") or []:
                call_out = out["tools"].setdefault(call["index"], {"name": "", "arguments": ""})
                function = call.get("function") or {}
                call_out["name"] += function.get("name") or ""
                call_out["arguments"] += function.get("arguments") or ""
            logprobs = choice.get("logprobs") or {}
            out["logprobs"] += logprobs.get("content") or logprobs.get("tokens") or []
            out["finish"] = choice.get("finish_reason") or out["finish"]
    return {
        "choices": choices,
        "keys": sorted(keys),
        "choice_keys": sorted(choice_keys),
        "usage": usage,
        "fingerprint": fingerprint,
    }


def _tokens(cap: Any) -> dict[str, float]:
    labels = {"tenant": "demo"}
    return {
        kind: sum(
            cap.value(semconv.TOKENS, type=kind, model=m, **labels) or 0.0
            for m in ("tiny", "tiny-embed")
        )
        for kind in ("input", "output", "cached_input")
    }


def _requests_seen(capture: Any) -> float:
    return sum(
        sample.value
        for metric in capture.registry.collect()
        for sample in metric.samples
        if sample.name == semconv.REQUESTS
    )


def _billed(cap: Any, before: dict[str, float], seen: float) -> dict[str, float]:
    """Tokens billed since ``before``, once the request is accounted."""
    deadline = time.monotonic() + 5
    while _requests_seen(cap) < seen + 1:
        assert time.monotonic() < deadline, "the request was never accounted"
        time.sleep(0.02)
    after = _tokens(cap)
    return {k: after[k] - before[k] for k in after}


def _usage_tokens(usage: dict[str, Any]) -> dict[str, float]:
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input": usage["prompt_tokens"],
        "output": usage.get("completion_tokens") or 0,
        "cached_input": details.get("cached_tokens") or 0,
    }


def _counted(stack: Any, kind: str, body: dict[str, Any]) -> int:
    """The gateway tokenizer stage's count for ``body`` (the request the SDK sent)."""
    gateway = stack.app.state.gateway
    counter = gateway.tokenizer_for(body["model"])
    if kind == "chat":
        return int(counter.count_chat(ChatRequest.model_validate(body)))
    req: Any = (
        CompletionRequest.model_validate(body)
        if kind == "completions"
        else EmbeddingRequest.model_validate(body)
    )
    prompts = req.prompts if kind == "completions" else req.inputs
    return sum(counter.count_prompt(p) for p in prompts)


CALLS = [
    *(("chat", name, stream) for name in CHAT_CASES for stream in (False, True)),
    *(("completions", name, stream) for name in COMPLETION_CASES for stream in (False, True)),
    *(("embeddings", name, False) for name in EMBEDDING_CASES),
]


def _request(kind: str, name: str, stream: bool) -> dict[str, Any]:
    cases = {"chat": CHAT_CASES, "completions": COMPLETION_CASES, "embeddings": EMBEDDING_CASES}
    kwargs = dict(cases[kind][name])
    if kind == "embeddings":
        return {"model": "tiny-embed", **kwargs}
    kwargs = {"model": "tiny", "max_tokens": MAX_TOKENS, "seed": 1234, **kwargs}
    if stream:
        kwargs["stream"] = True
        if name in ("parts", "text", "n2"):  # the others stream without the usage event
            kwargs["stream_options"] = {"include_usage": True}
    return _salted(kwargs)


def _body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The JSON body the SDK sends for ``kwargs`` (``extra_body`` merged in)."""
    body = {k: v for k, v in kwargs.items() if k != "extra_body"}
    return {**body, **kwargs.get("extra_body", {})}


def _check(
    stack: Any,
    kind: str,
    kwargs: dict[str, Any],
    via_gateway: Any,
    direct: Any,
    billed: dict[str, float],
) -> None:
    if kwargs.get("stream"):
        got, want = _streamed(via_gateway), _streamed(direct)
        assert got == want
        usage = want["usage"] or {}
    else:
        got, want = _plain(via_gateway), _plain(direct)
        assert got == want
        assert getattr(via_gateway, "metrics", None) is None
        usage = want["usage"]
    if usage:
        assert billed == _usage_tokens(usage)
        assert _counted(stack, kind, _body(kwargs)) == usage["prompt_tokens"]
    else:  # no usage event asked for: billed what vLLM counted for the direct call
        assert billed["output"] > 0


def _assert_stream_usage(
    stack: Any, kind: str, kwargs: dict[str, Any], direct_usage: Any, billed: Any
) -> None:
    usage = direct_usage.model_dump()
    assert billed == _usage_tokens(usage)
    assert _counted(stack, kind, _body(kwargs)) == usage["prompt_tokens"]


class TestSyncSDK:
    """The official SDK's sync client, through the gateway and straight to vLLM."""

    def test_models_list_and_retrieve(self, stack, vllm_server) -> None:
        """models.list and models.retrieve answer vLLM's model objects for the router's
        pools, field for field (times and permission ids are the server's own)."""
        gateway, direct = _clients(stack, vllm_server.base_url, asynchronous=False)
        listed = {m.id: m for m in gateway.models.list()}
        assert set(listed) == {"tiny", "tiny-chat", "tiny-embed"}
        straight = {m.id: m for m in direct.models.list()}
        for name in ("tiny", "tiny-chat"):
            got, want = listed[name].model_dump(), straight[name].model_dump()
            for model in (got, want):
                model.pop("created")
                model.pop("root")
                model["permission"] = [
                    {k: v for k, v in p.items() if k not in ("id", "created")}
                    for p in model["permission"]
                ]
            assert got == want
        assert gateway.models.retrieve("tiny").model_dump() | {"permission": None} == listed[
            "tiny"
        ].model_dump() | {"permission": None}
        with pytest.raises(openai.NotFoundError) as missing:
            gateway.models.retrieve("no-such-model")
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-wrong").models.list()

    @pytest.mark.parametrize(("kind", "name", "stream"), CALLS)
    def test_same_answer_and_billed_vllms_usage(
        self, stack, vllm_server, vllm_embed_server, kind, name, stream
    ) -> None:
        """Through the gateway and straight to vLLM, the same request (fixed seed) gets the
        same answer; the gateway bills exactly vLLM's usage and counted its prompt."""
        upstream = vllm_embed_server.base_url if kind == "embeddings" else vllm_server.base_url
        gateway, direct = _clients(stack, upstream, asynchronous=False)
        kwargs = _request(kind, name, stream)
        call = {
            "chat": lambda c, k: c.chat.completions.create(**k),
            "completions": lambda c, k: c.completions.create(**k),
            "embeddings": lambda c, k: c.embeddings.create(**k),
        }[kind]
        before, seen = _tokens(stack.capture), _requests_seen(stack.capture)
        got = call(gateway, kwargs)
        got = list(got) if stream else got
        billed = _billed(stack.capture, before, seen)
        want = call(direct, _salted(kwargs))
        want = list(want) if stream else want
        if stream and not kwargs.get("stream_options"):
            usage_call = {**_salted(kwargs), "stream": False}
            _assert_stream_usage(stack, kind, kwargs, call(direct, usage_call).usage, billed)
        _check(stack, kind, kwargs, got, want, billed)
        if kind == "embeddings":  # its GenAI span; no tokens generated: no first token
            _assert_embeddings_span(stack, kwargs, got)
            ttft = semconv.TIME_TO_FIRST_TOKEN + "_count"
            for size, _ in prompt_size_classes(stack.capture.telemetry.settings):
                assert not stack.capture.value(ttft, model="tiny-embed", prompt_size=size)


def _assert_embeddings_span(stack: Any, kwargs: dict[str, Any], got: Any) -> None:
    """The call's GenAI client span: ``embeddings {model}``, a CLIENT span with the
    operation, the model and the input tokens of vLLM's usage as the client received it."""
    from opentelemetry.trace import SpanKind

    name = f"{semconv.GEN_AI_OPERATION_EMBEDDINGS} {kwargs['model']}"
    spans = [s for s in stack.capture.spans() if s.name == name]
    assert spans, f"no span {name!r}"
    span = spans[-1]  # the latest: this call's (the direct one passed no gateway)
    attributes = span.attributes or {}
    assert span.kind == SpanKind.CLIENT
    assert attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.GEN_AI_OPERATION_EMBEDDINGS
    assert attributes[semconv.GEN_AI_REQUEST_MODEL] == kwargs["model"]
    assert attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] == got.usage.prompt_tokens


class TestAsyncSDK:
    """The official SDK's async client, through the gateway and straight to vLLM."""

    @pytest.mark.parametrize(("kind", "name", "stream"), CALLS)
    def test_same_answer_and_billed_vllms_usage(
        self, stack, vllm_server, vllm_embed_server, kind, name, stream
    ) -> None:
        """The async client gets the same answers as straight from vLLM, billed exactly."""
        import asyncio

        upstream = vllm_embed_server.base_url if kind == "embeddings" else vllm_server.base_url
        kwargs = _request(kind, name, stream)

        async def run() -> tuple[Any, Any, dict[str, float], Any]:
            gateway, direct = _clients(stack, upstream, asynchronous=True)

            async def call(client: Any, k: dict[str, Any]) -> Any:
                if kind == "chat":
                    answer = await client.chat.completions.create(**k)
                elif kind == "completions":
                    answer = await client.completions.create(**k)
                else:
                    answer = await client.embeddings.create(**k)
                return [c async for c in answer] if k.get("stream") else answer

            before, seen = _tokens(stack.capture), _requests_seen(stack.capture)
            got = await call(gateway, kwargs)
            billed = await asyncio.to_thread(_billed, stack.capture, before, seen)
            want = await call(direct, _salted(kwargs))
            usage = None
            if stream and not kwargs.get("stream_options"):
                usage = (await call(direct, {**_salted(kwargs), "stream": False})).usage
            return got, want, billed, usage

        got, want, billed, usage = asyncio.run(run())
        if usage is not None:
            _assert_stream_usage(stack, kind, kwargs, usage, billed)
        _check(stack, kind, kwargs, got, want, billed)
        if kind == "embeddings":
            _assert_embeddings_span(stack, kwargs, got)
