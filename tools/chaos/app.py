"""The application the chaos workers load: `bgq --app tools.chaos.app:queue work|process|consume`.

Configured by environment variables the harness sets for each run:
  BGQ_CHAOS_URL      the run's database (SQLAlchemy URL)
  BGQ_CHAOS_TABLE    the jobs table
  BGQ_CHAOS_QUEUE    the base queue name (broker mode: the RabbitMQ queue prefix too)
  BGQ_CHAOS_LEDGER   the ledger directory: one append-only file per worker process
  BGQ_CHAOS_STALLED  stalled_job_timeout in seconds (default 8)
  BGQ_CHAOS_LOST     lost_message_timeout in seconds (broker mode)
  BGQ_CHAOS_BACKOFF  stalled_job_backoff in seconds (default 0: a reaped job may run again at once)
  BGQ_CHAOS_AMQP     if set, broker mode on this AMQP URL (a cluster: several, separated by spaces)
  BGQ_CHAOS_QUEUE_TYPE  broker mode: "quorum" declares every queue a quorum queue (default: classic)
  BGQ_CHAOS_LISTEN_URL  the queue's listen_url: a direct URL for idle workers' LISTEN (when
                     BGQ_CHAOS_URL leads to a pooler)
  BGQ_CHAOS_POOLED   1: the queue's pooled option (BGQ_CHAOS_URL leads to a transaction pooler)

The one callback, `chaos(token, group, sleep_ms)`, appends `token start pid monotonic_ns wall` to its
process's ledger file, sleeps, and appends the same line with `end`. Each line is one write(2) on an
O_APPEND descriptor, so a line is never torn by a concurrent writer and is on the file (in the page
cache) as soon as the call returns: a SIGKILL right after loses nothing. The ledger never touches
bgq's table or database.
"""

from __future__ import annotations

import os
import time

from bgq import Queue

_files: dict[int, int] = {}


def _fd() -> int:
    """This process's ledger file (a forked `bgq work -c N` child opens its own)."""
    pid = os.getpid()
    fd = _files.get(pid)
    if fd is None:
        path = os.path.join(os.environ["BGQ_CHAOS_LEDGER"], f"{pid}-{time.monotonic_ns()}.ledger")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _files[pid] = fd
    return fd


def write(token: int, event: str) -> None:
    line = f"{token} {event} {os.getpid()} {time.monotonic_ns()} {time.time():.6f}\n"
    os.write(_fd(), line.encode())


def chaos(token: int, group: str | None = None, sleep_ms: float = 3.0) -> None:
    """A job of the harness: start, a few ms of work, end."""
    write(token, "start")
    time.sleep(sleep_ms / 1000.0)
    write(token, "end")


def queue() -> Queue:
    """The factory `--app tools.chaos.app:queue` calls."""
    producer = None
    amqp = os.environ.get("BGQ_CHAOS_AMQP")
    if amqp:
        from bgq.broker.rabbitmq import RabbitMQ

        producer = RabbitMQ(amqp, queue_type=os.environ.get("BGQ_CHAOS_QUEUE_TYPE") or None)
    return Queue(
        callbacks={"chaos": chaos},
        database_url=os.environ["BGQ_CHAOS_URL"],
        table_name=os.environ.get("BGQ_CHAOS_TABLE", "chaos_job"),
        queue=os.environ["BGQ_CHAOS_QUEUE"],
        priorities=[1, 2, 3],
        bulk_size=500,
        stalled_job_timeout=int(os.environ.get("BGQ_CHAOS_STALLED", "8")),
        # A frozen session is cut after 2 s idle in its transaction, and nobody waits longer than
        # that for its locks: well under stalled_job_timeout, so a result that a frozen peer held
        # up still lands before the reaper takes its job.
        lock_timeout=2,
        # A reaped job may run again at once (the default waits the retry backoff, a minute),
        # so a run's tail after a kill is the stall timeout plus the reaper's interval.
        stalled_job_backoff=int(os.environ.get("BGQ_CHAOS_BACKOFF", "0")),
        heartbeat_interval=1,
        lost_message_timeout=int(os.environ.get("BGQ_CHAOS_LOST", "8")),
        producer=producer,
        pooled=os.environ.get("BGQ_CHAOS_POOLED", "") == "1",
        listen_url=os.environ.get("BGQ_CHAOS_LISTEN_URL") or None,
    )
