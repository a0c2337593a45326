"""One request through the stages after the gateway's: load balancer, tokenizer, router,
inference (with failover), then the relay (``relay``) or the embedding answer.

Why the client's own JSON is forwarded: vLLM must see what the client sent (every field the
gateway does not read passes untouched); the gateway changes only the model name (the
pool's upstream name) and, on streams, asks for the usage event and the token ids it needs
to bill a stream cut short (stripped again unless the client asked for them).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from stagelens.reference.balancer import Backend
from stagelens.reference.pipeline import Pool, check_context
from stagelens.reference.relay import RelayResponse, Strip, finish_json, relay
from stagelens.reference.schema import (
    MEDIA_PART_MODALITIES,
    ChatRequest,
    CompletionRequest,
)
from stagelens.reference.tokens import TokenCounter, flatten
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagelens import Rejected, Stage, current_request, stage

if TYPE_CHECKING:
    from stagelens.reference.app import Gateway

REQUEST_KEY = "stagelens.reference.request"
"""Where the gateway stage leaves (validated request, client JSON) in the ASGI scope."""
TENANT_KEY = "stagelens.reference.tenant"
BODY_BYTES_KEY = "stagelens.reference.body_bytes"
"""Where the gateway stage leaves the request body's size in the ASGI scope."""


class Lease:
    """What one request holds: a backend (counted in its ``outstanding`` from assignment,
    so least-outstanding sees queued requests too) and an admission slot. Released once."""

    __slots__ = ("backend", "pool")

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.pool: Pool | None = None

    def release(self) -> None:
        if self.backend is not None:
            self.backend.outstanding -= 1
            self.backend = None
        if self.pool is not None:
            self.pool.release()
            self.pool = None


def reject(stage_name: Stage) -> None:
    """Attribute an error answered outside a ``stage()`` block to the stage that failed."""
    state = current_request()
    if state is not None:
        state.reject(stage_name)


def affinity_key(req: Any, counter: TokenCounter | None, chars: int) -> str:
    """The prompt prefix hashed for prefix affinity: the text vLLM's prefix cache sees
    first, whatever form the content took (a string, or parts joined as vLLM joins them)."""
    if isinstance(req, ChatRequest):
        fmt = counter.content_format if counter is not None else "string"
        texts = []
        for m in req.messages:
            content = flatten(m.content, fmt)
            texts.append(content if isinstance(content, str) else json.dumps(content))
            if sum(map(len, texts)) >= chars:
                break
        return "\x00".join(texts)[:chars]
    prompts = req.prompts if isinstance(req, CompletionRequest) else req.inputs
    first = prompts[0] if prompts else ""
    return (first if isinstance(first, str) else ",".join(map(str, first)))[:chars]


def _check_media(req: ChatRequest, pool: Pool) -> None:
    """400 naming the first content part of a kind the served model does not take."""
    allowed = pool.config.input_modalities
    for i, message in enumerate(req.messages):
        if not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            modality = MEDIA_PART_MODALITIES.get(part.type)
            if modality is not None and modality not in allowed:
                raise Rejected(
                    400,
                    f"The model {pool.name!r} does not take {modality} input "
                    f"(content part type {part.type!r}).",
                    param=f"messages.{i}.content.{j}",
                    code="unsupported_content",
                )


def count_prompt(req: Any, raw: dict[str, Any], pool: Pool, counter: TokenCounter) -> int:
    """Tokenizer stage: the prompt tokens vLLM will count, checked against the context
    window per prompt (unless the client asked vLLM to truncate)."""
    window = pool.config.max_model_len
    check = raw.get("truncate_prompt_tokens") is None
    if isinstance(req, ChatRequest):
        _check_media(req, pool)
        tokens = counter.count_chat(req)
        if check:
            check_context(tokens, req.output_limit, window, "messages")
        return tokens
    prompts, field, limit = (
        (req.prompts, "prompt", req.output_limit)
        if isinstance(req, CompletionRequest)
        else (req.inputs, "input", 0)
    )
    total = 0
    for prompt in prompts:
        tokens = counter.count_prompt(prompt)
        if check:
            check_context(tokens, limit, window, field)
        total += tokens
    return total


