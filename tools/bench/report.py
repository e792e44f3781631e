"""The benchmark's tables and the docs/benchmarks.md page, with its methodology text."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from tools.bench.systems import (
    AMQP_URL,
    CASE_TITLES,
    CASES,
    CRON,
    FLOOR_CLIENTS,
    LATENCY_IDLE,
    LATENCY_WARMUP,
    MYSQL_URL,
    PG_ADMIN,
    VERIFY_WAIT,
)

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


def median_of(results: dict, label: str, case: str) -> float | None:
    """The median of one cell of the throughput table (None: not measured)."""
    return results.get(label, {}).get(case, {}).get("median")


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

    med = functools.partial(median_of, results)

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


def head_figures(head: str) -> dict[tuple[str, int], dict[str, float]]:
    """The figures of tools/head_timing.py's output, by (dialect, waiting rows)."""
    names = ("group_heads", "predecessor", "claim_wait", "batch_busy", "batch_idle")
    out: dict[tuple[str, int], dict[str, float]] = {}
    for line in head.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[0] not in ("mysql", "postgres"):
            continue
        try:
            out[(cols[0], int(cols[1]))] = {n: float(v) for n, v in zip(names, cols[3:8], strict=True)}
        except ValueError:  # "-" or "failed: ..."
            continue
    return out


