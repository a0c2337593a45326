"""Disconnect storm: what the gateway bills for streams whose clients leave, against what vLLM
generated for them, and whether any generation runs on after its client left.

Starts real vLLM (the tiny model on CPU, or ``--vllm-url``: then nothing else may use it
during the run) and the reference gateway (in this process, on uvicorn), then sends
``--streams`` streamed chat requests at once, each asking for ``--max-tokens`` tokens; every
client reads ``--read`` content events and closes its connection. Then it waits until vLLM
runs no request, and reads, each from its own source:

- billed: the tenant's ``output_tokens`` in the gateway's ``GET /v1/usage`` (the ledger);
- generated: vLLM's own ``vllm:generation_tokens_total`` (its ``/metrics``);
- vLLM's ``vllm:request_success_total`` by finish reason (a ``length`` finish is a
  generation that ran to ``max_tokens``);

and prints the gap, per stream, and the billing-drift ratio the recording rule
``stagelens:billing_drift:ratio_rate1h`` computes from those two counters
((generated - billed) / generated: over one window the rates' common divisor cancels) with
the alert's threshold. The README quotes its output.

With ``--prometheus``, Debian's Prometheus runs the generated recording rules, scraping the
gateway's internal metrics port and vLLM every second; a few whole requests first give every
series its first sample (a counter's first scrape is its baseline), and the rule's own
``stagelens:billing_drift:ratio_rate1h`` is read before and after the storm and set beside
the drift expected from the counters over the same span.

    nice .venv/bin/python benchmarks/disconnect_storm.py [--streams 50] [--max-tokens 1000]
        [--prometheus]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_stack import free_port, tiny_vllm

ROOT = Path(__file__).resolve().parents[1]

DRIFT_ALERT = 0.05
"""``StagelensBillingDrift`` fires above this absolute drift (alerts/stagelens-alerts.yaml)."""
API_KEY = "sk-stagelens-demo"


@contextlib.contextmanager
def _gateway(vllm_url: str, model: str) -> Iterator[tuple[str, str]]:
    """(API URL, internal metrics address) of the reference gateway, served in threads."""
    from stagelens.reference import create_app, demo_config
    from stagelens.reference.serve import serving_in_threads

    from stagelens.testing import capture_telemetry

    config = demo_config(
        [vllm_url], model, api_key=API_KEY, rate_limit_per_second=1000, rate_limit_burst=1000
    )
    with capture_telemetry() as capture:
        app = create_app(config, telemetry=capture.telemetry)
        port, metrics_port = free_port(), free_port()
        with serving_in_threads(app, port, metrics_port):
            yield f"http://127.0.0.1:{port}", f"127.0.0.1:{metrics_port}"


def _vllm_metrics(url: str) -> dict[str, float]:
    """vLLM's generated tokens, running requests and finishes by reason (summed samples)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {"generated": 0.0, "running": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:generation_tokens_total":
                out["generated"] += sample.value
            elif sample.name == "vllm:num_requests_running":
                out["running"] += sample.value
            elif sample.name == "vllm:request_success_total":
                key = f"finished:{sample.labels.get('finished_reason', '?')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _billed(gateway: str) -> int:
    headers = {"authorization": f"Bearer {API_KEY}"}
    return int(
        httpx.get(f"{gateway}/v1/usage", headers=headers, timeout=10).json()["output_tokens"]
    )


async def _storm(gateway: str, streams: int, max_tokens: int, read: int) -> list[int]:
    """``streams`` streamed requests at once; each client leaves after ``read`` content
    events. Returns the events each read."""
    headers = {"authorization": f"Bearer {API_KEY}"}

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": "tiny",
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": f"storm {i}: tell a long story"}],
        }
        seen = 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    seen += 1
                    if seen >= read:
                        break  # leaving the block closes the connection mid-stream
        return seen

    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(
        base_url=gateway, headers=headers, timeout=120, limits=limits
    ) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(streams))))


