"""The agent APIs' request schemas, validated in the gateway stage: the OpenAI Responses API
(``/v1/responses``) and the Anthropic Messages API (``/v1/messages``, and
``/v1/messages/count_tokens``).

As for chat (``schema``): the client's own JSON is forwarded, and these models only decide
whether the request is well formed in the fields the gateway reads (model, stream, the
output limit, the prompt's shape); everything else reaches vLLM untouched.

``as_chat`` turns a request into the chat conversation the tokenizer stage counts: the
instructions or system prompt, then each message's text (tool calls and results as vLLM
hands them to a chat template), with the function tools. vLLM's own conversion renders
some blocks (images, documents, reasoning items) its own way, so the count is the gateway's
estimate: it keys prefix affinity and bills a stream cut before the engine said its input,
and is no context-window check (vLLM refuses an over-long prompt itself, in the API's
error shape).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationError
from stagelens.reference.schema import ChatRequest, _Open

Blocks = list[dict[str, Any]]
"""Content blocks or input items: objects the gateway reads the text of, vLLM the rest."""


class ResponsesRequest(_Open):
    """``POST /v1/responses``."""

    model: StrictStr = Field(min_length=1)
    input: StrictStr | Blocks
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    stream: StrictBool | None = False
    tools: Blocks | None = None
    temperature: float | None = Field(default=None, ge=0)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)


class AnthropicMessage(_Open):
    """One message of the Messages API: text, or content blocks."""

    role: Literal["user", "assistant", "system"]
    content: StrictStr | Blocks


class _MessagesCommon(_Open):
    model: StrictStr = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | Blocks | None = None
    tools: Blocks | None = None


class MessagesRequest(_MessagesCommon):
    """``POST /v1/messages``: ``max_tokens`` is required, as Anthropic's API requires it."""

    max_tokens: StrictInt = Field(ge=1)
    stream: StrictBool | None = False
    stop_sequences: list[StrictStr] | None = None
    temperature: float | None = Field(default=None, ge=0)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)


class CountTokensRequest(_MessagesCommon):
    """``POST /v1/messages/count_tokens``."""

    @property
    def streaming(self) -> bool:
        return False


AgentRequest = ResponsesRequest | MessagesRequest
"""A generation request of an agent API."""


def _text(value: Any) -> str:
    """The text of content: a string, or its blocks' ``text`` joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [b.get("text") for b in value if isinstance(b, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _responses_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    for item in req.input:
        role = item.get("role")
        if role in ("system", "developer", "user", "assistant"):
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif item.get("type") == "function_call":
            call: dict[str, Any] = {"id": str(item.get("call_id") or "call"), "type": "function"}
            arguments = item.get("arguments") or "{}"
            call["function"] = {"name": str(item.get("name")), "arguments": arguments}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.get("type") == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "content": content})
    return messages


def _messages_messages(req: _MessagesCommon) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": _text(req.system)})
    for message in req.messages:
        content = message.content
        blocks = content if isinstance(content, list) else []
        calls = [
            {
                "id": str(block.get("id") or "call"),
                "type": "function",
                "function": {"name": str(block.get("name")), "arguments": block.get("input") or {}},
            }
            for block in blocks
            if block.get("type") == "tool_use"
        ]
        for block in blocks:
            if block.get("type") == "tool_result":
                messages.append({"role": "tool", "content": _text(block.get("content"))})
        text = content if isinstance(content, str) else _text(blocks)
        if text or calls:
            out: dict[str, Any] = {"role": message.role, "content": text or None}
            if calls and message.role == "assistant":
                out["tool_calls"] = calls
            messages.append(out)
    return messages


def _tools(tools: Blocks | None, schema_key: str) -> list[dict[str, Any]] | None:
    """Function tools as chat takes them (the Responses API's ``parameters``, the
    Messages API's ``input_schema``); hosted tools are not rendered."""
    found = []
    for tool in tools or []:
        name = tool.get("name")
        if isinstance(name, str) and name and tool.get("type") in ("function", "custom", None):
            function = {"name": name, "parameters": tool.get(schema_key)}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            found.append({"type": "function", "function": function})
    return found or None


def as_chat(req: ResponsesRequest | MessagesRequest | CountTokensRequest) -> ChatRequest | None:
    """The chat conversation the tokenizer stage counts for ``req`` (module docstring);
    None when it makes no chat request (nothing to count then)."""
    if isinstance(req, ResponsesRequest):
        messages, tools = _responses_messages(req), _tools(req.tools, "parameters")
    else:
        messages, tools = _messages_messages(req), _tools(req.tools, "input_schema")
    if not messages:
        return None
    try:
        return ChatRequest.model_validate(
            {"model": req.model, "messages": messages, "tools": tools}
        )
    except ValidationError:
        return None
