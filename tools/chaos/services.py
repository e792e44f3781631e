"""The servers a chaos run touches: its database, session cuts, RabbitMQ restarts, versions."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import subprocess
import sys
from typing import Any

import sqlalchemy as sa

MYSQL_ADMIN = os.environ.get("BGQ_CHAOS_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
POSTGRES_ADMIN = os.environ.get("BGQ_CHAOS_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("BGQ_CHAOS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
RABBITMQCTL = os.environ.get("BGQ_CHAOS_RABBITMQCTL", "rabbitmqctl")


class Server:
    """One dialect's server: an admin engine (on its `test` database, never the run's) that creates,
    cuts and drops the run's database `bgqchaos_<hex>`."""

    def __init__(self, dialect: str, admin: str | None = None) -> None:
        """`admin`: another server's admin URL (a `make scale` topology's writable node)."""
        self.dialect = dialect
        admin = admin or (MYSQL_ADMIN if dialect == "mysql" else POSTGRES_ADMIN)
        self.admin_url = sa.make_url(admin)
        self.engine = sa.create_engine(
            admin, isolation_level="AUTOCOMMIT", pool_pre_ping=True, connect_args=connect_args(dialect)
        )

    def url_for(self, database: str) -> str:
        return self.admin_url.set(database=database).render_as_string(hide_password=False)

    def create(self, database: str) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {database}")

    def drop(self, database: str) -> None:
        with self.engine.connect() as conn:
            if self.dialect == "postgres":
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            else:
                self.cut_sessions(database)
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database}")

    def cut_sessions(self, database: str) -> int:
        """Kill every session on `database` (only the run's own): how many were cut."""
        with self.engine.connect() as conn:
            if self.dialect == "postgres":
                rows = conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (database,),
                ).all()
                return sum(1 for (ok,) in rows if ok)
            ids = [
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()",
                    (database,),
                )
            ]
            cut = 0
            for session in ids:
                with contextlib.suppress(sa.exc.DBAPIError):  # it may have gone meanwhile
                    conn.exec_driver_sql(f"KILL {int(session)}")
                    cut += 1
            return cut

    def snapshot(self, database: str, table: str) -> list[dict[str, Any]]:
        """The end state of bgq's table: id, state, attempts, finished_at (epoch s), pid."""
        engine = sa.create_engine(self.url_for(database), connect_args=connect_args(self.dialect))
        try:
            with engine.connect() as conn:
                rows = conn.exec_driver_sql(
                    f"SELECT id, state, number_of_attempts, finished_at, pid FROM {table}"
                ).all()
        finally:
            engine.dispose()
        out = []
        for job_id, state, attempts, finished_at, pid in rows:
            if isinstance(finished_at, dt.datetime):
                if finished_at.tzinfo is None:  # MySQL: DATETIME(6) in UTC
                    finished_at = finished_at.replace(tzinfo=dt.UTC)
                finished_at = finished_at.timestamp()
            out.append(
                {"id": job_id, "state": state, "attempts": attempts, "finished_at": finished_at, "pid": pid}
            )
        return out

    def version(self) -> str:
        with self.engine.connect() as conn:
            if self.dialect == "postgres":
                return "PostgreSQL " + conn.exec_driver_sql("SHOW server_version").scalar_one().split()[0]
            text = conn.exec_driver_sql("SELECT VERSION()").scalar_one()
            return ("MariaDB " if "mariadb" in text.lower() else "MySQL ") + text.split("-")[0]

    def close(self) -> None:
        self.engine.dispose()


def connect_args(dialect: str) -> dict[str, Any]:
    """The harness's own connections: no server-side prepared statements (a pooler such as
    PgBouncer in transaction mode cannot route them)."""
    return {"prepare_threshold": None} if dialect == "postgres" else {}


def rabbitmqctl(*args: str, timeout: float = 60) -> str:
    proc = subprocess.run([RABBITMQCTL, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"rabbitmqctl {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def rabbit_names(prefix: str) -> tuple[list[str], list[str]]:
    """The queues and exchanges whose names start with `prefix` (a run's own)."""
    queues = rabbitmqctl("list_queues", "name", "--quiet", "--no-table-headers").split()
    exchanges = rabbitmqctl("list_exchanges", "name", "--quiet", "--no-table-headers").split()
    return [q for q in queues if q.startswith(prefix)], [e for e in exchanges if e.startswith(prefix)]


def delete_broker_objects(prefix: str) -> int:
    """Delete the run's RabbitMQ queues and exchanges (bgq names both `<queue>_<priority>[_<ms>]`)."""
    import pika

    queues, exchanges = rabbit_names(prefix)
    if not queues and not exchanges:
        return 0
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = conn.channel()
        for name in queues:
            channel.queue_delete(name)
        for name in exchanges:
            channel.exchange_delete(name)
    finally:
        conn.close()
    return len(queues) + len(exchanges)


def rabbit_version() -> str:
    try:
        return "RabbitMQ " + rabbitmqctl("version", timeout=30).strip()
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"RabbitMQ unknown ({type(exc).__name__})"


def versions(dialects: list[str], broker: bool) -> list[str]:
    from importlib.metadata import version

    out = [f"bgq {version('bgq')}"]
    for d in dialects:
        server = Server(d)
        try:
            out.append(server.version())
        finally:
            server.close()
    if broker:
        out.append(rabbit_version())
    out.append(f"Python {sys.version.split()[0]}")
    return out
