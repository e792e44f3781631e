"""bgq behind PgBouncer in transaction pooling (`pooled=True`): no session state on a server
connection, LISTEN only on a direct `listen_url` (else polling, with one warning), and a real
PgBouncer 1.18 in front of the suite's PostgreSQL for install-procs, publish and `bgq work`.

The PgBouncer tests skip when pgbouncer is not installed, unless CI=true (then they fail).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bgq import Queue
from bgq.db import Database
from bgq.errors import ConfigError
from bgq.sql.calls import Procs
from bgq.sql.install import install, uninstall
from bgq.sql.wakeups import Listener
from tests.conftest import DATABASE_URLS, IN_CI, _probe_database, require_service
from tests.support.helpers import unique_name, wait_until

ROOT = Path(__file__).resolve().parents[1]
POSTGRES = DATABASE_URLS["postgres"]


@pytest.fixture
def pg() -> str:
    require_service("PostgreSQL", _probe_database(POSTGRES))
    return POSTGRES


@pytest.fixture
def bouncer(tmp_path: Path, pg: str) -> Iterator[Any]:
    """A PgBouncer of this test's own (transaction pooling, 3 server connections) on a port of
    16440-16459 (one per xdist worker), stopped by pid."""
    if shutil.which("pgbouncer") is None:
        if IN_CI:
            pytest.fail("CI=true and pgbouncer is not installed (apt-get install pgbouncer)", pytrace=False)
        pytest.skip("pgbouncer is not installed")
    from tools.scale.pgbouncer import PgBouncer

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    port = 16440 + (int(worker) if worker.isdigit() else 0) % 20
    workdir = tmp_path / "pgbouncer"
    b = PgBouncer(workdir, port, pool_size=3, idle_transaction_timeout=5)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _database(url: str) -> str:
    return sa.make_url(url).database or "test"


def _server_state(url: str) -> dict[str, Any]:
    """What a session on `url` shows of the state it inherited: its lock_timeout and
    idle_in_transaction_session_timeout, its prepared statements, and the advisory locks held
    in the database by anyone."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as conn:
            return {
                "lock_timeout": conn.exec_driver_sql("SHOW lock_timeout").scalar(),
                "idle": conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar(),
                "prepared": conn.exec_driver_sql("SELECT count(*) FROM pg_prepared_statements").scalar(),
                "advisory": conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                ).scalar(),
            }
    finally:
        engine.dispose()


def _exercise(url: str, table: str, listen_url: str | None = None) -> None:
    """install-procs, a bulk publish, single publishes, claims and their results, pooled."""
    db = Database(url, pooled=True, listen_url=listen_url)
    try:
        install(db, table)
        install(db, table)  # the second one finds everything up to date, under the same lock
    finally:
        db.dispose()
    queue = Queue(
        callbacks={"job": lambda n: None}, database_url=url, table_name=table, bulk_size=50, pooled=True
    )
    try:
        with queue.bulk():
            for i in range(120):
                queue.publish("job", [i], serial_group=f"g{i % 3}")
        for i in range(10):  # more than psycopg's prepare_threshold (5) of one statement
            queue.publish("job", [i])
        assert queue.process().outcomes == {"claimed": 130}
    finally:
        queue.close()


def test_pooled_mode_leaves_no_session_state_on_a_direct_server(pg):
    """pooled=True on a direct connection: the connection bgq used shows the server's defaults
    between transactions, prepares nothing, and install-procs holds no advisory lock after."""
    table = unique_name("bgqpool")
    db = Database(pg, pooled=True, lock_timeout=3)
    try:
        install(db, table)
        procs = Procs(db, table)
        with db.pinned():
            for _ in range(8):
                with db.transaction() as conn:
                    assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "3s"  # SET LOCAL
                    procs.claim_batch(conn, "default", 5, os.getpid(), None, None, 1000)
            with db.transaction() as conn:
                pass
            raw = db._local.conn.connection.driver_connection
            raw.commit()
            assert raw.execute("SHOW lock_timeout").fetchone()[0] == "0"
            assert raw.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "0"
            assert raw.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
            raw.rollback()
        state = _server_state(pg)
        assert state["advisory"] == 0
    finally:
        uninstall(db, table)
        db.dispose()


def test_the_direct_default_keeps_its_session_settings(pg):
    """Without pooled, bgq's own sessions keep lock_timeout as before (the faster default)."""
    db = Database(pg, lock_timeout=3)
    try:
        with db.transaction() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "3s"
    finally:
        db.dispose()


def test_pooled_without_listen_url_polls_and_with_it_listens(pg):
    table = unique_name("bgqpool")
    db = Database(pg, pooled=True)
    try:
        install(db, table)
        assert Procs(db, table).polls and Procs(db, table).waker() is None
        with_listen = Database(pg, pooled=True, listen_url=pg)
        try:
            waker = Procs(with_listen, table).waker()
            assert isinstance(waker, Listener) and not Procs(with_listen, table).polls
            waker.close()
        finally:
            with_listen.dispose()
        direct = Database(pg)
        try:
            assert not Procs(direct, table).polls
        finally:
            direct.dispose()
    finally:
        uninstall(db, table)
        db.dispose()


