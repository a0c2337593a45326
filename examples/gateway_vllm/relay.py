"""Post-processing of the engine's answer: stop sequences and the safety check, per choice,
on a whole answer or event by event on a stream (never buffered), then billing.

Why per choice: with ``n > 1`` (or several prompts) every choice is its own text; a stop
sequence or a blocked term ends that choice only. The stream is cut (the upstream closed,
which aborts the generation) once every choice has ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from stagelens.reference.pipeline import SafetyCheck, apply_stops
from stagelens.reference.schema import CompletionRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from stagelens import Stage, current_request, stage

if TYPE_CHECKING:
    from stagelens.reference.app import Gateway
    from stagelens.reference.flow import Lease


class Choices:
    """Each choice's text so far and whether the gateway ended it."""

    def __init__(self, req: Any, safety: SafetyCheck) -> None:
        self.stops = req.stops
        self.keep_stop = bool(req.include_stop_str_in_output)
        # Echoed prompts are not generated text: vLLM never stops inside them.
        self.use_stops = bool(self.stops) and not getattr(req, "echo", False)
        self.safety = safety
        self.texts: dict[int, str] = {}
        self.ended: set[int] = set()
        self.total = (req.n or 1) * (len(req.prompts) if isinstance(req, CompletionRequest) else 1)

    def take(self, index: int, piece: str) -> tuple[str, str | None]:
        """Choice ``index`` produced ``piece``: what of it to show, and the finish reason
        when the gateway ends the choice here (``stop``, ``content_filter``)."""
        text = self.texts.get(index, "")
        kept, stopped = (
            apply_stops(text + piece, self.stops, self.keep_stop)
            if self.use_stops
            else (text + piece, False)
        )
        reason = "stop" if stopped else None
        if not self.safety(kept):
            kept, reason = text, "content_filter"
        self.texts[index] = kept
        if reason is not None:
            self.ended.add(index)
        return kept[len(text) :], reason

    @property
    def all_ended(self) -> bool:
        return len(self.ended) >= self.total


def _text_of(choice: dict[str, Any], chat: bool) -> tuple[dict[str, Any], str, Any]:
    """(holder, key, text) of a choice's content: a chat message or delta, or the choice."""
    if chat:
        holder = choice.get("message") or choice.get("delta") or {}
        return holder, "content", holder.get("content")
    return choice, "text", choice.get("text")


async def finish_json(
    gateway: Gateway,
    upstream: httpx.Response,
    req: Any,
    tenant: str,
    prompt_tokens: int,
    chat: bool,
) -> Response:
    """A whole answer: each choice post-processed, the engine's timings removed, billed
    with vLLM's usage."""
    payload = upstream.json()
    with stage(Stage.POSTPROCESS):
        choices = Choices(req, gateway.safety)
        for choice in payload.get("choices") or []:
            holder, key, text = _text_of(choice, chat)
            if not isinstance(text, str) or not text:
                continue
            kept, reason = choices.take(int(choice.get("index") or 0), text)
            if reason is not None:
                holder[key] = kept
                choice["finish_reason"] = reason
        if "metrics" in payload:  # vLLM's timings, asked for by the gateway: null, as
            payload["metrics"] = None  # vLLM answers without --enable-per-request-metrics
    usage = payload.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    await gateway.bill(  # committed to the ledger before the answer is sent
        tenant,
        int(usage.get("prompt_tokens", prompt_tokens)),
        int(usage.get("completion_tokens", 0)),
        int(details.get("cached_tokens") or 0),
        _reasoning_tokens(usage),
        int(details.get("created_cache_tokens") or 0),
    )
    return JSONResponse(payload)


def event_bytes(data: dict[str, Any]) -> bytes:
    """One SSE event, JSON as compact as vLLM's (non-ASCII text as UTF-8, like vLLM)."""
    return f"data: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


@dataclass(frozen=True)
class Strip:
    """What the gateway asked vLLM for on its own account and removes from the client's
    stream unless the client asked too: the usage event, the per-event token ids and the
    running usage on every event (continuous usage stats)."""

    usage: bool
    token_ids: bool
    running_usage: bool = True


