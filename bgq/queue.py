"""The public API: `Queue` publishes jobs and processes them through the stored procedures."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from . import outbox
from . import params as params_codec
from .config import Config, build_config
from .db import Database, dialect_name
from .errors import BgqError, PublishError
from .heartbeat import Heartbeat
from .install import check_installed, install
from .operations import Operations
from .processing import Processing
from .procs import NewJob, Procs
from .reaper import Reaper
from .states import Mode
from .validate import new_job

#: Parameter bytes per multi-row INSERT of a bulk: far below MariaDB's default max_allowed_packet
#: (16 MiB) even when escaping doubles them; a larger bulk is inserted in several statements.
BULK_INSERT_BYTES = 4 * 1024 * 1024


def _by_size(jobs: list[NewJob]) -> Iterator[list[NewJob]]:
    """Consecutive runs of `jobs` whose parameters take at most BULK_INSERT_BYTES (one job at least)."""
    chunk: list[NewJob] = []
    size = 0
    for job in jobs:
        job_size = params_codec.encoded_size(job.parameters_json, job.parameters)
        if chunk and size + job_size > BULK_INSERT_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(job)
        size += job_size
    if chunk:
        yield chunk


@dataclass
class _Bulk:
    """Jobs published since start_bulk(): those not inserted yet, and the ids of those inserted."""

    jobs: list[NewJob] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


class Queue(Processing, Operations):
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
      stalled_job_backoff          s a reaped job waits before it runs again (None: the retry backoff,
                                   1, 2, 4, 8, 16 min by attempts; 0: at once)
      heartbeat_interval           s between heartbeat writes (60)
      lost_message_timeout         s before a READY job's lost broker message is re-sent (3600; 0 = off)
      lock_timeout                 s a bgq session waits for a lock, or sits idle in a transaction before
                                   the server ends it: how long a frozen worker holds others up (5; 0 = off)
      producer                     a broker producer (broker mode); None = cron mode
      logger                       a logging.Logger (default logging.getLogger("bgq"))
      allow_pickle                 store non-JSON parameters pickled (False: unpickling runs code)
      permanent_errors             exception classes that fail a job for good (programming errors)
      data_dir                     where the embedded PostgreSQL keeps its data
      max_parameters_bytes         largest encoded parameters publish accepts (1 MiB); larger: PublishError
    """

    def __init__(self, **options: Any) -> None:
        self.config: Config = build_config(**options)
        self.log = self.config.logger
        self._db: Database | None = None
        self._procs: Procs | None = None
        self.should_die = False
        self._bulk: _Bulk | None = None
        self._heartbeat = Heartbeat(self)  # the running job's proof of life (bgq/heartbeat.py)
        #: Reaps stalled jobs (bgq/reaper.py): process() runs it once per run, and `bgq work` and
        #: `bgq consume` start it on a thread of their own.
        self.reaper = Reaper(self)

    # --- connection ---

    @property
    def database(self) -> Database:
        if self._db is None:
            url = self.config.database_url
            if url is None:
                from .embedded import embedded_url

                url = embedded_url(self.config.data_dir)
                self._db = Database(url, self.log, self.config.lock_timeout)
                install(self._db, self.config.table_name)  # the embedded database is bgq's own
            else:
                self._db = Database(url, self.log, self.config.lock_timeout)
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
        if dialect_name(conn.dialect.name) != self.database.dialect.name:
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
            ids = [i for chunk in _by_size(jobs) for i in self.procs.insert_many(conn, chunk)]
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
