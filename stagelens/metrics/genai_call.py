"""What the GenAI metrics need to know about a request's upstream call, beyond its figures.

Why a record of its own: the gateway series are labelled by model and code only, but the
GenAI semantic conventions describe each request by its operation (``chat``, ...), its
streaming, the model the engine answered with and the engine's address. The upstream
instrumentation learns these; they ride to the fold on the request's ``RequestRecord``, and
only when a GenAI sink is installed (``RequestSink.needs_genai``), so that with the GenAI
metrics off nothing is built.
"""

from __future__ import annotations

from typing import NamedTuple


class GenAICall(NamedTuple):
    """One request's upstream GenAI call (the last one, when there were several)."""

    operation: str
    """``gen_ai.operation.name``: ``chat`` or ``text_completion`` (the calls the upstream
    instrumentation wraps)."""
    stream: bool
    """The client asked for a streamed (SSE) answer: only then is the first body chunk the
    first token."""
    server_address: str | None
    """Host of the engine called (``server.address``)."""
    server_port: int | None
    """Port of the engine called (``server.port``), when the URL names one."""
    response_model: str | None = None
    """The model name the engine answered with (``gen_ai.response.model``), when read."""
