"""Bytecodes the request path runs per request, per function, for each variant, in one run.

Why beside ``overhead_instructions.py``: instruction counts are steady for one process,
but each process carries an offset of its own from where its objects land in memory
(``--layouts`` there): the same code counted up to 13 k instructions a request apart,
which is more than most single changes save. The bytecodes a request runs do not depend
on memory at all: the same code and requests give the same count in every process, and
the count is kept per function, so a difference between two variants (or two revisions)
names where it is. They are a map, not a price: an instruction count weighs what each
bytecode and each C call does; a few thousand instructions are a few hundred bytecodes.

Each variant runs in its own process: the bench proxy of ``overhead.py`` (its app called
directly by ``overhead_paired.one_request``, no server and no sockets), its upstream the
in-memory one of ``overhead_paired.py`` (the events of ``overhead.py``'s), the garbage
collector off. After a warm-up, ``--requests`` fine
requests are traced with ``sys.settrace`` counting opcodes on the event loop's thread
(the export worker's encoding is not counted: with no exporter set nothing is exported,
so a kept trace's spans are built and queued only). ``--sampled`` sends every request
with a sampled ``traceparent`` (every trace kept at its start, under any sampler that
follows its parent); ``--end-kept`` makes every request slow for the tail sampler
(``STAGELENS_TAIL_SLOW_SECONDS``), so its trace is kept at the end.

``--instructions`` counts instructions instead, under valgrind, in two runs of each
variant's child (the warm-up alone, then ``--requests`` more; no trace hook), and prints
each variant's instructions per request and its difference to the first. In-process, with
one string hash layout (``PYTHONHASHSEED=0``), the count repeats to about 1 k
instructions a request, run after run (the tail sampler over metrics only: 62.4 k and
61.4 k in two runs); ``overhead_instructions.py``'s proxy behind real sockets moves about
20 k from process to process unless its upstream is paced (``--pace``). So this is the figure
to weigh a change by, before and after (``PYTHONPATH`` naming another tree's ``stagelens``
runs that code); it has no server in it, so it is no share of the bench's bare proxy.

    .venv/bin/python benchmarks/overhead_bytecodes.py [--variants metrics,tail]
        [--requests 50] [--top 40] [--sampled] [--end-kept] [--instructions]
        [--api chat|responses|messages] [--events N | --events N,M]

A variant named ``VARIANT~NAME`` (``--instructions`` only) runs ``VARIANT`` with the
shortcuts ``NAME`` (``+``-joined, or ``all``) replaced by their plain twins
(``stagelens._plain``): its difference to ``VARIANT`` is what those shortcuts save, with
none of the socket benchmark's noise from process to process.

``--api`` asks the Responses or Messages API instead of chat (the upstream streams that
API's events, as ``overhead.py``'s does); ``--events`` sets the output events an answer
carries. With ``--instructions --events N,M``, each variant is counted at both, and the
slope between them is what one more output event costs: the fair comparison of one API's
event with another's (``overhead_instructions.py``'s slope behind real sockets depends on
how many events each read of the socket brings, which timing decides).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from overhead import APIS, CHUNKS, PROXY
from overhead_instructions import VALGRIND, counted
from overhead_paired import events_of, load_proxy, one_request

_SAMPLERS = {"metrics": "always_off", "tail": "stagelens_tail", "stagelens": "always_on"}
_SITE = "site-packages/"


def _child(variant: str, requests: int, out: Path, proxy: Path) -> None:
    """In the variant's own process: drive the proxy app, count, write ``out``."""
    os.environ.update(
        BENCH_UPSTREAM="http://upstream.invalid",  # swapped for the in-memory one
        BENCH_NO_GC="1",
        BENCH_NO_EXEMPLAR_KEEPS="1",  # as overhead_instructions.py, with its refresh
        STAGELENS_TAIL_EXEMPLAR_REFRESH_SECONDS="1e9",
        STAGELENS_GPU_COLLECTOR="0",
        OTEL_TRACES_EXPORTER="none",
        OTEL_TRACES_SAMPLER=_SAMPLERS.get(variant, "always_on"),
        OTEL_SERVICE_NAME="bench-proxy",
        PYTHONHASHSEED="0",
    )
    if variant == "tail":
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = "0"  # fine requests: kept only as asked
    api = os.environ.get("BENCH_API", "chat")
    events = events_of(api, int(os.environ.get("BENCH_EVENTS") or CHUNKS))
    app = load_proxy(proxy, variant, events)
    sampled = bool(os.environ.get("BENCH_BYTECODES_SAMPLED"))
    tracing = not os.environ.get("BENCH_BYTECODES_UNTRACED")  # --instructions: valgrind counts

    async def one(seq: int) -> None:
        parent = b"00-%032x-%016x-01" % (seq + 1, seq + 1)
        await one_request(app, [(b"traceparent", parent)] if sampled else (), api)

    counts: Counter[tuple[str, str, int]] = Counter()

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name, code.co_firstlineno)] += 1
        return trace

    async def drive() -> None:
        for seq in range(5):  # warm-up: imports, first-use caches, bound series
            await one(seq)
        if tracing:
            sys.settrace(trace)
        try:
            for seq in range(requests):
                await one(1000 + seq)
        finally:
            sys.settrace(None)

    asyncio.run(drive())
    rows = [[_short(f), name, line, n / max(requests, 1)] for (f, name, line), n in counts.items()]
    out.write_text(json.dumps(rows))


