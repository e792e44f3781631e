"""Time the console's pages on a table of 1,000,000 jobs per dialect, and EXPLAIN what they run.

    .venv/bin/python tools/web_timing.py                       # both dialects, 1,000,000 rows
    .venv/bin/python tools/web_timing.py --dialect mysql --rows 100000 --explain

The rows are inserted set-based (generate_series on PostgreSQL, a cross join of digits on
MySQL/MariaDB): 88 % FINISHED, 5 % READY, 3 % TEMPORARILY_FAILED, 1 % PERMANENTLY_FAILED, 3 %
WAITING; one job in five in one of 1,000 serial groups; three queues, seven callbacks; the last
hour holds 3,600 changes. Each page is requested through Starlette's TestClient (rendering
included) five times after one warm-up; the median is reported. --explain prints the plan of
every statement a page ran (captured as it ran). The table is dropped afterwards.
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

from sqlalchemy import event  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from bgq import Queue  # noqa: E402
from bgq.sql.install import install, uninstall  # noqa: E402
from bgq.web import app  # noqa: E402

URLS = {
    "mysql": os.environ.get("BGQ_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
    "postgres": os.environ.get("BGQ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
}

# The columns filled, and each one's value for row number n (1..N) and "now" (per dialect).
_STATE = "CASE WHEN {n} % 100 < 88 THEN 3 WHEN {n} % 100 < 93 THEN 1 WHEN {n} % 100 < 96 THEN 4 WHEN {n} % 100 < 97 THEN 5 ELSE 6 END"  # noqa: E501


def _insert_sql(dialect: str, table: str, rows: int) -> str:
    n = "g" if dialect == "postgres" else "s.n"
    cat = (
        (lambda *parts: " || ".join(parts))
        if dialect == "postgres"
        else (lambda *p: f"CONCAT({', '.join(p)})")
    )
    text = (lambda e: f"CAST({e} AS TEXT)") if dialect == "postgres" else (lambda e: f"CAST({e} AS CHAR)")
    if dialect == "postgres":
        ago = f"CLOCK_TIMESTAMP() - ({rows} - {n}) * INTERVAL '1 second'"
    else:
        ago = f"UTC_TIMESTAMP(6) - INTERVAL ({rows} - {n}) SECOND"
    state = _STATE.format(n=n)
    select = (
        f"SELECT CASE WHEN {n} % 10 < 7 THEN 'general' WHEN {n} % 10 < 9 THEN 'mail' ELSE 'reports' END,"
        f" 1 + {n} % 3, {cat(repr('cb'), text(f'{n} % 7'))}, '[1, 2]', {state}, {ago}, {ago},"
        f" CASE WHEN {n} % 5 = 0 THEN {cat(repr('g'), text(f'{n} % 1000'))} END,"
        f" CASE WHEN {n} % 10 = 3 THEN {cat(repr('id-'), text(n))} END,"
        f" CASE WHEN {state} IN (4, 5) THEN {cat(repr('TimeoutError: upstream '), text(f'{n} % 50'))} END,"
        f" CASE WHEN {state} IN (3, 4, 5) THEN {ago} END, CASE WHEN {state} IN (3, 4, 5) THEN 1 ELSE 0 END,"
        f" CASE WHEN {state} = 3 THEN {ago} END"
    )
    columns = (
        "queue, priority, callback_name, parameters_json, state, created_at, updated_at, serial_group,"
        " identifier, error_message, last_attempt_at, number_of_attempts, finished_at"
    )
    if dialect == "postgres":
        return f"INSERT INTO {table} ({columns}) {select} FROM generate_series(1, {rows}) AS g"
    digits = " UNION ALL ".join(f"SELECT {d} AS d" for d in range(10))
    numbers = (
        f"SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * h.d AS n"
        f" FROM ({digits}) a, ({digits}) b, ({digits}) c, ({digits}) e, ({digits}) f, ({digits}) h"
    )
    return f"INSERT INTO {table} ({columns}) {select} FROM ({numbers}) AS s WHERE s.n <= {rows}"


def fill(queue: Queue, dialect: str, rows: int) -> float:
    started = time.monotonic()
    with queue.database.engine.begin() as conn:
        conn.exec_driver_sql(_insert_sql(dialect, queue.config.table_name, rows).replace("%", "%%"))
    # Statistics, and on PostgreSQL the visibility map that index-only scans need (autovacuum
    # keeps it on a table in use; a table filled a second ago has none yet).
    with queue.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        analyze = "VACUUM ANALYZE {}" if dialect == "postgres" else "ANALYZE TABLE {}"
        conn.exec_driver_sql(analyze.format(queue.config.table_name)).close()
    return time.monotonic() - started


def pages(queue: Queue) -> dict[str, str]:
    """The pages to time: first pages, a deep keyset page, filters, the groups."""
    with queue.database.engine.begin() as conn:
        (low,) = conn.exec_driver_sql(f"SELECT MIN(id) FROM {queue.config.table_name}").one()
    return {
        "overview": "/",
        "jobs, first page": "/jobs",
        "jobs, deep keyset page (50 rows after the ~999,950th newest)": f"/jobs?after={low + 60}",
        "jobs, state=PERMANENTLY_FAILED": "/jobs?state=5",
        "jobs, state=PERMANENTLY_FAILED, deep page": f"/jobs?state=5&after={low + 50_000}",
        "jobs, serial group g500": "/jobs?group=g500",
        "jobs, identifier": "/jobs?identifier=id-503",
        "jobs, queue=reports": "/jobs?queue=reports",
        "jobs, callback cb3 + state READY": "/jobs?callback=cb3&state=1",
        "jobs, state 4 + error text (1 in 3 match)": "/jobs?state=4&error=upstream%2044",
        "jobs, state 4 + error text, no match (reads all 30,000)": "/jobs?state=4&error=upstream%2017",
        "failures (states 4, 5)": "/failures",
        "serial groups, first page": "/groups",
        "serial groups, page after g900": "/groups?after=g900",
        "serial groups, one group": "/groups?name=g500",
    }


def measure(queue: Queue, dialect: str, explain: bool) -> list[tuple[str, float]]:
    client = TestClient(app(queue, no_auth=True))
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and queue.config.table_name in statement:
            seen.append((statement, parameters))

    event.listen(queue.database.engine, "before_cursor_execute", capture)
    out = []
    for name, url in pages(queue).items():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code, response.text[:300])
        times = []
        for _ in range(5):
            started = time.perf_counter()
            client.get(url)
            times.append(time.perf_counter() - started)
        out.append((name, statistics.median(times) * 1000))
        print(f"  {dialect:8} {statistics.median(times) * 1000:8.1f} ms  {name}  ({url})", flush=True)
        if explain:
            seen.clear()
            client.get(url)
            for statement, parameters in seen:
                prefix = "EXPLAIN " if dialect == "postgres" else "EXPLAIN "
                with queue.database.engine.begin() as conn:
                    plan = conn.exec_driver_sql(prefix + statement, parameters).all()
                print(f"      {statement[:160]}")
                for line in plan:
                    print("        " + " | ".join(str(c) for c in line))
    event.remove(queue.database.engine, "before_cursor_execute", capture)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dialect", choices=["mysql", "postgres", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--explain", action="store_true", help="print each statement's plan")
    args = parser.parse_args()
    for dialect in ("mysql", "postgres") if args.dialect == "both" else (args.dialect,):
        table = f"bgqweb_{uuid.uuid4().hex[:8]}"
        queue = Queue(callbacks={"cb": lambda: None}, database_url=URLS[dialect], table_name=table)
        install(queue.database, table)
        try:
            print(f"{dialect}: inserting {args.rows:,} rows ...", flush=True)
            print(f"  {dialect:8} filled in {fill(queue, dialect, args.rows):.1f} s", flush=True)
            measure(queue, dialect, args.explain)
        finally:
            uninstall(queue.database, table)
            queue.close()


if __name__ == "__main__":
    main()
