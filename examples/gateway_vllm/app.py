"""The reference gateway: seven real stages in front of real vLLM servers.

Order per request (CONTRACT.md "The seven stages"): ``gateway`` (stagelens middleware hooks:
API key, rate limit, schema), ``load_balancer`` (backend choice), ``tokenizer`` (real token
count, context window), ``router`` (model -> pool, admission), ``inference`` (the instrumented
httpx call), ``postprocess`` (safety, stop sequences, framing), ``billing``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from stagelens.instrumentation import Telemetry
from stagelens.reference.balancer import Backend, Balancer, HealthChecker
from stagelens.reference.config import GatewayConfig
from stagelens.reference.pipeline import (
    Pool,
    Router,
    SafetyCheck,
    TokenCounter,
    apply_stops,
    blocklist_classifier,
    check_context,
)
from stagelens.reference.policy import ApiKeyAuth, TokenBucketLimiter
from stagelens.reference.schema import ChatRequest, CompletionRequest, parse
from starlette.responses import JSONResponse, Response, StreamingResponse

import stagelens
from stagelens import Rejected, Stage, current_request, record_usage, stage

REQUEST_KEY = "stagelens.reference.request"
TENANT_KEY = "stagelens.reference.tenant"


@dataclass
class TenantUsage:
    """What one tenant used, for ``GET /v1/usage``."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float = 0.0


class Gateway:
    """State shared by all requests (backends, pools, tokenizers, usage); nothing per request."""

    def __init__(self, config: GatewayConfig, safety: SafetyCheck | None = None) -> None:
        self.config = config
        backends: dict[str, Backend] = {}
        pools: dict[str, Pool] = {}
        self.tokenizers: dict[str, TokenCounter] = {}
        for name, pool_config in config.models.items():
            members = [backends.setdefault(u, Backend(u)) for u in pool_config.backends]
            pools[name] = Pool(name, pool_config, Balancer(members, config.balancing))
            if pool_config.tokenizer not in self.tokenizers:
                self.tokenizers[pool_config.tokenizer] = TokenCounter(pool_config.tokenizer)
        self.backends = list(backends.values())
        self.router = Router(pools)
        self.health = HealthChecker(self.backends, config.health_interval_seconds)
        self.safety = safety or blocklist_classifier(config.blocked_terms)
        self.usage: dict[str, TenantUsage] = defaultdict(TenantUsage)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.upstream_timeout_seconds, connect=5.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
        )

    def validate(self, scope: dict[str, Any], body: bytes) -> None:
        """Body hook (gateway stage): schema validation, 400 naming the bad field."""
        path = scope.get("path", "")
        kind = ChatRequest if path.endswith("/chat/completions") else CompletionRequest
        if path.endswith("/completions"):
            scope[REQUEST_KEY] = parse(body, kind)

    def bill(self, tenant: str, input_tokens: int, output_tokens: int, cached: int) -> None:
        """Billing stage: usage to stagelens (cost, counters) and to the tenant's ledger."""
        record_usage(
            input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=cached
        )
        cost = stagelens.bill() or 0.0
        ledger = self.usage[tenant]
        ledger.requests += 1
        ledger.input_tokens += input_tokens
        ledger.output_tokens += output_tokens
        ledger.cached_input_tokens += cached
        ledger.cost_usd += cost


def _error(rejection: Rejected) -> JSONResponse:
    return JSONResponse(
        rejection.body(), status_code=rejection.status_code, headers=rejection.headers
    )


