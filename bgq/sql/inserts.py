"""The publish INSERTs of one table (one job, a bulk, alone, sent ahead, async): writes outside procedures."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from sqlalchemy.engine import Connection

from ..config import read_clock
from ..db import Database
from ..model import NewJob

_INSERT_COLUMNS = (
    "queue",
    "priority",
    "callback_name",
    "parameters",
    "parameters_json",
    "state",
    "number_of_attempts",
    "serial_group",
    "coalesce_threshold",
    "identifier",
    "mode",
    "postponed_by",
    "processed_by_broker",
)


class Inserts:
    """The INSERTs of publish on one table; each runs in the transaction of the connection given
    (or in one of its own: insert_alone, send_insert_many, insert_async)."""

    def __init__(self, db: Database, table: str, clock: Callable[[], Any] | None = None) -> None:
        self.db = db
        self.table = table
        self.clock = clock  # the option `clock`: when set, created_at is its time
        # The one-row INSERT and the bulk, built once: with the server's clock, or the option's.
        self._returning = db.dialect.name == "postgres"
        now = db.dialect.now_sql()
        self._insert_sql = _insert_sql(table, now, self._returning)
        self._insert_sql_clocked = _insert_sql(table, "%s", self._returning)
        if self._returning:  # PostgreSQL's bulk (MySQL's depends on the number of jobs)
            pg = _postgres()
            self._insert_many_sql = pg.insert_many_sql(table, _INSERT_COLUMNS, now)
            self._insert_many_sql_clocked = pg.insert_many_sql(table, _INSERT_COLUMNS, "%s::timestamptz")

    def insert(self, conn: Connection, job: NewJob) -> int:
        """Insert one READY job (created_at = updated_at = the clock) in `conn`'s transaction and
        return its id (the outbox: the application's own transaction)."""
        sql, values = self._insert_statement(job)
        if self._returning:
            return int(self.db.scalar(conn, sql, values))
        return int(self.db.execute(conn, sql, values))  # type: ignore[arg-type]

    def insert_alone(self, job: NewJob) -> int:
        """`insert` in a transaction of its own, in one round trip (Database.execute_alone)."""
        sql, values = self._insert_statement(job)
        rows, lastrowid = self.db.execute_alone(sql, values)
        return int(rows[0][0] if self._returning else lastrowid)  # type: ignore[arg-type]

    async def insert_async(self, job: NewJob) -> int:
        """`insert` on the running loop's asyncio connection (PostgreSQL: publish_async,
        Database.aio), in its own transaction."""
        sql, values = self._insert_statement(job)
        return int(await self.db.aio.fetch_value(sql, values))

    def _insert_statement(self, job: NewJob) -> tuple[str, tuple[Any, ...]]:
        """The one-row INSERT (built once per clock kind: the server's, or the option `clock`'s
        time passed twice) and its values."""
        values = _insert_values(job)
        if self.clock is None:
            return self._insert_sql, values
        now = read_clock(self.clock)
        return self._insert_sql_clocked, (*values, now, now)

    def insert_many(self, conn: Connection, jobs: Sequence[NewJob]) -> list[int]:
        """Insert READY jobs with one INSERT in `conn`'s transaction; return their ids in the
        order of `jobs`.

        Where the INSERT returns its ids (insert_many_statement: PostgreSQL, MariaDB 10.5+),
        they are sorted: the auto-increment values of one INSERT ascend in the order its rows
        reach it (each row takes its value as it is inserted; a concurrent INSERT may take
        values in between, never reorder them), so the sorted ids map to `jobs` by position.
        MySQL 8 (no RETURNING): one INSERT ... VALUES where its ids are consecutive
        (db/_mysql().py consecutive_ids), else each row on its own.
        """
        if not jobs:
            return []
        if self._returning:
            return sorted(r[0] for r in self.db.tuples(conn, *self.insert_many_statement(jobs)))
        if self.returns_many:
            # MariaDB: the values written in by the client (db/mysql.py inline), thousands at once
            sql, values = self.insert_many_statement(jobs)
            return sorted(int(r[0]) for r in self.db.execute_verbatim(conn, [sql], values)[0])
        sql, values = self._values_statement(jobs, "")
        step = _mysql().consecutive_ids(*self.db.tuples(conn, _mysql().AUTOINC_SQL)[0])
        if step is None:
            return [self.insert(conn, job) for job in jobs]
        first = int(self.db.execute_verbatim(conn, [sql], values)[1])  # type: ignore[arg-type]
        return [first + i * step for i in range(len(jobs))]

    @functools.cached_property
    def returns_many(self) -> bool:
        """Whether the bulk INSERT returns its ids (insert_many_statement, send_insert_many):
        PostgreSQL and MariaDB 10.5+ do (RETURNING); MySQL 8 does not."""
        return self._returning or self.db.insert_returning()

    @property
    def sends_many(self) -> bool:
        """Whether send_insert_many works here: the INSERT returns its ids and the driver can
        send a statement without waiting for it (PostgreSQL; MariaDB 10.5+ on PyMySQL)."""
        return self.db.dialect.can_send and self.returns_many

    def send_insert_many(self, statement: tuple[str, tuple[Any, ...]]) -> Callable[[], list[int]]:
        """Insert the jobs of an `insert_many_statement` in a transaction of their own, sent
        without waiting for the server (Database.send_alone); call the result for their ids, in
        the order of the jobs, once the server has committed them (sorted: see insert_many)."""
        sent = self.db.send_alone(*statement)
        return lambda: sorted(int(r[0]) for r in sent.rows())

    def insert_many_statement(self, jobs: Sequence[NewJob]) -> tuple[str, tuple[Any, ...]]:
        """The bulk INSERT of `jobs` that returns their ids (where `returns_many`), and its
        values. PostgreSQL: INSERT ... SELECT FROM unnest(one array per column) WITH ORDINALITY,
        ordered by it: 11 arrays (+ the clock) whatever the number of jobs. MariaDB: INSERT ...
        VALUES, a row per job, RETURNING id."""
        if not self._returning:
            return self._values_statement(jobs, " RETURNING id")
        arrays = _postgres().insert_many_arrays(jobs)
        if self.clock is None:
            return self._insert_many_sql, arrays
        now = read_clock(self.clock)
        return self._insert_many_sql_clocked, (now, now, *arrays)  # the SELECT list's two come first

    def _values_statement(self, jobs: Sequence[NewJob], returning: str) -> tuple[str, tuple[Any, ...]]:
        """MySQL's bulk INSERT ... VALUES, a row of %s per job (+ `returning`), and its values."""
        now = self.db.dialect.now_sql()
        clocked: tuple[Any, ...] = ()
        if self.clock is not None:
            now, clocked = "%s", (read_clock(self.clock),) * 2
        sql = _mysql().values_sql(self.table, _INSERT_COLUMNS, len(jobs), now, returning)
        return sql, tuple([v for job in jobs for v in _insert_values(job) + clocked])


def _insert_sql(table: str, now: str, returning: bool) -> str:
    """The one-row INSERT: a %s per column, then created_at and updated_at (`now` twice)."""
    columns = ", ".join(_INSERT_COLUMNS)
    marks = ", ".join(["%s"] * len(_INSERT_COLUMNS))
    sql = f"INSERT INTO {table} ({columns}, created_at, updated_at) VALUES ({marks}, {now}, {now})"
    return sql + " RETURNING id" if returning else sql


def _insert_values(job: NewJob) -> tuple[Any, ...]:
    """A new job's values in the order of _INSERT_COLUMNS (state READY, no attempts yet)."""
    return (
        job.queue, job.priority, job.callback_name, job.parameters, job.parameters_json, 1, 0,
        job.serial_group, job.coalesce_threshold, job.identifier, job.mode, job.postponed_by,
        int(job.processed_by_broker),
    )  # fmt: skip


def _mysql() -> ModuleType:
    from ..db import mysql  # loaded with the dialect: PyMySQL only where it is used

    return mysql


def _postgres() -> ModuleType:
    from ..db import postgres  # loaded with the dialect: psycopg only where it is used

    return postgres
