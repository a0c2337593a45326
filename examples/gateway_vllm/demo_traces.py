"""The demo's traces: where its spans go, and the slowest request's waterfall after the
traffic run.

Why a module of its own: ``demo.py`` only starts it, passes its exporters to
``configure()``, and asks it to print; this keeps the trace plumbing testable on its own
(the tests run ``DemoTraces`` against the real gateway and vLLM) and the demo short.

- No OTLP endpoint configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``): spans go, over real OTLP/HTTP, to the demo's own
  receiver on ``127.0.0.1:4318`` (the OTLP/HTTP port, so anything else that speaks OTLP can
  send there too), and ``stagelens trace TRACE_ID`` asks it.
- An endpoint configured: spans go there, as ``configure()`` would send them, and a copy
  to a receiver on a free loopback port (4318 is probably the collector's), so the demo
  still prints the waterfall; it says how to open the trace in Jaeger, Tempo and Phoenix.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from stagelens.exporters.otlp import span_exporters_from_env
from stagelens.reference.trace_receiver import TraceReceiver

from stagelens import semconv as sc
from stagelens.telemetry import Telemetry
from stagelens.views.traces import DEFAULT_TRACE_SOURCE, SpanRecord, local_roots
from stagelens.views.waterfall import build, format_ms, render_text

DEFAULT_TRACE_PORT: Final = int(urlsplit(DEFAULT_TRACE_SOURCE).port or 4318)
"""The receiver's port when no endpoint is configured (the OTLP/HTTP default, 4318)."""

ENDPOINT_ENV: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The variables that configure where OTLP traces go, most specific first."""


def configured_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The traces endpoint the ``OTEL_*`` variables name, or None when none is set."""
    env = os.environ if environ is None else environ
    explicit = env.get(ENDPOINT_ENV[0], "").strip()
    if explicit:
        return explicit
    base = env.get(ENDPOINT_ENV[1], "").strip()
    if not base:
        return None
    protocol = env.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    return base if protocol == "grpc" else base.rstrip("/") + "/v1/traces"


def _env_exporters(endpoint: str | None) -> list[SpanExporter]:
    """What ``configure()`` would export to: ``OTEL_TRACES_EXPORTER`` and the endpoint.
    Without an endpoint only a console exporter is kept: OTLP's default endpoint is
    ``localhost:4318``, the demo's own receiver, which gets every span already."""
    if endpoint is not None:
        return span_exporters_from_env()
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
    return [ConsoleSpanExporter()] if "console" in (n.strip() for n in names) else []


def span_exporters_with_copy(local: str, endpoint: str | None) -> list[SpanExporter]:
    """What ``configure()`` would export to (``endpoint``: :func:`configured_endpoint`), and
    a copy of every span to the receiver at ``local`` (its OTLP/HTTP traces endpoint). Also
    built by each gateway worker of ``stagelens demo --workers N``
    (``stagelens.reference.serve``)."""
    copy = OTLPSpanExporter(endpoint=local, timeout=5, compression=Compression.NoCompression)
    return [*_env_exporters(endpoint), copy]


