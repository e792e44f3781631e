"""The public API: `Queue`, a facade over the parts that publish, run and administer jobs.

A newcomer follows a job through one part per step: Publisher (bgq/jobs/publisher.py) validates
and inserts it and hands its id to the Sender (bgq/jobs/sender.py, broker mode); a worker loop
(bgq/modes/: work.py, consume.py, process.py) claims it and the Executor (bgq/jobs/executor.py)
runs it and writes its result; the Reaper (bgq/jobs/reaper.py) takes back a dead worker's job;
Admin (bgq/jobs/admin.py) holds the operations for people. Every part reaches the database through
one Store (bgq/sql/database.py), which calls the stored procedures (bgq/sql/calls.py).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from sqlalchemy.engine import Connection

from .config import Config, build_config, register_callback
from .db import Database
from .errors import ConfigError
from .jobs.admin import Admin
from .jobs.executor import Executor
from .jobs.publisher import Bulk, Publisher
from .jobs.reaper import Reaper
from .jobs.schedules import Schedule, Scheduler, declare
from .jobs.sender import Sender
from .model import Cancelled, JobRef, Mode, Pause, ScheduleRow, WorkerRow
from .modes import process as process_mode
from .sql.calls import Procs
from .sql.database import Store
from .tasks import Task

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")


class Queue:
    """A durable job queue on a table of the application's database.

    Options (keyword arguments), as in the original library:
      callbacks                    {name: callable} or {name: {"callback": f, "queue": sub, "priority": p}};
                                   optional ({}): @queue.task registers callbacks too
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
                                   (callbacks and these hooks may be `async def`: bgq/jobs/coroutines.py)
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
      clock                        a callable returning an aware datetime: bgq's time, passed as p_now to
                                   every procedure and written as created_at (None: the database's clock)
      worker_heartbeat_interval    s between two heartbeats of a worker process's {table}_worker row (5)
      worker_dead_after            s without such a heartbeat before the worker counts as dead and its
                                   PROCESSING jobs are reaped (30; 0 = off; more than 2 x the interval)
      log_format                   "text" or "json" (one JSON object per line): what the CLI logs in
                                   when --log-format is not given (bgq/logfmt.py)
      pooled                       PostgreSQL: database_url leads to a transaction-pooling PgBouncer:
                                   no session state, no prepared statements (default $BGQ_POOLED, else
                                   False; docs/scale-out/pgbouncer.md)
      listen_url                   PostgreSQL: a direct URL (not through a pooler) for the LISTEN of idle
                                   `bgq work` processes (default $BGQ_LISTEN_URL; pooled without it: they
                                   poll, up to --poll seconds apart)
    """

    def __init__(self, **options: Any) -> None:
        self._schedules: dict[str, Schedule] = {}  # declared in code; kept when the parts are rebuilt
        self._build(build_config(**options))

    def _build(self, config: Config) -> None:
        self._config = config
        self.store = Store(config)
        self.sender = Sender(config, self.store)
        self.publisher = Publisher(config, self.store, self.sender)
        self.executor = Executor(config, self.store, self.sender)
        self.admin = Admin(config, self.store, self.sender)
        #: Reaps stalled jobs (bgq/jobs/reaper.py): process() runs it once per run, and `bgq work` and
        #: `bgq consume` start it on a thread of their own.
        self.reaper = Reaper(config, self.store, self.sender)
        #: Fires the declared schedules (bgq/jobs/schedules.py): every worker loop calls its tick().
        self.scheduler = Scheduler(config, self.store, self.sender, self._schedules)

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        """A new configuration (the CLI's --database): the parts are built again, unconnected."""
        self.close()
        self._build(config)

    @property
    def log(self) -> logging.Logger:
        """The queue's logger (option `logger`)."""
        return self._config.logger

    # --- connection ---

    @property
    def database(self) -> Database:
        return self.store.database

    @property
    def procs(self) -> Procs:
        """The procedure calls, once the installed version has been checked."""
        return self.store.procs

    def install(self) -> bool:
        """Create the table and install the procedures (`bgq install-procs`); False if up to date."""
        return self.store.install()

    def close(self) -> None:
        self.store.close()

    # --- publishing (bgq/jobs/publisher.py) ---

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
        return self.publisher.publish(
            callback_name, parameters, serial_group=serial_group, identifier=identifier, mode=mode,
            postpone_by=postpone_by, priority=priority, coalesce_threshold=coalesce_threshold,
            connection=connection,
        )  # fmt: skip

    async def publish_async(
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
        """`publish` for asyncio applications: the same checks, the same INSERT, its own transaction.

        PostgreSQL: on psycopg's AsyncConnection, one per event loop (concurrent calls share it).
        MySQL: publish's insert on a thread (asyncio.to_thread). It takes no `connection` and
        ignores start_bulk(): it always inserts at once and returns the id. `await queue.aclose()`
        closes the running loop's connection.
        """
        return await self.publisher.publish_async(
            callback_name, parameters, serial_group=serial_group, identifier=identifier, mode=mode,
            postpone_by=postpone_by, priority=priority, coalesce_threshold=coalesce_threshold,
        )  # fmt: skip

    async def aclose(self) -> None:
        """Close the running event loop's publish_async connection (PostgreSQL); a later call reopens it."""
        await self.publisher.aclose()

    # --- tasks (bgq/tasks.py) ---

    @overload
    def task(self, func: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        func: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a callback: `@queue.task` or `@queue.task(name=, priority=, queue=)`.

        Beside the `callbacks` option (both work together): `name` (default: the function's
        __name__) is the callback name, `priority` its default priority, `queue` its sub-queue,
        checked like a `callbacks` entry (ConfigError; a name registered twice too). It only
        registers, so it can decorate functions before the queue connects. Returns a Task:
        `task.publish(*args, **kwargs)` is type-checked against the function's signature and
        checked again at run time (PublishError, nothing written);
        `task.configure(serial_group=..., priority=...).publish(...)` sets publish's options.
        """

        def register(function: Callable[P, R]) -> Task[P, R]:
            callback_name = name if name is not None else getattr(function, "__name__", None)
            if not isinstance(callback_name, str):
                raise ConfigError(f"{function!r} has no __name__: give the task a name.")
            register_callback(self._config, callback_name, function, queue, priority)
            return Task(self, function, callback_name)

        return register(func) if func is not None else register

    def start_bulk(self) -> None:
        """Buffer this thread's (or asyncio task's) publish() calls; every `bulk_size` jobs go in one
        multi-row INSERT. Other threads publishing on this queue meanwhile insert at once.

        PostgreSQL and MariaDB send a full batch without waiting for it and read its outcome when
        the next batch is full or at end_bulk(): a batch the database refuses raises from that call. A
        database error ends the bulk: the jobs not inserted yet are dropped, and the ids so far
        are those of the jobs published first."""
        self.publisher.start_bulk()

    def end_bulk(self) -> list[int]:
        """Insert what this thread buffered and return the ids of every job it published since
        start_bulk()."""
        return self.publisher.end_bulk()

    def bulk(self) -> AbstractContextManager[Bulk]:
        """`with queue.bulk() as batch: ...` then `batch.ids`; an exception inside inserts nothing more."""
        return self.publisher.bulk()

    # --- running jobs (bgq/modes/process.py, bgq/jobs/executor.py) ---

    def process(self, *, max_runtime: float | None = None) -> process_mode.ProcessReport:
        """`bgq process` (cron): reap stalled jobs, then run due jobs inline, one at a time.

        Without a broker a run is `bgq work`'s loop that ends when it finds nothing to claim: it
        claims with `{table}_claim_batch` (ungrouped due jobs and the heads of idle groups, in
        (priority, id) order, then a group's next head by hand-off), so however many jobs wait
        below a group's head, the run only ever claims jobs that may run now, and PROCESS_LIMIT
        counts the jobs run; the worker's reaper thread keeps reaping during a long run. In broker
        mode it sends BACK_TO_BROKER jobs, runs BROKER_FAILED ones, promotes stuck groups' heads
        and re-sends lost messages.

        `max_runtime` (seconds; None: no limit): no job is started once that much time has passed
        since the call (a running job is not interrupted), so a run ends within about
        max_runtime plus one job; the report's `timed_out` says so.
        """
        return process_mode.process(self, max_runtime=max_runtime)

    def process_job(self, job_id: int, on_claimed: Callable[[], None] | None = None) -> str:
        """Claim one job, run its callback and write its result. Returns the claim's outcome.

        Outcomes: claimed (it ran), waiting, redundant, locked, paused (its queue or group is
        paused: nothing changed; in broker mode the id is sent back with a delay), missing, skipped,
        unexpected, and
        taken_over: the claim was older than half of stalled_job_timeout when the callback was to
        start (this process was frozen or slow) and had been reaped meanwhile, so the callback did
        not run here. `on_claimed` runs once the claim (or its refusal) is committed, before the
        callback: a consumer acknowledges its message there.
        """
        return self.executor.process_job(job_id, on_claimed)

    @property
    def should_die(self) -> bool:
        """True once a callback raised DieException: every worker loop stops claiming."""
        return self.executor.should_die

    @should_die.setter
    def should_die(self, value: bool) -> None:
        self.executor.should_die = value

    def heartbeat(self) -> None:
        """Tell the reaper that the running job is alive: its updated_at moves to now; raise
        bgq.JobAborted if the job was cancelled or taken over by another worker (see below).

        Call it from a long callback more often than `stalled_job_timeout`. It writes at most once
        per `heartbeat_interval` seconds (the claim counts as the first heartbeat; 0 writes on every
        call), through bgq's own connection, fenced on the job's claim: a job that was reaped, claimed
        again elsewhere or finished is left alone (and logged once at WARNING). Outside a job it does
        nothing. A write that finds the job cancelled (`cancel`) or no longer this worker's (reaped
        and claimed again: a zombie) raises bgq.JobAborted, then so does every later call in that
        job, so a cooperative callback stops; the automatic hook (install_heartbeat) raises it too,
        from the statement the callback runs. Any other failure is logged at WARNING as
        'bgq: Heartbeat failed (ID: n).', never raised.
        """
        self.executor.heartbeat.beat()

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
        return self.executor.install_heartbeat(engine)

    # --- schedules (bgq/jobs/schedules.py) ---

    def schedule(
        self,
        name: str,
        cron: str,
        callback_name: str | None = None,
        parameters: list[Any] | tuple[Any, ...] | dict[str, Any] | None = None,
        *,
        serial_group: str | None = None,
        priority: int | None = None,
        timezone: str = "UTC",
        missed: str = "once",
        grace: float | dt.timedelta = 60.0,
    ) -> Any:
        """Declare a periodic job: every fire time of `cron` publishes one job of `callback_name`.

        `cron`: 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first
        ("*/10 * * * * *"), read in `timezone` (an IANA name; DST-aware: a time the clocks skip
        fires at the first time after it, a time they repeat fires once). Each fire time
        publishes exactly one job however many workers and hosts run. `missed`: what happens to
        fire times no worker reached within `grace` seconds (downtime): "once" publishes one
        catch-up job, "skip" publishes none. The schedule is stored (and those of this queue no
        longer declared are deactivated) when a worker starts; `bgq schedules` lists them.
        Raises ConfigError (bad cron, zone, policy) or a PublishError (unknown callback,
        priority, parameters) before anything is stored. Without `callback_name` it is a
        decorator: the function becomes the callback named `name` and is returned unchanged.
        """
        if callback_name is None:

            def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
                self._add_callback(name, func)
                self.schedule(
                    name, cron, name, parameters, serial_group=serial_group, priority=priority,
                    timezone=timezone, missed=missed, grace=grace,
                )  # fmt: skip
                return func

            return decorator
        spec = declare(
            self._config, name, cron, callback_name, parameters, serial_group=serial_group,
            priority=priority, timezone=timezone, missed=missed, grace=grace,
        )  # fmt: skip
        self._schedules[name] = spec
        self.scheduler.synced = False  # a running worker stores it at its next tick
        return spec

    def _add_callback(self, name: str, func: Callable[..., Any]) -> None:
        """The schedule decorator's callback, registered as @queue.task registers one."""
        known = self._config.callbacks.get(name)
        if known is not None and known.func is func:
            return
        register_callback(self._config, name, func, None, None)

    def schedules(self) -> list[ScheduleRow]:
        """Every stored schedule (all queues): next fire time, last fire and its job (`bgq schedules`)."""
        return self.scheduler.rows()

    def fire_schedules(self, now: dt.datetime | None = None) -> list[JobRef]:
        """Store the declared schedules and publish the jobs of those due now; what the worker
        loops do every second. `now` (aware) replaces the database's clock (tests)."""
        self.scheduler.sync(now)
        return self.scheduler.fire_due(now)

    # --- control: pause, resume, cancel (bgq/jobs/admin.py) ---

    def pause(
        self, reason: str, *, group: str | None = None, queue: str | None = None, by: str | None = None
    ) -> bool:
        """Pause this queue (or `queue`, a queue name; its sub-queues with it) or the serial
        `group`: no claim in any mode starts their jobs until resume(); a running job goes on.
        The reason and `by` are stored and shown by `bgq monitor`. False if already paused."""
        return self.admin.pause(reason, group=group, queue=queue, by=by)

    def resume(self, *, group: str | None = None, queue: str | None = None) -> bool:
        """Undo pause(): the jobs run again in (priority, id) order. False if it was not paused."""
        return self.admin.resume(group=group, queue=queue)

    def paused(self) -> list[Pause]:
        """Every paused queue and group, with reason, who and since when."""
        return self.admin.pauses()

    def cancel(self, job_id: int, reason: str) -> Cancelled:
        """Cancel a job. One that has not started becomes REDUNDANT with 'Cancelled: <reason>'
        and its group moves on (outcome "cancelled"); a running one is marked to abort (outcome
        "abort_requested"): its next heartbeat raises bgq.JobAborted in the callback and its
        result is recorded REDUNDANT with the reason; a finished one is left alone ("finished").
        Raises JobNotFoundError for an unknown id."""
        return self.admin.cancel(job_id, reason)

    # --- operations for people (bgq/jobs/admin.py) ---

    def requeue(self, job_id: int, reason: str) -> JobRef:
        """The DBA's manual requeue: the job becomes READY again (not while PROCESSING)."""
        return self.admin.requeue(job_id, reason)

    def run_now(self, job_id: int, reason: str) -> JobRef:
        """Clear a READY or TEMPORARILY_FAILED job's postponement: it is due at once."""
        return self.admin.run_now(job_id, reason)

    def workers(self) -> list[WorkerRow]:
        """The registered worker processes of this queue (`bgq workers`; bgq/modes/registry.py)."""
        return self.admin.workers()

    def get_job(self, job_id: int) -> dict[str, Any] | None:
        """The job's row, for people and tests."""
        return self.admin.get_job(job_id)

    def get_unfinished_job_identifiers(
        self, identifiers: list[str] | tuple[str, ...] = (), exclude_processing: bool = False
    ) -> list[str]:
        """The distinct identifiers of this queue's jobs that still have work ahead, sorted.

        A job is finished when FINISHED, REDUNDANT or PERMANENTLY_FAILED (and, with
        `exclude_processing`, PROCESSING: a running job does not count). `identifiers` limits the
        answer to those; empty means every job that has an identifier.
        """
        return self.admin.get_unfinished_job_identifiers(identifiers, exclude_processing)

    def report_stuck_jobs(self) -> dict[int, dict[str, Any]]:
        """The monitor (`bgq monitor`): jobs that need a person, per state (bgq/jobs/admin.py)."""
        return self.admin.report_stuck_jobs()

    def clear_finished_jobs(self, days: int | None = None) -> int:
        """Delete this queue's FINISHED jobs (`bgq clear-finished`); returns how many.

        `days` None or 0: every finished job; otherwise those created before today 00:00 UTC
        minus `days` days. REDUNDANT and failed jobs stay.
        """
        return self.admin.clear_finished_jobs(days)
