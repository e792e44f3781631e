"""Benchmarks bgq (work/broker/cron mode; PostgreSQL, MariaDB) beside pgqueuer, procrastinate and celery.

Usage: python tools/bench/run.py [--systems KEY,...] [--cases a,b,...] [--reps 3] [--target 10]
           [--enqueue-target 5] [--calib-jobs 1000] [--case-timeout 60] [--cron-jobs 30000]
           [--cron-procs 4] [--cron-groups 100] [--floor-seconds 5] [--latency 100]
           [--head-sizes 1000,20000,100000] [--no-head-timing] [--quick] [--out docs/benchmarks.md]

Throughput (jobs/s), one row per system: (a) enqueue one by one, (b) enqueue in bulk (500 per
batch), (c) process with 1 worker process, (d) with 2, (e) all jobs in one serial group on 2
workers, (f) jobs spread over 100 groups on 2 workers, (g) over 10,000 groups on 2 workers. Every
job's callback appends its number and the time.time() of its first and last statement to its
worker process's own O_APPEND stamp file; a processing figure is N / (last callback end - first
callback start). N is sized per system and case by a calibration run so that a measured run lasts
about --target seconds; every case runs --reps times, a cell is the median with the min-max
spread. The commit floor (pseudo-system `floor`, tools/bench/floor.py) is one INSERT + COMMIT per
transaction from 1 and 2 clients per dialect; each bgq cell is also given as a fraction of it.
Cron mode (`bgq process`, K processes restarted as they exit, on a backlog of --cron-jobs) is its
own table; single-job latency and the head-of-group timing (tools/head_timing.py) follow.
docs/benchmarks.md, which this writes, explains the method and how each peer is configured.

Systems (--systems): floor, bgq-pg-work, bgq-pg-broker, bgq-pg-cron, bgq-my-work, bgq-my-broker,
bgq-my-cron, pgqueuer, procrastinate, celery, celery-confirm. Cases (--cases): a-g, cron, or "none";
--latency 0 skips the latency table, --no-head-timing the head timing. --quick is a smoke run
(tiny N, one repetition): its figures are not results.

Bounded: a per-run timeout, a time limit per latency run, a global deadline; worker processes (own
process groups) get SIGTERM, then SIGKILL, when a run ends. Each system gets fresh databases /
tables / queue names and removes them afterwards (also after a failed setup). The workers' output
stays in a temporary directory whose name is printed.

Modules: run.py (this: runs, calibration, repetitions, worker processes, main), systems.py (the
systems under test, the job callbacks and the worker side), floor.py (the commit floor), report.py
(the tables and the page's text).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from tools.bench.report import (  # noqa: E402 (after the sys.path line)
    cron_table,
    floor_table,
    fraction_table,
    goals_table,
    latency_table,
    sizes_table,
    summary_table,
    table,
    write_doc,
)
from tools.bench.systems import (  # noqa: E402 (after the sys.path line)
    CASE_TITLES,
    CASES,
    CRON,
    CRON_EXIT_WAIT,
    FLOOR,
    GROUPS,
    LATENCY,
    LATENCY_IDLE,
    LATENCY_WARMUP,
    MYSQL_URL,
    PG_ADMIN,
    POLL,
    PROCESSING,
    STOP_GRACE,
    SYSTEMS,
    VERIFY_WAIT,
    WORKERS,
    Bgq,
    CaseTimeout,
    Celery,
    NotApplicable,
    PgQueuer,
    Procrastinate,
    System,
    read_stamps,
    stamp_count,
    worker_main,
)


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
            [bgq_command(), "--app", "tools.bench.systems:cron_app", "process"],
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
    sizes = [str(r["n"]) for r in runs if r.get("n") is not None]
    cell: dict = {"n": "/".join(dict.fromkeys(sizes)), "reps": len(rates)}
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
    system.enqueue(n_cal, system.bulk_supported, GROUPS[case], time.monotonic() + args.enqueue_timeout)
    res = run_processing(system, case, n_cal, args.calib_seconds, logdir)
    done, seconds = res.get("done", 0), res.get("seconds")
    if res.get("error", "").startswith("error") or (done == 0 and res.get("error") == "workers exited"):
        return None, f"error in calibration ({res['error']})"
    if done == 0:
        return (
            None,
            f"< {1 / args.calib_seconds:.2f} (calibration only: no job done in {args.calib_seconds:.0f}s)",
        )
    # not all done in time: a span over the few that ran may be short, so count the whole limit
    rate = done / seconds if done >= n_cal and seconds else done / args.calib_seconds
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
    if case in ("e", "f", "g") and not system.groups_supported:
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
                    limit = time.monotonic() + min(args.enqueue_timeout, remaining)  # untimed
                    system.enqueue(n, system.bulk_supported, GROUPS[case], limit)
                except CaseTimeout:
                    runs.append({"n": n, "error": "timeout (while enqueueing, untimed)"})
                else:
                    runs.append(run_processing(system, case, n, timeout, logdir))
        except CaseTimeout:
            runs.append({"n": n, "error": f"timeout ({timeout:.0f}s)"})
        print(f"      rep {len(runs)}: {fmt_run(runs[-1])}", flush=True)
        last = runs[-1]
        if last.get("rate") and last["seconds"] < target:  # the calibration underestimated: grow N
            n = min(args.max_jobs, max(n, math.ceil(last["rate"] * target * 1.15)))
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
    only: set[str] | None = None,
) -> None:
    """Runs the cases of `system` that --cases (and `only`, the system's own filter) select."""
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
            if case not in args.cases or (only is not None and case not in only):
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
        if CRON in system.cases and CRON in args.cases and (only is None or CRON in only):
            assert isinstance(system, Bgq)
            crons[system.label()] = cron_of(system, args, global_deadline, logdir)
        if args.latency and system.latency_supported and (only is None or LATENCY in only):
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
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, in run order: {','.join(SYSTEMS)}; KEY:c+d+L runs only cases c, d and "
        "the latency run (L) of that system",
    )
    parser.add_argument(
        "--cases", default=",".join([*CASES, CRON]), help='throughput cases: a-g, cron, or "none"'
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
    parser.add_argument(
        "--enqueue-timeout", type=float, default=180.0, help="seconds for the untimed enqueue before a run"
    )
    parser.add_argument(
        "--cron-jobs", type=int, default=30_000, help="cron case: backlog size N (about 10 s or more of work)"
    )
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
    parser.add_argument("--deadline", type=float, default=3900.0, help="seconds for all systems")
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
    only: dict[str, set[str] | None] = {}  # "bgq-pg-broker:d+L": that system runs only d and latency
    for entry in args.systems.split(","):
        key, _, sel = entry.partition(":")
        only[key] = set(sel.split("+")) if sel else None
    keys = list(only)
    chosen = set().union(*(v for v in only.values() if v))
    unknown = sorted((args.cases - set(CASES) - {CRON}) | (set(keys) - set(SYSTEMS)))
    unknown += sorted(chosen - set(CASES) - {CRON, LATENCY})
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
        run_system(system, args, results, latencies, global_deadline, logdir, crons, only[key])
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
    tables["goals"] = goals_table(results, floors, latencies, head)
    print()
    print(tables["goals"], flush=True)
    write_doc(Path(args.out), args, tables, latency_md, head, started_at, total)
    took = dt.timedelta(seconds=round(total))
    print(f"\nwrote {args.out}; worker logs in {logdir}; total {total:.0f} s ({took})")


if __name__ == "__main__":
    main()
