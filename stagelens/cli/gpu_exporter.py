"""``stagelens gpu-exporter``: serve the NVML GPU metrics alone on ``/metrics``.

Why here and not in ``exporters/``: this is console-script wiring (argument parsing, an
HTTP server, a process that runs until interrupted); the collector it serves is
``stagelens.exporters.nvml``. It belongs to the entry layer with ``stagelens.cli``. The
imports are inside ``serve()`` so that ``stagelens --help`` loads no exporter.
"""

from __future__ import annotations

import argparse
from typing import Any


def serve(args: argparse.Namespace) -> int:
    """Run the standalone exporter until interrupted."""
    from prometheus_client import CollectorRegistry, start_http_server

    from stagelens.exporters.nvml import register_gpu_collector

    registry = CollectorRegistry()
    collector = register_gpu_collector(registry, interval_s=args.interval)
    server, thread = start_http_server(args.port, addr=args.host, registry=registry)
    print(f"stagelens gpu-exporter on http://{args.host}:{server.server_port}/metrics", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        if collector is not None:
            collector.close()
        server.shutdown()
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``stagelens gpu-exporter [--port] [--host] [--interval]``."""
    parser = subparsers.add_parser("gpu-exporter", help="Serve NVML GPU metrics on /metrics.")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="background sampling interval (s)"
    )
    parser.set_defaults(func=serve)
