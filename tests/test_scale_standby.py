"""A PostgreSQL primary with a streaming standby (docs/scale-out/standby.md), the parts that need
no cluster: multi-host URLs (libpq tries the hosts in order and, with
target_session_attrs=read-write, keeps the one that takes writes), and a server that refuses
writes (a standby: SQLSTATE 25006; MySQL/MariaDB 1290, 1792) as a retryable ReadOnlyError that
makes bgq drop its connections and connect again. The failover itself is `make scale`'s
(tools/scale/standby.py)."""

from __future__ import annotations

import logging
import socket

import pytest
import sqlalchemy as sa

from bgq import Queue, ReadOnlyError
from bgq.db import Database, normalise_url, render_url
from bgq.errors import DatabaseError, DatabaseUnavailableError
from bgq.sql import retry
from tests.conftest import DATABASE_URLS, SERVICE_NAMES, _probe_database, require_service
from tests.support.helpers import unique_name

#: A port of this work's own range (25400-25499) that nothing listens on: the "dead primary".
CLOSED_PORT = 25499


def _postgres() -> sa.URL:
    require_service(SERVICE_NAMES["postgres"], _probe_database(DATABASE_URLS["postgres"]))
    return sa.make_url(DATABASE_URLS["postgres"])


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _forms(live: sa.URL, dead_port: int) -> dict[str, str]:
    """The same two hosts (a dead one first, then the live server) in each form bgq accepts."""
    host, port, db, user = live.host or "127.0.0.1", live.port or 5432, live.database, live.username
    return {
        "sqlalchemy host=h:p repeated": (
            f"postgresql+psycopg://{user}@/{db}?host=127.0.0.1:{dead_port}&host={host}:{port}"
            "&target_session_attrs=read-write"
        ),
        "libpq host=a,b port=p,q": (
            f"postgresql://{user}@/{db}?host=127.0.0.1,{host}&port={dead_port},{port}"
            "&target_session_attrs=read-write"
        ),
        "libpq URI hosts in the netloc": (
            f"postgres://{user}@127.0.0.1:{dead_port},{host}:{port}/{db}?target_session_attrs=read-write"
        ),
    }


# --- parsing, no server needed ---


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql+psycopg://postgres@/db?host=10.0.0.1:5433&host=10.0.0.2:5434&target_session_attrs=read-write",
        "postgresql://postgres@/db?host=10.0.0.1,10.0.0.2&port=5433,5434&target_session_attrs=read-write",
        "postgresql://postgres@10.0.0.1:5433,10.0.0.2:5434/db?target_session_attrs=read-write",
        "postgres://postgres@10.0.0.1:5433,10.0.0.2:5434/db?target_session_attrs=read-write",
    ],
)
def test_every_multi_host_form_reaches_libpq_as_two_hosts_in_order(raw):
    url = normalise_url(raw)
    assert url.drivername == "postgresql+psycopg"
    db = Database(raw)  # _check_url_options passes: psycopg takes host, port, target_session_attrs
    try:
        _, params = db.engine.dialect.create_connect_args(db.url)
    finally:
        db.dispose()
    assert params["host"] == "10.0.0.1,10.0.0.2"
    assert params["port"] == "5433,5434"
    assert params["target_session_attrs"] == "read-write"
    assert params["dbname"] == "db"


def test_a_multi_host_uri_keeps_credentials_and_options_and_hides_the_password():
    url = normalise_url(
        "postgresql://app:s%40cret@h1:5433,h2/db?connect_timeout=3&target_session_attrs=read-write"
    )
    assert (url.username, url.password, url.database) == ("app", "s@cret", "db")
    assert url.query["host"] == ("h1:5433", "h2")
    assert url.query["connect_timeout"] == "3"
    shown = render_url(url)
    assert "s@cret" not in shown and "***" in shown
    assert "host=h1:5433&host=h2" in shown  # readable in logs and errors, not %3A-quoted


def test_a_single_host_url_is_left_as_it_was():
    raw = "postgresql+psycopg://postgres@127.0.0.1:5432/test?connect_timeout=5"
    assert normalise_url(raw).render_as_string(hide_password=False) == raw


def test_a_typo_in_a_multi_host_url_is_named_by_libpq():
    with pytest.raises(DatabaseError, match='invalid connection option "target_session_attr"'):
        db = Database("postgresql://postgres@127.0.0.1:1,127.0.0.1:2/db?target_session_attr=read-write")
        try:
            with db.transaction():
                pass
        finally:
            db.dispose()


# --- failover in libpq's order, on the machine's server (no cluster) ---


@pytest.mark.parametrize(
    "form", ["sqlalchemy host=h:p repeated", "libpq host=a,b port=p,q", "libpq URI hosts in the netloc"]
)
def test_the_first_host_down_bgq_works_on_the_second(form):
    live = _postgres()
    assert _closed(CLOSED_PORT), f"port {CLOSED_PORT} should be closed for this test"
    raw = _forms(live, CLOSED_PORT)[form]
    table = unique_name("bgqt_sb")
    queue = Queue(callbacks={"noop": lambda: None}, database_url=raw, table_name=table, queue="standby")
    try:
        queue.install()
        job_id = queue.publish("noop", [])  # the single-statement path (bgq/db/autocommit.py)
        report = queue.process()  # claims and results through the engine's pool
        assert sum(report.outcomes.values()) == 1
        assert queue.get_job(job_id)["state"] == 3  # FINISHED
        with queue.database.transaction() as conn:
            assert conn.exec_driver_sql("SELECT inet_server_port()").scalar() == (live.port or 5432)
    finally:
        from bgq.sql.install import uninstall

        uninstall(queue.database, table)
        queue.close()


