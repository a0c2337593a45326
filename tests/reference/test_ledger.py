"""The usage ledger on real engines: SQLite files shared by processes, a real PostgreSQL.

Expected totals are what the test itself added; each figure is read back through a fresh
ledger object (or the engine directly), never from the writer's memory.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stagelens.reference.ledger import GroupCommit, SqliteLedger, TenantUsage
from stagelens.reference.ledger_url import default_url, open_ledger, resolve_url

from stagelens.errors import ConfigurationError

pytestmark = pytest.mark.anyio

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from stagelens.reference.ledger import TenantUsage
    from stagelens.reference.ledger_url import open_ledger

    async def main(url, n):
        ledger = open_ledger(url)
        await ledger.open()
        # concurrent adds: several group commits of several entries each
        await asyncio.gather(*(
            ledger.add(f"t{i % 3}", TenantUsage(1, 10, i % 7, 1, 0.25)) for i in range(n)
        ))
        await ledger.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def _expected(processes: int, n: int) -> dict[str, TenantUsage]:
    """What ``processes`` writers of ``n`` adds each add up to."""
    totals = {f"t{t}": TenantUsage() for t in range(3)}
    for _ in range(processes):
        for i in range(n):
            totals[f"t{i % 3}"] += TenantUsage(1, 10, i % 7, 1, 0.25)
    return totals


def _write_from_processes(url: str, processes: int, n: int) -> None:
    """``processes`` Python processes add ``n`` usages each, all at once."""
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, url, str(n)]) for _ in range(processes)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * processes


async def _totals(url: str) -> dict[str, TenantUsage]:
    ledger = open_ledger(url)
    try:
        return {f"t{t}": await ledger.get(f"t{t}") for t in range(3)}
    finally:
        await ledger.close()


class TestUrls:
    """One URL names the engine and where it is."""

    def test_unknown_scheme_is_refused_with_the_password_hidden(self) -> None:
        """A scheme other than sqlite/postgresql fails at start-up; no password in the message."""
        with pytest.raises(ConfigurationError, match=r"mysql://u:\*\*\*@h/db") as info:
            open_ledger("mysql://u:hunter2@h/db")
        assert "hunter2" not in str(info.value)

    def test_relative_sqlite_path_is_refused(self) -> None:
        """A relative SQLite path would depend on the working directory: refused."""
        with pytest.raises(ConfigurationError, match="absolute"):
            open_ledger("sqlite://ledger.db")

    def test_config_wins_over_environment_over_default(self, monkeypatch) -> None:
        """The config's URL, else $STAGELENS_LEDGER_URL, else a file under XDG_STATE_HOME."""
        monkeypatch.setenv("STAGELENS_LEDGER_URL", "sqlite:///env.db")
        assert resolve_url("sqlite:///config.db") == "sqlite:///config.db"
        assert resolve_url(None) == "sqlite:///env.db"
        monkeypatch.delenv("STAGELENS_LEDGER_URL")
        monkeypatch.setenv("XDG_STATE_HOME", "/var/state")
        assert resolve_url(None) == default_url() == "sqlite:///var/state/stagelens/ledger.sqlite3"


