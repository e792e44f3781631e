"""Benchmarks bgq (work/broker/cron mode; PostgreSQL, MariaDB) beside pgqueuer, procrastinate and celery.

Usage: python tools/bench/run.py [--systems KEY,...] [--cases a,b,...] [--reps 3] [--target 10]
           [--enqueue-target 5] [--calib-jobs 1000] [--case-timeout 60] [--cron-jobs 10000]
           [--cron-procs 4] [--cron-groups 100] [--floor-seconds 5] [--latency 100]
           [--head-sizes 1000,20000,100000] [--no-head-timing] [--quick] [--out docs/benchmarks.md]

Throughput (jobs/s), one row per system: (a) enqueue one by one, (b) enqueue in bulk (500 per
batch), (c) process with 1 worker process, (d) with 2, (e) all jobs in one serial group on 2
workers, (f) jobs spread over 100 groups on 2 workers. Every job's callback appends its number and
the time.time() of its first and last statement to its worker process's own O_APPEND stamp file;
a processing figure is N / (last callback end - first callback start). N is sized per system and
case by a calibration run so that a measured run lasts about --target seconds; every case runs
--reps times, a cell is the median with the min-max spread. The commit floor (pseudo-system
`floor`, tools/bench/floor.py) is one INSERT + COMMIT per transaction from 1 and 2 clients per
dialect; each bgq cell is also given as a fraction of it. Cron mode (`bgq process`, K processes
restarted as they exit, on a backlog of --cron-jobs) is its own table; single-job latency and the
head-of-group timing (tools/head_timing.py) follow. docs/benchmarks.md, which this writes, explains
the method and how each peer is configured.

Systems (--systems): floor, bgq-pg-work, bgq-pg-broker, bgq-pg-cron, bgq-my-work, bgq-my-broker,
bgq-my-cron, pgqueuer, procrastinate, celery, celery-confirm. Cases (--cases): a-f, cron, or "none";
--latency 0 skips the latency table, --no-head-timing the head timing. --quick is a smoke run
(tiny N, one repetition): its figures are not results.

Bounded: a per-run timeout, a time limit per latency run, a global deadline; worker processes (own
process groups) get SIGTERM, then SIGKILL, when a run ends. Each system gets fresh databases /
tables / queue names and removes them afterwards (also after a failed setup). The workers' output
stays in a temporary directory whose name is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import logging
import math
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
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
    "cron": "cron at a backlog",
}
LATENCY = "L"  # the latency run's case key: one worker, no groups
CRON = "cron"  # the cron-at-a-backlog case key: bgq cron systems only, its own table
CRON_PRIORITIES = (1, 2, 3)
CRON_EXIT_WAIT = 10.0  # seconds the `bgq process` runs get to end by themselves once all jobs ran
GROUPS = {"c": None, "d": None, "e": 1, "f": 100, LATENCY: None}
PROCESSING = ("c", "d", "e", "f")
FLOOR = "floor"  # the pseudo-system that measures the durable single-row commit floor
FLOOR_CLIENTS = {"a": 1, "b": 1, "c": 1, "d": 2, "e": 2, "f": 2, CRON: 2}  # which floor a cell compares to
WORKERS = {"c": 1, "d": 2, "e": 2, "f": 2, LATENCY: 1}
BULK = 500
POLL = 0.05
STOP_GRACE = 3.0  # seconds a worker has to exit after SIGTERM before it gets SIGKILL
LATENCY_WARMUP = 5  # first samples of a latency run, dropped (connections, caches, worker start)
LATENCY_IDLE = 1.0  # seconds the worker idles after "go" before the first job of a latency run
SYSTEMS = [
    FLOOR,
    "bgq-pg-work",
    "bgq-pg-broker",
    "bgq-pg-cron",
    "bgq-my-work",
    "bgq-my-broker",
    "bgq-my-cron",
    "pgqueuer",
    "procrastinate",
    "celery",
    "celery-confirm",
]


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


def worker_logger(mode: str) -> logging.Logger:
    """bgq's logger in a worker process: errors go to the worker's log file; cron mode stays silent
    (its racing workers log every lost claim at critical level, by design)."""
    if mode == "cron":
        return silent_logger()
    log = logging.getLogger("bgq.bench.worker")
    log.setLevel(logging.ERROR)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    return log


_STAMP_FD: int | None = None  # in a latency worker: the write end of the harness's pipe


def stamp(seq: int) -> None:
    """The latency callback: its first statement tells the harness when it started."""
    os.write(_STAMP_FD, f"{seq} {time.time():.6f}\n".encode())


_JOB_FILE: int | None = None  # in a worker process: its own O_APPEND stamp file, opened at the first job
_STAMP_DIR: str | None = None  # where the worker processes of one run write their stamp files
STAMP_LINE = 47  # bytes per stamp line: "%10d %17.6f %17.6f\n"


def job(seq: int) -> None:
    """The callback of every throughput job: a no-op that appends, in one write to its process's own
    O_APPEND file, its job number and the `time.time()` of its first and its last statement."""
    global _JOB_FILE
    start = time.time()
    if _JOB_FILE is None:
        path = os.path.join(_STAMP_DIR or os.environ["BENCH_STAMP_DIR"], f"stamps-{os.getpid()}")
        _JOB_FILE = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_JOB_FILE, b"%10d %17.6f %17.6f\n" % (seq, start, time.time()))


def cron_app():
    """The queue a `bgq process` of the cron case loads (`--app tools.bench.run:cron_app`), from
    $BENCH_CRON_SPEC; its callbacks write into the harness's pipe, inherited as $BENCH_STAMP_FD."""
    import bgq

    spec = json.loads(os.environ["BENCH_CRON_SPEC"])
    return bgq.Queue(
        callbacks={"job": job},
        database_url=spec["url"],
        table_name=spec["table"],
        queue=spec["queue"],
        priorities=CRON_PRIORITIES,
    )


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
# `worker_spec(case)` is the JSON handed to `run.py --worker`; `latency_publisher()` yields a
# function that publishes the latency job number `seq` (callback: `stamp(seq)`).


class System:
    name = ""
    mode = ""
    dialect = ""
    bulk_supported = True
    groups_supported = True
    latency_supported = True
    graceful_stop = False  # its workers run under bgq.stopping.GracefulStop: SIGTERM must end them with 0
    #: the label of a row whose processing cells this row shares (same workers), if it runs too
    processing_same_as: str | None = None
    #: the throughput cases it runs (bgq cron: only its own cron case)
    cases: tuple[str, ...] = tuple(CASES)

    def label(self) -> str:
        return f"{self.name} / {self.mode} / {self.dialect}"

    def setup(self) -> None: ...

    def cleanup(self) -> None: ...

    def reset(self, case: str) -> None: ...

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None: ...

    def done(self) -> int: ...

    def worker_spec(self, case: str) -> dict: ...

    def latency_publisher(self) -> contextlib.AbstractContextManager[Callable[[int], object]]: ...


