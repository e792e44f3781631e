"""The `bgq` command line (typer): install-procs, the worker modes, monitoring, admin, web, demo."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import sqlalchemy as sa
import typer
from typer.core import TyperGroup

from .. import logfmt
from ..config import LOG_FORMATS
from ..db import Database, normalise_url
from ..errors import BgqError, JobNotFoundError, JobStateError
from ..queue import Queue
from ..sql.install import install
from .cmdlock import CommandLockedError, command_lock, lock_name, locks_dir

#: `bgq process --max-runtime`'s default, in seconds: a cron run stops claiming after this.
MAX_RUNTIME = 600
#: `--stale-after`'s default, in seconds: a command lock held longer than this (3 x the default
#: max runtime) is reported at CRITICAL by the run it refuses and by `bgq monitor`.
STALE_AFTER = 3 * MAX_RUNTIME

log = logging.getLogger("bgq")


class _Commands(TyperGroup):
    """Every command's errors end here: a BgqError, or a database or driver error that reached
    the CLI untranslated, becomes one line `bgq: <message>` on stderr and exit code 1. Anything
    else is a bug of bgq or of the application and keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:  # click's Context (typer vendors click: its path varies)
        try:
            return super().invoke(ctx)
        except Exception as exc:  # typer.Exit and usage errors are not bgq's: they pass
            message = error_message(exc)
            if message is None:
                raise
            fail(message)


