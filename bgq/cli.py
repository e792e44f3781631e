"""The `bgq` command line (typer): install-procs, process, consume, monitor, clear-finished, requeue, demo."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from .cmdlock import CommandLockedError, command_lock, lock_name, locks_dir
from .db import Database, normalise_url
from .errors import BgqError
from .install import install
from .queue import Queue

app = typer.Typer(
    help="bgq: a durable background-job queue on MySQL/MariaDB or PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class State:
    app_path: str | None = None
    database_url: str | None = None
    table: str | None = None


state = State()


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
    table: Annotated[str | None, typer.Option("--table", help="Jobs table when no --app is given.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    state.app_path, state.database_url, state.table = app_path, database_url, table


def load_queue(required: bool = True) -> Queue | None:
    """Import the application's queue named by --app / BGQ_APP."""
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
        queue = target() if callable(target) and not isinstance(target, Queue) else target
    except (ImportError, AttributeError, BgqError) as exc:
        fail(f"Cannot load {state.app_path!r}: {exc}", code=2)
    if not isinstance(queue, Queue):
        fail(f"{state.app_path!r} is not a bgq.Queue (got {type(queue).__name__}).", code=2)
    if state.database_url:
        queue.close()
        queue.config = type(queue.config)(**{**queue.config.__dict__, "database_url": state.database_url})
    return queue


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"bgq: {message}", err=True)
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


@contextmanager
def locked(name: str) -> Iterator[None]:
    """Run the body under the per-host command lock `name`; if another process holds it, say so
    on stderr and exit 0 at once (SPEC B §10: a cron job that overlaps the previous run)."""
    lock = command_lock(name)
    try:
        lock.acquire()
    except CommandLockedError:
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
        from .config import TABLE_NAME_RE

        table = state.table or "background_job"
        if not TABLE_NAME_RE.fullmatch(table):
            fail(f"Invalid table name {table!r}.", code=2)
        name = lock_name("install-procs", table, _database_key(state.database_url))
    with locked(name):
        try:
            if queue is not None:
                changed, table, where = queue.install(), queue.config.table_name, queue.database.safe_url
            else:
                if state.database_url:
                    db = Database(state.database_url)
                else:
                    from .embedded import embedded_url

                    db = Database(embedded_url())
                changed, where = install(db, table), db.safe_url
        except BgqError as exc:
            fail(str(exc))
        typer.echo(f"{'installed' if changed else 'already up to date'}: table {table} on {where}")


app.command("update-schema", help="Alias of install-procs.")(install_procs)


@app.command()
def process() -> None:
    """Cron mode: reap stalled jobs, then run every due job once (run it every minute)."""
    queue = load_queue()
    assert queue is not None
    with locked(queue_lock_name("process", queue)):
        try:
            report = queue.process()
        except BgqError as exc:
            fail(str(exc))
        done = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "nothing due"
        typer.echo(f"processed: {done}; reaped {report.reaped}")


@app.command()
def requeue(
    job_ids: Annotated[list[int], typer.Argument(help="Job ids to run again.")],
    reason: Annotated[
        str, typer.Option("--reason", "-r", help="Why; stored in error_message.")
    ] = "manual requeue",
) -> None:
    """Put finished, failed or redundant jobs back to READY (not PROCESSING ones)."""
    queue = load_queue()
    assert queue is not None
    failed = False
    for job_id in job_ids:
        try:
            job = queue.requeue(job_id, reason)
            typer.echo(f"requeued {job.id} (was state {job.state})")
        except BgqError as exc:
            typer.echo(f"bgq: job {job_id}: {exc}", err=True)
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
) -> None:
    """Broker mode: take job ids from RabbitMQ and run them (SIGTERM lets the running job finish)."""
    from .broker import parse_priorities
    from .worker import GracefulStop
    from .worker import consume as run_consumer

    queue = load_queue()
    assert queue is not None
    try:
        chosen = parse_priorities(priorities, queue.config.priorities)
        with GracefulStop() as stop:
            code = run_consumer(queue, sub_queue, jobs, chosen, stop)
    except BgqError as exc:
        fail(str(exc))
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
) -> None:
    """Continuous database worker: claim due jobs in batches and run them (SIGTERM stops it cleanly)."""
    from .broker import parse_priorities
    from .supervisor import run_workers

    queue = load_queue()
    assert queue is not None
    try:
        chosen = parse_priorities(priorities, queue.config.priorities) if priorities else None
        code = run_workers(
            lambda: queue, concurrency, sub_queue=sub_queue, priorities=chosen, batch_max=batch, poll=poll
        )
    except BgqError as exc:
        fail(str(exc))
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
    queue = load_queue()
    assert queue is not None
    producer = queue.config.producer
    if producer is None:
        fail(
            "reload-consumers needs a broker: configure the queue with "
            "producer=bgq.broker.rabbitmq.RabbitMQ(...).",
            code=2,
        )
    with locked(queue_lock_name("reload-consumers", queue)):
        try:
            for _ in range(number):
                producer.publish_die(queue.config.queue_name(sub_queue))
        except BgqError as exc:
            fail(str(exc))
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
) -> None:
    """Report stuck jobs: temporarily and permanently failed ones, and jobs running over 24 h.

    Logs one record (critical for permanent failures or long runs, else warning) when any count
    is not 0; the exit code is 0 either way. Suggested cron: once a day.
    """
    queue = load_queue()
    assert queue is not None
    with locked(queue_lock_name("monitor", queue)):
        try:
            report = queue.report_stuck_jobs()
        except BgqError as exc:
            fail(str(exc))
        if as_json:
            payload = {}
            for job_state, _, key in MONITOR_LINES:
                oldest = report[job_state]["oldest_since"]
                payload[key] = {
                    "state": job_state,
                    "count": report[job_state]["count"],
                    "oldest_since": None if oldest is None else oldest.isoformat(),
                }
            typer.echo(json.dumps(payload))
            return
        for job_state, label, _ in MONITOR_LINES:
            count, oldest = report[job_state]["count"], report[job_state]["oldest_since"]
            since = f" (oldest {_stamp(oldest)})" if count and oldest is not None else ""
            typer.echo(f"{label} ({job_state}): {count}{since}")


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
    queue = load_queue()
    assert queue is not None
    with locked(queue_lock_name("clear-finished", queue)):
        try:
            deleted = queue.clear_finished_jobs(days)
        except BgqError as exc:
            fail(str(exc))
        typer.echo(f"deleted {deleted} finished job(s)")


@app.command()
def demo(
    broker: Annotated[
        str | None,
        typer.Option(
            "--broker",
            help="Run through RabbitMQ with two consumers, e.g. amqp://guest:guest@127.0.0.1:5672/",
        ),
    ] = None,
) -> None:
    """Run the canonical serial-group demo (a1 b1 c2 d1 e1 f2 g1 -> a b d e g c f).

    Uses --database-url / BGQ_DATABASE_URL if set, else an embedded PostgreSQL.
    """
    from .demo import EXPECTED, run_demo

    try:
        ran = run_demo(state.database_url, broker)
    except BgqError as exc:
        fail(str(exc))
    if ran != EXPECTED:
        fail(f"unexpected order {ran!r}")


def main() -> None:
    app()
