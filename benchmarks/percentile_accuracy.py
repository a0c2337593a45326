"""Percentiles you can trust (issue 27), before and after, side by side.

Prints, for the stagelens of git ``--against`` (default ``main``: before) and of this
working tree (after):

1. **Accuracy.** The worst relative error of p50, p95 and p99 against the exact
   (nearest-rank) percentile, over uniform, log-normal and bimodal latencies of 80 and 1000
   requests in each family's working range (TTFT 20 ms-2.5 s, stages 0.1-10 ms, end to end
   10 ms-60 s, ITL 2.5-500 ms), and how often a figure lay above the slowest request:
   - before: ``histogram_quantile`` on the former buckets (what the report, the demo table
     and the dashboards printed);
   - after, report: what ``stagelens report`` prints from buckets alone (no spans at hand:
     with them it prints the exact figures), the estimate narrowed to the tracked min/max;
   - after, ``histogram_quantile`` alone on the new buckets (what the panels drew before
     they were narrowed);
   - after, dashboards: what the panels draw (``stagelens.dashboards.common.quantile``):
     ``histogram_quantile`` pulled into ``[0.9 * upper, 1.1 * lower]`` of the bucket that
     holds the rank, narrowed to the tracked min/max (the query is evaluated by real
     Prometheus in ``tests/dashboards/test_panel_percentiles.py``; this is its arithmetic).
2. **Scrape.** Series and bytes of the demo gateway's ``/metrics`` after the same traffic
   (the reference gateway with the demo's config in front of the tiny vLLM on CPU, as
   ``benchmarks/sizing.py`` runs it), each side in a process of its own.
3. **Fold cost per record**, in instructions counted by valgrind (``cachegrind
   --cache-sim=no``): a process that builds 2000 streamed requests' records and folds
   them, minus one that only builds them, divided by 2000; each side in a process of its
   own.

Why side by side: the figures of a loaded 2-core machine drift; the comparison is only
fair run against run.

    .venv/bin/python benchmarks/percentile_accuracy.py [--against main] [--requests 200]
        [--vllm-url URL] [--no-stack] [--no-valgrind]

Needs ``valgrind`` (Debian package) for part 3 and the tiny vLLM (or ``--vllm-url``) for
part 2; a full run takes ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUANTILES = (0.5, 0.95, 0.99)
SIZES = (80, 1000)
SEEDS = 10
FOLD_RECORDS = 2000

Draw = Callable[[random.Random, float, float], float]


def _uniform(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def _lognormal(rng: random.Random, low: float, high: float) -> float:
    return min(high, max(low, rng.lognormvariate(math.log(math.sqrt(low * high)), 0.9)))


def _bimodal(rng: random.Random, low: float, high: float) -> float:
    centre = low * 2 if rng.random() < 0.7 else high / 2
    return min(high, max(low, rng.gauss(centre, centre / 10)))


DISTRIBUTIONS: dict[str, Draw] = {"uniform": _uniform, "lognormal": _lognormal, "bimodal": _bimodal}

FAMILIES: dict[str, tuple[str, tuple[float, float]]] = {
    "TTFT": ("TTFT_BUCKETS", (0.02, 2.5)),
    "stage": ("STAGE_DURATION_BUCKETS", (0.0001, 0.01)),
    "end to end": ("REQUEST_DURATION_BUCKETS", (0.01, 60.0)),
    "ITL": ("INTER_TOKEN_LATENCY_BUCKETS", (0.0025, 0.5)),
}
"""Family -> (its bounds' name in ``stagelens.metrics.buckets``, the working range measured)."""


# -- 1. accuracy --------------------------------------------------------------------------
def _buckets_of(revision: str) -> types.ModuleType:
    """The bucket module of ``revision`` (``stagelens/metrics/buckets.py``, or
    ``stagelens/buckets.py`` before it moved), loaded on its own (it needs only the
    standard library)."""
    for path in ("stagelens/metrics/buckets.py", "stagelens/buckets.py"):
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"{revision}: no bucket module ({shown.stderr.strip()})")
    module = types.ModuleType(f"buckets_{revision}")
    exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def _cumulative(bounds: Sequence[float], values: Sequence[float]) -> list[tuple[float, float]]:
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    running, out = 0, []
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