app = typer.Typer(
    cls=_Commands,
    help="bgq: a durable background-job queue on MySQL/MariaDB or PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class State:
    app_path: str | None = None
    database_url: str | None = None
    pooled: bool | None = None  # --pooled / --no-pooled (None: the queue's option)
    listen_url: str | None = None
    table: str | None = None
    queue: Queue | None = None  # the command's queue (load_queue)
    log_format: str | None = None  # --log-format (None: the queue's log_format option)
    verbose: bool = False
    database: Database | None = None  # the command's database without a queue (install-procs, demo)


state = State()


def error_message(exc: BaseException) -> str | None:
    """The one-line text `bgq: ...` prints for `exc`; None for an exception that is not bgq's,
    the database's or its driver's (a bug: it keeps its traceback)."""
    if isinstance(exc, BgqError):
        return str(exc)
    database = state.database
    if database is None and state.queue is not None and state.queue.config.database_url is not None:
        database = state.queue.database  # only builds the engine: never connects, never starts one
    if isinstance(exc, sa.exc.DBAPIError) and database is not None:
        return str(database.translate(exc))
    if isinstance(exc, sa.exc.DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        return f"Database error: {orig}"
    if isinstance(exc, sa.exc.SQLAlchemyError) or _is_driver_error(exc):
        return f"Database error: {exc}"
    return None


def _is_driver_error(exc: BaseException) -> bool:
    """An error of pymysql or psycopg that reached the CLI without SQLAlchemy's wrapper."""
    module = type(exc).__module__ or ""
    return module.split(".")[0] in ("pymysql", "psycopg") and isinstance(exc, Exception)


@app.callback()
def options(
    app_path: Annotated[
        str | None,
        typer.Option(
            "--app", envvar="BGQ_APP", help="Your queue: 'package.module:queue' (a bgq.Queue or a factory)."
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url", envvar="BGQ_DATABASE_URL", help="SQLAlchemy URL; overrides the app's."
        ),
    ] = None,
    pooled: Annotated[
        bool | None,
        typer.Option(
            "--pooled/--no-pooled",
            envvar="BGQ_POOLED",
            help="PostgreSQL behind a transaction-pooling PgBouncer: no session state, no prepared "
            "statements. Default: the queue's pooled option.",
        ),
    ] = None,
    listen_url: Annotated[
        str | None,
        typer.Option(
            "--listen-url",
            envvar="BGQ_LISTEN_URL",
            help="A direct PostgreSQL URL (not through a pooler) for idle workers' LISTEN.",
        ),
    ] = None,
    table: Annotated[str | None, typer.Option("--table", help="Jobs table when no --app is given.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            envvar="BGQ_LOG_FORMAT",
            help="text, or json: one JSON object per line, with a line per job run (INFO) carrying "
            "job_id, callback, queue, group, attempt, outcome, duration_ms. Default: the queue's "
            "log_format option, else text.",
        ),
    ] = None,
) -> None:
    if log_format is not None and log_format not in LOG_FORMATS:
        fail(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}.", code=2)
    state.log_format, state.verbose = log_format, verbose
    _use_log_format(log_format or "text")
    # pika logs each failed connection attempt with a traceback; bgq reports the failure itself
    # (BrokerError, one line), so pika speaks only with --verbose.
    logging.getLogger("pika").setLevel(logging.INFO if verbose else logging.CRITICAL)
    state.app_path, state.database_url, state.table = app_path, database_url, table
    state.pooled, state.listen_url = pooled, listen_url


def _use_log_format(fmt: str) -> None:
    """Log in `fmt`; json also turns on the INFO job-outcome lines (for machines to read)."""
    logfmt.use(fmt, logging.INFO if state.verbose else logging.WARNING)
    if fmt == "json":
        logging.getLogger("bgq").setLevel(logging.INFO)


def app_queue() -> Queue:
    """The command's queue, imported from --app / BGQ_APP; a command that needs one exits with
    code 2 and the reason (none given, not importable, not a bgq.Queue) when there is none."""
    queue = load_queue(required=False)
    if queue is None:
        fail("No queue given: pass --app package.module:queue or set BGQ_APP.", code=2)
    return queue


def load_queue(required: bool = True) -> Queue | None:
    """Import the application's queue named by --app / BGQ_APP (None when none is named and it
    is not `required`; app_queue when it is)."""
    if not state.app_path:
        if required:
            fail("No queue given: pass --app package.module:queue or set BGQ_APP.", code=2)
        return None
    module_name, _, attr = state.app_path.partition(":")
    if not module_name or not attr:
        fail(f"--app must look like 'package.module:queue', got {state.app_path!r}.", code=2)
    sys.path.insert(0, "")
    try:
        target = getattr(importlib.import_module(module_name), attr)
        queue: object = target() if callable(target) and not isinstance(target, Queue) else target
    except (ImportError, AttributeError, BgqError) as exc:
        fail(f"Cannot load {state.app_path!r}: {exc}", code=2)
    if not isinstance(queue, Queue):
        fail(f"{state.app_path!r} is not a bgq.Queue (got {type(queue).__name__}).", code=2)
    overrides = {
        name: value
        for name, value in (
            ("database_url", state.database_url or None),
            ("pooled", state.pooled),
            ("listen_url", state.listen_url or None),
        )
        if value is not None
    }
    if overrides:
        queue.close()
        queue.config = type(queue.config)(**{**queue.config.__dict__, **overrides})
    state.queue = queue
    if state.log_format is None and queue.config.log_format != "text":
        _use_log_format(queue.config.log_format)
    return queue


def one_line(message: str) -> str:
    """`message` as one line without a leading "bgq: " (the CLI adds its own): driver messages
    span lines (psycopg's hints), and procedures and libraries may already say "bgq: "."""
    text = " ".join(message.split())
    while text.lower().startswith("bgq: "):
        text = text[5:]
    return text


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"bgq: {one_line(message)}", err=True)
    raise typer.Exit(code)


def _database_key(url: str | None, data_dir: str | None = None) -> str:
    """Which database a command works on, for its lock name (never printed: it may hold a password)."""
    if url is None:
        return f"embedded:{data_dir or ''}"
    try:
        return normalise_url(url).render_as_string(hide_password=False)
    except BgqError:
        return url


def queue_lock_name(command: str, queue: Queue) -> str:
    """The per-host lock of `command` on this queue: its table, queue name and database."""
    cfg = queue.config
    return lock_name(command, cfg.table_name, cfg.queue, _database_key(cfg.database_url, cfg.data_dir))


def stale_after_option() -> Any:
    return typer.Option(
        "--stale-after",
        envvar="BGQ_STALE_AFTER",
        min=0.0,
        help="A command lock held longer than this many seconds (a hung run) is logged at CRITICAL.",
    )


def metrics_port_option() -> Any:
    return typer.Option(
        "--metrics-port",
        min=1,
        max=65535,
        help="Serve Prometheus /metrics on this port (needs bgq[metrics]); with -c N the workers' "
        "counters are added up (PROMETHEUS_MULTIPROC_DIR).",
    )


def _serve_metrics(queue: Queue, port: int, addr: str = "0.0.0.0") -> Any:
    """Count this process's jobs and serve /metrics on a daemon thread (bgq/metrics.py)."""
    from .. import metrics

    metrics.enable()
    server = metrics.serve(queue, port, addr)
    log.info(f"bgq: serving metrics on http://{addr}:{port}/metrics")
    return server


@contextmanager
def locked(name: str, stale_after: float = STALE_AFTER) -> Iterator[None]:
    """Run the body under the per-host command lock `name`; if another process holds it, say so
    on stderr and exit 0 at once (SPEC B §10: a cron job that overlaps the previous run). A holder
    older than `stale_after` seconds is hung (stopped, stuck in I/O): that is logged at CRITICAL
    with its pid and age, since this host runs nothing of the command until it is gone."""
    lock = command_lock(name)
    try:
        lock.acquire()
    except CommandLockedError as exc:
        age = exc.age
        if age is not None and age > stale_after:
            log.critical(
                f"bgq: {name} has been held by pid {exc.pid} for {age:.0f} s (over {stale_after:g} s): "
                f"that run is hung, and no other starts on this host until it ends (lock file {exc.path})."
            )
        typer.echo(f"bgq: {name} is already running on this host; exiting.", err=True)
        raise typer.Exit(0) from None
    except OSError as exc:
        fail(f"Cannot take the command lock {name} in {locks_dir()}: {exc}")
    try:
        yield
    finally:
        lock.release()


@app.command("install-procs")
def install_procs() -> None:
    """Create the jobs table and install or upgrade bgq's stored procedures (idempotent)."""
    queue = load_queue(required=False)
    if queue is not None:
        cfg = queue.config
        name = lock_name("install-procs", cfg.table_name, _database_key(cfg.database_url, cfg.data_dir))
    else:
        from ..config import TABLE_NAME_RE

        table = state.table or "background_job"
        if not TABLE_NAME_RE.fullmatch(table):
            fail(f"Invalid table name {table!r}.", code=2)
        name = lock_name("install-procs", table, _database_key(state.database_url))
    with locked(name):
        if queue is not None:
            changed, table, where = queue.install(), queue.config.table_name, queue.database.safe_url
        else:
            if state.database_url:
                db = state.database = Database(state.database_url, pooled=bool(state.pooled))
            else:
                from ..db.embedded import embedded_url

                db = state.database = Database(embedded_url())
            changed, where = install(db, table), db.safe_url
        typer.echo(f"{'installed' if changed else 'already up to date'}: table {table} on {where}")


app.command("update-schema", help="Alias of install-procs.")(install_procs)


@app.command()
def sql(
    routine: Annotated[
        str | None, typer.Argument(help="One routine (e.g. claim_batch), `schema` or `migrations/NAME`.")
    ] = None,
    dialect: Annotated[
        str | None,
        typer.Option(
            help="mysql or postgres (default: the dialect of the --app or --database-url database)."
        ),
    ] = None,
    write: Annotated[
        str | None, typer.Option(help="Write one .sql file per part into this directory instead.")
    ] = None,
) -> None:
    """Print the SQL that install-procs installs, rendered for the table (--table, default
    background_job): the schema, the migrations and every procedure, as the server receives them."""
    from ..config import TABLE_NAME_RE
    from ..db import dialect_name
    from ..sql.install import RENDERED_TABLE, rendered_sql

    queue = load_queue(required=False) if dialect is None else None
    table = queue.config.table_name if queue is not None else state.table or RENDERED_TABLE
    if not TABLE_NAME_RE.fullmatch(table):
        fail(f"Invalid table name {table!r}.", code=2)
    if dialect is None:
        url = queue.config.database_url if queue is not None else state.database_url
        if not url:
            fail("Name the dialect: bgq sql --dialect mysql|postgres (or give --app or --database-url).", 2)
        dialect = dialect_name(normalise_url(url).get_backend_name())
    if dialect not in ("mysql", "postgres"):
        fail(f"Unknown dialect {dialect!r}: mysql or postgres.", code=2)
    parts = rendered_sql(dialect, table)
    if routine is not None:
        if routine not in parts:
            fail(f"No routine {routine!r} in bgq's {dialect} SQL (known: {', '.join(parts)}).", code=2)
        parts = {routine: parts[routine]}
    if write is not None:
        from pathlib import Path

        for name, text in parts.items():
            path = Path(write) / f"{name}.sql"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        typer.echo(f"wrote {len(parts)} files to {write}")
        return
    for name, text in parts.items():
        if len(parts) > 1:
            typer.echo(f"-- ==== {name} ({dialect}, table {table}) ====")
        typer.echo(text)


@app.command()
def process(
    max_runtime: Annotated[
        float,
        typer.Option(
            "--max-runtime",
            envvar="BGQ_MAX_RUNTIME",
            min=0.0,
            help="Start no job after this many seconds; the run exits (0: no limit).",
        ),
    ] = MAX_RUNTIME,
    stale_after: Annotated[float, stale_after_option()] = STALE_AFTER,
) -> None:
    """Cron mode: reap stalled jobs, then run every due job once (run it every minute).

    A run stops claiming after --max-runtime seconds (the next run goes on). A run that finds the
    previous one still holding this host's lock exits 0; if that one has held it for longer than
    --stale-after seconds (hung: stopped, stuck in I/O) it also logs CRITICAL with its pid and age.
    A pass in which a claim or a result write failed (the database refused it past the retries)
    exits 1 after saying so on stderr; a job whose callback failed is the job's outcome, not an
    error of the pass.
    """
    queue = app_queue()
    with locked(queue_lock_name("process", queue), stale_after):
        report = queue.process(max_runtime=max_runtime or None)
        done = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "nothing due"
        limit = f"; stopped at --max-runtime {max_runtime:g} s" if report.timed_out else ""
        typer.echo(f"processed: {done}; reaped {report.reaped}{limit}")
    if report.outcomes.get("error"):  # cron's monitoring sees a pass that did not do its work
        typer.echo(
            f"bgq process: {report.outcomes['error']} error(s) in this pass (a claim or a result "
            "write failed; the log says which); exit status 1.",
            err=True,
        )
        raise typer.Exit(1)


@app.command()
def requeue(
    job_ids: Annotated[list[int], typer.Argument(help="Job ids to run again.")],
    reason: Annotated[
        str, typer.Option("--reason", "-r", help="Why; stored in error_message.")
    ] = "manual requeue",
) -> None:
    """Put finished, failed or redundant jobs back to READY (not PROCESSING ones)."""
    queue = app_queue()
    failed = False
    for job_id in job_ids:
        try:
            job = queue.requeue(job_id, reason)
            typer.echo(f"requeued {job.id} (was state {job.state})")
        except (JobNotFoundError, JobStateError) as exc:  # this job's answer; the others go on
            typer.echo(f"bgq: job {job_id}: {one_line(str(exc))}", err=True)
            failed = True
    if failed:
        raise typer.Exit(1)


@app.command()
def consume(
    sub_queue: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", help="Sub-queue of the app's queue.")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", min=0, help="Messages to handle, then exit (0: until stopped).")
    ] = 0,
    priorities: Annotated[
        str | None, typer.Option("--priorities", "-p", help="N, A-B, -B or A- of the configured priorities.")
    ] = None,
    metrics_port: Annotated[int | None, metrics_port_option()] = None,
) -> None:
    """Broker mode: take job ids from RabbitMQ and run them (SIGTERM lets the running job finish)."""
    from ..broker import parse_priorities
    from ..modes.consume import consume as run_consumer
    from ..modes.stopping import GracefulStop

    queue = app_queue()
    chosen = parse_priorities(priorities, queue.config.priorities)
    queue.config.served_queue(sub_queue)  # a sub-queue no callback is in: said before connecting
    with GracefulStop() as stop:  # SIGTERM while the database is reached is a clean stop too
        _ = queue.procs  # reach the database and check the install before taking any message
        if metrics_port is not None:
            _serve_metrics(queue, metrics_port)
        code = run_consumer(queue, sub_queue, jobs, chosen, stop)
    raise typer.Exit(code)