class Bgq(System):
    name = "bgq"

    def __init__(self, dialect: str, mode: str) -> None:
        self.dialect = "postgres" if dialect == "postgres" else "mariadb"
        self.mode = mode  # "work" (bgq work), "cron" (bgq process) or "broker" (bgq consume)
        self.broker = mode == "broker"
        self.latency_supported = mode != "cron"  # cron mode runs a job at the next cron start
        if mode == "cron":  # its enqueue path is the work rows'; its processing is the cron case
            self.cases = (CRON,)
        self.graceful_stop = mode != "cron"  # cron workers exit by themselves once all jobs are done
        self.created = False  # set before the first database object is created
        self.table = f"bgqb_{uuid.uuid4().hex[:8]}"
        self.db_name: str | None = None
        self.url = MYSQL_URL
        self.queues_used: list[str] = []
        self.qname = ""
        self._engine = None

    def setup(self) -> None:
        from sqlalchemy import create_engine

        import bgq

        if self.mode == "work" and importlib.util.find_spec("bgq.work") is None:
            raise NotApplicable("bgq/work.py does not exist")
        self.created = True
        if self.dialect == "postgres":
            self.db_name = pg_create_db("bgq")
            self.url = pg_dsn(self.db_name).replace("postgresql://", "postgresql+psycopg://")
        q = bgq.Queue(callbacks={"job": job}, database_url=self.url, table_name=self.table)
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
            callbacks={"job": job, "stamp": stamp},
            database_url=self.url,
            table_name=self.table,
            queue=self.qname,
            bulk_size=bulk_size,
            producer=producer,
            logger=silent_logger(),
        )

    def reset(self, case: str) -> None:
        self.qname = f"bq{uuid.uuid4().hex[:8]}{case.lower()}"
        self.queues_used += [f"{self.qname}_{p}" for p in (0, 1)] + [f"{self.qname}_1_1000"]
        with self._engine.connect() as conn:  # TRUNCATE: no dead rows left for the next case to skip
            conn.exec_driver_sql(f"TRUNCATE TABLE {self.table}")
            conn.exec_driver_sql(f"TRUNCATE TABLE {self.table}_group")

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        q = self.queue(BULK if bulk else 1)
        try:
            if bulk:
                q.start_bulk()
            for i in range(n):
                q.publish("job", [i], serial_group=group_of(i, groups))
                if i % 100 == 0:
                    bounded(deadline)
            if bulk:
                q.end_bulk()
        finally:
            q.close()

    def enqueue_backlog(self, n: int, groups: int, deadline: float) -> None:
        """The cron case's backlog, in bulk: N // 10 ungrouped jobs, the rest spread at
        random over `groups` groups, priorities 1-3 at random, the two kinds in random id order."""
        rng = random.Random(9)
        kinds = [None] * (n // 10) + [f"g{rng.randrange(groups)}" for _ in range(n - n // 10)]
        rng.shuffle(kinds)
        q = bgq_queue(self.url, self.table, self.qname, BULK)
        try:
            q.start_bulk()
            for i, group in enumerate(kinds):
                q.publish("job", [i], serial_group=group, priority=rng.choice(CRON_PRIORITIES))
                if i % 100 == 0:
                    bounded(deadline)
            q.end_bulk()
        finally:
            q.close()

    def done(self) -> int:
        with self._engine.connect() as conn:
            return conn.exec_driver_sql(f"SELECT COUNT(*) FROM {self.table} WHERE state = 3").scalar_one()

    def worker_spec(self, case: str) -> dict:
        return {"url": self.url, "table": self.table, "queue": self.qname, "mode": self.mode}

    @contextlib.contextmanager
    def latency_publisher(self) -> Iterator[Callable[[int], object]]:
        q = self.queue()
        try:
            yield lambda seq: q.publish("stamp", [seq])
        finally:
            q.close()

    def cleanup(self) -> None:
        from bgq.db import Database
        from bgq.install import uninstall

        if self._engine is not None:
            self._engine.dispose()
        if self.broker:
            amqp_delete(self.queues_used)
        if self.db_name:
            pg_drop_db(self.db_name)
        elif self.created:  # also after a failed install: it may have created some of the tables
            db = Database(self.url)
            try:
                uninstall(db, self.table)
            finally:
                db.dispose()


def bgq_queue(url: str, table: str, qname: str, bulk_size: int):
    import bgq

    return bgq.Queue(
        callbacks={"job": job},
        database_url=url,
        table_name=table,
        queue=qname,
        bulk_size=bulk_size,
        priorities=CRON_PRIORITIES,
        logger=silent_logger(),
    )


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
        task = self.app.tasks["bench_job"]
        with self.app.open():
            if bulk:
                for start in range(0, n, BULK):
                    count = min(BULK, n - start)
                    if groups is None:
                        task.batch_defer(*[{"seq": i} for i in range(start, start + count)])
                    else:  # a lock is per job: one batch per lock value
                        by_lock: dict[str, list[dict]] = {}
                        for i in range(start, start + count):
                            by_lock.setdefault(group_of(i, groups), []).append({"seq": i})
                        for lock, kwargs in by_lock.items():
                            task.configure(lock=lock).batch_defer(*kwargs)
                    bounded(deadline)
            else:
                for i in range(n):
                    if groups is None:
                        task.defer(seq=i)
                    else:
                        task.configure(lock=group_of(i, groups)).defer(seq=i)
                    if i % 100 == 0:
                        bounded(deadline)

    def done(self) -> int:
        return self.conn.execute(
            "SELECT COUNT(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]

    def worker_spec(self, case: str) -> dict:
        return {"dsn": self.dsn}

    @contextlib.contextmanager
    def latency_publisher(self) -> Iterator[Callable[[int], object]]:
        task = self.app.tasks["bench_stamp"]
        with self.app.open():
            yield lambda seq: task.defer(seq=seq)

    def cleanup(self) -> None:  # also after a failed setup
        if getattr(self, "conn", None) is not None:
            self.conn.close()
        if getattr(self, "db_name", None):
            pg_drop_db(self.db_name)


def make_procrastinate(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench_job")
    def bench_job(seq: int) -> None:
        job(seq)

    @app.task(name="bench_stamp")
    def bench_stamp(seq: int) -> None:
        stamp(seq)

    return app


class PgQueuer(System):
    """pgqueuer on asyncpg, the driver its documentation leads with (`PgQueuer.from_asyncpg_connection`)."""

    name, mode, dialect = "pgqueuer", "worker", "postgres"

    def setup(self) -> None:
        import psycopg

        self.db_name = pg_create_db("pgq")
        self.dsn = pg_dsn(self.db_name)
        asyncio.run(self._install())
        self.conn = psycopg.connect(self.dsn, autocommit=True)  # the harness's own counting
        self.total = 0

    async def _install(self) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(self.dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    def reset(self, case: str) -> None:
        self.conn.execute("TRUNCATE pgqueuer")
        self.total = 0

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        self.total = n
        asyncio.run(self._enqueue(n, bulk, groups, deadline))

    async def _enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        def ep(i: int) -> str:
            return "job" if groups is None else f"job_{i % groups}"

        conn = await asyncpg.connect(self.dsn)
        try:
            q = Queries(AsyncpgDriver(conn))
            if bulk:
                for start in range(0, n, BULK):
                    idx = range(start, min(n, start + BULK))
                    await q.enqueue([ep(i) for i in idx], [str(i).encode() for i in idx], [0] * len(idx))
                    bounded(deadline)
            else:
                for i in range(n):
                    await q.enqueue(ep(i), str(i).encode())
                    if i % 100 == 0:
                        bounded(deadline)
        finally:
            await conn.close()

    def done(self) -> int:  # finished jobs leave the pgqueuer table (they are logged in pgqueuer_log)
        return self.total - self.conn.execute("SELECT COUNT(*) FROM pgqueuer").fetchone()[0]

    def worker_spec(self, case: str) -> dict:
        return {"dsn": self.dsn, "groups": GROUPS[case], "latency": case == LATENCY}

    @contextlib.contextmanager
    def latency_publisher(self) -> Iterator[Callable[[int], object]]:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        async def connect():
            conn = await asyncpg.connect(self.dsn)
            return conn, Queries(AsyncpgDriver(conn))

        loop = asyncio.new_event_loop()
        try:
            conn, q = loop.run_until_complete(connect())
            try:
                yield lambda seq: loop.run_until_complete(q.enqueue("stamp", str(seq).encode()))
            finally:
                loop.run_until_complete(conn.close())
        finally:
            loop.close()

    def cleanup(self) -> None:  # also after a failed setup
        if getattr(self, "conn", None) is not None:
            self.conn.close()
        if getattr(self, "db_name", None):
            pg_drop_db(self.db_name)


class Celery(System):
    """celery on RabbitMQ; `confirm=True`: the producer waits for RabbitMQ's publisher confirm of each
    message (`broker_transport_options={"confirm_publish": True}`), so a returned `apply_async`
    means the broker has the message."""

    name, mode, dialect = "celery", "worker", "rabbitmq"
    bulk_supported = False
    groups_supported = False

    def __init__(self, confirm: bool = False) -> None:
        self.confirm = confirm
        if confirm:
            self.mode = "worker, publisher confirms"
            self.latency_supported = False  # the same workers; only the publish differs
            self.cases = ("a",)

    def setup(self) -> None:
        self.queues_used: list[str] = []
        self.done_dir = ""

    def reset(self, case: str) -> None:
        self.qname = f"cel{uuid.uuid4().hex[:8]}{case.lower()}"
        self.queues_used.append(self.qname)

    def enqueue(self, n: int, bulk: bool, groups: int | None, deadline: float) -> None:
        app, task, _stamp = make_celery(self.qname, self.confirm)
        try:
            with app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async(args=[i], producer=producer)
                    if i % 100 == 0:
                        bounded(deadline)
        finally:
            app.close()

    def done(self) -> int:  # no result backend: the stamps are the record
        return stamp_count(Path(self.done_dir)) if self.done_dir else 0

    def worker_spec(self, case: str) -> dict:
        return {"queue": self.qname}

    @contextlib.contextmanager
    def latency_publisher(self) -> Iterator[Callable[[int], object]]:
        app, _task, stamp_task = make_celery(self.qname, self.confirm)
        try:
            with app.producer_or_acquire() as producer:
                yield lambda seq: stamp_task.apply_async(args=[seq], producer=producer)
        finally:
            app.close()

    def cleanup(self) -> None:  # and the workers' remote-control exchange
        amqp_delete(self.queues_used + ["celery.pidbox"])


def make_celery(qname: str, confirm: bool = False):
    from celery import Celery as CeleryApp

    app = CeleryApp("bench", broker=AMQP_URL)
    app.conf.update(
        task_default_queue=qname,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=False,
    )
    if confirm:
        app.conf.broker_transport_options = {"confirm_publish": True}

    @app.task(name="bench.job")
    def bench_job(seq: int) -> None:
        job(seq)

    @app.task(name="bench.stamp")
    def bench_stamp(seq: int) -> None:
        stamp(seq)

    return app, bench_job, bench_stamp


# --- worker processes -----------------------------------------------------------------------------


def worker_main(kind: str, spec: dict, ready: str, go: str) -> None:
    """Runs in a subprocess: prepare, signal ready, wait for go, then work until stopped or done."""
    global _STAMP_FD, _STAMP_DIR
    _STAMP_FD = spec.get("stamp_fd")
    _STAMP_DIR = spec.get("stamp_dir")

    def barrier() -> None:
        Path(ready).touch()
        limit = time.monotonic() + 120
        while not os.path.exists(go):
            if time.monotonic() > limit:
                sys.exit(3)
            time.sleep(0.005)

    if kind == "bgq":
        import bgq
        from bgq.stopping import GracefulStop

        mode = spec["mode"]
        producer = None
        if mode == "broker":
            from bgq.broker.rabbitmq import RabbitMQ

            producer = RabbitMQ(AMQP_URL)
        queue = bgq.Queue(
            callbacks={"job": job, "stamp": stamp},
            database_url=spec["url"],
            table_name=spec["table"],
            queue=spec["queue"],
            producer=producer,
            logger=worker_logger(mode),
        )
        queue.procs  # connect and check the installed procedures before "go"  # noqa: B018
        if mode == "work":
            from bgq.work import work

            barrier()
            with GracefulStop() as stop:  # what `bgq work` runs; SIGTERM ends it
                work(queue, sub_queue=None, priorities=None, stop=stop)
            return
        from bgq.consumer import consume  # broker mode (cron mode runs `bgq process`: run_cron)

        barrier()
        with GracefulStop() as stop:  # what `bgq consume` runs; SIGTERM ends it
            consume(queue, None, 0, [1], stop)
    elif kind == "procrastinate":
        app = make_procrastinate(spec["dsn"])
        logging.getLogger("procrastinate").setLevel(logging.ERROR)
        barrier()
        app.run_worker(concurrency=1, wait=True)
    elif kind == "pgqueuer":

        async def run() -> None:
            import asyncpg
            from pgqueuer import PgQueuer as PgQ

            conn = await asyncpg.connect(spec["dsn"])
            pgq = PgQ.from_asyncpg_connection(conn)  # its documented asyncpg setup

            async def handler(pgq_job) -> None:
                job(int(pgq_job.payload))

            async def stamp_handler(pgq_job) -> None:
                stamp(int(pgq_job.payload))

            groups = spec["groups"]
            if spec["latency"]:
                pgq.entrypoint("stamp")(stamp_handler)
            elif groups is None:
                pgq.entrypoint("job")(handler)
            else:  # one entrypoint per group; concurrency_limit=1 serialises it across all workers
                for g in range(groups):
                    pgq.entrypoint(f"job_{g}", concurrency_limit=1)(handler)
            barrier()
            await pgq.run()

        logging.getLogger("pgqueuer").setLevel(logging.ERROR)
        asyncio.run(run())
    elif kind == "celery":
        app, _task, _stamp = make_celery(spec["queue"])
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


def kill_group(proc: subprocess.Popen, grace: float) -> str:
    """Stop a worker's process group: SIGTERM, then SIGKILL. Returns how it ended."""
    if proc.poll() is not None:
        return "exited"
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return "exited"
        try:
            proc.wait(timeout=wait)
            return "SIGTERM" if sig == signal.SIGTERM else "SIGKILL"
        except subprocess.TimeoutExpired:
            continue
    return "still running after SIGKILL"


class Workers:
    """The worker processes of one case: started, released together at "go", stopped at the end."""

    def __init__(self, system: System, case: str, logdir: Path, extra: dict | None = None) -> None:
        self.system = system
        self.case = case
        self.count = WORKERS[case]
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-{system.name}-{case}-"))
        self.procs: list[subprocess.Popen] = []
        if isinstance(system, Celery):
            system.done_dir = str(self.tmp)
        spec = json.dumps({**system.worker_spec(case), "stamp_dir": str(self.tmp), **(extra or {})})
        pass_fds = (extra["stamp_fd"],) if extra and "stamp_fd" in extra else ()
        tag = f"{system.name}-{system.mode}-{system.dialect}-{case}"
        try:
            for i in range(self.count):
                with open(logdir / f"{tag}-{i}.log", "w") as log:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, __file__, "--worker", system.name, spec]
                            + [str(self.tmp / f"ready-{i}"), str(self.tmp / "go")],
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                            cwd=ROOT,
                            pass_fds=pass_fds,
                        )
                    )
        except BaseException:
            self.stop()  # the workers started so far
            raise

    def go(self) -> bool:
        """Wait until every worker is ready, then release them; False if one failed to start."""
        limit = time.monotonic() + 120
        while len(list(self.tmp.glob("ready-*"))) < self.count:
            if time.monotonic() > limit or any(p.poll() not in (None, 0) for p in self.procs):
                return False
            time.sleep(0.01)
        (self.tmp / "go").touch()
        return True

    def all_exited(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def stop(self) -> None:
        for i, p in enumerate(self.procs):
            how = kill_group(p, grace=STOP_GRACE)
            if not self.system.graceful_stop:  # the peers' and bgq cron's way to stop is not checked
                continue
            if how not in ("exited", "SIGTERM"):
                print(f"   worker {i} ({self.case}) did not exit within {STOP_GRACE:.0f}s of SIGTERM: {how}")
            elif how == "SIGTERM" and p.returncode != 0:  # GracefulStop ends bgq's workers with 0
                print(f"   worker {i} ({self.case}) exited with status {p.returncode} after SIGTERM")
        shutil.rmtree(self.tmp, ignore_errors=True)


VERIFY_WAIT = 20.0  # seconds the system gets, after the last callback, to record N jobs done (untimed)


def stamp_count(directory: Path) -> int:
    """How many job callbacks have ended: the stamp files' bytes over the fixed line length."""
    return sum(p.stat().st_size for p in directory.glob("stamps-*")) // STAMP_LINE


def read_stamps(directory: Path) -> dict:
    """count (distinct jobs), twice (callbacks of a job seen before), first start, last end."""
    seen: set[int] = set()
    twice = 0
    first, last = math.inf, -math.inf
    for path in directory.glob("stamps-*"):
        for line in path.read_bytes().splitlines():
            seq, start, end = line.split()
            if int(seq) in seen:
                twice += 1
            seen.add(int(seq))
            first = min(first, float(start))
            last = max(last, float(end))
    return {"count": len(seen), "twice": twice, "first": first, "last": last}


def run_processing(system: System, case: str, n: int, timeout: float, logdir: Path) -> dict:
    """Enqueued N jobs -> workers -> "go"; jobs/s = N / (last callback end - first callback start),
    from the stamps the callbacks write. Then (untimed) the system must record all N as done."""
    workers = Workers(system, case, logdir)
    try:
        if not workers.go():
            return {"error": "error (worker start)"}
        deadline = time.monotonic() + timeout
        while stamp_count(workers.tmp) < n:
            if time.monotonic() > deadline or workers.all_exited():
                break
            time.sleep(POLL)
        st = read_stamps(workers.tmp)
        out = {"n": n, "done": st["count"], "twice": st["twice"]}
        if st["count"] >= 2:
            out["seconds"] = st["last"] - st["first"]
        if st["count"] < n:
            out["error"] = "workers exited" if workers.all_exited() else f"timeout ({st['count']}/{n})"
            return out
        out["rate"] = n / out["seconds"]
        limit = time.monotonic() + VERIFY_WAIT
        while system.done() < n and time.monotonic() < limit:
            time.sleep(POLL)
        recorded = system.done()
        if recorded < n:
            out["note"] = f"{recorded}/{n} recorded done {VERIFY_WAIT:.0f}s after the last callback"
        return out
    finally:
        workers.stop()


class Stamps:
    """Reads the "<seq> <time>" lines that the latency callbacks write into the pipe (and the
    "<seq> <time> end" lines of the cron case's callbacks)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.started: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.repeated = 0  # start lines of a job whose start was already seen (it ran again)
        self.closed = False

    def wait(self, seq: int, deadline: float) -> float | None:
        """The callback start time of job `seq`; None at the deadline or when the writers are gone."""
        while seq not in self.started:
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            self.read(left)
        return self.started[seq]

    def read(self, timeout: float) -> None:
        """Take in the lines that arrive within `timeout` seconds (one read)."""
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if not readable:
            return
        chunk = os.read(self.fd, 65536)
        if not chunk:  # every worker process has closed the write end: they died
            self.closed = True
            return
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        for line in lines:
            number, at, *end = line.split()
            if end:
                self.ended[int(number)] = float(at)
            elif int(number) in self.started:
                self.repeated += 1
            else:
                self.started[int(number)] = float(at)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted `values`."""
    return values[max(0, math.ceil(p / 100 * len(values)) - 1)]


def run_latency(system: System, samples: int, timeout: float, gap: float, logdir: Path) -> dict[str, str]:
    """One idle worker; `samples` jobs one at a time: publish -> callback start, in ms."""
    read_fd, write_fd = os.pipe()
    workers = None
    try:
        workers = Workers(system, LATENCY, logdir, extra={"stamp_fd": write_fd})
        os.close(write_fd)  # the workers hold the write end now: EOF on read_fd means they are gone
        write_fd = -1
        if not workers.go():
            return {"p50": "error (worker start)"}
        stamps = Stamps(read_fd)
        rng = random.Random(5)
        deadline = time.monotonic() + timeout
        measured: list[float] = []
        with system.latency_publisher() as publish:
            time.sleep(LATENCY_IDLE)
            for seq in range(LATENCY_WARMUP + samples):
                time.sleep(gap * rng.uniform(0.5, 1.5))
                if time.monotonic() > deadline:
                    break
                before = time.time()
                publish(seq)
                started = stamps.wait(seq, deadline)
                if started is None:
                    break
                if seq >= LATENCY_WARMUP:
                    measured.append((started - before) * 1000)
        measured.sort()
        done = len(measured)
        note = ""
        if done < samples:
            why = "workers exited" if stamps.closed else f"time limit {timeout:.0f}s"
            note = f" (stopped: {why})"
        if not measured:
            return {"p50": "no samples" + note}
        return {
            "p50": f"{percentile(measured, 50):.1f}",
            "p99": f"{percentile(measured, 99):.1f}",
            "max": f"{measured[-1]:.1f}",
            "n": f"{done}{note}",
        }
    finally:
        if workers is not None:
            workers.stop()
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def bgq_command() -> str:
    """The `bgq` console script of the interpreter that runs the benchmark."""
    script = Path(sys.executable).with_name("bgq")
    return str(script) if script.exists() else (shutil.which("bgq") or "bgq")


def run_cron(system: Bgq, n: int, procs: int, groups: int, timeout: float, logdir: Path) -> dict:
    """`procs` slots, each running `bgq process` again as soon as the previous run exits, on a
    backlog of `n` jobs; jobs/s from the first callback start to the last callback end."""
    system.enqueue_backlog(n, groups, time.monotonic() + timeout)  # untimed
    tmp = Path(tempfile.mkdtemp(prefix="bench-bgq-cron-"))
    stamps = tmp / "stamps"
    stamps.mkdir()
    spec = json.dumps({"url": system.url, "table": system.table, "queue": system.qname})
    tag = f"{system.name}-{system.mode}-{system.dialect}-{CRON}"
    slots: list[subprocess.Popen | None] = [None] * procs
    logs = [open(logdir / f"{tag}-{i}.log", "w") for i in range(procs)]  # noqa: SIM115 (closed below)
    runs = failed = 0

    def start(i: int) -> subprocess.Popen:
        nonlocal runs
        runs += 1
        env = dict(
            os.environ,
            BGQ_LOCKS_DIR=str(tmp / f"locks-{i}"),  # its own per-host lock: a separate host
            BENCH_CRON_SPEC=spec,
            BENCH_STAMP_DIR=str(stamps),
        )
        return subprocess.Popen(
            [bgq_command(), "--app", "tools.bench.run:cron_app", "process"],
            stdout=logs[i],
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
            env=env,
        )

    try:
        deadline = time.monotonic() + timeout
        for i in range(procs):
            slots[i] = start(i)
        while stamp_count(stamps) < n and time.monotonic() < deadline:
            time.sleep(POLL)
            for i, proc in enumerate(slots):
                if proc is not None and proc.poll() is not None:
                    failed += proc.returncode != 0
                    slots[i] = start(i) if stamp_count(stamps) < n else None
        limit = time.monotonic() + CRON_EXIT_WAIT  # the last runs end once claims find nothing
        while any(p is not None and p.poll() is None for p in slots) and time.monotonic() < limit:
            time.sleep(POLL)
        for proc in slots:
            if proc is not None:
                if proc.poll() is None:
                    kill_group(proc, grace=STOP_GRACE)
                failed += proc.returncode not in (0, None, -signal.SIGTERM, -signal.SIGKILL)
        st = read_stamps(stamps)
    finally:
        for proc in slots:
            if proc is not None:
                kill_group(proc, grace=STOP_GRACE)
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"n": n, "runs": runs, "failed": failed, "twice": st["twice"], "done": st["count"]}
    if st["count"] >= 2:
        out["seconds"] = st["last"] - st["first"]
    if st["count"] < n:
        out["error"] = f"timeout ({st['count']}/{n})"
        return out
    out["rate"] = n / out["seconds"]
    finished = system.done()
    if finished != n:
        out["note"] = f"{finished}/{n} rows FINISHED"
    return out


def summarise(runs: list[dict], target: float) -> dict:
    """The cell of a case: median jobs/s with the min-max spread over the repetitions, N, the
    median span in seconds; a dagger when the median span is below the target."""
    rates = sorted(r["rate"] for r in runs if "rate" in r)
    errors = [r["error"] for r in runs if "error" in r]
    cell: dict = {"n": runs[0].get("n") if runs else None, "reps": len(rates)}
    notes = sorted({r["note"] for r in runs if r.get("note")} | set(errors))
    if not rates:
        cell["text"] = "; ".join(notes) or "no result"
        return cell
    med = statistics.median(rates)
    spans = [r["seconds"] for r in runs if "rate" in r]
    cell.update(median=med, seconds=statistics.median(spans), twice=sum(r.get("twice", 0) for r in runs))
    text = f"{med:.0f}" if len(rates) == 1 else f"{med:.0f} ({rates[0]:.0f}–{rates[-1]:.0f})"
    if cell["seconds"] < target:
        text += " †"
    if cell["twice"]:
        notes.append(f"{cell['twice']} callbacks ran twice")
    cell["text"] = text + (f" [{'; '.join(notes)}]" if notes else "")
    return cell


def calibrate_processing(system: System, case: str, args, logdir: Path) -> tuple[int | None, str]:
    """A short run of --calib-jobs jobs (at most --calib-seconds): the rate it shows sizes N so that
    a run lasts about --target seconds. (None, cell text) when even --min-jobs would not finish
    within --case-timeout."""
    system.reset(case)
    n_cal = args.calib_jobs
    system.enqueue(n_cal, system.bulk_supported, GROUPS[case], time.monotonic() + args.case_timeout)
    res = run_processing(system, case, n_cal, args.calib_seconds, logdir)
    done, seconds = res.get("done", 0), res.get("seconds")
    if done == 0:
        return None, f"error in calibration ({res.get('error', 'no job ran')})"
    rate = done / seconds if done >= 2 and seconds else max(done, 1) / args.calib_seconds
    if rate * args.case_timeout < args.min_jobs:
        return None, (
            f"≈ {rate:.1f} (calibration only: {done}/{n_cal} jobs in {args.calib_seconds:.0f}s; "
            f"{args.min_jobs} jobs would exceed {args.case_timeout:.0f}s)"
        )
    return min(args.max_jobs, max(args.min_jobs, math.ceil(rate * args.target * 1.15))), ""


def calibrate_enqueue(system: System, case: str, args) -> int:
    system.reset(case)
    started = time.monotonic()
    system.enqueue(args.calib_jobs, case == "b", None, started + args.case_timeout)
    rate = args.calib_jobs / (time.monotonic() - started)
    return min(args.max_jobs, max(args.min_jobs, math.ceil(rate * args.enqueue_target * 1.15)))


def not_supported(system: System, case: str) -> str:
    if case == "b" and not system.bulk_supported:
        return "n/a (no batch API)"
    if case in ("e", "f") and not system.groups_supported:
        return "n/a (no serial groups)"
    return ""


def run_case(system: System, case: str, args, logdir: Path, global_deadline: float) -> dict:
    if not_supported(system, case):
        return {"text": not_supported(system, case)}
    if global_deadline - time.monotonic() < 10:
        return {"text": "skipped (global deadline)"}
    if case in ("a", "b"):
        n = calibrate_enqueue(system, case, args)
        target = args.enqueue_target
    else:
        n, why = calibrate_processing(system, case, args, logdir)
        if n is None:
            return {"text": why}
        target = args.target
    runs = []
    for _ in range(args.reps):
        remaining = global_deadline - time.monotonic()
        if remaining < 10:
            break
        timeout = min(args.case_timeout, remaining)
        system.reset(case)
        try:
            if case in ("a", "b"):
                started = time.monotonic()
                system.enqueue(n, case == "b", None, started + timeout)
                took = time.monotonic() - started
                runs.append({"n": n, "rate": n / took, "seconds": took})
            else:
                try:
                    system.enqueue(n, system.bulk_supported, GROUPS[case], time.monotonic() + timeout)
                except CaseTimeout:
                    runs.append({"n": n, "error": "timeout (while enqueueing, untimed)"})
                    continue
                runs.append(run_processing(system, case, n, timeout, logdir))
        except CaseTimeout:
            runs.append({"n": n, "error": f"timeout ({timeout:.0f}s)"})
        print(f"      rep {len(runs)}: {fmt_run(runs[-1])}", flush=True)
    return summarise(runs, target)


def fmt_run(run: dict) -> str:
    return ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in run.items())


