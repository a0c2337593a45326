"""``FastAPIInstrumentor`` and ``instrument_app()``: add stagelens to a FastAPI/Starlette app.

Follows opentelemetry-instrumentation's BaseInstrumentor so the OTel auto-instrumentation
CLI finds it (entry point ``opentelemetry_instrumentor``): ``instrument()`` patches
``fastapi.FastAPI`` so apps built afterwards get the middleware; ``instrument_app(app)``
instruments one existing app; both are idempotent and undone exactly by their
``uninstrument`` counterparts.

FastAPI's built-in OpenTelemetry (FastAPI 0.165 and later: tracing, HTTP metrics, logs) is
switched off on an instrumented app, so that a request has one trace and one SERVER span:
stagelens' (see ``_fastapi_builtin`` for why off rather than continued).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection
from typing import Any, Final

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from stagelens.instrumentation import _fastapi_builtin
from stagelens.instrumentation.asgi import StageLensMiddleware
from stagelens.instrumentation.package import _instruments

from stagelens.errors import ConfigurationError
from stagelens.telemetry import Telemetry

_MARK = "_stagelens_instrumented"
_BUILTIN = "_stagelens_fastapi_telemetry"
"""Where an instrumented app keeps its FastAPI telemetry settings from before, for undo."""
_OPTIONS: Final = frozenset(inspect.signature(StageLensMiddleware.__init__).parameters) - {
    "self",
    "app",
}
"""Keywords the middleware takes; anything else is refused when instrumenting, because
Starlette builds the middleware lazily and would only fail on the first request."""


def instrument_app(app: Any, *, telemetry: Telemetry | None = None, **options: Any) -> Any:
    """Add ``StageLensMiddleware`` to a Starlette/FastAPI app (outermost); idempotent.

    ``options`` go to the middleware: ``settings``, ``auth_hook``, ``rate_limit_hook``,
    ``body_hook``, ``request_hook``, ``response_hook``, ``metrics_path`` (serve ``/metrics``
    from the app). Returns the app. Raises ConfigurationError for an unknown option.

    On FastAPI 0.165 and later, the app's built-in tracing, HTTP metrics and logs are
    switched off (whatever ``FastAPI(telemetry=...)`` said): stagelens' root is the request's one
    SERVER span. :func:`uninstrument_app` puts them back.
    """
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigurationError(
            f"instrument_app: unknown option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    if getattr(app, _MARK, False):
        return app
    app.add_middleware(StageLensMiddleware, telemetry=telemetry, **options)
    setattr(app, _MARK, True)
    setattr(app, _BUILTIN, _fastapi_builtin.switch_off(app))
    return app


def uninstrument_app(app: Any) -> None:
    """Remove the middleware added by :func:`instrument_app` (before the app started) and
    give FastAPI's built-in telemetry its settings back."""
    if not getattr(app, _MARK, False):
        return
    before = getattr(app, _BUILTIN, None)
    if before is not None:
        _fastapi_builtin.restore(app, before)
        setattr(app, _BUILTIN, None)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not StageLensMiddleware]
    app.middleware_stack = None
    setattr(app, _MARK, False)


class FastAPIInstrumentor(BaseInstrumentor):
    """Instrument every FastAPI app created after ``instrument()``, or one with
    ``instrument_app()``."""

    _original_init: Any = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    @staticmethod
    def instrument_app(app: Any, **options: Any) -> Any:
        return instrument_app(app, **options)

    @staticmethod
    def uninstrument_app(app: Any) -> None:
        uninstrument_app(app)

    def _instrument(self, **kwargs: Any) -> None:
        """``kwargs`` are instrument_app() options; OTel's conventional ``tracer_provider``
        is honoured by building a Telemetry on it when no ``telemetry`` is given."""
        import fastapi

        tracer_provider = kwargs.pop("tracer_provider", None)
        kwargs.pop("meter_provider", None)  # stagelens metrics go to Prometheus
        if tracer_provider is not None and kwargs.get("telemetry") is None:
            kwargs["telemetry"] = Telemetry(tracer_provider=tracer_provider)
        unknown = set(kwargs) - _OPTIONS - {"telemetry"}
        if unknown:
            raise ConfigurationError(f"FastAPIInstrumentor: unknown option(s) {sorted(unknown)}")

        original = fastapi.FastAPI.__init__
        FastAPIInstrumentor._original_init = original

        def patched_init(app_self: Any, *args: Any, **init_kwargs: Any) -> None:
            original(app_self, *args, **init_kwargs)
            instrument_app(app_self, **kwargs)

        setattr(fastapi.FastAPI, "__init__", patched_init)  # noqa: B010 - mypy rejects assigning a method

    def _uninstrument(self, **kwargs: Any) -> None:
        import fastapi

        if FastAPIInstrumentor._original_init is not None:
            setattr(fastapi.FastAPI, "__init__", FastAPIInstrumentor._original_init)  # noqa: B010 - as above
            FastAPIInstrumentor._original_init = None