async def _whole(gateway: str, count: int) -> None:
    """``count`` whole streamed answers (billed in full): every series gets its first sample."""
    headers = {"authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=gateway, headers=headers, timeout=120) as client:
        for i in range(count):
            body = {
                "model": "tiny",
                "stream": True,
                "max_tokens": 16,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": f"warm-up {i}"}],
            }
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass


@contextlib.contextmanager
def _prometheus(gateway_metrics: str, vllm_url: str, tmp: Path) -> Iterator[Any]:
    """Prometheus with the generated recording rules scraping the gateway and vLLM."""
    sys.path.insert(0, str(ROOT))
    from stagelens.slo.alert_rules import dump_yaml
    from stagelens.slo.config import SloConfig
    from stagelens.slo.recording_rules import render_rules
    from tests._promstack import prom_stack

    rules = tmp / "rules.yaml"
    rules.write_text(dump_yaml(render_rules(SloConfig())))
    targets = {"stagelens-gateway": gateway_metrics, "vllm": vllm_url.split("//", 1)[1]}
    with prom_stack(
        (free_port(), free_port(), free_port()), targets, [rules], "http://127.0.0.1:9/"
    ) as p:
        yield p


def _rule(prom: Any, record: str) -> float | None:
    """The recording rule's current value (summed over its series), None before it has one."""
    result = prom.query(f"sum({record})")
    return float(result[0]["value"][1]) if result else None


def _settled(url: str, timeout: float = 60.0) -> tuple[dict[str, float], float]:
    """vLLM's readings once it runs nothing and two readings 0.5 s apart agree, and the
    seconds until it ran nothing."""
    t0 = time.monotonic()
    idle_after: float | None = None
    last = _vllm_metrics(url)
    while True:
        time.sleep(0.1)
        now = _vllm_metrics(url)
        if idle_after is None and now["running"] == 0:
            idle_after = time.monotonic() - t0
        if idle_after is not None and now == last and time.monotonic() - t0 > 1.0:
            return now, idle_after
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"vLLM still busy after {timeout}s: {now}")
        last = now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--read", type=int, default=4, help="content events read per client")
    parser.add_argument("--vllm-url", default=None)
    parser.add_argument(
        "--prometheus", action="store_true", help="read the recording rule on real Prometheus"
    )
    args = parser.parse_args()
    rule: dict[str, float | None] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        tiny_vllm(args.vllm_url) as (vllm_url, model),
    ):
        os.environ["STAGELENS_LEDGER_URL"] = f"sqlite://{Path(tmp) / 'ledger.sqlite3'}"
        with (
            _gateway(vllm_url, model) as (gateway, gateway_metrics),
            contextlib.ExitStack() as stack,
        ):
            prom = None
            if args.prometheus:
                prom = stack.enter_context(_prometheus(gateway_metrics, vllm_url, Path(tmp)))
                start, _ = _settled(vllm_url)
                asyncio.run(_whole(gateway, 5))
                warm, _ = _settled(vllm_url)
                rule["warm_generated"] = warm["generated"] - start["generated"]
                deadline = time.monotonic() + 60  # scraped twice, the rules evaluated
                while rule.get("before") is None and time.monotonic() < deadline:
                    time.sleep(1)
                    rule["before"] = _rule(prom, "stagelens:billing_drift:ratio_rate1h")
            before, _ = _settled(vllm_url)
            billed0 = _billed(gateway)
            t0 = time.monotonic()
            seen = asyncio.run(_storm(gateway, args.streams, args.max_tokens, args.read))
            left = time.monotonic() - t0
            after, idle = _settled(vllm_url)
            time.sleep(1.0)  # the gateway's cleanups (billing the cut streams) are done
            billed = _billed(gateway) - billed0
            if prom is not None:
                time.sleep(5)
                rule["after"] = _rule(prom, "stagelens:billing_drift:ratio_rate1h")
    generated = after["generated"] - before["generated"]
    finishes = {
        k.split(":", 1)[1]: after[k] - before.get(k, 0.0)
        for k in sorted(after)
        if k.startswith("finished:") and after[k] - before.get(k, 0.0)
    }
    gap = generated - billed
    drift = gap / generated if generated else 0.0
    print(
        f"streams: {args.streams}, max_tokens {args.max_tokens}, each client left after "
        f"{args.read} content events (read {sum(seen)} in all; the storm took {left:.1f}s)"
    )
    print(f"vLLM ran no request {idle:.2f}s after the last client left")
    print(f"vLLM finishes by reason: {finishes or 'none counted'}")
    print(f"generated (vllm:generation_tokens_total): {generated:.0f}")
    print(f"billed (GET /v1/usage output_tokens):     {billed}")
    print(f"gap: {gap:.0f} tokens ({gap / args.streams:.1f} per stream, {drift:.1%} of generated)")
    print(
        f"billing drift as the recording rule computes it: {drift:.3f} "
        f"(alert above {DRIFT_ALERT}: {'fires' if abs(drift) > DRIFT_ALERT else 'quiet'})"
    )
    if args.prometheus:
        warm_generated = rule["warm_generated"] or 0.0
        with_warm_up = gap / (generated + warm_generated)  # the warm-up was billed in full
        print(
            f"recording rule stagelens:billing_drift:ratio_rate1h on Prometheus: before the "
            f"storm {rule['before']}, after {rule['after']}; from the counters: the storm "
            f"alone {drift:.3f}, with the warm-up's {warm_generated:.0f} tokens (billed in "
            f"full) {with_warm_up:.3f}. The warm-up's counts precede the series' first "
            f"scrapes (their baselines), so the rule's window holds the storm alone"
        )
    ran_out = finishes.get("length", 0.0)
    print(
        f"generations that ran to max_tokens: {ran_out:.0f} (vLLM counts a request that "
        f"ran to max_tokens as finished_reason=length; aborted ones it does not count); "
        f"generated per stream {generated / args.streams:.1f} of {args.max_tokens} allowed"
    )
    return 0 if ran_out == 0 and generated < args.max_tokens * args.streams / 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
