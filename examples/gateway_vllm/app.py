"""The reference gateway: seven real stages in front of real vLLM servers.

Order per request (the seven stages of ``stagelens.Stage``): ``gateway`` (stagelens
middleware hooks: API key, rate limit, schema), ``load_balancer`` (backend choice),
``tokenizer`` (real token count, context window), ``router`` (model -> pool, admission),
``inference`` (the instrumented httpx call), ``postprocess`` (safety, stop sequences,
framing), ``billing``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from stagelens.instrumentation import Telemetry, default_telemetry
from stagelens.reference.balancer import Backend, Balancer, HealthChecker
from stagelens.reference.config import GatewayConfig
from stagelens.reference.ledger import TenantUsage, open_ledger, resolve_url
from stagelens.reference.pipeline import (
    Pool,
    Router,
    SafetyCheck,
    TokenCounter,
    apply_stops,
    blocklist_classifier,
    check_context,
)
from stagelens.reference.policy import ApiKeyAuth
from stagelens.reference.ratelimit import RedisTokenBucket, rate_limiter
from stagelens.reference.schema import ChatRequest, CompletionRequest, parse
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

import stagelens
from stagelens import PriceTable, Rejected, Stage, current_request, record_usage, semconv, stage

REQUEST_KEY = "stagelens.reference.request"
TENANT_KEY = "stagelens.reference.tenant"


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
        # In a database: shared by every worker and replica, kept across restarts.
        self.ledger = open_ledger(resolve_url(config.ledger_url))
        self.telemetry: Telemetry | None = None  # set by create_app
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

    def tokenizer_for(self, model: str) -> TokenCounter | None:
        """The token counter of a served model (None for an unknown name)."""
        pool = self.router.pools.get(model)
        return self.tokenizers[pool.config.tokenizer] if pool is not None else None

    async def bill(self, tenant: str, input_tokens: int, output_tokens: int, cached: int) -> None:
        """Billing stage: usage to stagelens (cost, counters) and to the tenant's ledger,
        returning once the ledger has committed it. A ledger that cannot be written does
        not fail the request: the failure is counted
        (``stagelens_telemetry_errors_total{component="ledger"}``) and logged once."""
        record_usage(
            input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=cached
        )
        cost = stagelens.bill() or 0.0
        usage = TenantUsage(1, input_tokens, output_tokens, cached, cost)
        try:
            await self.ledger.add(tenant, usage)
        except Exception as exc:
            if self.telemetry is not None:
                self.telemetry.report_error(semconv.COMPONENT_LEDGER, exc)


def _error(rejection: Rejected) -> JSONResponse:
    return JSONResponse(
        rejection.body(), status_code=rejection.status_code, headers=rejection.headers
    )


def _reject(stage_name: Stage) -> None:
    """Attribute an error answered outside a ``stage()`` block to the stage that failed."""
    state = current_request()
    if state is not None:
        state.reject(stage_name)


def _serving(
    telemetry: Telemetry | None, config: GatewayConfig, prices: PriceTable | None
) -> Telemetry:
    """The Telemetry the gateway records through: where ``telemetry`` (or the default)
    records, with the router's models as the served ones (the ``model`` label's values,
    unless the settings name models themselves) and the gateway's price table, if any."""
    base = telemetry if telemetry is not None else default_telemetry()
    overrides: dict[str, Any] = {}
    if not base.settings.models:
        names = tuple(config.models)
        overrides = {"models": names, "max_models": max(base.settings.max_models, len(names))}
    return base.derive(prices=prices, **overrides)


