"""Gateway configuration: API keys, rate limits, model pools. One validated object.

Why pydantic: a typo in a config file must fail at start-up with the field named, not as a
500 on the first request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stagelens.errors import ConfigurationError

DEMO_API_KEY = "sk-stagelens-demo"
"""The demo's API key (documented; override with a config file)."""


class ModelPool(BaseModel):
    """One served model: the backends that serve it and how to admit requests to them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: tuple[str, ...] = Field(min_length=1)
    """Base URLs of vLLM OpenAI-compatible servers serving this model."""
    upstream_model: str | None = None
    """Model name at the backend, when it differs from the public name."""
    tokenizer: str
    """Model directory (or name) whose tokenizer counts prompt tokens."""
    max_model_len: int = Field(default=2048, gt=0)
    """Context window: prompt + max_tokens beyond it answers 400 before any GPU work."""
    max_inflight: int = Field(default=64, gt=0)
    """Admission control: requests in flight to this pool at once."""
    admission_timeout_seconds: float = Field(default=5.0, gt=0)
    """How long a request may wait for admission before 503."""
    task: Literal["generate", "embed"] = "generate"
    """What the backends serve: ``generate`` (chat and completions) or ``embed``
    (``/v1/embeddings``, a vLLM pooling server: the router sends embedding requests only to
    such a pool)."""
    chat_template_content_format: Literal["string", "openai"] = "string"
    """How the backends hand message content to the chat template, as vLLM resolved its
    ``--chat-template-content-format`` (its log says which): the tokenizer stage renders
    the same way, so its count is vLLM's."""
    input_modalities: tuple[Literal["text", "image", "audio", "video", "file"], ...] = ("text",)
    """What the served model takes in message content: a part of another kind answers 400
    naming it before any engine work; image, audio... parts of a listed kind go to the
    engine (the tokenizer stage counts only text, so the context check is a lower bound)."""


class GatewayConfig(BaseModel):
    """Everything the reference gateway needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys: dict[str, str] = Field(min_length=1)
    """API key -> tenant name. Keys never appear in telemetry."""
    rate_limit_per_second: float = Field(default=50.0, gt=0)
    """Token-bucket refill rate per API key (requests per second)."""
    rate_limit_burst: int = Field(default=100, gt=0)
    """Token-bucket size per API key."""
    models: dict[str, ModelPool] = Field(min_length=1)
    """Public model name -> pool."""
    balancing: Literal["least_outstanding", "prefix_affinity"] = "least_outstanding"
    """Backend choice within a pool."""
    prefix_affinity_chars: int = Field(default=256, gt=0)
    """Prompt prefix length hashed for prefix-affinity routing."""
    health_interval_seconds: float = Field(default=2.0, gt=0)
    """Active health-check period."""
    upstream_timeout_seconds: float = Field(default=60.0, gt=0)
    """Upstream read timeout; exceeded answers 504."""
    upstream_first_byte_timeout_seconds: float = Field(default=30.0, gt=0)
    """Per upstream attempt: how long a backend may take to send its response headers
    and, on a stream, its first event. Exceeded, the request (which has sent the client
    nothing yet) is tried on another healthy backend; with none left it answers 504.
    A whole (not streamed) answer's headers come only once it is generated: keep this
    above the longest non-streamed generation you serve."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    """Largest request body accepted; a larger one answers 413 ``request_too_large``
    before it is parsed or tokenized."""
    blocked_terms: tuple[str, ...] = ("ignore previous instructions", "rm -rf /")
    """Default safety classifier: a completion containing one of these is withheld."""
    price_table: Path | None = None
    """Price table YAML for billing (None: stagelens's documented default)."""
    metrics_host: str = "127.0.0.1"
    """Where the internal ``/metrics`` server listens (never the public API's port)."""
    metrics_port: int = Field(default=9464, gt=0, le=65535)
    """Port of the internal ``/metrics`` server."""
    ledger_url: str | None = None
    """Usage ledger: ``sqlite:///ABSOLUTE/PATH`` (one machine, every worker) or
    ``postgresql://...`` (several replicas). None: ``$STAGELENS_LEDGER_URL``, else a SQLite
    file under ``$XDG_STATE_HOME/stagelens``. See ``stagelens.reference.ledger``."""
    redis_url: str | None = None
    """Rate-limit buckets shared in Redis (``redis://host:6379/0``). None:
    ``$STAGELENS_REDIS_URL``, else per-process buckets. See ``stagelens.reference.ratelimit``."""

    @classmethod
    def load(cls, path: str | Path) -> GatewayConfig:
        """Read a YAML config file; ConfigurationError names the bad field."""
        try:
            data = yaml.safe_load(Path(path).read_text())
            return cls.model_validate(data)
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigurationError(f"cannot read gateway config {path}: {exc}") from exc
        except ValidationError as exc:
            problems = "; ".join(_problem(error) for error in exc.errors(include_url=False))
            raise ConfigurationError(f"invalid gateway config {path}: {problems}") from None


def _problem(error: Any) -> str:
    """``models.tiny.max_inflight: Input should be greater than 0 (got -1)``. An API key
    is never quoted: under ``api_keys`` the key is ``<key>`` and the value is left out."""
    loc = [str(part) for part in error["loc"]]
    secret = bool(loc) and loc[0] == "api_keys"
    if secret and len(loc) > 1:
        loc[1] = "<key>"
    got = error.get("input")
    shown = "" if secret or isinstance(got, dict | list) else f" (got {got!r})"
    return f"{'.'.join(loc) or '(the file)'}: {error['msg']}{shown}"


def demo_config(
    backends: list[str],
    model_dir: str,
    api_key: str = DEMO_API_KEY,
    embed_backends: Sequence[str] = (),
    think_backends: Sequence[str] = (),
    think_model_dir: str | None = None,
    **overrides: Any,
) -> GatewayConfig:
    """The demo: two served models, ``tiny`` and ``tiny-chat`` (vLLM serves both names), each
    its own pool with its own admission limit; with ``embed_backends``, ``tiny-embed`` too
    (the same model served by a vLLM pooling server); with ``think_backends``,
    ``tiny-think`` (the tiny model's reasoning variant, ``think_model_dir``, served by vLLM
    with a reasoning parser)."""
    pool = {"backends": tuple(backends), "tokenizer": model_dir}
    models: dict[str, Any] = {"tiny": pool, "tiny-chat": {**pool, "max_inflight": 8}}
    if embed_backends:
        models["tiny-embed"] = {
            "backends": tuple(embed_backends),
            "tokenizer": model_dir,
            "task": "embed",
        }
    if think_backends:
        models["tiny-think"] = {
            "backends": tuple(think_backends),
            "tokenizer": think_model_dir or model_dir,
        }
    return GatewayConfig.model_validate(
        {
            "api_keys": {api_key: "demo"},
            "models": models,
            "balancing": "prefix_affinity",
            **overrides,
        }
    )
