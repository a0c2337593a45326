"""Whole-process CPU cost of stagelens per request, as instructions counted by valgrind.

Why beside ``overhead.py``: on a shared 2-core VM whole-process timings swing by 10-40 %
between rounds (bare alone ranged 387-540 req/s in one run), which hides the few percent
the targets are about. Instructions retired are deterministic: the same proxy, upstream and
requests give the same count to a fraction of a percent, so ratios of a few percent are
measurable. For a CPU-bound proxy, throughput is inversely proportional to CPU per request,
so ``1 / (instructions ratio)`` is the throughput ratio the instrumentation leaves
(instructions are a proxy for time: they do not weigh cache misses or lock waits, and only
user-space ones count: the kernel's socket work, a share of the bare proxy's cost, is left
out, so the ratios are upper bounds on the overhead).

The proxy of ``overhead.py`` (uvicorn, one worker, real sockets) runs under
``valgrind --tool=cachegrind --cache-sim=no``; the upstream (16 SSE chunks) and the OTLP
sink run natively. Each variant runs twice, serving ``--small`` and ``--large`` sequential
requests, then is scraped once (``GET /metrics``); the difference divided by the request
difference is the per-request count, with start-up and shutdown cancelled out.

Why the scrape: stagelens folds finished requests into its series in batches of
``FOLD_EVERY`` (128) and before every collection. Without it, a run of 30 requests folds
none and a run of 230 folds 128, and binds every series child on its first fold: the
difference then carried that one-time binding (several million instructions, ~40 k per
request over 200) and the folds of a batch more. With it, both runs fold all their requests
and bind the same children, and only the per-request fold remains in the difference.

All threads count: the ``stagelens`` variant includes its export worker encoding and
POSTing spans (in full batches of 512, as at real speed).

    .venv/bin/python benchmarks/overhead_instructions.py [--variants bare,floor,metrics,stagelens]
        [--small 30] [--large 230] [--events 16] [--long-small 4] [--long-large 14]

``--against REF`` also runs each instrumented variant on the stagelens code of git
revision ``REF`` (``metrics@REF``, ``stagelens@REF``), in the same run: the figures the
no-regression rule compares, measured side by side rather than against a number written
down on another day (the bare proxy, upstream and sink are the same for both; the code of
``REF`` is exported with ``git archive`` and put first on the proxy's ``PYTHONPATH``).
``--against-variants`` names the variants run on ``REF`` (default ``metrics,stagelens``;
add ``tail`` for a revision that has the tail sampler: older code falls back to the SDK's
default sampler, whose figure would not be the tail sampler's).

The proxy asks for the usage event (``stream_options.include_usage``), as a gateway that
bills does; the upstream, like vLLM, sends it only when asked. ``--no-usage``: the proxy
does not ask, so stagelens asks for it itself and removes the event from what the proxy
reads (what that costs).

``--plain NAMES`` also runs each variant of ``--plain-variants`` (default ``stagelens``)
with shortcuts on the request path replaced by their plain twins (``stagelens._plain``), in
the same run: ``variant~NAME`` for each comma-separated NAME, where NAME is a shortcut, a
``+``-joined set of them, or ``all``. What ``variant~NAME`` costs more than ``variant`` is
what the shortcut saves, printed per request and as a share of bare: a shortcut stays only
where that is at least 1 % of bare.

``--mix SECONDS``: the traffic mix the tail sampler's goal is stated for. Of every 100
requests (numbered by the order they are sent, ``overhead.mix_of``), the upstream refuses
one with a 503 (relayed by the proxy: a failure the tail sampler keeps) and sends the
first event of two ``SECONDS`` late (slow against the TTFT SLO: kept), and the client's
``traceparent`` of one says sampled: ``tail`` runs at base ratio 0, so that this one
stands for the 1 % its base ratio would keep (the same path: kept at the start) on the
same requests in every run. So 4 % of the traces are kept, built and exported; the 200
requests the two runs differ by hold 2 refused, 4 late and 2 sampled ones, and every
variant serves the same. The wait costs no instructions; the traces kept do (printed per
``tail`` run).

Under any option the tail sampler's ``exemplar`` rule is counted (it runs on every
request) but keeps nothing by itself: its keeps come per 15 s window, a bucket's first
trace and each new slowest, a few in thousands of requests at real speed; under valgrind,
at a few requests a second, they were 5-10 % of the requests, and a different number in
every run (``benchmarks/tail_sampling.py`` runs at real speed, with them). So the proxy
starts with every bucket of its models filled and each window's slowest unbeatable, never
stale (``_NEVER_STALE``): the rule runs in full, with no wrapper around its calls.

Each run starts with one warm-up request, which the counts of both runs hold: it has a
sampled ``traceparent``, so that every variant that keeps traces keeps it in both runs
(the first request of a process is slow under valgrind, and was kept as slow in some
runs only).

``--layouts K``: every variant is counted in K memory layouts (its environment padded to
K lengths, ``_layout_pad``, and stagelens imported from a folder of a path length of each
layout's own, ``_layout_trees``), and the figures are their means. Where objects land decides
which collide in CPython's caches, so one process's figure carries an offset of its own
(the same code counted up to 13 k a request apart in two layouts): a difference of a few
k between two revisions, or two variants, in one layout can be that offset alone.
With K > 1 each variant's share of bare is printed per layout, and the tail sampler's
points over metrics only. The same layout does not give the same figure in two runs
either (the tail sampler's points over metrics only, one revision: 1.20 and 2.20 in one
layout, a standard deviation of 0.41 over twenty counts): K is the number of draws the
mean is taken over, and its noise about 0.4 / sqrt(K) point.

Under valgrind the proxy's uvicorn ticks (its housekeeping timer) every 5 s, not every
0.1 s (``overhead.serve``): each tick costs the same instructions at any speed, so at
valgrind's ~50x slower requests they were ~50x their share of a request, and that share
grew with how busy the host was (the idle proxy spent 225 k instructions a second on
them, 11 k with the slower tick).

``--no-gc``: the proxy runs with Python's garbage collector off, every variant alike. A
full collection walks every live object, so its cost grows with the series a registry
holds (finer buckets, more labels), and whether one falls between the smaller and the
larger run decides a jump of about 0.07 M instructions per request: with it off, the
figures are the request path's own instructions, and the difference to a run with it on
is what the collector's walks added.

``--events`` gives the content events the upstream streams per answer (then its usage event
and ``[DONE]``). With two counts (``--events 16,1000``) each variant is counted at both,
the longer streams serving ``--long-small`` and ``--long-large`` requests (as long to run),
and the slope, (instructions at 1000 - at 16) / 984, is printed per variant: what one more
streamed event costs. stagelens' share of it is the slope minus bare's (the proxy relaying
the event itself). Instructions become microseconds at this machine's rate, measured by
running the bare proxy natively and reading its user CPU time per request (an estimate: the
instrumentation's instructions are taken to run at the bare proxy's speed; hosts differ:
0.18 ns per instruction on the machine of 2026-11-24, 0.21 to 0.31 ns on that of
2026-11-27, whose rate moved over the day: a shared host). The per-event slope includes
recording each event's gap (the scrape folds the long runs too).

``--pace SECONDS``: the upstream waits SECONDS before each event after the first (and
before the usage event and ``[DONE]``), as an engine does between tokens. Without it the
upstream writes an answer's events back to back, and the valgrind'd proxy, ~50x slower,
finds most of them already arrived and reads and relays them together: a request costs
the bare proxy about 4.9 M instructions then, against about 7.2 M when each event is read
and relayed on its own (``--pace 0.03``), as a proxy does at real speed behind a real
engine. stagelens' own instructions per request hardly change (it records each event
either way), so every share of bare is smaller paced: the figures of the two are not
comparable, and the no-regression figures are stated without it.

Needs ``valgrind`` (Debian package); a run takes ~3 minutes on 2 cores (~10 with
``--events 16,1000 --against REF``).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import compileall
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # (its REQUEST: the API --api picks)
from overhead import (
    cpu_seconds,
    free_port,
    full_work_problem,
    mix_of,
    one,
    proxy_env,
    serve,
    wait_up,
    write_programs,
)

_INSTRUMENTED = ("metrics", "stagelens")
"""The variants ``--against`` runs on the older revision unless ``--against-variants``
says otherwise (``tail`` is not among them: older code falls back to the SDK's default
sampler)."""
_CHECKED = (*_INSTRUMENTED, "tail")
"""Variants whose ``/metrics`` must show the full work: checked after their scrape."""
VALGRIND: Final = (
    "valgrind",
    "--tool=cachegrind",
    "--cache-sim=no",
    "--cachegrind-out-file=/dev/null",
)
"""The command prefix that counts a process's instructions (user space), reported on its
stderr at exit (``counted``); also ``overhead_bytecodes.py --instructions``'s."""
_IREFS = re.compile(r"I\s+refs:\s+([\d,]+)")
_WARM_UP: Final = 1_000_000
"""The number of each run's warm-up request (its trace id, outside the counted ones')."""
_NEVER_STALE: Final = 1e9
"""The exemplar rule's refresh interval in the proxy (seconds): with the bench's seeded
buckets (``overhead.py``), the rule runs in full on every request and keeps none."""
_TICK: Final = 5.0
"""Seconds between the valgrind'd proxy's uvicorn housekeeping ticks: 0.1 s at real speed,
times valgrind's ~50x (see ``overhead.serve``), so that they cost a request what they cost
it at real speed, as ``OTEL_BSP_SCHEDULE_DELAY`` is scaled for the export timer."""


