"""Driver errors become bgq's exceptions by error code at the dialect seam, and one retry policy."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import psycopg.errors
import pymysql
import pytest
import sqlalchemy as sa

from bgq.db import Database, Proc
from bgq.errors import (
    ConnectionLostError,
    DatabaseError,
    DatabaseUnavailableError,
    DeadlockError,
    JobNotFoundError,
    LockTimeoutError,
    PacketTooLargeError,
    SchemaVersionError,
    SerializationFailureError,
    StatementCanceledError,
)
from bgq.sql import retry
from tests.conftest import DATABASE_URLS
from tests.support.helpers import (
    background,
    held_transaction,
    new_job,
    session_id,
    wait_for_lock_wait,
    wait_session_gone,
)

# --- the mapping, on real driver exception objects (no server needed) ---

_MYSQL_CASES = [
    (1205, "Lock wait timeout exceeded; try restarting transaction", LockTimeoutError, True),
    (3572, "Statement aborted: lock(s) could not be acquired immediately and NOWAIT is set",
     LockTimeoutError, True),
    (1213, "Deadlock found when trying to get lock; try restarting transaction", DeadlockError, True),
    (1020, "Record has changed since last read in table 't'", SerializationFailureError, True),
    (2003, "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)",
     DatabaseUnavailableError, False),
    (2006, "MySQL server has gone away", ConnectionLostError, True),
    (2013, "Lost connection to MySQL server during query", ConnectionLostError, True),
    (2055, "Lost connection to MySQL server at 'reading', system error: 104", ConnectionLostError, True),
    (1927, "Connection was killed", ConnectionLostError, True),
    (4031, "The client was disconnected by the server because of inactivity", ConnectionLostError, True),
    (1153, "Got a packet bigger than 'max_allowed_packet' bytes", PacketTooLargeError, False),
    (1969, "Query execution was interrupted (max_statement_time exceeded)", StatementCanceledError, False),
    (31001, "bgq: no such job", JobNotFoundError, False),
    (1305, "PROCEDURE test.t_claim does not exist", SchemaVersionError, False),
]  # fmt: skip

_POSTGRES_CASES = [
    ("55P03", "canceling statement due to lock timeout", LockTimeoutError, True),
    ("40P01", "deadlock detected", DeadlockError, True),
    ("40001", "could not serialize access due to concurrent update", SerializationFailureError, True),
    ("08006", "connection failure", ConnectionLostError, True),
    ("08001", "could not establish connection", DatabaseUnavailableError, False),
    ("57P01", "terminating connection due to administrator command", ConnectionLostError, True),
    ("57P02", "terminating connection because of crash of another server process", ConnectionLostError, True),
    ("57P03", "the database system is starting up", DatabaseUnavailableError, False),
    ("25P03", "terminating connection due to idle-in-transaction timeout", ConnectionLostError, True),
    ("57014", "canceling statement due to statement timeout", StatementCanceledError, False),
    ("54000", "total size of jsonb array elements exceeds the maximum", PacketTooLargeError, False),
    ("42883", "function t_claim(bigint) does not exist", SchemaVersionError, False),
]  # fmt: skip


@pytest.fixture(scope="module")
def databases() -> Iterator[dict[str, Database]]:
    """Databases whose engines never connect here: translate() needs only the dialect."""
    dbs = {name: Database(url) for name, url in DATABASE_URLS.items()}
    yield dbs
    for db in dbs.values():
        db.dispose()


@pytest.mark.parametrize(("code", "message", "kind", "retryable"), _MYSQL_CASES)
def test_mysql_error_codes_map_to_their_class(databases, code, message, kind, retryable):
    orig = pymysql.err.OperationalError(code, message)
    for exc in (orig, sa.exc.OperationalError("CALL t_claim(%s)", (1,), orig)):
        error = databases["mysql"].translate(exc)
        assert type(error) is kind
        assert error.retryable is retryable if isinstance(error, DatabaseError) else not retryable


@pytest.mark.parametrize(("state", "message", "kind", "retryable"), _POSTGRES_CASES)
def test_postgres_sqlstates_map_to_their_class(databases, state, message, kind, retryable):
    orig = psycopg.errors.lookup(state)(message)
    assert orig.sqlstate == state
    for exc in (orig, sa.exc.OperationalError("SELECT t_claim(%s)", (1,), orig)):
        error = databases["postgres"].translate(exc)
        assert type(error) is kind
        assert error.retryable is retryable if isinstance(error, DatabaseError) else not retryable


def test_a_lock_timeout_is_never_reported_as_an_unreachable_database(databases):
    """The old classifier matched "timeout" in the text and said "Cannot reach the database"."""
    cases = {
        "mysql": pymysql.err.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction"),
        "postgres": psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
    }
    for name, orig in cases.items():
        error = databases[name].translate(sa.exc.OperationalError("x", (), orig))
        assert isinstance(error, LockTimeoutError) and not isinstance(error, DatabaseUnavailableError)
        assert "Cannot reach" not in str(error)


def test_psycopg_errors_without_sqlstate_are_connection_errors(databases):
    """psycopg's own connection errors have no SQLSTATE: a failed attempt carries its pgconn."""
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("host=127.0.0.1 port=1 user=postgres connect_timeout=2")
    assert refused.value.sqlstate is None and refused.value.pgconn is not None
    unreachable = databases["postgres"].translate(refused.value)
    assert type(unreachable) is DatabaseUnavailableError and not unreachable.retryable
    assert str(unreachable).startswith("Cannot reach the database at postgresql+psycopg://")
    closed = databases["postgres"].translate(psycopg.OperationalError("the connection is closed"))
    assert type(closed) is ConnectionLostError and closed.retryable


