"""PostgreSQL for asyncio applications (`publish_async`): psycopg's AsyncConnection, one per event loop.

Each event loop that publishes gets one autocommit connection, opened on first use with the
same connect arguments and session settings (lock_timeout; none in pooled mode, where each
INSERT is a transaction of its own) as bgq's engine, kept for the loop's next calls and
replaced when it is found closed or broken. psycopg serialises the
statements of concurrent tasks on one connection, and each INSERT commits on its own, so many
concurrent `publish_async` calls from one loop are safe (they queue on that connection: one
round trip each). A connection idle longer than PING_AFTER seconds is pinged before it is
used, as the engine's pool_pre_ping does, so a server restart costs no failed publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from .postgres import PING_SQL

if TYPE_CHECKING:
    from . import Database

PING_AFTER = 1.0  # seconds idle after which a connection is pinged before its next statement


@dataclass
class _Slot:
    """One loop's connection, the lock that opens it once, and when it was last used."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: psycopg.AsyncConnection[Any] | None = None
    used: float = 0.0


class AsyncPostgres:
    """The async connections of one Database (PostgreSQL only)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slot] = weakref.WeakKeyDictionary()

    async def fetch_value(self, sql: str, values: Sequence[Any]) -> Any:
        """Run one statement in its own transaction (autocommit) and return its first column."""
        conn = await self._connection()
        try:
            cursor = await conn.execute(sql, tuple(values))
            row = await cursor.fetchone()
        except psycopg.Error as exc:
            raise self.database.translate(exc) from exc
        if row is None:
            raise self.database.translate(psycopg.DataError("The statement returned no row."))
        return row[0]

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        loop = asyncio.get_running_loop()
        slot = self._slots.get(loop)
        if slot is None:
            slot = self._slots[loop] = _Slot()
        async with slot.lock:
            conn = slot.conn
            if conn is not None and not conn.closed and time.monotonic() - slot.used > PING_AFTER:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(PING_SQL)
            if conn is None or conn.closed or conn.broken:
                if conn is not None:
                    await conn.close()
                slot.conn = conn = await self._connect()
            slot.used = time.monotonic()
            return conn

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        database = self.database
        args, kwargs = database.engine.dialect.create_connect_args(database.url)
        try:
            if database.pooled:  # behind a transaction pooler: no session state (bgq/db/__init__.py)
                kwargs = {**kwargs, "prepare_threshold": None}
            conn = await psycopg.AsyncConnection.connect(*args, **{**kwargs, "autocommit": True})
            if database.lock_timeout and not database.pooled:
                for statement in database.dialect.session_sql(conn, database.lock_timeout):
                    await conn.execute(statement)
        except psycopg.Error as exc:
            raise database.translate(exc) from exc
        return conn

    async def aclose(self) -> None:
        """Close the running loop's connection (the next publish_async opens a new one)."""
        slot = self._slots.pop(asyncio.get_running_loop(), None)
        if slot is not None and slot.conn is not None:
            await slot.conn.close()
