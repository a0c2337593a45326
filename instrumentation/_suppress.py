"""Whether instrumentation is suppressed here (``opentelemetry.instrumentation.utils``).

Contrib instrumentors check ``is_instrumentation_enabled()`` (and, for HTTP,
``is_http_instrumentation_enabled()``) before each operation: inside
``suppress_instrumentation()`` or ``suppress_http_instrumentation()`` they make no span and
record nothing. stagelens does the same in the middleware, in ``stage()`` and in the
upstream transports, through the public functions themselves (re-exported here, so that
the three read suppression one way).
"""

from __future__ import annotations

from opentelemetry.instrumentation.utils import (
    is_http_instrumentation_enabled as http_instrumentation_enabled,
)
from opentelemetry.instrumentation.utils import (
    is_instrumentation_enabled as instrumentation_enabled,
)

__all__ = ["http_instrumentation_enabled", "instrumentation_enabled"]
