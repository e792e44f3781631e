"""A worker process for the concurrency tests: runs jobs whose callback logs start/end to a ledger table."""

from __future__ import annotations

import random
import time
from typing import Any

import sqlalchemy as sa

from bgq import Queue

_ledger: dict[str, Any] = {}


def create_ledger(url: str, ledger: str) -> None:
    """The ledger table: one row per start/end event, `seq` in commit order (`at`: time.time(),
    written by tests/support/work_app.py's callbacks)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(
                f"CREATE TABLE {ledger} (seq BIGSERIAL PRIMARY KEY, token VARCHAR(64), grp VARCHAR(64), "
                "event VARCHAR(8), pid INT, at DOUBLE PRECISION)"
            )
        else:
            conn.exec_driver_sql(
                f"CREATE TABLE {ledger} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, token VARCHAR(64), "
                "grp VARCHAR(64), event VARCHAR(8), pid INT, at DOUBLE) ENGINE=InnoDB"
            )
    engine.dispose()


def drop_ledger(url: str, ledger: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {ledger}")
    engine.dispose()


def read_ledger(url: str, ledger: str) -> list[tuple[int, str, str | None, str]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT seq, token, grp, event FROM {ledger} ORDER BY seq").all()
    engine.dispose()
    return [tuple(r) for r in rows]


def _write(event: str, token: str, grp: str | None) -> None:
    import os

    with _ledger["engine"].begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO {_ledger['table']} (token, grp, event, pid) VALUES (%s, %s, %s, %s)",
            (token, grp, event, os.getpid()),
        )


def ledger_job(token: str, grp: str | None = None) -> None:
    slow_ledger_job(token, grp, random.uniform(0, 0.003))


def _queue(url: str, table: str, ledger: str) -> Queue:
    _ledger["engine"] = sa.create_engine(url)
    _ledger["table"] = ledger
    return Queue(
        callbacks={"ledger": ledger_job},
        database_url=url,
        table_name=table,
        queue="general",
        priorities=[1, 2, 3],
        stalled_job_timeout=0,
    )


def run_until_done(url: str, table: str, ledger: str, seed: int, seconds: float) -> None:
    """Call process_job on every unfinished job, in random order, until none is left."""
    random.seed(seed)
    queue = _queue(url, table, ledger)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with queue.database.engine.connect() as conn:
            pending = [
                r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {table} WHERE state NOT IN (3, 5, 7)")
            ]
        if not pending:
            break
        random.shuffle(pending)
        for job_id in pending[:40]:
            queue.process_job(job_id)
    queue.close()


def race_one(url: str, table: str, ledger: str, job_ids: list[int], barrier: Any, results: Any) -> None:
    """For each id: wait for the other racer, then both call process_job on the same id at once."""
    queue = _queue(url, table, ledger)
    for job_id in job_ids:
        barrier.wait(timeout=60)
        results.put((job_id, queue.process_job(job_id)))
    queue.close()


def slow_ledger_job(token: str, grp: str | None = None, seconds: float = 0.0) -> None:
    _write("start", token, grp)
    time.sleep(seconds)  # real: the job's run time in a real worker process, which others overlap
    _write("end", token, grp)


def slow_once_job(token: str, grp: str | None = None, seconds: float = 30.0) -> None:
    """Slow on its first run only (a rerun finds its earlier 'start'): the job a test kills."""
    with _ledger["engine"].connect() as conn:
        ran_before = conn.exec_driver_sql(
            f"SELECT COUNT(*) FROM {_ledger['table']} WHERE token = %s AND event = 'start'", (token,)
        ).scalar_one()
    slow_ledger_job(token, grp, 0.001 if ran_before else seconds)


def consume_ledger(
    url: str, table: str, ledger: str, amqp_url: str, base_queue: str, jobs: int = 0, stalled: int = 0,
    backoff: int | None = None,
) -> None:  # fmt: skip
    """A `bgq consume` worker process: SIGTERM stops it after the running job; 'die' stops it.
    `stalled`: its stalled_job_timeout (0: its reaper is off); `backoff`: its stalled_job_backoff
    (None: the default, a minute or more before a reaped job runs again)."""
    from bgq.broker.rabbitmq import RabbitMQ
    from bgq.modes.consume import GracefulStop, consume

    _ledger["engine"] = sa.create_engine(url)
    _ledger["table"] = ledger
    queue = Queue(
        callbacks={"ledger": ledger_job, "slow": slow_ledger_job, "slow_once": slow_once_job},
        database_url=url,
        table_name=table,
        queue=base_queue,
        priorities=[1, 2, 3],
        producer=RabbitMQ(amqp_url),
        stalled_job_timeout=stalled,
        stalled_job_backoff=backoff,
    )
    with GracefulStop() as stop:
        code = consume(queue, None, jobs, [1, 2, 3], stop)
    queue.close()
    raise SystemExit(code)
