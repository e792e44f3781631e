"""bgq's calls on one table: typed calls of the stored procedures, the publish INSERTs and the plain reads.

The procedures' signatures are in bgq/sql/signatures.py, the dialects' SQL plumbing in bgq/db/mysql.py
and bgq/db/postgres.py, the idle worker's wake-ups in bgq/sql/wakeups.py. Every statement goes
through the call seam of bgq/db (Database.call, rows, ...), which translates driver errors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from ..config import read_clock
from ..db import Database, InstalledRoutine, Proc
from ..errors import JobNotFoundError
from ..model import (
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
from . import signatures as sig
from .inserts import Inserts
from .signatures import ALL_PROCS, INTERNAL_PROCS
from .wakeups import Listener, Prober, Waker

__all__ = ["ALL_PROCS", "INTERNAL_PROCS", "Listener", "Procs", "Prober", "Waker"]


class Procs:
    """bgq's calls on one table. Each method runs in the transaction of the connection it is given."""

    def __init__(self, db: Database, table: str, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.db = db
        self.table = table
        self.clock = clock  # the option `clock`: when set, every p_now left None is its time
        self.inserts = Inserts(db, table, clock)

    def _clocked(self, proc: Proc, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """`args` with the configured clock's time in a p_now left None (no clock: as given)."""
        if self.clock is not None:
            at = next((i for i, (name, _) in enumerate(proc.params) if name == "p_now"), None)
            if at is not None and at < len(args) and args[at] is None:
                return (*args[:at], read_clock(self.clock), *args[at + 1 :])
        return args

    def _call(
        self, conn: Connection, proc: Proc, *args: Any, fast: bool = False, alone: bool = False
    ) -> list[dict[str, Any]]:
        """Call `proc` through the seam (Database.call; `fast` and `alone`: see there)."""
        return self.db.call(conn, self.table, proc, self._clocked(proc, args), fast=fast, alone=alone)

    # --- state changes (stored procedures) ---

    def claim(
        self, conn: Connection, job_id: int, queue: str, pid: int, waiting_ms: int,
        metadata_json: str | None, now: dt.datetime | None = None, *, worker_id: int | None = None,
    ) -> ClaimResult:  # fmt: skip
        (row,) = self._call(conn, sig.CLAIM, job_id, queue, pid, waiting_ms, metadata_json, worker_id, now)
        return ClaimResult(**row)

    def finish(
        self, conn: Connection, job_id: int, attempt: int, state: int, error: str | None,
        postponed_by: int | None, execution_time: int | None, memory_json: str | None,
        now: dt.datetime | None = None, *, clone_delay_ms: int | None = None,
    ) -> FinishResult:  # fmt: skip
        (row,) = self._call(
            conn, sig.FINISH, job_id, attempt, state, error, postponed_by, execution_time, memory_json,
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
        ids = json.dumps(list(job_ids))
        rows = self._call(conn, sig.CLAIM_IDS, ids, queue, pid, waiting_ms, worker_id, now)
        return [(int(row.pop("id")), ClaimResult(**row)) for row in rows]

    def claim_batch(
        self, conn: Connection, queue: str, limit: int, pid: int, min_priority: int | None,
        max_priority: int | None, waiting_ms: int, now: dt.datetime | None = None,
        *, max_heads: int | None = None, worker_id: int | None = None, alone: bool = False,
    ) -> list[Claimed]:  # fmt: skip
        """Claim up to `limit` due jobs (ungrouped, or heads of idle groups, at most `max_heads`
        of them), in (priority, id) order. `alone`: nothing else runs in `conn`'s transaction
        (see Database.call)."""
        rows = self._call(
            conn, sig.CLAIM_BATCH, queue, limit, pid, min_priority, max_priority, max_heads, waiting_ms,
            worker_id, now, fast=True, alone=alone,
        )  # fmt: skip
        return [_claimed(r) for r in rows]

    def hand_off(
        self, conn: Connection, results: Sequence[JobResult], groups: Sequence[str] | None, queue: str,
        pid: int, min_priority: int | None, max_priority: int | None, waiting_ms: int,
        now: dt.datetime | None = None, *, worker_id: int | None = None, alone: bool = False,
    ) -> tuple[dict[int, bool], list[Claimed]]:  # fmt: skip
        """Write `results` (as finish_batch), then claim the next head of each of `groups`, in
        one call: ({job id: written}, the heads claimed, in (priority, id) order). `alone`:
        nothing else runs in `conn`'s transaction (see Database.call)."""
        if isinstance(groups, str):
            raise TypeError("hand_off takes a sequence of groups, not one group's name")
        rows = self._call(
            conn, sig.HAND_OFF, _results_json(results), None if groups is None else json.dumps(list(groups)),
            queue, pid, min_priority, max_priority, waiting_ms, worker_id, now, fast=True, alone=alone,
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
        rows = self._call(conn, sig.FINISH_BATCH, _results_json(results), now)
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
        """What an idle `bgq work` waits on (bgq/sql/wakeups.py): the LISTEN connection (PostgreSQL;
        on `listen_url` when set), or a Prober of the table's newest id (MySQL, which has no
        NOTIFY). Each holds a connection of its own. None when it `polls`."""
        if self.db.dialect.name == "postgres":
            return None if self.polls else Listener(self.db, self.table)
        return Prober(self.db, f"SELECT MAX(id) FROM {self.table}")

    def promote_waiting(self, conn: Connection, now: dt.datetime | None = None) -> list[JobRef]:
        rows = self._call(conn, sig.PROMOTE_WAITING, now)
        return [JobRef(r["id"], None, r["queue"], r["priority"]) for r in rows]

    def requeue(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> JobRef:
        rows = self._call(conn, sig.REQUEUE, job_id, reason, now)
        if not rows:  # deleted between the procedure's two reads
            raise JobNotFoundError("no such job")
        row = rows[0]
        return JobRef(row["id"], row["previous_state"], row["queue"], row["priority"])

    def run_now(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> JobRef:
        """Clear a not-started job's postponement (READY or TEMPORARILY_FAILED): due at once."""
        rows = self._call(conn, sig.RUN_NOW, job_id, reason, now)
        if not rows:  # deleted between the procedure's two reads
            raise JobNotFoundError("no such job")
        row = rows[0]
        return JobRef(row["id"], row["previous_state"], row["queue"], row["priority"])

    def reap(
        self, conn: Connection, queue: str, timeout_s: int, limit: int, now: dt.datetime | None = None,
        *, backoff_ms: int | None = None,
    ) -> list[Reaped]:  # fmt: skip
        """Reap stalled jobs; each waits `backoff_ms` (None: the retry backoff by attempts)."""
        rows = self._call(conn, sig.REAP, queue, timeout_s, limit, backoff_ms, now)
        return _reaped(rows)

    def broker_failed(
        self, conn: Connection, job_id: int, error: str, now: dt.datetime | None = None
    ) -> bool:
        """Mark a job the broker refused BROKER_FAILED; False when it no longer waited for its message."""
        (row,) = self._call(conn, sig.BROKER_FAILED, job_id, error, now)
        return bool(row["changed"])

    def back_to_broker(
        self, conn: Connection, queue: str, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        """Move the queue's BACK_TO_BROKER jobs to READY; the caller publishes the returned ones."""
        rows = self._call(conn, sig.BACK_TO_BROKER, queue, limit, now)
        return [JobRef(r["id"], None, r["queue"], r["priority"]) for r in rows]

    def lost_messages(
        self, conn: Connection, queue: str, timeout_s: int, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        """The lost-message pass: READY/TEMPORARILY_FAILED jobs to re-publish (their state unchanged)."""
        rows = self._call(conn, sig.LOST_MESSAGES, queue, timeout_s, limit, now)
        return [JobRef(r["id"], r["state"], r["queue"], r["priority"]) for r in rows]

    # --- reads (stored procedures too, so a DBA sees the same answers) ---

    def predecessor(self, conn: Connection, job_id: int) -> int | None:
        (row,) = self._call(conn, sig.PREDECESSOR, job_id)
        found: int | None = row["result"] if "result" in row else next(iter(row.values()))
        return found

    def group_heads(self, conn: Connection) -> list[GroupHead]:
        # Thousands of rows: tuples straight from the driver, not one dict per row.
        rows = self.db.tuples(conn, self.db.dialect.call_sql(self.table, sig.GROUP_HEADS))
        return [GroupHead(group, head, priority) for group, head, priority in rows]

    def due_jobs(
        self, conn: Connection, queue: str, broker_mode: bool, limit: int, now: dt.datetime | None = None
    ) -> list[JobRef]:
        rows = self._call(conn, sig.DUE_JOBS, queue, int(broker_mode), limit, now)
        return [JobRef(r["id"], r["state"], r["queue"], r["priority"]) for r in rows]

    # --- plain statements ---

    # The publish INSERTs (bgq/sql/inserts.py), here so that a monkeypatch of Procs sees them too.

    def insert(self, conn: Connection, job: NewJob) -> int:
        return self.inserts.insert(conn, job)

    def insert_alone(self, job: NewJob) -> int:
        return self.inserts.insert_alone(job)

    async def insert_async(self, job: NewJob) -> int:
        return await self.inserts.insert_async(job)

    def insert_many(self, conn: Connection, jobs: Sequence[NewJob]) -> list[int]:
        return self.inserts.insert_many(conn, jobs)

    @property
    def sends_many(self) -> bool:
        return self.inserts.sends_many

    def send_insert_many(self, statement: tuple[str, tuple[Any, ...]]) -> Callable[[], list[int]]:
        return self.inserts.send_insert_many(statement)

    def insert_many_statement(self, jobs: Sequence[NewJob]) -> tuple[str, tuple[Any, ...]]:
        return self.inserts.insert_many_statement(jobs)

    def get_job(self, conn: Connection, job_id: int) -> dict[str, Any] | None:
        """The job's row as a dict (for people and tests), or None."""
        rows = self.db.rows(conn, f"SELECT * FROM {self.table} WHERE id = %s", (job_id,))
        return rows[0] if rows else None

    def installed(self, conn: Connection) -> dict[str, str]:
        """The {table}_meta rows (version, checksum), or {} when bgq is not installed."""
        return dict(self.db.tuples(conn, f"SELECT name, value FROM {self.table}_meta"))

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
        self.db.execute(conn, f"DELETE FROM {self.table}_meta")
        self.add_meta(conn, values)

    def add_meta(self, conn: Connection, values: dict[str, str]) -> None:
        """Add {table}_meta rows (names not there yet)."""
        for name, value in sorted(values.items()):
            sql = f"INSERT INTO {self.table}_meta (name, value) VALUES (%s, %s)"
            self.db.execute(conn, sql, (name, value))

    def run(self, conn: Connection, statements: Sequence[str]) -> None:
        """Run DDL statements verbatim (install-procs only): no parameter markers, so '%' stays '%'."""
        self.db.execute_verbatim(conn, statements)

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
        (row,) = self._call(conn, sig.HEARTBEAT, job_id, attempt, metadata_json, now)
        return Beat(bool(row["alive"]), bool(row["abort_requested"]), row["reason"])

    # --- control: pause, resume, cancel (migration 0004_control) ---

    def pause(
        self, conn: Connection, kind: str, name: str, reason: str | None, by: str | None,
        now: dt.datetime | None = None,
    ) -> bool:  # fmt: skip
        """Pause a queue or a group; False when it was paused already (reason and by replaced)."""
        (row,) = self._call(conn, sig.PAUSE, kind, name, reason, by, now)
        return bool(row["paused"])

    def resume(self, conn: Connection, kind: str, name: str) -> bool:
        """Resume a queue or a group; False when it was not paused."""
        (row,) = self._call(conn, sig.RESUME, kind, name)
        return bool(row["resumed"])

    def pauses(self, conn: Connection) -> list[Pause]:
        """Every paused queue and group, by kind and name."""
        return [
            Pause(r["kind"], r["name"], r["reason"], r["paused_by"], _utc(r["paused_at"]))
            for r in self._call(conn, sig.PAUSES)
        ]

    def cancel(self, conn: Connection, job_id: int, reason: str, now: dt.datetime | None = None) -> Cancelled:
        """Cancel a job: REDUNDANT if it has not started, else its abort is requested."""
        rows = self._call(conn, sig.CANCEL, job_id, reason, now)
        if not rows:  # deleted between the procedure's reads
            raise JobNotFoundError("no such job")
        r = rows[0]
        return Cancelled(r["outcome"], int(r["state"]), r["promoted_id"], r["queue"], int(r["priority"]))

    # --- schedules (bgq/jobs/schedules.py) ---

    def schedule_upsert(
        self, conn: Connection, name: str, cron: str, timezone: str, callback: str,
        parameters_json: str | None, queue: str, group: str | None, priority: int, missed: str,
        next_at: dt.datetime, now: dt.datetime | None = None,
    ) -> dt.datetime | None:  # fmt: skip
        """Declare a schedule active; its stored next fire time."""
        (row,) = self._call(
            conn, sig.SCHEDULE_UPSERT, name, cron, timezone, callback, parameters_json, queue, group,
            priority, missed, _utc(next_at), _utc_or_none(now),
        )  # fmt: skip
        return _utc_or_none(row["next_fire_at"])

    def schedule_retire(
        self, conn: Connection, queue: str, names: Sequence[str], now: dt.datetime | None = None
    ) -> int:
        """Deactivate the queue's schedules not in `names`; how many."""
        (row,) = self._call(conn, sig.SCHEDULE_RETIRE, queue, json.dumps(list(names)), _utc_or_none(now))
        return int(row["retired"])

    def schedules(
        self, conn: Connection, queue: str | None, due_only: bool, now: dt.datetime | None = None
    ) -> list[ScheduleRow]:
        """The schedules of `queue` (None: all); with `due_only` the active ones due at `now`."""
        rows = self._call(conn, sig.SCHEDULES, queue, int(due_only), _utc_or_none(now))
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
        (row,) = self._call(conn, sig.FIRE, name, _utc_or_none(fire_at), _utc(next_at), _utc_or_none(now))
        if not row["fired"]:
            return None
        return JobRef(int(row["job_id"]), None, row["queue"], int(row["priority"]))

    # --- operations: unfinished identifiers, the monitor, clear-finished ---

    def unfinished_identifiers(
        self, conn: Connection, queue: str, identifiers_json: str | None, exclude_processing: bool
    ) -> list[str]:
        """Distinct identifiers of the queue's unfinished jobs, among a JSON array (None or '[]': all)."""
        rows = self._call(conn, sig.UNFINISHED_IDENTIFIERS, queue, identifiers_json, int(exclude_processing))
        return [r["identifier"] for r in rows]

    def monitor(
        self, conn: Connection, queue: str, long_s: int, now: dt.datetime | None = None
    ) -> list[StuckJobs]:
        """Stuck jobs: TEMPORARILY_FAILED, PERMANENTLY_FAILED, PROCESSING > long_s, in that order."""
        rows = self._call(conn, sig.MONITOR, queue, long_s, now)
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
        (row,) = self._call(conn, sig.CLEAR_FINISHED, queue, before, now)
        return int(row["deleted"])

    # --- workers (bgq/modes/registry.py) and the metrics' table read (bgq/metrics.py) ---

    def worker_register(
        self, conn: Connection, host: str, pid: int, mode: str, queue: str, version: str,
        now: dt.datetime | None = None,
    ) -> int:  # fmt: skip
        """Register a worker process; its id."""
        (row,) = self._call(conn, sig.WORKER_REGISTER, host, pid, mode, queue, version, now)
        return int(row["id"])

    def worker_heartbeat(
        self, conn: Connection, worker_id: int, current_job_id: int | None, jobs_done: int,
        now: dt.datetime | None = None,
    ) -> bool:  # fmt: skip
        """Refresh the worker's row; False when it no longer exists (reaped as dead)."""
        (row,) = self._call(conn, sig.WORKER_HEARTBEAT, worker_id, current_job_id, jobs_done, now)
        return bool(row["alive"])

    def worker_deregister(self, conn: Connection, worker_id: int) -> bool:
        """Remove the worker's row at its clean exit; False when it was gone already."""
        (row,) = self._call(conn, sig.WORKER_DEREGISTER, worker_id)
        return bool(row["removed"])

    def worker_reap(
        self, conn: Connection, queue: str, dead_after_s: int, limit: int, now: dt.datetime | None = None,
        *, backoff_ms: int | None = None,
    ) -> list[Reaped]:  # fmt: skip
        """Reap the PROCESSING jobs of workers silent for `dead_after_s`, then remove those workers."""
        rows = self._call(conn, sig.WORKER_REAP, queue, dead_after_s, limit, backoff_ms, now)
        return _reaped(rows)

    def workers(self, conn: Connection, queue: str) -> list[WorkerRow]:
        """The registered workers of the queue and its sub-queues, in id order."""
        rows = self.db.rows(
            conn,
            f"SELECT id, host, pid, mode, queue, started_at, last_heartbeat_at, current_job_id, jobs_done,"
            f" version FROM {self.table}_worker WHERE {_IN_QUEUE} ORDER BY id",
            (queue, _sub_queues(queue)),
        )
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
        jobs = self.db.tuples(
            conn,
            f"SELECT queue, state, COUNT(*) AS job_count, MIN(created_at) AS oldest FROM {self.table}"
            f" WHERE {_IN_QUEUE} GROUP BY queue, state",
            args,
        )
        blocked = self.db.tuples(
            conn,
            f"SELECT f.queue, COUNT(DISTINCT f.serial_group) FROM {self.table} f"
            f" WHERE {_IN_QUEUE.replace('queue', 'f.queue')} AND f.state IN (4, 8)"
            " AND f.serial_group IS NOT NULL AND EXISTS (SELECT 1 FROM"
            f" {self.table} w WHERE w.serial_group = f.serial_group AND w.state IN (-1, 1, 6))"
            " GROUP BY f.queue",
            args,
        )
        workers = self.db.tuples(
            conn, f"SELECT mode, COUNT(*) FROM {self.table}_worker WHERE {_IN_QUEUE} GROUP BY mode", args
        )
        now = self.db.scalar(conn, f"SELECT {self.db.dialect.now_sql()}")
        return TableStats(
            now=_utc(now),
            jobs=[(q, int(st), int(n), _utc(oldest)) for q, st, n, oldest in jobs],
            groups_blocked={q: int(n) for q, n in blocked},
            workers={m: int(n) for m, n in workers},
        )

    def job_wait_seconds(self, conn: Connection, job_id: int) -> float | None:
        """A job's first claim (last_attempt_at) minus its due time (created_at + postponed_by), in
        seconds; None after the first attempt (a retry's due time is gone once it is claimed)."""
        rows = self.db.tuples(
            conn,
            f"SELECT created_at, last_attempt_at, postponed_by, number_of_attempts FROM {self.table}"
            " WHERE id = %s",
            (job_id,),
        )
        row = rows[0] if rows else None
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