def goals_table(results: dict, floors: dict, latencies: dict, head: str) -> str:
    """The speed issue's goals, each computed from this run's figures: target, figure, reached or by
    how much it falls short (figure / target)."""

    med = functools.partial(median_of, results)

    def floor(dialect: str, clients: int) -> float | None:
        return floors.get((dialect, clients), {}).get("median")

    def verdict(value: float | None, target: float | None, at_most: bool = False) -> str:
        if value is None or not target:
            return "not measured"
        if (value <= target) if at_most else (value >= target):
            return "yes"
        return (
            f"no ({value / target:.2f} of the target)"
            if not at_most
            else f"no ({value / target:.1f}× the limit)"
        )

    def limit_row(
        goal: str, target: str, value: float | None, fmt: str, limit: float, at_most: bool = False,
        missing: str = "not measured",
    ) -> list[str]:  # fmt: skip
        """A goal with a fixed target; the figure shown as `fmt` formats it, or `missing`."""
        shown = missing if value is None else fmt.format(value)
        return [goal, target, shown, verdict(value, limit, at_most)]

    def ratio_row(goal: str, what: str, num: float | None, den: float | None, need: float) -> list[str]:
        if num is None or den is None:
            return [goal, f"≥ {need:g}× {what}", "not measured", "not measured"]
        r = num / den
        return [goal, f"≥ {need:g}× {what}", f"{num:.0f} / {den:.0f} = {r:.2f}", verdict(r, need)]

    rows: list[list[str]] = []
    pg, my, pgq = "bgq / work / postgres", "bgq / work / mariadb", "pgqueuer / worker / postgres"
    for dialect, label in (("PostgreSQL", pg), ("MariaDB", my)):
        rows.append(
            ratio_row(f"2. 100 groups, {dialect}", "own ungrouped (d)", med(label, "f"), med(label, "d"), 0.7)
        )
    rows.append(ratio_row("2. 100 groups, PostgreSQL", "pgqueuer (f)", med(pg, "f"), med(pgq, "f"), 1.2))
    for dialect, label in (("PostgreSQL", pg), ("MariaDB", my)):
        rows.append(
            ratio_row(
                f"2. 10,000 groups, {dialect}", "own 100 groups (f)", med(label, "g"), med(label, "f"), 1.0
            )
        )
    for dialect, label, need in (("PostgreSQL", pg, 1500.0), ("MariaDB", my, 800.0)):
        v = med(label, "e")
        rows.append(limit_row(f"3. one group, {dialect}", f"≥ {need:.0f} jobs/s", v, "{:.0f}", need))
    rows.append(ratio_row("4. enqueue 1-by-1, PostgreSQL", "pgqueuer (a)", med(pg, "a"), med(pgq, "a"), 1.0))
    for dialect, label, key in (("PostgreSQL", pg, "postgres"), ("MariaDB", my, "mariadb")):
        rows.append(
            ratio_row(
                f"4. enqueue 1-by-1, {dialect}", "the 1-client floor", med(label, "a"), floor(key, 1), 0.6
            )
        )
    rows.append(ratio_row("4. enqueue bulk, PostgreSQL", "pgqueuer (b)", med(pg, "b"), med(pgq, "b"), 1.0))
    for dialect, key in (("PostgreSQL", "postgres"), ("MariaDB", "mariadb")):
        v = med(f"bgq / broker / {key}", "d")
        rows.append(limit_row(f"5. broker, 2 consumers, {dialect}", "≥ 2500 jobs/s", v, "{:.0f}", 2500.0))
    heads = head_figures(head)
    for key, dialect in (("postgres", "PostgreSQL"), ("mysql", "MariaDB")):
        fig = heads.get((key, 100000), {})
        for name, what, limit in (
            ("batch_idle", "`claim_batch`, groups idle", 5.0),
            ("batch_busy", "`claim_batch`, every group busy", 5.0),
            ("group_heads", "`group_heads`", 20.0),
        ):
            v = fig.get(name)
            target = f"≤ {limit:g} ms (100,000 waiting, 5,000 groups)"
            rows.append(limit_row(f"6. {what}, {dialect}", target, v, "{:.2f} ms", limit, at_most=True))
    p50 = latencies.get(my, {}).get("p50", "")
    try:
        lat: float | None = float(p50)
    except ValueError:
        lat = None
    rows.append(
        limit_row(
            "7. MariaDB wake-up, p50",
            "≤ 10 ms",
            lat,
            "{:.1f}",
            10.0,
            at_most=True,
            missing=p50 or "not measured",
        )
    )
    lines = ["| goal | target | this run | reached? |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
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
done; it is the rate at which jobs ran once they were running. The commit that records the last
jobs as done therefore falls outside the span, as the speed issue defines the measure; against a
run of about ten seconds it is small. (The harness still waits, untimed,
up to {VERIFY_WAIT:.0f} s for the system to record N jobs done — bgq: N rows FINISHED, pgqueuer: its
table empty, procrastinate: N jobs `succeeded` — and shows it beside the figure if it did not;
celery has no result backend here, its stamps are its record. A job whose callback ran twice
is shown too.) An enqueue figure is N / (wall time of the N client calls) in one process.

**Size of a run.** Before the measured runs of a case, a calibration run of {args.calib_jobs} jobs
(at most {args.calib_seconds:.0f} s) gives the system's rate on that case; the measured runs then
use N = 1.15 × rate × {args.target:g} s for a processing case ({args.enqueue_target:g} s for an
enqueue case), at least {args.min_jobs} and at most {args.max_jobs} jobs. So a processing run lasts
about {args.target:g} s whatever the system's speed: start-up and the last poll are a small part of
it. When a run lasts less than the target (the calibration run underestimated the rate), N grows
for the following runs; a cell whose median span came out below the target is marked †. A system
so slow on a case that {args.min_jobs} jobs would not finish within {args.case_timeout:.0f} s is not
run further: its cell gives the calibration's rate (≈). The N and median span of every cell are
in the table "Run sizes".

**Repetitions.** Every case is run {args.reps} time(s) (fresh tables, emptied with TRUNCATE, and new
queue names each time; new worker processes each time). A cell is the median jobs/s with the
lowest and highest of the repetitions in brackets.

**Processing runs.** N jobs are enqueued first (untimed; in bulk where the system has a batch
API), then the worker processes start (one OS process per worker), and are released together
once each has imported its code and connected. When all N callbacks have run, the workers get
SIGTERM. A run that has not done N jobs within {args.case_timeout:.0f} s shows `timeout (done/N)`.

**The commit floor.** One INSERT of one row and one COMMIT per transaction, in a loop, from 1
and from 2 client processes (psycopg on PostgreSQL, PyMySQL on MariaDB — the drivers bgq uses),
{args.floor_seconds:g} s per run, {args.reps} run(s), into a fresh table; the servers' own durability
settings (listed in the table) apply. A durable queue needs at least one commit per job (its
claim or its finish) unless it batches several jobs into one commit, so the floor is the most
jobs per second that one commit per job allows on this machine. Each bgq cell is also given as a
fraction of the floor of its dialect: enqueue and 1-worker cells against the 1-client floor,
2-worker and cron cells against the 2-client floor. A fraction above 1 means more than one job per commit.

### How each system is set up, and why

- **bgq work** (`bgq-pg-work`, `bgq-my-work`): worker processes call `bgq.modes.work.work(queue,
  sub_queue=None, priorities=None, stop=stop)` inside `bgq.modes.stopping.GracefulStop`, which is what
  `bgq work` runs. On PostgreSQL they wake on LISTEN/NOTIFY, on MariaDB on a `SELECT MAX(id)` probe
  every 5 ms (the claims themselves back off from 5 ms to `--poll`).
  Enqueue: `Queue.publish()` per job; bulk: `start_bulk()` / `end_bulk()` with `bulk_size=500`.
  Groups: `serial_group="one"` or `"g<i % 100>"`.
- **bgq broker** (`bgq-pg-broker`, `bgq-my-broker`): the same table, producer
  `bgq.broker.rabbitmq.RabbitMQ`; `publish()` commits the row, then sends its id to RabbitMQ;
  worker processes run `bgq.modes.consume.consume` (what `bgq consume` runs). Its "(d) 2 workers"
  cell is the broker-mode 2-worker figure.
- **bgq cron** (`bgq-pg-cron`, `bgq-my-cron`): its own table below (publishing is the same call
  as the work rows').
- **pgqueuer**: on **asyncpg**, the driver its documentation leads with:
  `PgQueuer.from_asyncpg_connection(await asyncpg.connect(dsn))`, workers `await pgq.run()`
  with its defaults (batch size 10), which is what its `pgq run` command runs. Enqueue:
  `Queries(AsyncpgDriver(conn)).enqueue()`, lists of 500 for bulk. Groups: one entrypoint per
  group registered with `concurrency_limit=1`, which pgqueuer documents as serialising that
  entrypoint's dispatch across all workers (enforced in its dequeue query). Earlier versions of
  this page drove it through its `PsycopgDriver` instead.
- **procrastinate**: `procrastinate.App(connector=PsycopgConnector(conninfo=dsn))` (its
  recommended connector in version 3), `task.defer()` / `task.batch_defer()` (500 per call),
  workers `app.run_worker(concurrency=1)` (what `procrastinate worker` runs, with its defaults:
  LISTEN/NOTIFY plus a 5 s poll); groups: `configure(lock=...)`, its way to run jobs of one lock
  one at a time.
- **celery**: `apply_async()` on one producer connection to RabbitMQ, no result backend
  (`task_ignore_result`), workers `celery worker --pool=prefork --concurrency=1`: its default
  pool with one child process, so that a worker runs one job at a time like every other
  system's worker (`--pool=solo`, one process, stalled for 10 s in the middle of some smoke
  runs); default prefetch and early acknowledgement. Two enqueue rows: without
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

- bgq work: PostgreSQL wakes the worker by NOTIFY (a trigger on insert); MariaDB by a probe of the
  table's newest id (`SELECT MAX(id)`) every 5 ms on the idle worker's own connection.
- bgq broker: `consume` on RabbitMQ; `publish()` commits the row, then sends the id.
- bgq cron: not measured: a job waits for the next `bgq process` (cron starts it once a minute).
- procrastinate: `run_worker(concurrency=1)` with `listen_notify` (its default; polls every 5 s
  besides). pgqueuer (asyncpg): `PgQueuer.run()`, woken by its NOTIFY trigger. celery:
  `--pool=prefork --concurrency=1`, messages pushed by RabbitMQ, published without confirms.

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

## The speed issue's goals, computed from this run

Each row is computed by `tools/bench/report.py` from the figures above (no hand-written cell): the
target, this run's figure, and whether it is reached or what fraction of the target it reaches.
Where the time goes in the goals not reached, and what would close them, is in
[speed.md](speed.md) (a profile written by hand, with its own commands and dates).

{tables["goals"]}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