def histogram_quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile`` on classic buckets (promql/quantile.go: rank
    ``q * count``, linear interpolation inside the bucket, the first bucket from 0)."""
    count = cumulative[-1][1]
    rank = q * count
    previous_bound, previous_count = 0.0, 0.0
    for bound, running in cumulative:
        if running >= rank:
            if math.isinf(bound):
                return previous_bound
            width = running - previous_count
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / width
        previous_bound, previous_count = bound, running
    return previous_bound


def panel_estimate(
    q: float, cumulative: Sequence[tuple[float, float]], lo: float, hi: float
) -> float:
    """What a dashboard percentile panel draws (``stagelens.dashboards.common.quantile``):
    the bucket that holds rank ``q * count`` (less the rank slack) as ``[lower, upper]``,
    narrowed to ``[lo, hi]`` (the tracked extremes), and ``histogram_quantile``'s value
    pulled into ``[max(lower, 0.9 * upper), min(upper, 1.1 * lower)]``."""
    count = cumulative[-1][1]
    rank = (q - 1e-9) * count
    previous_bound = 0.0
    lower = upper = math.nan
    for bound, running in cumulative:
        if running >= rank:
            lower, upper = previous_bound, bound
            if math.isinf(bound):
                upper = previous_bound
            break
        previous_bound = bound
    lower, upper = max(lower, lo), min(upper, hi)
    pulled_up = max(histogram_quantile(q, cumulative), lower, 0.9 * upper)
    return min(pulled_up, upper, 1.1 * lower)


def accuracy(former: types.ModuleType) -> None:
    from stagelens.metrics import buckets
    from stagelens.views.percentiles import from_buckets, nearest_rank

    print("1. worst relative error against the exact (nearest-rank) percentile;")
    print(f"   {len(DISTRIBUTIONS)} shapes x {SIZES} requests x {SEEDS} seeds per family")
    print(f"   {'family':11s} {'estimate':22s} {'p50':>7s} {'p95':>7s} {'p99':>7s} above max")
    for family, (name, (low, high)) in FAMILIES.items():
        layouts = {
            "before (hq, former)": (getattr(former, name), "hq"),
            "after: report": (getattr(buckets, name), "report"),
            "after: hq alone": (getattr(buckets, name), "hq"),
            "after: dashboards": (getattr(buckets, name), "panel"),
        }
        for label, (bounds, how) in layouts.items():
            worst = dict.fromkeys(QUANTILES, 0.0)
            above = 0
            for shape, draw in DISTRIBUTIONS.items():
                for n in SIZES:
                    for seed in range(SEEDS):
                        rng = random.Random(f"{shape}{n}{seed}")
                        values = [draw(rng, low, high) for _ in range(n)]
                        cumulative = _cumulative(bounds, values)
                        for q in QUANTILES:
                            exact = nearest_rank(values, q)
                            if how == "hq":
                                got = histogram_quantile(q, cumulative)
                            elif how == "panel":
                                got = panel_estimate(q, cumulative, min(values), max(values))
                            else:
                                got = from_buckets(cumulative, q, min(values), max(values)).value
                            worst[q] = max(worst[q], abs(got - exact) / exact)
                            above += got > max(values)
            print(
                f"   {family:11s} {label:22s} "
                + " ".join(f"{worst[q] * 100:6.1f}%" for q in QUANTILES)
                + f" {above:5d}"
            )
    print()


# -- 2. scrape ----------------------------------------------------------------------------
def _export(revision: str, into: Path) -> Path:
    """The stagelens package of ``revision``, with its reference stack as
    ``stagelens.reference``, as an importable tree: the folder to put on ``PYTHONPATH``."""
    source = into / "source"
    source.mkdir(parents=True)
    folders = ["stagelens", "instrumentation", "exporters", "dashboards", "examples/gateway_vllm"]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, *folders], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    package = source / "stagelens"
    for folder in ("instrumentation", "exporters", "dashboards"):
        (source / folder).rename(package / folder)
    (source / "examples" / "gateway_vllm").rename(package / "reference")
    return source


def _child(args: list[str], pythonpath: Path | None, prefix: Sequence[str] = ()) -> str:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    command = [*prefix, sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def _scrape_child(url: str, model: str, requests: int) -> None:
    """In the side's own process: the demo gateway, the traffic, then one scrape."""
    import asyncio
    import threading
    import time

    import uvicorn
    from prometheus_client import generate_latest
    from stagelens.reference import create_app, demo_config

    from stagelens.testing import capture_telemetry

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _vllm_stack import free_port
    from sizing import _traffic

    with capture_telemetry() as capture:
        app = create_app(demo_config([url], model), telemetry=capture.telemetry)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        try:
            asyncio.run(_traffic(f"http://127.0.0.1:{port}", requests))
            time.sleep(1)
            text = generate_latest(capture.telemetry.exposition_registry)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
    lines = [x for x in text.decode().splitlines() if x and not x.startswith("#")]
    ours = [x for x in lines if x.startswith("stagelens_")]
    print(json.dumps({"series": len(lines), "stagelens": len(ours), "bytes": len(text)}))


