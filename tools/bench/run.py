"""Benchmarks bgq (cron/broker mode, PostgreSQL/MariaDB) side by side with procrastinate, pgqueuer, celery.

Usage: python tools/bench/run.py [--jobs 10000] [--case-timeout 120] [--deadline 1200] [--out FILE]
Cases: (a) enqueue one by one, (b) enqueue in bulk (500 per batch), (c) process with 1 worker process,
(d) with 2, (e) all jobs in one serial group on 2 workers, (f) jobs spread over 100 groups on 2 workers.
Every processing case enqueues its jobs first (untimed), starts the workers, waits until they have
imported and connected, then times from "go" until the database (or, for celery, the workers' done
files) reports all N jobs done. Everything is bounded: a per-case timeout, a global deadline, and
worker processes (own process groups) are killed when a case ends. Each system gets fresh
databases / tables / queue names and removes them afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
CASES = ["a", "b", "c", "d", "e", "f"]
CASE_TITLES = {
    "a": "(a) enqueue 1-by-1",
    "b": "(b) enqueue bulk",
    "c": "(c) 1 worker",
    "d": "(d) 2 workers",
    "e": "(e) 1 group, 2 workers",
    "f": "(f) 100 groups, 2 workers",
}
GROUPS = {"c": None, "d": None, "e": 1, "f": 100}
WORKERS = {"c": 1, "d": 2, "e": 2, "f": 2}
BULK = 500
POLL = 0.05


class CaseTimeout(Exception):
    pass


class NotApplicable(Exception):
    pass


def group_of(i: int, groups: int | None) -> str | None:
    if groups is None:
        return None
    return "one" if groups == 1 else f"g{i % groups}"


def silent_logger() -> logging.Logger:
    log = logging.getLogger("bgq.bench.silent")
    log.disabled = True
    return log


def noop(*args, **kwargs) -> None:
    return None


def bounded(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise CaseTimeout


# --- PostgreSQL databases -------------------------------------------------------------------------


def pg_create_db(prefix: str) -> str:
    import psycopg

    name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return name


def pg_drop_db(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_dsn(db: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + db


def amqp_delete(queues: list[str]) -> None:
    import pika

    try:
        conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    except Exception:
        return
    try:
        for name in queues:
            for kind in ("queue", "exchange"):
                try:
                    ch = conn.channel()
                    if kind == "queue":
                        ch.queue_delete(name)
                    else:
                        ch.exchange_delete(name)
                    ch.close()
                except Exception:
                    pass
    finally:
        with contextlib.suppress(Exception):
            conn.close()


# --- systems --------------------------------------------------------------------------------------
# A system sets itself up, enqueues (timed by the caller), counts done jobs and cleans up.
# `worker_spec(case)` is the JSON handed to `run.py --worker`.


class System:
    name = ""
    mode = ""
    dialect = ""
    bulk_supported = True
    groups_supported = True
    only_cases: set[str] | None = None

    def label(self) -> str:
        return f"{self.name} / {self.mode} / {self.dialect}"

    def setup(self) -> None: ...

    def cleanup(self) -> None: ...

    def reset(self, case: str) -> None: ...

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None: ...

    def done(self) -> int: ...

    def worker_spec(self, case: str) -> dict: ...


class Bgq(System):
    name = "bgq"

    def __init__(self, dialect: str, broker: bool) -> None:
        self.dialect = "postgres" if dialect == "postgres" else "mariadb"
        self.broker = broker
        self.mode = "broker" if broker else "cron"
        self.table = f"bgqb_{uuid.uuid4().hex[:8]}"
        self.db_name: str | None = None
        self.url = MYSQL_URL
        self.queues_used: list[str] = []
        self.qname = ""
        self._engine = None

    def setup(self) -> None:
        from sqlalchemy import create_engine

        import bgq

        if self.dialect == "postgres":
            self.db_name = pg_create_db("bgq")
            self.url = pg_dsn(self.db_name).replace("postgresql://", "postgresql+psycopg://")
        q = bgq.Queue(callbacks={"noop": noop}, database_url=self.url, table_name=self.table)
        q.install()
        q.close()
        self._engine = create_engine(self.url, isolation_level="AUTOCOMMIT", pool_size=1)

    def queue(self, bulk_size: int = 1):
        import bgq

        producer = None
        if self.broker:
            from bgq.broker.rabbitmq import RabbitMQ

            producer = RabbitMQ(AMQP_URL)
        return bgq.Queue(
            callbacks={"noop": noop},
            database_url=self.url,
            table_name=self.table,
            queue=self.qname,
            bulk_size=bulk_size,
            producer=producer,
            logger=silent_logger(),
        )

    def reset(self, case: str) -> None:
        self.qname = f"bq{uuid.uuid4().hex[:8]}{case}"
        self.queues_used += [f"{self.qname}_{p}" for p in (0, 1)] + [f"{self.qname}_1_1000"]
        with self._engine.connect() as conn:
            conn.exec_driver_sql(f"DELETE FROM {self.table}")
            conn.exec_driver_sql(f"DELETE FROM {self.table}_group")

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        q = self.queue(BULK if bulk else 1)
        try:
            if bulk:
                q.start_bulk()
            for i in range(n):
                q.publish("noop", serial_group=group_of(i, groups))
                if i % 100 == 0:
                    bounded(deadline)
            if bulk:
                q.end_bulk()
        finally:
            q.close()

    def done(self) -> int:
        with self._engine.connect() as conn:
            return conn.exec_driver_sql(f"SELECT COUNT(*) FROM {self.table} WHERE state = 3").scalar_one()

    def worker_spec(self, case: str) -> dict:
        return {"url": self.url, "table": self.table, "queue": self.qname, "broker": self.broker}

    def cleanup(self) -> None:
        from bgq.db import Database
        from bgq.install import uninstall

        if self._engine is not None:
            self._engine.dispose()
        if self.broker:
            amqp_delete(self.queues_used)
        if self.db_name:
            pg_drop_db(self.db_name)
        else:
            db = Database(self.url)
            try:
                uninstall(db, self.table)
            finally:
                db.dispose()


class Procrastinate(System):
    name, mode, dialect = "procrastinate", "worker", "postgres"

    def setup(self) -> None:
        import psycopg

        self.db_name = pg_create_db("procr")
        self.dsn = pg_dsn(self.db_name)
        self.app = make_procrastinate(self.dsn)
        with self.app.open():
            self.app.schema_manager.apply_schema()
        self.conn = psycopg.connect(self.dsn, autocommit=True)

    def reset(self, case: str) -> None:
        self.conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        task = self.app.tasks["bench_noop"]
        with self.app.open():
            if bulk:
                for start in range(0, n, BULK):
                    count = min(BULK, n - start)
                    if groups is None:
                        task.batch_defer(*[{} for _ in range(count)])
                    else:  # a lock is per job: one batch per lock value
                        by_lock: dict[str, int] = {}
                        for i in range(start, start + count):
                            lock = group_of(i, groups)
                            by_lock[lock] = by_lock.get(lock, 0) + 1
                        for lock, k in by_lock.items():
                            task.configure(lock=lock).batch_defer(*[{} for _ in range(k)])
                    bounded(deadline)
            else:
                for i in range(n):
                    if groups is None:
                        task.defer()
                    else:
                        task.configure(lock=group_of(i, groups)).defer()
                    if i % 100 == 0:
                        bounded(deadline)

    def done(self) -> int:
        return self.conn.execute(
            "SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]

    def worker_spec(self, case: str) -> dict:
        return {"dsn": self.dsn}

    def cleanup(self) -> None:
        self.conn.close()
        pg_drop_db(self.db_name)


def make_procrastinate(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench_noop")
    def bench_noop() -> None:
        return None

    return app


class PgQueuer(System):
    name, mode, dialect = "pgqueuer", "worker", "postgres"

    def setup(self) -> None:
        import psycopg

        self.db_name = pg_create_db("pgq")
        self.dsn = pg_dsn(self.db_name)
        asyncio.run(self._install())
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.total = 0

    async def _install(self) -> None:
        import psycopg
        from pgqueuer import PsycopgDriver, Queries

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await Queries(PsycopgDriver(conn)).install()

    def reset(self, case: str) -> None:
        self.conn.execute("TRUNCATE pgqueuer")
        self.total = 0

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        self.total = n
        asyncio.run(self._enqueue(n, bulk, groups, deadline))

    async def _enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        import psycopg
        from pgqueuer import PsycopgDriver, Queries

        def ep(i: int) -> str:
            return "noop" if groups is None else f"noop_{i % groups}"

        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            q = Queries(PsycopgDriver(conn))
            if bulk:
                for start in range(0, n, BULK):
                    idx = range(start, min(n, start + BULK))
                    await q.enqueue([ep(i) for i in idx], [None] * len(idx), [0] * len(idx))
                    bounded(deadline)
            else:
                for i in range(n):
                    await q.enqueue(ep(i), None)
                    if i % 100 == 0:
                        bounded(deadline)

    def done(self) -> int:  # finished jobs leave the pgqueuer table (they are logged in pgqueuer_log)
        return self.total - self.conn.execute("SELECT COUNT(*) FROM pgqueuer").fetchone()[0]

    def worker_spec(self, case: str) -> dict:
        return {"dsn": self.dsn, "groups": GROUPS[case]}

    def cleanup(self) -> None:
        self.conn.close()
        pg_drop_db(self.db_name)


class Celery(System):
    name, mode, dialect = "celery", "worker", "rabbitmq"
    bulk_supported = False
    groups_supported = False

    def setup(self) -> None:
        self.queues_used: list[str] = []
        self.done_dir = ""

    def reset(self, case: str) -> None:
        self.qname = f"cel{uuid.uuid4().hex[:8]}{case}"
        self.queues_used.append(self.qname)

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        app, task = make_celery(self.qname, None)
        try:
            with app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async(producer=producer)
                    if i % 100 == 0:
                        bounded(deadline)
        finally:
            app.close()

    def done(self) -> int:
        return sum(p.stat().st_size for p in Path(self.done_dir).glob("done-*"))

    def worker_spec(self, case: str) -> dict:
        return {"queue": self.qname, "done_dir": self.done_dir}

    def cleanup(self) -> None:
        amqp_delete(self.queues_used)


def make_celery(qname: str, done_dir: str | None):
    from celery import Celery as CeleryApp

    app = CeleryApp("bench", broker=AMQP_URL)
    app.conf.update(
        task_default_queue=qname,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=False,
    )
    state: dict[str, int] = {}

    @app.task(name="bench.noop")
    def bench_noop() -> None:
        if done_dir is not None:  # one byte per finished job, in this worker's own file
            if "fd" not in state:
                path = os.path.join(done_dir, f"done-{os.getpid()}")
                state["fd"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.write(state["fd"], b"x")

    return app, bench_noop


# --- worker processes -----------------------------------------------------------------------------


def worker_main(kind: str, spec: dict, ready: str, go: str) -> None:
    """Runs in a subprocess: prepare, signal ready, wait for go, then work until killed or done."""

    def barrier() -> None:
        Path(ready).touch()
        limit = time.monotonic() + 120
        while not os.path.exists(go):
            if time.monotonic() > limit:
                sys.exit(3)
            time.sleep(0.005)

    if kind == "bgq":
        import bgq

        producer = None
        if spec["broker"]:
            from bgq.broker.rabbitmq import RabbitMQ

            producer = RabbitMQ(AMQP_URL)
        queue = bgq.Queue(
            callbacks={"noop": noop},
            database_url=spec["url"],
            table_name=spec["table"],
            queue=spec["queue"],
            producer=producer,
            logger=silent_logger(),
        )
        queue.procs  # connect and check the installed procedures before "go"  # noqa: B018
        barrier()
        if spec["broker"]:
            from bgq.worker import GracefulStop, consume

            with GracefulStop() as stop:
                consume(queue, None, 0, [1], stop)
            return
        table = spec["table"]
        while True:  # cron mode: loop process() until no unfinished job is left
            report = queue.process()
            if report.outcomes.get("claimed"):
                continue
            with queue.database.transaction() as conn:
                left = conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table} WHERE state <> 3").scalar_one()
            if left == 0:
                return
            time.sleep(POLL)
    elif kind == "procrastinate":
        app = make_procrastinate(spec["dsn"])
        logging.getLogger("procrastinate").setLevel(logging.ERROR)
        barrier()
        app.run_worker(concurrency=1, wait=True)
    elif kind == "pgqueuer":

        async def run() -> None:
            import psycopg
            from pgqueuer import PgQueuer as PgQ
            from pgqueuer import PsycopgDriver

            conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
            pgq = PgQ(PsycopgDriver(conn))

            async def handler(job) -> None:
                return None

            groups = spec["groups"]
            if groups is None:
                pgq.entrypoint("noop")(handler)
            else:  # one entrypoint per group, each serialised (concurrency_limit=1)
                for g in range(groups):
                    pgq.entrypoint(f"noop_{g}", concurrency_limit=1)(handler)
            barrier()
            await pgq.run()

        logging.getLogger("pgqueuer").setLevel(logging.ERROR)
        asyncio.run(run())
    elif kind == "celery":
        app, _task = make_celery(spec["queue"], spec["done_dir"])
        barrier()
        app.worker_main(
            [
                "worker",
                "--pool=solo",
                "--loglevel=ERROR",
                "-n",
                f"w{os.getpid()}@bench",
                "-Q",
                spec["queue"],
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    else:
        raise SystemExit(f"unknown worker kind {kind}")


def kill_group(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_processing(system: System, case: str, n: int, timeout: float, logdir: Path) -> str:
    kind = system.name
    workers = WORKERS[case]
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-{case}-"))
    procs: list[subprocess.Popen] = []
    try:
        if isinstance(system, Celery):
            system.done_dir = str(tmp)
        spec = json.dumps(system.worker_spec(case))
        go = tmp / "go"
        for i in range(workers):
            log = open(logdir / f"{kind}-{system.mode}-{system.dialect}-{case}-{i}.log", "w")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", kind, spec, str(tmp / f"ready-{i}"), str(go)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=ROOT,
                )
            )
            log.close()
        limit = time.monotonic() + 120
        while len(list(tmp.glob("ready-*"))) < workers:
            if time.monotonic() > limit or any(p.poll() not in (None, 0) for p in procs):
                return "error (worker start)"
            time.sleep(0.01)
        go.touch()
        started = time.monotonic()
        deadline = started + timeout
        while True:
            if system.done() >= n:
                return f"{n / (time.monotonic() - started):.0f}"
            if time.monotonic() > deadline:
                return f"timeout ({system.done()}/{n} in {timeout:.0f}s)"
            if all(p.poll() is not None for p in procs) and system.done() < n:
                return "error (workers exited)"
            time.sleep(POLL)
    finally:
        for p in procs:
            kill_group(p, grace=3.0)
        shutil.rmtree(tmp, ignore_errors=True)


def run_system(system: System, args, results: dict, global_deadline: float, logdir: Path) -> None:
    row = results.setdefault(system.label(), {})
    print(f"== {system.label()}", flush=True)
    try:
        system.setup()
    except Exception as exc:
        for c in CASES:
            row[c] = f"n/a (setup failed: {type(exc).__name__})"
        print(f"   setup failed: {exc!r}", flush=True)
        return
    try:
        for case in CASES:
            if system.only_cases is not None and case not in system.only_cases:
                row[case] = "n/a"
                continue
            if case == "b" and not system.bulk_supported:
                row[case] = "n/a (no batch API)"
                continue
            if case in ("e", "f") and not system.groups_supported:
                row[case] = "n/a (no serial groups)"
                continue
            remaining = global_deadline - time.monotonic()
            if remaining < 10:
                row[case] = "skipped (global deadline)"
                continue
            timeout = min(args.case_timeout, remaining)
            t0 = time.monotonic()
            try:
                system.reset(case)
                if case in ("a", "b"):
                    started = time.monotonic()
                    system.enqueue(args.jobs, case == "b", None, started + timeout)
                    row[case] = f"{args.jobs / (time.monotonic() - started):.0f}"
                else:
                    system.enqueue(args.jobs, system.bulk_supported, GROUPS[case], time.monotonic() + timeout)
                    row[case] = run_processing(system, case, args.jobs, timeout, logdir)
            except CaseTimeout:
                row[case] = f"timeout ({timeout:.0f}s)"
            except Exception as exc:
                row[case] = f"error ({type(exc).__name__})"
                print(f"   {case}: {exc!r}", flush=True)
            print(f"   {CASE_TITLES[case]}: {row[case]}  [{time.monotonic() - t0:.1f}s]", flush=True)
    finally:
        try:
            system.cleanup()
        except Exception as exc:
            print(f"   cleanup failed: {exc!r}", flush=True)


# --- report ---------------------------------------------------------------------------------------


def number(cell: str) -> float | None:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def table(results: dict) -> str:
    lines = [
        "| system / mode / dialect | " + " | ".join(CASE_TITLES[c] for c in CASES) + " |",
        "|---" * (len(CASES) + 1) + "|",
    ]
    for label, row in results.items():
        lines.append(f"| {label} | " + " | ".join(row.get(c, "") for c in CASES) + " |")
    ratios = []
    for c in CASES:
        ours = [number(r.get(c)) for lbl, r in results.items() if lbl.startswith("bgq ")]
        peers = [number(r.get(c)) for lbl, r in results.items() if not lbl.startswith("bgq ")]
        ours = [v for v in ours if v is not None]
        peers = [v for v in peers if v is not None]
        ratios.append(f"{max(ours) / max(peers):.2f}" if ours and peers else "n/a")
    lines.append("| **bgq best / best peer** | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in (
        "bgq",
        "procrastinate",
        "pgqueuer",
        "celery",
        "kombu",
        "SQLAlchemy",
        "psycopg",
        "PyMySQL",
        "pika",
    ):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} (not installed)")
    return out


def server_versions() -> list[str]:
    out = []
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN) as conn:
            out.append("PostgreSQL " + conn.execute("SHOW server_version").fetchone()[0])
    except Exception as exc:
        out.append(f"PostgreSQL unreachable ({type(exc).__name__})")
    try:
        from sqlalchemy import create_engine

        engine = create_engine(MYSQL_URL)
        with engine.connect() as conn:
            out.append("MariaDB " + conn.exec_driver_sql("SELECT VERSION()").scalar_one())
        engine.dispose()
    except Exception as exc:
        out.append(f"MariaDB unreachable ({type(exc).__name__})")
    try:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        props = conn._impl.server_properties
        ver = props.get("version", b"?")
        out.append("RabbitMQ " + (ver.decode() if isinstance(ver, bytes) else str(ver)))
        conn.close()
    except Exception as exc:
        out.append(f"RabbitMQ unreachable ({type(exc).__name__})")
    return out


def head_timing(remaining: float) -> str:
    if remaining < 30:
        return "(skipped: global deadline reached)"
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "head_timing.py"), "--sizes", "1000,20000,100000"],
            capture_output=True,
            text=True,
            timeout=min(remaining, 600),
            cwd=ROOT,
        )
        return (proc.stdout + (proc.stderr[-2000:] if proc.returncode else "")).rstrip()
    except subprocess.TimeoutExpired:
        return f"(timeout after {min(remaining, 600):.0f}s)"


def write_doc(path: Path, args, md: str, head: str, started_at: str, total: float) -> None:
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    doc = f"""# Benchmarks

