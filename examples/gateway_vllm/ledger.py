"""The per-tenant usage ledger behind ``GET /v1/usage``, in a real database.

Why a database: a ledger in process memory is lost on every restart, and with several
workers each one answers with its own share. One URL picks the engine (``ledger_url``):

- ``sqlite:///ABSOLUTE/PATH`` (the default, under ``$XDG_STATE_HOME/stagelens``): one file
  shared by all the workers of one machine, in WAL mode, written in ``BEGIN IMMEDIATE``
  transactions that wait for each other (busy timeout), never lose an update;
- ``postgresql://user:password@host:5432/db`` for several replicas on several machines.

Writes are group-committed: the usages added while one transaction is running go in the
next one, merged per tenant, so a busy gateway pays one commit per batch, not per request.
``add`` returns once its usage is committed, so a response sent after it is on record.
Blocking calls never run on the event loop: SQLite in a worker thread, PostgreSQL through
psycopg's asyncio connections.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Final, Protocol

import anyio.to_thread

TABLE: Final = "stagelens_usage"
"""One row per tenant: running totals."""

_COLUMNS: Final = ("requests", "input_tokens", "output_tokens", "cached_input_tokens", "cost_usd")


@dataclass
class TenantUsage:
    """What one tenant used, for ``GET /v1/usage`` (running totals)."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cost_usd: float = 0.0

    def __iadd__(self, other: TenantUsage) -> TenantUsage:
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.cost_usd += other.cost_usd
        return self


class Ledger(Protocol):
    """A usage ledger: add one request's usage, read a tenant's totals."""

    async def open(self) -> None:
        """Connect and create the table if needed (also done by the first call)."""

    async def add(self, tenant: str, usage: TenantUsage) -> None:
        """Add ``usage`` to ``tenant``'s totals; returns once it is committed."""

    async def get(self, tenant: str) -> TenantUsage:
        """``tenant``'s totals (zeros for a tenant never billed)."""

    async def close(self) -> None:
        """Finish pending writes and disconnect."""


Entry = tuple[str, TenantUsage]


def merge(entries: Sequence[Entry]) -> list[Entry]:
    """Sum ``entries`` per tenant, sorted by tenant: one row write per tenant, always in
    the same order (two transactions locking rows in opposite orders would deadlock)."""
    totals: dict[str, TenantUsage] = {}
    for tenant, usage in entries:
        totals.setdefault(tenant, TenantUsage()).__iadd__(usage)
    return sorted(totals.items())


class GroupCommit:
    """Runs ``write`` over the entries added while the previous write was running.

    Why: a commit is the expensive part (a file sync, a network round trip); requests that
    end together share one. An awaiting request that is cancelled (its client left) does
    not cancel the write: its usage is still committed with the batch.
    """

    def __init__(self, write: Callable[[list[Entry]], Awaitable[None]]) -> None:
        self._write = write
        self._pending: list[tuple[str, TenantUsage, asyncio.Future[None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def add(self, tenant: str, usage: TenantUsage) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((tenant, usage, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await done

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._write(merge([(tenant, usage) for tenant, usage, _ in batch]))
            except Exception as exc:
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            else:
                for *_, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def drain(self) -> None:
        """Wait for the writes under way (at shutdown)."""
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


def upsert_sql(placeholder: str) -> str:
    """Add one row's figures to a tenant's totals, creating the row on first use (the
    statement SQLite >= 3.24 and PostgreSQL share; ``placeholder`` is ``?`` or ``%s``)."""
    values = ", ".join([placeholder] * (len(_COLUMNS) + 1))
    added = ", ".join(f"{c} = {TABLE}.{c} + excluded.{c}" for c in _COLUMNS)
    return (
        f"INSERT INTO {TABLE} (tenant, {', '.join(_COLUMNS)}) VALUES ({values}) "
        f"ON CONFLICT (tenant) DO UPDATE SET {added}"
    )


SELECT_SQL: Final = f"SELECT {', '.join(_COLUMNS)} FROM {TABLE} WHERE tenant = "


def rows(entries: list[Entry]) -> list[tuple[str | int | float, ...]]:
    """Parameter rows for :func:`upsert_sql`."""
    return [(tenant, *astuple(usage)) for tenant, usage in entries]


def _switch_to_wal(db: sqlite3.Connection, timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``timeout`` seconds for its lock.

    The switch takes the file's exclusive lock. SQLite answers ``SQLITE_BUSY`` at once,
    without calling the busy handler, to the connections that race for it (waiting could
    deadlock them), so workers starting together would fail to open; this waits and tries
    again, as the busy timeout waits for a write. Any other error is raised as it is.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            busy = error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


class SqliteLedger:
    """The ledger in one SQLite file, shared by every process that opens it.

    WAL mode lets readers go on while one process writes; ``synchronous=FULL`` syncs the
    log at each commit, so a committed usage survives a power cut as well as a killed
    process. Each write is a ``BEGIN IMMEDIATE`` transaction (the write lock taken up front,
    so no transaction has to upgrade a read lock and fail); a process that finds the
    file locked waits up to ``busy_timeout`` seconds.
    """

    def __init__(self, path: Path, busy_timeout: float = 30.0) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._commits = GroupCommit(self._write)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            _switch_to_wal(db, self._busy_timeout)
            db.execute("PRAGMA synchronous=FULL")
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLE} (tenant TEXT PRIMARY KEY, "
                "requests INTEGER NOT NULL, input_tokens INTEGER NOT NULL, "
                "output_tokens INTEGER NOT NULL, cached_input_tokens INTEGER NOT NULL, "
                "cost_usd REAL NOT NULL)"
            )
            self._db = db
        return self._db

    def _open_sync(self) -> None:
        with self._lock:
            self._connection()

    def _write_sync(self, entries: list[Entry]) -> None:
        with self._lock:
            db = self._connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(upsert_sql("?"), rows(entries))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _get_sync(self, tenant: str) -> TenantUsage:
        with self._lock:
            row = self._connection().execute(SELECT_SQL + "?", (tenant,)).fetchone()
        return TenantUsage(*row) if row is not None else TenantUsage()

    def _close_sync(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    async def _write(self, entries: list[Entry]) -> None:
        await anyio.to_thread.run_sync(self._write_sync, entries)

    async def open(self) -> None:
        await anyio.to_thread.run_sync(self._open_sync)

    async def add(self, tenant: str, usage: TenantUsage) -> None:
        await self._commits.add(tenant, usage)

    async def get(self, tenant: str) -> TenantUsage:
        return await anyio.to_thread.run_sync(self._get_sync, tenant)

    async def close(self) -> None:
        await self._commits.drain()
        await anyio.to_thread.run_sync(self._close_sync)
