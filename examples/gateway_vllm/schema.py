"""Request schemas: validated in the gateway stage; a bad field answers 400 naming it."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stagelens import Rejected


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)

    @property
    def output_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 16

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(_Common):
    prompt: str = Field(min_length=1)


def parse(body: bytes, kind: type[_Common]) -> Any:
    """Validate ``body``; Rejected(400) names the first bad field in ``param``."""
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise Rejected(
            400, f"Request body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from exc
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise Rejected(
            400, f"Invalid request: {param}: {first['msg']}", param=param, code="invalid_request"
        ) from exc
