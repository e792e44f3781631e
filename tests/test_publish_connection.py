"""publish()'s own connection (bgq/db/autocommit.py): one INSERT per job, a lost connection replaced
only while it is certain the INSERT was not sent, never an INSERT sent twice."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bgq import ConnectionLostError, DatabaseError, OutcomeUnknownError, Queue
from bgq.db import POOL_SIZE, autocommit
from tests.support.helpers import background, count_rows, held_transaction, wait_session_gone, wait_until

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _kept(queue: Queue) -> Any:
    """The connection publish keeps idle (the one the next publish of this thread takes)."""
    free = queue.store.database.alone._free
    assert free, "publish keeps its connection between calls"
    return free[-1]


def _session(queue: Queue) -> int:
    conn = _kept(queue).conn
    return int(conn.info.backend_pid if queue.store.database.dialect.name == "postgres" else conn.thread_id())


def _kill(installed: Any, dialect: str, session: int) -> None:
    if dialect == "mysql":
        installed.sql(f"KILL {session}")
    else:
        installed.sql("SELECT pg_terminate_backend(%s)", (session,))


def _sessions(installed: Any, dialect: str, session: int) -> int:
    query = (
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = %s"
        if dialect == "mysql"
        else "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = %s"
    )
    return int(installed.sql(query, (session,))[0]["n"])


def _gone(installed: Any, dialect: str, session: int) -> None:
    wait_until(lambda: _sessions(installed, dialect, session) == 0, f"session {session} closed")


def test_publish_keeps_one_connection_for_its_inserts(dialect, installed, make_queue):
    queue = make_queue()
    ids = [queue.publish("noop", [n]) for n in range(3)]
    session = _session(queue)
    ids += [queue.publish("noop", [n]) for n in range(3, 6)]
    assert _session(queue) == session and len(queue.store.database.alone._free) == 1
    assert len(set(ids)) == 6 and count_rows(installed) == 6


def test_a_publish_after_the_server_killed_the_idle_connection_inserts_once(dialect, installed, make_queue):
    queue = make_queue()
    first = queue.publish("noop", [1])
    old = _session(queue)
    _kill(installed, dialect, old)
    _gone(installed, dialect, old)
    second = queue.publish("noop", [2])  # the dead connection is found before the INSERT goes out
    assert second != first and _session(queue) != old
    assert installed.sql("SELECT id FROM {t} ORDER BY id") == [{"id": first}, {"id": second}]


def test_a_silently_lost_idle_connection_is_pinged_and_replaced(dialect, installed, make_queue, monkeypatch):
    """A loss the socket does not show (a partition, a vanished host): after PING_AFTER idle the
    connection is pinged before the INSERT, and replaced when the ping fails."""
    queue = make_queue()
    queue.publish("noop", [1])
    kept, old = _kept(queue), _session(queue)
    kept.poller = type("Silent", (), {"poll": lambda self, timeout: []})()  # the socket shows nothing
    monkeypatch.setattr(autocommit, "PING_AFTER", 0.0)
    _kill(installed, dialect, old)
    _gone(installed, dialect, old)
    queue.publish("noop", [2])
    assert _session(queue) != old and count_rows(installed) == 2


def _hold_table_lock(conn: Any, dialect: str, table: str) -> None:
    """Block every INSERT into `table` until `conn`'s transaction (MySQL: its table lock) ends."""
    if dialect == "mysql":
        conn.exec_driver_sql(f"LOCK TABLES {table} READ")
    else:
        conn.exec_driver_sql(f"LOCK TABLE {table} IN SHARE MODE")


def _insert_waits(installed: Any, dialect: str, session: int) -> bool:
    if dialect == "mysql":
        query = "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE ID = %s AND STATE LIKE %s"
        args: tuple[Any, ...] = (session, "%lock%")
    else:
        query = "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE pid = %s AND wait_event_type = %s"
        args = (session, "Lock")
    return int(installed.sql(query, args)[0]["n"]) == 1


def test_a_connection_lost_while_the_insert_is_in_flight_raises_and_never_inserts_twice(
    dialect, installed, make_queue
):
    """The INSERT went out, then the session died: it may or may not have committed (here it
    did not), so publish raises an OutcomeUnknownError (a ConnectionLostError that is not
    retryable), and sends nothing again."""
    queue = make_queue()
    queue.publish("noop", [0])
    session = _session(queue)
    with held_transaction(installed) as holder, background() as run:
        _hold_table_lock(holder, dialect, installed.table)
        publishing = run(queue.publish, "noop", [1])
        wait_until(lambda: _insert_waits(installed, dialect, session), "the INSERT waits for the lock")
        _kill(installed, dialect, session)
        with pytest.raises(OutcomeUnknownError) as caught:
            publishing.result(timeout=30)
        if dialect == "mysql":
            holder.exec_driver_sql("UNLOCK TABLES")
    assert caught.value.retryable is False
    assert "may or may not have been committed" in str(caught.value)
    wait_session_gone(installed, session)  # the killed INSERT can no longer land late
    assert installed.sql("SELECT parameters_json FROM {t} ORDER BY id") == [
        {"parameters_json": [0] if dialect == "postgres" else "[0]"}
    ]
    queue.publish("noop", [2])  # the next publish opens a new connection
    assert _session(queue) != session and count_rows(installed) == 2