OFF_LOOP_BYTES = 16 * 1024
"""Bodies larger than this are tokenized off the event loop (smaller ones take well under
a millisecond: the thread hop would cost more than it saves)."""


async def tokenize(
    gateway: Gateway,
    request: Request,
    req: Any,
    raw: dict[str, Any],
    pool: Pool,
    counter: TokenCounter,
) -> int:
    """:func:`count_prompt`, on a worker thread for a body over :data:`OFF_LOOP_BYTES`."""
    if request.scope.get(BODY_BYTES_KEY, 0) <= OFF_LOOP_BYTES:
        return count_prompt(req, raw, pool, counter)
    return await gateway.off_loop.run(counter, lambda c: count_prompt(req, raw, pool, c))


async def complete(gateway: Gateway, request: Request, *, chat: bool) -> Response:
    """Chat or text completion through the load balancer, tokenizer, router and inference
    stages; the answer relayed (streamed) or post-processed (not)."""
    req, raw, tenant, pool = begin(gateway, request)
    lease = Lease()
    handed_over = False
    try:
        pool, prefix, prompt_tokens = await _admit(
            gateway, request, req, raw, pool, lease, "generate"
        )

        body = dict(raw)
        body["model"] = pool.upstream_model
        options = raw.get("stream_options")
        wants_usage = bool(
            req.streaming and req.stream_options and req.stream_options.include_usage
        )
        wants_token_ids = bool(req.return_token_ids)
        wants_running = bool(
            req.streaming and req.stream_options and req.stream_options.continuous_usage_stats
        )
        if req.streaming:
            body["stream_options"] = {**(options or {}), "include_usage": True}
            if _one_answer(req):
                # vLLM then says the tokens generated so far on every event: a stream cut
                # before the usage event is billed the engine's own count.
                body["stream_options"]["continuous_usage_stats"] = True
            # vLLM then lists each event's token ids: a stream cut before the usage event
            # is billed the exact count received, not an estimate. Not with ``echo``: vLLM
            # then echoes the prompt's ids instead of its text.
            if not getattr(req, "echo", False):
                body["return_token_ids"] = True
        path = "/v1/chat/completions" if chat else "/v1/completions"
        upstream, chunks = await send(gateway, pool, lease, prefix, path, body, req.streaming)
        if upstream.status_code >= 400:
            return await upstream_error(upstream)
        if not req.streaming:
            return await finish_json(gateway, upstream, req, tenant, prompt_tokens, chat)
        response = RelayResponse(
            relay(
                gateway,
                upstream,
                chunks,
                req,
                tenant,
                prompt_tokens,
                Strip(
                    usage=not wants_usage,
                    token_ids=not wants_token_ids,
                    running_usage=not wants_running,
                ),
                chat,
                lease,
            ),
            media_type="text/event-stream",
        )
        handed_over = True  # the relay releases the lease when the stream ends
        return response
    finally:
        if not handed_over:
            lease.release()


def _one_answer(req: Any) -> bool:
    """The request asks for one choice of one prompt: vLLM's running usage (continuous
    usage stats) is then the request's (with more, each event's is its own choice's)."""
    prompts = req.prompts if isinstance(req, CompletionRequest) else [None]
    return (req.n or 1) == 1 and len(prompts) == 1