@app.command()
def work(
    sub_queue: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", help="Sub-queue of the app's queue.")
    ] = None,
    priorities: Annotated[
        str | None, typer.Option("--priorities", "-p", help="N, A-B, -B or A- of the configured priorities.")
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-c", min=1, help="Worker processes (each runs one job at a time)."),
    ] = 1,
    batch: Annotated[
        int, typer.Option("--batch", min=1, help="Most jobs one claim takes (it adapts to job duration).")
    ] = 100,
    poll: Annotated[
        float, typer.Option("--poll", min=0.01, help="Longest idle wait between two claims, in seconds.")
    ] = 1.0,
    metrics_port: Annotated[int | None, metrics_port_option()] = None,
) -> None:
    """Continuous database worker: claim due jobs in batches and run them (SIGTERM stops it cleanly)."""
    from ..broker import parse_priorities
    from .supervisor import run_workers

    queue = app_queue()
    chosen = parse_priorities(priorities, queue.config.priorities) if priorities else None
    scratch = None
    if metrics_port is not None:
        if concurrency > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # Every forked worker writes its counters there; this process adds them up.
            scratch = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bgq-metrics-")
        _serve_metrics(queue, metrics_port)
    try:
        code = run_workers(
            lambda: queue, concurrency, sub_queue=sub_queue, priorities=chosen, batch_max=batch, poll=poll
        )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    raise typer.Exit(code)