Generated by `tools/bench/run.py` on {started_at} (`date -u`); the run took {total:.0f} s.

- N = {args.jobs} no-op jobs per case; `nproc` = {nproc}; Python {sys.version.split()[0]}
- packages: {", ".join(versions())}
- servers: {", ".join(server_versions())}

How to run: `make bench` (creates `.venv-bench` from `tools/bench/requirements.txt` and runs
`.venv-bench/bin/python tools/bench/run.py`; pass options with `BENCH_ARGS="--jobs 2000"`).

Cells are jobs/s (N / wall time). Enqueue cases time the client calls in one process. Processing
cases enqueue N jobs first (untimed), start the worker processes, wait until every worker has
imported its code and connected, then time from "go" until the database reports N jobs done
(celery: the workers' done-files hold N bytes). A processing cell that does not finish within the
per-case timeout ({args.case_timeout:.0f} s) shows `timeout (done/N in …)`.

- bgq cron: worker processes loop `queue.process()` until no unfinished job is left (several
  cron workers race for the same due ids; the loser's claim is refused by the procedure).
- bgq broker: worker processes run `bgq.worker.consume` (what `bgq consume` runs) on RabbitMQ.
- bgq bulk: `start_bulk()` / `end_bulk()` with `bulk_size=500`; groups: `serial_group="one"` or
  `"g<i % 100>"`.
- procrastinate: `task.defer()` / `task.batch_defer()` (500 per call), workers
  `app.run_worker(concurrency=1)`; groups: `configure(lock=...)`.
- pgqueuer: `Queries.enqueue()` (lists of 500 for bulk), workers `PgQueuer.run()` with default
  batch size; groups: one entrypoint per group with `concurrency_limit=1` (serialised dispatch).
- celery: `apply_async()` on one producer connection, workers `celery worker --pool=solo` (one
  process each) on RabbitMQ, no result backend; no batch publish API and no serial groups.

{md}

## tools/head_timing.py --sizes 1000,20000,100000

```
{head}
```
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per case (N)")
    parser.add_argument("--case-timeout", type=float, default=120.0, help="seconds per case")
    parser.add_argument("--deadline", type=float, default=1200.0, help="seconds for the whole run")
    parser.add_argument(
        "--systems",
        default="bgq-pg-cron,bgq-pg-broker,bgq-my-cron,bgq-my-broker,procrastinate,pgqueuer,celery",
    )
    parser.add_argument("--no-head-timing", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "SPEC", "READY", "GO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, spec, ready, go = args.worker
        worker_main(kind, json.loads(spec), ready, go)
        return

    started_at = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    t_start = time.monotonic()
    global_deadline = t_start + args.deadline
    factories: dict[str, Callable[[], System]] = {
        "bgq-pg-cron": lambda: Bgq("postgres", broker=False),
        "bgq-pg-broker": lambda: Bgq("postgres", broker=True),
        "bgq-my-cron": lambda: Bgq("mysql", broker=False),
        "bgq-my-broker": lambda: Bgq("mysql", broker=True),
        "procrastinate": Procrastinate,
        "pgqueuer": PgQueuer,
        "celery": Celery,
    }
    logdir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    print(f"N = {args.jobs}; worker logs in {logdir}", flush=True)
    results: dict[str, dict[str, str]] = {}
    for key in args.systems.split(","):
        run_system(factories[key](), args, results, global_deadline, logdir)
    md = table(results)
    print()
    print(md, flush=True)
    head = "(skipped)" if args.no_head_timing else head_timing(global_deadline - time.monotonic() + 300)
    print(head)
    total = time.monotonic() - t_start
    write_doc(Path(args.out), args, md, head, started_at, total)
    print(f"\nwrote {args.out}; total {total:.0f} s ({dt.timedelta(seconds=round(total))})")


if __name__ == "__main__":
    main()