def run_system(
    system: System,
    args,
    results: dict,
    latencies: dict,
    global_deadline: float,
    logdir: Path,
    crons: dict,
) -> None:
    row = results.setdefault(system.label(), {}) if system.cases != (CRON,) else {}
    print(f"== {system.label()}", flush=True)
    try:
        system.setup()
    except Exception as exc:
        why = str(exc) if isinstance(exc, NotApplicable) else f"setup failed: {type(exc).__name__}"
        for c in system.cases:
            if c == CRON:
                crons[system.label()] = {"text": f"n/a ({why})"}
            else:
                row[c] = {"text": f"n/a ({why})"}
        if args.latency and system.latency_supported:
            latencies[system.label()] = {"p50": f"n/a ({why})"}
        print(f"   setup failed: {exc!r}", flush=True)
        try:
            system.cleanup()  # whatever the setup created before it failed
        except Exception as cleanup_exc:
            print(f"   cleanup failed: {cleanup_exc!r}", flush=True)
        return
    try:
        for case in CASES:
            if case not in system.cases:
                if system.cases == (CRON,):
                    continue
                unsupported = not_supported(system, case)
                if unsupported:
                    row[case] = {"text": unsupported}
                elif system.processing_same_as and case in PROCESSING:
                    row[case] = {"text": "= " + system.processing_same_as}
                else:
                    row[case] = {"text": "—"}
                continue
            if case not in args.cases:
                row[case] = {"text": "not run"}
                continue
            t0 = time.monotonic()
            print(f"   {CASE_TITLES[case]}:", flush=True)
            try:
                row[case] = run_case(system, case, args, logdir, global_deadline)
            except Exception as exc:
                row[case] = {"text": f"error ({type(exc).__name__})"}
                print(f"   {case}: {exc!r}", flush=True)
            print(f"   {CASE_TITLES[case]}: {row[case]['text']}  [{time.monotonic() - t0:.1f}s]", flush=True)
        if CRON in system.cases and CRON in args.cases and isinstance(system, Bgq):
            crons[system.label()] = cron_of(system, args, global_deadline, logdir)
        if args.latency and system.latency_supported:
            latencies[system.label()] = latency_of(system, args, global_deadline, logdir)
    finally:
        try:
            system.cleanup()
        except Exception as exc:
            print(f"   cleanup failed: {exc!r}", flush=True)


