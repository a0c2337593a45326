"""The agent APIs' streams through the gateway: relayed event by event, unchanged (never
buffered), read on the way for the post-processing stage and for billing.

Per event, the gateway reads what it needs: the answer's text (the safety check at the
end; an unsafe answer is followed by an error event in the API's shape, as chat's is by
its own), everything generated (re-tokenized for a stream cut before the engine's final
usage), and the usage: the Responses API's final response carries it, the Messages API's
``message_start`` the input and ``message_delta`` the final counts. Billing commits the
engine's usage to the ledger before the client gets the event that carries it. A stream
cut before it is billed what the engine said so far (the Messages API's input) and the
gateway's count of the rest, marked estimated; a backend dying mid-stream ends the
client's stream with an error event in the API's shape.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from stagelens.reference.agent_schema import AgentRequest
from stagelens.reference.api_errors import event_error
from stagelens.reference.relay import _add_postprocess, _reject_inference

from stagelens import Stage, stage

if TYPE_CHECKING:
    from stagelens.reference.app import Gateway
    from stagelens.reference.flow import Lease

_TEXT_DELTAS = {
    "responses": {"response.output_text.delta": "delta"},
    "messages": {"content_block_delta": "text"},
}
"""The events holding the answer's text, and its key (in the Messages API's ``delta``)."""
_FINAL = frozenset(("response.completed", "response.incomplete", "response.failed"))


def messages_usage(
    counts: dict[str, Any], prompt_tokens: int = 0
) -> tuple[int, int, int, int | None, int]:
    """``Gateway.bill``'s (input, output, cached, reasoning, written) of the Messages API's
    usage counts: the input is the tokens computed plus those read from and written to the
    cache; its thinking tokens are not said apart (None: stagelens counts them)."""

    def count(name: str) -> int:
        value = counts.get(name)
        return value if isinstance(value, int) and value > 0 else 0

    read, written = count("cache_read_input_tokens"), count("cache_creation_input_tokens")
    computed = count("input_tokens") if "input_tokens" in counts else prompt_tokens
    return computed + read + written, count("output_tokens"), read, None, written


class _Stream:
    """What the gateway reads of one agent stream."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.texts: list[str] = []
        """The answer's text (the safety check's)."""
        self.generated: list[str] = []
        """Everything generated: text, thinking, tool arguments (billing a cut stream)."""
        self.counts: dict[str, Any] = {}
        """The usage the engine said so far (the Messages API's laid over each other)."""
        self.final = False
        """``counts`` are the engine's final usage."""
        self.work = 0.0
        """Seconds spent reading the events: the postprocess stage's share."""

    def read(self, raw: bytes) -> None:
        """Read one event (its lines, without the blank line ending it)."""
        name = data = None
        for line in raw.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                data = line[5:].strip()
        if data is None:
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        name = name or str(event.get("type"))
        if name.endswith(".delta") or name == "content_block_delta":
            self._delta(name, event)
        elif self.api == "responses" and name in _FINAL:
            usage = (event.get("response") or {}).get("usage")
            if isinstance(usage, dict):
                self.counts, self.final = usage, True
        elif name in ("message_start", "message_delta"):
            holder = event.get("message") if name == "message_start" else event
            usage = holder.get("usage") if isinstance(holder, dict) else None
            if isinstance(usage, dict):
                self.counts.update(usage)
                self.final = self.final or name == "message_delta"

    def _delta(self, name: str, event: dict[str, Any]) -> None:
        delta = event.get("delta")
        if isinstance(delta, dict):  # the Messages API's: text, thinking or tool input
            pieces = [delta.get(k) for k in ("text", "thinking", "partial_json")]
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self.texts.append(delta["text"])
        else:
            pieces = [delta]
            if name in _TEXT_DELTAS["responses"] and isinstance(delta, str):
                self.texts.append(delta)
        self.generated += [p for p in pieces if isinstance(p, str)]


async def relay_agent(
    gateway: Gateway,
    upstream: httpx.Response,
    chunks: AsyncIterator[bytes],
    req: AgentRequest,
    tenant: str,
    prompt_tokens: int,
    lease: Lease,
    api: str,
) -> AsyncIterator[bytes]:
    """Relay an agent API's stream (see the module docstring); the upstream is closed,
    the lease released and the stream billed however it ends."""
    state = _Stream(api)
    perf_counter = time.perf_counter
    billed = False
    buffer = b""
    try:
        try:
            async for chunk in chunks:
                buffer += chunk
                while b"\n\n" in buffer:
                    raw, buffer = buffer.split(b"\n\n", 1)
                    t0 = perf_counter()
                    state.read(raw)
                    state.work += perf_counter() - t0
                    if state.final and not billed:
                        # The engine's usage arrived: committed before the client reads it.
                        billed = True
                        with anyio.CancelScope(shield=True):
                            await _bill(gateway, req, tenant, prompt_tokens, state)
                    yield raw + b"\n\n"
            if buffer:
                yield buffer
        except httpx.HTTPError as exc:
            if not state.final:
                _reject_inference()
                message = f"Model server failed mid-stream: {type(exc).__name__}"
                yield _event(api, event_error(api, message, "upstream_failed"))
                return
        with stage(Stage.POSTPROCESS):
            unsafe = not gateway.safety("".join(state.texts))
        _add_postprocess(state.work)
        if unsafe:
            message = "Response withheld by the safety check."
            error = event_error(api, message, "content_filter", "invalid_request_error")
            yield _event(api, error)
    finally:
        # Shielded: when the client goes away this runs inside a cancelled scope, and the
        # close must still reach the engine (closing the connection aborts the generation),
        # and a stream cut before the engine's usage must still reach the ledger.
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
            lease.release()
            if not billed:
                await _bill(gateway, req, tenant, prompt_tokens, state)


def _event(api: str, data: dict[str, Any]) -> bytes:
    """One SSE event of ``data``, named by its type as both APIs name theirs."""
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _bill(
    gateway: Gateway, req: AgentRequest, tenant: str, prompt_tokens: int, state: _Stream
) -> None:
    """Bill the stream: the engine's final usage; cut before it, what the engine said so
    far (the Messages API's input) with the rest counted by the gateway (the prompt the
    tokenizer stage counted, the generated text re-tokenized), marked estimated."""
    counts = state.counts
    if state.api == "messages" and counts:
        total, output, read, reasoning, written = messages_usage(counts, prompt_tokens)
    elif state.final:
        details = counts.get("input_tokens_details") or {}
        reasoning = (counts.get("output_tokens_details") or {}).get("reasoning_tokens")
        total = int(counts.get("input_tokens") or 0)
        output = int(counts.get("output_tokens") or 0)
        read, written = (
            int(details.get("cached_tokens") or 0),
            int(details.get("cache_write_tokens") or 0),
        )
        reasoning = reasoning if isinstance(reasoning, int) else None
    else:
        total, output, read, reasoning, written = prompt_tokens, 0, 0, None, 0
    if not state.final:
        counter = gateway.tokenizer_for(req.model)
        generated = "".join(state.generated)
        output = counter.count_generated(generated) if counter and generated else 0
    await gateway.bill(tenant, total, output, read, reasoning, written, estimated=not state.final)
