"""`make scale`: bgq's chaos harness on the engines users scale out to, judged by its oracle.

Usage: .venv/bin/python -m tools.scale [--preset ci|full] [--topology NAME[,NAME...]] [--seed N]
           [--out PATH] [--keep]

For each topology (tools/scale/<module>.py, a `Topology`): start it (installing its Debian
packages when missing), run
  1. a fault-free throughput pair in `bgq work` mode: the same jobs on a single server directly
     (the one the topology fronts when it has its own, else the machine's), then through the
     topology (`throughput_workers` workers each);
  2. a chaos run per mode of the topology: workers through it, the harness's own faults (SIGKILL,
     SIGSTOP, session cuts) beside the topology's (failover, node kill...), judged by the oracle
     (tools/chaos/oracle.py), with the recovery after each topology fault;
then stop everything it started, also after a failure or Ctrl-C.

Presets:
  ci    a few minutes per topology: 4,000 jobs (at 1,500 a work run ended before its failover),
        4 workers, one topology fault per run, at most
        two modes; the reduced run of .ci/run. Prints the tables; writes nothing unless --out.
  full  15,000 jobs, 6 workers (a topology's `full_chaos_workers` for a mode: PgBouncer's
        work runs have 50), three topology faults per run, 15 s apart from 15 s in (50
        workers take seconds to start), every mode, 10,000 jobs in the throughput pair;
        writes docs/scale-out.md.
Exit code 1 when a run has a violation or a stuck job, no topology fault struck, a busy worker
did not come back within the topology's recovery bound, or (full) the throughput ratio is below
the topology's floor.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.chaos import report as chaos_report  # noqa: E402
from tools.chaos import run as chaos  # noqa: E402
from tools.chaos.report import RunResult  # noqa: E402
from tools.scale import report  # noqa: E402
from tools.scale.topology import Topology, ensure_packages  # noqa: E402

#: --topology name -> the module of tools/scale/ that defines it (the class whose `name` it is).
TOPOLOGIES = {
    "pgbouncer": "pgbouncer",
    "standby": "standby",
    "standby-async": "standby",
    "galera": "galera",
    "rabbitmq": "rabbitmq",
}
PRESETS: dict[str, dict[str, object]] = {
    "ci": dict(
        jobs=4000, groups=20, ungrouped_share=0.1, workers=4, seconds=150.0, stalled_timeout=8,
        kill_every=8.0, stop_every=30.0, dbkill_every=0.0, broker_restarts=0, drain=60.0,
        lost_timeout=15, topology_faults=1, topology_first=3.0, throughput_jobs=3000, max_modes=2,
        out=None,
    ),
    "full": dict(
        jobs=15000, groups=60, ungrouped_share=0.15, workers=6, seconds=500.0, stalled_timeout=8,
        kill_every=6.0, stop_every=25.0, dbkill_every=25.0, broker_restarts=0, drain=200.0,
        lost_timeout=30, topology_faults=3, topology_first=15.0, topology_every=15.0,
        throughput_jobs=10000, max_modes=9,
        out="docs/scale-out.md",
    ),
}  # fmt: skip


@dataclass
class TopologyResult:
    topology: Topology
    versions: list[str] = field(default_factory=list)
    direct: RunResult | None = None  # fault-free, the single server
    through: RunResult | None = None  # fault-free, through the topology
    runs: list[RunResult] = field(default_factory=list)  # chaos runs
    errors: list[str] = field(default_factory=list)  # what broke the driver itself
    chaos_workers: dict[str, int] = field(default_factory=dict)  # mode -> worker processes

    def problems(self, preset: str) -> list[str]:
        out = list(self.errors)
        t = self.topology
        for r in self.runs:
            label = f"{t.name} {r.mode}"
            if r.verdict.failed:
                out.append(f"{label}: the oracle found violations or stuck jobs")
            if r.unexercised:
                out.append(f"{label}: no {'/'.join(t.fault_kinds)} struck before the run drained")
            for rec in r.recovery:
                if rec.missing:
                    out.append(
                        f"{label}: after {rec.kind} at {rec.at_s:.0f} s, "
                        f"{', '.join(rec.missing)} never ran again"
                    )
                elif (
                    t.recovery_bound_s is not None
                    and rec.back_s is not None
                    and rec.back_s > t.recovery_bound_s
                ):
                    out.append(
                        f"{label}: after {rec.kind} at {rec.at_s:.0f} s, every busy worker took a job again "
                        f"only after {rec.back_s:.1f} s (bound {t.recovery_bound_s:.0f} s)"
                    )  # fmt: skip
        for r in (self.direct, self.through):
            if r is not None and r.verdict.failed:
                out.append(f"{t.name} fault-free {r.mode} ({r.topology or 'direct'}): violations")
        ratio = self.ratio
        if (
            preset == "full"
            and t.throughput_floor is not None
            and ratio is not None
            and ratio < t.throughput_floor
        ):
            out.append(f"{t.name}: throughput {ratio:.2f}x direct, below the floor {t.throughput_floor}x")
        return out

    @property
    def ratio(self) -> float | None:
        if self.direct is None or self.through is None or self.direct.rate <= 0:
            return None
        return self.through.rate / self.direct.rate


def topology_class(name: str) -> type[Topology]:
    module = importlib.import_module(f"tools.scale.{TOPOLOGIES[name]}")
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, Topology) and getattr(value, "name", None) == name:
            return value
    raise SystemExit(f"scale: tools/scale/{TOPOLOGIES[name]}.py defines no topology named {name!r}")


def load(name: str, workdir: Path) -> Topology:
    return topology_class(name)(workdir)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="ci")
    p.add_argument("--topology", default=",".join(TOPOLOGIES), help="comma-separated names")
    p.add_argument("--mode", help="only this chaos mode (default: each topology's own)")
    p.add_argument("--jobs", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--topology-faults", type=int, help="topology faults per chaos run")
    p.add_argument("--no-throughput", action="store_true", help="skip the fault-free throughput pair")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write docs to this Markdown file")
    p.add_argument("--keep", action="store_true", help="keep every run's ledger and logs")
    p.add_argument(
        "--packages-only",
        action="store_true",
        help="only apt-get install the topologies' Debian packages that are missing (make test)",
    )
    args = p.parse_args(argv)
    args.explicit = {k for k, v in vars(args).items() if v is not None}
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    names = [n.strip() for n in args.topology.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOPOLOGIES]
    if unknown:
        p.error(f"unknown topology {', '.join(unknown)} (known: {', '.join(TOPOLOGIES)})")
    args.names = names
    return args


def run_topology(args: argparse.Namespace, name: str, n: int) -> TopologyResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"bgqscale-{name}-"))
    topology = load(name, workdir)
    result = TopologyResult(topology)
    print(f"\n=== {name}: {topology.title} (workdir {workdir})", flush=True)
    try:
        started = time.monotonic()
        from tools.scale.topology import ensure_packages

        ensure_packages(topology.packages)
        topology.start()
        print(f"=== {name}: started in {time.monotonic() - started:.0f} s", flush=True)
        result.versions = topology.versions()
        seed = args.seed * 1000 + n * 10
        if not args.no_throughput:
            pair = argparse.Namespace(
                **{**vars(args), "jobs": args.throughput_jobs, "workers": topology.throughput_workers,
                   "preset": "scale"}
            )  # fmt: skip
            result.direct = chaos.run_one(
                pair, "work", topology.dialect, seed, None, faults_on=False, admin=topology.direct_admin_url()
            )
            print(chaos_report.HEADER + "\n" + result.direct.row(), flush=True)
            result.through = chaos.run_one(pair, "work", topology.dialect, seed, topology, faults_on=False)
            print(chaos_report.HEADER + "\n" + result.through.row(), flush=True)
        modes = [args.mode] if args.mode else list(topology.modes)[: args.max_modes]
        for i, mode in enumerate(modes):
            workers = args.workers
            if args.preset == "full" and "workers" not in args.explicit:
                workers = topology.full_chaos_workers.get(mode, workers)
            result.chaos_workers[mode] = workers
            run_args = argparse.Namespace(**{**vars(args), "preset": "scale", "workers": workers})
            r = chaos.run_one(run_args, mode, topology.dialect, seed + 1 + i, topology)
            result.runs.append(r)
            print(chaos_report.HEADER + "\n" + r.row(), flush=True)
            print(report.recovery_line(r), flush=True)
    except Exception as exc:  # the other topologies still run; this one fails
        import traceback

        traceback.print_exc()
        result.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            topology.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.packages_only:  # the suite's cluster tests start these servers themselves
        for name in args.names:
            ensure_packages(topology_class(name).packages)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    command = " ".join(
        shlex.quote(a) for a in [".venv/bin/python", "-m", "tools.scale", *(argv or sys.argv[1:])]
    )
    started = time.monotonic()
    results = [run_topology(args, name, n) for n, name in enumerate(args.names, 1)]
    took = time.monotonic() - started
    problems = [p for r in results for p in r.problems(args.preset)]
    print(f"\nscale: {len(results)} topolog{'y' if len(results) == 1 else 'ies'} in {took:.0f} s\n")
    print(report.text(results))
    if args.out:
        report.write_doc(ROOT / args.out, results, command, args.preset, took)
        print(f"\nwrote {args.out}")
    for p in problems:
        print(f"scale: FAILED: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
