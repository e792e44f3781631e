"""Shared test tools: jobs and rows by hand, one-transaction procedure calls, held transactions, names."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection

from bgq.model import ClaimResult, FinishResult, NewJob
from bgq.sql.calls import Procs

UTC = dt.UTC
#: The clock of every time-dependent test (far from the server's clock, with microseconds).
T0 = dt.datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
QUEUE = "general"
PID = 4242
WAITING_MS = 1500

# Generated on MySQL (running_group, pending_group, ungrouped_priority): never written by hand.
_JSON_COLUMNS = ("parameters_json", "metadata", "memory")
_TIME_COLUMNS = ("created_at", "last_attempt_at", "finished_at", "updated_at")


def at(seconds: float) -> dt.datetime:
    """T0 plus `seconds`."""
    return T0 + dt.timedelta(seconds=seconds)


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """A timestamp read back from either dialect as an aware UTC datetime (MySQL gives naive UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def procs(installed: Any) -> Procs:
    return Procs(installed.db, installed.table)


def new_job(
    installed: Any,
    *,
    queue: str = QUEUE,
    priority: int = 1,
    group: str | None = None,
    threshold: int | None = None,
    identifier: str | None = None,
    mode: str = "normal",
    postponed_by: int | None = None,
    broker: bool = False,
    callback: str = "cb",
    parameters_json: str | None = "[1, 2]",
) -> int:
    """Insert one READY job through Procs.insert (as publish does) and return its id."""
    job = NewJob(
        queue=queue,
        priority=priority,
        callback_name=callback,
        parameters_json=parameters_json,
        parameters=None,
        serial_group=group,
        coalesce_threshold=threshold,
        identifier=identifier,
        mode=mode,
        postponed_by=postponed_by,
        processed_by_broker=broker,
    )
    with installed.db.transaction() as conn:
        return procs(installed).insert(conn, job)


#: MySQL's generated columns (never set by hand, left out of `row`).
_GENERATED = ("running_group", "pending_group", "ungrouped_priority", "grouped_priority")


def set_row(installed: Any, job_id: int, **columns: Any) -> None:
    """Set columns of a job by raw SQL (a state set by hand); never the MySQL generated columns."""
    assert not set(_GENERATED) & columns.keys()
    assignments = ", ".join(f"{name} = %s" for name in columns)
    installed.sql(f"UPDATE {{t}} SET {assignments} WHERE id = %s", (*columns.values(), job_id))


def row(installed: Any, job_id: int) -> dict[str, Any] | None:
    """The job's row, the same on both dialects: UTC-aware timestamps, parsed JSON, no generated columns."""
    rows = installed.sql("SELECT * FROM {t} WHERE id = %s", (job_id,))
    if not rows:
        return None
    out = {k: v for k, v in rows[0].items() if k not in _GENERATED}
    for name in _TIME_COLUMNS:
        out[name] = utc(out[name])
    for name in _JSON_COLUMNS:
        if isinstance(out[name], (str, bytes)):
            out[name] = json.loads(out[name])
    return out


def state(installed: Any, job_id: int) -> int | None:
    found = row(installed, job_id)
    return None if found is None else found["state"]


def states(installed: Any, *job_ids: int) -> list[int | None]:
    return [state(installed, job_id) for job_id in job_ids]


def group_row(installed: Any, group: str) -> dict[str, Any] | None:
    rows = installed.sql("SELECT * FROM {t}_group WHERE serial_group = %s", (group,))
    return rows[0] if rows else None


def processing_count(installed: Any, group: str) -> int:
    rows = installed.sql("SELECT COUNT(*) AS n FROM {t} WHERE serial_group = %s AND state = 2", (group,))
    return int(rows[0]["n"])


def claim(
    installed: Any,
    job_id: int,
    *,
    queue: str = QUEUE,
    pid: int = PID,
    waiting_ms: int = WAITING_MS,
    metadata: str | None = None,
    now: dt.datetime = T0,
    conn: Connection | None = None,
    worker_id: int | None = None,
) -> ClaimResult:
    """One claim in one transaction of its own (or on `conn`, whose transaction the caller owns)."""
    args = (job_id, queue, pid, waiting_ms, metadata, now)
    if conn is not None:
        return procs(installed).claim(conn, *args, worker_id=worker_id)
    with installed.db.transaction() as own:
        return procs(installed).claim(own, *args, worker_id=worker_id)


def claimed(installed: Any, job_id: int, **kwargs: Any) -> int:
    """Claim a job that must be claimable and return its attempt token."""
    result = claim(installed, job_id, **kwargs)
    assert result.outcome == "claimed", result
    assert result.attempt is not None
    return result.attempt


def finish(
    installed: Any,
    job_id: int,
    attempt: int,
    job_state: int = 3,
    *,
    error: str | None = None,
    postponed_by: int | None = None,
    execution_time: int | None = None,
    memory: str | None = None,
    clone_delay_ms: int | None = None,
    now: dt.datetime = T0,
) -> FinishResult:
    with installed.db.transaction() as conn:
        return procs(installed).finish(
            conn, job_id, attempt, job_state, error, postponed_by, execution_time, memory, now,
            clone_delay_ms=clone_delay_ms,
        )  # fmt: skip


@contextmanager
def held_transaction(installed: Any) -> Iterator[Connection]:
    """A transaction on a connection of its own, left open until the caller commits it.

    Whatever the test does, the transaction is rolled back (if still open) and the connection
    closed on the way out, so no lock outlives the test.
    """
    conn = installed.db.engine.connect()
    conn.begin()
    try:
        yield conn
    finally:
        if conn.in_transaction():
            conn.rollback()
        conn.close()


@contextmanager
def background() -> Iterator[Callable[..., Future[Any]]]:
    """Run callables on threads: `with background() as run: future = run(fn, *args)`."""
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        yield pool.submit
    finally:
        pool.shutdown(wait=True)


def wait_for_lock_wait(installed: Any, timeout: float = 10.0) -> None:
    """Poll until some session waits for a lock in a statement on this test's table.

    Polling, not sleeping: it returns as soon as the other thread is blocked. InnoDB refreshes
    its INFORMATION_SCHEMA transaction tables only after they were left unread for 0.1 s, so on
    MySQL/MariaDB the poll interval is longer than that.
    """
    if installed.db.dialect.name == "mysql":
        query = (
            "SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX "
            "WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE %s"
        )
        interval = 0.15
    else:
        query = "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
        interval = 0.01
    pattern = f"%{installed.table}%"
    wait_until(
        lambda: int(installed.sql(query, (pattern,))[0]["n"]) > 0,
        f"a session waiting for a lock on {installed.table}",
        timeout,
        step=interval,
    )


def wait_session_gone(installed: Any, session: int, timeout: float = 10.0) -> None:
    """Poll until the server has closed `session` (e.g. it cut a transaction left idle)."""
    query = (
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = %s"
        if installed.db.dialect.name == "mysql"
        else "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = %s"
    )
    wait_until(
        lambda: int(installed.sql(query, (session,))[0]["n"]) == 0, f"session {session} closed", timeout, 0.05
    )


def run_together(*calls: Callable[[], Any]) -> list[Any]:
    """Start the calls on threads at the same instant (a barrier) and return their results in order."""
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait(timeout=10)
        return call()

    with background() as run:
        futures = [run(start, call) for call in calls]
        return [future.result(timeout=60) for future in futures]


def blocked_or_done(installed: Any, future: Future[Any], timeout: float = 10.0) -> bool:
    """Poll until `future` is done (False) or some session waits for a lock on this table (True)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if future.done():
            return False
        try:
            wait_for_lock_wait(installed, timeout=0.2)
            return True
        except AssertionError:
            continue
    raise AssertionError(f"neither done nor blocked within {timeout} s")


@contextmanager
def old_snapshot(installed: Any) -> Iterator[None]:
    """Hold a REPEATABLE READ snapshot open, as a long report or a backup does.

    Old row versions are then kept (MySQL does not purge the delete-marked index entries of
    rows changed after the snapshot), which makes the index state of a busy server reproducible.
    """
    conn = installed.db.engine.connect().execution_options(isolation_level="REPEATABLE READ")
    conn.begin()
    conn.exec_driver_sql(f"SELECT COUNT(*) FROM {installed.table}").all()
    try:
        yield
    finally:
        conn.rollback()
        conn.close()


def claim_batch(
    installed: Any,
    limit: int | None = 10,
    *,
    queue: str = QUEUE,
    pid: int = PID,
    min_priority: int | None = None,
    max_priority: int | None = None,
    waiting_ms: int = WAITING_MS,
    now: dt.datetime = T0,
    conn: Connection | None = None,
    max_heads: int | None = None,
    worker_id: int | None = None,
) -> list[Any]:
    """One claim_batch (a list of bgq.sql.calls.Claimed) in a transaction of its own (or on `conn`)."""
    args = (queue, limit, pid, min_priority, max_priority, waiting_ms, now)
    options = {"max_heads": max_heads, "worker_id": worker_id}
    if conn is not None:
        return procs(installed).claim_batch(conn, *args, **options)
    with installed.db.transaction() as own:
        return procs(installed).claim_batch(own, *args, **options)


def hand_off(
    installed: Any,
    group: str | list[str] | None,
    results: list[Any] | None = None,
    *,
    queue: str = QUEUE,
    pid: int = PID,
    min_priority: int | None = None,
    max_priority: int | None = None,
    waiting_ms: int = WAITING_MS,
    now: dt.datetime = T0,
    conn: Connection | None = None,
    worker_id: int | None = None,
) -> tuple[dict[int, bool], list[Any]]:
    """One hand_off (bgq.sql.calls.JobResult objects written, then the head of `group`, or of each
    group of a list, claimed) in a transaction of its own (or on `conn`): ({id: written}, the
    claimed heads in (priority, id) order). None passes no groups at all (an error)."""
    groups = [group] if isinstance(group, str) else group
    args = (results or [], groups, queue, pid, min_priority, max_priority, waiting_ms, now)
    if conn is not None:
        return procs(installed).hand_off(conn, *args, worker_id=worker_id)
    with installed.db.transaction() as own:
        return procs(installed).hand_off(own, *args, worker_id=worker_id)


def finish_batch(
    installed: Any, results: list[Any], *, now: dt.datetime = T0, conn: Connection | None = None
) -> dict[int, bool]:
    """One finish_batch of bgq.sql.calls.JobResult objects in a transaction of its own (or on `conn`)."""
    if conn is not None:
        return procs(installed).finish_batch(conn, results, now)
    with installed.db.transaction() as own:
        return procs(installed).finish_batch(own, results, now)


def unique_name(prefix: str = "bgqt") -> str:
    """A table (or queue) name no other test, worker process or xdist worker uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def state_of(installed: Any, job_id: int) -> int | None:
    """The job's state, read by raw SQL; None when the row is gone."""
    rows = installed.sql("SELECT state FROM {t} WHERE id = %s", (job_id,))
    return rows[0]["state"] if rows else None


def count_rows(installed: Any) -> int:
    return int(installed.sql("SELECT COUNT(*) AS n FROM {t}")[0]["n"])


def json_column(value: Any) -> Any:
    """A JSON column as Python: psycopg parses json columns, pymysql returns text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def session_id(conn: Connection) -> int:
    """The server's id of the connection's session (to kill it, or find it in the process list)."""
    mysql = conn.dialect.name == "mysql"
    return int(
        conn.exec_driver_sql("SELECT CONNECTION_ID()" if mysql else "SELECT pg_backend_pid()").scalar_one()
    )


def lock_timeout_setting(installed: Any, conn: Connection) -> Any:
    """The session's lock wait limit as the server reports it (MySQL: seconds; PostgreSQL: text)."""
    if installed.db.dialect.name == "mysql":
        return conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar_one()
    return conn.exec_driver_sql("SHOW lock_timeout").scalar_one()


@contextmanager
def host_lock(name: str) -> Iterator[None]:
    """Hold an exclusive flock on `<tmp>/bgq-tests-<name>.lock` for the block: tests that share a
    fixed-name resource (`bgq demo`'s table and broker queues) run one at a time on this host,
    across xdist workers and separate pytest runs alike. The kernel drops it if the holder dies."""
    path = Path(tempfile.gettempdir()) / f"bgq-tests-{name}.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fail_first_follow_up(queue: Any, monkeypatch: Any) -> list[int]:
    """Make the queue's first follow-up (Executor.after_finish) raise once written, the others
    run as usual; the job ids every follow-up was called for, in order."""
    after_finish, calls = queue.executor.after_finish, []

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == 1:
            raise RuntimeError("a follow-up failed")
        return after_finish(*args, **kwargs)

    monkeypatch.setattr(queue.executor, "after_finish", failing_once)
    return calls


def wait_state_left(installed: Any, job_id: int, state: int, what: str, timeout: float) -> None:
    """Poll until the job's row is no longer in `state` (AssertionError naming `what` after
    `timeout` seconds)."""
    wait_until(lambda: state_of(installed, job_id) != state, what, timeout, step=0.1)


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 10.0, step: float = 0.02) -> Any:
    """Poll `predicate` until it returns something true, and return that; AssertionError naming
    `what` after `timeout` seconds. The one wait-until helper of the suite: a test that waits for
    another thread, process or the server waits for the condition itself, never a fixed time."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(step)  # real: the poll interval while another thread, process or the server works
    return value


#: Seconds one write of results takes in the backpressure tests (slower than their jobs).
SLOW_WRITE = 0.05


def slow_write() -> None:
    """A database write slower than the jobs (a loaded server), for the backpressure tests."""
    time.sleep(SLOW_WRITE)  # real: the worker's threads must see a slow commit, as on a loaded server