def _count(
    work: Path,
    variant: str,
    requests: int,
    upstream: int,
    sink: int,
    layout: int = 0,
    trees: Mapping[str, str] | None = None,
) -> int:
    """Instructions of one proxy process that served ``requests`` requests, start to exit.
    ``variant@TREE``: the variant on the stagelens code exported to ``TREE``. ``layout``:
    which memory layout the process gets (``_layout_pad``); ``trees``: where that layout
    imports each tree from (``_layout_trees``; ``""``: this checkout's code)."""
    port = free_port()
    variant, _, tree = variant.partition("@")
    variant, _, plain = variant.partition("~")
    mixed = bool(os.environ.get("BENCH_MIX_SLOW"))  # --mix (the upstream reads it too)
    env = {
        **proxy_env(variant, upstream, sink),
        "STAGELENS_GPU_COLLECTOR": "0",
        # Under valgrind requests are ~50x slower, so the 1 s export timer would fire every
        # few requests and POST tiny batches a real-speed proxy never sends (it fills a
        # 512-span batch in well under a second). Full batches only, as at real speed;
        # what is left goes out in the shutdown flush of both runs.
        "OTEL_BSP_SCHEDULE_DELAY": "3600000",
        # One string hash layout for every run: with random ones, counts moved by ~0.5 %.
        "PYTHONHASHSEED": "0",
        # The tail sampler's exemplar rule runs but keeps nothing by itself: it keeps a
        # few traces per window of 15 s (a bucket's first, each new slowest), which at
        # real speed is a few in thousands of requests, and under valgrind, at a few a
        # second, was 5-10 % of them, more on a busier host and different in every run.
        "BENCH_NO_EXEMPLAR_KEEPS": "1",
        "STAGELENS_TAIL_EXEMPLAR_REFRESH_SECONDS": str(_NEVER_STALE),
        "BENCH_LAYOUT_PAD": _layout_pad(layout),
    }
    if mixed and variant == "tail":
        # The mix's 1 % kept at the start is the client's sampled traceparent (mix_of),
        # not the base ratio's random pick of trace ids: the same requests in every run.
        env["OTEL_TRACES_SAMPLER_ARG"] = "0"
    if plain:
        env["STAGELENS_PLAIN"] = plain.replace("+", ",")  # read by stagelens._plain
    if trees is not None:
        tree = trees.get(tree, tree)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (tree, os.environ.get("PYTHONPATH"))))
    proc = serve(
        work, "bench_proxy", port, env, prefix=VALGRIND, stderr=subprocess.PIPE, tick=_TICK
    )
    try:
        wait_up(f"http://127.0.0.1:{port}/docs", timeout=1800)  # valgrind on a busy host

        async def drive() -> None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
                # A warm-up, the same in both runs: the first request of a process is slow
                # under valgrind; kept as slow in one run and not in the other, it moved the
                # tail sampler's figure by a kept trace. Sampled, it is kept in both runs of
                # every variant that keeps any.
                await one(c, _WARM_UP, "sampled")
                for seq in range(requests):
                    await one(c, seq if mixed else None)
                # Scraped once, as Prometheus would: every request's figures are folded into
                # the series in both runs, and the series are bound in both (see the module
                # docstring). A variant without /metrics answers 404, the same in both runs.
                await asyncio.sleep(1)  # the last request is recorded after its last byte
                scraped = await c.get("/metrics")
                if variant in _CHECKED:  # refuse a flattering figure
                    failed = sum(mix_of(n) == "failed" for n in range(requests)) if mixed else 0
                    phases = 0 if overhead.REQUEST[0] == "/v1/messages" else 3
                    problem = full_work_problem(
                        scraped.text, served=requests + 1, failed=failed, phases_per=phases
                    )
                    if problem is not None:
                        raise SystemExit(f"{variant}: {problem}")
                if variant == "tail":
                    print(f"  tail x {requests}: traces {_decisions(scraped.text)}", flush=True)

        asyncio.run(drive())
    finally:
        proc.terminate()  # uvicorn shuts down cleanly: the lifespan flush runs, valgrind reports
        _, raw = proc.communicate(timeout=300)
    return counted(raw.decode(errors="replace"), variant)