class TestSqlite:
    """One SQLite file shared by every worker process of a machine."""

    def test_concurrent_processes_lose_no_update(self, tmp_path) -> None:
        """Four processes adding at once: every usage is in the totals, exactly."""
        url = f"sqlite://{tmp_path}/ledger.sqlite3"
        _write_from_processes(url, processes=4, n=150)
        assert asyncio.run(_totals(url)) == _expected(4, 150)

    def test_processes_opening_a_new_file_at_once_all_open(self, tmp_path) -> None:
        """Several workers opening one new file at once all open it.

        Switching a file to WAL takes its exclusive lock, and SQLite answers "database is
        locked" at once, without waiting out the busy timeout, to the connections that race
        for it; the ledger waits for such a switch as it waits for a write.
        """
        failures: list[BaseException] = []
        for round_ in range(40):
            ledgers = [SqliteLedger(tmp_path / f"r{round_}.sqlite3") for _ in range(4)]
            start = threading.Barrier(len(ledgers))

            def open_one(ledger: SqliteLedger, start: threading.Barrier = start) -> None:
                start.wait()
                try:
                    ledger._open_sync()
                except sqlite3.Error as error:
                    failures.append(error)
                finally:
                    ledger._close_sync()

            threads = [threading.Thread(target=open_one, args=(one,)) for one in ledgers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert failures == []

    def test_file_is_in_wal_mode(self, tmp_path) -> None:
        """The file is in WAL mode (readers never block the writer), read by sqlite3 itself."""
        path = tmp_path / "ledger.sqlite3"

        async def one() -> None:
            ledger = open_ledger(f"sqlite://{path}")
            await ledger.add("acme", TenantUsage(1, 2, 3, 0, 0.5))
            await ledger.close()

        asyncio.run(one())
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT * FROM stagelens_usage").fetchall() == [("acme", 1, 2, 3, 0, 0.5)]

    @settings(
        max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        adds=st.lists(
            st.tuples(
                st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
                st.integers(0, 10**6),
                st.integers(0, 10**6),
            ),
            max_size=12,
        )
    )
    def test_any_tenant_name_adds_up(self, tmp_path, adds) -> None:
        """Whatever the tenant names (quotes, any Unicode), each tenant reads its own sum."""
        path = tmp_path / f"h{time.monotonic_ns()}.sqlite3"
        expected: dict[str, TenantUsage] = {}
        for tenant, inp, out in adds:
            expected.setdefault(tenant, TenantUsage()).__iadd__(TenantUsage(1, inp, out, 0, 0.0))

        async def run() -> dict[str, TenantUsage]:
            ledger = open_ledger(f"sqlite://{path}")
            await asyncio.gather(*(ledger.add(t, TenantUsage(1, i, o, 0, 0.0)) for t, i, o in adds))
            await ledger.close()
            again = open_ledger(f"sqlite://{path}")
            got = {t: await again.get(t) for t in expected}
            await again.close()
            return got

        assert asyncio.run(run()) == expected


class TestSqliteAsync:
    """The event loop goes on while SQLite waits."""

    async def test_a_locked_file_does_not_stall_the_event_loop(self, tmp_path) -> None:
        """While another process holds the write lock for 0.5 s, the add waits for it in a
        thread: the event loop keeps ticking every few ms, and the add lands afterwards."""
        path = tmp_path / "ledger.sqlite3"
        ledger = open_ledger(f"sqlite://{path}")
        await ledger.open()
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
        release.start()
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        started = time.monotonic()
        await ledger.add("acme", TenantUsage(1, 1, 1, 0, 0.0))
        waited = time.monotonic() - started
        task.cancel()
        release.join()
        assert waited >= 0.4  # it did wait for the lock
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        assert max(gaps) < 0.2, max(gaps)
        assert (await ledger.get("acme")).requests == 1
        await ledger.close()
        holder.close()

    async def test_cancelled_caller_still_gets_its_usage_committed(self, tmp_path) -> None:
        """A caller cancelled while its batch commits (its client left) is still on record."""
        url = f"sqlite://{tmp_path}/ledger.sqlite3"
        ledger = open_ledger(url)
        first = asyncio.create_task(ledger.add("acme", TenantUsage(1, 5, 5, 0, 0.1)))
        second = asyncio.create_task(ledger.add("acme", TenantUsage(1, 7, 7, 0, 0.2)))
        await asyncio.sleep(0)
        second.cancel()
        await first
        await ledger.close()
        assert (await _totals_one(url, "acme")) == TenantUsage(2, 12, 12, 0, pytest.approx(0.3))

    async def test_a_failed_write_raises_in_every_caller_of_its_batch(self) -> None:
        """The callers whose usage a failed transaction carried see the error."""

        async def failing(entries: list) -> None:
            raise OSError("disk full")

        commits = GroupCommit(failing)
        results = await asyncio.gather(
            commits.add("a", TenantUsage(1)),
            commits.add("b", TenantUsage(1)),
            return_exceptions=True,
        )
        assert [type(r) for r in results] == [OSError, OSError]


async def _totals_one(url: str, tenant: str) -> TenantUsage:
    ledger = open_ledger(url)
    try:
        return await ledger.get(tenant)
    finally:
        await ledger.close()


class TestPostgres:
    """A real PostgreSQL shared by several replicas."""

    def test_concurrent_processes_lose_no_update(self, postgres_url) -> None:
        """Four processes (four replicas) adding at once: every usage is in the totals."""
        asyncio.run(_reset(postgres_url))
        _write_from_processes(postgres_url, processes=4, n=150)
        assert asyncio.run(_totals(postgres_url)) == _expected(4, 150)

    def test_row_is_readable_by_plain_sql(self, postgres_url) -> None:
        """What the ledger wrote is in the documented table, read with psycopg directly."""
        import psycopg

        async def one() -> None:
            ledger = open_ledger(postgres_url)
            await ledger.add("plain-sql", TenantUsage(1, 2, 3, 1, 0.5))
            await ledger.close()

        asyncio.run(one())
        with psycopg.connect(postgres_url) as conn:
            row = conn.execute(
                "SELECT requests, input_tokens, output_tokens, cached_input_tokens, cost_usd "
                "FROM stagelens_usage WHERE tenant = %s",
                ("plain-sql",),
            ).fetchone()
        assert row == (1, 2, 3, 1, 0.5)


async def _reset(url: str) -> None:
    import psycopg

    ledger = open_ledger(url)
    await ledger.open()  # creates the table
    await ledger.close()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("DELETE FROM stagelens_usage WHERE tenant LIKE 't%'")


class TestPostgresAsync:
    """Start-up against a database that is not there."""

    async def test_unreachable_database_fails_the_start_at_once(self, port_factory) -> None:
        """Nothing listening: open() raises the driver's error within seconds (not after
        the pool's retries), and the message holds no password."""
        import psycopg

        ledger = open_ledger(f"postgresql://u:hunter2@127.0.0.1:{port_factory()}/db")
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            await ledger.open()
        assert time.monotonic() - started < 5
        assert "hunter2" not in str(info.value)