async def _admit(
    gateway: Gateway,
    request: Request,
    req: Any,
    raw: dict[str, Any],
    named: Pool | None,
    lease: Lease,
    task: str,
) -> tuple[Pool, str, int]:
    """The load balancer, tokenizer and router stages a request passes before its upstream
    call, in that order (chat, completions and embeddings alike): (the pool routed to, the
    prefix-affinity key, the prompt's tokens, 0 when its model has no tokenizer or serves
    another task). ``lease`` takes the backend and the admitted pool, for the caller to
    release."""
    counter = gateway.tokenizer_for(req.model)
    with stage(Stage.LOAD_BALANCER):
        prefix = affinity_key(req, counter, gateway.config.prefix_affinity_chars)
        if named is not None:
            lease.backend = named.balancer.assign(prefix)
    with stage(Stage.TOKENIZER):
        prompt_tokens = 0
        if counter is not None and named is not None and named.config.task == task:
            prompt_tokens = await tokenize(gateway, request, req, raw, named, counter)
    with stage(Stage.ROUTER):
        pool = gateway.router.route(req.model, task)
        await pool.acquire()
        lease.pool = pool
    return pool, prefix, prompt_tokens


def begin(
    gateway: Gateway, request: Request, *, tokenless: bool = False
) -> tuple[Any, dict[str, Any], str, Pool | None]:
    """What every generation route reads first: the request as the body check parsed it
    and its raw body, the tenant the key check found, and the pool serving its model (None:
    no such model, refused at admission). The request's record learns what it is now,
    before anything can refuse it: its model (only a model the router serves names the
    metric series; any other name keeps the default label, so random model names cannot
    create new series), a stream (a stream refused before its call still counts for TTFT)
    or an answer with no tokens (``tokenless``: no first token, no output)."""
    req, raw = request.scope[REQUEST_KEY]
    tenant = str(request.scope.get(TENANT_KEY, "other"))
    pool = gateway.router.pools.get(req.model)
    state = current_request()
    if state is not None:
        if pool is not None:
            state.set_model(req.model)
        if tokenless:
            state.set_tokenless()
        elif req.streaming:
            state.set_streamed()
    return req, raw, tenant, pool


async def embed(gateway: Gateway, request: Request) -> Response:
    """Embeddings through the same stages, sent to an embedding pool; the inference stage
    is the instrumented client's ``embeddings {model}`` span, and the answer has no first
    token (no TTFT) and no output tokens."""
    req, raw, tenant, pool = begin(gateway, request, tokenless=True)
    lease = Lease()
    try:
        pool, prefix, prompt_tokens = await _admit(gateway, request, req, raw, pool, lease, "embed")
        body = {**raw, "model": pool.upstream_model}
        # The inference stage is the instrumented client's ``embeddings {model}`` span.
        upstream, _ = await send(gateway, pool, lease, prefix, "/v1/embeddings", body, False)
        if upstream.status_code >= 400:
            return await upstream_error(upstream)
        content = upstream.content
        usage = _usage_of(content)
        input_tokens = int(usage.get("prompt_tokens", prompt_tokens))
        await gateway.bill(tenant, input_tokens, 0, 0)
        return Response(content, media_type="application/json")
    finally:
        lease.release()


