"""What an idle `bgq work` waits on: LISTEN on PostgreSQL, a probe of the newest job id on MySQL.

Each wake-up holds a connection of its own, opened through the call seam (bgq/db: `detached`,
`listener_connect`), never one of the engine's pool.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Protocol

from ..db import Database


class Waker(Protocol):
    """A wait that ends early when jobs are published (bgq/sql/calls.py Procs.waker)."""

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True if jobs may have been published meanwhile."""

    def close(self) -> None: ...


#: Prober: seconds between two reads of the newest id. A read costs the server what `SELECT 1`
#: does (one round trip, ~60-120 us of mariadbd CPU): about 1.5-2 % of a core per idle worker.
PROBE_SECONDS = 0.005


class Prober:
    """MySQL's stand-in for LISTEN: a dedicated autocommit connection reads `SELECT MAX(id)` every
    PROBE_SECONDS; `wait()` returns True once it changed.

    InnoDB answers MAX of the primary key from the index's last entry ("Select tables optimized
    away"), at the cost of a `SELECT 1`, whatever the table's size; autocommit gives each read a
    fresh view, so it sees every commit. It sees new rows only: released jobs, jobs handed back
    and jobs that become due by time are found by the worker's own claims, and so is a row whose
    id was taken before, but committed after, the newest one's.
    """

    def __init__(self, db: Database, newest_id_sql: str, every: float = PROBE_SECONDS) -> None:
        self._conn: Any = db.detached()  # autocommit, never back to the pool
        self._sql = newest_id_sql
        self._every = every
        try:
            self._last = self._read()
        except Exception:
            self.close()  # the connection is detached: nobody else would close it
            raise

    def _read(self) -> Any:
        with self._conn.cursor() as cursor:
            cursor.execute(self._sql)
            return cursor.fetchone()[0]

    def wait(self, timeout: float) -> bool:
        """Read the newest id every PROBE_SECONDS for up to `timeout` seconds; True once it moved."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(self._every, left))
            newest = self._read()
            if newest != self._last:
                self._last = newest
                return True
        return False

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing left to do
            self._conn.close()


class Listener:
    """A dedicated autocommit PostgreSQL connection that LISTENs on the table's channel.

    The jobs table's statement-level insert trigger (schema.sql) and released jobs
    ({table}_finish_results) NOTIFY that channel; `wait()` returns as soon as one arrives. The
    connection is not the engine's: it goes to the Database's `listen_url` when set (a direct
    one, the engine's URL leading to a transaction pooler), and needs no session settings.
    """

    def __init__(self, db: Database, table: str) -> None:
        self._conn: Any = db.listener_connect()
        try:
            self._conn.execute(f'LISTEN "{table}"')
        except Exception as exc:
            self.close()
            raise db.translate(exc) from exc

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for a notification; True if one came (all are drained)."""
        got = any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))
        if got:
            for _ in self._conn.notifies(timeout=0):
                pass
        return got

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing left to do
            self._conn.close()