def test_the_error_names_every_host_when_none_answers():
    assert _closed(CLOSED_PORT) and _closed(CLOSED_PORT - 1)
    db = Database(
        f"postgresql://postgres@127.0.0.1:{CLOSED_PORT},127.0.0.1:{CLOSED_PORT - 1}/test?connect_timeout=2"
    )
    try:
        with pytest.raises(DatabaseUnavailableError) as info, db.transaction():
            pass
    finally:
        db.dispose()
    assert not isinstance(info.value, ReadOnlyError)
    assert f"host=127.0.0.1:{CLOSED_PORT}&host=127.0.0.1:{CLOSED_PORT - 1}" in str(info.value)
    assert "\n" not in str(info.value)  # libpq's one line per host, joined


# --- a server that refuses writes: ReadOnlyError, retryable, connections replaced ---

#: A URL option that makes every session of bgq's read-only, as a hot standby's are.
_READ_ONLY_OPTION = {
    "postgres": {"options": "-c default_transaction_read_only=on"},
    "mysql": {"init_command": "SET SESSION TRANSACTION READ ONLY"},
}
_SESSION_ID = {"postgres": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


def _read_only_url(url: str, dialect: str) -> str:
    return (
        sa.make_url(url).update_query_dict(_READ_ONLY_OPTION[dialect]).render_as_string(hide_password=False)
    )


def test_25006_in_a_read_only_transaction_is_a_retryable_read_only_error_and_the_pool_reconnects():
    """PostgreSQL: SET TRANSACTION READ ONLY, then a bgq procedure call: SQLSTATE 25006."""
    live = _postgres()
    db = Database(live.render_as_string(hide_password=False))
    try:
        with db.transaction() as conn:
            before = conn.exec_driver_sql(_SESSION_ID["postgres"]).scalar()
        with pytest.raises(ReadOnlyError) as info, db.transaction() as conn:
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            conn.exec_driver_sql("CREATE TEMPORARY TABLE bgq_read_only_probe (a int)")  # a write
        assert info.value.retryable and retry.retryable(info.value)
        assert isinstance(info.value, DatabaseUnavailableError)
        assert "read-only" in str(info.value)
        assert "\n" not in str(info.value)  # one line in the log, without the CONTEXT lines
        with db.transaction() as conn:  # the connection that reached the read-only server is gone
            assert conn.exec_driver_sql(_SESSION_ID["postgres"]).scalar() != before
    finally:
        db.dispose()


def test_a_read_only_server_fails_publish_and_claims_with_read_only_error(make_queue, installed, dialect):
    """Both dialects: every session read-only (as a standby's), bgq's writes on both of its
    paths (the single-statement publish, the pooled claim) raise ReadOnlyError, bounded: the
    claim's retries reconnect each time and then give up, nothing is written."""
    writer = make_queue()
    job_id = writer.publish("noop", [])
    reader = make_queue(database_url=_read_only_url(installed.url, dialect))
    with pytest.raises(ReadOnlyError):
        reader.publish("noop", [])
    with pytest.raises(ReadOnlyError):
        reader.requeue(job_id, "a standby cannot take this")
    assert reader.get_job(job_id)["state"] == writer.get_job(job_id)["state"]  # reads still work
    with pytest.raises(ReadOnlyError):  # cron mode's reap and claims: retried, reconnecting, bounded
        reader.process()
    assert sum(writer.process().outcomes.values()) == 1  # the primary serves the same job


def test_a_read_only_error_on_a_kept_connection_drops_every_kept_connection(make_queue, installed, dialect):
    reader = make_queue(database_url=_read_only_url(installed.url, dialect))
    db = reader.database
    for _ in range(2):
        with pytest.raises(ReadOnlyError):
            reader.publish("noop", [])
    assert db.alone._free == []  # none kept: the next statement connects again


def test_a_worker_on_a_read_only_server_logs_one_line_per_try_and_stops_when_asked(
    make_queue, installed, dialect, caplog
):
    """`bgq work` against a standby (before the failover completes, or a URL without
    target_session_attrs): no crash, no hang, no busy loop; a clear line per claim, each on one
    line; it stops when asked."""
    import threading
    import time

    from bgq.modes.work import work

    class Stop:
        requested = False

    reader = make_queue(database_url=_read_only_url(installed.url, dialect))
    stop = Stop()
    thread = threading.Thread(target=lambda: work(reader, stop=stop, poll=0.5), daemon=True)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="bgq"):
        thread.start()
        time.sleep(3.0)  # real: the window in which a busy loop would show as many failed claims
        stop.requested = True
        thread.join(10)
    assert not thread.is_alive(), "work() did not stop within 10 s on a read-only server"
    claims = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("bgq: Claiming jobs failed")
    ]
    assert 1 <= len(claims) <= 12  # about one per poll (0.5 s), never a busy loop
    assert all("refuses writes" in line and "\n" not in line for line in claims), claims[:2]