def _usage_of(content: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(content)
    except ValueError:
        return {}
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return usage if isinstance(usage, dict) else {}


async def send(
    gateway: Gateway,
    pool: Pool,
    lease: Lease,
    prefix: str,
    path: str,
    body: dict[str, Any],
    stream: bool,
) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    """Inference stage: call the backend; fail over to another while the client has been
    sent nothing: on a connection error, on a backend marked down while the request waits
    on it, and on no first byte within ``upstream_first_byte_timeout_seconds`` (the
    response headers and, on a stream, its first event). Returns the response and its
    body chunks (a stream's first one already read, replayed first).

    Errors answered here happen outside any ``stage()`` block, so each names the stage that
    failed: the load balancer when no healthy backend is left, inference for a timeout.
    """
    tried: list[Backend] = []
    first_byte = gateway.config.upstream_first_byte_timeout_seconds
    while True:
        backend = lease.backend
        assert backend is not None
        failure: Exception
        if not backend.healthy:  # marked down while this request waited for admission
            failure = httpx.ConnectError("backend marked down")
        else:
            try:
                with anyio.move_on_after(first_byte) as scope, backend.waiting_on(scope):
                    return await _attempt(gateway, backend.url + path, body, stream)
                failure = httpx.ConnectError("backend marked down")
                if backend.healthy:  # no first byte in time: slow or frozen, not known dead
                    failure = httpx.ReadTimeout("no first byte in time")
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                # No answer at all from this backend: take it out (passive check, until
                # the active check says otherwise) and try another.
                backend.healthy = False
                failure = exc
            except httpx.TimeoutException as exc:
                reject(Stage.INFERENCE)
                raise _timed_out() from exc
            except httpx.HTTPError as exc:
                reject(Stage.INFERENCE)
                raise Rejected(
                    502,
                    f"The model server call failed: {type(exc).__name__}",
                    type="server_error",
                    code="upstream_error",
                ) from exc
        backend.outstanding -= 1
        lease.backend = None
        tried.append(backend)
        try:
            lease.backend = pool.balancer.assign(prefix, exclude=tried)
        except Rejected:
            if isinstance(failure, httpx.TimeoutException):
                reject(Stage.INFERENCE)
                raise _timed_out() from failure
            reject(Stage.LOAD_BALANCER)
            raise Rejected(
                503,
                f"Backend unavailable: {type(failure).__name__}",
                type="server_error",
                code="backend_unavailable",
            ) from failure


def _timed_out() -> Rejected:
    return Rejected(
        504,
        "The model server did not answer in time.",
        type="server_error",
        code="upstream_timeout",
    )


async def _attempt(
    gateway: Gateway, url: str, body: dict[str, Any], stream: bool
) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    """One upstream call, up to its first byte: the headers and, on a successful stream,
    its first chunk (read here, so a backend that answers headers and then freezes is
    still one the request can leave). Cancelled, it closes what it opened."""
    client = gateway.client
    response = await client.send(client.build_request("POST", url, json=body), stream=stream)
    if not stream or response.status_code >= 400:
        return response, response.aiter_raw()
    try:
        chunks = response.aiter_raw()
        first = await anext(chunks, b"")
    except BaseException:
        with anyio.CancelScope(shield=True):
            await response.aclose()
        raise
    return response, _replay(first, chunks)


async def _replay(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


def client_status(upstream_status: int) -> int:
    """The status the client gets for an upstream error status.

    A 4xx other than 401/403/404/429 means the engine found the request invalid: passed on.
    401/403/404 from the engine mean the gateway's own upstream settings are wrong, and other
    5xx a broken engine: 502. 429/503 mean the engine is full: 503. 504 stays 504.
    """
    if upstream_status in (401, 403, 404):
        return 502
    if upstream_status in (429, 503):
        return 503
    if upstream_status == 504 or 400 <= upstream_status < 500:
        return upstream_status
    return 502


async def upstream_error(upstream: httpx.Response) -> Response:
    """Answer an upstream error status (before any byte was streamed) with the mapped status
    and an OpenAI-style body (``upstream_rejection``). The inference stage rejected."""
    rejection = await upstream_rejection(upstream)
    return JSONResponse(rejection.body(), status_code=rejection.status_code)


async def upstream_rejection(upstream: httpx.Response) -> Rejected:
    """The rejection for an upstream error status, its body read and the upstream closed:
    the mapped status; a refused request (4xx) gets vLLM's own message and param (in
    OpenAI's error shape or Anthropic's), a failing engine a ``server_error``. The
    inference stage rejected."""
    try:
        raw = await upstream.aread()
    finally:
        await upstream.aclose()
    message = raw.decode(errors="replace")[:500] or f"HTTP {upstream.status_code}"
    param = None
    try:
        payload = json.loads(raw)
        error = payload.get("error", payload) if isinstance(payload, dict) else None
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            param = error.get("param") if isinstance(error.get("param"), str) else None
    except ValueError:
        pass
    status = client_status(upstream.status_code)
    reject(Stage.INFERENCE)
    if status < 500:
        return Rejected(
            status,
            message,
            type="invalid_request_error",
            code="upstream_rejected",
            param=param,
        )
    return Rejected(
        status,
        f"The model server answered {upstream.status_code}: {message}",
        type="server_error",
        code="upstream_error",
    )
