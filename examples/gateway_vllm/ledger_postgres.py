"""The usage ledger in PostgreSQL, for gateway replicas on several machines.

Why psycopg 3: maintained, typed, and its asyncio connections never block the event loop;
its pool (psycopg-pool) reconnects after a database restart. The table is created under a
transaction-scoped advisory lock, so replicas starting together do not race on
``CREATE TABLE IF NOT EXISTS`` (which is not safe under concurrency in PostgreSQL).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from stagelens.reference.ledger import (
    SELECT_SQL,
    TABLE,
    Entry,
    GroupCommit,
    TenantUsage,
    rows,
    upsert_sql,
)

_SCHEMA_LOCK: Final = zlib.crc32(TABLE.encode())
"""Advisory lock id held while the table is created (any fixed number would do)."""

_CREATE: Final = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (tenant TEXT PRIMARY KEY, "
    "requests BIGINT NOT NULL, input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL, "
    "cached_input_tokens BIGINT NOT NULL, cost_usd DOUBLE PRECISION NOT NULL)"
)


class PostgresLedger:
    """The ledger in a PostgreSQL table, shared by every replica given the same URL."""

    def __init__(self, url: str, max_connections: int = 4, connect_timeout: float = 10.0) -> None:
        self._pool = AsyncConnectionPool(
            url, min_size=1, max_size=max_connections, open=False, timeout=connect_timeout
        )
        self._url = url
        self._timeout = connect_timeout
        self._opened = False
        self._opening = asyncio.Lock()
        self._commits = GroupCommit(self._write)

    async def open(self) -> None:
        async with self._opening:
            if self._opened:
                return
            # One plain connection first: a wrong URL or a database down fails the start at
            # once with the driver's own error (the pool would retry until its timeout).
            conn = await AsyncConnection.connect(
                self._url, connect_timeout=max(1, round(self._timeout))
            )
            async with conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                await conn.execute(_CREATE)
            await self._pool.open(wait=True, timeout=self._timeout)
            self._opened = True

    async def _write(self, entries: list[Entry]) -> None:
        await self.open()
        async with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            await cur.executemany(upsert_sql("%s"), rows(entries))

    async def add(self, tenant: str, usage: TenantUsage) -> None:
        await self._commits.add(tenant, usage)

    async def get(self, tenant: str) -> TenantUsage:
        await self.open()
        async with self._pool.connection() as conn:
            cur = await conn.execute(SELECT_SQL + "%s", (tenant,))
            row = await cur.fetchone()
        return TenantUsage(*row) if row is not None else TenantUsage()

    async def close(self) -> None:
        await self._commits.drain()
        await self._pool.close()