def create_app(
    config: GatewayConfig,
    *,
    telemetry: Telemetry | None = None,
    safety: SafetyCheck | None = None,
) -> FastAPI:
    """Build the gateway app, instrumented with stagelens (``/metrics`` served by it).

    The app records through a copy of ``telemetry`` (or of the default one) that knows
    what the gateway knows: the router's models are the served ones, so a request for a
    model name it refused never becomes a ``model`` label value (unless the settings name
    the models themselves); and ``config.price_table``, when set, wins over the passed
    telemetry's prices (the gateway's own config is the more specific source). Without
    it, the passed telemetry's prices apply (or, with none passed, the configured
    default's).
    """
    gateway = Gateway(config, safety)
    prices = PriceTable.load(config.price_table) if config.price_table is not None else None
    telemetry = _serving(telemetry, config, prices)
    gateway.telemetry = telemetry
    limiter = rate_limiter(
        config.redis_url,
        config.rate_limit_per_second,
        config.rate_limit_burst,
        lambda exc: telemetry.report_error(semconv.COMPONENT_RATE_LIMITER, exc),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.ledger.open()  # an unreachable database fails the start, not a request
        await gateway.health.check_once(gateway.client)
        gateway.health.start()
        yield
        await gateway.health.stop()
        await gateway.client.aclose()
        await gateway.ledger.close()  # after the last request: its usage is committed
        if isinstance(limiter, RedisTokenBucket):
            await limiter.aclose()

    app = FastAPI(title="stagelens reference gateway", lifespan=lifespan)
    app.state.gateway = gateway
    app.state.telemetry = telemetry
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
        try:
            totals = await gateway.ledger.get(str(tenant))
        except Exception as exc:
            telemetry.report_error(semconv.COMPONENT_LEDGER, exc)
            raise Rejected(
                503, "The usage ledger is unavailable.", type="server_error", code="ledger_error"
            ) from exc
        return JSONResponse({"tenant": tenant, **asdict(totals)})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"backends": {b.url: b.healthy for b in gateway.backends}}

    auth = ApiKeyAuth(config.api_keys)
    stagelens.instrument_app(
        app,
        telemetry=telemetry,
        auth_hook=auth,
        rate_limit_hook=limiter,
        body_hook=gateway.validate,
        metrics_path="/metrics",
    )
    return app


class _Lease:
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