def counted(stderr: str, what: str) -> int:
    """The instructions ``VALGRIND`` reported on a process's ``stderr``; SystemExit, with
    the end of that stderr, when it reported none (the process of ``what`` failed)."""
    found = _IREFS.search(stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind for {what}:\n{stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


_DECISION = re.compile(
    r'^stagelens_trace_decisions_total\{decision="(\w+)",reason="(\w+)"\} ([\d.e+]+)$', re.M
)


def _decisions(text: str) -> str:
    """What the tail sampler decided, from a scrape: ``kept N (reason n, ...), dropped M``.

    Why printed: every kept trace is built, encoded and exported, about 5 k instructions a
    request for each kept in the 200 requests two counts differ by, so the figures of two
    revisions compare only with what each kept beside them (``--mix`` keeps the same
    requests in every run, and each run's warm-up; a request slowed by the host may be
    ``slow``)."""
    kept: dict[str, float] = {}
    dropped = 0.0
    for decision, reason, value in _DECISION.findall(text):
        if decision == "kept":
            kept[reason] = kept.get(reason, 0.0) + float(value)
        else:
            dropped += float(value)
    reasons = ", ".join(f"{r} {n:g}" for r, n in sorted(kept.items()))
    return f"kept {sum(kept.values()):g} ({reasons}), dropped {dropped:g}"


def _export_revision(revision: str, into: Path) -> Path:
    """The stagelens package of git ``revision`` as an importable tree under ``into``:
    its ``stagelens/`` files with ``instrumentation/``, ``exporters/`` and ``dashboards/``
    inside, as setuptools maps them. Returns the folder to put on ``PYTHONPATH``."""
    repo = Path(__file__).resolve().parent.parent
    source = into / "source"
    source.mkdir(parents=True)
    archive = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "archive",
            revision,
            "stagelens",
            "instrumentation",
            "exporters",
            "dashboards",
        ],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    package = source / "stagelens"
    for folder in ("instrumentation", "exporters", "dashboards"):
        if (source / folder).is_dir():
            (source / folder).rename(package / folder)
    return source


def _layout_pad(layout: int) -> str:
    """An environment variable's value, of a length each ``layout`` has its own of.

    Why: where objects land in memory decides which of them collide in CPython's caches
    (the type attribute cache is indexed by addresses), and a collision repeated on every
    request costs the same every time. So a process's figure carries an offset of its
    own, unrelated to the code: the same metrics-only code counted 8 k and 13 k a request
    less with this value 1,000 and 2,777 bytes longer (in one process without sockets).
    The environment is copied to the heap at start-up, so its size moves everything
    allocated after it; counting each variant in several layouts (``--layouts``) shows
    that spread, and their mean is a figure of the code."""
    return "x" * (layout * 1531)


_REPO: Final = Path(__file__).resolve().parent.parent
_PACKAGE_PARTS: Final = ("instrumentation", "exporters", "dashboards")
"""Folders of the checkout that setuptools installs inside the ``stagelens`` package."""


def _layout_trees(root: Path, layout: int, against: str | None) -> dict[str, str]:
    """Where layout ``layout``'s processes import stagelens from: this checkout's code
    (under ``""``) and ``against``'s exported tree (under its path), each copied into a
    folder whose path has a length of the layout's own, the same for both.

    Why: the folder a package is imported from moves where objects land as the
    environment does (``_layout_pad``). The same code imported from two folders whose
    paths differ by 40 characters counted 8 k instructions a request apart (in one process
    without sockets); with one folder per revision for every layout, a revision's offset
    was the same in all of them (``310b8df``'s tail sampler came out 0.29 to 0.55 point
    under the same code with two small cuts, in each of three layouts). Compiled here,
    before any count: a process that compiled what another found compiled would carry
    that work in its count."""
    base = root / f"layout-{layout}" / ("p" * (1 + 11 * layout))
    trees = {"": str(_copy_package(_REPO, base / "own"))}
    if against is not None:
        trees[against] = str(shutil.copytree(against, base / "ref"))
    for tree in trees.values():
        compileall.compile_dir(tree, quiet=1)
    return trees


def _copy_package(checkout: Path, into: Path) -> Path:
    """This checkout's stagelens package, as installed (``_PACKAGE_PARTS`` inside it),
    copied under ``into``: the folder to put on ``PYTHONPATH``."""
    skip = shutil.ignore_patterns("__pycache__")
    package = into / "stagelens"
    shutil.copytree(checkout / "stagelens", package, ignore=skip)
    for folder in _PACKAGE_PARTS:
        shutil.copytree(checkout / folder, package / folder, ignore=skip)
    return into


def _per_request(
    work: Path,
    variants: list[str],
    runs: tuple[int, int],
    up: int,
    sink: int,
    layout: int = 0,
    trees: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Instructions per request of each variant: two runs, ``runs`` requests each, one
    valgrind per core, both in memory layout ``layout`` (``_layout_pad``, ``trees``).

    A plain twin (``variant~NAME``) runs the larger count only: its start-up is its base
    variant's (the same modules imported; the switch only picks, once, which of two
    functions runs), so the base's smaller run cancels it out. Half the runs per twin."""
    small, large = runs

    def start_of(v: str) -> str:
        return v.partition("~")[0] if "~" in v and "@" not in v else v

    jobs = [(v, n) for v in variants for n in runs if n == large or start_of(v) == v]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(
            zip(
                jobs,
                pool.map(lambda j: _count(work, j[0], j[1], up, sink, layout, trees), jobs),
                strict=True,
            )
        )
        for (v, n), count in counts.items():
            print(f"  {v.partition('@')[0]} x {n}: {count} instructions", flush=True)
    return {
        v: (counts[(v, large)] - counts[(start_of(v), small)]) / (large - small) for v in variants
    }


def _native_seconds_per_request(work: Path, up: int, sink: int, runs: tuple[int, int]) -> float:
    """User-space CPU seconds per request of the bare proxy running natively (two runs of
    ``runs`` requests, start-up cancelled out as for the instructions).

    User time only: valgrind counts user-space instructions, so the kernel's time (socket
    system calls, a tenth of the bare proxy's CPU here, more on some hosts) would inflate
    the time per instruction, and with it every instruction stagelens adds."""
    used = []
    for requests in runs:
        port = free_port()
        env = {**proxy_env("bare", up, sink), "PYTHONHASHSEED": "0"}
        proc = serve(work, "bench_proxy", port, env)
        try:
            wait_up(f"http://127.0.0.1:{port}/docs")

            async def drive(n: int = requests, at: int = port) -> None:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{at}", timeout=60) as c:
                    for _ in range(n):
                        await one(c)

            asyncio.run(drive())
            used.append(cpu_seconds(proc.pid, user_only=True))
        finally:
            proc.terminate()
            proc.wait(30)
    return (used[1] - used[0]) / (runs[1] - runs[0])


def _shown(variant: str, against: str | None) -> str:
    """A variant's name as printed: ``metrics@REF`` for one run on revision ``REF``."""
    return f"{variant.partition('@')[0]}@{against}" if "@" in variant else variant


def _plain_savings(per_request: dict[str, float]) -> None:
    """Per plain twin: instructions per request its shortcut saves, and that as % of bare."""
    base = per_request.get("bare")
    twins = [v for v in per_request if "~" in v and "@" not in v]
    if not twins:
        return
    print(f"\n{'shortcut (variant~plain)':34s} {'saves/req':>10s} {'% of bare':>9s}")
    for twin in twins:
        saved = per_request[twin] - per_request[twin.partition("~")[0]]
        share = f"{100 * saved / base:8.2f}%" if base else ""
        print(f"{twin:34s} {saved:10.0f} {share}")


def _layout_table(per_layout: list[dict[str, float]], against: str | None) -> None:
    """Each variant's figure in each memory layout (``_layout_pad``), as % of bare's in
    the same layout, and the spread; then, where both ran, the tail sampler's points over
    metrics only (its goal's figure) per layout and their mean."""
    if "bare" not in per_layout[0]:
        return
    print(f"\n% of bare per layout (--layouts {len(per_layout)})")
    for variant in per_layout[0]:
        shares = [100 * (f[variant] / f["bare"] - 1) for f in per_layout]
        cells = " ".join(f"{x:+7.2f}" for x in shares)
        print(f"{_shown(variant, against):18s} {cells}   mean {statistics.fmean(shares):+6.2f}")
    for variant in per_layout[0]:
        name, at, tree = variant.partition("@")
        if name != "tail" or f"metrics{at}{tree}" not in per_layout[0]:
            continue
        points = [100 * (f[variant] - f[f"metrics{at}{tree}"]) / f["bare"] for f in per_layout]
        cells = " ".join(f"{x:7.2f}" for x in points)
        label = _shown(variant, against).replace("tail", "tail - metrics", 1)
        print(f"{label:18s} {cells}   mean {statistics.fmean(points):6.2f} points")


def _table(per_request: dict[str, float], against: str | None) -> None:
    base = per_request.get("bare")
    for variant, n in per_request.items():
        versus = f"{n / base:8.3f} {base / n:16.3f}" if base else ""
        print(f"{_shown(variant, against):18s} {n / 1e6:9.3f}M {versus}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="bare,floor,metrics,stagelens")
    parser.add_argument("--small", type=int, default=30)
    parser.add_argument("--large", type=int, default=230)
    parser.add_argument("--events", default="16", help="content events per answer: N or N,M")
    parser.add_argument("--long-small", type=int, default=4)
    parser.add_argument("--long-large", type=int, default=14)
    parser.add_argument(
        "--layouts",
        type=int,
        default=1,
        metavar="K",
        help="count every variant in K memory layouts and report their mean (the spread "
        "between layouts is a figure's noise: see _layout_pad)",
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also run metrics and stagelens on the stagelens code of git revision REF",
    )
    parser.add_argument(
        "--against-variants",
        default=",".join(_INSTRUMENTED),
        metavar="NAMES",
        help="the variants --against runs on REF (add tail for a revision that has it)",
    )
    parser.add_argument(
        "--plain",
        metavar="NAMES",
        help="also run --plain-variants with these shortcuts plain (see stagelens._plain)",
    )
    parser.add_argument("--plain-variants", default="stagelens")
    parser.add_argument(
        "--no-usage",
        action="store_true",
        help="the proxy does not ask for usage: stagelens asks for it and strips the event",
    )
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="the proxy runs with the garbage collector off: the code path's instructions "
        "without the full collections whose cost grows with every live object (series)",
    )
    parser.add_argument(
        "--mix",
        metavar="SECONDS",
        type=float,
        help="the tail sampler's traffic mix: of every 100 requests the upstream refuses one "
        "(503) and sends the first event of two SECONDS late (1 is well over the TTFT SLO "
        "threshold under valgrind too)",
    )
    parser.add_argument(
        "--api",
        choices=("chat", "responses", "messages"),
        default="chat",
        help="the API the client asks (the proxy relays it; the upstream streams it as "
        "vLLM does): chat completions, the OpenAI Responses API or the Anthropic Messages "
        "API, each with --events output deltas",
    )
    parser.add_argument(
        "--pace",
        metavar="SECONDS",
        type=float,
        help="the upstream waits SECONDS before each event after the first, so that the "
        "valgrind'd proxy reads each event on its own, as it does at real speed",
    )
    args = parser.parse_args()
    overhead.use_api(args.api)
    if args.pace is not None and args.pace < 0:
        raise SystemExit("--pace takes seconds, 0 or more")
    if args.pace:
        os.environ["BENCH_PACE"] = str(args.pace)  # read by the upstream (serve passes it)
    if args.mix:
        os.environ["BENCH_MIX_SLOW"] = str(args.mix)  # read by the upstream (serve passes it)
    if args.no_gc:
        os.environ["BENCH_NO_GC"] = "1"  # read by the proxy program (serve passes it on)
    if args.no_usage:
        os.environ["BENCH_NO_USAGE"] = "1"  # read by the proxy programs (serve passes it on)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    events = sorted({int(e) for e in args.events.split(",") if e})
    if args.layouts < 1:
        raise SystemExit("--layouts must be at least 1")
    if args.large <= args.small or args.long_large <= args.long_small or len(events) > 2:
        raise SystemExit(
            "--large must exceed --small (and --long-large --long-small); "
            "--events takes one or two counts"
        )
    variants = [v for v in args.variants.split(",") if v]
    if args.plain:
        bases = [v for v in args.plain_variants.split(",") if v in variants]
        variants += [f"{v}~{n}" for n in args.plain.split(",") if n for v in bases]
    sink_port = free_port()
    root = Path(tempfile.mkdtemp(prefix="stagelens-instr-"))
    # The programs, and each layout's copy of the package (tens of MB at --layouts 10),
    # removed however the run ends.
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    tree: Path | None = None
    if args.against:
        tree = _export_revision(args.against, root / "against")
        at_ref = {v for v in args.against_variants.split(",") if v}
        if not at_ref <= set(_CHECKED):
            raise SystemExit(f"--against-variants: only {', '.join(_CHECKED)} run on REF")
        variants += [f"{v}@{tree}" for v in variants if v in at_ref]
    # With several layouts each has its own folders to import stagelens from.
    layouts = (
        [
            _layout_trees(root, k, str(tree) if tree is not None else None)
            for k in range(args.layouts)
        ]
        if args.layouts > 1
        else []
    )
    servers = []
    results: dict[int, dict[str, float]] = {}
    started = time.monotonic()
    try:
        work = write_programs(root, events[0])  # the sink (and the proxy) are the same for all
        servers.append(serve(work, "bench_sink", sink_port, {}))
        wait_up(f"http://127.0.0.1:{sink_port}/", timeout=300)  # a busy machine
        seconds_per_instruction = 0.0
        for i, n in enumerate(events):
            work_n = work
            if i:
                (root / f"events-{n}").mkdir()
                work_n = write_programs(root / f"events-{n}", n)
            up_port = free_port()
            servers.append(serve(work_n, "bench_upstream", up_port, {}))
            wait_up(f"http://127.0.0.1:{up_port}/", timeout=300)
            runs = (args.small, args.large) if i == 0 else (args.long_small, args.long_large)
            per_layout = [
                _per_request(
                    work_n,
                    variants,
                    runs,
                    up_port,
                    sink_port,
                    layout,
                    layouts[layout] if layouts else None,
                )
                for layout in range(args.layouts)
            ]
            results[n] = {v: statistics.fmean(f[v] for f in per_layout) for v in variants}
            if args.layouts > 1:
                _layout_table(per_layout, args.against)
            print(f"\n{n} content events per answer ({runs[0]} and {runs[1]} requests)")
            print(f"{'variant':18s} {'instr/req':>10s} {'vs bare':>8s} {'throughput left':>16s}")
            _table(results[n], args.against)
            _plain_savings(results[n])
            if i == 0 and len(events) == 2 and "bare" in variants:
                native = _native_seconds_per_request(work_n, up_port, sink_port, (200, 2000))
                seconds_per_instruction = native / results[n]["bare"]
                print(
                    f"(bare natively: {native * 1e6:.0f} us user CPU per request, "
                    f"{seconds_per_instruction * 1e9:.3f} ns per instruction)"
                )
        print(f"({time.monotonic() - started:.0f} s)")
    finally:
        for p in servers:
            p.terminate()
            p.wait(10)
    if len(events) == 2:
        short, long = events
        print(f"\nper streamed event (slope {short} -> {long} events)")
        print(f"{'variant':18s} {'instr':>10s} {'us':>8s} {'stagelens instr':>16s} {'us':>8s}")
        slopes = {v: (results[long][v] - results[short][v]) / (long - short) for v in variants}
        for variant, slope in slopes.items():
            added = slope - slopes.get("bare", 0.0)
            us = seconds_per_instruction * 1e6
            print(
                f"{_shown(variant, args.against):18s} {slope:10.0f} {slope * us:8.2f} "
                f"{added:16.0f} {added * us:8.2f}"
            )


if __name__ == "__main__":
    main()