@app.command("reload-consumers")
def reload_consumers(
    number: Annotated[
        int, typer.Argument(min=1, help="How many consumers to stop (one 'die' message each).")
    ],
    sub_queue: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", help="Sub-queue of the app's queue.")
    ] = None,
) -> None:
    """Send NUMBER 'die' messages: that many consumers exit (0) so the supervisor restarts them."""
    queue = app_queue()
    producer = queue.config.producer
    if producer is None:
        fail(
            "reload-consumers needs a broker: configure the queue with "
            "producer=bgq.broker.rabbitmq.RabbitMQ(...).",
            code=2,
        )
    with locked(queue_lock_name("reload-consumers", queue)):
        for _ in range(number):
            producer.publish_die(queue.config.queue_name(sub_queue))
        typer.echo(f"sent {number} die message(s) to {queue.config.queue_name(sub_queue)}_0")


#: `bgq monitor`'s states in its order: (state, label printed, key of --json).
MONITOR_LINES = (
    (4, "TEMPORARILY_FAILED", "temporarily_failed"),
    (5, "PERMANENTLY_FAILED", "permanently_failed"),
    (2, "PROCESSING > 24h", "processing_over_24h"),
)


def _stamp(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command()
def monitor(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (for machines).")] = False,
    stale_after: Annotated[float, stale_after_option()] = STALE_AFTER,
) -> None:
    """Report stuck jobs: temporarily and permanently failed ones, and jobs running over 24 h;
    and a `bgq process` of this queue on this host that has held its lock for longer than
    --stale-after seconds (hung).

    Logs one record (critical for permanent failures or long runs, else warning) when any count
    is not 0, and one critical record for a hung `bgq process`; the exit code is 0 either way.
    Suggested cron: once a day (or more often, to hear of a hung run sooner).
    """
    queue = app_queue()
    with locked(queue_lock_name("monitor", queue), stale_after):
        holder = process_lock_holder(queue, stale_after)
        if holder is not None and holder["stale"]:
            log.critical(
                f"bgq: bgq process has held this host's lock for {holder['age_s']:.0f} s "
                f"(pid {holder['pid']}, over {stale_after:g} s): it is hung; no job is run or "
                "reaped by cron on this host until it ends."
            )
        report = queue.report_stuck_jobs()
        if as_json:
            payload: dict[str, Any] = {}
            for job_state, _, key in MONITOR_LINES:
                oldest = report[job_state]["oldest_since"]
                payload[key] = {
                    "state": job_state,
                    "count": report[job_state]["count"],
                    "oldest_since": None if oldest is None else oldest.isoformat(),
                }
            payload["paused"] = [
                {
                    "kind": p.kind,
                    "name": p.name,
                    "reason": p.reason,
                    "paused_by": p.paused_by,
                    "paused_at": p.paused_at.isoformat(),
                }  # fmt: skip
                for p in queue.paused()
            ]
            if holder is not None:
                started = holder["started"]
                payload["process_lock"] = {**holder, "started": started and started.isoformat()}
            else:
                payload["process_lock"] = None
            typer.echo(json.dumps(payload))
            return
        for job_state, label, _ in MONITOR_LINES:
            count, oldest = report[job_state]["count"], report[job_state]["oldest_since"]
            since = f" (oldest {_stamp(oldest)})" if count and oldest is not None else ""
            typer.echo(f"{label} ({job_state}): {count}{since}")
        for p in queue.paused():
            typer.echo(
                f"paused {p.kind} {p.name}: since {_stamp(p.paused_at)} by {p.paused_by or '?'}: {p.reason}"
            )
        if holder is not None:
            status = "HUNG" if holder["stale"] else "running"
            age = "?" if holder["age_s"] is None else f"{holder['age_s']:.0f}"
            typer.echo(f"bgq process: {status} for {age} s (pid {holder['pid']})")


def process_lock_holder(queue: Queue, stale_after: float) -> dict[str, Any] | None:
    """Who holds this host's `bgq process` lock of the queue: {pid, started, age_s, stale}, or None."""
    holder = command_lock(queue_lock_name("process", queue)).holder()
    if holder is None:
        return None
    age = holder.age
    return {
        "pid": holder.pid,
        "started": None if holder.started is None else dt.datetime.fromtimestamp(holder.started, dt.UTC),
        "age_s": None if age is None else round(age, 1),
        "stale": age is not None and age > stale_after,
    }


@app.command()
def workers(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON array (for machines).")] = False,
) -> None:
    """List the registered worker processes (`bgq work`, `bgq consume`, `bgq process`) of the queue:
    host, pid, mode, queue, start, last heartbeat, current job, jobs done, version. A worker
    silent for longer than worker_dead_after is marked dead (its jobs are being reaped)."""
    queue = app_queue()
    rows = queue.workers()
    now = dt.datetime.now(dt.UTC)
    dead_after = queue.config.worker_dead_after
    listed = []
    for row in rows:
        age = (now - row.last_heartbeat_at).total_seconds()
        item: dict[str, Any] = dataclasses.asdict(row)
        item["started_at"] = row.started_at.isoformat()
        item["last_heartbeat_at"] = row.last_heartbeat_at.isoformat()
        item["heartbeat_age_s"] = round(age, 1)
        item["dead"] = bool(dead_after) and age > dead_after
        listed.append(item)
    if as_json:
        typer.echo(json.dumps(listed))
        return
    if not listed:
        typer.echo("no workers registered")
        return
    typer.echo("ID\tHOST\tPID\tMODE\tQUEUE\tSTARTED\tHEARTBEAT\tJOB\tDONE\tVERSION")
    for item, row in zip(listed, rows, strict=True):
        beat = f"{item['heartbeat_age_s']:.0f} s ago" + (" DEAD" if item["dead"] else "")
        job = "-" if row.current_job_id is None else str(row.current_job_id)
        typer.echo(
            f"{row.id}\t{row.host}\t{row.pid}\t{row.mode}\t{row.queue}\t{_stamp(row.started_at)}\t"
            f"{beat}\t{job}\t{row.jobs_done}\t{row.version}"
        )


@app.command("metrics")
def metrics_command(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port of /metrics.")] = 9464,
    addr: Annotated[str, typer.Option("--addr", help="Address to listen on.")] = "0.0.0.0",
) -> None:
    """Serve Prometheus /metrics for the queue until SIGTERM: the table read at each scrape, and the
    workers' counters when they share PROMETHEUS_MULTIPROC_DIR with this process (needs bgq[metrics])."""
    from ..modes.stopping import GracefulStop

    queue = app_queue()
    _ = queue.procs  # reach the database and check the install before serving
    server = _serve_metrics(queue, port, addr)
    typer.echo(f"serving metrics on http://{addr}:{port}/metrics", err=True)
    with GracefulStop() as stop:
        while not stop.requested:
            time.sleep(0.2)
    server.shutdown()


@app.command("clear-finished")
def clear_finished(
    days: Annotated[
        int,
        typer.Argument(
            min=0,
            help="Keep jobs created since today 00:00 UTC minus DAYS days; 0 deletes every finished job.",
        ),
    ] = 1,
) -> None:
    """Delete FINISHED jobs of the queue (REDUNDANT and failed jobs stay)."""
    queue = app_queue()
    with locked(queue_lock_name("clear-finished", queue)):
        deleted = queue.clear_finished_jobs(days)
        typer.echo(f"deleted {deleted} finished job(s)")


def _who() -> str:
    """user@host, stored as who paused."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment
        user = "?"
    return f"{user}@{socket.gethostname()}"


@app.command()
def pause(
    queue_name: Annotated[
        str | None, typer.Argument(metavar="[QUEUE]", help="Queue to pause (default: the app's queue).")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="Pause this serial group instead.")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; shown by `bgq monitor`.")] = "",
) -> None:
    """Pause a queue (its sub-queues with it) or a serial group: no worker starts their jobs
    until `bgq resume`; running jobs go on. Without QUEUE or --group, lists what is paused."""
    queue = app_queue()
    if queue_name is None and group is None:
        for p in queue.paused():
            typer.echo(f"{p.kind} {p.name}: paused {_stamp(p.paused_at)} by {p.paused_by or '?'}: {p.reason}")
        return
    if not reason:
        fail("bgq pause needs --reason.", code=2)
    target = _pause_target(queue, queue_name)
    new = queue.pause(reason, group=group, queue=target, by=_who())
    what = f"group {group}" if group else f"queue {target}"
    typer.echo(f"paused {what}" if new else f"{what} was paused already (reason updated)")


def _pause_target(queue: Queue, queue_name: str | None) -> str | None:
    """QUEUE of `bgq pause` / `bgq resume` as a queue name: the app's queue or one of its
    sub-queues by full name, or a sub-queue by its own name, as `bgq work QUEUE` reads it."""
    base = queue.config.queue
    if queue_name is None or queue_name == base or queue_name.startswith(f"{base}_"):
        return queue_name
    return queue.config.queue_name(queue_name)


@app.command()
def resume(
    queue_name: Annotated[str | None, typer.Argument(metavar="[QUEUE]", help="Queue to resume.")] = None,
    group: Annotated[str | None, typer.Option("--group", "-g", help="Resume this serial group.")] = None,
) -> None:
    """Undo `bgq pause`: the queue's or group's jobs run again in (priority, id) order."""
    queue = app_queue()
    if queue_name is None and group is None:
        fail("bgq resume needs QUEUE or --group.", code=2)
    target = _pause_target(queue, queue_name)
    done = queue.resume(group=group, queue=target)
    what = f"group {group}" if group else f"queue {target}"
    typer.echo(f"resumed {what}" if done else f"{what} was not paused")


@app.command()
def cancel(
    job_ids: Annotated[list[int], typer.Argument(help="Job ids to cancel.")],
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; stored in error_message.")] = "",
) -> None:
    """Cancel jobs: one that has not started becomes REDUNDANT (its group moves on); a running
    one is asked to abort (its next heartbeat raises bgq.JobAborted in the callback)."""
    queue = app_queue()
    if not reason:
        fail("bgq cancel needs --reason.", code=2)
    failed = False
    for job_id in job_ids:
        try:
            result = queue.cancel(job_id, reason)
            typer.echo(f"{job_id}: {result.outcome.replace('_', ' ')} (state {result.state})")
        except JobNotFoundError as exc:
            typer.echo(f"bgq: job {job_id}: {one_line(str(exc))}", err=True)
            failed = True
    if failed:
        raise typer.Exit(1)


@app.command()
def schedules(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array (for machines).")] = False,
) -> None:
    """List the schedules: cron, zone, next fire time, last fire and its job (all queues)."""
    queue = app_queue()
    rows = queue.schedules()
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "name": r.name,
                        "cron": r.cron,
                        "timezone": r.timezone,
                        "callback": r.callback_name,
                        "queue": r.queue,
                        "serial_group": r.serial_group,
                        "priority": r.priority,
                        "missed": r.missed,
                        "active": r.active,
                        "next_fire_at": r.next_fire_at and r.next_fire_at.isoformat(),
                        "last_fire_at": r.last_fire_at and r.last_fire_at.isoformat(),
                        "last_job_id": r.last_job_id,
                        "last_job_state": r.last_job_state,
                    }  # fmt: skip
                    for r in rows
                ]
            )
        )
        return
    for r in rows:
        nxt = _stamp(r.next_fire_at) if r.active and r.next_fire_at else "inactive"
        last = (
            f"{_stamp(r.last_fire_at)} job {r.last_job_id} (state {r.last_job_state})"
            if r.last_job_id and r.last_fire_at
            else "never"
        )
        typer.echo(
            f"{r.name}  [{r.cron}] {r.timezone}  {r.callback_name} -> {r.queue}  next: {nxt}  last: {last}"
        )


@app.command()
def demo(
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            help="Run through RabbitMQ with two consumers, e.g. amqp://guest:guest@127.0.0.1:5672/ "
            "(a cluster: its nodes' URLs separated by spaces).",
        ),
    ] = None,
) -> None:
    """Run the canonical serial-group demo (a1 b1 c2 d1 e1 f2 g1 -> a b d e g c f).

    Uses --database-url / BGQ_DATABASE_URL if set, else an embedded PostgreSQL.
    """
    from .demo import EXPECTED, run_demo

    if state.database_url:
        state.database = Database(state.database_url)
    ran = run_demo(state.database_url, broker)
    if ran != EXPECTED:
        fail(f"unexpected order {ran!r}")


@app.command()
def web(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="No credentials: accepted on a loopback address only.")
    ] = False,
    user: Annotated[
        str | None, typer.Option("--user", envvar="BGQ_WEB_USER", help="Admin user (HTTP basic).")
    ] = None,
    password: Annotated[
        str | None, typer.Option("--password", envvar="BGQ_WEB_PASSWORD", help="Admin password.")
    ] = None,
    readonly_user: Annotated[
        str | None, typer.Option("--readonly-user", envvar="BGQ_WEB_READONLY_USER", help="Read-only user.")
    ] = None,
    readonly_password: Annotated[
        str | None,
        typer.Option("--readonly-password", envvar="BGQ_WEB_READONLY_PASSWORD", help="Read-only password."),
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", envvar="BGQ_WEB_TOKEN", help="Bearer token (acts as admin).")
    ] = None,
    demo: Annotated[
        bool, typer.Option("--demo", help="Fill a demo table with jobs in every state, and show it.")
    ] = False,
    read_url: Annotated[
        str | None,
        typer.Option(
            "--read-url",
            envvar="BGQ_WEB_READ_URL",
            help="A standby's URL: the pages read there, the actions go to the primary (the app's or "
            "--database-url's); without either, a read-only console on the standby.",
        ),
    ] = None,
) -> None:
    """The operator console (pip install 'bgq[web]'): overview, jobs, serial groups, failures.

    Shows --app's table, else --database-url/--table's; --demo uses its own table (embedded
    PostgreSQL when no database is given). --read-url reads from a streaming standby instead
    (a banner says so). Refuses to start without credentials unless bound to loopback with
    --no-auth.
    """
    try:
        from ..web.auth import Credentials
        from ..web.serve import check_open, serve
    except ImportError as exc:
        fail(f"bgq web needs the web extra: pip install 'bgq[web]' ({exc})")
    env = {"BGQ_WEB_USER": user or "", "BGQ_WEB_PASSWORD": password or "",
           "BGQ_WEB_READONLY_USER": readonly_user or "", "BGQ_WEB_READONLY_PASSWORD": readonly_password or "",
           "BGQ_WEB_TOKEN": token or ""}  # fmt: skip
    credentials = Credentials.from_env(env)
    check_open(host, credentials, no_auth)  # before touching any database
    # --read-url with no other database (no --app, --database-url or --demo): the standby alone.
    standby_alone = bool(read_url) and not demo and state.app_path is None and not state.database_url
    table = {"table_name": state.table} if state.table else {}
    read_queue: Queue | None = None
    if demo:
        from ..web.demo import demo_queue, seed

        queue = demo_queue(state.database_url)
        seed(queue)
    elif standby_alone:
        queue = Queue(callbacks={"_console": lambda: None}, database_url=read_url, **table)
    else:
        loaded = load_queue(required=False)
        queue = loaded or Queue(
            callbacks={"_console": lambda: None},  # the console runs no callback
            database_url=state.database_url,
            **table,
        )
    if read_url and not standby_alone:
        read_queue = Queue(
            callbacks={"_console": lambda: None}, database_url=read_url, table_name=queue.config.table_name
        )
        _ = read_queue.procs  # the standby has the table and the procedures (replicated)
    state.queue = queue
    _ = queue.procs  # reach the database and check the install before serving
    where = f", reading from {(read_queue or queue).database.safe_url}" if read_url else ""
    typer.echo(f"bgq web: http://{host}:{port}/ (table {queue.config.table_name}{where}"
               f"{', read-only' if standby_alone else ''})")  # fmt: skip
    serve(queue, host, port, credentials, no_auth, read_queue=read_queue, read_only=standby_alone)


def main() -> None:
    app()