class Counted:
    """Tokens seen in the relayed stream, from vLLM's ``return_token_ids`` lists."""

    def __init__(self) -> None:
        self.prompts: dict[int, int] = {}  # prompt index -> its ``prompt_token_ids`` count
        self.output = 0
        self.exact = False  # some event carried token ids: ``output`` is exact

    def take(self, holder: dict[str, Any], strip: bool, prompt_index: int) -> None:
        """Count ``holder``'s token id lists, nulling them when ``strip`` (as vLLM sends
        them to a client that did not ask for them)."""
        prompt = holder.get("prompt_token_ids")
        if isinstance(prompt, list):
            self.prompts[prompt_index] = len(prompt)
            if strip:
                holder["prompt_token_ids"] = None
        ids = holder.get("token_ids")
        if isinstance(ids, list):
            self.output += len(ids)
            self.exact = True
            if strip:
                holder["token_ids"] = None

    @property
    def prompt(self) -> int | None:
        return sum(self.prompts.values()) if self.prompts else None


class RelayResponse(StreamingResponse):
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


class _Relay:
    """One stream's post-processing state: per-choice texts, counted tokens, usage."""

    def __init__(self, gateway: Gateway, req: Any, strip: Strip, chat: bool) -> None:
        self.choices = Choices(req, gateway.safety)
        self.counted = Counted()
        self.strip = strip
        self.chat = chat
        self.n = req.n or 1
        self.usage: dict[str, Any] | None = None
        self.running: dict[str, Any] | None = None  # the latest event's usage so far
        self.pieces: list[str] = []  # every content piece the engine produced
        self.work = 0.0  # seconds spent on the events: the postprocess stage's share
        self.finished: set[int] = set()  # choices vLLM finished (finish_reason seen)
        self.held: dict[str, Any] | None = None  # the last choice's final event, see below

    def event(self, data: bytes) -> bytes | None:
        """The event(s) the client gets for one upstream event (None: nothing to send)."""
        event = json.loads(data)
        if not isinstance(event, dict):
            return None
        if event.get("usage") is not None and not event.get("choices"):
            self.usage = event["usage"]
            if not self.strip.usage:
                event.pop("metrics", None)  # the gateway's ask (--enable-per-request-metrics)
                return event_bytes(event)
            # Without the usage event vLLM puts its fingerprint on the last choice's final
            # event, held back for this (the usage event follows it at once).
            held, self.held = self.held, None
            if held is not None and "system_fingerprint" in event:
                held["system_fingerprint"] = event["system_fingerprint"]
            return event_bytes(held) if held is not None else None
        out = self._choices(event)
        if out is None:
            return None
        if self.strip.usage and self.finished and len(self.finished) >= self.choices.total:
            self.held = out
            return None
        return event_bytes(out)

    def flush(self) -> bytes | None:
        """The held event, when the stream ended without a usage event."""
        held, self.held = self.held, None
        return event_bytes(held) if held is not None else None

    def _choices(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """A content event post-processed per choice (None: every choice in it had ended)."""
        running = event.get("usage")
        if isinstance(running, dict):
            self.running = running  # the engine's count so far (continuous usage stats)
        if self.strip.running_usage:
            event.pop("usage", None)
        self.counted.take(event, self.strip.token_ids, 0)
        kept = []
        for choice in event.get("choices") or []:
            index = int(choice.get("index") or 0)
            self.counted.take(choice, self.strip.token_ids, index // self.n)
            if choice.get("finish_reason") is not None:
                self.finished.add(index)
            if index in self.choices.ended:
                continue  # the gateway ended this choice; vLLM may still be generating it
            holder, key, piece = _text_of(choice, self.chat)
            if isinstance(piece, str) and piece:
                self.pieces.append(piece)
                shown, reason = self.choices.take(index, piece)
                if shown != piece:
                    holder[key] = shown
                if reason is not None:
                    choice["finish_reason"] = reason
            kept.append(choice)
        if not kept and event.get("choices"):
            return None
        event["choices"] = kept
        return event


async def relay(
    gateway: Gateway,
    upstream: httpx.Response,
    chunks: AsyncIterator[bytes],
    req: Any,
    tenant: str,
    prompt_tokens: int,
    strip: Strip,
    chat: bool,
    lease: Lease,
) -> AsyncIterator[bytes]:
    """Pass the upstream SSE stream through event by event (never buffered): stop
    sequences and the safety check per choice, usage and token ids stripped unless asked
    for; a backend dying mid-stream ends the client's stream with an error event; every
    choice ended by the gateway, or the client going away, closes the upstream connection,
    which aborts the generation; billing always runs with what was generated, committed to
    the ledger before the client gets vLLM's usage (or, without it, the stream's end). The
    work on the events is timed as the postprocess stage, not as inference."""
    state = _Relay(gateway, req, strip, chat)
    perf_counter = time.perf_counter
    billed = False
    upstream_done = False  # [DONE] seen: read on to the end so the connection is reused
    buffer = b""
    try:
        try:
            async for chunk in chunks:
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
                    t0 = perf_counter()
                    out = state.event(data)
                    state.work += perf_counter() - t0
                    if state.usage is not None and not billed:
                        # vLLM's usage arrived: commit it before the client reads it (or,
                        # without a usage event, the final content event held for it).
                        billed = True
                        with anyio.CancelScope(shield=True):
                            await _bill_stream(gateway, req, tenant, prompt_tokens, state)
                    if out is not None:
                        yield out
                    if state.choices.all_ended:
                        break
                if state.choices.all_ended:
                    break
        except httpx.HTTPError as exc:
            if not upstream_done and state.usage is None:
                _reject_inference()
                yield event_bytes(
                    {
                        "error": {
                            "message": f"Model server failed mid-stream: {type(exc).__name__}",
                            "type": "server_error",
                            "param": None,
                            "code": "upstream_failed",
                        }
                    }
                )
                return
        held = state.flush()
        if held is not None:
            yield held
        with stage(Stage.POSTPROCESS):
            unsafe = [i for i, text in state.choices.texts.items() if not gateway.safety(text)]
        _add_postprocess(state.work)
        if unsafe:
            yield event_bytes(
                {
                    "error": {
                        "message": "Response withheld by the safety check.",
                        "type": "content_filter",
                        "param": None,
                        "code": "content_filter",
                    }
                }
            )
        yield b"data: [DONE]\n\n"
    finally:
        # Shielded: when the client goes away this runs inside a cancelled scope, and the
        # close must still reach the engine (closing the connection aborts the generation),
        # and a stream cut before vLLM's usage must still reach the ledger.
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            lease.release()
            if not billed:
                await _bill_stream(gateway, req, tenant, prompt_tokens, state)


def _reject_inference() -> None:
    request = current_request()
    if request is not None:
        request.reject(Stage.INFERENCE)


def _add_postprocess(seconds: float) -> None:
    request = current_request()
    if request is not None:
        request.add_stage_time(Stage.POSTPROCESS, seconds)


async def _bill_stream(
    gateway: Gateway, req: Any, tenant: str, prompt_tokens: int, state: _Relay
) -> None:
    """Bill a stream: vLLM's usage; cut short before it, the running usage of the last
    event received (the engine's own count, where the gateway asked for it: one choice of
    one prompt), else the token ids vLLM listed in the events received (exact). An engine
    without either falls back to the tokenizer stage's prompt count and the generated text
    re-tokenized, which can differ by a few tokens: billed as an estimate. Cached prompt
    tokens are unknown without the engine's final usage and billed as 0 (full input
    price), which can only overcharge by the cache discount."""
    usage = state.usage
    if usage is not None:
        details = usage.get("prompt_tokens_details") or {}
        await gateway.bill(
            tenant,
            int(usage.get("prompt_tokens", prompt_tokens)),
            int(usage.get("completion_tokens", 0)),
            int(details.get("cached_tokens") or 0),
            _reasoning_tokens(usage),
            int(details.get("created_cache_tokens") or 0),
        )
        return
    running = state.running
    if running is not None:
        prompt = int(running.get("prompt_tokens") or prompt_tokens)
        await gateway.bill(tenant, prompt, int(running.get("completion_tokens") or 0), 0)
        return
    counted = state.counted
    estimated = not counted.exact
    if counted.exact:
        output = counted.output
    else:
        counter = gateway.tokenizer_for(req.model)
        generated = "".join(state.pieces)
        output = counter.count_generated(generated) if counter and generated else 0
    prompt = counted.prompt if counted.prompt is not None else prompt_tokens
    await gateway.bill(tenant, prompt, output, 0, estimated=estimated)


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    """vLLM's reasoning tokens (``completion_tokens_details``, written when it runs with a
    reasoning parser), or None: then stagelens' own count of the reasoning events is used."""
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return int(reasoning) if isinstance(reasoning, int) else None
