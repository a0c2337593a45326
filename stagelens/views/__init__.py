"""What people read: the per-stage report, trace waterfalls, the telemetry reference and
dashboard previews.

Why a package of its own: these read what the runtime already emitted (a ``/metrics`` page,
OTLP spans, the ``semconv`` table) and render it as text, HTML, SVG, Markdown or PNG. None
of it runs on a request; it imports only the runtime core.
"""