def test_a_disconnect_sqlalchemy_saw_is_a_lost_connection(databases):
    orig = pymysql.err.OperationalError(9999, "something the dialect does not name")
    wrapped = sa.exc.OperationalError("x", (), orig, connection_invalidated=True)
    assert type(databases["mysql"].translate(wrapped)) is ConnectionLostError
    plain = sa.exc.OperationalError("x", (), orig)
    error = databases["mysql"].translate(plain)
    assert type(error) is DatabaseError and not error.retryable


def test_pymysql_closed_socket_is_a_lost_connection(databases):
    assert type(databases["mysql"].translate(pymysql.err.InterfaceError(0, ""))) is ConnectionLostError


def test_the_retry_policy_runs_retryable_errors_again_and_others_once(databases, monkeypatch):
    monkeypatch.setattr("bgq.sql.retry.time.sleep", lambda s: None)
    calls: list[type[Exception]] = []

    def failing(kind: type[DatabaseError]):
        def call():
            calls.append(kind)
            raise kind("x")

        return call

    expected = {
        DeadlockError: 5,
        LockTimeoutError: 5,
        ConnectionLostError: 5,
        DatabaseUnavailableError: 1,
        DatabaseError: 1,
        JobNotFoundError: 1,
    }
    for kind, attempts in expected.items():
        calls.clear()
        with pytest.raises(kind):
            for attempt in retry.policy():
                with attempt:
                    failing(kind)()
        assert len(calls) == attempts, kind


# --- real servers: a real lock wait timeout, a real deadlock, a real killed session ---


def _short_lock_wait(conn: sa.Connection, dialect: str) -> None:
    """Make this transaction's lock waits end after a moment instead of 50 s (MySQL) or never."""
    if dialect == "mysql":
        conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 1")
    else:
        conn.exec_driver_sql("SET LOCAL lock_timeout = '300ms'")


@pytest.fixture
def own_db(installed) -> Iterator[Database]:
    """A Database of the test's own (session settings it changes die with it)."""
    db = Database(installed.url)
    yield db
    db.dispose()


def test_a_real_lock_wait_timeout_is_a_retryable_lock_timeout(dialect, installed, own_db):
    job = new_job(installed)
    with held_transaction(installed) as holder:
        holder.exec_driver_sql(f"SELECT id FROM {installed.table} WHERE id = %s FOR UPDATE", (job,)).all()
        with pytest.raises(LockTimeoutError) as caught, own_db.transaction() as conn:
            _short_lock_wait(conn, dialect)
            conn.exec_driver_sql(f"UPDATE {installed.table} SET priority = 2 WHERE id = %s", (job,))
    assert caught.value.retryable
    assert "Cannot reach" not in str(caught.value)


def test_an_error_a_procedure_raises_after_its_rows_reaches_the_caller(dialect, installed, own_db):
    """A procedure that sends its rows and then fails (here: a lock wait timeout in the UPDATE
    after its SELECT) raises through Database.call, fast or not. On MySQL the error comes with
    the CALL's status, after the rows; read through SQLAlchemy's result it was logged as "Error
    closing cursor" and dropped, and the caller went on to COMMIT as if the procedure had run
    (what a Galera certification failure did to a claim). PostgreSQL's function fails whole."""
    name = f"{installed.table}_rows_then_update"
    if dialect == "mysql":
        create = (
            f"CREATE PROCEDURE {name}(IN p_id BIGINT) BEGIN "
            f"SELECT p_id AS id; UPDATE {installed.table} SET priority = 2 WHERE id = p_id; END"
        )
        drop = f"DROP PROCEDURE IF EXISTS {name}"
    else:
        create = (
            f"CREATE FUNCTION {name}(p_id bigint) RETURNS TABLE (id bigint) LANGUAGE plpgsql AS $$ "
            f"BEGIN RETURN QUERY SELECT p_id; UPDATE {installed.table} SET priority = 2 "
            f"WHERE {installed.table}.id = p_id; END $$"
        )
        drop = f"DROP FUNCTION IF EXISTS {name}(bigint)"
    probe = Proc("rows_then_update", (("p_id", "bigint"),))
    installed.sql(drop)
    installed.sql(create)
    try:
        job = new_job(installed)
        with held_transaction(installed) as holder:
            holder.exec_driver_sql(f"SELECT id FROM {installed.table} WHERE id = %s FOR UPDATE", (job,)).all()
            for fast in (False, True):
                with pytest.raises(LockTimeoutError), own_db.transaction() as conn:
                    _short_lock_wait(conn, dialect)
                    own_db.call(conn, installed.table, probe, [job], fast=fast)
        with own_db.transaction() as conn:  # once the lock is gone, the same call returns its row
            assert own_db.call(conn, installed.table, probe, [job]) == [{"id": job}]
    finally:
        installed.sql(drop)