def _short(filename: str) -> str:
    """A code object's file, from its package on (site-packages or this checkout)."""
    if _SITE in filename:
        return filename.rsplit(_SITE, 1)[1]
    repo = str(Path(__file__).resolve().parent.parent) + os.sep
    return filename.removeprefix(repo)


def _instructions(
    variants: list[str], requests: int, proxy: Path, env: dict[str, str], events: list[int]
) -> None:
    """``--instructions``: each variant's instructions per request, as valgrind counts
    them in two runs of its child (the warm-up alone, then with ``requests`` more), and
    each one's difference to the first variant's; with two ``events`` counts, at each, and
    the slope between them: what one more output event costs, and its difference to the
    first variant's (what stagelens adds per event, with no chunking in it: the in-memory
    upstream hands each event over on its own)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    untraced = {**env, "BENCH_BYTECODES_UNTRACED": "1"}

    def count(variant: str, chunks: int, n: int) -> int:
        cmd = [*VALGRIND, sys.executable, __file__, "--requests", str(n)]
        base, _, plain = variant.partition("~")  # variant~NAME: NAME's shortcuts plain
        child_env = {**untraced, "BENCH_EVENTS": str(chunks)}
        if plain:
            child_env["STAGELENS_PLAIN"] = plain.replace("+", ",")  # read by stagelens._plain
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            done = subprocess.run(
                [*cmd, "--child", base, str(proxy), out.name],
                env=child_env,
                capture_output=True,
                text=True,
                check=True,
            )
        return counted(done.stderr, variant)

    jobs = [(v, e, n) for e in events for v in variants for n in (0, requests)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: count(*job), jobs), strict=True))
    base = variants[0]
    per: dict[int, dict[str, float]] = {}
    for e in events:
        per[e] = {v: (counts[(v, e, requests)] - counts[(v, e, 0)]) / requests for v in variants}
        print(f"instructions per request ({requests} requests, {e} output events, valgrind)")
        for variant in variants:
            value = per[e][variant]
            diff = f"  {value - per[e][base]:+10.0f} vs {base}" if variant != base else ""
            print(f"  {variant:12s} {value:12.0f}{diff}")
    if len(events) == 2:
        short, long = events
        print(f"per output event (slope {short} -> {long} events)")
        slope = {v: (per[long][v] - per[short][v]) / (long - short) for v in variants}
        for variant in variants:
            diff = f"  {slope[variant] - slope[base]:+10.0f} vs {base}" if variant != base else ""
            print(f"  {variant:12s} {slope[variant]:12.0f}{diff}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="metrics,tail")
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--top", type=int, default=40, help="functions listed per variant")
    parser.add_argument("--sampled", action="store_true", help="every request sampled")
    parser.add_argument("--end-kept", action="store_true", help="tail: every trace kept")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per request under valgrind instead (no trace hook)",
    )
    parser.add_argument("--api", choices=sorted(APIS), default="chat", help="what is asked")
    parser.add_argument(
        "--events",
        default=str(CHUNKS),
        help="output events per answer: N, or N,M with --instructions (the per-event slope)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, proxy, out = args.child
        _child(variant, args.requests, Path(out), Path(proxy))
        return
    variants = [v for v in args.variants.split(",") if v]
    if not variants or args.requests < 1:
        raise SystemExit("--variants names at least one variant; --requests at least 1")
    if not args.instructions and any("~" in v for v in variants):
        raise SystemExit("a variant with plain shortcuts (VARIANT~NAME) needs --instructions")
    try:
        events = sorted({int(e) for e in args.events.split(",") if e})
    except ValueError:
        raise SystemExit("--events takes N or N,M (whole numbers)") from None
    if not events or events[0] < 1 or len(events) > (2 if args.instructions else 1):
        raise SystemExit("--events takes one count of 1 or more (two with --instructions)")
    env = {**os.environ, "PYTHONHASHSEED": "0", "BENCH_API": args.api}  # one hash layout
    env["BENCH_EVENTS"] = str(events[0])
    if args.sampled:
        env["BENCH_BYTECODES_SAMPLED"] = "1"
    if args.end_kept:
        env["STAGELENS_TAIL_SLOW_SECONDS"] = "1e-9"
    with tempfile.TemporaryDirectory(prefix="stagelens-bytecodes-") as tmp:
        proxy = Path(tmp) / "bench_proxy.py"
        proxy.write_text(PROXY)
        if args.instructions:
            _instructions(variants, args.requests, proxy, env, events)
            return
        per: dict[str, dict[tuple[str, str, int], float]] = {}
        for variant in variants:
            out = Path(tmp) / f"{variant}.json"
            cmd = [sys.executable, __file__, "--requests", str(args.requests)]
            subprocess.run(
                [*cmd, "--child", variant, str(proxy), str(out)],
                check=True,
                env=env,
                stderr=subprocess.DEVNULL,  # the GPU collector's notice, and the like
            )
            rows = json.loads(out.read_text())
            per[variant] = {(f, name, line): n for f, name, line, n in rows}
    base = variants[0]
    print(f"bytecodes per request ({args.requests} requests)")
    for variant in variants:
        print(f"  {variant:12s} {sum(per[variant].values()):10.1f}")
    for variant in variants[1:]:
        diff = {
            key: per[variant].get(key, 0.0) - per[base].get(key, 0.0)
            for key in per[base].keys() | per[variant].keys()
        }
        total = sum(diff.values())
        print(f"\n{variant} - {base}: {total:+.1f} bytecodes per request, by function")
        for (f, name, line), d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: args.top]:
            if d:
                print(f"  {d:+8.1f}  {f}:{line} {name}")


if __name__ == "__main__":
    main()
