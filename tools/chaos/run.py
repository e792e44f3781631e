"""The chaos harness's command line: runs, faults on a seeded schedule, the oracle, the table.

Usage: .venv/bin/python -m tools.chaos [--preset ci|full] [--dialect mysql|postgres|both]
           [--mode cron|work|broker|mixed|all] [--jobs N] [--groups G] [--ungrouped-share F]
           [--workers W] [--seconds S] [--stalled-timeout S] [--seed N] [--out PATH] [--keep]

Presets (every value can be overridden by its option):
  ci    3,000 jobs (broker mode 1,500) in 30 groups (15), 4 workers, faults over the first 55 s of
        a run bounded at 90 s: the reduced run of .ci/run (all modes, both dialects, a few
        minutes); prints the table, writes nothing unless --out is given.
  full  20,000 jobs in 120 groups, 6 workers, faults over the first 100 s of a run bounded at
        900 s (broker 1,500 s), every fault kind, every mode, both dialects (12 to 17 minutes on
        2 cores): `make chaos`; writes docs/reliability.md.
Exit code 1 when any run has a violation or a stuck job (see tools/chaos/oracle.py), or drained
before its first fault (it proved nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from tools.chaos import oracle, report, services  # noqa: E402
from tools.chaos.fleet import APP, BGQ, FaultLog, Fleet  # noqa: E402
from tools.scale.topology import Topology  # noqa: E402

MODES = ["cron", "work", "broker", "mixed"]
DIALECTS = ["mysql", "postgres"]
PRESETS: dict[str, dict[str, object]] = {
    "ci": dict(
        jobs=3000, groups=30, ungrouped_share=0.1, workers=4, seconds=90.0, stalled_timeout=8,
        kill_every=4.0, stop_every=12.0, dbkill_every=9.0, broker_restarts=1, drain=35.0,
        lost_timeout=15, out=None,
    ),
    "full": dict(
        jobs=20000, groups=120, ungrouped_share=0.15, workers=6, seconds=900.0, stalled_timeout=8,
        kill_every=5.0, stop_every=20.0, dbkill_every=15.0, broker_restarts=3, drain=800.0,
        lost_timeout=60, out="docs/reliability.md",
    ),
}  # fmt: skip
#: Per-mode settings of a preset, used unless the option is given. A run ends as soon as every
#: job has completed; `seconds` only bounds a run that cannot finish, and faults stop `drain`
#: seconds before it. Broker mode runs slower on a 2-core machine (every message of a job that
#: is not its group's head costs a claim that makes it WAITING): its runs get fewer jobs (ci) or
#: more time (full).
MODE_SIZES: dict[str, dict[str, dict[str, float]]] = {
    "ci": {"broker": {"jobs": 1500, "groups": 15}},
    "full": {"broker": {"seconds": 1500.0, "drain": 1400.0}},
}


#: Lines counted in the workers' logs, as evidence for the report: (label, text).
LOG_NOTES = (
    ("CRITICAL lines", "CRITICAL"),
    ("Traceback", "Traceback"),
    ("already running", "already running"),
    ("Unexpected state", "Unexpected state"),
    ("reaped messages", "Stalled job reaped"),
    ("lock wait timeout", "Lock wait timeout"),
    # broker mode: ids the lost-message pass of `bgq process` had to send again (bgq/modes/process.py), and
    # consumers that lost their broker connection (bgq/modes/consume.py)
    ("republished lost messages", "Lost broker message republished"),
    ("broker reconnects", "The broker connection failed"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    p.add_argument("--dialect", choices=["mysql", "postgres", "both"], default="both")
    p.add_argument("--mode", choices=[*MODES, "all"], default="all")
    p.add_argument("--jobs", type=int)
    p.add_argument("--groups", type=int)
    p.add_argument("--ungrouped-share", type=float, help="fraction of jobs without a serial group")
    p.add_argument("--workers", type=int, help="worker processes (cron: hosts) per run")
    p.add_argument("--seconds", type=float, help="hard bound of one run, from the workers' start")
    p.add_argument("--stalled-timeout", type=int, help="stalled_job_timeout of the app, in seconds")
    p.add_argument("--kill-every", type=float, help="mean seconds between two SIGKILLs")
    p.add_argument("--stop-every", type=float, help="mean seconds between two SIGSTOPs")
    p.add_argument("--dbkill-every", type=float, help="mean seconds between two cuts of every session")
    p.add_argument("--broker-restarts", type=int, help="RabbitMQ stop_app/start_app per broker run")
    p.add_argument("--lost-timeout", type=int, help="lost_message_timeout of the app (broker mode), in s")
    p.add_argument("--drain", type=float, help="seconds without faults at the end of a run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write the table and evidence to this Markdown file")
    p.add_argument(
        "--keep", action="store_true", help="keep every run's ledger and logs (failed runs: always)"
    )
    args = p.parse_args(argv)
    args.explicit = {k for k, v in vars(args).items() if v is not None}  # given on the command line
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def schedule(
    args: argparse.Namespace, mode: str, rng: random.Random, topology_kinds: tuple[str, ...] = ()
) -> list[tuple[float, str]]:
    """The faults of one run: (seconds after the workers' start, kind), in time order.

    `topology_kinds`: a topology's own faults (tools/scale/), `args.topology_faults` of them spread
    evenly over the fault window, taking turns through the kinds; the harness's own faults keep
    clear of each of them (stall timeout + 2 s before, 1 s after)."""
    end = max(2.0, args.seconds - args.drain)
    freeze = args.stalled_timeout + 3.0
    out: list[tuple[float, str]] = []
    for kind, every, first, last in (
        ("kill", args.kill_every, 2.0, end),
        ("stop", args.stop_every, 3.0, end - freeze),
        ("dbkill", args.dbkill_every, 4.0, end),
    ):
        t = first + rng.uniform(0, every / 2)
        while every > 0 and t < last:
            out.append((round(t, 2), kind))
            t += every * rng.uniform(0.6, 1.4)
    if mode == "broker" and args.broker_restarts:
        step = (end - 6.0) / args.broker_restarts
        out += [
            (round(3.0 + i * step + rng.uniform(0, min(2.0, step / 3)), 2), "broker")
            for i in range(args.broker_restarts)
        ]
    count = getattr(args, "topology_faults", 0) if topology_kinds else 0
    if count:
        first = getattr(args, "topology_first", 8.0)
        step = getattr(args, "topology_every", None) or max(1.0, (end - first) / count)
        out += [
            (
                round(first + i * step + rng.uniform(0, min(3.0, step / 4)), 2),
                topology_kinds[i % len(topology_kinds)],
            )
            for i in range(count)
        ]
        # A worker the harness kills or freezes just before a topology fault holds its claimed
        # groups until the reaper's stall timeout: the recovery measured after the topology
        # fault would be the harness's. Its own faults keep clear of each topology fault by
        # that window (and a second after it); they strike everywhere else in the run.
        marks = [t for t, kind in out if kind in topology_kinds]
        clear = args.stalled_timeout + 2.0
        out = [
            (t, kind)
            for t, kind in out
            if kind in topology_kinds or not any(m - clear <= t <= m + 1.0 for m in marks)
        ]
    return sorted(out)


def publish(
    env: dict[str, str], args: argparse.Namespace, rng: random.Random, path: Path
) -> list[oracle.Job]:
    """Publish every job (bulk) through the Python API; record (id, token, group, priority) ourselves."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from tools.chaos import app

        queue = app.queue()
        specs = []
        for token in range(args.jobs):
            group = None if rng.random() < args.ungrouped_share else f"g{rng.randrange(args.groups):04d}"
            specs.append((token, group, rng.randint(1, 3), round(rng.uniform(1.0, 5.0), 2)))
        with queue.bulk() as batch:
            for token, group, priority, sleep_ms in specs:
                queue.publish("chaos", [token, group, sleep_ms], serial_group=group, priority=priority)
        queue.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    jobs = [oracle.Job(i, t, g, p) for i, (t, g, p, _) in zip(batch.ids, specs, strict=True)]
    with path.open("w") as f:
        for j in jobs:
            f.write(
                json.dumps({"id": j.id, "token": j.token, "group": j.group, "priority": j.priority}) + "\n"
            )
    return jobs


#: How long the faults' clock waits for the fleet's first finished job, at most (seconds).
FAULT_CLOCK_WAIT = 120.0


def first_finished(poll: sa.Engine, table: str, seconds: float) -> float:
    """When the fleet finished its first job (time.monotonic(); at most `seconds` from now): the
    clock of the fault plan. Fifty workers starting on two cores take tens of seconds; a fault
    planned before any job ran struck an idle fleet and proved nothing about recovery (a
    PgBouncer run: two of its three pooler faults before the first job)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(sa.exc.DBAPIError), poll.connect() as conn:
            if conn.exec_driver_sql(f"SELECT 1 FROM {table} WHERE state = 3 LIMIT 1").first():
                break
        time.sleep(0.2)
    return time.monotonic()


def inject(
    fleet: Fleet, server: services.Server, database: str, plan: list[tuple[float, str]], t0: float,
    args: argparse.Namespace, rng: random.Random, done: threading.Event, topology: Topology | None = None,
) -> None:  # fmt: skip
    """The fault thread: each planned fault at its time, on a random live target. A topology's
    fault runs in a thread of its own (a failover takes seconds), joined before this one ends."""
    freeze = args.stalled_timeout + 3.0
    cluster: list[threading.Thread] = []
    for at, kind in plan:
        if done.wait(max(0.0, t0 + at - time.monotonic())):
            break
        try:
            if topology is not None and kind in topology.fault_kinds:
                if any(t.is_alive() for t in cluster):
                    print(f"  {at:6.2f}s {kind}: the previous topology fault is still going on", flush=True)
                    continue
                thread = threading.Thread(
                    target=topology_fault, args=(topology, kind, fleet, at), daemon=True
                )
                thread.start()
                cluster.append(thread)
            elif kind == "dbkill":
                fleet.faults.add("dbkill", None, f"{server.cut_sessions(database)} sessions")
            elif kind == "broker":
                threading.Thread(target=restart_broker, args=(fleet,), daemon=True).start()
            else:
                targets = [t for t in fleet.targets() if kind == "kill" or t[0] not in fleet.frozen]
                if not targets:
                    print(f"  {at:6.2f}s {kind}: no live worker", flush=True)
                    continue
                pid, name = rng.choice(targets)
                ok = fleet.kill(pid, name) if kind == "kill" else fleet.stop(pid, name, freeze)
                print(f"  {at:6.2f}s {kind} {name} pid {pid}{'' if ok else ' (already gone)'}", flush=True)
        except Exception as exc:  # a fault that fails is reported, the run goes on
            print(f"  {at:6.2f}s {kind} failed: {exc}", flush=True)
    for thread in cluster:
        thread.join(300)


def topology_fault(topology: Topology, kind: str, fleet: Fleet, at: float) -> None:
    try:
        detail = topology.fault(kind, fleet.faults)
        print(f"  {at:6.2f}s {kind}: {detail}", flush=True)
    except Exception as exc:  # reported; the run goes on and the oracle judges what followed
        print(f"  {at:6.2f}s {kind} failed: {exc}", flush=True)


def restart_broker(fleet: Fleet) -> None:
    """RabbitMQ down for the time of stop_app, 2 s and start_app (logged from before the stop to after
    the start)."""
    fleet.faults.add("broker_stop")
    try:
        services.rabbitmqctl("stop_app")
        time.sleep(2.0)
    finally:
        services.rabbitmqctl("start_app")
        fleet.faults.add("broker_start")


def run_one(
    args: argparse.Namespace, mode: str, dialect: str, seed: int, topology: Topology | None = None,
    faults_on: bool = True, admin: str | None = None,
) -> report.RunResult:  # fmt: skip
    """One run. `topology` (tools/scale/): the workers connect through it, the harness administers
    through its current writable node, and its faults join the schedule. `faults_on` False: a
    fault-free run (a throughput figure; it is not failed for having no fault). `admin`, without
    a topology: another single server's admin URL (default: the machine's)."""
    sizes = {k: v for k, v in MODE_SIZES.get(args.preset, {}).get(mode, {}).items() if k not in args.explicit}
    args = argparse.Namespace(**{**vars(args), **sizes})
    rng = random.Random(seed)
    hexid = secrets.token_hex(4)
    database, queue_name, table = f"bgqchaos_{hexid}", f"bgqchaos{hexid}", "chaos_job"
    where = f"{topology.name}-" if topology is not None else ""
    run_dir = Path(tempfile.mkdtemp(prefix=f"bgqchaos-{where}{mode}-{dialect}-"))
    (run_dir / "ledger").mkdir()
    server = services.Server(dialect, topology.admin_url() if topology is not None else admin)
    worker_url = topology.worker_url(database) if topology is not None else server.url_for(database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BGQ_")}
    env.update(
        BGQ_CHAOS_URL=worker_url, BGQ_CHAOS_TABLE=table, BGQ_CHAOS_QUEUE=queue_name,
        BGQ_CHAOS_LEDGER=str(run_dir / "ledger"), BGQ_CHAOS_STALLED=str(args.stalled_timeout),
        BGQ_CHAOS_LOST=str(args.lost_timeout), PYTHONPATH=str(ROOT),
    )  # fmt: skip
    amqp = topology.amqp_urls() if topology is not None else None
    if mode == "broker":
        env["BGQ_CHAOS_AMQP"] = " ".join(amqp) if amqp else services.AMQP_URL
    if topology is not None:
        env.update(topology.app_env(database))
    if not faults_on:
        args = argparse.Namespace(**{**vars(args), "kill_every": 0.0, "stop_every": 0.0, "dbkill_every": 0.0,
                                     "broker_restarts": 0, "topology_faults": 0})  # fmt: skip
    elif amqp:  # the topology's broker: its own faults, never a restart of the machine's RabbitMQ
        args = argparse.Namespace(**{**vars(args), "broker_restarts": 0})
    plan = schedule(args, mode, rng, topology.fault_kinds if topology is not None else ())
    print(
        f"== {where}{mode} / {dialect}: database {database}, queue {queue_name}, run dir {run_dir}",
        flush=True,
    )
    print(
        "   fault schedule (s after the first job finished): "
        + (", ".join(f"{t:.1f} {k}" for t, k in plan) or "none"),
        flush=True,
    )
    server.create(database)
    fleet: Fleet | None = None
    done = threading.Event()
    result: report.RunResult | None = None
    try:
        subprocess.run([BGQ, "--app", APP, "install-procs"], cwd=ROOT, env=env, check=True, timeout=180,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        jobs = publish(
            {k: env[k] for k in env if k.startswith("BGQ_CHAOS_")}, args, rng, run_dir / "published.jsonl"
        )
        faults = FaultLog(run_dir / "faults.jsonl")
        fleet = Fleet(mode, args.workers, env, run_dir, faults)
        # The poll goes where the workers go: after a failover it follows them to the new primary.
        poll = sa.create_engine(worker_url, pool_pre_ping=True, connect_args=services.connect_args(dialect))
        t0 = time.monotonic()
        fleet.start()
        work_began = first_finished(poll, table, FAULT_CLOCK_WAIT)
        injector = threading.Thread(
            target=inject, args=(fleet, server, database, plan, work_began, args, rng, done, topology)
        )
        injector.start()
        finished = 0
        while time.monotonic() - t0 < args.seconds:
            with contextlib.suppress(sa.exc.DBAPIError), poll.connect() as conn:
                finished = conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table} WHERE state = 3").scalar_one()
            if finished >= len(jobs):
                break
            time.sleep(0.5)
        wall = time.monotonic() - t0
        done.set()
        injector.join(330)
        poll.dispose()
        fleet.teardown()
        run_end = time.monotonic_ns()
        faults.close()
        if topology is not None:
            topology.heal()
            server.close()
            server = admin_server(dialect, topology)  # the node that takes writes now
        result = judge(
            run_dir, server, database, table, jobs, run_end, mode, dialect, args, seed, wall, faults,
            topology, fleet.pid_units(), faults_on,
        )  # fmt: skip
        return result
    finally:
        done.set()
        if fleet is not None and not fleet.stopping:
            fleet.teardown(grace=2.0)
        with contextlib.suppress(Exception):
            server.drop(database)
        if mode == "broker" and not amqp:  # a topology's broker goes with its data directory
            with contextlib.suppress(Exception):
                services.delete_broker_objects(queue_name)
        server.close()
        if result is not None and not result.failed and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif result is not None:
            result.kept = str(run_dir)


def admin_server(dialect: str, topology: Topology | None) -> services.Server:
    """The server the harness administers the run's database through: the single server, or the
    topology's node that takes writes now."""
    return services.Server(dialect, topology.admin_url() if topology is not None else None)