def cron_of(system: Bgq, args, global_deadline: float, logdir: Path) -> dict:
    t0 = time.monotonic()
    runs = []
    for _ in range(args.reps):
        remaining = global_deadline - time.monotonic()
        if remaining < 10:
            break
        try:
            system.reset(CRON)
            runs.append(
                run_cron(
                    system,
                    args.cron_jobs,
                    args.cron_procs,
                    args.cron_groups,
                    min(max(args.case_timeout, 4 * args.target), remaining),
                    logdir,
                )
            )
        except CaseTimeout:
            runs.append({"n": args.cron_jobs, "error": "timeout (while enqueueing, untimed)"})
        except Exception as exc:
            print(f"   cron: {exc!r}", flush=True)
            runs.append({"n": args.cron_jobs, "error": f"error ({type(exc).__name__})"})
        print(f"      rep {len(runs)}: {fmt_run(runs[-1])}", flush=True)
    cell = summarise(runs, args.target) if runs else {"text": "skipped (global deadline)"}
    if runs:
        cell["runs"] = "/".join(str(r.get("runs", "?")) for r in runs)
        cell["failed"] = sum(r.get("failed", 0) for r in runs)
        cell["twice"] = sum(r.get("twice", 0) for r in runs)
    print(f"   cron at a backlog: {cell['text']}  [{time.monotonic() - t0:.1f}s]", flush=True)
    return cell


