"""The agent APIs through the gateway: the OpenAI Responses API (``/v1/responses``) and the
Anthropic Messages API (``/v1/messages``), with the seven stages chat has.

The load balancer, tokenizer and router stages as for chat (the tokenizer counts the
request as the chat conversation ``agent_schema.as_chat`` makes of it: an estimate, with
no context-window check, which vLLM makes itself); the inference stage is the instrumented
call to vLLM's own route of the API (``flow.send``, with failover); the answer is relayed
(``agent_relay``) or post-processed whole; billing takes the engine's usage. Errors are
answered in the API's own shape (``api_errors``: the app's handlers shape what is
raised). ``/v1/messages/count_tokens`` is passed through to a backend of the model's pool.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

import httpx
from stagelens.reference.agent_relay import messages_usage, relay_agent
from stagelens.reference.agent_schema import AgentRequest, CountTokensRequest, as_chat
from stagelens.reference.api_errors import for_path
from stagelens.reference.flow import (
    BODY_BYTES_KEY,
    OFF_LOOP_BYTES,
    REQUEST_KEY,
    Lease,
    affinity_key,
    begin,
    send,
    upstream_rejection,
)
from stagelens.reference.pipeline import Pool
from stagelens.reference.relay import RelayResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stagelens import Rejected, Stage, stage

if TYPE_CHECKING:
    from stagelens.reference.app import Gateway

PATHS: Final = {"responses": "/v1/responses", "messages": "/v1/messages"}
"""Each agent API's route, at the gateway and at vLLM alike."""


async def agent(gateway: Gateway, request: Request, api: str) -> Response:
    """A Responses (``api="responses"``) or Messages (``"messages"``) request through the
    stages after the gateway's; the answer relayed (streamed) or post-processed (not)."""
    req, raw, tenant, pool = begin(gateway, request)
    lease = Lease()
    handed_over = False
    path = PATHS[api]
    try:
        pool, prefix, prompt_tokens = await _admit(gateway, request, req, pool, lease)
        body = {**raw, "model": pool.upstream_model}
        upstream, chunks = await send(gateway, pool, lease, prefix, path, body, req.streaming)
        if upstream.status_code >= 400:
            rejection = for_path(path, await upstream_rejection(upstream))
            return JSONResponse(rejection.body(), status_code=rejection.status_code)
        if not req.streaming:
            return await _finish(gateway, upstream, req, tenant, prompt_tokens, api)
        response = RelayResponse(
            relay_agent(gateway, upstream, chunks, req, tenant, prompt_tokens, lease, api),
            media_type="text/event-stream",
        )
        handed_over = True  # the relay releases the lease when the stream ends
        return response
    finally:
        if not handed_over:
            lease.release()


async def _admit(
    gateway: Gateway, request: Request, req: AgentRequest, named: Pool | None, lease: Lease
) -> tuple[Pool, str, int]:
    """The load balancer, tokenizer and router stages, as ``flow._admit`` runs them for
    chat, on the request's chat conversation: (the pool, the prefix-affinity key, the
    prompt's tokens as the gateway counts them, 0 when it cannot)."""
    counter = gateway.tokenizer_for(req.model)
    chat = as_chat(req)
    with stage(Stage.LOAD_BALANCER):
        prefix = affinity_key(chat, counter, gateway.config.prefix_affinity_chars) if chat else ""
        if named is not None:
            lease.backend = named.balancer.assign(prefix)
    with stage(Stage.TOKENIZER):
        prompt_tokens = 0
        if counter is not None and chat is not None and named is not None:
            try:
                if request.scope.get(BODY_BYTES_KEY, 0) <= OFF_LOOP_BYTES:
                    prompt_tokens = counter.count_chat(chat)
                else:
                    prompt_tokens = await gateway.off_loop.run(
                        counter, lambda c: c.count_chat(chat)
                    )
            except Rejected:
                prompt_tokens = 0  # the chat template does not take this rendering: vLLM's own
    with stage(Stage.ROUTER):
        pool = gateway.router.route(req.model, "generate")
        await pool.acquire()
        lease.pool = pool
    return pool, prefix, prompt_tokens


async def _finish(
    gateway: Gateway,
    upstream: httpx.Response,
    req: AgentRequest,
    tenant: str,
    prompt_tokens: int,
    api: str,
) -> Response:
    """A whole answer: its text post-processed (the safety check: an unsafe answer is
    withheld, ended as each API ends a filtered answer), the engine's timings removed,
    billed with the engine's usage before it is sent."""
    payload = upstream.json()
    with stage(Stage.POSTPROCESS):
        texts = _texts(payload, api)
        if texts and not gateway.safety("".join(texts)):
            _withhold(payload, api)
        if "metrics" in payload:  # vLLM's timings, asked for by the gateway's flags
            payload["metrics"] = None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    if api == "messages":
        await gateway.bill(tenant, *messages_usage(usage, prompt_tokens))
    else:
        details = usage.get("input_tokens_details") or {}
        reasoning = (usage.get("output_tokens_details") or {}).get("reasoning_tokens")
        await gateway.bill(
            tenant,
            int(usage.get("input_tokens", prompt_tokens)),
            int(usage.get("output_tokens", 0)),
            int(details.get("cached_tokens") or 0),
            int(reasoning) if isinstance(reasoning, int) else None,
            int(details.get("cache_write_tokens") or 0),
        )
    return JSONResponse(payload)


def _texts(payload: Any, api: str) -> list[str]:
    """The answer's generated text (what the safety check reads)."""
    if not isinstance(payload, dict):
        return []
    if api == "messages":
        blocks = payload.get("content") or []
        return [b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
    found = []
    for item in payload.get("output") or []:
        for part in (item.get("content") or []) if isinstance(item, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                found.append(part["text"])
    return found


def _withhold(payload: dict[str, Any], api: str) -> None:
    """Empty the answer's text; end it as the API ends a filtered answer (the Messages
    API's ``refusal`` stop reason; an incomplete response, for ``content_filter``)."""
    if api == "messages":
        payload["content"] = [b for b in payload.get("content") or [] if b.get("type") != "text"]
        payload["stop_reason"] = "refusal"
        return
    for item in payload.get("output") or []:
        for part in item.get("content") or []:
            if isinstance(part, dict) and "text" in part:
                part["text"] = ""
    payload["status"] = "incomplete"
    payload["incomplete_details"] = {"reason": "content_filter"}


async def count_tokens(gateway: Gateway, request: Request) -> Response:
    """``/v1/messages/count_tokens``, passed through to a backend of the model's pool (its
    answer, or its error in the Messages API's shape)."""
    req: CountTokensRequest
    req, raw = request.scope[REQUEST_KEY]
    path = "/v1/messages/count_tokens"
    pool = gateway.router.route(req.model, "generate")
    with stage(Stage.LOAD_BALANCER):
        backend = pool.balancer.assign("")
    try:
        body = json.dumps({**raw, "model": pool.upstream_model}).encode()
        headers = {"content-type": "application/json"}
        answer = await gateway.client.post(backend.url + path, content=body, headers=headers)
    except httpx.HTTPError as exc:
        message = f"Backend unavailable: {type(exc).__name__}"
        raise Rejected(503, message, type="server_error", code="backend_unavailable") from exc
    finally:
        backend.outstanding -= 1
    if answer.status_code >= 400:
        rejection = for_path(path, await upstream_rejection(answer))
        return JSONResponse(rejection.body(), status_code=rejection.status_code)
    return Response(answer.content, media_type="application/json")
