"""Times head-of-group selection and the claim path with many WAITING jobs, on MariaDB and PostgreSQL.

Usage: python tools/head_timing.py [--sizes 1000,20000,100000] [--groups 5000] [--dialects mysql,postgres]
       [--explain]
Each size W fills a fresh table: per group (G = min(W, --groups)) one PROCESSING job, then the W
WAITING jobs spread at random over the groups with priorities 1 to 3; the group rows are derived
by the procedures themselves, then the tables are analysed. Prints the median of 7 runs per
operation, in ms (every write is rolled back, so each run sees the same table):
  group_heads     one group_heads call: every group's WAITING head (G rows)
  predecessor     one predecessor call for a WAITING job (mean over 10 jobs per run)
  claim(wait)     one claim of a WAITING job whose group runs a job, refused "waiting" (mean of 10)
  batch(busy)     one claim_batch (bgq work's claim, limit 100) while every group runs a job:
                  no head may be claimed, it claims nothing
  batch(idle)     one claim_batch (limit 1) after the running jobs were set FINISHED in the same
                  transaction (untimed): all G heads may be claimed, it claims the first
  fill s          the time the fill took (setup, not a result)
batch(...) shows "-" if the installed bgq has no claim_batch. Bounded: at most the sizes given.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bgq.db import Database  # noqa: E402
from bgq.sql.calls import Procs  # noqa: E402
from bgq.sql.install import install, uninstall  # noqa: E402

URLS = {
    "mysql": os.environ.get("BGQ_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "postgres": os.environ.get("BGQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
}
RUNS = 7


def fill(db: Database, table: str, waiting: int, groups: int) -> list[int]:
    """Insert `groups` PROCESSING jobs and `waiting` WAITING jobs; return the WAITING ids."""
    rng = random.Random(1)
    now = db.dialect.now_sql()
    cols = "queue, priority, callback_name, state, serial_group, mode, created_at, updated_at"
    with db.transaction() as conn:
        rows = [(f"g{g}", 2) for g in range(groups)]
        _insert(conn, table, cols, now, rows, state=2)
        rows = [(f"g{rng.randrange(groups)}", rng.choice((1, 2, 3))) for _ in range(waiting)]
        _insert(conn, table, cols, now, rows, state=6)
    procs = Procs(db, table)
    with db.transaction() as conn:
        for g in range(groups):  # group_wake derives each group row (no promotion: a job runs)
            conn.exec_driver_sql(_wake_sql(db, table), (f"g{g}",))
        ids = [r[0] for r in conn.exec_driver_sql(f"SELECT id FROM {table} WHERE state = 6").all()]
        if db.dialect.name == "postgres":
            conn.exec_driver_sql(f"ANALYZE {table}")
            conn.exec_driver_sql(f"ANALYZE {table}_group")
        else:
            conn.exec_driver_sql(f"ANALYZE TABLE {table}, {table}_group").all()
    del procs
    return ids


def _wake_sql(db: Database, table: str) -> str:
    if db.dialect.name == "postgres":
        return f"SELECT {table}_group_wake(%s, NULL)"
    return f"CALL {table}_group_wake(%s, NULL, @promoted)"


def _insert(conn, table, cols, now, rows, state, chunk=2000):
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        values = ", ".join(f"('general', %s, 'noop', {state}, %s, 'normal', {now}, {now})" for _ in part)
        params = [v for group, prio in part for v in (prio, group)]
        conn.exec_driver_sql(f"INSERT INTO {table} ({cols}) VALUES {values}", tuple(params))


def timed(fn) -> float:
    samples = []
    for _ in range(RUNS):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def batch_claim(db: Database, procs: Procs, limit: int, expected: int, conn) -> None:
    """One claim_batch for queue 'general', rolled back (in `conn`'s transaction if given)."""
    if conn is not None:
        claimed = procs.claim_batch(conn, "general", limit, 1, None, None, 1000)
        assert len(claimed) == expected, (len(claimed), expected)
        return
    with db.engine.connect() as conn, conn.begin() as tx:
        batch_claim(db, procs, limit, expected, conn)
        tx.rollback()


def timed_in_tx(db: Database, prepare_sql: str, fn) -> float:
    """Median ms of fn(conn), each run in its own transaction after `prepare_sql` (untimed), rolled back."""
    samples = []
    for _ in range(RUNS):
        with db.engine.connect() as conn, conn.begin() as tx:
            conn.exec_driver_sql(prepare_sql)
            started = time.perf_counter()
            fn(conn)
            samples.append((time.perf_counter() - started) * 1000)
            tx.rollback()
    return statistics.median(samples)


def measure(dialect: str, waiting: int, groups: int, explain: bool) -> dict[str, float]:
    db = Database(URLS[dialect])
    table = f"bgq_bench_{uuid.uuid4().hex[:8]}"
    try:
        install(db, table)
        fill_started = time.perf_counter()
        ids = fill(db, table, waiting, groups)
        fill_s = time.perf_counter() - fill_started
        procs = Procs(db, table)
        sample = random.Random(2).sample(ids, min(50, len(ids)))

        with db.transaction() as conn:
            expected = conn.exec_driver_sql(
                f"SELECT COUNT(DISTINCT serial_group) FROM {table} WHERE state = 6"
            ).scalar_one()

        def heads():
            with db.transaction() as conn:
                assert len(procs.group_heads(conn)) == expected

        def predecessor():
            with db.transaction() as conn:
                for job in sample[:10]:
                    procs.predecessor(conn, job)

        def claim_waiting():  # the claim of a job that must keep waiting, rolled back
            with db.engine.connect() as conn, conn.begin() as tx:
                for job in sample[:10]:
                    assert procs.claim(conn, job, "general", 1, 1000, None).outcome == "waiting"
                tx.rollback()

        result = {
            "fill_s": fill_s,
            "group_heads_ms": timed(heads),
            "predecessor_ms": timed(predecessor) / 10,
            "claim_waiting_ms": timed(claim_waiting) / 10,
        }
        if hasattr(procs, "claim_batch"):  # bgq work's claim (it came with `bgq work`)
            result["batch_busy_ms"] = timed(lambda: batch_claim(db, procs, 100, 0, None))
            free = f"UPDATE {table} SET state = 3 WHERE state = 2"
            result["batch_idle_ms"] = timed_in_tx(db, free, lambda c: batch_claim(db, procs, 1, 1, c))
        if explain:
            print_explain(db, table)
        return result
    finally:
        uninstall(db, table)
        db.dispose()


def print_explain(db: Database, table: str) -> None:
    queries = {
        "running job of a group": f"SELECT id FROM {table} WHERE {_running(db)} = 'g1'",
        "head of a group": f"SELECT id, state FROM {table} WHERE {_pending(db)} "
        "ORDER BY priority, id LIMIT 1",
        "waiting head of a group": f"SELECT id FROM {table} WHERE serial_group = 'g1' AND state = 6 "
        "ORDER BY priority, id LIMIT 1",
        "all group heads": f"SELECT serial_group, waiting_head_id FROM {table}_group "
        "WHERE waiting_head_id IS NOT NULL ORDER BY waiting_head_id",
        "due jobs (cron)": f"SELECT id FROM {table} WHERE state IN (1, 4, 6, 8) ORDER BY id LIMIT 1000",
    }
    with db.transaction() as conn:
        for label, query in queries.items():
            print(f"  EXPLAIN {label}:")
            for row in conn.exec_driver_sql(f"EXPLAIN {query}").all():
                print("    " + " | ".join(str(v) for v in row))


def _running(db: Database) -> str:
    return "running_group" if db.dialect.name == "mysql" else "state = 2 AND serial_group"


def _pending(db: Database) -> str:
    if db.dialect.name == "mysql":
        return "pending_group = 'g1'"
    return "serial_group = 'g1' AND state IN (-1, 1, 4, 6, 8)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,20000,100000")
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--dialects", default="mysql,postgres")
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN of the hot queries at each size"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"{'dialect':9} {'waiting':>8} {'groups':>6} {'group_heads ms':>15} {'predecessor ms':>15} "
        f"{'claim(wait) ms':>15} {'batch(busy) ms':>15} {'batch(idle) ms':>15} {'fill s':>7}"
    )
    failed = False
    for dialect in args.dialects.split(","):
        for size in sizes:
            groups = min(args.groups, size)
            try:
                r = measure(dialect, size, groups, args.explain)
            except Exception as exc:  # report it and go on with the other sizes and dialects
                failed = True
                why = str(exc).splitlines()[0][:200] if str(exc) else ""
                print(f"{dialect:9} {size:>8} {groups:>6} failed: {type(exc).__name__}: {why}", flush=True)
                continue
            batch = [f"{r[k]:>15.2f}" if k in r else f"{'-':>15}" for k in ("batch_busy_ms", "batch_idle_ms")]
            print(
                f"{dialect:9} {size:>8} {groups:>6} {r['group_heads_ms']:>15.2f} "
                f"{r['predecessor_ms']:>15.3f} {r['claim_waiting_ms']:>15.3f} {' '.join(batch)} "
                f"{r['fill_s']:>7.1f}",
                flush=True,
            )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