def create_app(
    config: GatewayConfig,
    *,
    telemetry: Telemetry | None = None,
    safety: SafetyCheck | None = None,
) -> FastAPI:
    """Build the gateway app, instrumented with stagelens (``/metrics`` served by it)."""
    gateway = Gateway(config, safety)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.health.check_once(gateway.client)
        gateway.health.start()
        yield
        await gateway.health.stop()
        await gateway.client.aclose()

    app = FastAPI(title="stagelens reference gateway", lifespan=lifespan)
    app.state.gateway = gateway
    stagelens.instrument_httpx_client(gateway.client, telemetry=telemetry)

    @app.exception_handler(Rejected)
    async def rejected(request: Request, exc: Rejected) -> Response:
        return _error(exc)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _complete(gateway, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(gateway, request, chat=False)

    @app.get("/v1/usage")
    async def usage(request: Request) -> Response:
        tenant = request.scope.get(TENANT_KEY)
        return JSONResponse({"tenant": tenant, **asdict(gateway.usage[str(tenant)])})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"backends": {b.url: b.healthy for b in gateway.backends}}

    auth = ApiKeyAuth(config.api_keys)
    limiter = TokenBucketLimiter(config.rate_limit_per_second, config.rate_limit_burst)
    stagelens.instrument_app(
        app,
        telemetry=telemetry,
        auth_hook=auth,
        rate_limit_hook=limiter,
        body_hook=gateway.validate,
        metrics_path="/metrics",
    )
    return app


async def _complete(gateway: Gateway, request: Request, *, chat: bool) -> Response:
    req = request.scope[REQUEST_KEY]
    tenant = str(request.scope.get(TENANT_KEY, "other"))
    state = current_request()
    if state is not None:
        state.set_model(req.model)
    pool = gateway.router.pools.get(req.model)

    with stage(Stage.LOAD_BALANCER):
        prefix = ("".join(m.content for m in req.messages) if chat else req.prompt)[
            : gateway.config.prefix_affinity_chars
        ]
        backend = pool.balancer.choose(prefix) if pool is not None else None

    with stage(Stage.TOKENIZER):
        counter = gateway.tokenizers[pool.config.tokenizer] if pool is not None else None
        prompt_tokens = 0
        if counter is not None and pool is not None:
            prompt_tokens = (
                counter.count_chat([m.model_dump() for m in req.messages])
                if chat
                else counter.count_text(req.prompt)
            )
            check_context(prompt_tokens, req.output_limit, pool.config.max_model_len)

    with stage(Stage.ROUTER):
        pool = gateway.router.route(req.model)
        admission = pool.admitted()
        await admission.__aenter__()
    assert backend is not None

    body = req.model_dump(exclude_none=True)
    body["model"] = pool.upstream_model
    wants_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        upstream, backend = await _send(gateway, pool, backend, prefix, path, body, req.stream)
    except BaseException:
        await admission.__aexit__(None, None, None)
        raise
    if not req.stream:
        try:
            return await _finish_json(gateway, upstream, req, tenant, prompt_tokens, chat)
        finally:
            backend.outstanding -= 1
            await admission.__aexit__(None, None, None)

    async def release() -> None:
        backend.outstanding -= 1
        await admission.__aexit__(None, None, None)

    return StreamingResponse(
        _relay(gateway, upstream, req, tenant, prompt_tokens, wants_usage, chat, release),
        media_type="text/event-stream",
    )