def run_floor(args) -> dict:
    """Commits/s of one INSERT + COMMIT per transaction, 1 and 2 clients, per dialect; median of
    --reps runs of --floor-seconds each."""
    from tools.bench.floor import measure, settings

    urls = {"postgres": PG_ADMIN, "mariadb": MYSQL_URL}
    out: dict = {}
    for dialect, url in urls.items():
        print(f"== commit floor / {dialect}", flush=True)
        try:
            out[(dialect, "settings")] = settings(dialect, url)
        except Exception as exc:
            out[(dialect, "settings")] = f"unreachable ({type(exc).__name__})"
            continue
        for clients in (1, 2):
            rates = []
            for _ in range(args.reps):
                try:
                    rates.append(measure(dialect, url, clients, args.floor_seconds))
                except Exception as exc:
                    print(f"   floor {dialect} x{clients}: {exc!r}", flush=True)
            runs = [{"rate": r, "seconds": args.floor_seconds, "n": None} for r in rates]
            out[(dialect, clients)] = summarise(runs, 0) if runs else {"text": "error"}
            print(f"   {clients} client(s): {out[(dialect, clients)]['text']} commits/s", flush=True)
    return out


def latency_of(system: System, args, global_deadline: float, logdir: Path) -> dict[str, str]:
    if not system.latency_supported:
        return {"p50": "n/a (cron: a job waits for the next `bgq process` start)"}
    remaining = global_deadline - time.monotonic()
    if remaining < 15:
        return {"p50": "skipped (global deadline)"}
    t0 = time.monotonic()
    try:
        system.reset(LATENCY)
        cell = run_latency(
            system, args.latency, min(args.latency_timeout, remaining - 5), args.latency_gap, logdir
        )
    except Exception as exc:
        print(f"   latency: {exc!r}", flush=True)
        cell = {"p50": f"error ({type(exc).__name__})"}
    shown = ", ".join(f"{k} {v}" for k, v in cell.items())
    print(f"   latency ms: {shown}  [{time.monotonic() - t0:.1f}s]", flush=True)
    return cell