async def _complete(gateway: Gateway, request: Request, *, chat: bool) -> Response:
    req = request.scope[REQUEST_KEY]
    tenant = str(request.scope.get(TENANT_KEY, "other"))
    pool = gateway.router.pools.get(req.model)
    state = current_request()
    if pool is not None and state is not None:
        # Only a model the router serves names the metric series; any other name keeps the
        # default label, so random model names cannot create new series.
        state.set_model(req.model)
    lease = _Lease()
    handed_over = False
    try:
        with stage(Stage.LOAD_BALANCER):
            prefix = ("".join(m.content for m in req.messages) if chat else req.prompt)[
                : gateway.config.prefix_affinity_chars
            ]
            if pool is not None:
                lease.backend = pool.balancer.assign(prefix)

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
            await pool.acquire()
            lease.pool = pool

        body = req.model_dump(exclude_none=True)
        body["model"] = pool.upstream_model
        wants_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        wants_token_ids = bool(body.get("return_token_ids"))
        if req.stream:
            body["stream_options"] = {"include_usage": True}
            # vLLM then lists each event's token ids: a stream cut before the usage event
            # is billed the exact count received, not an estimate.
            body["return_token_ids"] = True
        path = "/v1/chat/completions" if chat else "/v1/completions"
        upstream = await _send(gateway, pool, lease, prefix, path, body, req.stream)
        if upstream.status_code >= 400:
            return await _upstream_error(upstream)
        if not req.stream:
            return await _finish_json(gateway, upstream, req, tenant, prompt_tokens, chat)
        response = _RelayResponse(
            _relay(
                gateway,
                upstream,
                req,
                tenant,
                prompt_tokens,
                _Strip(usage=not wants_usage, token_ids=not wants_token_ids),
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


async def _send(
    gateway: Gateway,
    pool: Pool,
    lease: _Lease,
    prefix: str,
    path: str,
    body: dict[str, Any],
    stream: bool,
) -> httpx.Response:
    """Inference stage: call the backend; fail over to another on a connection error.

    Errors answered here happen outside any ``stage()`` block, so each names the stage that
    failed: the load balancer when no healthy backend is left, inference for a timeout.
    """
    tried: list[Backend] = []
    while True:
        backend = lease.backend
        assert backend is not None
        try:
            return await gateway.client.send(
                gateway.client.build_request("POST", backend.url + path, json=body),
                stream=stream,
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            # No answer at all from this backend: take it out (passive check, until the
            # active check says otherwise) and try another.
            backend.healthy = False
            backend.outstanding -= 1
            lease.backend = None
            tried.append(backend)
            try:
                lease.backend = pool.balancer.assign(prefix, exclude=tried)
            except Rejected:
                _reject(Stage.LOAD_BALANCER)
                raise Rejected(
                    503,
                    f"Backend unavailable: {type(exc).__name__}",
                    type="server_error",
                    code="backend_unavailable",
                ) from exc
        except httpx.TimeoutException as exc:
            _reject(Stage.INFERENCE)
            raise Rejected(
                504,
                "The model server did not answer in time.",
                type="server_error",
                code="upstream_timeout",
            ) from exc
        except httpx.HTTPError as exc:
            _reject(Stage.INFERENCE)
            raise Rejected(
                502,
                f"The model server call failed: {type(exc).__name__}",
                type="server_error",
                code="upstream_error",
            ) from exc


def _client_status(upstream_status: int) -> int:
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


async def _upstream_error(upstream: httpx.Response) -> Response:
    """Answer an upstream error status (before any byte was streamed) with the mapped status
    and an OpenAI-style body carrying the engine's message; the inference stage rejected."""
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
    status = _client_status(upstream.status_code)
    _reject(Stage.INFERENCE)
    return _error(
        Rejected(
            status,
            f"The model server answered {upstream.status_code}: {message}",
            type="invalid_request_error" if status < 500 else "server_error",
            code="upstream_rejected" if status < 500 else "upstream_error",
            param=param,
        )
    )


async def _finish_json(
    gateway: Gateway,
    upstream: httpx.Response,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    chat: bool,
) -> Response:
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
    await gateway.bill(
        tenant,
        int(usage.get("prompt_tokens", prompt_tokens)),
        int(usage.get("completion_tokens", 0)),
        int(details.get("cached_tokens") or 0),
    )
    return JSONResponse(payload)


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass(frozen=True)
class _Strip:
    """What the gateway asked vLLM for on its own account and removes from the client's
    stream unless the client asked too: the usage event and the per-event token ids."""

    usage: bool
    token_ids: bool


class _Counted:
    """Tokens seen in the relayed stream, from vLLM's ``return_token_ids`` lists."""

    def __init__(self) -> None:
        self.prompt: int | None = None  # from ``prompt_token_ids`` (first event)
        self.output = 0
        self.exact = False  # some event carried token ids: ``output`` is exact

    def take(self, holder: dict[str, Any], strip: bool) -> None:
        """Count ``holder``'s token id lists, removing them when ``strip``."""
        prompt = holder.pop("prompt_token_ids", None) if strip else holder.get("prompt_token_ids")
        if isinstance(prompt, list):
            self.prompt = len(prompt)
        ids = holder.pop("token_ids", None) if strip else holder.get("token_ids")
        if isinstance(ids, list):
            self.output += len(ids)
            self.exact = True


class _RelayResponse(StreamingResponse):
    """A StreamingResponse that always closes its relay itself, in the request's context.

    Why: when the client goes away while a chunk is being sent, Starlette abandons the body
    iterator; left to the garbage collector, the relay's cleanup (closing the upstream,
    which makes vLLM abort; releasing the backend and admission slot; billing) would run
    late and outside the request, after its metrics were recorded.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


async def _relay(
    gateway: Gateway,
    upstream: httpx.Response,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    strip: _Strip,
    chat: bool,
    lease: _Lease,
) -> AsyncIterator[bytes]:
    """Pass the upstream SSE stream through event by event (never buffered): stop
    sequences and the safety check per event, usage stripped unless asked for; a backend
    dying mid-stream ends the client's stream with an error event; a stop sequence, a
    safety cut or the client going away closes the upstream connection, which aborts the
    generation; billing always runs with what was generated."""
    text = ""  # what the client was sent
    pieces: list[str] = []  # every content piece the engine produced
    counted = _Counted()  # tokens received, for a stream cut before the usage event
    usage: dict[str, Any] | None = None
    upstream_done = False  # [DONE] seen: read on to the end so the connection is reused
    cut = False  # the gateway ended the stream (stop sequence, safety check)
    buffer = b""
    try:
        try:
            async for chunk in upstream.aiter_raw():
                if upstream_done:
                    continue
                buffer += chunk
                while b"\n\n" in buffer:
                    raw, buffer = buffer.split(b"\n\n", 1)
                    if not raw.startswith(b"data:"):
                        continue
                    data = raw[5:].strip()
                    if data == b"[DONE]":
                        upstream_done = True
                        break
                    event = json.loads(data)
                    if event.get("usage") is not None and not event.get("choices"):
                        usage = event["usage"]
                        if not strip.usage:
                            event.pop("metrics", None)
                            yield _event(event)
                        continue
                    event.pop("usage", None)
                    counted.take(event, strip.token_ids)
                    for choice in event.get("choices", []):
                        counted.take(choice, strip.token_ids)
                        delta = choice.get("delta", {}) if chat else choice
                        piece = delta.get("content") if chat else delta.get("text")
                        if piece:
                            pieces.append(piece)
                            kept, stopped = apply_stops(text + piece, req.stops)
                            if stopped or not gateway.safety(kept):
                                keep = kept[len(text) :] if stopped else ""
                                if chat:
                                    delta["content"] = keep
                                else:
                                    delta["text"] = keep
                                choice["finish_reason"] = "stop" if stopped else "content_filter"
                                cut = True
                            text = kept
                    yield _event(event)
                    if cut:
                        break
                if cut:
                    break
        except httpx.HTTPError as exc:
            if not upstream_done and usage is None:
                _reject(Stage.INFERENCE)
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
        # Shielded: when the client goes away this runs inside a cancelled scope, and the
        # close must still reach the engine (closing the connection aborts the generation),
        # and the usage the ledger.
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            lease.release()
            await _bill_stream(gateway, req, tenant, prompt_tokens, usage, counted, pieces)


async def _bill_stream(
    gateway: Gateway,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    usage: dict[str, Any] | None,
    counted: _Counted,
    pieces: list[str],
) -> None:
    """Bill a stream with vLLM's usage, or, cut short before it, with what was received."""
    if usage is not None:
        details = usage.get("prompt_tokens_details") or {}
        await gateway.bill(
            tenant,
            int(usage.get("prompt_tokens", prompt_tokens)),
            int(usage.get("completion_tokens", 0)),
            int(details.get("cached_tokens") or 0),
        )
    else:
        # Cut short before the engine's usage: bill the token ids vLLM listed in the
        # events received (exact); an engine without ``return_token_ids`` falls back
        # to the tokenizer stage's prompt count and the generated text re-tokenized,
        # which can differ by a few tokens. Cached prompt tokens are unknown without
        # the engine's usage and billed as 0 (full input price), which can only
        # overcharge by the cache discount.
        if counted.exact:
            output = counted.output
        else:
            counter = gateway.tokenizer_for(req.model)
            generated = "".join(pieces)
            output = counter.count_generated(generated) if counter and generated else 0
        prompt = counted.prompt if counted.prompt is not None else prompt_tokens
        await gateway.bill(tenant, prompt, output, 0)
