"""The public API: `Queue` publishes jobs and processes them through the stored procedures."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from . import outbox, runner
from . import params as params_codec
from .config import Config, build_config
from .db import Database
from .errors import (
    BgqError,
    DatabaseError,
    PublishError,
    SerializationError,
)
from .heartbeat import Heartbeat
from .install import check_installed, install
from .procs import ClaimResult, JobRef, NewJob, Procs
from .states import JobState, Mode
from .validate import new_job

_MAX_TEXT = 255
_MAX_INT32 = 2**31 - 1
PROCESS_LIMIT = 1000  # jobs per process() run, as in the original
CLAIM_TRIES = 5  # a deadlock or lock-wait timeout in the claim is retried this many times


@dataclass
class ProcessReport:
    """What one `process()` run did."""

    reaped: int = 0
    promoted: int = 0
    republished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


@dataclass
class _Bulk:
    """Jobs published since start_bulk(): those not inserted yet, and the ids of those inserted."""

    jobs: list[NewJob] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


class Queue:
    """A durable job queue on a table of the application's database.

    Options (keyword arguments), as in the original library:
      callbacks                    {name: callable} or {name: {"callback": f, "queue": sub, "priority": p}}
      database_url                 SQLAlchemy URL (mysql+pymysql://…, postgresql+psycopg://…); default
                                   $BGQ_DATABASE_URL, else an embedded PostgreSQL (pip install bgq[embedded])
      queue                        base queue name (default "default"); sub-queues are "<queue>_<sub>"
      table_name                   jobs table (default "background_job")
      priorities                   allowed priorities, lower runs sooner; the first is the default ([1])
      bulk_size                    rows per INSERT between start_bulk() and end_bulk() (1)
      waiting_job_expiration       ms a WAITING job waits before cron mode retries it (1000)
      notify_on_number_of_attempts log critical once when a job has failed this many times
      on_before_process(params), on_after_process(params), on_error(exc, params),
      on_processing_get_metadata(params) -> JSON-able, stored in `metadata` at the claim
      stalled_job_timeout          s without a heartbeat before a PROCESSING job is reaped (3600; 0 = off)
      heartbeat_interval           s between heartbeat writes (60)
      lost_message_timeout         s before a READY job's lost broker message is re-sent (3600; 0 = off)
      producer                     a broker producer (broker mode); None = cron mode
      logger                       a logging.Logger (default logging.getLogger("bgq"))
      allow_pickle                 store non-JSON parameters pickled (False: unpickling runs code)
      permanent_errors             exception classes that fail a job for good (programming errors)
      data_dir                     where the embedded PostgreSQL keeps its data
    """

    def __init__(self, **options: Any) -> None:
        self.config: Config = build_config(**options)
        self.log = self.config.logger
        self._db: Database | None = None
        self._procs: Procs | None = None
        self.should_die = False
        self._bulk: _Bulk | None = None
        self._heartbeat = Heartbeat(self)  # the running job's proof of life (bgq/heartbeat.py)

    # --- connection ---

    @property
    def database(self) -> Database:
        if self._db is None:
            url = self.config.database_url
            if url is None:
                from .embedded import embedded_url

                url = embedded_url(self.config.data_dir)
                self._db = Database(url)
                install(self._db, self.config.table_name)  # the embedded database is bgq's own
            else:
                self._db = Database(url)
        return self._db

    @property
    def procs(self) -> Procs:
        """The procedure calls, once the installed version has been checked."""
        if self._procs is None:
            check_installed(self.database, self.config.table_name)
            self._procs = Procs(self.database, self.config.table_name)
        return self._procs

    def install(self) -> bool:
        """Create the table and install the procedures (`bgq install-procs`); False if up to date."""
        changed = install(self.database, self.config.table_name)
        self._procs = None
        return changed

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
        self._db = None
        self._procs = None

    # --- publishing ---

    def publish(
        self,
        callback_name: str,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        identifier: str | None = None,
        mode: Mode | str = Mode.NORMAL,
        postpone_by: int | dt.timedelta | None = None,
        priority: int | None = None,
        coalesce_threshold: int | None = None,
        connection: Session | Connection | None = None,
    ) -> int | None:
        """Store a job and return its id. Every check runs before anything is written.

        `connection`: the application's SQLAlchemy Session or Connection. The job is inserted in
        its transaction, and in broker mode its id reaches the broker only after the outermost
        commit (a rollback publishes nothing). Without it, bgq inserts and commits on its own.
        Between start_bulk() and end_bulk() it returns None: end_bulk() returns the ids.
        """
        job = new_job(
            self.config, callback_name, parameters, serial_group, identifier, mode, postpone_by, priority,
            coalesce_threshold,
        )  # fmt: skip
        if connection is None and self._bulk is not None:
            self._bulk.jobs.append(job)
            if len(self._bulk.jobs) >= self.config.bulk_size:
                self._flush_bulk()
            return None
        if connection is None:
            with self.database.transaction() as conn:
                job_id = self.procs.insert(conn, job)
            self._send([(job_id, job.queue, job.priority, job.postponed_by)])
            return job_id
        conn = connection.connection() if isinstance(connection, Session) else connection
        if not isinstance(conn, Connection):
            raise PublishError("connection must be a SQLAlchemy Session or Connection.")
        if _backend(conn.dialect.name) != self.database.dialect.name:
            raise PublishError(
                f"connection is {conn.dialect.name}, the queue's database {self.database.dialect.name}."
            )
        job_id = self.procs.insert(conn, job)
        if self.config.producer is not None:
            outbox.add(connection, (job_id, job.queue, job.priority, job.postponed_by), self._send_pending)
        return job_id

    # --- bulk publishing ---

    def start_bulk(self) -> None:
        """Buffer publish() calls; every `bulk_size` jobs go in one multi-row INSERT."""
        if self._bulk is None:
            self._bulk = _Bulk()

    def end_bulk(self) -> list[int]:
        """Insert what is buffered and return the ids of every job published since start_bulk()."""
        if self._bulk is None:
            return []
        try:
            self._flush_bulk()
            return self._bulk.ids
        finally:
            self._bulk = None

    @contextmanager
    def bulk(self) -> Iterator[_Bulk]:
        """`with queue.bulk() as batch: ...` then `batch.ids`; an exception inside inserts nothing more."""
        self.start_bulk()
        batch = self._bulk
        assert batch is not None
        try:
            yield batch
        except BaseException:
            self._bulk = None
            raise
        self.end_bulk()

    def _flush_bulk(self) -> None:
        batch = self._bulk
        if batch is None or not batch.jobs:
            return
        jobs, batch.jobs = batch.jobs, []
        with self.database.transaction() as conn:
            ids = self.procs.insert_many(conn, jobs)
        batch.ids.extend(ids)
        self._send([(i, j.queue, j.priority, j.postponed_by) for i, j in zip(ids, jobs, strict=True)])

    # --- the broker (no-ops in cron mode) ---

    def _send(self, jobs: list[tuple[int, str, int, int | None]]) -> None:
        """Send job ids to the broker; a failed send leaves the job BROKER_FAILED for `bgq process`."""
        producer = self.config.producer
        if producer is None:
            return
        for job_id, queue, priority, delay_ms in jobs:
            try:
                producer.publish(job_id, queue, priority, delay_ms or None)
            except BgqError as exc:
                self.log.critical(f"bgq: Publishing to the broker failed. (ID: {job_id})", exc_info=exc)
                with self.database.transaction() as conn:
                    self.procs.broker_failed(conn, job_id, f"{type(exc).__name__}: {exc}")

    def _send_pending(self, items: list[outbox.Pending]) -> None:
        self._send([(i.job_id, i.queue, i.priority, i.delay_ms) for i in items])

    def _send_job(self, job_id: int) -> None:
        """Send a job a procedure made ready (promoted, requeued, reaped), with its own delay."""
        if self.config.producer is None:
            return
        row = self.get_job(job_id)
        if row is not None:
            self._send([(job_id, row["queue"], row["priority"], row["postponed_by"])])

    # --- processing ---

    def process(self) -> ProcessReport:
        """`bgq process` (cron): reap stalled jobs, run due jobs inline; in broker mode also
        send BACK_TO_BROKER jobs, promote stuck groups' heads and re-send lost messages."""
        report = ProcessReport()
        procs, cfg = self.procs, self.config
        broker = cfg.producer is not None
        if cfg.stalled_job_timeout:
            with self.database.transaction() as conn:
                reaped = procs.reap(conn, cfg.queue, cfg.stalled_job_timeout, PROCESS_LIMIT)
            for job in reaped:
                self.log.critical(f"bgq: Stalled job reaped. (ID: {job.id}, PID {job.pid})")
                self._send_job(job.id)
            report.reaped = len(reaped)
        if broker:
            with self.database.transaction() as conn:
                released = procs.back_to_broker(conn, cfg.queue, PROCESS_LIMIT)
            self._send([(j.id, j.queue, j.priority, None) for j in released])
        with self.database.transaction() as conn:
            due = procs.due_jobs(conn, cfg.queue, broker, PROCESS_LIMIT)
        for job in due:
            if self.should_die:
                break
            if job.state == JobState.BACK_TO_BROKER:
                continue  # published by back_to_broker above
            try:
                report.count(self.process_job(job.id))
            except BgqError as exc:
                self.log.critical(f"bgq: Unexpected error occurred. (ID: {job.id})", exc_info=exc)
                report.count("error")
        if broker:
            with self.database.transaction() as conn:
                promoted = procs.promote_waiting(conn)
            self._send([(j.id, j.queue, j.priority, None) for j in promoted])
            report.promoted = len(promoted)
            if cfg.lost_message_timeout:
                with self.database.transaction() as conn:
                    lost = procs.lost_messages(conn, cfg.queue, cfg.lost_message_timeout, PROCESS_LIMIT)
                for job in lost:
                    self.log.warning(f"bgq: Lost broker message republished (ID: {job.id}).")
                self._send([(j.id, j.queue, j.priority, None) for j in lost])
                report.republished = len(lost)
        return report

    def process_job(self, job_id: int, on_claimed: Callable[[], None] | None = None) -> str:
        """Claim one job, run its callback and write its result. Returns the claim's outcome.

        Outcomes: claimed (it ran), waiting, redundant, locked, missing, skipped, unexpected.
        `on_claimed` runs once the claim (or its refusal) is committed, before the callback: a
        consumer acknowledges its message there.
        """
        cfg = self.config
        metadata_json = None
        if cfg.on_processing_get_metadata is not None:
            metadata_json = self._metadata(job_id)
        claim = self._claim(job_id, metadata_json)
        if on_claimed is not None:
            on_claimed()
        if claim.promoted_id is not None:
            self._send_job(claim.promoted_id)
        if claim.outcome == "locked" and claim.queue is not None and claim.priority is not None:
            self._send([(job_id, claim.queue, claim.priority, None)])  # another worker holds the group
        if claim.outcome == "unexpected":
            self.log.critical(f'bgq: Unexpected state "{claim.state}". (ID: {job_id})')
        if claim.outcome != "claimed":
            return claim.outcome
        assert claim.attempt is not None
        self._heartbeat.start(job_id, claim.attempt)
        try:
            outcome = self._run(job_id, claim)
        finally:
            self._heartbeat.stop()  # cleared before the result is written (SPEC B §1.5)
        self._finish(job_id, claim, outcome)
        return claim.outcome

    def heartbeat(self) -> None:
        """Tell the reaper that the running job is alive: its updated_at moves to now.

        Call it from a long callback more often than `stalled_job_timeout`. It writes at most once
        per `heartbeat_interval` seconds (the claim counts as the first heartbeat; 0 writes on every
        call), through bgq's own connection, fenced on the job's claim: a job that was reaped, claimed
        again elsewhere or finished is left alone (and logged once at WARNING). Outside a job it does
        nothing. It never raises: a failure is logged at WARNING as 'bgq: Heartbeat failed (ID: n).'
        """
        self._heartbeat.beat()

    def install_heartbeat(self, engine: Any) -> Callable[[], None]:
        """Send heartbeats automatically from every statement run on the application's `engine`.

        Registers a SQLAlchemy "before_cursor_execute" listener on `engine` (an Engine; for an
        AsyncEngine, its sync_engine) that calls `heartbeat()`: any query a callback runs on the
        application's database keeps its job alive, throttled to one write per
        `heartbeat_interval`. Outside a job it is a cheap no-op, so the application's other
        statements are not slowed. The heartbeat itself runs on bgq's own engine, and a guard stops
        any recursion. Installing twice on one engine registers one listener. Returns a function
        that removes the listener.
        """
        return self._heartbeat.install(engine)

    def _metadata(self, job_id: int) -> str | None:
        with self.database.transaction() as conn:
            row = self.procs.get_job(conn, job_id)
        if row is None:
            return None
        parameters = params_codec.decode(
            row["parameters_json"], row["parameters"], allow_pickle=self.config.allow_pickle
        )
        return json.dumps(self.config.on_processing_get_metadata(parameters), default=str)

    def _claim(self, job_id: int, metadata_json: str | None) -> ClaimResult:
        db = self.database
        for attempt in range(1, CLAIM_TRIES + 1):
            try:
                with db.transaction() as conn:
                    return self.procs.claim(
                        conn,
                        job_id,
                        self.config.queue,
                        os.getpid(),
                        self.config.waiting_job_expiration,
                        metadata_json,
                    )
            except DatabaseError as exc:
                if attempt == CLAIM_TRIES or not getattr(exc, "retryable", False):
                    raise
                time.sleep(0.1 * attempt)
        raise AssertionError("unreachable")

    def _run(self, job_id: int, claim: ClaimResult) -> runner.Outcome:
        cfg = self.config
        spec = cfg.callbacks.get(claim.callback_name or "")
        if spec is None:
            message = f'Callback "{claim.callback_name}" does not exist.'
            self.log.critical(f"bgq: {message} (ID: {job_id})")
            return runner.Outcome(JobState.PERMANENTLY_FAILED, message)
        try:
            parameters = params_codec.decode(
                claim.parameters_json, claim.parameters, allow_pickle=cfg.allow_pickle
            )
        except (SerializationError, ValueError) as exc:
            return runner.Outcome(JobState.PERMANENTLY_FAILED, runner.describe(exc), exception=exc)
        return runner.run(spec.func, parameters, claim.attempt or 0, cfg)

    def _finish(self, job_id: int, claim: ClaimResult, outcome: runner.Outcome) -> None:
        cfg = self.config
        memory = json.dumps(outcome.memory) if outcome.memory is not None else None
        # A RECURRING job that finished (a Skip too) and a WaitingException both leave a fresh copy,
        # due after waiting_job_expiration; the finish procedure inserts it in the same transaction.
        recurring_done = claim.mode == Mode.RECURRING and outcome.state is JobState.FINISHED
        clone_delay = cfg.waiting_job_expiration if (outcome.clone or recurring_done) else None
        result = None
        for wait in (0, 1, 2, 4, 8):  # the callback has run: try hard to write its result
            time.sleep(wait)
            try:
                with self.database.transaction() as conn:
                    result = self.procs.finish(
                        conn, job_id, claim.attempt or 0, int(outcome.state), outcome.error,
                        outcome.postponed_by, outcome.execution_time, memory, clone_delay_ms=clone_delay,
                    )  # fmt: skip
                break
            except BgqError as exc:
                self.log.critical(f"bgq: Writing the result failed; retrying. (ID: {job_id})", exc_info=exc)
        if outcome.die:
            self.should_die = True
        if result is None:
            return
        if not result.finished:
            self.log.warning(
                f"bgq: The job was taken over while it ran; its result is dropped. (ID: {job_id})"
            )
            return
        attempts = claim.attempt or 0
        if outcome.state is JobState.TEMPORARILY_FAILED:
            if cfg.notify_on_number_of_attempts and attempts == cfg.notify_on_number_of_attempts:
                self.log.critical(
                    f'bgq: Number of attempts reached "{attempts}". (ID: {job_id})',
                    exc_info=outcome.exception,
                )
        elif outcome.state is JobState.PERMANENTLY_FAILED:
            self.log.critical(f"bgq: Permanent error occurred. (ID: {job_id})", exc_info=outcome.exception)
        if outcome.state is JobState.TEMPORARILY_FAILED:
            self._send([(job_id, claim.queue or cfg.queue, claim.priority or 0, outcome.postponed_by)])
        if result.promoted_id is not None:
            self._send([(result.promoted_id, result.promoted_queue, result.promoted_priority, None)])
        if result.clone_id is not None:
            self._send([(result.clone_id, claim.queue or cfg.queue, claim.priority or 0, clone_delay)])

    # --- operations ---

    def requeue(self, job_id: int, reason: str) -> JobRef:
        """The DBA's manual requeue: the job becomes READY again (not while PROCESSING)."""
        with self.database.transaction() as conn:
            job = self.procs.requeue(conn, job_id, reason)
        self._send([(job.id, job.queue, job.priority, None)])
        return job

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row, for people and tests."""
        with self.database.transaction() as conn:
            return self.procs.get_job(conn, job_id)

    #: A PROCESSING job started longer ago than this (s) is stuck for the monitor (24 hours).
    STUCK_RUN_S = 86400

    def get_unfinished_job_identifiers(
        self, identifiers: list[str] | tuple[str, ...] = (), exclude_processing: bool = False
    ) -> list[str]:
        """The distinct identifiers of this queue's jobs that still have work ahead, sorted.

        A job is finished when FINISHED, REDUNDANT or PERMANENTLY_FAILED (and, with
        `exclude_processing`, PROCESSING: a running job does not count). `identifiers` limits the
        answer to those; empty means every job that has an identifier.
        """
        if isinstance(identifiers, str | bytes):
            raise TypeError("identifiers must be a list of strings, not one string.")
        wanted = list(identifiers)
        if not all(isinstance(i, str) for i in wanted):
            raise TypeError("identifiers must be strings.")
        if wanted:
            wanted = [i for i in wanted if len(i) <= _MAX_TEXT]  # longer ones cannot be stored
            if not wanted:
                return []
        with self.database.transaction() as conn:
            return self.procs.unfinished_identifiers(
                conn, self.config.queue, json.dumps(wanted) if wanted else None, exclude_processing
            )

    def report_stuck_jobs(self) -> dict[int, dict[str, Any]]:
        """The monitor (`bgq monitor`): jobs that need a person, per state.

        Returns {4: {"count": n, "oldest_since": datetime | None}, 5: {...}, 2: {...}}:
        TEMPORARILY_FAILED and PERMANENTLY_FAILED jobs with their oldest created_at, and PROCESSING
        jobs started (last_attempt_at) more than 24 hours ago with the oldest start. When any
        count is not 0 it logs one record, critical if there are permanent failures or long runs,
        else warning.
        """
        with self.database.transaction() as conn:
            rows = self.procs.monitor(conn, self.config.queue, self.STUCK_RUN_S)
        report = {r.state: {"count": r.job_count, "oldest_since": r.oldest_since} for r in rows}
        temporary, permanent, running = report[4], report[5], report[2]
        parts = []
        if temporary["count"]:
            parts.append(
                f"{temporary['count']}x TEMPORARILY_FAILED (oldest {self._stamp(temporary['oldest_since'])})"
            )
        if permanent["count"]:
            parts.append(
                f"{permanent['count']}x PERMANENTLY_FAILED (oldest {self._stamp(permanent['oldest_since'])})"
            )
        if running["count"]:
            parts.append(
                f"{running['count']}x PROCESSING running longer than 24 hours "
                f"(since {self._stamp(running['oldest_since'])})"
            )
        if parts:
            message = f"bgq: Stuck jobs report: {', '.join(parts)}."
            if permanent["count"] or running["count"]:
                self.log.critical(message)
            else:
                self.log.warning(message)
        return report

    @staticmethod
    def _stamp(value: dt.datetime | None) -> str:
        """A monitor timestamp for people: UTC to the second."""
        return "-" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    def clear_finished_jobs(self, days: int | None = None) -> int:
        """Delete this queue's FINISHED jobs (`bgq clear-finished`); returns how many.

        `days` None or 0: every finished job; otherwise those created before today 00:00 UTC
        minus `days` days. REDUNDANT and failed jobs stay.
        """
        if days is not None and (isinstance(days, bool) or not isinstance(days, int) or days < 0):
            raise ValueError(f"days must be a whole number >= 0 or None, got {days!r}.")
        before = None
        if days:
            midnight = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            before = midnight - dt.timedelta(days=days)
        for attempt in range(1, CLAIM_TRIES + 1):
            try:
                with self.database.transaction() as conn:
                    return self.procs.clear_finished(conn, self.config.queue, before)
            except DatabaseError as exc:
                if attempt == CLAIM_TRIES or not getattr(exc, "retryable", False):
                    raise
                time.sleep(0.1 * attempt)
        raise AssertionError("unreachable")


def _backend(name: str) -> str:
    return "postgres" if name.startswith("postgres") else "mysql"
