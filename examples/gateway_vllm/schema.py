"""Request schemas, validated in the gateway stage: what vLLM accepts, and only the fields
the gateway reads are checked; a bad one answers 400 naming it (``param``).

Why the gateway forwards the client's own JSON, not these models: a client must get what
vLLM would answer it, so every field the gateway does not read (``tools``, ``tool_choice``,
``response_format``, ``logprobs``, ``seed``, penalties, vLLM's own extras...) reaches vLLM
untouched; these models only decide whether the request is well formed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
)

from stagelens import Rejected

TEXT_PART_KEYS: dict[str, str] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
"""Content part type -> the key holding its text (vLLM's text parts)."""

MEDIA_PART_MODALITIES: dict[str, str] = {
    "image_url": "image",
    "input_image": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
    "file": "file",
}
"""Content part type -> the modality a served model must take to accept it."""

_TAG = "~"
"""Union branch tags start with it; they are left out of the ``param`` named in errors."""


class _Open(BaseModel):
    """Fields vLLM knows and the gateway does not read pass through (``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    """A part of a message's ``content``: text (counted) or media (passed to the engine)."""

    type: Literal[
        "text",
        "input_text",
        "output_text",
        "refusal",
        "thinking",
        "image_url",
        "input_image",
        "image_embeds",
        "audio_url",
        "input_audio",
        "audio_embeds",
        "video_url",
        "video_embeds",
        "file",
        "tool_reference",
    ]
    text: StrictStr | None = None
    refusal: StrictStr | None = None
    thinking: StrictStr | None = None

    @property
    def text_value(self) -> str | None:
        """The part's text when it is a text part, else None."""
        key = TEXT_PART_KEYS.get(self.type)
        value = getattr(self, key) if key is not None else None
        return value if isinstance(value, str) else None


def _content_branch(value: Any) -> str | None:
    if isinstance(value, str):
        return _TAG + "text"
    if isinstance(value, list):
        return _TAG + "parts"
    return None


Content = Annotated[
    Annotated[StrictStr, Tag(_TAG + "text")] | Annotated[list[ContentPart], Tag(_TAG + "parts")],
    Discriminator(
        _content_branch,
        custom_error_type="invalid_content",
        custom_error_message="content must be a string, a list of content parts or null",
    ),
]


class FunctionCall(_Open):
    """An assistant message's call: name and arguments (a JSON string, as OpenAI sends)."""

    name: StrictStr
    arguments: StrictStr | dict[str, Any] = "{}"


class ToolCall(_Open):
    """One of an assistant message's ``tool_calls``."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    """A chat message; ``content`` may be null (an assistant message with ``tool_calls``)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None


class StreamOptions(_Open):
    include_usage: StrictBool | None = False
    continuous_usage_stats: StrictBool | None = False


class FunctionDefinition(_Open):
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Open):
    """A tool the model may call (vLLM renders it into the prompt through the template)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class _Common(_Open):
    model: StrictStr = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    include_stop_str_in_output: StrictBool | None = False
    return_token_ids: StrictBool | None = None

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool | None = True
    continue_final_message: StrictBool | None = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0)

    @property
    def output_limit(self) -> int:
        """Tokens the answer may take: vLLM's default for chat is what the window leaves,
        so without a limit the prompt only has to leave room for one token."""
        return self.max_completion_tokens or self.max_tokens or 1


TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


def _prompt_branch(value: Any) -> str | None:
    if isinstance(value, str):
        return _TAG + "text"
    if not isinstance(value, list) or not value:
        return _TAG + "texts" if isinstance(value, list) else None
    first = value[0]
    if isinstance(first, str):
        return _TAG + "texts"
    if isinstance(first, list):
        return _TAG + "token_lists"
    return _TAG + "tokens"


Prompt = Annotated[
    Annotated[StrictStr, Tag(_TAG + "text")]
    | Annotated[list[StrictStr], Tag(_TAG + "texts"), Field(min_length=1)]
    | Annotated[TokenIds, Tag(_TAG + "tokens")]
    | Annotated[list[TokenIds], Tag(_TAG + "token_lists"), Field(min_length=1)],
    Discriminator(
        _prompt_branch,
        custom_error_type="invalid_prompt",
        custom_error_message=(
            "prompt must be a string, a list of strings, a list of token ids or a list of "
            "token id lists"
        ),
    ),
]


class CompletionRequest(_Common):
    prompt: Prompt
    echo: StrictBool | None = False
    logprobs: StrictInt | None = Field(default=None, ge=0)

    @property
    def output_limit(self) -> int:
        """vLLM's completions default is 16 tokens."""
        return 16 if self.max_tokens is None else self.max_tokens

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: text or token ids (a batch has several)."""
        prompt: Any = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [list(prompt)]
        return list(prompt)


class EmbeddingRequest(_Open):
    model: StrictStr = Field(min_length=1)
    input: Prompt
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: StrictInt | None = Field(default=None, ge=1)

    @property
    def inputs(self) -> list[str | list[int]]:
        """Each input of the request: text or token ids."""
        return CompletionRequest.model_construct(prompt=self.input).prompts

    @property
    def streaming(self) -> bool:
        return False


def _param(loc: tuple[int | str, ...]) -> str | None:
    """The dotted path of a field (``messages.0.content``), union branch tags left out."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith(_TAG))]
    return ".".join(parts) or None


MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (vLLM's requests need a handful;
a JSON schema in ``tools`` a few dozen). Deeper answers 400 ``nesting_too_deep``: left to
the JSON decoder, the chat template and httpx, a deep body ends in ``RecursionError``."""

_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
"""A UTF-16 surrogate in a body, escaped (``\\ud800``) or as the bytes Python's decoder lets
through: a lone one cannot be encoded as UTF-8 (prefix hashing, httpx), so it answers 400."""


def _constant(name: str) -> float:
    """``NaN``, ``Infinity``, ``-Infinity``: not JSON, refused (vLLM's encoder would be
    sent what it cannot serialise back)."""
    raise Rejected(
        400,
        f"Request body has a non-finite number ({name}); JSON numbers must be finite.",
        param=None,
        code="invalid_number",
    )


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one too large for a float (``1e400``)
    would become infinity, and is refused like ``Infinity``."""
    value = float(text)
    if not math.isfinite(value):
        _constant(text)
    return value


def _path(path: tuple[int | str, ...]) -> str | None:
    return ".".join(map(str, path)) or None


def check_values(data: Any) -> None:
    """400 naming the first place where ``data`` nests deeper than :data:`MAX_DEPTH` or
    holds a string (or key) with a lone surrogate. Iterative: depth cannot overflow it."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if len(path) >= MAX_DEPTH:
            raise Rejected(
                400,
                f"Request body nests deeper than {MAX_DEPTH} levels.",
                param=_path(path[:1]),  # the top-level field holding it
                code="nesting_too_deep",
            )
        for key, item in items:
            if isinstance(key, str):
                _check_text(key, path)
            if isinstance(item, (str, dict, list)):
                stack.append((item, (*path, key)))


def _check_text(text: str, path: tuple[int | str, ...]) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise Rejected(
            400,
            "Request body has a lone UTF-16 surrogate (invalid Unicode) in a string.",
            param=_path(path),
            code="invalid_unicode",
        ) from exc


def parse(body: bytes, kind: type[BaseModel]) -> tuple[Any, dict[str, Any]]:
    """Validate ``body``: (the validated request, the client's JSON object as sent).

    Rejected(400) names the problem: not JSON (``invalid_json``), a non-finite number
    (``invalid_number``), nesting too deep (``nesting_too_deep``), a lone surrogate
    (``invalid_unicode``), or the first bad field in ``param`` (``invalid_request``).
    The deep walk runs only when the body could need it (more brackets than the depth
    limit, or a surrogate in its bytes): most bodies pay two byte counts and a search.
    """
    try:
        data = json.loads(body or b"null", parse_constant=_constant, parse_float=_finite)
    except RecursionError as exc:
        raise Rejected(
            400,
            f"Request body nests deeper than {MAX_DEPTH} levels.",
            param=None,
            code="nesting_too_deep",
        ) from exc
    except UnicodeDecodeError as exc:
        raise Rejected(
            400, f"Request body is not valid UTF-8: {exc}", param=None, code="invalid_unicode"
        ) from exc
    except ValueError as exc:
        raise Rejected(
            400, f"Request body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from exc
    if not isinstance(data, dict):
        raise Rejected(
            400, "Request body must be a JSON object.", param=None, code="invalid_request"
        )
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH or _SURROGATE.search(body):
        check_values(data)
    try:
        return kind.model_validate(data), data
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = _param(first["loc"])
        raise Rejected(
            400,
            f"Invalid request: {param or 'body'}: {first['msg']}",
            param=param,
            code="invalid_request",
        ) from exc
