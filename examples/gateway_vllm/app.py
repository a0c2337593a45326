"""The reference gateway: seven real stages in front of real vLLM servers.

Order per request (the seven stages of ``stagelens.Stage``): ``gateway`` (stagelens
middleware hooks: API key, rate limit, schema), ``load_balancer`` (backend choice),
``tokenizer`` (real token count, context window), ``router`` (model -> pool, admission),
``inference`` (the instrumented httpx call), ``postprocess`` (safety, stop sequences,
framing), ``billing``. The request flow is in ``flow``, the relay of answers in ``relay``;
the agent APIs (OpenAI Responses, Anthropic Messages) in ``agent_flow`` and
``agent_relay``, each answering errors in its own shape (``api_errors``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from stagelens.instrumentation import Telemetry, default_telemetry
from stagelens.reference.agent_flow import agent, count_tokens
from stagelens.reference.agent_schema import CountTokensRequest, MessagesRequest, ResponsesRequest
from stagelens.reference.api_errors import for_path, shaping
from stagelens.reference.balancer import Backend, Balancer, HealthChecker
from stagelens.reference.config import GatewayConfig
from stagelens.reference.flow import (
    BODY_BYTES_KEY,
    OFF_LOOP_BYTES,
    REQUEST_KEY,
    TENANT_KEY,
    complete,
    embed,
)
from stagelens.reference.ledger import TenantUsage
from stagelens.reference.ledger_url import open_ledger, resolve_url
from stagelens.reference.pipeline import Pool, Router, SafetyCheck, blocklist_classifier
from stagelens.reference.policy import ApiKeyAuth, BodyLimit
from stagelens.reference.ratelimit import RedisTokenBucket, rate_limiter
from stagelens.reference.schema import ChatRequest, CompletionRequest, EmbeddingRequest, parse
from stagelens.reference.tokens import OffLoop, TokenCounter
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

import stagelens
from stagelens import PriceTable, Rejected, record_usage, semconv
from stagelens.errors import ConfigurationError

_BODIES: dict[str, type[Any]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
}
"""The routes whose JSON body the gateway stage validates, and their schema."""

PUBLIC_PATHS = ("/health",)
"""Paths served without an API key (``/health`` tells only up or down)."""


class Gateway:
    """State shared by all requests (backends, pools, tokenizers, usage); nothing per request."""

    def __init__(self, config: GatewayConfig, safety: SafetyCheck | None = None) -> None:
        self.config = config
        backends: dict[str, Backend] = {}
        pools: dict[str, Pool] = {}
        self.tokenizers: dict[tuple[str, str], TokenCounter] = {}
        self.off_loop = OffLoop()  # big inputs are tokenized on a worker thread
        for name, pool_config in config.models.items():
            members = [backends.setdefault(u, Backend(u)) for u in pool_config.backends]
            pools[name] = Pool(name, pool_config, Balancer(members, config.balancing))
            key = (pool_config.tokenizer, pool_config.chat_template_content_format)
            if key not in self.tokenizers:
                self.tokenizers[key] = TokenCounter(*key)
        self.backends = list(backends.values())
        self.router = Router(pools)
        self.health = HealthChecker(self.backends, config.health_interval_seconds)
        self.safety = safety or blocklist_classifier(config.blocked_terms)
        # In a database: shared by every worker and replica, kept across restarts.
        self.ledger = open_ledger(resolve_url(config.ledger_url))
        self.telemetry: Telemetry | None = None  # set by create_app
        self.started = int(time.time())
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.upstream_timeout_seconds, connect=5.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
        )

    async def validate(self, scope: dict[str, Any], body: bytes) -> None:
        """Body hook (gateway stage): schema validation, 400 naming the problem. A body
        over ``OFF_LOOP_BYTES`` is parsed on a worker thread (the event loop keeps
        serving); the size limit (413) was checked while it was read."""
        kind = _BODIES.get(scope.get("path", ""))
        if kind is not None and scope.get("method") == "POST":
            scope[BODY_BYTES_KEY] = len(body)
            if len(body) > OFF_LOOP_BYTES:
                scope[REQUEST_KEY] = await anyio.to_thread.run_sync(parse, body, kind)
            else:
                scope[REQUEST_KEY] = parse(body, kind)

    def tokenizer_for(self, model: str) -> TokenCounter | None:
        """The token counter of a served model (None for an unknown name)."""
        pool = self.router.pools.get(model)
        if pool is None:
            return None
        return self.tokenizers[(pool.config.tokenizer, pool.config.chat_template_content_format)]

    def model_card(self, name: str) -> dict[str, Any]:
        """A served model in vLLM's ``/v1/models`` format (the router's pool ``name``)."""
        pool = self.router.pools[name]
        return {
            "id": name,
            "object": "model",
            "created": self.started,
            "owned_by": "vllm",
            "root": pool.upstream_model,
            "parent": None,
            "max_model_len": pool.config.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{secrets.token_hex(8)}",
                    "object": "model_permission",
                    "created": self.started,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }

    @property
    def up(self) -> bool:
        """Every pool has a healthy backend."""
        return all(
            any(b.healthy for b in pool.balancer.backends) for pool in self.router.pools.values()
        )

    async def bill(
        self,
        tenant: str,
        input_tokens: int,
        output_tokens: int,
        cached: int,
        reasoning: int | None = None,
        written: int = 0,
        *,
        estimated: bool = False,
    ) -> None:
        """Billing stage: usage to stagelens (cost, counters) and to the tenant's ledger,
        returning once the ledger has committed it; ``written``: the input tokens written
        to the prompt cache; ``estimated``: the counts are the gateway's estimate, not the
        engine's. A ledger that cannot be written does not fail the request: the failure
        is counted (``stagelens_telemetry_errors_total{component="ledger"}``) and logged
        once."""
        record_usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached,
            reasoning_output_tokens=reasoning,
            cache_write_input_tokens=written,
            estimated=estimated,
        )
        cost = stagelens.bill() or 0.0
        usage = TenantUsage(1, input_tokens, output_tokens, cached, cost)
        try:
            await self.ledger.add(tenant, usage)
        except Exception as exc:
            if self.telemetry is not None:
                self.telemetry.report_error(semconv.COMPONENT_LEDGER, exc)


def _error(path: str, rejection: Rejected) -> JSONResponse:
    """The rejection answered in the shape of the API ``path`` belongs to."""
    shaped = for_path(path, rejection)
    return JSONResponse(shaped.body(), status_code=shaped.status_code, headers=shaped.headers)


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


def _http_error(exc: HTTPException) -> Rejected:
    """Starlette's own errors (no such route, wrong method) in OpenAI's format."""
    codes = {404: "not_found", 405: "method_not_allowed"}
    return Rejected(
        exc.status_code,
        str(exc.detail),
        type="invalid_request_error" if exc.status_code < 500 else "server_error",
        code=codes.get(exc.status_code, f"http_{exc.status_code}"),
        headers=dict(exc.headers or {}),
    )


def create_app(
    config: GatewayConfig,
    *,
    telemetry: Telemetry | None = None,
    safety: SafetyCheck | None = None,
) -> FastAPI:
    """Build the gateway app, instrumented with stagelens. Its ``/metrics`` is not on this
    app (the public API's port): serve :func:`metrics_app` on an internal port.

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
        await gateway.off_loop.close()  # the token counting process, if one started
        if isinstance(limiter, RedisTokenBucket):
            await limiter.aclose()

    app = FastAPI(title="stagelens reference gateway", lifespan=lifespan)
    app.state.gateway = gateway
    app.state.telemetry = telemetry
    stagelens.instrument_httpx_client(gateway.client, telemetry=telemetry)

    @app.exception_handler(Rejected)
    async def rejected(request: Request, exc: Rejected) -> Response:
        return _error(request.url.path, exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(request.url.path, _http_error(exc))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [gateway.model_card(n) for n in gateway.router.pools]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model not in gateway.router.pools:
            raise Rejected(
                404, f"The model {model!r} does not exist.", param="model", code="model_not_found"
            )
        return gateway.model_card(model)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await complete(gateway, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(gateway, request, chat=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await embed(gateway, request)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await agent(gateway, request, "responses")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await agent(gateway, request, "messages")

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request) -> Response:
        return await count_tokens(gateway, request)

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
    async def health() -> Response:
        up = gateway.up
        return JSONResponse({"status": "up" if up else "down"}, status_code=200 if up else 503)

    _check_excluded(app, telemetry)
    auth = ApiKeyAuth(config.api_keys, public_paths=PUBLIC_PATHS)
    stagelens.instrument_app(  # each hook's rejections in the shape of the request's API
        app,
        telemetry=telemetry,
        auth_hook=shaping(auth),
        rate_limit_hook=shaping(limiter),
        body_hook=shaping(gateway.validate),
    )
    # Added last, so outermost: the body hook's read of a body over the limit answers 413.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    return app


def _check_excluded(app: FastAPI, telemetry: Telemetry) -> None:
    """Refuse a setting that would serve a route without its checks: the API key, rate
    limit and body checks are the middleware's hooks, and the middleware passes a path
    ``STAGELENS_EXCLUDED_PATHS`` names to the app untouched, hooks and all."""
    routes = {getattr(route, "path", None) for route in app.routes} - {None, *PUBLIC_PATHS}
    served = sorted(path for path in telemetry.settings.excluded_paths if path in routes)
    if served:
        raise ConfigurationError(
            f"STAGELENS_EXCLUDED_PATHS names {', '.join(served)}: the gateway checks the API "
            "key, rate limit and body of those routes in the middleware, which an excluded "
            "path skips. Leave them out (only /health may be excluded)."
        )


def metrics_app(app: FastAPI) -> Any:
    """The ASGI app serving the gateway's Prometheus metrics, for an internal port of its
    own (``config.metrics_host``/``metrics_port``; the demo serves it there)."""
    return app.state.telemetry.metrics_app()
