"""Splits the cost of one job of a one-group chain (the speed issue's goal 3) into its parts, per dialect.

Usage: python tools/chain_timing.py [--jobs 3000] [--dialects mysql,postgres] [--statements]
One process, one connection, one group: N READY jobs in group "one"; the first is claimed with
claim_batch, then every job is handed on as `bgq work` does it, with no callback in between:
hand_off(its FINISHED result, ["one"]) claims the next head in the same call, then COMMIT.
Prints the median per job, in ms:
  hand_off      the call (on PostgreSQL it runs as a statement of its own, autocommit, as `bgq
                work` sends it, so its commit is inside this figure)
  commit        the COMMIT after it (on PostgreSQL nothing is left to commit: ~0)
  per job       hand_off + commit + the Python between two calls (the total time / N)
  jobs/s        1000 / per job: the chain's ceiling on one connection, without a callback
  select 1      one `SELECT 1` round trip (the driver and the network, no work)
  floor         one INSERT of one row + COMMIT (the durable commit floor of the benchmark)
So hand_off - floor is what the procedure costs beyond a durable one-row commit.
--statements (MySQL/MariaDB only): also the statements of one hand_off in the middle of the chain
and their times (SHOW PROFILES; profiling adds a little to each).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy.engine import Connection  # noqa: E402

from bgq.db import Database  # noqa: E402
from bgq.model import Claimed, JobResult, JobState  # noqa: E402
from bgq.sql.calls import Procs  # noqa: E402
from bgq.sql.install import install, uninstall  # noqa: E402
from tools.head_timing import URLS  # noqa: E402 (the same servers, the same environment variables)


def fill(db: Database, table: str, jobs: int) -> None:
    now = db.dialect.now_sql()
    cols = "queue, priority, callback_name, state, serial_group, mode, created_at, updated_at"
    values = f"('general', 2, 'noop', {int(JobState.READY)}, 'one', 'normal', {now}, {now})"
    with db.transaction() as conn:
        for start in range(0, jobs, 1000):
            part = min(1000, jobs - start)
            conn.exec_driver_sql(f"INSERT INTO {table} ({cols}) VALUES " + ", ".join([values] * part))


def measure(dialect: str, jobs: int, statements: bool = False) -> dict[str, float]:
    db = Database(URLS[dialect])
    table = f"bgq_chain_{uuid.uuid4().hex[:8]}"
    try:
        install(db, table)
        fill(db, table, jobs)
        procs = Procs(db, table)
        pid = os.getpid()
        calls: list[float] = []
        commits: list[float] = []
        rtts: list[float] = []
        floors: list[float] = []
        with db.engine.connect() as conn:
            with conn.begin():
                (first,) = procs.claim_batch(conn, "general", 1, pid, None, None, 1000, max_heads=1)
            job: Claimed | None = first
            started = time.perf_counter()
            done = 0
            while job is not None:
                profile = statements and dialect == "mysql" and done == jobs // 2
                if profile:  # on the driver's cursor: outside SQLAlchemy's transaction
                    driver_sql(conn, "SET profiling = 1, profiling_history_size = 100")
                tx = conn.begin()
                t0 = time.perf_counter()
                done_job = JobResult(job.id, job.claim.attempt or 0, int(JobState.FINISHED))
                _, heads = procs.hand_off(
                    conn, [done_job], ["one"], "general", pid, None, None, 1000, alone=True
                )
                t1 = time.perf_counter()
                tx.commit()
                t2 = time.perf_counter()
                if profile:
                    print_profile(conn)
                calls.append(t1 - t0)
                commits.append(t2 - t1)
                done += 1
                job = heads[0] if heads else None
            total = time.perf_counter() - started
            if done != jobs:
                raise RuntimeError(f"the chain ran {done} of {jobs} jobs")
            conn.exec_driver_sql(f"CREATE TABLE {table}_floor (id INT PRIMARY KEY, v INT)")
            conn.commit()
            raw: Any = conn.connection.driver_connection
            for i in range(min(jobs, 2000)):
                t0 = time.perf_counter()
                cursor = raw.cursor()
                cursor.execute("SELECT 1")
                cursor.fetchall()
                cursor.close()
                t1 = time.perf_counter()
                cursor = raw.cursor()
                cursor.execute(f"INSERT INTO {table}_floor VALUES (%s, 1)", (i,))
                cursor.close()
                raw.commit()
                t2 = time.perf_counter()
                rtts.append(t1 - t0)
                floors.append(t2 - t1)
            conn.exec_driver_sql(f"DROP TABLE {table}_floor")
            conn.commit()
        ms = 1000.0
        return {
            "hand_off": statistics.median(calls) * ms,
            "commit": statistics.median(commits) * ms,
            "per_job": total / jobs * ms,
            "jobs_s": jobs / total,
            "select_1": statistics.median(rtts) * ms,
            "floor": statistics.median(floors) * ms,
        }
    finally:
        uninstall(db, table)
        db.engine.dispose()


def driver_sql(conn: Connection, sql: str) -> list[Any]:
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def print_profile(conn: Connection) -> None:
    """The statements since profiling was turned on (one hand_off and its COMMIT), slowest first."""
    rows = driver_sql(conn, "SHOW PROFILES")
    driver_sql(conn, "SET profiling = 0")
    print(f"  one hand_off: {len(rows)} statements, {sum(r[1] for r in rows) * 1000:.3f} ms in all")
    for row in sorted(rows, key=lambda r: -r[1]):
        print(f"    {row[1] * 1000:7.3f} ms  {' '.join(row[2].split())[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--dialects", default="mysql,postgres")
    parser.add_argument("--statements", action="store_true", help="MySQL: one hand_off's statements")
    args = parser.parse_args()
    print(
        f"{'dialect':9} {'jobs':>6} {'hand_off ms':>12} {'commit ms':>10} {'per job ms':>11} "
        f"{'jobs/s':>7} {'select 1 ms':>12} {'floor ms':>9}"
    )
    for dialect in args.dialects.split(","):
        r = measure(dialect, args.jobs, args.statements)
        print(
            f"{dialect:9} {args.jobs:>6} {r['hand_off']:>12.3f} {r['commit']:>10.3f} {r['per_job']:>11.3f} "
            f"{r['jobs_s']:>7.0f} {r['select_1']:>12.3f} {r['floor']:>9.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