# --- report ---------------------------------------------------------------------------------------


def ratio(results: dict, case: str) -> str:
    """The best bgq median over the best peer median; cells without a measured median do not count."""
    ours = [
        r[case]["median"]
        for lbl, r in results.items()
        if lbl.startswith("bgq ") and "median" in r.get(case, {})
    ]
    peers = [
        r[case]["median"]
        for lbl, r in results.items()
        if not lbl.startswith("bgq ") and "median" in r.get(case, {})
    ]
    if not ours or not peers:
        return "n/a"
    return f"{max(ours) / max(peers):.2f}"


SUMMARY_COLUMNS = (  # (title, mode of the bgq row it takes, case)
    ("enqueue 1-by-1", "work", "a"),
    ("enqueue bulk", "work", "b"),
    ("1 worker", "work", "c"),
    ("2 workers", "work", "d"),
    ("broker, 2 workers", "broker", "d"),
    ("100 groups, 2 workers", "work", "f"),
)


def summary_table(results: dict) -> str:
    """The speed issue's table: medians only; bgq per dialect (work mode, and broker mode's 2-worker
    figure in its own column) beside each peer, then bgq's best over pgqueuer and over the best peer."""
    lines = [
        "| system | " + " | ".join(t for t, _, _ in SUMMARY_COLUMNS) + " |",
        "|---" * (len(SUMMARY_COLUMNS) + 1) + "|",
    ]

    def med(label: str, case: str) -> float | None:
        return results.get(label, {}).get(case, {}).get("median")

    def show(v: float | None) -> str:
        return "" if v is None else f"{v:.0f}"

    ours: dict[str, list[float]] = {t: [] for t, _, _ in SUMMARY_COLUMNS}
    for dialect in ("postgres", "mariadb"):
        cells = []
        for title, mode, case in SUMMARY_COLUMNS:
            v = med(f"bgq / {mode} / {dialect}", case)
            cells.append(show(v))
            if v is not None:
                ours[title].append(v)
        if any(cells):
            lines.append(f"| bgq / {dialect} | " + " | ".join(cells) + " |")
    peers: dict[str, list[float]] = {t: [] for t, _, _ in SUMMARY_COLUMNS}
    pgq: dict[str, float | None] = {}
    for label in results:
        if label.startswith("bgq "):
            continue
        cells = []
        for title, mode, case in SUMMARY_COLUMNS:
            v = None if mode == "broker" else med(label, case)
            cells.append(show(v))
            if v is not None:
                peers[title].append(v)
            if label.startswith("pgqueuer "):
                pgq[title] = v
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    def over(best: dict[str, float | None]) -> str:
        return " | ".join(
            f"{max(ours[t]) / best[t]:.2f}" if ours[t] and best.get(t) else "n/a"
            for t, _, _ in SUMMARY_COLUMNS
        )

    lines.append("| **bgq best / pgqueuer** | " + over(pgq) + " |")
    lines.append(
        "| **bgq best / best peer** | " + over({t: max(v, default=None) for t, v in peers.items()}) + " |"
    )
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = [
        "| system / mode / dialect | " + " | ".join(CASE_TITLES[c] for c in CASES) + " |",
        "|---" * (len(CASES) + 1) + "|",
    ]
    for label, row in results.items():
        lines.append(f"| {label} | " + " | ".join(row.get(c, {}).get("text", "") for c in CASES) + " |")
    lines.append("| **bgq best / best peer** | " + " | ".join(ratio(results, c) for c in CASES) + " |")
    return "\n".join(lines)


def sizes_table(results: dict, crons: dict) -> str:
    """N and the median measured span of each measured cell."""
    lines = [
        "| system / mode / dialect | " + " | ".join(CASE_TITLES[c] for c in [*CASES, CRON]) + " |",
        "|---" * (len(CASES) + 2) + "|",
    ]

    def size(cell: dict | None) -> str:
        if not cell or "median" not in cell:
            return ""
        return f"{cell['n']} / {cell['seconds']:.1f}s"

    for label, row in results.items():
        lines.append(f"| {label} | " + " | ".join(size(row.get(c)) for c in CASES) + " | |")
    for label, cell in crons.items():
        lines.append(f"| {label} | " + " | " * len(CASES) + size(cell) + " |")
    return "\n".join(lines)


def floor_table(floors: dict) -> str:
    lines = ["| dialect | 1 client | 2 clients | durability settings |", "|---|---|---|---|"]
    for dialect in ("postgres", "mariadb"):
        if (dialect, "settings") not in floors:
            continue
        cells = [floors.get((dialect, k), {}).get("text", "") for k in (1, 2)]
        lines.append(f"| {dialect} | {cells[0]} | {cells[1]} | {floors[(dialect, 'settings')]} |")
    return "\n".join(lines)


def dialect_of(label: str) -> str:
    return "postgres" if label.endswith("/ postgres") else "mariadb"


