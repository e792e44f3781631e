"""The only module that names bgq's SQL: typed calls of the stored procedures, the insert and reads."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .config import read_clock
from .db import Database, InstalledRoutine, Proc
from .errors import DatabaseUnavailableError, JobNotFoundError
from .model import (
    Beat,
    Cancelled,
    Claimed,
    ClaimResult,
    FinishResult,
    GroupHead,
    JobRef,
    JobResult,
    JobState,
    NewJob,
    Pause,
    Reaped,
    ScheduleRow,
    StuckJobs,
    TableStats,
    WorkerRow,
)

if TYPE_CHECKING:
    from .db.aio_postgres import AsyncPostgres

# Signatures of db/<dialect>/<name>.sql; the PostgreSQL types double as documentation.
CLAIM = Proc(
    "claim",
    (
        ("p_id", "bigint"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_metadata", "text"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
FINISH = Proc(
    "finish",
    (
        ("p_id", "bigint"),
        ("p_attempt", "integer"),
        ("p_state", "integer"),
        ("p_error", "text"),
        ("p_postponed_by", "integer"),
        ("p_execution_time", "integer"),
        ("p_memory", "text"),
        ("p_clone_delay_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
CLAIM_BATCH = Proc(
    "claim_batch",
    (
        ("p_queue", "varchar"),
        ("p_limit", "integer"),
        ("p_pid", "integer"),
        ("p_min_priority", "integer"),
        ("p_max_priority", "integer"),
        ("p_max_heads", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
FINISH_BATCH = Proc("finish_batch", (("p_results", "text"), ("p_now", "timestamptz")))
HAND_OFF = Proc(
    "hand_off",
    (
        ("p_results", "text"),
        ("p_groups", "text"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_min_priority", "integer"),
        ("p_max_priority", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
PREDECESSOR = Proc("predecessor", (("p_id", "bigint"),), function=True)
GROUP_HEADS = Proc("group_heads", ())
PROMOTE_WAITING = Proc("promote_waiting", (("p_now", "timestamptz"),))
DUE_JOBS = Proc(
    "due_jobs",
    (("p_queue", "varchar"), ("p_broker_mode", "integer"), ("p_limit", "integer"), ("p_now", "timestamptz")),
)
REQUEUE = Proc("requeue", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
RUN_NOW = Proc("run_now", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
REAP = Proc(
    "reap",
    (
        ("p_queue", "varchar"),
        ("p_timeout_s", "integer"),
        ("p_limit", "integer"),
        ("p_backoff_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
BROKER_FAILED = Proc("broker_failed", (("p_id", "bigint"), ("p_error", "text"), ("p_now", "timestamptz")))
BACK_TO_BROKER = Proc(
    "back_to_broker", (("p_queue", "varchar"), ("p_limit", "integer"), ("p_now", "timestamptz"))
)
LOST_MESSAGES = Proc(
    "lost_messages",
    (("p_queue", "varchar"), ("p_timeout_s", "integer"), ("p_limit", "integer"), ("p_now", "timestamptz")),
)
HEARTBEAT = Proc(
    "heartbeat",
    (("p_id", "bigint"), ("p_attempt", "integer"), ("p_metadata", "text"), ("p_now", "timestamptz")),
)
UNFINISHED_IDENTIFIERS = Proc(
    "unfinished_identifiers",
    (("p_queue", "varchar"), ("p_identifiers_json", "text"), ("p_exclude_processing", "integer")),
)
MONITOR = Proc("monitor", (("p_queue", "varchar"), ("p_long_s", "integer"), ("p_now", "timestamptz")))
CLEAR_FINISHED = Proc(
    "clear_finished", (("p_queue", "varchar"), ("p_before", "timestamptz"), ("p_now", "timestamptz"))
)
WORKER_REGISTER = Proc(
    "worker_register",
    (
        ("p_host", "varchar"),
        ("p_pid", "integer"),
        ("p_mode", "varchar"),
        ("p_queue", "varchar"),
        ("p_version", "varchar"),
        ("p_now", "timestamptz"),
    ),
)
WORKER_HEARTBEAT = Proc(
    "worker_heartbeat",
    (("p_id", "bigint"), ("p_current_job_id", "bigint"), ("p_jobs_done", "bigint"), ("p_now", "timestamptz")),
)
WORKER_DEREGISTER = Proc("worker_deregister", (("p_id", "bigint"),))
WORKER_REAP = Proc(
    "worker_reap",
    (
        ("p_queue", "varchar"),
        ("p_dead_after_s", "integer"),
        ("p_limit", "integer"),
        ("p_backoff_ms", "integer"),
        ("p_now", "timestamptz"),
    ),
)
PAUSE = Proc(
    "pause",
    (
        ("p_kind", "varchar"),
        ("p_name", "varchar"),
        ("p_reason", "text"),
        ("p_by", "varchar"),
        ("p_now", "timestamptz"),
    ),
)
RESUME = Proc("resume", (("p_kind", "varchar"), ("p_name", "varchar")))
PAUSES = Proc("pauses", ())
CANCEL = Proc("cancel", (("p_id", "bigint"), ("p_reason", "text"), ("p_now", "timestamptz")))
SCHEDULE_UPSERT = Proc(
    "schedule_upsert",
    (
        ("p_name", "varchar"),
        ("p_cron", "varchar"),
        ("p_timezone", "varchar"),
        ("p_callback", "varchar"),
        ("p_parameters_json", "text"),
        ("p_queue", "varchar"),
        ("p_group", "varchar"),
        ("p_priority", "integer"),
        ("p_missed", "varchar"),
        ("p_next_at", "timestamptz"),
        ("p_now", "timestamptz"),
    ),
)
SCHEDULE_RETIRE = Proc(
    "schedule_retire", (("p_queue", "varchar"), ("p_names_json", "text"), ("p_now", "timestamptz"))
)
SCHEDULES = Proc("schedules", (("p_queue", "varchar"), ("p_due_only", "integer"), ("p_now", "timestamptz")))
FIRE = Proc(
    "fire",
    (
        ("p_name", "varchar"),
        ("p_fire_at", "timestamptz"),
        ("p_next_at", "timestamptz"),
        ("p_now", "timestamptz"),
    ),
)
CLAIM_IDS = Proc(
    "claim_ids",
    (
        ("p_ids", "text"),
        ("p_queue", "varchar"),
        ("p_pid", "integer"),
        ("p_waiting_ms", "integer"),
        ("p_worker_id", "bigint"),
        ("p_now", "timestamptz"),
    ),
)
#: Every installed routine, in install order (schema.sql comes first).
ALL_PROCS: tuple[Proc, ...] = (
    PREDECESSOR,
    CLAIM,
    FINISH,
    CLAIM_BATCH,
    FINISH_BATCH,
    HAND_OFF,
    GROUP_HEADS,
    PROMOTE_WAITING,
    DUE_JOBS,
    REQUEUE,
    REAP,
    BROKER_FAILED,
    BACK_TO_BROKER,
    LOST_MESSAGES,
    HEARTBEAT,
    UNFINISHED_IDENTIFIERS,
    MONITOR,
    CLEAR_FINISHED,
    RUN_NOW,
    WORKER_REGISTER,
    WORKER_HEARTBEAT,
    WORKER_DEREGISTER,
    WORKER_REAP,
    PAUSE,
    RESUME,
    PAUSES,
    CANCEL,
    SCHEDULE_UPSERT,
    SCHEDULE_RETIRE,
    SCHEDULES,
    FIRE,
    CLAIM_IDS,
)
#: Called by the other procedures only, never by Python; installed all the same.
INTERNAL_PROCS: tuple[Proc, ...] = (
    Proc("group_wake", ()),
    Proc("claim_job", ()),
    Proc("claim_heads", ()),
    Proc("finish_results", ()),
)

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


class Procs:
    """bgq's calls on one table. Each method runs in the transaction of the connection it is given."""

    def __init__(self, db: Database, table: str, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.db = db
        self.table = table
        self.clock = clock  # the option `clock`: when set, every p_now left None is its time
        # The INSERTs of publish, built once: with the server's clock, or the option's.
        self._returning = db.dialect.name == "postgres"
        now = db.dialect.now_sql()
        self._insert_sql = _insert_sql(table, now, self._returning)
        self._insert_sql_clocked = _insert_sql(table, "%s", self._returning)
        self._insert_many_sql = _insert_many_sql(table, now)
        self._insert_many_sql_clocked = _insert_many_sql(table, "%s::timestamptz")
        # _call_raw's statements and their result columns, by procedure (built on first use).
        self._statements: dict[str, str] = {}
        self._columns: dict[str, list[str]] = {}

    def _clocked(self, proc: Proc, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """`args` with the configured clock's time in a p_now left None (no clock: as given)."""
        if self.clock is not None:
            at = next((i for i, (name, _) in enumerate(proc.params) if name == "p_now"), None)
            if at is not None and at < len(args) and args[at] is None:
                return (*args[:at], read_clock(self.clock), *args[at + 1 :])
        return args

    def _call(self, conn: Connection, proc: Proc, *args: Any) -> list[dict[str, Any]]:
        args = self._clocked(proc, args)
        return self.db.call(conn, self.table, proc, args)

    def _call_raw(
        self, conn: Connection, proc: Proc, *args: Any, alone: bool = False
    ) -> list[dict[str, Any]]:
        """`_call` on the DBAPI cursor of `conn` (in its transaction), past SQLAlchemy's layers:
        for the worker's hot path (claim_batch, hand_off). A driver error is wrapped as
        SQLAlchemy wraps it (Database.transaction translates it); on a lost connection `conn` is
        invalidated, as SQLAlchemy would, so the next transaction opens a new one.

        `alone`: the caller's transaction holds this call and nothing else, so on PostgreSQL,
        when nothing has run in the transaction yet, the call runs as a statement of its own
        (autocommit for that statement: one round trip instead of BEGIN, the call, COMMIT; a
        function's statement is atomic, and its locks last until it ends, which is the
        transaction's end). The transaction's COMMIT then has nothing to do (psycopg sends
        nothing). On MySQL a CALL is not atomic by itself, so `alone` changes nothing there."""
        args = self._clocked(proc, args)
        if len(args) != len(proc.params):
            raise TypeError(f"{proc.name} takes {len(proc.params)} arguments, got {len(args)}")
        driver_error: type[Exception] = self.db.engine.dialect.loaded_dbapi.Error
        statement = self._statements.get(proc.name)
        if statement is None:
            statement = self._statements[proc.name] = self.db.dialect.call_sql(self.table, proc)
        raw: Any = conn.connection.driver_connection
        single = alone and self.db.dialect.name == "postgres" and raw.info.transaction_status == _PG_IDLE
        try:
            if single:
                raw.autocommit = True
            try:
                cursor = raw.cursor()
                try:
                    cursor.execute(statement, args)
                    # A procedure's columns never change: read once (psycopg builds its
                    # description afresh, column by column, on each read).
                    names = self._columns.get(proc.name)
                    if names is None:
                        description = cursor.description
                        if description is None:
                            return []
                        names = self._columns[proc.name] = [column[0] for column in description]
                    return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
                finally:
                    cursor.close()
            finally:
                if single and not raw.closed:
                    raw.autocommit = False
        except driver_error as exc:
            lost = isinstance(self.db.translate(exc), DatabaseUnavailableError)
            if lost:
                conn.invalidate()
            raise sa.exc.DBAPIError.instance(
                statement, args, exc, driver_error, connection_invalidated=lost
            ) from exc

    # --- state changes (stored procedures) ---

    def claim(
        self, conn: Connection, job_id: int, queue: str, pid: int, waiting_ms: int,
        metadata_json: str | None, now: dt.datetime | None = None, *, worker_id: int | None = None,
    ) -> ClaimResult:  # fmt: skip
        (row,) = self._call(conn, CLAIM, job_id, queue, pid, waiting_ms, metadata_json, worker_id, now)
        return ClaimResult(**row)

    def finish(
        self, conn: Connection, job_id: int, attempt: int, state: int, error: str | None,
        postponed_by: int | None, execution_time: int | None, memory_json: str | None,
        now: dt.datetime | None = None, *, clone_delay_ms: int | None = None,
    ) -> FinishResult:  # fmt: skip
        (row,) = self._call(
            conn, FINISH, job_id, attempt, state, error, postponed_by, execution_time, memory_json,
            clone_delay_ms, now,
        )  # fmt: skip
        return FinishResult(
            finished=bool(row["finished"]),
            promoted_id=row["promoted_id"],
            promoted_queue=row["promoted_queue"],
            promoted_priority=row["promoted_priority"],
            clone_id=row["clone_id"],
        )

    def claim_ids(
        self, conn: Connection, job_ids: Sequence[int], queue: str, pid: int, waiting_ms: int,
        now: dt.datetime | None = None, *, worker_id: int | None = None,
    ) -> list[tuple[int, ClaimResult]]:  # fmt: skip
        """Claim each of `job_ids` (distinct) as claim() would, in one call: [(id, its claim)],
        in the order given; a grouped job after the first is 'deferred' (unchanged: claim it
        with claim() in a transaction of its own)."""
        if not job_ids:
            return []
        rows = self._call(conn, CLAIM_IDS, json.dumps(list(job_ids)), queue, pid, waiting_ms, worker_id, now)
        return [(int(row.pop("id")), ClaimResult(**row)) for row in rows]

    def claim_batch(
        self, conn: Connection, queue: str, limit: int, pid: int, min_priority: int | None,
        max_priority: int | None, waiting_ms: int, now: dt.datetime | None = None,
        *, max_heads: int | None = None, worker_id: int | None = None, alone: bool = False,
    ) -> list[Claimed]:  # fmt: skip
        """Claim up to `limit` due jobs (ungrouped, or heads of idle groups, at most `max_heads`
        of them), in (priority, id) order. `alone`: nothing else runs in `conn`'s transaction
        (see _call_raw)."""
        rows = self._call_raw(
            conn, CLAIM_BATCH, queue, limit, pid, min_priority, max_priority, max_heads, waiting_ms,
            worker_id, now, alone=alone,
        )  # fmt: skip
        return [_claimed(r) for r in rows]

    def hand_off(
        self, conn: Connection, results: Sequence[JobResult], groups: Sequence[str] | None, queue: str,
        pid: int, min_priority: int | None, max_priority: int | None, waiting_ms: int,
        now: dt.datetime | None = None, *, worker_id: int | None = None, alone: bool = False,
    ) -> tuple[dict[int, bool], list[Claimed]]:  # fmt: skip
        """Write `results` (as finish_batch), then claim the next head of each of `groups`, in
        one call: ({job id: written}, the heads claimed, in (priority, id) order). `alone`:
        nothing else runs in `conn`'s transaction (see _call_raw)."""
        if isinstance(groups, str):
            raise TypeError("hand_off takes a sequence of groups, not one group's name")
        rows = self._call_raw(
            conn, HAND_OFF, _results_json(results), None if groups is None else json.dumps(list(groups)),
            queue, pid, min_priority, max_priority, waiting_ms, worker_id, now, alone=alone,
        )  # fmt: skip
        written = {int(r["id"]): bool(r["finished"]) for r in rows if r["finished"] is not None}
        heads = sorted((r for r in rows if r["finished"] is None), key=lambda r: (r["priority"], r["id"]))
        return written, [_claimed(r) for r in heads]

    def finish_batch(
        self, conn: Connection, results: Sequence[JobResult], now: dt.datetime | None = None
    ) -> dict[int, bool]:
        """Write many results at once (clones included); {job id: written} (False: taken over)."""
        if not results:
            return {}
        rows = self._call(conn, FINISH_BATCH, _results_json(results), now)
        return {int(r["id"]): bool(r["finished"]) for r in rows}

    def listener(self) -> Listener | None:
        """A LISTEN connection woken by new jobs (PostgreSQL's insert trigger); None on MySQL
        and behind a transaction pooler without a listen_url (`polls`)."""
        if self.db.dialect.name != "postgres" or self.polls:
            return None
        return Listener(self.db, self.table)

    @property
    def polls(self) -> bool:
        """Whether idle workers poll instead of waiting on LISTEN: behind a transaction pooler
        (PgBouncer) a LISTEN lands on whichever server connection is free, which hands it to
        another client after the statement, so without a direct `listen_url` no wake-up comes."""
        return self.db.pooled and self.db.listen_url is None

    def waker(self) -> Waker | None:
        """What an idle `bgq work` waits on: the LISTEN connection (PostgreSQL; on `listen_url`
        when set), or a Prober of the table's newest id (MySQL, which has no NOTIFY). Each holds
        a connection of its own. None when it `polls`."""
        if self.db.dialect.name == "postgres":
            return None if self.polls else Listener(self.db, self.table)
        return Prober(self.db, self.table)

    def promote_waiting(self, conn: Connection, now: dt.datetime | None = None) -> list[JobRef]:
        rows = self._call(conn, PROMOTE_WAITING, now)
        return [JobRef(r["id"], None, r["queue"], r["priority"]) for r in rows]

    def requeue(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> JobRef:
        rows = self._call(conn, REQUEUE, job_id, reason, now)
        if not rows:  # deleted between the procedure's two reads
            raise JobNotFoundError("no such job")
        row = rows[0]
        return JobRef(row["id"], row["previous_state"], row["queue"], row["priority"])

    def run_now(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> JobRef:
        """Clear a not-started job's postponement (READY or TEMPORARILY_FAILED): due at once."""
        rows = self._call(conn, RUN_NOW, job_id, reason, now)
        if not rows:  # deleted between the procedure's two reads
            raise JobNotFoundError("no such job")
        row = rows[0]
        return JobRef(row["id"], row["previous_state"], row["queue"], row["priority"])

    def reap(
        self, conn: Connection, queue: str, timeout_s: int, limit: int, now: dt.datetime | None = None,
        *, backoff_ms: int | None = None,
    ) -> list[Reaped]:  # fmt: skip
        """Reap stalled jobs; each waits `backoff_ms` (None: the retry backoff by attempts)."""
        rows = self._call(conn, REAP, queue, timeout_s, limit, backoff_ms, now)
        return _reaped(rows)

    def broker_failed(
        self, conn: Connection, job_id: int, error: str, now: dt.datetime | None = None
    ) -> bool:
        """Mark a job the broker refused BROKER_FAILED; False when it no longer waited for its message."""
        (row,) = self._call(conn, BROKER_FAILED, job_id, error, now)
        return bool(row["changed"])

    def back_to_broker(
        self, conn: Connection, queue: str, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        """Move the queue's BACK_TO_BROKER jobs to READY; the caller publishes the returned ones."""
        rows = self._call(conn, BACK_TO_BROKER, queue, limit, now)
        return [JobRef(r["id"], None, r["queue"], r["priority"]) for r in rows]

    def lost_messages(
        self, conn: Connection, queue: str, timeout_s: int, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        """The lost-message pass: READY/TEMPORARILY_FAILED jobs to re-publish (their state unchanged)."""
        rows = self._call(conn, LOST_MESSAGES, queue, timeout_s, limit, now)
        return [JobRef(r["id"], r["state"], r["queue"], r["priority"]) for r in rows]

    # --- reads (stored procedures too, so a DBA sees the same answers) ---

    def predecessor(self, conn: Connection, job_id: int) -> int | None:
        (row,) = self._call(conn, PREDECESSOR, job_id)
        found: int | None = row["result"] if "result" in row else next(iter(row.values()))
        return found

    def group_heads(self, conn: Connection) -> list[GroupHead]:
        # Thousands of rows: tuples straight from the driver, not one dict per row.
        rows = conn.exec_driver_sql(self.db.dialect.call_sql(self.table, GROUP_HEADS)).all()
        return [GroupHead(group, head, priority) for group, head, priority in rows]

    def due_jobs(
        self, conn: Connection, queue: str, broker_mode: bool, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        rows = self._call(conn, DUE_JOBS, queue, int(broker_mode), limit, now)
        return [JobRef(r["id"], r["state"], r["queue"], r["priority"]) for r in rows]

    # --- plain statements ---

    def insert(self, conn: Connection, job: NewJob) -> int:
        """Insert one READY job (created_at = updated_at = the clock) in `conn`'s transaction and
        return its id (the outbox: the application's own transaction)."""
        sql, values = self._insert_statement(job)
        if self._returning:
            new_id: int = conn.exec_driver_sql(sql, values).scalar_one()
            return new_id
        return int(conn.exec_driver_sql(sql, values).lastrowid)

    def insert_alone(self, job: NewJob) -> int:
        """`insert` in a transaction of its own, in one round trip (Database.execute_alone)."""
        sql, values = self._insert_statement(job)
        rows, lastrowid = self.db.execute_alone(sql, values)
        return int(rows[0][0] if self._returning else lastrowid)  # type: ignore[arg-type]

    async def insert_async(self, aconn: AsyncPostgres, job: NewJob) -> int:
        """`insert` on an asyncio connection (PostgreSQL: publish_async), in its own transaction."""
        sql, values = self._insert_statement(job)
        return int(await aconn.fetch_value(sql, values))

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
        MySQL 8 (no RETURNING): InnoDB gives one INSERT ... VALUES consecutive ids (stepping by
        auto_increment_increment) under innodb_autoinc_lock_mode 0 or 1; under 2 (interleaved)
        they need not be consecutive, so each row is inserted on its own.
        """
        if not jobs:
            return []
        if self._returning:
            unnest, arrays = self.insert_many_statement(jobs)
            return sorted(r[0] for r in conn.exec_driver_sql(unnest, arrays).all())
        from .db.mysql import inline

        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            if self.returns_many:
                cursor.execute(inline(cursor.connection, *self.insert_many_statement(jobs)))
                return sorted(int(r[0]) for r in cursor.fetchall())
            cursor.execute("SELECT @@innodb_autoinc_lock_mode, @@auto_increment_increment")
            mode, step = cursor.fetchall()[0]
            if int(mode) == 2:
                return [self.insert(conn, job) for job in jobs]
            cursor.execute(inline(cursor.connection, *self._values_statement(jobs, "")))
            first = int(cursor.lastrowid)
        finally:
            cursor.close()
        return [first + i * int(step) for i in range(len(jobs))]

    @functools.cached_property
    def returns_many(self) -> bool:
        """Whether the bulk INSERT returns its ids (insert_many_statement, send_insert_many):
        PostgreSQL and MariaDB 10.5+ do (RETURNING); MySQL 8 does not."""
        if self._returning:
            return True
        dialect = self.db.engine.dialect
        if dialect.server_version_info is None:  # learnt on the engine's first connection
            with self.db.engine.connect():
                pass
        return bool(dialect.insert_returning)

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
        rows = [
            (
                j.queue,
                j.priority,
                j.callback_name,
                None if j.parameters is None else "\\x" + j.parameters.hex(),  # bytea's hex input
                j.parameters_json,
                j.serial_group,
                j.coalesce_threshold,
                j.identifier,
                j.mode,
                j.postponed_by,
                int(j.processed_by_broker),
            )
            for j in jobs
        ]
        arrays = tuple(
            _pg_array(list(column), text)
            for column, text in zip(zip(*rows, strict=True), _TEXT_ARRAYS, strict=True)
        )
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
        row = "(" + ", ".join(["%s"] * len(_INSERT_COLUMNS)) + f", {now}, {now})"
        sql = (
            f"INSERT INTO {self.table} ({', '.join(_INSERT_COLUMNS)}, created_at, updated_at) VALUES "
            + ", ".join([row] * len(jobs))
            + returning
        )
        return sql, tuple([v for job in jobs for v in _insert_values(job) + clocked])

    def get_job(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        """The job's row as a dict (for people and tests), or None."""
        row = conn.exec_driver_sql(f"SELECT * FROM {self.table} WHERE id = %s", (job_id,)).mappings().first()
        return dict(row) if row is not None else None

    def installed(self, conn: Connection) -> dict[str, str]:
        """The {table}_meta rows (version, checksum), or {} when bgq is not installed."""
        rows = conn.exec_driver_sql(f"SELECT name, value FROM {self.table}_meta").all()
        return {name: value for name, value in rows}

    def routines(self, conn: Connection) -> dict[str, list[InstalledRoutine]]:
        """bgq's routines installed for this table, by procedure name (without the table prefix);
        more than one per name are PostgreSQL overloads. Missing ones are absent."""
        prefix = f"{self.table}_".lower()
        names = [prefix + p.name for p in (*ALL_PROCS, *INTERNAL_PROCS)]
        out: dict[str, list[InstalledRoutine]] = {}
        for routine in self.db.dialect.routines(conn, names):
            out.setdefault(routine.name[len(prefix) :], []).append(routine)
        return out

    def record_install(self, conn: Connection, values: dict[str, str]) -> None:
        """Replace every {table}_meta row by `values`."""
        conn.exec_driver_sql(f"DELETE FROM {self.table}_meta")
        self.add_meta(conn, values)

    def add_meta(self, conn: Connection, values: dict[str, str]) -> None:
        """Add {table}_meta rows (names not there yet)."""
        for name, value in sorted(values.items()):
            conn.exec_driver_sql(
                f"INSERT INTO {self.table}_meta (name, value) VALUES (%s, %s)", (name, value)
            )

    def run(self, conn: Connection, statements: Sequence[str]) -> None:
        """Run DDL statements verbatim (install-procs only): no parameter markers, so '%' stays '%'."""
        cursor = conn.connection.cursor()
        try:
            for statement in statements:
                cursor.execute(statement)
        finally:
            cursor.close()

    def heartbeat(
        self, conn: Connection, job_id: int, attempt: int, now: dt.datetime | None = None,
        *, metadata_json: str | None = None,
    ) -> bool:  # fmt: skip
        """Refresh a running job's updated_at (and metadata, if given); False when the claim
        `attempt` no longer owns the job."""
        return self.beat(conn, job_id, attempt, now, metadata_json=metadata_json).alive

    def beat(
        self, conn: Connection, job_id: int, attempt: int, now: dt.datetime | None = None,
        *, metadata_json: str | None = None,
    ) -> Beat:  # fmt: skip
        """The heartbeat with its whole answer: alive, and whether a cancel asked the job to stop."""
        (row,) = self._call(conn, HEARTBEAT, job_id, attempt, metadata_json, now)
        return Beat(bool(row["alive"]), bool(row["abort_requested"]), row["reason"])

    # --- control: pause, resume, cancel (migration 0004_control) ---

    def pause(
        self, conn: Connection, kind: str, name: str, reason: str | None, by: str | None,
        now: dt.datetime | None = None,
    ) -> bool:  # fmt: skip
        """Pause a queue or a group; False when it was paused already (reason and by replaced)."""
        (row,) = self._call(conn, PAUSE, kind, name, reason, by, now)
        return bool(row["paused"])

    def resume(self, conn: Connection, kind: str, name: str) -> bool:
        """Resume a queue or a group; False when it was not paused."""
        (row,) = self._call(conn, RESUME, kind, name)
        return bool(row["resumed"])

    def pauses(self, conn: Connection) -> list[Pause]:
        """Every paused queue and group, by kind and name."""
        return [
            Pause(r["kind"], r["name"], r["reason"], r["paused_by"], _utc(r["paused_at"]))
            for r in self._call(conn, PAUSES)
        ]

    def cancel(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> Cancelled:
        """Cancel a job: REDUNDANT if it has not started, else its abort is requested."""
        rows = self._call(conn, CANCEL, job_id, reason, now)
        if not rows:  # deleted between the procedure's reads
            raise JobNotFoundError("no such job")
        r = rows[0]
        return Cancelled(r["outcome"], int(r["state"]), r["promoted_id"], r["queue"], int(r["priority"]))

    # --- schedules (bgq/schedules.py) ---

    def schedule_upsert(
        self, conn: Connection, name: str, cron: str, timezone: str, callback: str,
        parameters_json: str | None, queue: str, group: str | None, priority: int, missed: str,
        next_at: dt.datetime, now: dt.datetime | None = None,
    ) -> dt.datetime | None:  # fmt: skip
        """Declare a schedule active; its stored next fire time."""
        (row,) = self._call(
            conn, SCHEDULE_UPSERT, name, cron, timezone, callback, parameters_json, queue, group,
            priority, missed, _utc(next_at), _utc_or_none(now),
        )  # fmt: skip
        return _utc_or_none(row["next_fire_at"])

    def schedule_retire(
        self, conn: Connection, queue: str, names: Sequence[str], now: dt.datetime | None = None
    ) -> int:
        """Deactivate the queue's schedules not in `names`; how many."""
        (row,) = self._call(conn, SCHEDULE_RETIRE, queue, json.dumps(list(names)), _utc_or_none(now))
        return int(row["retired"])

    def schedules(
        self, conn: Connection, queue: str | None, due_only: bool, now: dt.datetime | None = None
    ) -> list[ScheduleRow]:
        """The schedules of `queue` (None: all); with `due_only` the active ones due at `now`."""
        rows = self._call(conn, SCHEDULES, queue, int(due_only), _utc_or_none(now))
        out = []
        for r in rows:
            params = r["parameters_json"]
            out.append(
                ScheduleRow(
                    name=r["name"],
                    cron=r["cron"],
                    timezone=r["timezone"],
                    callback_name=r["callback_name"],
                    parameters_json=json.loads(params) if isinstance(params, str | bytes) else params,
                    queue=r["queue"],
                    serial_group=r["serial_group"],
                    priority=int(r["priority"]),
                    missed=r["missed"],
                    active=bool(r["active"]),
                    next_fire_at=_utc_or_none(r["next_fire_at"]),
                    last_fire_at=_utc_or_none(r["last_fire_at"]),
                    last_job_id=r["last_job_id"],
                    last_job_state=r["last_job_state"],
                    now=_utc(r["now"]),
                )  # fmt: skip
            )
        return out

    def fire(
        self, conn: Connection, name: str, fire_at: dt.datetime | None, next_at: dt.datetime,
        now: dt.datetime | None = None,
    ) -> JobRef | None:  # fmt: skip
        """Publish the schedule's job for `fire_at` unless that fire time was published already
        (None then); move next_fire_at forward to `next_at` either way."""
        (row,) = self._call(conn, FIRE, name, _utc_or_none(fire_at), _utc(next_at), _utc_or_none(now))
        if not row["fired"]:
            return None
        return JobRef(int(row["job_id"]), None, row["queue"], int(row["priority"]))

    # --- operations: unfinished identifiers, the monitor, clear-finished ---

    def unfinished_identifiers(
        self, conn: Connection, queue: str, identifiers_json: str | None, exclude_processing: bool
    ) -> list[str]:
        """Distinct identifiers of the queue's unfinished jobs, among a JSON array (None or '[]': all)."""
        rows = self._call(conn, UNFINISHED_IDENTIFIERS, queue, identifiers_json, int(exclude_processing))
        return [r["identifier"] for r in rows]

    def monitor(
        self, conn: Connection, queue: str, long_s: int, now: dt.datetime | None = None
    ) -> list[StuckJobs]:
        """Stuck jobs: TEMPORARILY_FAILED, PERMANENTLY_FAILED, PROCESSING > long_s, in that order."""
        rows = self._call(conn, MONITOR, queue, long_s, now)
        return [
            StuckJobs(
                state=int(r["state"]),
                job_count=int(r["job_count"]),
                oldest_since=None if r["oldest_since"] is None else _utc(r["oldest_since"]),
            )
            for r in rows
        ]

    def clear_finished(
        self, conn: Connection, queue: str, before: dt.datetime | None, now: dt.datetime | None = None
    ) -> int:
        """Delete the queue's FINISHED jobs (created_at <= before, if given); the number deleted."""
        (row,) = self._call(conn, CLEAR_FINISHED, queue, before, now)
        return int(row["deleted"])

    # --- workers (bgq/workers.py) and the metrics' table read (bgq/metrics.py) ---

    def worker_register(
        self, conn: Connection, host: str, pid: int, mode: str, queue: str, version: str,
        now: dt.datetime | None = None,
    ) -> int:  # fmt: skip
        """Register a worker process; its id."""
        (row,) = self._call(conn, WORKER_REGISTER, host, pid, mode, queue, version, now)
        return int(row["id"])

    def worker_heartbeat(
        self, conn: Connection, worker_id: int, current_job_id: int | None, jobs_done: int,
        now: dt.datetime | None = None,
    ) -> bool:  # fmt: skip
        """Refresh the worker's row; False when it no longer exists (reaped as dead)."""
        (row,) = self._call(conn, WORKER_HEARTBEAT, worker_id, current_job_id, jobs_done, now)
        return bool(row["alive"])

    def worker_deregister(self, conn: Connection, worker_id: int) -> bool:
        """Remove the worker's row at its clean exit; False when it was gone already."""
        (row,) = self._call(conn, WORKER_DEREGISTER, worker_id)
        return bool(row["removed"])

    def worker_reap(
        self, conn: Connection, queue: str, dead_after_s: int, limit: int, now: dt.datetime | None = None,
        *, backoff_ms: int | None = None,
    ) -> list[Reaped]:  # fmt: skip
        """Reap the PROCESSING jobs of workers silent for `dead_after_s`, then remove those workers."""
        rows = self._call(conn, WORKER_REAP, queue, dead_after_s, limit, backoff_ms, now)
        return _reaped(rows)

    def workers(self, conn: Connection, queue: str) -> list[WorkerRow]:
        """The registered workers of the queue and its sub-queues, in id order."""
        rows = conn.exec_driver_sql(
            f"SELECT id, host, pid, mode, queue, started_at, last_heartbeat_at, current_job_id, jobs_done,"
            f" version FROM {self.table}_worker WHERE {_IN_QUEUE} ORDER BY id",
            (queue, _sub_queues(queue)),
        ).mappings()
        return [
            WorkerRow(
                **{
                    **r,
                    "started_at": _utc(r["started_at"]),
                    "last_heartbeat_at": _utc(r["last_heartbeat_at"]),
                }
            )
            for r in rows
        ]

    def table_stats(self, conn: Connection, queue: str) -> TableStats:
        """What the metrics read at scrape time, in one transaction: jobs per (queue, state) with the
        oldest created_at, serial groups held up behind a failed job (TEMPORARILY_FAILED or
        BROKER_FAILED, with jobs of the group waiting: -1, 1, 6), workers per mode, and the server's
        clock. A full pass over the queue's jobs: scrape every 15 s or slower on a large table."""
        args = (queue, _sub_queues(queue))
        jobs = conn.exec_driver_sql(
            f"SELECT queue, state, COUNT(*) AS job_count, MIN(created_at) AS oldest FROM {self.table}"
            f" WHERE {_IN_QUEUE} GROUP BY queue, state",
            args,
        ).all()
        blocked = conn.exec_driver_sql(
            f"SELECT f.queue, COUNT(DISTINCT f.serial_group) FROM {self.table} f"
            f" WHERE {_IN_QUEUE.replace('queue', 'f.queue')} AND f.state IN (4, 8)"
            " AND f.serial_group IS NOT NULL AND EXISTS (SELECT 1 FROM"
            f" {self.table} w WHERE w.serial_group = f.serial_group AND w.state IN (-1, 1, 6))"
            " GROUP BY f.queue",
            args,
        ).all()
        workers = conn.exec_driver_sql(
            f"SELECT mode, COUNT(*) FROM {self.table}_worker WHERE {_IN_QUEUE} GROUP BY mode", args
        ).all()
        now = conn.exec_driver_sql(f"SELECT {self.db.dialect.now_sql()}").scalar_one()
        return TableStats(
            now=_utc(now),
            jobs=[(q, int(st), int(n), _utc(oldest)) for q, st, n, oldest in jobs],
            groups_blocked={q: int(n) for q, n in blocked},
            workers={m: int(n) for m, n in workers},
        )

    def job_wait_seconds(self, conn: Connection, job_id: int) -> float | None:
        """A job's first claim (last_attempt_at) minus its due time (created_at + postponed_by), in
        seconds; None after the first attempt (a retry's due time is gone once it is claimed)."""
        row = conn.exec_driver_sql(
            f"SELECT created_at, last_attempt_at, postponed_by, number_of_attempts FROM {self.table}"
            " WHERE id = %s",
            (job_id,),
        ).first()
        if row is None or row[1] is None or row[3] != 1:
            return None
        due = _utc(row[0]) + dt.timedelta(milliseconds=row[2] or 0)
        return max(0.0, (_utc(row[1]) - due).total_seconds())


#: The queue filter of the plain reads: the queue or one of its sub-queues (as in_queue() of the
#: SQL rules; a LIKE pattern whose wildcards are escaped).
_IN_QUEUE = "(queue = %s OR queue LIKE %s)"


def _sub_queues(queue: str) -> str:
    escaped = queue.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "\\_%"


def _results_json(results: Sequence[JobResult]) -> str | None:
    """Results as {table}_finish_results reads them (None: no results)."""
    if not results:
        return None
    # The fields by name (dataclasses.asdict deep-copies every value: slower, the same JSON).
    return json.dumps([{f: getattr(r, f) for f in _RESULT_FIELDS} for r in results])


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(JobResult))
_PG_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction begun on the connection


def _claimed(row: dict[str, Any]) -> Claimed:
    """A claimed job's row of claim_batch or hand_off."""
    return Claimed(
        row["id"],
        ClaimResult(
            outcome="claimed",
            attempt=row["attempt"],
            state=2,
            predecessor_id=None,
            promoted_id=None,
            callback_name=row["callback_name"],
            parameters_json=row["parameters_json"],
            parameters=row["parameters"],
            queue=row["queue"],
            priority=row["priority"],
            serial_group=row["serial_group"],
            identifier=row["identifier"],
            mode=row["mode"],
            coalesce_threshold=row["coalesce_threshold"],
        ),
    )


def _insert_sql(table: str, now: str, returning: bool) -> str:
    """The one-row INSERT: a %s per column, then created_at and updated_at (`now` twice)."""
    columns = ", ".join(_INSERT_COLUMNS)
    marks = ", ".join(["%s"] * len(_INSERT_COLUMNS))
    sql = f"INSERT INTO {table} ({columns}, created_at, updated_at) VALUES ({marks}, {now}, {now})"
    return sql + " RETURNING id" if returning else sql


def _insert_many_sql(table: str, now: str) -> str:
    """PostgreSQL's bulk INSERT: one array per column that varies, unnested in order (insert_many)."""
    return (
        f"INSERT INTO {table} ({', '.join(_INSERT_COLUMNS)}, created_at, updated_at)"
        f" SELECT q, p, c, pk, pj::json, 1, 0, g, t, i, m, pb, b, {now}, {now}"
        " FROM unnest(%s::varchar[], %s::integer[], %s::varchar[], %s::bytea[], %s::text[],"
        " %s::varchar[], %s::bigint[], %s::varchar[], %s::varchar[], %s::integer[], %s::smallint[])"
        " WITH ORDINALITY AS j(q, p, c, pk, pj, g, t, i, m, pb, b, n) ORDER BY n RETURNING id"
    )


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_CONTROL = re.compile(r"[\x00-\x1f]")


#: Which of insert_many_statement's arrays hold text (the others: integers).
_TEXT_ARRAYS = (True, False, True, True, True, True, False, True, True, False, False)


def _pg_array(column: list[Any], text: bool) -> str:
    """A column of str or int (`text` says which) and None as PostgreSQL array input, written by
    the C JSON encoder (psycopg dumps a list element by element, ~15 times slower): a JSON
    string's quoting ("..." escaping only \\ and \") is the array input's, null is NULL, and
    only the outer brackets differ. JSON writes a control character as \\n or \\u00XX, which
    array input would read differently: a column holding one is quoted here, element by element
    (inside double quotes array input takes every character but \\ and \" as it is)."""
    if text and _CONTROL.search("".join(filter(None, column))):
        return "{" + ",".join("NULL" if v is None else _quoted(v) for v in column) + "}"
    return "{" + _JSON.encode(column)[1:-1] + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _insert_values(job: NewJob) -> tuple[Any, ...]:
    """A new job's values in the order of _INSERT_COLUMNS (state READY, no attempts yet)."""
    return (
        job.queue, job.priority, job.callback_name, job.parameters, job.parameters_json, 1, 0,
        job.serial_group, job.coalesce_threshold, job.identifier, job.mode, job.postponed_by,
        int(job.processed_by_broker),
    )  # fmt: skip


def _utc(value: dt.datetime) -> dt.datetime:
    """pymysql returns naive UTC datetimes, psycopg aware ones: make both aware UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _reaped(rows: list[dict[str, Any]]) -> list[Reaped]:
    """The rows of {table}_reap or {table}_worker_reap as Reaped, with aware times and states."""
    return [
        Reaped(**{**r, "stalled_since": _utc(r["stalled_since"]), "state": JobState(r["state"])})
        for r in rows
    ]


def _utc_or_none(value: dt.datetime | None) -> dt.datetime | None:
    """_utc, keeping None. An aware argument goes in as UTC (pymysql drops the zone of what it
    sends, so a time in another zone would be read as UTC by MySQL)."""
    return None if value is None else _utc(value)


class Waker(Protocol):
    """A wait that ends early when jobs are published (Procs.waker)."""

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

    def __init__(self, db: Database, table: str, every: float = PROBE_SECONDS) -> None:
        raw = db.engine.raw_connection()
        driver = raw.driver_connection
        assert driver is not None  # a fresh raw connection holds its driver connection
        raw.detach()  # this connection never goes back to the pool
        self._conn: Any = driver
        self._sql = f"SELECT MAX(id) FROM {table}"
        self._every = every
        try:
            self._conn.rollback()
            self._conn.autocommit(True)
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
