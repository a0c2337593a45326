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

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationError
from stagelens.reference.schema import ChatRequest, _Open

Blocks = list[dict[str, Any]]
"""Content blocks or input items, as the gateway reads them (their text)."""


class InputPart(_Open):
    """A part of a Responses API message's content: text (counted) or media (vLLM's)."""

    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file"]
    text: StrictStr | None = None


class InputMessage(_Open):
    """A Responses API input item that is a message."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[InputPart]


class FunctionCallItem(_Open):
    """A tool call the model made, given back as input."""

    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr


class FunctionOutputItem(_Open):
    """A tool call's result, given as input."""

    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1)
    output: StrictStr


class FunctionTool(_Open):
    """A function the model may call (the Responses API's flat form)."""

    type: Literal["function"]
    name: StrictStr = Field(min_length=1)
    parameters: dict[str, Any] | None = None
    description: StrictStr | None = None


class ResponsesRequest(_Open):
    """``POST /v1/responses``."""

    model: StrictStr = Field(min_length=1)
    input: StrictStr | list[InputMessage | FunctionCallItem | FunctionOutputItem]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    stream: StrictBool | None = False
    tools: list[FunctionTool] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)


class Block(_Open):
    """A content block of the Messages API: text, thinking, a tool call or its result
    (media passes to vLLM)."""

    type: Literal["text", "image", "tool_use", "tool_result", "thinking", "document"]
    text: StrictStr | None = None
    id: StrictStr | None = None
    name: StrictStr | None = None
    input: dict[str, Any] | None = None
    tool_use_id: StrictStr | None = None
    content: StrictStr | list[dict[str, Any]] | None = None


class TextBlock(_Open):
    """A text block (a system prompt's)."""

    type: Literal["text"]
    text: StrictStr


class AnthropicMessage(_Open):
    """One message of the Messages API: text, or content blocks."""

    role: Literal["user", "assistant"]
    content: StrictStr | list[Block]


class AnthropicTool(_Open):
    """A tool the model may call: its name and its input's JSON schema."""

    name: StrictStr = Field(min_length=1)
    input_schema: dict[str, Any]
    description: StrictStr | None = None


class _MessagesCommon(_Open):
    model: StrictStr = Field(min_length=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: StrictStr | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None


class MessagesRequest(_MessagesCommon):
    """``POST /v1/messages``: ``max_tokens`` is required, as Anthropic's API requires it."""

    max_tokens: StrictInt = Field(ge=1)
    stream: StrictBool | None = False
    stop_sequences: list[StrictStr] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)

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
    """The text of content: a string, or its parts' or blocks' text joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [
            getattr(b, "text", None) if not isinstance(b, dict) else b.get("text") for b in value
        ]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _responses_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    for item in req.input:
        if isinstance(item, InputMessage):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
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
                "id": block.id or "call",
                "type": "function",
                "function": {"name": block.name or "tool", "arguments": block.input or {}},
            }
            for block in blocks
            if block.type == "tool_use"
        ]
        for block in blocks:
            if block.type == "tool_result":
                result = {"role": "tool", "content": _text(block.content)}
                messages.append(result | {"tool_call_id": block.tool_use_id or "call"})
        text = (
            content if isinstance(content, str) else _text([b for b in blocks if b.type == "text"])
        )
        if text or calls:
            out: dict[str, Any] = {"role": message.role, "content": text or None}
            if calls and message.role == "assistant":
                out["tool_calls"] = calls
            messages.append(out)
    return messages


def _tools(tools: list[FunctionTool] | list[AnthropicTool] | None) -> list[dict[str, Any]] | None:
    """Function tools as chat takes them (the Responses API's ``parameters``, the
    Messages API's ``input_schema``)."""
    found = []
    for tool in tools or []:
        schema = tool.parameters if isinstance(tool, FunctionTool) else tool.input_schema
        function: dict[str, Any] = {"name": tool.name, "parameters": schema}
        if tool.description is not None:
            function["description"] = tool.description
        found.append({"type": "function", "function": function})
    return found or None


def as_chat(req: ResponsesRequest | MessagesRequest | CountTokensRequest) -> ChatRequest | None:
    """The chat conversation the tokenizer stage counts for ``req`` (module docstring);
    None when it makes no chat request (nothing to count then)."""
    if isinstance(req, ResponsesRequest):
        messages, tools = _responses_messages(req), _tools(req.tools)
    else:
        messages, tools = _messages_messages(req), _tools(req.tools)
    if not messages:
        return None
    try:
        return ChatRequest.model_validate(
            {"model": req.model, "messages": messages, "tools": tools}
        )
    except ValidationError:
        return None
