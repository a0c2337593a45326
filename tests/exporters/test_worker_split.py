"""A process that is one of several workers of one server is found from what it can see
(a listening socket shared with its parent and siblings), warned about once, and shown on
``/metrics``. Real processes and sockets: a small pre-fork server forked here."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client import CollectorRegistry
from stagelens.exporters import worker_split
from stagelens.exporters.worker_split import RECHECK_SECONDS, WorkerSplit, watch_workers

from stagelens import semconv
from stagelens.prefork import Workers, find_workers, server_name

PREFORK = textwrap.dedent(
    """
    import json, os, socket, sys, time
    from stagelens.prefork import find_workers

    workers, mode = int(sys.argv[1]), sys.argv[2]
    share = mode != "own"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    if mode != "bound":  # "bound": as uvicorn's supervisor, which leaves listen() to workers
        listener.listen()
    client = socket.create_connection(listener.getsockname()) if mode != "bound" else None
    ready_r, ready_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            if not share:
                listener.close()
                own = socket.socket()
                own.bind(("127.0.0.1", 0))
                own.listen()
            os.read(ready_r, 1)  # every worker exists before any looks
            found = find_workers()
            line = json.dumps(None if found is None else [found.count, found.parent])
            os.write(out_w, (line + "\\n").encode())
            time.sleep(0.5)  # still there while the others look
            os._exit(0)
        pids.append(pid)
    os.write(ready_w, b"x" * workers)
    lines = os.fdopen(out_r)
    results = [json.loads(lines.readline()) for _ in range(workers)]
    for pid in pids:
        os.waitpid(pid, 0)
    print(json.dumps({"parent": os.getpid(), "results": results}))
    """
)


def _prefork(workers: int, mode: str = "share") -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PREFORK, str(workers), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


class TestFindWorkers:
    """``stagelens.prefork.find_workers`` on real forked processes."""

    def test_two_workers_on_one_socket_see_each_other(self) -> None:
        """Each of two forked workers accepting on the parent's socket counts two, and
        names the parent."""
        seen = _prefork(2)
        assert seen["results"] == [[2, seen["parent"]], [2, seen["parent"]]]

    def test_workers_of_a_socket_bound_but_not_yet_listening(self) -> None:
        """uvicorn's supervisor binds the socket and each worker calls ``listen()`` as it
        starts serving: a worker importing the app before any listens is still found."""
        seen = _prefork(2, "bound")
        assert seen["results"] == [[2, seen["parent"]], [2, seen["parent"]]]

    def test_three_workers(self) -> None:
        """Every sibling sharing the socket is counted."""
        seen = _prefork(3)
        assert [count for count, _ in seen["results"]] == [3, 3, 3]

    def test_a_lone_worker_is_a_worker_of_one(self) -> None:
        """One worker sharing the socket with its parent (gunicorn ``-w 1``, or the
        first worker before the next is started): a worker, not split."""
        seen = _prefork(1)
        assert seen["results"] == [[1, seen["parent"]]]

    def test_children_with_sockets_of_their_own_are_no_workers(self) -> None:
        """Children that each listen on a socket of their own share nothing: None (what
        ``SO_REUSEPORT`` servers look like; documented as not detected)."""
        assert _prefork(2, "own")["results"] == [None, None]

    def test_this_process_is_no_worker(self) -> None:
        """The test process accepts on no socket its parent shares."""
        assert find_workers() is None

    def test_without_proc_nothing_is_found(self, tmp_path) -> None:
        """No ``/proc`` (macOS, Windows): None, no error."""
        assert find_workers(tmp_path / "no-proc") is None

    @pytest.mark.parametrize(
        ("software", "expected"),
        [("gunicorn/27.0.1", "gunicorn"), ("Hypercorn/0.17", "hypercorn")],
    )
    def test_the_server_is_named_from_what_it_exports(self, software, expected) -> None:
        """gunicorn exports ``SERVER_SOFTWARE`` to its workers."""
        assert server_name({"SERVER_SOFTWARE": software}) == expected


def _split(count: int) -> Workers:
    return Workers(server="uvicorn", pids=tuple(range(100, 100 + count)), parent=1)


class TestTheCollector:
    """``stagelens_metrics_split_info`` and the warning, from what is found."""

    def test_split_is_shown_and_warned_once(self, caplog) -> None:
        """Two workers: the series on every scrape, one warning naming the fix."""
        registry = CollectorRegistry()
        with caplog.at_level(logging.WARNING):
            watch_workers(registry, find=lambda: _split(2))
            for _ in range(3):
                value = registry.get_sample_value(
                    semconv.METRICS_SPLIT,
                    {semconv.LABEL_SERVER: "uvicorn", semconv.LABEL_WORKERS: "2"},
                )
                assert value == 1.0
            watch_workers(registry, find=lambda: _split(2))  # configure() again
        warnings = [r for r in caplog.records if r.name == worker_split.logger.name]
        assert len(warnings) == 1
        assert "one of 2 workers of uvicorn" in warnings[0].getMessage()
        assert "PROMETHEUS_MULTIPROC_DIR" in warnings[0].getMessage()

    @pytest.mark.parametrize("found", [None, _split(1)])
    def test_nothing_when_not_split(self, found, caplog) -> None:
        """No worker, or a worker alone: no series, no warning."""
        registry = CollectorRegistry()
        with caplog.at_level(logging.WARNING):
            watch_workers(registry, find=lambda: found)
        assert not [m for m in registry.collect() if m.name == semconv.METRICS_SPLIT]
        assert not caplog.records

    def test_a_failed_look_breaks_no_scrape(self) -> None:
        """A look that raises finds nothing; the scrape goes on."""

        def broken() -> Workers:
            raise RuntimeError("no /proc today")

        registry = CollectorRegistry()
        watch_workers(registry, find=broken)
        assert not [m for m in registry.collect() if m.name == semconv.METRICS_SPLIT]

    def test_a_scrape_looks_again_when_the_last_look_is_stale(self) -> None:
        """Split: a scrape reuses the last look until ``RECHECK_SECONDS`` have passed (a
        third worker is then counted); no worker: likewise."""
        now = [0.0]
        found: list[Workers | None] = [_split(2)]
        looks = []

        def find() -> Workers | None:
            looks.append(now[0])
            return found[0]

        watcher = WorkerSplit(find, clock=lambda: now[0])
        watcher.look()
        found[0] = _split(3)
        now[0] = RECHECK_SECONDS / 2
        assert watcher.current() == _split(2)
        now[0] = RECHECK_SECONDS + 1
        assert watcher.current() == _split(3)
        assert looks == [0.0, RECHECK_SECONDS + 1]

    def test_a_worker_alone_looks_again_at_every_scrape(self) -> None:
        """Its siblings may start any moment: the first scrape after they did shows the
        split."""
        found = [_split(1)]
        watcher = WorkerSplit(lambda: found[0], clock=lambda: 0.0)
        watcher.look()
        assert not list(watcher.collect())
        found[0] = _split(2)
        assert [m.name for m in watcher.collect()] == [semconv.METRICS_SPLIT]

    def test_a_worker_alone_looks_again_soon(self) -> None:
        """At ``configure()`` a worker whose siblings have not started yet looks again on
        a thread, and stops once it sees them."""
        answers = iter([_split(1), _split(1), _split(2)])
        watcher = WorkerSplit(lambda: next(answers))
        watcher.look()
        watcher.look_again_soon(delays=(0.01, 0.02, 0.03))
        for _ in range(200):
            if watcher.current() == _split(2):
                break
            time.sleep(0.01)
        assert watcher.current() == _split(2)