def test_pooled_and_listen_url_are_postgresql_only(monkeypatch):
    with pytest.raises(ConfigError, match='"pooled" is for PostgreSQL only'):
        Queue(callbacks={}, database_url=DATABASE_URLS["mysql"], pooled=True)
    with pytest.raises(ConfigError, match='"listen_url" is for PostgreSQL only'):
        Queue(callbacks={}, database_url=POSTGRES, listen_url=DATABASE_URLS["mysql"])
    monkeypatch.setenv("BGQ_POOLED", "1")
    monkeypatch.setenv("BGQ_LISTEN_URL", POSTGRES)
    config = Queue(callbacks={}, database_url=POSTGRES).config
    assert config.pooled and config.listen_url == POSTGRES
    assert not Queue(callbacks={}, database_url=POSTGRES, pooled=False).config.pooled


def test_through_pgbouncer_no_session_state_reaches_the_next_client(bouncer):
    """install-procs, bulk and single publishes, claims and results through a real PgBouncer
    (3 server connections): then a new client of the same pool (one of the same server
    connections) sees the defaults, no prepared statement and no advisory lock."""
    url = bouncer.url(_database(POSTGRES))
    table = unique_name("bgqpool")
    try:
        _exercise(url, table)
        for _ in range(3):  # each of the pool's server connections, by chance or not
            state = _server_state(url)
            assert state == {"lock_timeout": "0", "idle": "0", "prepared": 0, "advisory": 0}
    finally:
        db = Database(POSTGRES)
        uninstall(db, table)
        db.dispose()


APP = """
import os
from bgq import Queue

def job(n):
    return n

def queue():
    return Queue(callbacks={"job": job}, database_url=os.environ["T_URL"], table_name=os.environ["T_TABLE"],
                 bulk_size=100, heartbeat_interval=1)
"""


def test_bgq_work_through_pgbouncer(bouncer, tmp_path):
    """`bgq install-procs`, then publishes (bulk, and inside an application transaction on an
    engine with prepare_threshold=None), then two `bgq work --pooled` through PgBouncer run
    every job; their logs hold the one polling warning each, nothing else."""
    url = bouncer.url(_database(POSTGRES))
    table = unique_name("bgqpool")
    (tmp_path / "pgbapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "BGQ_APP": "pgbapp:queue",
           "T_URL": url, "T_TABLE": table, "BGQ_POOLED": "1"}  # fmt: skip
    env.pop("BGQ_LISTEN_URL", None)
    bgq = str(Path(sys.executable).parent / "bgq")
    workers: list[subprocess.Popen[str]] = []
    try:
        subprocess.run([bgq, "install-procs"], env=env, check=True, timeout=120, capture_output=True)
        sys.path.insert(0, str(tmp_path))
        os.environ.update(T_URL=url, T_TABLE=table)
        import pgbapp

        queue = pgbapp.queue()
        queue.close()
        queue = Queue(**{**_options(queue), "pooled": True})
        try:
            with queue.bulk():
                for i in range(200):
                    queue.publish("job", [i], serial_group=f"g{i % 5}")
            app = sa.create_engine(url, connect_args={"prepare_threshold": None})
            try:
                with app.begin() as conn:
                    for i in range(20):
                        queue.publish("job", [i], connection=conn)
            finally:
                app.dispose()
        finally:
            queue.close()
        for _ in range(2):
            workers.append(subprocess.Popen([bgq, "work"], env=env, stderr=subprocess.PIPE, text=True))
        wait_until(lambda: _unfinished(table) == 0, "every job to finish through PgBouncer", 90, 0.3)
    finally:
        for w in workers:
            w.terminate()
        logs = [w.communicate(timeout=30)[1] for w in workers]
        db = Database(POSTGRES)
        uninstall(db, table)
        db.dispose()
        sys.path.remove(str(tmp_path)) if str(tmp_path) in sys.path else None
        sys.modules.pop("pgbapp", None)
    for log in logs:
        lines = [line for line in log.splitlines() if line.strip()]
        assert len(lines) == 1 and "without listen_url: idle workers poll" in lines[0], log


def _options(queue: Queue) -> dict[str, Any]:
    cfg = queue.config
    return {"callbacks": {n: s.func for n, s in cfg.callbacks.items()}, "database_url": cfg.database_url,
            "table_name": cfg.table_name, "bulk_size": cfg.bulk_size}  # fmt: skip


def _unfinished(table: str) -> int:
    engine = sa.create_engine(POSTGRES, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table} WHERE state <> 3").scalar() or 0)
    finally:
        engine.dispose()
