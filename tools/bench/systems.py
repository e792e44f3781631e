"""The systems under test (bgq in each mode and dialect, pgqueuer, procrastinate, celery), their job
callbacks, and the worker-process side of the benchmark (`worker_main`)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import math
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

PG_ADMIN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
CASES = ["a", "b", "c", "d", "e", "f", "g"]
CASE_TITLES = {
    "a": "(a) enqueue 1-by-1",
    "b": "(b) enqueue bulk",
    "c": "(c) 1 worker",
    "d": "(d) 2 workers",
    "e": "(e) 1 group, 2 workers",
    "f": "(f) 100 groups, 2 workers",
    "g": "(g) 10,000 groups, 2 workers",
    "cron": "cron at a backlog",
}
LATENCY = "L"  # the latency run's case key: one worker, no groups
CRON = "cron"  # the cron-at-a-backlog case key: bgq cron systems only, its own table
CRON_PRIORITIES = (1, 2, 3)
CRON_EXIT_WAIT = 10.0  # seconds the `bgq process` runs get to end by themselves once all jobs ran
GROUPS = {"c": None, "d": None, "e": 1, "f": 100, "g": 10_000, LATENCY: None}
PROCESSING = ("c", "d", "e", "f", "g")
FLOOR = "floor"  # the pseudo-system that measures the durable single-row commit floor
# which floor a cell compares to
FLOOR_CLIENTS = {"a": 1, "b": 1, "c": 1, "d": 2, "e": 2, "f": 2, "g": 2, CRON: 2}
WORKERS = {"c": 1, "d": 2, "e": 2, "f": 2, "g": 2, LATENCY: 1}
BULK = 500
POLL = 0.05
STOP_GRACE = 3.0  # seconds a worker has to exit after SIGTERM before it gets SIGKILL
LATENCY_WARMUP = 5  # first samples of a latency run, dropped (connections, caches, worker start)
LATENCY_IDLE = 1.0  # seconds the worker idles after "go" before the first job of a latency run
VERIFY_WAIT = 20.0  # seconds the system gets, after the last callback, to record N jobs done (untimed)
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
    graceful_stop = (
        False  # its workers run under bgq.modes.stopping.GracefulStop: SIGTERM must end them with 0
    )
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

        if self.mode == "work" and importlib.util.find_spec("bgq.modes.work") is None:
            raise NotApplicable("bgq/modes/work.py does not exist")
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
        from bgq.sql.install import uninstall

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


#: celery's default pool (prefork) with one child per worker, so that a worker runs one job at a time
#: as every other system's worker process does. (`--pool=solo` stalled for 10 s in the middle of
#: some smoke runs, with nothing logged; prefork did not.)
CELERY_POOL = ("--pool=prefork", "--concurrency=1")


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
        from bgq.modes.stopping import GracefulStop

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
            from bgq.modes.work import work

            barrier()
            with GracefulStop() as stop:  # what `bgq work` runs; SIGTERM ends it
                work(queue, sub_queue=None, priorities=None, stop=stop)
            return
        from bgq.modes.consume import consume  # broker mode (cron mode runs `bgq process`: run_cron)

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
                *CELERY_POOL,
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