def fraction_table(results: dict, crons: dict, floors: dict) -> str:
    """Each bgq median over the commit floor of its dialect at its client count (FLOOR_CLIENTS)."""
    cols = [*CASES, CRON]
    lines = [
        "| system / mode / dialect | " + " | ".join(CASE_TITLES.get(c, c) for c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    rows = {lbl: r for lbl, r in results.items() if lbl.startswith("bgq ")}
    rows.update({lbl: {CRON: c} for lbl, c in crons.items()})
    for label, row in rows.items():
        cells = []
        for c in cols:
            floor = floors.get((dialect_of(label), FLOOR_CLIENTS[c]), {}).get("median")
            med = row.get(c, {}).get("median")
            cells.append(f"{med / floor:.2f}" if med and floor else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cron_table(crons: dict) -> str:
    lines = [
        "| system / mode / dialect | jobs/s | seconds | N | runs started (per rep) | runs that failed "
        "| jobs run twice |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, cell in crons.items():
        secs = f"{cell['seconds']:.1f}" if "seconds" in cell else ""
        cols = [cell.get("text", ""), secs, str(cell.get("n", ""))]
        cols += [str(cell.get(k, "")) for k in ("runs", "failed", "twice")]
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def latency_table(latencies: dict) -> str:
    lines = ["| system / mode / dialect | p50 ms | p99 ms | max ms | samples |", "|---|---|---|---|---|"]
    for label, cell in latencies.items():
        cols = [cell.get(k, "") for k in ("p50", "p99", "max", "n")]
        lines.append(f"| {label} | " + " | ".join(cols) + " |")
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


def head_timing(sizes: str, remaining: float) -> str:
    if remaining < 30:
        return "(skipped: global deadline reached)"
    env = dict(  # the same servers as the rest of the benchmark
        os.environ,
        BGQ_TEST_MYSQL_URL=MYSQL_URL,
        BGQ_TEST_POSTGRES_URL=PG_ADMIN.replace("postgresql://", "postgresql+psycopg://", 1),
    )
    limit = min(remaining, 600)
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "head_timing.py"), "--sizes", sizes],
            capture_output=True,
            text=True,
            timeout=limit,
            cwd=ROOT,
            env=env,
        )
        return (proc.stdout + (proc.stderr[-2000:] if proc.returncode else "")).rstrip()
    except subprocess.TimeoutExpired:
        return f"(timeout after {limit:.0f}s)"


def write_doc(
    path: Path, args, tables: dict, latency_md: str, head: str, started_at: str, total: float
) -> None:
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    options = " ".join(sys.argv[1:]) or "(defaults)"
    gap_lo, gap_hi = 0.5 * args.latency_gap * 1000, 1.5 * args.latency_gap * 1000
    quick = (
        "\n**This is a smoke run (`--quick`): N is tiny and there is one repetition; its figures measure "
        "start-up and polling more than processing and are not results.**\n"
        if args.quick
        else ""
    )
    doc = f"""# Benchmarks

Generated by `tools/bench/run.py` on {started_at} (`date -u`); the run took {total:.0f} s.
{quick}
- `nproc` = {nproc}; Python {sys.version.split()[0]}
- options: `{options}`
- packages: {", ".join(versions())}
- servers: {", ".join(server_versions())}

How to run: `make bench` (creates `.venv-bench` from `tools/bench/requirements.txt` plus bgq from
this source tree, and runs `.venv-bench/bin/python tools/bench/run.py`; pass options with
`BENCH_ARGS="--systems floor,bgq-pg-work,pgqueuer --cases a,c,d"`; `run.py --help` lists them;
`--quick` is a smoke run of a few minutes whose figures are not results).

## Method

**What a figure is.** Every job's callback is a no-op that appends one line to its worker
process's own file (opened `O_APPEND`, one `write` per job): the job's number, `time.time()` at
its first statement and `time.time()` at its last. A processing figure is
N / (last callback end − first callback start) over all worker processes, so it does not include
the workers' start, the harness's polling, or the time a system takes to record the last job as
done; it is the rate at which jobs ran once they were running. (The harness still waits, untimed,
up to {VERIFY_WAIT:.0f} s for the system to record N jobs done — bgq: N rows FINISHED, pgqueuer: its
table empty, procrastinate: N jobs `succeeded` — and shows it beside the figure if it did not;
celery has no result backend here, its stamps are its record. A job whose callback ran twice
is shown too.) An enqueue figure is N / (wall time of the N client calls) in one process.

**Size of a run.** Before the measured runs of a case, a calibration run of {args.calib_jobs} jobs
(at most {args.calib_seconds:.0f} s) gives the system's rate on that case; the measured runs then
use N = 1.15 × rate × {args.target:.0f} s for a processing case ({args.enqueue_target:.0f} s for an
enqueue case), at least {args.min_jobs} and at most {args.max_jobs} jobs. So a processing run lasts
about {args.target:.0f} s whatever the system's speed: start-up and the last poll are a small part of
it. A cell whose median span came out below the target is marked †. A system so slow on a case
that {args.min_jobs} jobs would not finish within {args.case_timeout:.0f} s is not run further: its cell
gives the calibration's rate (≈). The N and median span of every cell are in the table "Run sizes".

**Repetitions.** Every case is run {args.reps} times (fresh tables, emptied with TRUNCATE, and new
queue names each time; new worker processes each time). A cell is the median jobs/s with the
lowest and highest of the repetitions in brackets.

**Processing runs.** N jobs are enqueued first (untimed; in bulk where the system has a batch
API), then the worker processes start (one OS process per worker), and are released together
once each has imported its code and connected. When all N callbacks have run, the workers get
SIGTERM. A run that has not done N jobs within {args.case_timeout:.0f} s shows `timeout (done/N)`.

**The commit floor.** One INSERT of one row and one COMMIT per transaction, in a loop, from 1
and from 2 client processes (psycopg on PostgreSQL, PyMySQL on MariaDB — the drivers bgq uses),
{args.floor_seconds:.0f} s per run, {args.reps} runs, into a fresh table; the servers' own durability
settings (listed in the table) apply. A durable queue needs at least one commit per job (its
claim or its finish) unless it batches jobs into one commit, so this is what one commit per job
would cost at most on this machine. Each bgq cell is also given as a fraction of the floor of
its dialect: enqueue and 1-worker cells against the 1-client floor, 2-worker and cron cells
against the 2-client floor. A fraction above 1 means more than one job per commit.

### How each system is set up, and why

- **bgq work** (`bgq-pg-work`, `bgq-my-work`): worker processes call `bgq.work.work(queue,
  sub_queue=None, priorities=None, stop=stop)` inside `bgq.stopping.GracefulStop`, which is what
  `bgq work` runs. On PostgreSQL they wake on LISTEN/NOTIFY, on MariaDB they poll adaptively.
  Enqueue: `Queue.publish()` per job; bulk: `start_bulk()` / `end_bulk()` with `bulk_size=500`.
  Groups: `serial_group="one"` or `"g<i % 100>"`.
- **bgq broker** (`bgq-pg-broker`, `bgq-my-broker`): the same table, producer
  `bgq.broker.rabbitmq.RabbitMQ`; `publish()` commits the row, then sends its id to RabbitMQ;
  worker processes run `bgq.consumer.consume` (what `bgq consume` runs). Its "(d) 2 workers"
  cell is the broker-mode 2-worker figure.
- **bgq cron** (`bgq-pg-cron`, `bgq-my-cron`): its own table below (publishing is the same call
  as the work rows').
- **pgqueuer**: on **asyncpg**, the driver its documentation leads with:
  `PgQueuer.from_asyncpg_connection(await asyncpg.connect(dsn))`, workers `await pgq.run()`
  with its defaults (batch size 10), which is what its `pgq run` command runs. Enqueue:
  `Queries(AsyncpgDriver(conn)).enqueue()`, lists of 500 for bulk. Groups: one entrypoint per
  group registered with `concurrency_limit=1`, which pgqueuer documents as serialising that
  entrypoint's dispatch across all workers (enforced in its dequeue query). Earlier versions of
  this page drove it through `PsycopgDriver`, which is slower.
- **procrastinate**: `procrastinate.App(connector=PsycopgConnector(conninfo=dsn))` (its
  recommended connector in version 3), `task.defer()` / `task.batch_defer()` (500 per call),
  workers `app.run_worker(concurrency=1)` (what `procrastinate worker` runs, with its defaults:
  LISTEN/NOTIFY plus a 5 s poll); groups: `configure(lock=...)`, its way to run jobs of one lock
  one at a time.
- **celery**: `apply_async()` on one producer connection to RabbitMQ, no result backend
  (`task_ignore_result`), workers `celery worker --pool=solo` (one process each, to match one
  worker per process), default prefetch and early acknowledgement. Two enqueue rows: without
  publisher confirms (celery's default: `apply_async` returns once the message is written to
  the socket, so a broker crash can lose it) and with them
  (`broker_transport_options={{"confirm_publish": True}}`: it returns once RabbitMQ confirmed,
  the comparable guarantee to a committed row). Processing does not depend on the producer's
  confirms, so the confirms row's processing cells point to the plain row. celery has no batch
  publish API and no serial groups.

The last row of the throughput table divides the best bgq median (work or broker, either
dialect) by the best peer median, per column; cells without a measured median do not count.

## Summary (jobs/s, medians)

The speed issue's view of the throughput table below: bgq's work-mode row per dialect, with its
broker-mode 2-worker figure as its own column, beside every peer; the ratios divide bgq's best
(either dialect) by pgqueuer and by the best peer per column.

{tables["summary"]}

## Commit floor (commits/s)

{tables["floor"]}

## Throughput (jobs/s; median, min–max over the repetitions)

{tables["md"]}

### bgq as a fraction of the commit floor

{tables["fraction"]}

### Run sizes (N / median span)

{tables["sizes"]}

## Cron mode at a backlog (jobs/s)

bgq only, so there is no peer column and no ratio: none of procrastinate, pgqueuer and celery has a
cron mode (a command that a scheduler starts, which runs what is due and exits); they have only
continuous workers, which the throughput table compares.

For each dialect a backlog of N = {args.cron_jobs} jobs is enqueued first (untimed, `start_bulk()`):
{args.cron_jobs // 10} of them (N // 10) without a group, the others each in one of G =
{args.cron_groups} groups chosen at random (`serial_group="g<k>"`), every job with a random
priority of 1, 2 or 3, the two kinds in random id order. Then K = {args.cron_procs} slots each run
`bgq process` (the console script, `--app` a queue with the same table), each slot with its own
`BGQ_LOCKS_DIR`, so that no run is refused by another's per-host lock: they act as K hosts. A slot
starts `bgq process` again as soon as the previous run exits, as a cron that starts it every few
seconds would, without the wait; every run after a slot's first includes a new process's start
(Python, imports, connecting, the installed-procedures check). jobs/s is N / (last callback end −
first callback start), from the same stamp files as above, median and min–max of {args.reps}
repetitions; `seconds` is the median span. `runs started` counts every `bgq process` started per
repetition, `runs that failed` those that exited with a status other than 0, `jobs run twice`
callbacks that ran for a job whose callback had already run (0 expected). A row count other than
N in state FINISHED at the end is shown beside the figure.

{tables["cron"]}

## Single-job latency (ms)

One worker process per system is started and left idle ({LATENCY_IDLE:.0f} s). Then, up to
{args.latency} times, the harness takes `time.time()` just before it publishes one job (bgq
`Queue.publish()`, procrastinate `defer()`, pgqueuer `Queries.enqueue()`, celery `apply_async()`),
the job's callback writes `time.time()` into a pipe as its first statement, and the harness waits
for that line before it publishes the next job, after a random pause of {gap_lo:.0f} to {gap_hi:.0f}
ms (so the worker is idle again, and the pauses do not fall in step with a poll interval). A
sample is thus publish (with its commit) + wake-up + claim + callback start. The first
{LATENCY_WARMUP} samples are warm-up and dropped; p50, p99 and max are nearest-rank over the
remaining ones; a run stops after {args.latency_timeout:.0f} s with the samples it has.

- bgq work: PostgreSQL wakes the worker by NOTIFY (a trigger on insert); MariaDB by its adaptive
  poll, whose interval the pause between jobs influences.
- bgq broker: `consume` on RabbitMQ; `publish()` commits the row, then sends the id.
- bgq cron: not measured: a job waits for the next `bgq process` (cron starts it once a minute).
- procrastinate: `run_worker(concurrency=1)` with `listen_notify` (its default; polls every 5 s
  besides). pgqueuer (asyncpg): `PgQueuer.run()`, woken by its NOTIFY trigger. celery:
  `--pool=solo`, messages pushed by RabbitMQ, published without confirms.

{latency_md}

## Head-of-group selection: `tools/head_timing.py --sizes {args.head_sizes}`

For each dialect and size W, a fresh bgq table gets G = min(W, 5000) groups with one PROCESSING
job each, then W WAITING jobs spread at random over those groups with priorities 1 to 3; the
procedures derive the `_group` rows, then the tables are analysed. Each figure is the median of 7
runs, in ms; every write is rolled back, so each run sees the same table:

- `group_heads`: one call of the `group_heads` procedure, which returns the WAITING head of
  every group (G rows, read from the `_group` table that the procedures keep);
- `predecessor`: one call of `predecessor` for a WAITING job (the job ahead of it in its group),
  mean over 10 jobs;
- `claim(wait)`: one claim (`claim`, as `bgq process` and `bgq consume` do it) of a WAITING job
  whose group has a job running, which the procedure must refuse ("waiting") after finding the
  group's head and its running job, mean over 10 claims;
- `batch(busy)`: one `claim_batch` (the claim of `bgq work`, limit 100) while every group runs a
  job, so no head may be claimed: the time it takes to find that out;
- `batch(idle)`: one `claim_batch` with limit 1 after the running jobs were set FINISHED in the
  same transaction (untimed), so all G heads may be claimed: it claims the first of them in
  (priority, id) order;
- `fill s`: how long filling took (setup, not a result).

```
{head}
```
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)


QUICK = {  # --quick: a smoke run that proves every system and case works, in a few minutes
    "target": 1.0,
    "enqueue_target": 0.5,
    "calib_jobs": 100,
    "calib_seconds": 5.0,
    "min_jobs": 20,
    "max_jobs": 500,
    "cron_jobs": 300,
    "reps": 1,
    "floor_seconds": 1.0,
    "latency": 20,
    "case_timeout": 30.0,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated, in run order: {','.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--cases", default=",".join([*CASES, CRON]), help='throughput cases: a-f, cron, or "none"'
    )
    parser.add_argument("--reps", type=int, default=3, help="repetitions per case (median, min-max)")
    parser.add_argument("--target", type=float, default=10.0, help="seconds a processing run should last")
    parser.add_argument(
        "--enqueue-target", type=float, default=5.0, help="seconds an enqueue run should last"
    )
    parser.add_argument("--calib-jobs", type=int, default=1000, help="jobs of the calibration run per case")
    parser.add_argument("--calib-seconds", type=float, default=8.0, help="time limit of a calibration run")
    parser.add_argument("--min-jobs", type=int, default=50, help="smallest N of a measured run")
    parser.add_argument("--max-jobs", type=int, default=200_000, help="largest N of a measured run")
    parser.add_argument("--case-timeout", type=float, default=60.0, help="seconds per measured run")
    parser.add_argument("--cron-jobs", type=int, default=10_000, help="cron case: backlog size N")
    parser.add_argument(
        "--cron-procs", type=int, default=4, help="cron case: `bgq process` processes (K), each a host"
    )
    parser.add_argument("--cron-groups", type=int, default=100, help="cron case: serial groups (G)")
    parser.add_argument("--floor-seconds", type=float, default=5.0, help="seconds per commit-floor run")
    parser.add_argument(
        "--latency", type=int, default=100, help="single-job latency samples per system (0: none)"
    )
    parser.add_argument("--latency-timeout", type=float, default=40.0, help="seconds per latency run")
    parser.add_argument(
        "--latency-gap", type=float, default=0.1, help="mean seconds between latency jobs (0.5x-1.5x)"
    )
    parser.add_argument("--head-sizes", default="1000,20000,100000", help="waiting rows for head_timing")
    parser.add_argument("--no-head-timing", action="store_true")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: tiny N, 1 rep (" + ", ".join(f"{k}={v}" for k, v in QUICK.items()) + ")",
    )
    parser.add_argument("--deadline", type=float, default=2700.0, help="seconds for all systems")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "SPEC", "READY", "GO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, spec, ready, go = args.worker
        worker_main(kind, json.loads(spec), ready, go)
        return
    if args.quick:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
        for k, v in QUICK.items():
            if k not in given:
                setattr(args, k, v)
        args.no_head_timing = True
    args.cases = set() if args.cases == "none" else set(args.cases.split(","))
    keys = args.systems.split(",")
    unknown = sorted((args.cases - set(CASES) - {CRON}) | (set(keys) - set(SYSTEMS)))
    if unknown:
        parser.error(f"unknown case or system: {', '.join(unknown)}")
    if args.cron_procs < 1 or args.cron_groups < 1 or args.reps < 1:
        parser.error("--cron-procs, --cron-groups and --reps must be at least 1")

    started_at = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    t_start = time.monotonic()
    global_deadline = t_start + args.deadline
    factories: dict[str, Callable[[], System]] = {
        "bgq-pg-work": lambda: Bgq("postgres", "work"),
        "bgq-pg-cron": lambda: Bgq("postgres", "cron"),
        "bgq-pg-broker": lambda: Bgq("postgres", "broker"),
        "bgq-my-work": lambda: Bgq("mysql", "work"),
        "bgq-my-cron": lambda: Bgq("mysql", "cron"),
        "bgq-my-broker": lambda: Bgq("mysql", "broker"),
        "procrastinate": Procrastinate,
        "pgqueuer": PgQueuer,
        "celery": Celery,
        "celery-confirm": lambda: Celery(confirm=True),
    }
    logdir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    print(
        f"target {args.target:.0f}s per processing run, {args.reps} reps; worker logs in {logdir}", flush=True
    )
    results: dict[str, dict[str, dict]] = {}
    latencies: dict[str, dict[str, str]] = {}
    crons: dict[str, dict] = {}
    floors: dict = run_floor(args) if FLOOR in keys else {}
    for key in keys:
        if key == FLOOR:
            continue
        system = factories[key]()
        if key == "celery-confirm":
            system.processing_same_as = Celery().label()
        run_system(system, args, results, latencies, global_deadline, logdir, crons)
    md = table(results)
    if crons:
        cron_md = cron_table(crons)
    elif CRON in args.cases:
        cron_md = "(not measured: no bgq cron system in --systems)"
    else:
        cron_md = "(not measured: not in --cases)"
    floor_md = floor_table(floors) if floors else "(not measured: `floor` not in --systems)"
    fraction_md = fraction_table(results, crons, floors) if floors else "(no commit floor measured)"
    sizes_md = sizes_table(results, crons)
    latency_md = latency_table(latencies) if latencies else "(not measured: --latency 0)"
    for part in (floor_md, summary_table(results), md, fraction_md, sizes_md, cron_md, latency_md):
        print()
        print(part, flush=True)
    if args.no_head_timing:
        head = "(skipped: --no-head-timing)"
    else:
        head = head_timing(args.head_sizes, global_deadline - time.monotonic() + 300)
    print()
    print(head)
    total = time.monotonic() - t_start
    tables = {"md": md, "cron": cron_md, "floor": floor_md, "fraction": fraction_md, "sizes": sizes_md}
    tables["summary"] = summary_table(results)
    write_doc(Path(args.out), args, tables, latency_md, head, started_at, total)
    took = dt.timedelta(seconds=round(total))
    print(f"\nwrote {args.out}; worker logs in {logdir}; total {total:.0f} s ({took})")


if __name__ == "__main__":
    main()