class DemoTraces:
    """The receiver, the exporters to pass to ``configure()``, and what to print."""

    def __init__(self, receiver: TraceReceiver, endpoint: str | None, port_busy: bool) -> None:
        self.receiver = receiver
        self.endpoint = endpoint
        self.port_busy = port_busy
        self.exporters: list[SpanExporter] = span_exporters_with_copy(
            receiver.traces_endpoint, endpoint
        )

    @classmethod
    def start(cls, port: int | None = None, host: str = "127.0.0.1") -> DemoTraces:
        """Start the receiver: on ``port``, else 4318 without an endpoint configured and a
        free port with one; a busy port falls back to a free one."""
        endpoint = configured_endpoint()
        wanted = port if port is not None else (0 if endpoint else DEFAULT_TRACE_PORT)
        try:
            receiver, busy = TraceReceiver(host, wanted), False
        except OSError:
            receiver, busy = TraceReceiver(host, 0), True
        return cls(receiver.start(), endpoint, busy)

    def stop(self) -> None:
        self.receiver.stop()

    @property
    def source_option(self) -> str:
        """`` --source URL`` when ``stagelens trace`` would not find the receiver itself."""
        url = self.receiver.url
        return "" if url == DEFAULT_TRACE_SOURCE else f" --source {url}"

    def describe(self) -> str:
        """One line for the start of the demo: where the spans go."""
        local = f"the demo's receiver at {self.receiver.traces_endpoint}"
        busy = " (the port asked for was busy)" if self.port_busy else ""
        if self.endpoint is None:
            return f"traces: no OTLP endpoint configured, so spans go to {local}{busy}"
        return f"traces: spans go to {self.endpoint} (OTEL_EXPORTER_OTLP_*) and to {local}"

    def wait_for(self, telemetry: Telemetry | None, roots: int, timeout: float = 5.0) -> None:
        """Flush until ``roots`` traces have their root span here, or ``timeout``: a root
        ends just after the last byte reached the client, so a client can be done first.
        ``telemetry`` None: the spans come from other processes (the gateway's workers),
        which export on their own schedule (every second)."""
        deadline = time.monotonic() + timeout
        while True:
            if telemetry is not None:
                telemetry.force_flush(int(timeout * 1000))
            if self.receiver.store.roots() >= roots or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def spans(self) -> list[SpanRecord]:
        """Every span received: the stage table's exact percentiles come from them."""
        store = self.receiver.store
        return [
            span
            for summary in store.summaries("recent", limit=len(store))
            for span in store.get(summary.trace_id)
        ]

    def slowest(self, *, thinking: bool = False) -> list[SpanRecord]:
        """The spans of the slowest complete trace received (its root arrived); with
        ``thinking``, of the slowest whose model reasoned (its root's time to first answer
        token later than its time to first token)."""
        store = self.receiver.store
        for summary in store.summaries("slowest", limit=len(store)):
            spans = store.get(summary.trace_id)
            roots = sorted(local_roots(spans), key=lambda s: s.start_ns)
            if roots and (not thinking or _thought(roots[0])):
                return spans
        return []

    def print_thinking(self, out: Callable[[str], None] = print) -> None:
        """The slowest request to a model that reasoned, thinking and answer apart (after
        ``print_slowest``, which waited for the traces); nothing when there is none."""
        spans = self.slowest(thinking=True)
        if spans:
            waterfall = build(spans)
            out(
                f"==> the slowest request that reasoned, {format_ms(waterfall.total_ns)} ms "
                "(thinking: first token to first answer token):"
            )
            out(render_text(waterfall))

    def print_slowest(
        self, telemetry: Telemetry | None, requests: int, out: Callable[[str], None] = print
    ) -> str | None:
        """After a traffic run of ``requests``: print the slowest request's waterfall and
        how to see any other; returns its trace id (None when no trace arrived)."""
        self.wait_for(telemetry, requests)
        spans = self.slowest()
        if not spans:
            out("==> no trace received (sampled out? see OTEL_TRACES_SAMPLER)")
            return None
        waterfall = build(spans)
        out(f"==> the slowest request, {format_ms(waterfall.total_ns)} ms, as its spans have it:")
        out(render_text(waterfall))
        out(
            f"    every request's trace: stagelens trace --list{self.source_option}; "
            f"one: stagelens trace TRACE_ID{self.source_option}"
        )
        return waterfall.trace_id

    def where(self, trace_id: str | None) -> list[str]:
        """The URL lines for the end of the demo: how to open the traces."""
        shown = trace_id or "TRACE_ID"
        lines = [
            f"  traces      {self.receiver.traces_endpoint} (OTLP/HTTP, kept in memory): "
            f"stagelens trace {shown}{self.source_option}"
        ]
        if self.endpoint is None:
            lines.append(
                "              to Jaeger, Tempo or Phoenix: set OTEL_EXPORTER_OTLP_ENDPOINT "
                "(see the README's demo section)"
            )
            return lines
        host = urlsplit(self.endpoint).hostname or "localhost"
        lines += [
            f"              also sent to {self.endpoint}; open trace {shown} in:",
            f"              Jaeger   http://{host}:16686/trace/{shown}",
            f"              Tempo    Grafana > Explore > Tempo > TraceQL {shown}, "
            f"or curl http://{host}:3200/api/traces/{shown}",
            f"              Phoenix  http://{host}:6006 > project default > Traces",
        ]
        return lines


def _thought(root: SpanRecord) -> bool:
    """The request's model reasoned: its first answer token came after its first token."""
    ttft = root.attributes.get(sc.ATTR_TTFT)
    ttfat = root.attributes.get(sc.ATTR_TTFAT)
    return isinstance(ttft, float) and isinstance(ttfat, float) and ttfat > ttft