def test_the_retry_policy_cures_a_lock_timeout_once_the_lock_is_gone(dialect, installed, own_db):
    job = new_job(installed)
    attempts = []
    with held_transaction(installed) as holder:
        holder.exec_driver_sql(f"SELECT id FROM {installed.table} WHERE id = %s FOR UPDATE", (job,)).all()

        def update(conn: sa.Connection) -> int:
            attempts.append(1)
            if len(attempts) == 2:
                holder.rollback()  # the lock holder goes away before the second attempt
            _short_lock_wait(conn, dialect)
            sql = f"UPDATE {installed.table} SET priority = 2 WHERE id = %s"
            return conn.exec_driver_sql(sql, (job,)).rowcount

        assert retry.in_transaction(own_db, update) == 1
    assert len(attempts) == 2
    assert installed.sql("SELECT priority FROM {t} WHERE id = %s", (job,)) == [{"priority": 2}]


def test_a_real_deadlock_is_a_retryable_deadlock(dialect, installed, own_db):
    first, second = new_job(installed), new_job(installed)
    both_locked = threading.Barrier(2, timeout=10)
    sql = f"UPDATE {installed.table} SET priority = priority + 1 WHERE id = %s"

    def lock(mine: int, theirs: int, wait_for_other: bool) -> None:
        with own_db.transaction() as conn:
            conn.exec_driver_sql(sql, (mine,))
            both_locked.wait()
            if wait_for_other:
                wait_for_lock_wait(installed)  # the other one already waits for `mine`
            conn.exec_driver_sql(sql, (theirs,))

    with background() as run:
        a = run(lock, first, second, False)
        b = run(lock, second, first, True)
        errors = [f.exception(timeout=30) for f in (a, b)]
    deadlocks = [e for e in errors if e is not None]
    assert len(deadlocks) == 1, errors
    assert type(deadlocks[0]) is DeadlockError and deadlocks[0].retryable


def _kill(installed, dialect: str, session: int) -> None:
    if dialect == "mysql":
        installed.sql(f"KILL {session}")
    else:
        installed.sql("SELECT pg_terminate_backend(%s)", (session,))


def test_a_killed_session_is_a_retryable_lost_connection(dialect, installed, own_db):
    with pytest.raises(ConnectionLostError) as caught, own_db.transaction() as conn:
        _kill(installed, dialect, session_id(conn))
        conn.exec_driver_sql(f"SELECT COUNT(*) FROM {installed.table}").all()
    assert caught.value.retryable and isinstance(caught.value, DatabaseUnavailableError)
    # The pool replaces the connection: the next transaction runs.
    with own_db.transaction() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1


def test_the_retry_policy_runs_again_after_the_session_was_killed(dialect, installed, own_db):
    sessions: list[int] = []

    def count(conn: sa.Connection) -> int:
        sessions.append(session_id(conn))
        if len(sessions) == 1:
            _kill(installed, dialect, sessions[0])
        return int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {installed.table}").scalar_one())

    assert retry.in_transaction(own_db, count) == 0
    assert len(sessions) == 2 and sessions[0] != sessions[1]


def test_a_transaction_the_server_cut_for_idling_is_a_lost_connection(dialect, installed, own_db):
    """MariaDB idle_transaction_timeout / PostgreSQL idle_in_transaction_session_timeout."""
    setting = (
        "SET SESSION idle_transaction_timeout = 1"
        if dialect == "mysql"
        else "SET SESSION idle_in_transaction_session_timeout = '200ms'"
    )
    with pytest.raises(ConnectionLostError) as caught, own_db.transaction() as conn:
        conn.exec_driver_sql(setting)
        session = session_id(conn)
        conn.exec_driver_sql(f"SELECT COUNT(*) FROM {installed.table}").all()
        wait_session_gone(installed, session)
        conn.exec_driver_sql("SELECT 1")
    assert caught.value.retryable


# --- the result writes' schedule of the one retry policy (retry.persist_policy) ---


def test_persist_policy_tries_every_bgq_error_again_after_the_persist_pauses(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("bgq.sql.retry.time.sleep", slept.append)
    retried: list[BaseException] = []
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        raise DatabaseError("not retryable, tried again all the same")

    with pytest.raises(DatabaseError, match="tried again all the same"):
        retry.persist_policy(retried.append)(write)
    assert len(tries) == len(retry.PERSIST_PAUSES)
    assert slept == list(retry.PERSIST_PAUSES[1:])
    assert len(retried) == len(retry.PERSIST_PAUSES) - 1


def test_persist_policy_lets_a_non_bgq_error_through_at_once(monkeypatch):
    monkeypatch.setattr("bgq.sql.retry.time.sleep", lambda s: pytest.fail("slept"))
    with pytest.raises(KeyError):
        retry.persist_policy(lambda exc: None)(lambda: {}["x"])