def judge(run_dir: Path, server: services.Server, database: str, table: str, jobs: list[oracle.Job],
          run_end: int, mode: str, dialect: str, args: argparse.Namespace, seed: int, wall: float,
          faults: FaultLog, topology: Topology | None = None, pid_units: dict[int, str] | None = None,
          faults_on: bool = True) -> report.RunResult:  # fmt: skip
    events: list[oracle.Event] = []
    torn = 0
    for path in sorted((run_dir / "ledger").glob("*.ledger")):
        evs, bad = oracle.parse_ledger(path.name, path.read_text().splitlines())
        events += evs
        torn += bad
    fault_list = oracle.parse_faults((run_dir / "faults.jsonl").read_text().splitlines())
    logs = [p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.log"))]
    rows = {r["id"]: oracle.Row(r["id"], r["state"], r["attempts"], r["finished_at"], r["pid"])
            for r in server.snapshot(database, table)}  # fmt: skip
    explaining = topology.fault_kinds if topology is not None and topology.may_rerun else ()
    verdict = oracle.judge(
        jobs, events, fault_list, rows, oracle.parse_reaped(logs), run_end, torn, cluster_kinds=explaining
    )
    recovery = (
        oracle.recovery(
            events, fault_list, pid_units or {}, topology.fault_kinds, topology.recovery_from == "fault"
        )
        if topology
        else []
    )
    notes = {}
    for label, needle in LOG_NOTES:
        n = sum(text.count(needle) for text in logs)
        if n:
            notes[label] = n
    groups = len({j.group for j in jobs if j.group is not None})
    return report.RunResult(
        mode, dialect, len(jobs), groups, seed, dict(faults.counts), wall, verdict, notes,
        topology=topology.name if topology is not None else None, recovery=recovery, faults_on=faults_on,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    modes = MODES if args.mode == "all" else [args.mode]
    dialects = DIALECTS if args.dialect == "both" else [args.dialect]
    command = " ".join(
        shlex.quote(a) for a in [".venv/bin/python", "-m", "tools.chaos", *(argv or sys.argv[1:])]
    )
    print(
        f"chaos: preset {args.preset}, {len(modes) * len(dialects)} run(s): {args.jobs} jobs (unless the "
        f"preset sizes a mode apart), "
        f"{args.groups} groups, {args.workers} workers, <= {args.seconds:.0f} s each, seed {args.seed}",
        flush=True,
    )
    started = time.monotonic()
    results: list[report.RunResult] = []
    n = 0
    for dialect in dialects:
        for mode in modes:
            n += 1
            result = run_one(args, mode, dialect, args.seed * 1000 + n)
            results.append(result)
            print(report.HEADER + "\n" + result.row(), flush=True)
    took = time.monotonic() - started
    print(f"\nchaos: {len(results)} run(s) in {took:.0f} s\n")
    print(report.text(results))
    if args.out:
        versions = services.versions(dialects, "broker" in modes)
        report.write_doc(ROOT / args.out, results, versions, command, args.preset, took)
        print(f"\nwrote {args.out}")
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
