"""The durable single-row commit floor: one INSERT + COMMIT per transaction, K clients, per dialect.

Each client is its own process (`python tools/bench/floor.py client ...`): it connects with the
driver bgq uses on that dialect (psycopg on PostgreSQL, PyMySQL on MariaDB), waits for the go
file, then runs `INSERT INTO <table> (v) VALUES (1); COMMIT` in a loop for the given seconds and
prints how many commits it completed and in how many seconds. The floor is the sum over clients of
commits / seconds. Nothing is relaxed: the servers' own durability settings apply, and
`settings()` reports them (synchronous_commit, fsync; innodb_flush_log_at_trx_commit, sync_binlog).

A job of a durable queue needs at least one such commit (its claim or its finish), so no queue on
the same server and client count can process more jobs per second than this, except by batching
several jobs into one commit.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve()


def _connect(dialect: str, url: str):
    if dialect == "postgres":
        import psycopg

        return psycopg.connect(url, autocommit=False)
    import pymysql

    host, port, user, db = _mysql_parts(url)
    return pymysql.connect(host=host, port=port, user=user, database=db, autocommit=False)


def _mysql_parts(url: str) -> tuple[str, int, str, str]:
    """host, port, user, database of a `mysql+pymysql://user@host:port/db` URL (no password)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return u.host or "127.0.0.1", u.port or 3306, u.username or "root", u.database or "test"


def settings(dialect: str, url: str) -> str:
    """The server's durability settings, as one line for the report."""
    conn = _connect(dialect, url)
    try:
        cur = conn.cursor()
        if dialect == "postgres":
            out = []
            for name in ("synchronous_commit", "fsync", "wal_sync_method", "full_page_writes"):
                cur.execute(f"SHOW {name}")
                out.append(f"{name}={cur.fetchone()[0]}")
        else:
            names = ("innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin", "innodb_doublewrite")
            cur.execute("SELECT " + ", ".join(f"@@{n}" for n in names))
            out = [f"{n}={v}" for n, v in zip(names, cur.fetchone(), strict=True)]
        conn.rollback()
        return ", ".join(out)
    finally:
        conn.close()


def client(dialect: str, url: str, table: str, seconds: float, go: str) -> None:
    conn = _connect(dialect, url)
    cur = conn.cursor()
    sql = f"INSERT INTO {table} (v) VALUES (1)"
    cur.execute(sql)  # warm-up: parse, plan, first page
    conn.commit()
    print("ready", flush=True)
    limit = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > limit:
            sys.exit(3)
        time.sleep(0.002)
    commits = 0
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        cur.execute(sql)
        conn.commit()
        commits += 1
    print(f"{commits} {time.monotonic() - start:.6f}", flush=True)
    conn.close()


def measure(dialect: str, url: str, clients: int, seconds: float) -> float:
    """Commits per second of `clients` processes on a fresh table (dropped afterwards)."""
    table = f"bench_floor_{uuid.uuid4().hex[:8]}"
    conn = _connect(dialect, url)
    try:
        cur = conn.cursor()
        key = "BIGSERIAL PRIMARY KEY" if dialect == "postgres" else "BIGINT AUTO_INCREMENT PRIMARY KEY"
        cur.execute(f"CREATE TABLE {table} (id {key}, v INT NOT NULL)")
        conn.commit()
        tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
        go = tmp / "go"
        procs = [
            subprocess.Popen(
                [sys.executable, str(HERE), "client", dialect, url, table, str(seconds), str(go)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(clients)
        ]
        try:
            for p in procs:  # each prints "ready" once connected and warmed up
                if p.stdout is None or p.stdout.readline().strip() != "ready":
                    raise RuntimeError("a commit-floor client failed to start")
            go.touch()
            rate = 0.0
            for p in procs:
                out, _ = p.communicate(timeout=seconds + 60)
                commits, took = out.split()
                rate += int(commits) / float(took)
            return rate
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            go.unlink(missing_ok=True)
            tmp.rmdir()
    finally:
        with contextlib.suppress(Exception):
            conn.rollback()
            conn.cursor().execute(f"DROP TABLE IF EXISTS {table}")
            conn.commit()
        conn.close()


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), sys.argv[6])
    else:
        raise SystemExit("usage: floor.py client DIALECT URL TABLE SECONDS GO")
