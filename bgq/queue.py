"""The public API: `Queue` publishes jobs and processes them through the stored procedures."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import params as params_codec
from . import runner
from .config import Config, build_config
from .db import Database
from .errors import (
    BgqError,
    DatabaseError,
    PriorityError,
    PublishError,
    SerializationError,
    UnknownCallbackError,
)
from .install import check_installed, install
from .procs import ClaimResult, JobRef, NewJob, Procs
from .states import JobState, Mode

_MAX_TEXT = 255
_MAX_INT32 = 2**31 - 1
PROCESS_LIMIT = 1000  # jobs per process() run, as in the original
CLAIM_TRIES = 5  # a deadlock or lock-wait timeout in the claim is retried this many times


@dataclass
class ProcessReport:
    """What one `process()` run did."""

    reaped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


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
    ) -> int:
        """Store a job and return its id. Every check runs before anything is written."""
        job = self._new_job(
            callback_name,
            parameters,
            serial_group,
            identifier,
            mode,
            postpone_by,
            priority,
            coalesce_threshold,
        )
        with self.database.transaction() as conn:
            return self.procs.insert(conn, job)

    def _new_job(
        self,
        callback_name: Any,
        parameters: Any,
        serial_group: Any,
        identifier: Any,
        mode: Any,
        postpone_by: Any,
        priority: Any,
        coalesce_threshold: Any,
    ) -> NewJob:
        cfg = self.config
        if not callback_name:
            raise PublishError('The job does not have the required parameter "callback_name" set.')
        spec = cfg.callbacks.get(callback_name) if isinstance(callback_name, str) else None
        if spec is None:
            raise UnknownCallbackError(f'Callback "{callback_name}" does not exist.')
        try:
            mode = Mode(mode)
        except ValueError:
            raise PublishError(f"Unknown mode {mode!r}: use normal, unique or recurring.") from None
        if mode is not Mode.NORMAL and not identifier:
            raise PublishError(f'Parameter "identifier" has to be set if "mode" is {mode.value}.')
        if coalesce_threshold is not None and not serial_group:
            raise PublishError('Parameter "serial_group" has to be set if "coalesce_threshold" is used.')
        if priority is None:
            priority = spec.priority if spec.priority is not None else cfg.priorities[0]
        if isinstance(priority, bool) or priority not in cfg.priorities:
            raise PriorityError(
                f"Priority {priority} for callback {callback_name} is not in available priorities: "
                f"{','.join(map(str, cfg.priorities))}"
            )
        for name, value in (("serial_group", serial_group), ("identifier", identifier)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > _MAX_TEXT):
                raise PublishError(
                    f'Parameter "{name}" must be a non-empty string of at most {_MAX_TEXT} characters.'
                )
            if value is not None and value != value.rstrip():
                # MySQL compares these PAD SPACE ('a ' = 'a'), PostgreSQL does not: refuse the ambiguity.
                raise PublishError(f'Parameter "{name}" must not end with whitespace: {value!r}.')
        if coalesce_threshold is not None and (
            isinstance(coalesce_threshold, bool) or not isinstance(coalesce_threshold, int)
        ):
            raise PublishError('Parameter "coalesce_threshold" must be an integer.')
        postponed_by = _milliseconds(postpone_by)
        parameters_json, pickled = params_codec.encode(parameters, allow_pickle=cfg.allow_pickle)
        return NewJob(
            queue=cfg.queue_name(spec.queue),
            priority=priority,
            callback_name=callback_name,
            parameters_json=parameters_json,
            parameters=pickled,
            serial_group=serial_group,
            coalesce_threshold=coalesce_threshold,
            identifier=identifier,
            mode=mode.value,
            postponed_by=postponed_by,
            processed_by_broker=cfg.producer is not None,
        )

    # --- processing ---

    def process(self) -> ProcessReport:
        """Cron mode (`bgq process`): reap stalled jobs, then run every due job inline, in id order."""
        report = ProcessReport()
        procs = self.procs
        cfg = self.config
        if cfg.stalled_job_timeout:
            with self.database.transaction() as conn:
                reaped = procs.reap(conn, cfg.queue, cfg.stalled_job_timeout, PROCESS_LIMIT)
            for job in reaped:
                self.log.critical(f"bgq: Stalled job reaped. (ID: {job.id}, PID {job.pid})")
            report.reaped = len(reaped)
        with self.database.transaction() as conn:
            due = procs.due_jobs(conn, cfg.queue, False, PROCESS_LIMIT)
        for job in due:
            if self.should_die:
                break
            try:
                report.count(self.process_job(job.id))
            except BgqError as exc:
                self.log.critical(f"bgq: Unexpected error occurred. (ID: {job.id})", exc_info=exc)
                report.count("error")
        return report

    def process_job(self, job_id: int) -> str:
        """Claim one job, run its callback and write its result. Returns the claim's outcome.

        Outcomes: claimed (it ran), waiting, redundant, locked, missing, skipped, unexpected.
        """
        cfg = self.config
        metadata_json = None
        if cfg.on_processing_get_metadata is not None:
            metadata_json = self._metadata(job_id)
        claim = self._claim(job_id, metadata_json)
        if claim.promoted_id is not None:
            self._on_ready(claim.promoted_id)
        if claim.outcome == "unexpected":
            self.log.critical(f'bgq: Unexpected state "{claim.state}". (ID: {job_id})')
        if claim.outcome != "claimed":
            return claim.outcome
        assert claim.attempt is not None
        outcome = self._run(job_id, claim)
        self._finish(job_id, claim, outcome)
        return claim.outcome

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
        result = None
        for wait in (0, 1, 2, 4, 8):  # the callback has run: try hard to write its result
            time.sleep(wait)
            try:
                with self.database.transaction() as conn:
                    result = self.procs.finish(
                        conn, job_id, claim.attempt or 0, int(outcome.state), outcome.error,
                        outcome.postponed_by, outcome.execution_time, memory,
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
        if result.promoted_id is not None:
            self._on_ready(result.promoted_id)

    def _on_ready(self, job_id: int) -> None:
        """A job became READY inside a procedure. Cron mode finds it on the next run."""

    # --- operations ---

    def requeue(self, job_id: int, reason: str) -> JobRef:
        """The DBA's manual requeue: the job becomes READY again (not while PROCESSING)."""
        with self.database.transaction() as conn:
            job = self.procs.requeue(conn, job_id, reason)
        self._on_ready(job.id)
        return job

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row, for people and tests."""
        with self.database.transaction() as conn:
            return self.procs.get_job(conn, job_id)


def _milliseconds(value: int | dt.timedelta | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value // dt.timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > _MAX_INT32:
        raise PublishError(
            f'Parameter "postpone_by" must be 0..{_MAX_INT32} ms or a timedelta, got {value!r}.'
        )
    return value