def scrape(former_tree: Path, revision: str, url: str | None, requests: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _vllm_stack import tiny_vllm

    print(f"2. the demo gateway's /metrics after {requests} requests (sizing.py's traffic)")
    with tiny_vllm(url) as (vllm_url, model):
        sides = {revision: former_tree, "this tree": None}
        for side, tree in sides.items():
            out = _child(["--child-scrape", vllm_url, model, str(requests)], tree)
            got = json.loads(out.strip().splitlines()[-1])
            print(
                f"   {side:12s} {got['series']:6d} series ({got['stagelens']} stagelens_*), "
                f"{got['bytes']:8,d} bytes"
            )
    print()


# -- 3. fold cost -------------------------------------------------------------------------
def _fold_child(n: int, fold: bool) -> None:
    """Build ``n`` records shaped like a streamed demo request (seven stages, TTFT, 15
    gaps, billing, three SLI verdicts) and, with ``fold``, fold them into a fresh
    registry: the difference between the two is the fold's cost alone."""
    from prometheus_client import CollectorRegistry

    from stagelens.config import Settings
    from stagelens.metrics.record import BillingRecord, RequestRecord, StageTimes
    from stagelens.telemetry import recording_for

    rng = random.Random(0)
    stages = ("gateway", "load_balancer", "tokenizer", "router", "inference", "postprocess")
    records = [
        RequestRecord(
            model="tiny" if i % 3 else "tiny-chat",
            code="200",
            duration=rng.uniform(0.1, 2.0),
            ttft=rng.uniform(0.02, 0.5),
            gaps=[rng.uniform(0.005, 0.1) for _ in range(15)],
            stages=StageTimes([(s, rng.uniform(0.0001, 0.01)) for s in (*stages, "billing")]),
            phases=None,
            rejected_by=None,
            billing=BillingRecord("demo", 600, 16, 512, 0.0001),
            verdicts=(("availability", False), ("ttft", False), ("itl", False)),
        )
        for i in range(n)
    ]
    recording = recording_for(CollectorRegistry(), Settings())
    recording.instruments.for_model("tiny")  # bound in both runs: no per-record cost
    if fold:
        for record in records:
            recording.fold.submit(record)
        recording.fold.fold()


def _instructions(mode: str, tree: Path | None) -> int:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "cachegrind.out"
        prefix = ("valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}")
        text = _child(["--child-fold", str(FOLD_RECORDS), mode], tree, prefix)
    found = re.search(r"I\s+refs:\s+([\d,]+)", text)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind:\n{text[-2000:]}")
    return int(found.group(1).replace(",", ""))


def fold_cost(former_tree: Path, revision: str) -> None:
    print(f"3. fold cost per record (valgrind; {FOLD_RECORDS} records folded minus built)")
    for side, tree in {revision: former_tree, "this tree": None}.items():
        per = (_instructions("fold", tree) - _instructions("build", tree)) / FOLD_RECORDS
        print(f"   {side:12s} {per / 1000:8.1f} k instructions per record")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--against", default="main", help="the 'before' git revision")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--vllm-url", default=None)
    parser.add_argument("--no-stack", action="store_true", help="skip part 2 (needs vLLM)")
    parser.add_argument("--no-valgrind", action="store_true", help="skip part 3")
    parser.add_argument("--only-valgrind", action="store_true", help="part 3 alone")
    parser.add_argument("--child-scrape", nargs=3, metavar=("URL", "MODEL", "N"))
    parser.add_argument("--child-fold", nargs=2, metavar=("N", "MODE"))
    args = parser.parse_args()
    if args.child_scrape:
        url, model, n = args.child_scrape
        _scrape_child(url, model, int(n))
        return 0
    if args.child_fold is not None:
        _fold_child(int(args.child_fold[0]), args.child_fold[1] == "fold")
        return 0
    if not args.only_valgrind:
        accuracy(_buckets_of(args.against))
    with tempfile.TemporaryDirectory() as work:
        former_tree = _export(args.against, Path(work))
        if not (args.no_stack or args.only_valgrind):
            scrape(former_tree, args.against, args.vllm_url, args.requests)
        if not args.no_valgrind:
            if shutil.which("valgrind") is None:
                raise SystemExit("valgrind is not installed (apt-get install valgrind)")
            fold_cost(former_tree, args.against)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
