"""The reference gateway-to-vLLM stack (``stagelens.reference``), instrumented only through
stagelens's public API: ``create_app(config)`` builds the FastAPI gateway; ``demo``,
``tinymodel`` and ``vllm_server`` run it on this machine (``stagelens demo``).

Why the names below load lazily: ``stagelens --help`` imports the ``demo`` subcommand from
here, and must not need the demo extra (FastAPI, transformers) to print its help.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stagelens.reference.app import create_app, metrics_app
    from stagelens.reference.config import GatewayConfig, ModelPool, demo_config

__all__ = ["GatewayConfig", "ModelPool", "create_app", "demo_config", "metrics_app"]

_HOMES = {
    "create_app": "stagelens.reference.app",
    "metrics_app": "stagelens.reference.app",
    "GatewayConfig": "stagelens.reference.config",
    "ModelPool": "stagelens.reference.config",
    "demo_config": "stagelens.reference.config",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