def test_a_connection_lost_while_a_bulk_batch_is_in_flight_raises_at_end_bulk(dialect, installed, make_queue):
    """A bulk's batch was sent (its outcome is read later), then its session died while the
    INSERT waited for a lock: end_bulk raises an OutcomeUnknownError, the ids of the batches
    before it stay, and the next publish opens a new connection."""
    queue = make_queue(bulk_size=2, lock_timeout=30)
    queue.publish("noop", ["alone"])
    session = _session(queue)
    with held_transaction(installed) as holder:
        queue.start_bulk()
        for n in range(2):
            queue.publish("noop", [n])
        wait_until(lambda: count_rows(installed) == 3, "the first batch committed")
        _hold_table_lock(holder, dialect, installed.table)
        for n in range(2, 4):
            queue.publish("noop", [n])  # the second batch goes out, and waits for the lock
        wait_until(lambda: _insert_waits(installed, dialect, session), "the INSERT waits for the lock")
        _kill(installed, dialect, session)
        with pytest.raises(OutcomeUnknownError):
            queue.end_bulk()
        if dialect == "mysql":
            holder.exec_driver_sql("UNLOCK TABLES")
    assert count_rows(installed) == 3
    assert isinstance(queue.publish("noop", ["after"]), int)
    assert _session(queue) != session and count_rows(installed) == 4


def test_a_statement_error_keeps_the_connection(dialect, installed, make_queue):
    """A statement the server refuses (here: the state CHECK) commits nothing and leaves the
    connection usable: the error is the translated one, not a lost connection, and the
    connection stays kept."""
    queue = make_queue()
    queue.publish("noop", [1])
    session = _session(queue)
    columns = "queue, priority, callback_name, state, created_at, updated_at"
    with pytest.raises(DatabaseError) as caught:
        queue.store.database.execute_alone(
            f"INSERT INTO {installed.table} ({columns}) VALUES ('q', 1, 'noop', 99, %s, %s)", (NOW, NOW)
        )
    assert not isinstance(caught.value, ConnectionLostError) and not caught.value.retryable
    queue.publish("noop", [2])
    assert _session(queue) == session and count_rows(installed) == 2


def test_concurrent_publishing_threads_get_their_own_ids_on_a_bounded_set_of_connections(
    dialect, installed, make_queue
):
    queue = make_queue()
    queue.publish("noop", ["warm", 0])  # the install check, once
    go = threading.Barrier(12, timeout=30)

    def publish_many(tag: int) -> list[int]:
        go.wait()
        return [queue.publish("noop", [tag, n]) for n in range(40)]

    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(publish_many, tag) for tag in range(12)]
        results = [f.result(timeout=120) for f in futures]
    rows = installed.sql("SELECT id, parameters_json FROM {t}")
    by_id = {r["id"]: r["parameters_json"] for r in rows}
    for tag, ids in enumerate(results):
        for n, job_id in enumerate(ids):
            stored = by_id[job_id]
            assert (stored if dialect == "postgres" else json.loads(stored)) == [tag, n]
    assert len(by_id) == 12 * 40 + 1
    assert 1 <= len(queue.store.database.alone._free) <= POOL_SIZE  # idle ones kept: the pool's bound


def _publish_in_child(queue: Queue, out: Any) -> None:
    queue.store.database.engine.dispose(close=False)  # the engine's pool is the parent's (as bgq work does)
    queue.publish("noop", ["child"])
    out.put(_session(queue))


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(dialect, installed, make_queue):
    queue = make_queue()
    queue.publish("noop", ["parent", 1])
    parent_session = _session(queue)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_publish_in_child, args=(queue, out))
    child.start()
    child_session = out.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0
    assert child_session != parent_session
    queue.publish("noop", ["parent", 2])
    assert _session(queue) == parent_session and count_rows(installed) == 3


def test_close_closes_the_kept_connection(dialect, installed, make_queue):
    queue = make_queue()
    queue.publish("noop", [1])
    session = _session(queue)
    queue.close()
    _gone(installed, dialect, session)


def test_a_url_without_a_driver_publishes_through_bgq_s_driver(make_queue, installed):
    """`postgres://…` / `mysql://…` as a platform hands them out: the job is stored."""
    backend, _, rest = installed.url.partition("://")
    bare = {"postgresql+psycopg": "postgres", "mysql+pymysql": "mysql"}[backend] + "://" + rest
    queue = make_queue(database_url=bare)
    job = queue.publish("noop")
    assert installed.sql("SELECT id FROM {t}") == [{"id": job}]


def test_a_database_error_on_the_applications_connection_is_a_bgq_error(dialect, installed, make_queue):
    """publish(connection=...) on a connection to a database without bgq's table (the wrong
    engine): a bgq DatabaseError naming the problem, like every database failure bgq reports,
    not the driver's own exception."""
    import sqlalchemy as sa

    queue = make_queue()
    other = sa.make_url(installed.url).set(database="postgres" if dialect == "postgres" else "mysql")
    engine = sa.create_engine(other)
    try:
        with engine.connect() as conn, pytest.raises(DatabaseError) as raised:
            queue.publish("noop", connection=conn)
    finally:
        engine.dispose()
    assert installed.table in str(raised.value)