async def _send(
    gateway: Gateway,
    pool: Pool,
    backend: Backend,
    prefix: str,
    path: str,
    body: dict[str, Any],
    stream: bool,
) -> tuple[httpx.Response, Backend]:
    """Inference stage: call the backend; fail over to another on a connection error."""
    tried: list[Backend] = []
    while True:
        backend.outstanding += 1
        try:
            upstream = await gateway.client.send(
                gateway.client.build_request("POST", backend.url + path, json=body),
                stream=stream,
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            backend.outstanding -= 1
            backend.healthy = False  # passive check: out until the active check says so
            tried.append(backend)
            try:
                backend = pool.balancer.choose(prefix, exclude=tried)
            except Rejected:
                raise Rejected(
                    503,
                    f"Backend unavailable: {type(exc).__name__}",
                    type="server_error",
                    code="backend_unavailable",
                ) from exc
            continue
        except httpx.TimeoutException as exc:
            backend.outstanding -= 1
            raise Rejected(
                504,
                "The model server did not answer in time.",
                type="server_error",
                code="upstream_timeout",
            ) from exc
        return upstream, backend


async def _finish_json(
    gateway: Gateway,
    upstream: httpx.Response,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    chat: bool,
) -> Response:
    if upstream.status_code >= 400:
        state = current_request()
        if state is not None:
            state.reject(Stage.INFERENCE)
        return Response(
            upstream.content, status_code=upstream.status_code, media_type="application/json"
        )
    payload = upstream.json()
    with stage(Stage.POSTPROCESS):
        for choice in payload.get("choices", []):
            key = "message" if chat else None
            text = (choice.get(key) or {}).get("content") if key else choice.get("text")
            text = text or ""
            text, stopped = apply_stops(text, req.stops)
            if stopped:
                choice["finish_reason"] = "stop"
            if not gateway.safety(text):
                text, choice["finish_reason"] = "", "content_filter"
            if key:
                choice[key]["content"] = text
            else:
                choice["text"] = text
        payload.pop("metrics", None)
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    gateway.bill(
        tenant,
        int(usage.get("prompt_tokens", prompt_tokens)),
        int(usage.get("completion_tokens", 0)),
        int(details.get("cached_tokens") or 0),
    )
    return JSONResponse(payload)


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _relay(
    gateway: Gateway,
    upstream: httpx.Response,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    wants_usage: bool,
    chat: bool,
    release: Callable[[], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """Pass the upstream SSE stream through event by event (never buffered): stop
    sequences and the safety check per event, usage stripped unless asked for; a backend
    dying mid-stream ends the client's stream with an error event; a client going away
    aborts the upstream request; billing always runs with what was generated."""
    text = ""
    generated = 0
    usage: dict[str, Any] | None = None
    finished = False
    buffer = b""
    try:
        if upstream.status_code >= 400:
            body = await upstream.aread()
            yield _event(
                {
                    "error": {
                        "message": body.decode(errors="replace")[:500],
                        "type": "server_error",
                        "code": upstream.status_code,
                    }
                }
            )
            return
        try:
            async for chunk in upstream.aiter_raw():
                buffer += chunk
                while b"\n\n" in buffer and not finished:
                    raw, buffer = buffer.split(b"\n\n", 1)
                    if not raw.startswith(b"data: "):
                        continue
                    data = raw[6:]
                    if data == b"[DONE]":
                        finished = True
                        break
                    event = json.loads(data)
                    if event.get("usage") is not None and not event.get("choices"):
                        usage = event["usage"]
                        if wants_usage:
                            event.pop("metrics", None)
                            yield _event(event)
                        continue
                    event.pop("usage", None)
                    for choice in event.get("choices", []):
                        delta = choice.get("delta", {}) if chat else choice
                        piece = delta.get("content") if chat else delta.get("text")
                        if piece:
                            generated += 1
                            cut, stopped = apply_stops(text + piece, req.stops)
                            if stopped or not gateway.safety(cut):
                                keep = cut[len(text) :] if stopped else ""
                                if chat:
                                    delta["content"] = keep
                                else:
                                    delta["text"] = keep
                                choice["finish_reason"] = "stop" if stopped else "content_filter"
                                finished = True
                            text = cut
                    yield _event(event)
                if finished:
                    break
        except httpx.HTTPError as exc:
            state = current_request()
            if state is not None:
                state.reject(Stage.INFERENCE)
            yield _event(
                {
                    "error": {
                        "message": f"Model server failed mid-stream: {type(exc).__name__}",
                        "type": "server_error",
                        "code": "upstream_failed",
                    }
                }
            )
            return
        with stage(Stage.POSTPROCESS):
            safe = gateway.safety(text)
        if not safe:
            yield _event(
                {
                    "error": {
                        "message": "Response withheld by the safety check.",
                        "type": "content_filter",
                        "code": "content_filter",
                    }
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        await upstream.aclose()  # closing the connection makes vLLM abort the generation
        await release()
        if usage is not None:
            details = usage.get("prompt_tokens_details") or {}
            gateway.bill(
                tenant,
                int(usage.get("prompt_tokens", prompt_tokens)),
                int(usage.get("completion_tokens", generated)),
                int(details.get("cached_tokens") or 0),
            )
        else:  # cut short: bill the prompt and what was generated so far
            gateway.bill(tenant, prompt_tokens, generated, 0)
