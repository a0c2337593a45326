"""The reference gateway-to-vLLM stack (``stagelens.reference``), instrumented only through
stagelens's public API: ``create_app(config)`` builds the FastAPI gateway."""

from __future__ import annotations

from stagelens.reference.app import create_app
from stagelens.reference.config import GatewayConfig, ModelPool, demo_config

__all__ = ["GatewayConfig", "ModelPool", "create_app", "demo_config"]
